// Reference encodings from @lenml/tokenizers (a port of transformers.js's tokenizers): JSON
// strings one a line on stdin, JSON id lists out, special tokens in the text recognised, no
// BOS added. usage: node ref_encode.js PACKAGE_MAIN_JS MODEL_DIR
const { TokenizerLoader } = require(process.argv[2]);
const fs = require('fs');
const dir = process.argv[3];
const tok = TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(fs.readFileSync(dir + '/tokenizer.json')),
  tokenizerConfig: JSON.parse(fs.readFileSync(dir + '/tokenizer_config.json')),
});
const out = [];
for (const line of fs.readFileSync(0, 'utf8').split('\n')) {
  if (line.length) out.push(JSON.stringify(tok.encode(JSON.parse(line), { add_special_tokens: false })));
}
process.stdout.write(out.join('\n') + '\n');

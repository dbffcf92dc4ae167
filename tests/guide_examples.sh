#!/bin/sh
# The output lines quoted in docs/guide.md (the step line, the metrics.jsonl records, eval's
# summary and last line) against real output: each quoted line, with its numbers and times
# as wildcards, must match a line the program writes.
set -u
TZ=${1:?usage: guide_examples.sh TURBOZERO SOURCE_DIR}
SRC=${2:?usage: guide_examples.sh TURBOZERO SOURCE_DIR}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/tzguide.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT
cd "$SRC" || exit 1
"$TZ" train inputs/llama/finetune.cfg --set train.steps=4 --set data.seq_len=64 \
    --set train.micro_batch=4 --set train.eval_every=2 --set train.eval_windows=8 \
    --set train.log_every=1 --set run.dir="$TMP/run" > "$TMP/train.log" 2>&1 ||
    { echo "FAIL train"; tail -5 "$TMP/train.log"; exit 1; }
"$TZ" eval inputs/llama/finetune.cfg > "$TMP/eval.log" 2>&1 ||
    { echo "FAIL eval"; tail -5 "$TMP/eval.log"; exit 1; }
cat "$TMP/train.log" "$TMP/run/metrics.jsonl" "$TMP/eval.log" > "$TMP/all"
python3 - "$SRC/docs/guide.md" "$TMP/all" <<'PY'
import re, sys
guide = open(sys.argv[1]).read().splitlines()
out = open(sys.argv[2]).read().splitlines()
starts = ("step ", '{"step": ', '{"summary": ', "eval_loss=", "model inputs/")
quoted = [l for l in guide if l.startswith(starts)]
fail = 0
def pattern(q):
    q = re.sub(r"\d{4}-\d\d-\d\dT[0-9:.]+Z", "\x01", q)       # ISO times
    q = re.sub(r"\b(\d+h\d+m|\d+m\d+s|\d+s)\b", "\x02", q)      # durations (ETA)
    q = re.sub(r"-?\d+(\.\d+)?(e[-+]?\d+)?", "\x03", q)          # numbers
    p = re.escape(q)
    return (p.replace("\x01", "[0-9T:.Z-]+").replace("\x02", "[0-9hms]+")
             .replace("\x03", "-?[0-9.]+(e[-+]?[0-9]+)?"))
for q in quoted:
    pat = pattern(q)
    if any(re.fullmatch(pat, o) for o in out):
        print("ok   " + q[:90])
    else:
        print("FAIL no output line of the form: " + q)
        fail += 1
if len(quoted) < 5:
    print("FAIL only %d quoted lines found in the guide" % len(quoted)); fail += 1
print("guide_examples: %d checked, %d failed" % (len(quoted), fail))
sys.exit(1 if fail else 0)
PY

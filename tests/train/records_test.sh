#!/usr/bin/env bash
# What a run records, and the warnings of a learning rate that does not suit the mode (the
# real binary, the bundled model):
#  1. a run stopped by SIGUSR1 inside a "Slurm job" (SLURM_JOB_ID etc. set) and resumed:
#     run.json names the backend and device used, the job, its restart count and two
#     segments (stopped 0 -> 3, finished 3 -> 6); the effective config is printed by the
#     first start only;
#  2. run.dir/tb holds TensorBoard event files: every record's masked CRC-32C checks, the
#     first event is the file version, and the scalars are those of metrics.jsonl (every
#     step of both segments, train/loss, eval/loss, ...), decoded by the reader below
#     (TensorBoard's own reader where Python has it installed);
#  3. eval on the same configuration reports the training run's evaluation loss
#     (train.eval_windows honoured by both);
#  4. optim.lr unset takes the mode's default (qzo: 1e-6); a LoRA learning rate in qzo
#     mode is warned about at start, and the loss it makes climb is warned about too.
# usage: records_test.sh TURBOZERO SOURCE_DIR
set -u
tz=$1 src=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/tzrecords.XXXXXX")
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/../lib.sh"
cd "$src"
export OMPI_MCA_ess_singleton_isolated=1
cfg=inputs/llama/finetune.cfg
common=(--set train.steps=6 --set data.seq_len=64 --set train.micro_batch=2 --set train.checkpoint_every=2
        --set train.log_every=1 --set train.eval_windows=4 --set train.eval_every=3 --set train.threads=1
        --set run.dir="$work/run")

# ---- 1. stopped and resumed inside a job
TZ_CKPT_FAULT=rank=0,at=step,step=3,do=pause SLURM_JOB_ID=4242 SLURM_ARRAY_JOB_ID=4240 \
  SLURM_ARRAY_TASK_ID=2 SLURM_RESTART_COUNT=0 "$tz" train $cfg "${common[@]}" > "$work/a.log" 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q "TZ_CKPT_FAULT: pause" "$work/a.log" && break; sleep 0.1; done
kill -USR1 $pid
wait $pid; rc=$?
SLURM_JOB_ID=4242 SLURM_ARRAY_JOB_ID=4240 SLURM_ARRAY_TASK_ID=2 SLURM_RESTART_COUNT=1 \
  "$tz" train $cfg "${common[@]}" --resume > "$work/b.log" 2>&1 || bad "the resumed run failed"
if [ $rc -eq 75 ] && /usr/bin/python3 - "$work/run/run.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
s = j["segments"]
want = [("stopped", 0, 3, 0), ("finished", 3, 6, 1)]
got = [(x["status"], x["steps_from"], x["steps_to"], x["slurm_restart_count"]) for x in s]
assert got == want, got
assert j["backend"] == "cpu" and j["device"].startswith("host CPU") and j["build_cuda"] in (True, False)
assert j["slurm"] == {"job_id": "4242", "array_job_id": "4240", "array_task_id": "2", "restart_count": 1}, j["slurm"]
assert j["status"] == "finished" and j["start"] == s[0]["start"] and s[1]["start"] > s[0]["start"]
assert abs(j["wall_s"] - s[0]["wall_s"] - s[1]["wall_s"]) < 1e-3
assert all(x["ranks"] == 1 and x["backend"] == "cpu" for x in s)
PY
then
  ok "run.json: backend cpu on the host CPU, Slurm job 4242 (array 4240 index 2, restart 1), segments stopped 0->3 and finished 3->6"
else
  bad "run.json of a stopped and resumed run (first exit $rc)"; cat "$work/run/run.json"
fi
[ "$(grep -c '^# effective config' "$work/a.log")" = 1 ] && ! grep -q '^# effective config' "$work/b.log" &&
  grep -q "effective config: .*config.used.cfg.*not printed again" "$work/b.log" &&
  ok "the effective config is printed by the first start only" ||
  bad "effective config printed $(grep -c '^# effective config' "$work/a.log") + $(grep -c '^# effective config' "$work/b.log") times"

# ---- 2. TensorBoard event files
/usr/bin/python3 - "$work/run" > "$work/tb.log" 2>&1 <<'PY'
import glob, json, struct, sys
run = sys.argv[1]
def crc32c(b):
    c = 0xFFFFFFFF
    for x in b:
        c ^= x
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    return c ^ 0xFFFFFFFF
def mask(c):
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF
assert crc32c(b"123456789") == 0xE3069283
def varint(b, i):
    v = s = 0
    while True:
        x = b[i]; i += 1; v |= (x & 0x7F) << s; s += 7
        if x < 0x80: return v, i
def fields(b):  # (field, wire type, value) of one message
    i = 0
    while i < len(b):
        k, i = varint(b, i); f, t = k >> 3, k & 7
        if t == 0: v, i = varint(b, i)
        elif t == 1: v = b[i:i + 8]; i += 8
        elif t == 5: v = b[i:i + 4]; i += 4
        elif t == 2: n, i = varint(b, i); v = b[i:i + n]; i += n
        else: raise ValueError("wire type %d" % t)
        yield f, t, v
files = glob.glob(run + "/tb/events.out.tfevents.*")
assert len(files) == 1, files
d = open(files[0], "rb").read()
i, events = 0, []
while i < len(d):
    n, = struct.unpack("<Q", d[i:i + 8])
    assert struct.unpack("<I", d[i + 8:i + 12])[0] == mask(crc32c(d[i:i + 8])), "length CRC"
    data = d[i + 12:i + 12 + n]
    assert struct.unpack("<I", d[i + 12 + n:i + 16 + n])[0] == mask(crc32c(data)), "data CRC"
    i += 16 + n
    ev = {"step": 0}
    for f, t, v in fields(data):
        if f == 1: ev["wall"] = struct.unpack("<d", v)[0]
        elif f == 2: ev["step"] = v
        elif f == 3: ev["version"] = v.decode()
        elif f == 5:
            for _, _, val in fields(v):
                tag, x = None, None
                for g, _, w in fields(val):
                    if g == 1: tag = w.decode()
                    elif g == 2: x = struct.unpack("<f", w)[0]
                ev["scalar"] = (tag, x)
    events.append(ev)
assert events[0].get("version") == "brain.Event:2", events[0]
got = sorted((e["step"],) + e["scalar"] for e in events[1:])
want = []
for line in open(run + "/metrics.jsonl"):
    r = json.loads(line)
    if "summary" in r: continue
    for k, v in r.items():
        if k in ("step", "time") or not isinstance(v, (int, float)): continue
        tag = "eval/" + k[5:] if k.startswith("eval_") else "train/" + k
        want.append((r["step"], tag, struct.unpack("<f", struct.pack("<f", v))[0]))
assert got == sorted(want), (got[:5], sorted(want)[:5])
steps = sorted(s for s, t, _ in got if t == "train/loss")
assert steps == [1, 2, 3, 4, 5, 6], steps
assert [s for s, t, _ in got if t == "eval/loss"] == [0, 3, 6]
print("%d records, %d scalars" % (len(events), len(got)))
try:  # TensorBoard's own reader, where it is installed
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    a = EventAccumulator(run + "/tb"); a.Reload()
    assert [e.step for e in a.Scalars("train/loss")] == steps
    print("read back by TensorBoard")
except ImportError:
    print("TensorBoard is not installed: checked by the reader above")
PY
[ $? -eq 0 ] && ok "tb/: $(head -1 "$work/tb.log"), the metrics of both segments, CRCs good; $(tail -1 "$work/tb.log")" ||
  { bad "tb/ event file"; cat "$work/tb.log"; }

# ---- 3. eval agrees with training
ev=(--set train.eval_windows=8 --set data.seq_len=128 --set train.micro_batch=4 --set train.threads=1)
"$tz" train $cfg "${ev[@]}" --set train.steps=1 --set run.dir="$work/ev" > "$work/ev.log" 2>&1
"$tz" eval $cfg "${ev[@]}" > "$work/eval.log" 2>&1
t=$(sed -n 's/.*"step": 0, "eval_loss": \([0-9.]*\),.*/\1/p' "$work/ev/metrics.jsonl")
e=$(sed -n 's/^eval_loss=\([0-9.]*\) tokens=1024$/\1/p' "$work/eval.log")
[ -n "$t" ] && [ "$t" = "$e" ] && grep -q "the first 8 of [0-9]* windows" "$work/eval.log" &&
  ok "eval and training report one loss on one config: $e (train.eval_windows = 8)" ||
  { bad "training's eval_loss '$t', eval's '$e'"; tail -3 "$work/eval.log"; }

# ---- 4. learning rates by mode
grep -v "lr = " $cfg > "$work/nolr.cfg"
q=(--set train.mode=qzo --set quant.bits=4 --set train.threads=2 --set data.val=)
"$tz" train "$work/nolr.cfg" "${q[@]}" --set train.steps=1 --set data.seq_len=64 --set run.dir="$work/q0" > "$work/q0.log" 2>&1
grep -q "^  lr = 1e-06;" "$work/q0/config.used.cfg" && ! grep -q "warning: optim.lr" "$work/q0.log" &&
  ok "optim.lr unset in qzo mode: 1e-06, no warning" ||
  { bad "qzo's default lr"; grep "lr = " "$work/q0/config.used.cfg"; }
"$tz" train $cfg "${q[@]}" --set train.steps=25 --set run.dir="$work/q1" > "$work/q1.log" 2>&1 # 3.4 -> 4.7
grep -q 'warning: optim.lr 0.002 is far outside what train.mode = "qzo" usually runs at' "$work/q1.log" &&
  grep -q "warning: step [0-9]*: the training loss is climbing" "$work/q1.log" &&
  grep -q "HINT: lower optim.lr (now 0.002" "$work/q1.log" &&
  ok "LoRA's lr 2e-3 in qzo mode: warned at start, and $(grep -o 'step [0-9]*: the training loss is climbing' "$work/q1.log")" ||
  { bad "qzo at lr 2e-3: warnings"; grep -E "warning|^step" "$work/q1.log" | tail -5; }
finish records

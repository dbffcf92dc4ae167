#!/usr/bin/env bash
# Checkpoints and run.dir under hostile use (docs/guide.md, "Surviving preemption"): each
# case is a way a checkpoint.json, a resume or a run.dir was once trusted too far.
#  3. checkpoint.json edited (its marker no longer matches), or edited with the marker made to
#     match (its own consistency: step, data position, ZeRO plan, tensors), or a FIFO (10):
#     refused by name,
#     --resume falls back to the previous checkpoint and ends bit for bit as the
#     uninterrupted run; "step": -1 at 2 ranks; "step": 10^15 commits nothing.
#  4. a damaged but parseable checkpoint (a shard that passes its CRC but cannot be read):
#     falls back too; a named damaged checkpoint is refused with what is wrong, no stale hint.
#  5. a refused --resume leaves no staged log that a later run takes; the log stays whole.
#  6. --resume on a finished run is refused and changes nothing.
#  7. --resume PATH/step-2 retires the newer checkpoints, so a later plain --resume keeps to
#     the new timeline.
#  8. changed settings named key by key (run.seed, optim.eps, quant.seed: values that appear
#     elsewhere in the config).
# 12. an overwrite run killed before it sets the earlier run's checkpoints aside: the requeued
#     --resume starts the new run, not the old one.
# 14. a run.dir that is not a run folder (shaped like "/", a folder with folders) is refused
#     untouched; one with a note of its own is fine.
# usage: hostile_test.sh TURBOZERO SOURCE_DIR MPIEXEC
set -u
tz=$1 src=$2 mpiexec=$3
py=/usr/bin/python3
source "$(dirname "$0")/common.sh"
ckpt_setup tzhostile 12
ad=adapter/adapter_model.safetensors
# run DIR [args...]: one process; runN N DIR [args...]: N ranks
run() { local dir=$1; shift; (timeout 120 "$tz" train "$work/run.cfg" --set run.dir="$dir" "$@" > "$dir.log" 2>&1); }
runN() {
  local n=$1 dir=$2; shift 2
  timeout 120 "$mpiexec" -np $n "$tz" train "$work/run.cfg" --set train.micro_batch=$((12 / n)) \
    --set run.dir="$dir" "$@" > "$dir.log" 2>&1
}
# stopped DIR: a copy of the run killed after step 5 (checkpoints step-2 and step-4, its log staged)
stopped() { rm -rf "$1"; cp -a "$work/stop" "$1"; }
# edit DIR STEP PYTHON: applies PYTHON to the dict m of DIR's checkpoint.json of STEP, then
# writes a marker that matches the edited file (so only the file's own consistency is judged)
edit() {
  $py - "$1/checkpoints/step-$2" "$3" <<'PY'
import json, sys, zlib
d, code = sys.argv[1], sys.argv[2]
m = json.load(open(d + "/checkpoint.json"))
exec(code)
t = json.dumps(m, indent=1).encode()
open(d + "/checkpoint.json", "wb").write(t)
open(d + "/COMPLETE", "w").write("step %s\ncheckpoint.json %d %08x\n" % (d.rsplit("-", 1)[1], len(t), zlib.crc32(t)))
PY
}
fell_back() { # fell_back DIR PATTERN: refused with PATTERN, resumed at step-2, ended as the reference
  grep -q "checkpoint refused: .*$2" "$1.log" && grep -q "resumed from .*step-2: step 2" "$1.log" &&
    same_run "$work/ref" "$1" $ad
}

run "$work/ref" || { bad "the uninterrupted run failed"; tail -5 "$work/ref.log"; finish hostile; exit 1; }
TZ_CKPT_FAULT=rank=0,at=step,step=5,do=kill run "$work/stop"
[ -f "$work/stop/checkpoints/step-4/COMPLETE" ] && [ -f "$work/stop/staging/metrics.jsonl" ] ||
  { bad "the run killed after step 5 left no checkpoint"; tail -5 "$work/stop.log"; finish hostile; exit 1; }

# ---- 3. checkpoint.json trusted no further than it can be checked
d="$work/c3a"; stopped "$d"
sed -i 's/"step": 4,/"step": 3,/' "$d/checkpoints/step-4/checkpoint.json"
run "$d" --resume && fell_back "$d" "step-4/checkpoint.json: .*other than its marker records" &&
  ok "3: checkpoint.json edited by hand: refused by its marker, fell back to step-2, ended as the uninterrupted run" ||
  { bad "3: an edited checkpoint.json"; tail -4 "$d.log"; }
for row in 'm["step"] = 3;in a folder of step 4' 'm["data"]["next_row"] = 36;data position' \
           'm["zero"]["buckets"][1][3] += 256;zero.buckets' 'm["tensors"][1]["name"] = m["tensors"][0]["name"];listed twice' \
           'm["tensors"][0]["numel"] += 1;tensor .*inconsistent' 'm["shards"][0]["crc32"] = -5;shards' \
           'm["eval"] = {"before": 1.0};eval' 'm["zero"]["world"] = 2;shards'; do
  code=${row%;*} pat=${row#*;}
  d="$work/c3b"; stopped "$d"; edit "$d" 4 "$code"
  run "$d" --resume && fell_back "$d" "$pat" && ok "3: '$code' (marker matching): refused ('$pat'), fell back, same end" ||
    { bad "3: '$code' was not refused as '$pat'"; grep -E "refused|resumed|FATAL|rror" "$d.log" | head -3; }
done
d="$work/c3c"; rm -rf "$d"; cp -a "$work/stop" "$d"; edit "$d" 4 'm["step"] = -1'
# (2 ranks read the 1-rank checkpoint: the same run within the ZeRO test's tolerance, not
# bit for bit, so only the end is checked here)
runN 2 "$d" --resume && grep -q "checkpoint refused: checkpoint.json: step missing, malformed or out of range" "$d.log" &&
  grep -q "resumed from .*step-2: step 2, written by 1 rank (zero stage 2), read by 2" "$d.log" && [ -f "$d/$ad" ] &&
  ok "3: \"step\": -1 at 2 ranks: refused, fell back to step-2, finished" || { bad "3: step -1 at 2 ranks"; tail -4 "$d.log"; }
d="$work/c3d"; stopped "$d"; edit "$d" 4 'm["step"] = 10**15'
run "$d" --resume && fell_back "$d" "step" && ok "3: \"step\": 10^15: refused, nothing committed as finished, same end" ||
  { bad "3: step 10^15"; tail -4 "$d.log"; }

d="$work/c3e"; stopped "$d"; printf 'step 4\n' > "$d/checkpoints/step-4/COMPLETE"   # as earlier versions wrote it
run "$d" --resume && grep -q "resumed from .*step-4: step 4" "$d.log" && same_run "$work/ref" "$d" $ad &&
  ok "3: a checkpoint of an earlier version (a marker without the CRC line) is still resumed, checked in itself" ||
  { bad "3: a marker of an earlier version"; tail -3 "$d.log"; }

d="$work/c3f"; stopped "$d"; rm "$d/checkpoints/step-4/checkpoint.json"; mkfifo "$d/checkpoints/step-4/checkpoint.json"
run "$d" --resume && fell_back "$d" "step-4/checkpoint.json: missing or not a regular file" &&
  ok "3: a FIFO named checkpoint.json: refused without opening it, fell back, same end" ||
  { bad "3: a FIFO as checkpoint.json"; tail -3 "$d.log"; }

# ---- 4. damaged but parseable: fall back past it; a named one is refused plainly
d="$work/c4"; stopped "$d"
$py - "$d/checkpoints/step-4" <<'PY'
import h5py, json, sys, zlib, os
d = sys.argv[1]
with h5py.File(d + "/rank-00000.h5", "a") as f:   # a dataset gone: the shard reads as no tensor
    names = []
    f.visit(lambda n: names.append(n) if isinstance(f[n], h5py.Dataset) else None)
    del f[names[0]]
m = json.load(open(d + "/checkpoint.json"))
b = open(d + "/rank-00000.h5", "rb").read()
m["shards"][0]["bytes"], m["shards"][0]["crc32"] = len(b), zlib.crc32(b)
t = json.dumps(m, indent=1).encode()
open(d + "/checkpoint.json", "wb").write(t)
open(d + "/COMPLETE", "w").write("step 4\ncheckpoint.json %d %08x\n" % (len(t), zlib.crc32(t)))
PY
run "$d" --resume && fell_back "$d" "rank-00000.h5" &&
  ok "4: a shard that passes its CRC but cannot be read: refused, fell back to step-2, same end" ||
  { bad "4: an unreadable shard"; grep -E "refused|resumed|FATAL" "$d.log" | head -3; }
d="$work/c4n"; stopped "$d"; edit "$d" 4 'm["zero"]["buckets"][0][0] = 7'
if ! run "$d" --resume "$d/checkpoints/step-4" && grep -q "zero.buckets\[0\] inconsistent" "$d.log" &&
   grep -q "the checkpoint is incomplete, damaged or inconsistent" "$d.log" && ! grep -q "HINT: resume with the model" "$d.log"; then
  ok "4: a named inconsistent checkpoint: refused with what is wrong, no misleading hint"
else
  bad "4: a named inconsistent checkpoint"; tail -3 "$d.log"
fi

# ---- 5. a refused --resume leaves nothing a later run takes
d="$work/c5"; stopped "$d"
if ! run "$d" --resume --set train.micro_batch=6 && grep -q "12 rows each, this run's 6" "$d.log"; then
  TZ_CKPT_FAULT=rank=0,at=step,step=3,do=kill run "$d" --set run.overwrite=true --set optim.lr=1e-3
  run "$d" --resume --set run.overwrite=true --set optim.lr=1e-3 && run "$work/ref-lr" --set optim.lr=1e-3
  [ ! -e "$d/.metrics.resume.jsonl" ] && same_run "$work/ref-lr" "$d" $ad &&
    ok "5: after a refused --resume, a new run stopped and resumed keeps its own log whole (no earlier run's losses)" ||
    { bad "5: the log after a refused resume"; diff <(strip_timing "$work/ref-lr/metrics.jsonl") <(strip_timing "$d/metrics.jsonl") | head -4; }
else
  bad "5: the resume with another global batch was not refused"; tail -3 "$d.log"
fi
d="$work/c5b"; stopped "$d"
run "$d" --resume --set train.micro_batch=6
run "$d" --resume "$d/checkpoints/step-9" # no such checkpoint: refused too
run "$d" --resume && grep -q "5 records of the stopped run kept\|4 records of the stopped run kept" "$d.log" &&
  same_run "$work/ref" "$d" $ad && ok "5: two refused resumes, then one that runs: the log is whole, the run as the uninterrupted one" ||
  { bad "5: resume after two refusals"; grep "records" "$d.log"; }

# ---- 6. a finished run is not resumed
d="$work/c6"; rm -rf "$d"; cp -a "$work/ref" "$d"
if ! run "$d" --resume && grep -q "holds a finished run.*nothing to resume" "$d.log" && same_run "$work/ref" "$d" $ad &&
   cmp -s "$work/ref/run.json" "$d/run.json"; then
  ok "6: --resume on a finished run: refused, its outputs untouched"
else
  bad "6: --resume on a finished run"; tail -3 "$d.log"
fi

# ---- 7. going back: the abandoned timeline's checkpoints are retired
d="$work/c7"; stopped "$d"
TZ_CKPT_FAULT=rank=0,at=step,step=3,do=kill run "$d" --resume "$d/checkpoints/step-2" --set optim.lr=1e-3
if [ ! -e "$d/checkpoints/step-4" ] && grep -q "step-4 (step 4, after the step 2 this run continues from): set aside" "$d.log"; then
  run "$d" --resume --set optim.lr=1e-3
  grep -q "resumed from .*step-2: step 2" "$d.log" && ok "7: --resume PATH/step-2 retired step-4; the next --resume kept to step-2's timeline" ||
    { bad "7: the plain --resume after going back"; grep resumed "$d.log"; }
else
  bad "7: step-4 of the abandoned timeline is still there"; ls "$d/checkpoints"
fi

# ---- 8. settings compared key by key
d="$work/c8"; stopped "$d"
run "$d" --resume --set run.seed=0 --set optim.eps=0.001 --set quant.seed=1234
for k in "run.seed 1234 -> 0" "optim.eps 1e-08 -> 0.001" "quant.seed 0 -> 1234"; do
  grep -q "settings other than the checkpoint's:.*$k" "$d.log" && ok "8: the changed setting is named: $k" ||
    { bad "8: no warning for $k"; grep "other than" "$d.log"; }
done

# ---- 12. an overwrite run killed before the earlier run's checkpoints are set aside
d="$work/c12"; stopped "$d"
TZ_CKPT_FAULT=rank=0,at=aside,do=kill run "$d" --set run.overwrite=true --set optim.lr=1e-3
if grep -q "TZ_CKPT_FAULT: kill at aside" "$d.log" && [ -f "$d/checkpoints/step-4/COMPLETE" ]; then
  run "$d" --resume --set run.overwrite=true --set optim.lr=1e-3
  grep -q "passing over .*step-4: written by another run" "$d.log" && grep -q "starting from step 0" "$d.log" &&
    same_run "$work/ref-lr" "$d" $ad && ok "12: the requeued --resume started the new run, not the one it replaces" ||
    { bad "12: the requeued --resume of a new run"; grep -E "resum|passing" "$d.log" | head -4; }
else
  bad "12: the fault point before the set-aside was not reached"; tail -3 "$d.log"
fi

# ---- 14. run.dir must be a run folder
# (a copy of a root folder's shape rather than "/" itself, so that a regression cannot write there)
mkdir -p "$work/fakeroot/bin" "$work/fakeroot/etc" "$work/fakeroot/home" "$work/fakeroot/usr"
if ! run "$work/fakeroot" && grep -q "run.dir .*fakeroot is not a run folder: it holds 4 folders" "$work/fakeroot.log" &&
   [ -z "$(ls -A "$work/fakeroot" | grep -v '^bin$\|^etc$\|^home$\|^usr$')" ]; then
  ok "14: a run.dir shaped like \"/\" refused before anything is written"
else
  bad "14: a run.dir shaped like /"; tail -3 "$work/fakeroot.log"
fi
mkdir -p "$work/proj/src" && echo x > "$work/proj/notes.txt"
! run "$work/proj" && grep -q "is not a run folder: it holds 1 folder" "$work/proj.log" && [ ! -e "$work/proj/.lock" ] &&
  ok "14: a folder holding a folder of its own is refused untouched" || { bad "14: a project folder as run.dir"; tail -3 "$work/proj.log"; }
mkdir -p "$work/note" && echo x > "$work/note/notes.txt"
run "$work/note" && [ -f "$work/note/$ad" ] && [ -f "$work/note/notes.txt" ] &&
  ok "14: a folder holding a note of its own is a fine run.dir" || { bad "14: a run.dir with a note"; tail -3 "$work/note.log"; }

finish hostile

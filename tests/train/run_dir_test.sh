#!/usr/bin/env bash
# The life of a run.dir, with the real binary and a tiny model:
#  1. two runs started together on one run.dir: one runs, the other is refused naming the
#     holder (or comes after it), the outputs are one whole run's (repeated: a race); a run
#     started while another trains is refused naming it; a lock held elsewhere is named;
#     a killed run's lock and staging are named and taken over;
#  2. a run that fails (bad data path) leaves the previous run as it was (overwrite=true), and
#     a failed first run does not block the corrected command;
#  3. a write failure injected at each write of an overwriting run (TZ_TEST_FAIL_WRITE=N): the
#     run.dir is all old run (byte for byte) or, once the next run completed the interrupted
#     commit, all new run; never an adapter beside another run's adapter_config.json;
#  4. disk full (a small tmpfs, root only, else that part is skipped): the run stops at the
#     first failing write, at that step, naming the reason; metrics.jsonl has whole lines.
# usage: run_dir_test.sh TURBOZERO SOURCE_DIR
set -u
tz=$1 src=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/tzrundir.XXXXXX")
small=""
cleanup() {
  [ -n "$small" ] && umount "$small" 2> /dev/null
  rm -rf "$work"
}
trap cleanup EXIT
source "$(dirname "$0")/../lib.sh"
cd "$src"
export OMPI_MCA_ess_singleton_isolated=1 # about 40 one-rank runs: no orted to start for each

"$tz" init-model --arch llama --preset tiny --vocab 256 --out "$work/tiny" > /dev/null ||
  { echo "init-model failed"; exit 1; }
common=(--set model.path="$work/tiny" --set train.steps=2 --set data.seq_len=32
        --set train.micro_batch=2 --set train.eval_windows=2 --set train.threads=1)
train() { # run.dir, alpha, more --set ...
  local dir=$1 alpha=$2; shift 2
  "$tz" train inputs/llama/finetune.cfg "${common[@]}" --set lora.alpha="$alpha" --set run.dir="$dir" "$@"
}
# which run a run.dir holds: "ALPHA" when its outputs agree on one lora.alpha and the run is
# finished, else a description of the mix
holds_run() {
  local d=$1 a c
  a=$(grep -o '"lora_alpha": [0-9.]*' "$d/adapter/adapter_config.json" 2> /dev/null | awk '{print $2+0}')
  c=$(awk '$1 == "alpha" {print $3+0}' "$d/config.used.cfg" 2> /dev/null)
  if [ -z "$a" ] || [ "$a" != "$c" ]; then echo "mixed: adapter alpha '$a', config alpha '$c'"; return; fi
  [ "$(grep -c '"summary": true' "$d/metrics.jsonl" 2> /dev/null)" = 1 ] || { echo "metrics without one summary"; return; }
  grep -q '"status": "finished"' "$d/run.json" 2> /dev/null || { echo "run.json not finished"; return; }
  [ -e "$d/staging" ] && { echo "staging left"; return; }
  echo "$a"
}
# same_files DIR_A DIR_B: the outputs of A and B are byte-identical (the lock and the
# staging folder of a failed run aside)
# (.run names the run.dir's current run: a new run, even one that fails, records its id first)
same_files() {
  diff -r -x .lock -x .run -x staging "$1" "$2" > /dev/null
}

# 1. concurrent runs: started together with run.overwrite=true and 100 steps, so that both
# pass the start and train at once unless the lock stops one; a second run that comes after
# the first has ended may replace it, whole
races=0
for i in 1 2 3; do
  d="$work/race$i"
  train "$d" 8 --set run.overwrite=true --set train.steps=100 > "$work/race$i.a.log" 2>&1 & pa=$!
  train "$d" 64 --set run.overwrite=true --set train.steps=100 > "$work/race$i.b.log" 2>&1 & pb=$!
  wait $pa; ra=$?
  wait $pb; rb=$?
  h=$(holds_run "$d")
  steps=$(grep -c '"loss"' "$d/metrics.jsonl" 2> /dev/null)
  if [ $ra -eq 0 ] && [ $rb -ne 0 ]; then lost="$work/race$i.b.log" want=8
  elif [ $rb -eq 0 ] && [ $ra -ne 0 ]; then lost="$work/race$i.a.log" want=64
  elif [ $ra -eq 0 ] && [ $rb -eq 0 ]; then lost="" want="8 or 64"
  else bad "race $i: both runs failed ($ra, $rb)"; tail -3 "$work/race$i.a.log"; continue; fi
  if [ -n "$lost" ] && ! grep -Eq "is in use by another run: pid [0-9]+ on host" "$lost"; then
    bad "race $i: the refused run does not name the holder"; tail -3 "$lost"; continue
  fi
  if [[ " $want " == *" $h "* ]] && [ "$steps" = 100 ]; then races=$((races + 1))
  else bad "race $i: run.dir holds '$h' with $steps step records, expected alpha $want, 100 steps"; fi
done
[ $races -eq 3 ] && ok "two runs on one run.dir at once: one whole run in it, a refused run names the holder, 3 of 3"

d="$work/held"
mkdir -p "$d"
echo "host=elsewhere pid=4242 since=2026-01-01T00:00:00Z state=running" > "$d/.lock"
# the sleep holds the lock; its flock waits (no -n): the probe below holds the lock for a
# moment each time it looks, and a holder that gave up then would never hold it
( flock 9 && exec sleep 600 ) 9< "$d/.lock" & fpid=$!
# wait until it does (however long a busy machine takes to start it), not a fixed time
held=0
for _ in $(seq 6000); do flock -n "$d/.lock" true || { held=1; break; }; sleep 0.05; done
if [ $held = 0 ]; then bad "a held lock: the holder never took the lock"
elif train "$d" 8 > "$work/held.log" 2>&1; then bad "a held lock: the run went ahead"
elif grep -q "in use by another run: pid 4242 on host elsewhere" "$work/held.log" && [ ! -e "$d/staging" ]; then
  ok "a held lock: refused, naming the holder, nothing written"
else bad "a held lock: wrong message"; cat "$work/held.log"; fi
kill $fpid 2> /dev/null; wait $fpid 2> /dev/null

# a run killed mid-training (SIGKILL: nothing of it can clean up): while it trains, a second
# run on its run.dir is refused naming its pid, even with run.overwrite=true; once it is
# dead, the next run names it, clears its staging folder and completes
d="$work/killed"
"$tz" train inputs/llama/finetune.cfg "${common[@]}" --set lora.alpha=8 --set train.steps=1000000 \
  --set run.dir="$d" > "$work/killed.log" 2>&1 & pk=$!
for _ in $(seq 600); do
  grep -qs '"loss"' "$d/staging/metrics.jsonl" "$d/metrics.jsonl" && break
  kill -0 $pk 2> /dev/null || break
  sleep 0.05
done
if train "$d" 64 --set run.overwrite=true > "$work/killed2.log" 2>&1; then
  bad "a second run on a run.dir in use: it went ahead"
elif grep -q "is in use by another run: pid $pk on host $(hostname)" "$work/killed2.log"; then
  ok "a second run on a run.dir in use (run.overwrite=true): refused, naming the holder's pid"
else bad "a second run on a run.dir in use: wrong message"; tail -3 "$work/killed2.log"; fi
kill -9 $pk 2> /dev/null; wait $pk 2> /dev/null
if train "$d" 8 > "$work/killed3.log" 2>&1 &&
   grep -q "pid $pk on host $(hostname).*did not finish.*that process is gone" "$work/killed3.log" &&
   grep -q "partial outputs of a previous run" "$work/killed3.log" && [ "$(holds_run "$d")" = 8 ] &&
   grep -q "pid=[0-9]* .*state=released" "$d/.lock"; then
  ok "after a killed run: its lock and staging folder named and cleared, the next run completes"
else bad "after a killed run"; tail -5 "$work/killed3.log"; fi

# 2. failed runs
train "$work/old" 8 > "$work/old.log" 2>&1 || { bad "the reference run failed"; tail -5 "$work/old.log"; }
mkdir -p "$work/old/checkpoints/step-1" && echo keep > "$work/old/checkpoints/step-1/x"
cp -a "$work/old" "$work/old.copy"
# what a failed overwriting run leaves: the old outputs byte for byte, the old checkpoints
# set aside whole in checkpoints.replaced/ (so that a --resume never mixes two runs')
cp -a "$work/old" "$work/old.aside" && mv "$work/old.aside/checkpoints" "$work/old.aside/checkpoints.replaced"
d="$work/ow"
cp -a "$work/old" "$d"
if train "$d" 64 --set run.overwrite=true --set data.train=nonexistent.tok > "$work/ow.log" 2>&1; then
  bad "overwrite with a bad data path: succeeded"
elif same_files "$d" "$work/old.aside"; then
  ok "overwrite with a bad data path fails and leaves the previous run byte for byte (its checkpoints set aside)"
else bad "overwrite with a bad data path changed the previous run"; diff -r -x .lock -x .run -x staging "$d" "$work/old.aside" | head -5; fi
if train "$d" 64 --set run.overwrite=true > "$work/ow2.log" 2>&1 && [ "$(holds_run "$d")" = 64 ] &&
   [ ! -e "$d/checkpoints" ] && [ ! -e "$d/checkpoints.replaced" ]; then
  ok "overwrite: the new run replaces the old outputs and the old checkpoints whole"
else bad "overwrite: run.dir holds '$(holds_run "$d")'"; tail -3 "$work/ow2.log"; fi
d="$work/first"
train "$d" 8 --set data.train=nonexistent.tok > "$work/first.log" 2>&1
if train "$d" 8 > "$work/first2.log" 2>&1 && [ "$(holds_run "$d")" = 8 ]; then
  ok "a failed first run does not block the corrected command"
else bad "a failed first run blocks the corrected command"; tail -3 "$work/first2.log"; fi

# 3. a failure injected at each write of an overwriting run
kept=0 done_=0 mixed=0 n=1 d="$work/inj"
for n in $(seq 1 40); do
  rm -rf "$d"; cp -a "$work/old" "$d"
  TZ_TEST_FAIL_WRITE=$n train "$d" 64 --set run.overwrite=true --set train.steps=1 > "$work/inj.log" 2>&1; rc=$?
  if ! grep -q "injected by TZ_TEST_FAIL_WRITE=$n" "$work/inj.log"; then
    [ $rc -eq 0 ] && break # past the last write
    mixed=$((mixed + 1)); echo "write $n: failed otherwise:"; tail -3 "$work/inj.log"; continue
  fi
  if [ $rc -eq 0 ]; then # only the picture is optional: a run without loss.png
    [ "$(holds_run "$d")" = 64 ] && [ ! -e "$d/loss.png" ] && grep -q "no loss curve" "$work/inj.log" ||
      { mixed=$((mixed + 1)); echo "write $n: the run went on"; }
    continue
  fi
  if grep -q "the trained result is complete in" "$work/inj.log" &&
     ! grep -q '"lora_alpha": 64' "$d/staging/adapter/adapter_config.json"; then
    mixed=$((mixed + 1)); echo "write $n: the kept result is not the new adapter"
  fi
  # (kept as it was: with its checkpoints set aside, or untouched when the failing write
  # came before the set-aside)
  if same_files "$d" "$work/old.aside" || same_files "$d" "$work/old"; then kept=$((kept + 1)); continue; fi
  # an interrupted commit: the next run on this run.dir completes it, then finds the run
  train "$d" 8 > "$work/inj2.log" 2>&1
  if grep -q "completed the commit" "$work/inj2.log" && grep -q "already holds a run" "$work/inj2.log" &&
     [ "$(holds_run "$d")" = 64 ] && [ ! -e "$d/checkpoints.replaced" ]; then
    done_=$((done_ + 1))
  else
    mixed=$((mixed + 1)); echo "write $n: run.dir holds '$(holds_run "$d")'"; tail -3 "$work/inj2.log"
  fi
done
echo "     injected failures: the old run kept $kept times, the commit completed by the next run $done_ times, $mixed wrong; the run has $((n - 1)) checked writes"
if [ $mixed -eq 0 ] && [ $kept -ge 8 ] && [ $done_ -ge 3 ] && [ "$(holds_run "$d")" = 64 ]; then
  ok "a failure at any write of an overwriting run leaves one whole run in run.dir"
else bad "failure injection"; fi

# 4. disk full
small="$work/small"
mkdir -p "$small"
if [ "$(id -u)" != 0 ] || ! mount -t tmpfs -o size=256k tmpfs "$small" 2> /dev/null; then
  small=""
  echo "SKIP disk full: mounting a tmpfs needs root"
  finish run_dir || exit 1
  exit 77
fi
# fill it, then free 16 pages: the config (about 8 KiB, 3 pages), run.json, the staging
# files and a few dozen KiB of metrics fit; 2000 steps of metrics (about 200 KiB) do not
dd if=/dev/zero of="$small/fill" bs=4k 2> /dev/null
truncate -s -64k "$small/fill"
train "$small/run" 8 --set train.steps=2000 --set train.eval_windows=0 > "$work/full.log" 2>&1; rc=$?
lines=$(wc -l < "$small/run/staging/metrics.jsonl" 2> /dev/null || echo 0)
if [ $rc -ne 0 ] && grep -q "step [0-9]*: .*metrics.jsonl: write failed: No space left on device" "$work/full.log" &&
   [ "$lines" -gt 0 ] && [ "$lines" -lt 2000 ] &&
   /usr/bin/python3 -c 'import json, sys; [json.loads(l) for l in open(sys.argv[1])]' "$small/run/staging/metrics.jsonl" &&
   [ "$(tail -c 1 "$small/run/staging/metrics.jsonl" | od -An -c | tr -d ' ')" = '\n' ]; then
  ok "disk full: stops at the first failing write ($(grep -o 'step [0-9]*:' "$work/full.log")), says why; $lines whole lines in metrics.jsonl"
else bad "disk full (exit $rc, $lines lines)"; tail -3 "$work/full.log"; fi
finish run_dir

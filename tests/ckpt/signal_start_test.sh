#!/usr/bin/env bash
# Signals during start-up (docs/guide.md, "Surviving preemption"): SIGUSR1, SIGTERM or SIGINT
# that come while the model loads, while a checkpoint is read or before the first step stop
# the run with status 75 (requeue), having written nothing new; the run goes on afterwards.
# Each run waits at the start-up point named by the test hook TZ_CKPT_FAULT (do=pause: until
# a signal comes), so nothing depends on timing:
#  1. one process: SIGTERM after the load, then a new run in the same run.dir; SIGINT before
#     the first step, then --resume: no checkpoint, no output in run.dir, and each run after
#     it ends bit for bit as the uninterrupted one (metrics.jsonl and adapter);
#  2. two ranks: SIGUSR1 to mpirun while rank 1 waits after the load, then --resume;
#  3. two ranks with checkpoints (stopped by SIGKILL after step 5): --resume stopped by
#     SIGUSR1 after reading step-4, again by SIGTERM to rank 1 alone after the load (the
#     ranks agree) and by SIGINT to rank 0 alone before the first step: checkpoints
#     unchanged each time; the last --resume ends bit for bit as the uninterrupted run;
#  4. qzo (no checkpoints): SIGUSR1 after the load gives 75, and --resume (a requeued job)
#     starts it over and finishes; a signal during its training takes the default action.
# usage: signal_start_test.sh TURBOZERO SOURCE_DIR MPIEXEC
set -u
tz=$1 src=$2 mpiexec=$3
py=/usr/bin/python3
source "$(dirname "$0")/common.sh"
ckpt_setup tzsigstart 6
out=adapter/adapter_model.safetensors

# cmd N DIR: the command of a run on N ranks (1: one process without mpirun), 12 rows per
# step whatever N, into CMD
cmd() {
  if [ $1 = 1 ]; then CMD=("$tz" train "$work/run.cfg" --set train.micro_batch=12 --set run.dir="$2")
  else CMD=("$mpiexec" -np $1 "$tz" train "$work/run.cfg" --set train.micro_batch=$((12 / $1)) --set run.dir="$2"); fi
}
run() { cmd $1 $2; shift 2; timeout 300 "${CMD[@]}" "$@"; }
# stopped N DIR FAULT SIGNAL WHO [args...]: a run that pauses at FAULT, then SIGNAL to WHO
# (all: the process started, mpirun passing it on to the ranks; rank: the paused rank's
# process alone); sets rc
stopped() {
  local n=$1 dir=$2 fault=$3 sig=$4 who=$5; shift 5
  cmd $n "$dir"
  TZ_CKPT_FAULT=$fault,do=pause "${CMD[@]}" "$@" > "$dir.log" 2>&1 &
  local pid=$! target
  for _ in $(seq 1 600); do grep -q "TZ_CKPT_FAULT: pause" "$dir.log" 2>/dev/null && break; sleep 0.2; done
  target=$pid
  [ $who = rank ] && target=$(sed -n 's/.*TZ_CKPT_FAULT: pause .*(pid \([0-9]*\)).*/\1/p' "$dir.log" | head -1)
  if [ -n "$target" ] && grep -q "TZ_CKPT_FAULT: pause" "$dir.log"; then kill -$sig $target; else kill -KILL $pid; fi
  wait $pid
  rc=$?
}
# nothing_new DIR: no checkpoint, and no output of this run in run.dir (it waits in staging
# for the run that goes on)
nothing_new() {
  [ -z "$(ls -A "$1/checkpoints" 2>/dev/null)" ] && [ ! -e "$1/adapter" ] && [ ! -e "$1/metrics.jsonl" ] &&
    [ ! -e "$1/run.json" ] && ! grep -q '"loss"' "$1/staging/metrics.jsonl" 2>/dev/null
}

run 1 "$work/ref1" > "$work/ref1.log" 2>&1 || { bad "uninterrupted run at N=1 failed"; tail -5 "$work/ref1.log"; }
run 2 "$work/ref2" > "$work/ref2.log" 2>&1 || { bad "uninterrupted run at N=2 failed"; tail -5 "$work/ref2.log"; }

# ---- 1. one process
a="$work/one-load"
stopped 1 "$a" rank=0,at=load TERM all
if [ $rc -eq 75 ] && grep -q "SIGTERM received during start-up (at load)" "$a.log" && nothing_new "$a"; then
  ok "SIGTERM after the model load: exit 75, nothing written"
else
  bad "SIGTERM after the load: exit $rc"; tail -5 "$a.log"
fi
run 1 "$a" > "$a.log" 2>&1 && same_run "$work/ref1" "$a" $out &&
  ok "a new run in that run.dir ends as the uninterrupted run" || { bad "new run after a start-up stop"; tail -5 "$a.log"; }
b="$work/one-start"
stopped 1 "$b" rank=0,at=start INT all
if [ $rc -eq 75 ] && grep -q "SIGINT received during start-up (at start)" "$b.log" && nothing_new "$b"; then
  ok "SIGINT before the first step: exit 75, nothing written"
else
  bad "SIGINT before the first step: exit $rc"; tail -5 "$b.log"
fi
run 1 "$b" --resume > "$b.log" 2>&1 && same_run "$work/ref1" "$b" $out &&
  ok "--resume after it starts from step 0 and ends as the uninterrupted run" || { bad "--resume after a stop before the first step"; tail -5 "$b.log"; }

# ---- 2. two ranks, SIGUSR1 through all
c="$work/two-load"
stopped 2 "$c" rank=1,at=load USR1 all
if [ $rc -eq 75 ] && grep -q "SIGUSR1 received during start-up (at load)" "$c.log" && nothing_new "$c"; then
  ok "2 ranks, SIGUSR1 to mpirun after the load: exit 75, nothing written"
else
  bad "2 ranks, SIGUSR1 after the load: exit $rc"; tail -5 "$c.log"
fi
run 2 "$c" --resume > "$c.log" 2>&1 && same_run "$work/ref2" "$c" $out &&
  ok "--resume after it ends as the uninterrupted run" || { bad "2 ranks: --resume after a start-up stop"; tail -5 "$c.log"; }

# ---- 3. two ranks with checkpoints: stops while resuming
k="$work/two-ckpt"
TZ_CKPT_FAULT=rank=1,at=step,step=5,do=kill run 2 "$k" > "$k.log" 2>&1
cp -a "$k/checkpoints" "$work/ckpts.before"
same_ckpts() { diff -r "$work/ckpts.before" "$k/checkpoints" > /dev/null; }
if [ -f "$k/checkpoints/step-4/COMPLETE" ] && [ ! -e "$k/checkpoints/step-5" ]; then
  ok "killed after step 5: checkpoints step-2 and step-4"
else
  bad "the killed run's checkpoints: $(ls -a "$k/checkpoints" 2>&1 | tr '\n' ' ')"
fi
stopped 2 "$k" rank=0,at=resume,step=4 USR1 all --resume
if [ $rc -eq 75 ] && grep -q "SIGUSR1 received during start-up (at resume)" "$k.log" && same_ckpts &&
   [ ! -e "$k/adapter" ] && ! grep -q '"step": 5' "$k/staging/metrics.jsonl"; then
  ok "SIGUSR1 after reading step-4: exit 75, checkpoints unchanged, no step after 4 logged"
else
  bad "SIGUSR1 after the resume: exit $rc"; tail -5 "$k.log"
fi
stopped 2 "$k" rank=1,at=load TERM rank --resume
if [ $rc -eq 75 ] && grep -q "\[rank 1\] SIGTERM received during start-up (at load)" "$k.log" &&
   ! grep -q "\[rank 0\] SIGTERM" "$k.log" && same_ckpts && [ ! -e "$k/adapter" ]; then
  ok "SIGTERM to rank 1 alone after the load: both ranks stop, exit 75, checkpoints unchanged"
else
  bad "SIGTERM to one rank after the load: exit $rc"; tail -5 "$k.log"
fi
stopped 2 "$k" rank=0,at=start INT rank --resume
if [ $rc -eq 75 ] && grep -q "SIGINT received during start-up (at start)" "$k.log" && same_ckpts; then
  ok "SIGINT to rank 0 alone before the first step: exit 75, checkpoints unchanged"
else
  bad "SIGINT before the first step of a resumed run: exit $rc"; tail -5 "$k.log"
fi
if run 2 "$k" --resume > "$k.log" 2>&1 && grep -q "resumed from .*step-4" "$k.log" && same_run "$work/ref2" "$k" $out; then
  ok "after three start-up stops --resume continues from step-4 and ends bit for bit as the uninterrupted run"
else
  bad "the resumed run differs from the uninterrupted one"; tail -5 "$k.log"
fi

# ---- 4. qzo: stopped at start-up with 75, requeued with --resume; default action in training
q=(--set train.mode=qzo --set quant.bits=4 --set quant.group=64 --set train.checkpoint_every=0)
z="$work/qzo"
stopped 1 "$z" rank=0,at=load USR1 all "${q[@]}"
[ $rc -eq 75 ] && nothing_new "$z" && ok "qzo: SIGUSR1 after the load: exit 75" || { bad "qzo: SIGUSR1 after the load: exit $rc"; tail -5 "$z.log"; }
run 1 "$z" "${q[@]}" --resume > "$z.log" 2>&1 && [ -f "$z/model/model.safetensors" ] &&
  ok "qzo: --resume (the requeued job) starts over and finishes" || { bad "qzo: --resume after a start-up stop"; tail -5 "$z.log"; }
z2="$work/qzo-step"
stopped 1 "$z2" rank=0,at=step,step=2 USR1 all "${q[@]}"
[ $rc -eq 138 ] && ok "qzo: SIGUSR1 during training takes the default action (exit $rc)" ||
  { bad "qzo: SIGUSR1 during training: exit $rc"; tail -3 "$z2.log"; }

finish signal_start

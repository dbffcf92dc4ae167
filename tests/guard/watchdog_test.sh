#!/usr/bin/env bash
# The collective watchdog (run.collective_timeout):
#  1. a two-rank ZeRO-2 run (non-blocking reduce-scatter) and a ZeRO-0 run (blocking
#     all-reduce) with a 3 s timeout train to the end: a normal run never trips it;
#  2. rank 1 stopped with SIGSTOP in the middle of a long run: the job ends (it does not
#     hang; `timeout` is only the backstop) with a non-zero status and rank 0's message
#     naming the collective, the step (in it, or after it: where the stop lands depends on
#     the machine's load, and both are named) and rank 1 as the rank that did not arrive.
# usage: watchdog_test.sh TURBOZERO SOURCE_DIR MPIEXEC
set -u
tz=$1 src=$2 mpiexec=$3
py=/usr/bin/python3
work=$(mktemp -d "${TMPDIR:-/tmp}/tzwatch.XXXXXX")
stopped=""
cleanup() {
  [ -n "$stopped" ] && kill -KILL "$stopped" 2> /dev/null
  [ -n "${KEEP:-}" ] && return; rm -rf "$work"
}
trap cleanup EXIT
source "$(dirname "$0")/../lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
$py "$src/tests/zero/make_model.py" "$work/model" > /dev/null || exit 1
$py "$src/tests/guard/tokens97.py" "$src/inputs/data/jargon.tok" "$work/t97.tok" || exit 1
cat > "$work/run.cfg" <<CFG
model = { path = "$work/model"; };
data = { train = "$work/t97.tok"; seq_len = 16; };
train = { steps = 6; micro_batch = 2; threads = 1; log_every = 1; };
lora = { rank = 2; };
zero = { bucket_mb = 0.02; };
run = { collective_timeout = 3.0; };
CFG

# 1. normal runs, both comm paths
for stage in 2 0; do
  if timeout -k 5 120 "$mpiexec" -np 2 "$tz" train "$work/run.cfg" --set zero.stage=$stage \
      --set run.dir="$work/ok$stage" > "$work/ok$stage.log" 2>&1 &&
     grep -q '"summary": true' "$work/ok$stage/metrics.jsonl"; then
    ok "stage $stage: a 2-rank run with a 3 s collective timeout completes"
  else
    bad "stage $stage: normal run failed"; tail -5 "$work/ok$stage.log"
  fi
done

# 2. rank 1 stopped: the wrapper records each rank's pid (exec keeps it)
cat > "$work/wrap.sh" <<'SH'
#!/bin/sh
echo $$ > "$WATCH_DIR/pid.$OMPI_COMM_WORLD_RANK"
exec "$@"
SH
chmod +x "$work/wrap.sh"
export WATCH_DIR=$work
start=$(date +%s)
timeout -k 5 150 "$mpiexec" -np 2 -x WATCH_DIR "$work/wrap.sh" "$tz" train "$work/run.cfg" \
  --set train.steps=1000000 --set run.dir="$work/stop" > "$work/stop.log" 2>&1 &
job=$!
for _ in $(seq 600); do # up to 60 s for the first steps
  grep -q "step 3/" "$work/stop.log" 2> /dev/null && [ -s "$work/pid.1" ] && break
  kill -0 $job 2> /dev/null || break
  sleep 0.1
done
if [ -s "$work/pid.1" ] && grep -q "step 3/" "$work/stop.log"; then
  stopped=$(cat "$work/pid.1")
  kill -STOP "$stopped"
  wait $job
  rc=$?
  took=$(($(date +%s) - start))
  msg=$(grep "collective timeout" "$work/stop.log" | head -1)
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $rc -ne 137 ] &&
     echo "$msg" | grep -qE '^\[rank 0\] collective timeout: [a-z_ ()-]+ \(collective #[0-9]+ of the run\) (at step [0-9]+|after step [0-9]+ \(between steps: [a-z, ]+\)) has not completed after [0-9]+ s \(run.collective_timeout = 3 s\); ranks that did not arrive: rank 1 \(no answer'; then
    ok "rank 1 stopped: the job ended (exit $rc, ${took} s) with: ${msg:0:160}..."
  else
    bad "rank 1 stopped: exit $rc after ${took} s, message: '$msg'"; tail -5 "$work/stop.log"
  fi
else
  bad "the long run did not reach step 3"; tail -5 "$work/stop.log"; kill $job 2> /dev/null
fi
finish watchdog

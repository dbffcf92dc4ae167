#!/usr/bin/env bash
# Will it fit, and do the ranks get their cores (the real binary, the bundled model):
#  1. `train CONFIG --dry-run` on a model folder plans from config.json without reading a
#     weight, and its backend bytes are the bytes a real run's allocator counts (LoRA on the
#     dense model, LoRA on a 4-bit base quantized at load, qzo); `bench CONFIG --dry-run`
#     and a DiT folder (planned from its weights) plan as well;
#  2. a run that cannot fit (a micro-batch of 65536 windows, 4096 sequences of 2048 tokens) is
#     refused at start with the plan's figures and a hint, before allocating: in well under a
#     second, exit status non-zero; `eval` alike;
#  3. start-up lines give each rank's cores and threads; a 1-rank run inside a Slurm job of 4
#     tasks warns (srun forgotten); 2 ranks of 2 threads on 2 shared cores under a job
#     without SLURM_CPUS_PER_TASK warn that they time-share, naming --cpus-per-task.
# usage: plan_test.sh TURBOZERO SOURCE_DIR
set -u
tz=$1 src=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/tzplan.XXXXXX")
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/../lib.sh"
cd "$src"
cfg=inputs/llama/finetune.cfg
small=(--set train.steps=1 --set data.seq_len=64 --set train.micro_batch=2 --set data.val=
       --set train.threads=1)

# ---- 1. the plan against a real run's allocator
plan_vs_run() { # name, more --set ...
  local name=$1; shift
  "$tz" train $cfg "${small[@]}" "$@" --dry-run > "$work/$name.plan" 2>&1 ||
    { bad "$name: train --dry-run failed"; tail -3 "$work/$name.plan"; return; }
  "$tz" train $cfg "${small[@]}" "$@" --set run.dir="$work/$name" > "$work/$name.log" 2>&1 ||
    { bad "$name: the run failed"; tail -3 "$work/$name.log"; return; }
  local planned real
  planned=$(sed -n 's/^planned backend memory per rank: [0-9.]* GiB (\([0-9]*\) bytes).*/\1/p' "$work/$name.plan")
  real=$(sed -n 's/.*memory per rank: backend (host) \([0-9.]*\) MiB.*/\1/p' "$work/$name.log")
  [ -z "$real" ] && # qzo's line: weights W MiB + forward activations A MiB (to 0.1 MiB)
    real=$(sed -n 's/.*memory per rank: weights \([0-9.]*\) MiB + forward activations \([0-9.]*\) MiB.*/\1 \2/p' \
           "$work/$name.log" | awk -v b="$planned" '{s = $1 + $2; d = s - b / 1048576; if (d < 0) d = -d;
                                                     if (d < 0.05) printf "%.2f", b / 1048576; else print s}')
  if grep -q "planned from config.json, no weight read" "$work/$name.plan" && [ -n "$planned" ] &&
     [ "$(awk -v b="$planned" 'BEGIN {printf "%.2f", b / 1048576}')" = "$real" ]; then
    ok "$name: the dry run plans $planned bytes from config.json alone; the run's allocator counts $real MiB"
  else
    bad "$name: planned '$planned' bytes, the run counted '$real' MiB"; head -3 "$work/$name.plan"
  fi
}
plan_vs_run lora
plan_vs_run lora-q4 --set quant.bits=4 --set quant.group=64
plan_vs_run qzo --set train.mode=qzo --set quant.bits=4 --set optim.lr=1e-4
if "$tz" bench $cfg --dry-run > "$work/bench.plan" 2>&1 && grep -q "^step model" "$work/bench.plan" &&
   "$tz" train inputs/dit/finetune.cfg --dry-run > "$work/dit.plan" 2>&1 &&
   grep -q "^planned backend memory per rank" "$work/dit.plan" && grep -q "^this machine: fits" "$work/dit.plan"; then
  ok "bench CONFIG --dry-run plans a model folder; a DiT folder is planned (from its weights)"
else
  bad "bench CONFIG --dry-run or the DiT dry run"; tail -3 "$work/bench.plan" "$work/dit.plan"
fi

# ---- 2. refused before allocating
refused() { # what, hint pattern, command ...
  local what=$1 hint=$2; shift 2
  local t0 t1 rc
  t0=$(date +%s%N)
  "$@" > "$work/refused.log" 2>&1; rc=$?
  t1=$(date +%s%N)
  if [ $rc -ne 0 ] && grep -q "does not fit in memory: host [0-9.]* GiB planned.*GiB available" "$work/refused.log" &&
     grep -q "HINT: activations are .*train.micro_batch.*data.seq_len$hint" "$work/refused.log" &&
     [ $(( (t1 - t0) / 1000000 )) -lt 5000 ]; then
    ok "$what: refused in $(( (t1 - t0) / 1000000 )) ms: $(grep -o 'host [0-9.]* GiB planned[^;]*' "$work/refused.log" | head -1)"
  else
    bad "$what: not refused as planned (exit $rc)"; grep -v "^ *#\|=" "$work/refused.log" | tail -4
  fi
}
refused "train with micro_batch 65536" ".*train.checkpointing" "$tz" train $cfg --set train.micro_batch=65536 --set run.dir="$work/big"
refused "train with seq_len 2048 x 4096 windows" ".*train.checkpointing" "$tz" train $cfg --set data.seq_len=2048 --set train.micro_batch=4096 --set run.dir="$work/long"
refused "eval with micro_batch 65536" "" "$tz" eval $cfg --set train.micro_batch=65536
"$tz" train $cfg --set data.seq_len=2048 --set train.micro_batch=4096 --dry-run > "$work/long.plan" 2>&1 &&
  grep -q "^this machine: does not fit" "$work/long.plan" && grep -q "^HINT: activations" "$work/long.plan" &&
  ok "the dry run of it says it does not fit here, with the hint" ||
  { bad "dry run of a run too large"; grep "machine" "$work/long.plan"; }
# a GPU's run whose host memory is mostly activations kept there (the checkpointed streams,
# attention's outputs): the hint names them and the switch; TZ_ATT_KEEP=0 keeps fewer
"$tz" bench --preset llama2-7b --dry-run --set train.micro_batch=512 > "$work/hacts.plan" 2>&1
TZ_ATT_KEEP=0 "$tz" bench --preset llama2-7b --dry-run --set train.micro_batch=512 > "$work/hacts0.plan" 2>&1
h1=$(grep -o "activations [0-9.]* (pinned: the checkpointed residual streams and attention's outputs)" "$work/hacts.plan" | awk '{print $2}')
h0=$(grep -o "activations [0-9.]* (pinned: the checkpointed residual streams)" "$work/hacts0.plan" | awk '{print $2}')
if grep -q "^this machine.*: does not fit" "$work/hacts.plan" &&
   grep -q "^HINT: the activations kept in host memory are .*TZ_ATT_KEEP=0" "$work/hacts.plan" &&
   [ -n "$h1" ] && [ -n "$h0" ] && awk -v a="$h1" -v b="$h0" 'BEGIN {exit !(a > 2.5 * b)}'; then
  ok "llama2-7b at micro_batch 512: the host's kept activations ($h1 GiB; $h0 with TZ_ATT_KEEP=0) named in the hint"
else
  bad "the host's kept activations in the plan and its hint: ${h1:-none}, ${h0:-none}"; grep "host\|HINT" "$work/hacts.plan"
fi

# ---- 3. cores and Slurm
bench=("$tz" bench --preset llama-tiny --set train.steps=1)
SLURM_JOB_ID=4242 SLURM_NTASKS=4 "${bench[@]}" > "$work/srun.log" 2>&1
grep -q "rank 0/1 | .* | [0-9]* cores, [0-9]* OpenMP threads" "$work/srun.log" &&
  grep -q "Slurm job 4242 has 4 tasks, but this run is 1 rank" "$work/srun.log" &&
  ok "a 1-rank run in a 4-task job warns (srun forgotten); the start-up line gives cores and threads" ||
  { bad "Slurm task count"; grep -i "warn\|cores" "$work/srun.log"; }
SLURM_JOB_ID=4242 mpirun -np 2 --oversubscribe --bind-to none -x SLURM_JOB_ID "${bench[@]}" \
  --set train.threads=$(nproc) > "$work/share.log" 2>&1
grep -q "2 ranks on host .* run $((2 * $(nproc))) OpenMP threads on $(nproc) cores: they time-share" "$work/share.log" &&
  grep -q "SLURM_CPUS_PER_TASK is not set.*--cpus-per-task" "$work/share.log" &&
  ok "2 ranks x $(nproc) threads on $(nproc) cores in a job without --cpus-per-task: warned" ||
  { bad "time-sharing ranks"; grep -i "warn\|cores" "$work/share.log"; }
finish plan

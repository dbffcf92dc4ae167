#!/usr/bin/env bash
# optim.offload = false (the optimizer on the backend, optim/zero.c) on the CPU backend,
# against the default host optimizer:
#  - the bundled LoRA job, 10 steps of 2 accumulated micro-batches: every step's loss within
#    1e-6 (relative) of the host optimizer's, and the gradient norms too (the same AdamW
#    arithmetic; only the order of the gradient sums and the norm's additions differ);
#  - killed after its step-4 checkpoint and resumed, it ends with the adapter of the
#    uninterrupted run, byte for byte (the checkpoint carries the backend's masters and
#    moments); a checkpoint of the host optimizer resumes with offload = false too;
#  - refused with the setting named: full fine-tuning of quantized weights, two ranks;
#  - `bench --dry-run` plans the backend's optimizer state (equal to the allocator's peak on a
#    GPU, where bench prints the peak), and bench names where the step ran.
# usage: offload_device_test.sh TURBOZERO [MPIEXEC]
set -u
tz=$1 mpiexec=${2:-}
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
source tests/lib.sh
work=$(mktemp -d "${TMPDIR:-/tmp}/tzoffdev.XXXXXX")
trap 'rm -rf "$work"' EXIT
c=(inputs/llama/finetune.cfg --set train.steps=10 --set train.eval_every=0 --set train.micro_batch=2
   --set train.grad_accum=2 --set data.seq_len=64 --set train.checkpoint_every=4 --set run.overwrite=true)

"$tz" train "${c[@]}" --set run.dir="$work/host" > "$work/host.log" 2>&1 || { tail -5 "$work/host.log"; bad "host optimizer run failed"; }
"$tz" train "${c[@]}" --set optim.offload=false --set run.dir="$work/dev" > "$work/dev.log" 2>&1 ||
  { tail -5 "$work/dev.log"; bad "backend optimizer run failed"; }
if /usr/bin/python3 - "$work/host/metrics.jsonl" "$work/dev/metrics.jsonl" <<'PY'
import json, sys
a, b = ([json.loads(l) for l in open(f) if '"loss"' in l] for f in sys.argv[1:3])
assert len(a) == len(b) == 10, (len(a), len(b))
worst = max(max(abs(x["loss"] - y["loss"]) / abs(x["loss"]),
                abs(x["grad_norm"] - y["grad_norm"]) / abs(x["grad_norm"])) for x, y in zip(a, b))
trained = a[-1]["loss"] < a[0]["loss"] and b[-1]["loss"] < b[0]["loss"]
print(f"worst relative difference {worst:.2e}; losses {b[0]['loss']:.4f} -> {b[-1]['loss']:.4f}")
sys.exit(0 if worst <= 1e-6 and trained else 1)
PY
then ok "offload = false: 10 steps' losses and gradient norms within 1e-6 of the host optimizer's"
else bad "offload = false: losses differ from the host optimizer's"; fi
grep -q "memory per rank: .* + optimizer [0-9.]* " "$work/dev.log" &&
  ok "offload = false: the memory line counts the backend's optimizer state" ||
  bad "offload = false: no optimizer in the memory line"

# killed after the step-4 checkpoint, resumed: the uninterrupted run's adapter
TZ_CKPT_FAULT=rank=0,at=step,step=6,do=kill "$tz" train "${c[@]}" --set optim.offload=false \
  --set run.dir="$work/kill" > "$work/kill.log" 2>&1
"$tz" train "${c[@]}" --set optim.offload=false --set run.dir="$work/kill" --resume > "$work/resume.log" 2>&1 &&
  grep -q "resumed from .*step-4" "$work/resume.log" &&
  cmp -s "$work/dev/adapter/adapter_model.safetensors" "$work/kill/adapter/adapter_model.safetensors" &&
  ok "offload = false: killed at step 6, resumed from step 4: the uninterrupted adapter, byte for byte" ||
  { tail -3 "$work/resume.log"; bad "offload = false: the resumed run differs"; }
# the host optimizer's checkpoint, resumed with the backend's
TZ_CKPT_FAULT=rank=0,at=step,step=6,do=kill "$tz" train "${c[@]}" --set run.dir="$work/mix" > "$work/mix.log" 2>&1
"$tz" train "${c[@]}" --set optim.offload=false --set run.dir="$work/mix" --resume > "$work/mix2.log" 2>&1 &&
  grep -q "resumed from .*step-4" "$work/mix2.log" && grep -q "+ optimizer " "$work/mix2.log" &&
  /usr/bin/python3 - "$work/dev/metrics.jsonl" "$work/mix/metrics.jsonl" <<'PY' &&
import json, sys
a, b = ([json.loads(l) for l in open(f) if '"loss"' in l] for f in sys.argv[1:3])
sys.exit(0 if abs(a[-1]["loss"] - b[-1]["loss"]) <= 1e-6 * abs(a[-1]["loss"]) else 1)
PY
  ok "a host optimizer's checkpoint resumes with offload = false (last loss within 1e-6)" ||
  { tail -3 "$work/mix2.log"; bad "a host optimizer's checkpoint did not resume with offload = false"; }

# refusals
"$tz" train "${c[@]}" --set optim.offload=false --set train.mode=full --set quant.bits=4 --set train.steps=1 \
  --set run.dir="$work/q" > "$work/q.log" 2>&1
grep -q "optim.offload = false: .* is a trainable quantized weight" "$work/q.log" &&
  ok "full fine-tuning of quantized weights with offload = false refused: $(grep -m1 -o 'optim.offload = false: [^;]*' "$work/q.log")" ||
  { tail -3 "$work/q.log"; bad "quantized trainables with offload = false: not refused as expected"; }
if [ -n "$mpiexec" ]; then
  "$mpiexec" -np 2 --oversubscribe "$tz" train "${c[@]}" --set optim.offload=false --set train.steps=1 \
    --set run.dir="$work/two" > "$work/two.log" 2>&1
  grep -q "optim.offload = false: the optimizer on the backend runs on one rank only" "$work/two.log" &&
    ok "two ranks with offload = false refused" || { tail -3 "$work/two.log"; bad "two ranks: not refused as expected"; }
fi

# the plan counts it, to the byte
plan=$("$tz" bench --preset llama-tiny --set optim.offload=false --dry-run 2>&1 | grep -o 'planned backend memory per rank: [0-9.]* GiB ([0-9]* bytes)')
peak=$("$tz" bench --preset llama-tiny --set optim.offload=false --set train.steps=2 2>&1 | grep -o 'backend (host) [0-9.]* MiB' | head -1)
want=$(grep -o '([0-9]* bytes)' <<< "$plan" | tr -dc 0-9)
if [ -n "$want" ] && "$tz" bench --preset llama-tiny --set optim.offload=false --dry-run 2>&1 | grep -q "+ optimizer " &&
  "$tz" bench --preset llama-tiny --set optim.offload=false --set train.steps=2 2>&1 | grep -q "optimizer step on the backend"; then
  ok "bench --dry-run plans the backend's optimizer: $plan (run: $peak)"
else bad "bench --dry-run: no optimizer in the plan"; fi
finish offload_device

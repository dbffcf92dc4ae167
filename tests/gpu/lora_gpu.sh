#!/bin/bash
# The bundled Llama's LoRA job (inputs/llama/finetune.cfg: rank 16 on every projection, 8 x 256
# tokens per step, lr 2e-3, warmup 20) for 100 steps on the GPU and on the CPU, from the same
# seed: the GPU with run.precision = "fp32" and with "bf16" (the GPU's default). Usage:
# lora_gpu.sh TURBOZERO [WORKDIR]. Exit 77 (skip) when the CUDA backend cannot be created (no
# GPU, a build without CUDA, the module missing), with the reason.
#
# Tolerances. fp32: the two runs apply the same updates up to rounding (each op within 1e-5
# of the CPU's, test_cuda_ops), and 100 AdamW steps carry those differences along without
# blowing them up at this learning rate; the validation loss after training (first 32
# windows) must agree within 0.01 nats/byte, under 1% of the ~1.5 nats the run gains, and
# each run must gain more than 0.5 nats (so a run that did not train cannot pass); before
# training within 1e-4. bf16: every GEMM rounds its operands to bf16 (2^-8 relative), which
# moved the untrained model's validation loss by 4.8e-5 on the CPU emulation of the CUDA
# backend (3.613114 against 3.613066, 2026-11-23); before training within 1e-3, after 100
# steps within 0.03 nats (2% of the gain: the bf16 run follows its own trajectory).
set -uo pipefail
tz=${1:?usage: lora_gpu.sh TURBOZERO [WORKDIR]}
root=$(cd "$(dirname "$0")/../.." && pwd)
work=${2:-$(mktemp -d)}
cd "$root"
source tests/lib.sh
mkdir -p "$work"
common=(--set train.steps=100 --set train.eval_every=0 --set train.eval_windows=32
        --set train.log_every=25 --set run.overwrite=true)

t0=$SECONDS
"$tz" train inputs/llama/finetune.cfg "${common[@]}" --set run.device=cuda --set run.precision=fp32 \
  --set run.dir="$work/gpu" > "$work/gpu.log" 2>&1
rc=$?
why=$(grep -oE 'no CUDA device is visible[^(]*|the CUDA backend cannot be loaded: .*|this build has no CUDA backend' "$work/gpu.log" | head -1)
if [ $rc -ne 0 ] && [ -n "$why" ]; then echo "skip: $why"; exit 77; fi
[ $rc -eq 0 ] || { tail -20 "$work/gpu.log"; bad "the GPU run failed (exit $rc)"; finish lora_gpu; exit 1; }
echo "     GPU run (fp32): $((SECONDS - t0)) s ($(grep -m1 -o 'cuda backend on .*' "$work/gpu.log"))"
t0=$SECONDS
"$tz" train inputs/llama/finetune.cfg "${common[@]}" --set run.device=cuda --set run.precision=bf16 \
  --set run.dir="$work/gpu16" > "$work/gpu16.log" 2>&1 ||
  { tail -20 "$work/gpu16.log"; bad "the GPU run in bf16 failed"; finish lora_gpu; exit 1; }
echo "     GPU run (bf16): $((SECONDS - t0)) s"
t0=$SECONDS
"$tz" train inputs/llama/finetune.cfg "${common[@]}" --set run.device=cpu \
  --set run.dir="$work/cpu" > "$work/cpu.log" 2>&1 || { tail -20 "$work/cpu.log"; bad "the CPU run failed"; finish lora_gpu; exit 1; }
echo "     CPU run: $((SECONDS - t0)) s"

# eval_loss of step 0 and of the last step, from metrics.jsonl
evals() { grep -o '"eval_loss": [0-9.]*' "$1/metrics.jsonl" | awk '{print $2}' | sed -n '1p;$p' | tr '\n' ' '; }
within() { awk -v a="${1:-x}" -v b="${2:-y}" -v t="$3" 'BEGIN {d = a - b; exit !(a != "x" && b != "y" && d <= t && d >= -t)}'; }
read -r c0 c1 <<< "$(evals "$work/cpu")"
for run in gpu:fp32:1e-4:0.01 gpu16:bf16:1e-3:0.03; do
  IFS=: read -r dir prec t0tol t1tol <<< "$run"
  read -r g0 g1 <<< "$(evals "$work/$dir")"
  echo "     validation loss (32 windows): GPU $prec ${g0:-?} -> ${g1:-?}, CPU ${c0:-?} -> ${c1:-?}"
  within "$g0" "$c0" "$t0tol" &&
    ok "$prec: the same start: step 0 validation loss within $t0tol (GPU $g0, CPU $c0)" ||
    bad "$prec: step 0 validation loss: GPU ${g0:-?}, CPU ${c0:-?} (more than $t0tol apart)"
  awk -v a="${g0:-0}" -v b="${g1:-9}" -v c="${c0:-0}" -v e="${c1:-9}" 'BEGIN {exit !(a - b > 0.5 && c - e > 0.5)}' &&
    ok "$prec: both runs trained (gains GPU $(awk -v a="$g0" -v b="$g1" 'BEGIN{printf "%.3f", a-b}'), CPU $(awk -v a="$c0" -v b="$c1" 'BEGIN{printf "%.3f", a-b}'))" ||
    bad "$prec: a run gained 0.5 nats or less"
  within "$g1" "$c1" "$t1tol" &&
    ok "$prec: after 100 steps the GPU run's validation loss is within $t1tol of the CPU run's ($g1 against $c1)" ||
    bad "$prec: after 100 steps: GPU ${g1:-?}, CPU ${c1:-?} (more than $t1tol apart)"
done
finish lora_gpu

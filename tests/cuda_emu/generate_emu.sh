#!/usr/bin/env bash
# `generate` on the emulated CUDA device (libtzcuda_emu.so) against the CPU, on the bundled model
# (byte-level: a token is a byte): the command runs on run.device as eval and sample do, with
# the device's key/value cache, its attention over that cache and, on a 4-bit base, a decode
# step's products through the fused narrow kernel (docs/design/cuda.md).
#  1. run.precision = "fp32": the same 40 greedy tokens as the CPU (the logits agree to fp32
#     rounding: test_gpu_model);
#  2. the device's default precision (bf16 GEMM operands, the cache in bf16), dense and on a
#     4-bit base: the same 12 greedy tokens as the CPU's fp32 run (the logits agree within
#     bf16 rounding, test_gpu_model's decode case: 3.91e-3 of the largest; measured
#     2026-11-28, these prompts' greedy tokens are the CPU's for 40 tokens in both);
#  3. the emulated run names its device a CPU emulation, on stderr: standard output holds the
#     text alone (the backend's and the quantized base's start-up lines went there before);
#  4. the prompt's pass takes attention's forward (the flash kernels, the cache holding the
#     prompt alone) and the decode steps attention over the cache: a fault planted in either
#     kernel stops the run.
# Not a GPU result; 12 tokens at bf16 take some 4 s here each.
# usage: generate_emu.sh TURBOZERO SOURCE_DIR LIBTZCUDA_EMU
set -u
tz=$1 src=$2
export TZ_CUDA_MODULE=$3
source "$(dirname "$0")/../lib.sh"
cd "$src"
err=$(mktemp "${TMPDIR:-/tmp}/tzgenemu.XXXXXX")
trap 'rm -f "$err"' EXIT
prompt=":hacker: n. "
gen() { timeout 120 "$tz" generate inputs/llama/finetune.cfg --prompt "$prompt" "$@" 2> "$err"; }
# same WHAT N ARGS...: the device's N greedy tokens against the CPU's
same() {
  local what=$1 n=$2 cpu dev
  shift 2
  cpu=$(gen --max-new "$n" --set run.device=cpu "$@") || { bad "$what: the CPU run failed"; cat "$err"; return; }
  dev=$(gen --max-new "$n" --set run.device=cuda "$@") || { bad "$what: the device run failed"; cat "$err"; return; }
  grep -q "CPU emulation of CUDA" "$err" || bad "$what: the device run does not name its device a CPU emulation"
  grep -q "generate: 12 prompt tokens, $n new" "$err" || { bad "$what: not $n new tokens"; cat "$err"; }
  grep -qE "; device memory peak [0-9]+\.[0-9]+ GiB$" "$err" ||
    bad "$what: the device run's stderr line does not end with its memory peak"
  # standard output is the text alone (a byte a token here), the start-up lines on stderr
  [ "$(LC_ALL=C; echo ${#dev})" -eq "$n" ] &&
    ok "$what: standard output holds the $n bytes of text alone" ||
    bad "$what: standard output is not $n bytes of text: '${dev//$'\n'/\\n}'"
  [ -n "$cpu" ] && [ "$cpu" == "$dev" ] &&
    ok "$what: the device's $n greedy tokens are the CPU's: '${dev//$'\n'/\\n}'" ||
    bad "$what: device '${dev//$'\n'/\\n}', CPU '${cpu//$'\n'/\\n}'"
}
# which kernels run: a fault planted in one (the emulation's TZ_CUDA_EMU_FAULT) stops the run
for k in k_fa_fwd:"the prompt's pass runs attention's flash forward" \
  k_att_cache:"the decode steps run attention over the key/value cache"; do
  if ! TZ_CUDA_EMU_FAULT=${k%%:*} gen --max-new 2 --set run.device=cuda > /dev/null &&
    grep -q "illegal memory access" "$err"; then
    ok "${k#*:} (a fault planted in ${k%%:*} stops it)"
  else
    bad "${k#*:}: a fault planted in ${k%%:*} did not show"; cat "$err"
  fi
done
same "fp32" 40 --set run.precision=fp32
same "bf16 (the device's default), dense" 12
same "bf16, a 4-bit TurboQuant base" 12 --set quant.bits=4
finish generate_emu

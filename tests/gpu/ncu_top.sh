#!/bin/bash
# Nsight Compute on named kernels of the 7B LoRA bench step, on the GPU machine
# (tests/gpu/device.sh ncu): for each kernel, one launch (past the first few, so caches and
# clocks are warm) with the Speed Of Light, memory, launch and occupancy sections; ncu ends the
# program when it has it (--kill on), so each costs the bench's set-up and one kernel.
# Usage: ncu_top.sh TURBOZERO OUTDIR [KERNEL ...] (a kernel: the regex of its function name;
# default: the flash attention kernels, the 4-bit decode, the rotation, the narrow GEMM that
# takes LoRA's rank-16 products (its DRAM throughput against the memory's rate is the figure
# to read) and cuBLAS's GEMMs, of which 12 launches in a row: the base and folded products,
# and with TZ_NARROW_GEMM=0 LoRA's too, whose grid sizes say whether the library gives these
# rank-16 rows or columns of 2,048 x 4,096 operands enough blocks). A first check on the tiny
# preset says whether ncu sees the program's kernels at all.
set -uo pipefail
tz=${1:?usage: ncu_top.sh TURBOZERO OUTDIR [KERNEL ...]}
out=${2:?usage: ncu_top.sh TURBOZERO OUTDIR [KERNEL ...]}
shift 2
kernels=("$@")
[ ${#kernels[@]} -gt 0 ] || kernels=(k_fa_fwd k_fa_dq k_fa_dkv k_dequant k_rotate k_narrow_part 'nvjet|gemm|xmma')
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$ncu" ] && [ -x "$ncu" ] || { echo "ncu: not found"; exit 77; }
mkdir -p "$out"
sections=(--section SpeedOfLight --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy)
show='Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy|Grid Size|Block Size|Theoretical Occupancy|==PROF==|==WARNING== No kernels'
# the flash kernels also: what their schedulers issue and why their warps wait (whether the
# per-score instructions, the mma, shared memory or the barriers set their pace: the
# question their next change turns on, docs/gpu.md)
fa_sections=(--section ComputeWorkloadAnalysis --section SchedulerStats --section WarpStateStats)
fa_show='Executed Ipc|Issue Slots Busy|Issued Warp Per Scheduler|No Eligible|Active Warps Per Scheduler|Eligible Warps Per Scheduler|Warp Cycles Per Issued|Local Memory Spilling|stalled|Shared Memory Throughput'

echo "== ncu check: k_rotate of the tiny preset"
timeout 60 "$ncu" --clock-control none --kill on -k regex:k_rotate --launch-count 1 \
  "${sections[@]}" "$tz" bench --preset llama-tiny --set run.device=cuda --set train.steps=2 \
  > "$out/ncu-check.txt" 2>&1
grep -E "$show" "$out/ncu-check.txt" | grep -v pmix | head -6

i=0
for k in "${kernels[@]}"; do
  i=$((i + 1))
  n=1 lines=14 extra=() pat=$show
  case $k in *gemm*) n=12 lines=160 ;; esac # (several GEMMs: their shapes differ)
  case $k in k_fa*) extra=("${fa_sections[@]}") pat="$show|$fa_show" lines=40 ;; esac
  echo "== ncu: $k (7B LoRA step, launch 6, $n)"
  timeout "${TZ_NCU_SECONDS:-75}" "$ncu" --clock-control none --kill on -k "regex:$k" \
    --launch-skip 5 --launch-count $n "${sections[@]}" "${extra[@]}" \
    "$tz" bench --preset llama2-7b --set train.steps=2 > "$out/ncu-$i.txt" 2>&1
  echo "   (exit $?)"
  grep -E "^  [a-zA-Z_].*\(|$pat" "$out/ncu-$i.txt" | grep -v pmix | head -$lines
done

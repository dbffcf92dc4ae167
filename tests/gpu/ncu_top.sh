#!/bin/bash
# Nsight Compute over the 7B LoRA bench step, on the GPU machine (tests/gpu/device.sh ncu):
#  1. the duration of every kernel in a window of launches (one metric, no replay), summed by
#     kernel name: where the GPU time of the window goes, kernel by kernel;
#  2. the Speed Of Light, memory and launch sections of the three kernels that took the most
#     time in the window (one launch each).
# Usage: ncu_top.sh TURBOZERO OUTDIR [SKIP COUNT]. The window starts SKIP launches into the run
# (past set-up) and holds COUNT launches; ncu ends the program when it has them (--kill on).
set -uo pipefail
tz=${1:?usage: ncu_top.sh TURBOZERO OUTDIR [SKIP COUNT]}
out=${2:?usage: ncu_top.sh TURBOZERO OUTDIR [SKIP COUNT]}
skip=${3:-3000} count=${4:-6000}
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$ncu" ] && [ -x "$ncu" ] || { echo "ncu: not found"; exit 77; }
mkdir -p "$out"
run=("$tz" bench --preset llama2-7b --set train.steps=2)

"$ncu" --clock-control none --kill on --launch-skip "$skip" --launch-count "$count" \
  --metrics gpu__time_duration.sum --csv --page raw --print-units base --print-kernel-base function "${run[@]}" \
  > "$out/ncu-window.csv" 2> "$out/ncu-window.err"
echo "ncu window: exit $?, $(grep -c '^"' "$out/ncu-window.csv") rows"

# sum by kernel name; the top three names go to top.txt
python3 - "$out/ncu-window.csv" "$out/top.txt" <<'PY' | tee "$out/ncu-kernels.txt"
import csv, sys, collections
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
head, data = rows[0], rows[1:]
name = head.index("Kernel Name"); dur = head.index("gpu__time_duration.sum")
tot = collections.defaultdict(float); n = collections.Counter()
for r in data:
    try: v = float(r[dur].replace(",", ""))
    except ValueError: continue  # the units row
    tot[r[name]] += v; n[r[name]] += 1
all_ns = sum(tot.values())
print(f"{sum(n.values())} launches, {all_ns/1e6:.2f} ms of kernel time in the window")
print(f"{'kernel':60s} {'launches':>8s} {'ms':>9s} {'share':>6s} {'us each':>8s}")
top = sorted(tot, key=tot.get, reverse=True)
for k in top[:20]:
    print(f"{k[:60]:60s} {n[k]:8d} {tot[k]/1e6:9.3f} {100*tot[k]/all_ns:5.1f}% {tot[k]/n[k]/1e3:8.1f}")
open(sys.argv[2], "w").write("\n".join(top[:3]) + "\n")
PY

i=0
while read -r k; do
  [ -n "$k" ] || continue
  i=$((i + 1))
  echo "== ncu sections of $k"
  timeout 90 "$ncu" --clock-control none --kill on -k "regex:^${k}$" --launch-skip 5 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy \
    --print-kernel-base function "${run[@]}" > "$out/ncu-top$i.txt" 2>&1
  grep -E 'Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy|Grid Size|Block Size|Theoretical Occupancy' \
    "$out/ncu-top$i.txt" | head -12
done < "$out/top.txt"

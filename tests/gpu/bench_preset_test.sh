#!/bin/bash
# bench --preset on the CPU (the GPU figures come from tests/gpu/device.sh): the Llama-2-7B and
# DiT-XL/2 shapes planned by --dry-run (parameter counts, planned memory), the full-size
# presets refused on a CPU backend, and the CPU-sized presets run: the allocator's peak equals
# the dry run's plan, and the step split is printed. Usage: bench_preset_test.sh TURBOZERO [WORK]
set -uo pipefail
tz=${1:?usage: bench_preset_test.sh TURBOZERO [WORKDIR]}
root=$(cd "$(dirname "$0")/../.." && pwd)
work=${2:-$(mktemp -d)}
cd "$root"
source tests/lib.sh
mkdir -p "$work"
export OMP_WAIT_POLICY=PASSIVE

# 1. Llama-2-7B: 6,738,415,616 base parameters (the published count) + LoRA r16 on all 7
#    projections of 32 layers = 32 * 16 * (4 * 2 * 4096 + 2 * (4096 + 11008) + 11008 + 4096)
"$tz" bench --preset llama2-7b --dry-run --set run.device=cpu > "$work/7b.log" 2>&1 ||
  { bad "dry run llama2-7b failed"; tail -3 "$work/7b.log"; }
lora=$((32 * 16 * (4 * 2 * 4096 + 3 * (4096 + 11008))))
grep -q "$((6738415616 + lora)) params, $lora trainable (lora)" "$work/7b.log" &&
  ok "llama2-7b: 6738415616 base parameters + $lora LoRA parameters" ||
  bad "llama2-7b parameter count: $(grep -o '[0-9]* params, [0-9]* trainable' "$work/7b.log")"
# codes + scales of the 224 projections: 4 bits + a bf16 scale per 128 weights (+ 16 levels each)
proj=$((32 * (4 * 4096 * 4096 + 3 * 4096 * 11008)))
want=$(awk -v p=$proj 'BEGIN {printf "%.3f", (p * (0.5 + 2 / 128) + 224 * 64) / 2^30}')
got=$(grep -o 'codes + scales [0-9.]*' "$work/7b.log" | awk '{print $4}')
[ "$got" = "$want" ] && ok "llama2-7b: planned codes + scales $got GiB" ||
  bad "llama2-7b: planned codes + scales ${got:-?} GiB, expected $want"
grep -q "planned backend memory per rank: [0-9.]* GiB" "$work/7b.log" &&
  ok "llama2-7b: $(grep -o 'planned backend memory per rank: [0-9.]* GiB' "$work/7b.log")" ||
  bad "no planned memory line"
# DiT-XL/2: 675,129,632 parameters in DiT's own count, of which the fixed 256 x 1152
# position table is a buffer here
"$tz" bench --preset dit-xl-2 --dry-run --set run.device=cpu > "$work/xl.log" 2>&1 ||
  { bad "dry run dit-xl-2 failed"; tail -3 "$work/xl.log"; }
grep -q "$((675129632 - 256 * 1152)) params" "$work/xl.log" &&
  ok "dit-xl-2: $((675129632 - 256 * 1152)) parameters (DiT-XL/2 without its position table)" ||
  bad "dit-xl-2 parameter count: $(grep -o '[0-9]* params' "$work/xl.log")"

# 2. refused on a CPU backend, at once and with the way out
for p in llama2-7b dit-xl-2; do
  timeout 60 "$tz" bench --preset $p --set run.device=cpu > "$work/no-$p.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "needs a GPU" "$work/no-$p.log" && grep -q "HINT:.*--dry-run" "$work/no-$p.log" &&
    ok "$p on the CPU: refused (exit $rc) with a hint" || bad "$p on the CPU: exit $rc, $(tail -1 "$work/no-$p.log")"
done

# 3. the CPU-sized presets run; the allocator's peak is the dry run's plan
plan() { grep -o 'planned backend memory per rank: [0-9.]* GiB ([0-9]* bytes)' "$1" | grep -o '([0-9]*' | tr -d '('; }
peak() { grep -m1 -o 'allocator peak [0-9.]* GiB ([0-9]* bytes' "$1" | awk '{print $5}' | tr -d '('; }
for p in llama-tiny dit-tiny flux-tiny; do
  "$tz" bench --preset $p --dry-run --set run.device=cpu > "$work/$p-plan.log" 2>&1
  "$tz" bench --preset $p --set run.device=cpu --set train.threads=2 > "$work/$p.log" 2>&1 || { bad "bench $p failed"; tail -3 "$work/$p.log"; continue; }
  a=$(plan "$work/$p-plan.log") b=$(peak "$work/$p.log")
  [ -n "$a" ] && [ "$a" = "$b" ] && ok "$p: allocator peak $b bytes, as planned" || bad "$p: planned ${a:-?} bytes, allocator peak ${b:-?}"
  split=$(grep -o 'step split, .*' "$work/$p.log")
  echo "$split" | grep -qE 'forward [0-9.]+ s.*backward [0-9.]+ s.*communication.*copies.*optimizer.*other.*sum' &&
    ok "$p: $(grep -o 'bench: .*' "$work/$p.log" | grep -oE '[0-9]+ (tokens|images|samples)/s \|' | tr -d ' |'), ${split%%|*}" ||
    bad "$p: no step split line"
done
OMPI_MCA_rmaps_base_oversubscribe=1 mpirun -np 2 "$tz" bench --preset llama-tiny --set run.device=cpu --set train.threads=1 > "$work/np2.log" 2>&1
OMPI_MCA_rmaps_base_oversubscribe=1 mpirun -np 2 "$tz" bench --preset llama-tiny --dry-run --set run.device=cpu > "$work/np2-plan.log" 2>&1
a=$(plan "$work/np2-plan.log") b=$(peak "$work/np2.log")
[ -n "$a" ] && [ "$a" = "$b" ] && ok "llama-tiny, 2 ranks: allocator peak $b bytes (with the stage-2 staging), as planned" ||
  bad "llama-tiny, 2 ranks: planned ${a:-?} bytes, allocator peak ${b:-?}"

# 4. the 7B recipe as a GPU runs it (bf16 GEMM operands, a preset's dry run by default): at
#    most 4.5 GiB of planned GPU memory. The figures are read from the line that names the
#    planned backend memory, whatever else it says.
plan_bytes() { grep -m1 -i 'planned backend memory' "$1" | grep -oE '[0-9]+ bytes' | head -1 | grep -oE '[0-9]+'; }
"$tz" bench --preset llama2-7b --dry-run > "$work/7b-gpu.log" 2>&1 ||
  { bad "dry run llama2-7b (GPU) failed"; tail -3 "$work/7b-gpu.log"; }
a=$(plan_bytes "$work/7b-gpu.log") limit=$((9 * 2 ** 29))
grep -qi 'bf16' "$work/7b-gpu.log" && [ -n "$a" ] && [ "$a" -le $limit ] &&
  ok "llama2-7b on a GPU: $a bytes planned ($(awk -v b="$a" 'BEGIN {printf "%.3f", b / 2^30}') GiB), at most 4.5 GiB" ||
  bad "llama2-7b on a GPU: planned ${a:-?} bytes, more than 4.5 GiB ($limit), or not with bf16 operands"

# 4b. the narrow GEMM's switch: the same plan without it (its workspace is outside the plan,
#     with the GEMM operands' buffer), the step model's GEMM bytes apart; anything but 0 or 1
#     refused, naming the variable
TZ_NARROW_GEMM=0 TZ_STEP_OPS=1 "$tz" bench --preset llama2-7b --dry-run > "$work/7b-nonarrow.log" 2>&1
TZ_STEP_OPS=1 "$tz" bench --preset llama2-7b --dry-run > "$work/7b-narrow.log" 2>&1
gemm_gb() { awk '$1 == "GEMM" { print $4; exit }' "$1"; }
n0=$(gemm_gb "$work/7b-nonarrow.log") n1=$(gemm_gb "$work/7b-narrow.log")
[ "$(plan_bytes "$work/7b-nonarrow.log")" = "$a" ] && [ -n "$n0" ] && [ -n "$n1" ] && [ "$n0" != "$n1" ] &&
  ok "llama2-7b with TZ_NARROW_GEMM=0: the same plan, the step model's GEMM bytes $n0 GB against $n1" ||
  bad "llama2-7b with TZ_NARROW_GEMM=0: plan $(plan_bytes "$work/7b-nonarrow.log") (want $a), GEMM GB '$n0' against '$n1'"
TZ_NARROW_GEMM=yes "$tz" bench --preset llama2-7b --dry-run > "$work/7b-narrow-bad.log" 2>&1
rc=$?
[ $rc -ne 0 ] && grep -q "TZ_NARROW_GEMM=yes: expected 1" "$work/7b-narrow-bad.log" &&
  ok "TZ_NARROW_GEMM=yes refused, naming the variable (exit $rc)" ||
  bad "TZ_NARROW_GEMM=yes: exit $rc, $(head -c 200 "$work/7b-narrow-bad.log")"

# 4c. the fused quantized products' switch (Flux.1-dev's modulations on its one row: the
#     codes decoded inside the narrow kernel): the same plan without it, the step model's
#     decode bytes apart; anything but 0 or 1 refused, naming the variable
TZ_TQ_FUSED=0 TZ_STEP_OPS=1 "$tz" bench --preset flux-dev --dry-run > "$work/flux-nofused.log" 2>&1
TZ_STEP_OPS=1 "$tz" bench --preset flux-dev --dry-run > "$work/flux-fused.log" 2>&1
quant_gb() { awk '$1 == "quant" { print $6; exit }' "$1"; }
f=$(plan_bytes "$work/flux-fused.log") q0=$(quant_gb "$work/flux-nofused.log") q1=$(quant_gb "$work/flux-fused.log")
[ -n "$f" ] && [ "$(plan_bytes "$work/flux-nofused.log")" = "$f" ] && [ -n "$q0" ] && [ -n "$q1" ] &&
  awk -v a="$q0" -v b="$q1" 'BEGIN { exit !(b + 0 < a + 0) }' &&
  ok "flux-dev with TZ_TQ_FUSED=0: the same plan ($f bytes), the step model's decode bytes $q0 GB against $q1 fused" ||
  bad "flux-dev with TZ_TQ_FUSED=0: plan $(plan_bytes "$work/flux-nofused.log") (want ${f:-?}), decode GB '$q0' against '$q1'"
TZ_TQ_FUSED=yes "$tz" bench --preset flux-dev --dry-run > "$work/flux-fused-bad.log" 2>&1
rc=$?
[ $rc -ne 0 ] && grep -q "TZ_TQ_FUSED=yes: expected 1" "$work/flux-fused-bad.log" &&
  ok "TZ_TQ_FUSED=yes refused, naming the variable (exit $rc)" ||
  bad "TZ_TQ_FUSED=yes: exit $rc, $(head -c 200 "$work/flux-fused-bad.log")"

# 5. the allocator's peak is the plan with the MLP in chunks (B*T rows of the hidden size above
#    TZ_LLAMA_MLP_FLOATS: 9 x 2048 tokens of llama-tiny), at 1 and 2 ranks
chunked="--set data.seq_len=2048 --set train.micro_batch=9 --set train.steps=1"
for np in 1 2; do
  run=("$tz") && [ $np -gt 1 ] && run=(mpirun -np $np "$tz")
  "${run[@]}" bench --preset llama-tiny $chunked --set run.device=cpu --set train.threads=$((2 / np)) > "$work/chunks$np.log" 2>&1 ||
    { bad "bench llama-tiny with MLP chunks, $np ranks, failed"; tail -3 "$work/chunks$np.log"; continue; }
  "${run[@]}" bench --preset llama-tiny $chunked --dry-run --set run.device=cpu > "$work/chunks$np-plan.log" 2>&1
  a=$(plan_bytes "$work/chunks$np-plan.log") b=$(peak "$work/chunks$np.log")
  [ -n "$a" ] && [ "$a" = "$b" ] && ok "llama-tiny, MLP in chunks, $np rank(s): allocator peak $b bytes, as planned" ||
    bad "llama-tiny, MLP in chunks, $np rank(s): planned ${a:-?} bytes, allocator peak ${b:-?}"
done

# 6. on the CPU emulation of the CUDA backend, where built (bf16 operands: the saved residual
#    streams in host memory, one slot of them on the device): the allocator's peak is the plan.
#    TZ_BENCH_CUDA_MODULE=the real CUDA module runs the same checks on a GPU (device.sh).
emu=${TZ_BENCH_CUDA_MODULE:-$(dirname "$tz")/libtzcuda_emu.so}
where="the emulated device" && [ -n "${TZ_BENCH_CUDA_MODULE:-}" ] && where="the GPU"
if [ -f "$emu" ]; then
  # (--no-split: bench_preset_emu checks a device's split; 2 extra steps each here cost 20 s)
  small="--set run.device=cuda --set data.seq_len=32 --set train.micro_batch=2 --set train.steps=1"
  TZ_CUDA_MODULE=$emu "$tz" bench --preset llama-tiny $small --no-split --set train.threads=2 > "$work/emu.log" 2>&1 ||
    { bad "bench llama-tiny on $where failed"; tail -3 "$work/emu.log"; }
  TZ_CUDA_MODULE=$emu "$tz" bench --preset llama-tiny $small --dry-run > "$work/emu-plan.log" 2>&1
  a=$(plan_bytes "$work/emu-plan.log") b=$(peak "$work/emu.log")
  [ -n "$a" ] && [ "$a" = "$b" ] && ok "llama-tiny on $where: allocator peak $b bytes, as planned" ||
    bad "llama-tiny on $where: planned ${a:-?} bytes, allocator peak ${b:-?}"
  n=$(grep -c 'bench step\|bench extra step\|step split' "$work/emu.log")
  [ "$n" = 1 ] && ok "bench --no-split on $where: the timed step alone, no split" ||
    bad "bench --no-split on $where: $n lines of steps and split, expected the one timed step"
  # each weight decoded whole (TZ_TQ_CHUNKS=1: one tile the size of the largest weight, not
  # two quarters): the plan follows, still the peak; and, on the emulation, with less shared
  # memory a block (TZ_CUDA_EMU_SMEM_OPTIN=24576: under the wide attention forward's 30 KiB at
  # this head size, as sm_86's 99 KiB is at 128), so that the forward falls back to 64 query
  # rows a block (where it did not, its launch fails): the same loss (the emulation's GEMMs
  # sum alike at any width; a GPU's cuBLAS may not, and a GPU's limit is its own). One run for
  # both. A bad chunk count is refused, named.
  c4=$a l4=$(grep -oE 'step 1/1 \| loss [0-9.]+' "$work/emu.log")
  smem=() && [ -z "${TZ_BENCH_CUDA_MODULE:-}" ] && smem=(TZ_CUDA_EMU_SMEM_OPTIN=24576)
  env "${smem[@]}" TZ_TQ_CHUNKS=1 TZ_CUDA_MODULE=$emu "$tz" bench --preset llama-tiny $small \
    --no-split --set train.threads=2 > "$work/emu1.log" 2>&1 ||
    { bad "bench llama-tiny on $where, TZ_TQ_CHUNKS=1 ${smem[*]}, failed"; grep -m1 -o 'kernel .*' "$work/emu1.log"; }
  TZ_TQ_CHUNKS=1 TZ_CUDA_MODULE=$emu "$tz" bench --preset llama-tiny $small --dry-run > "$work/emu1-plan.log" 2>&1
  a=$(plan_bytes "$work/emu1-plan.log") b=$(peak "$work/emu1.log") l1=$(grep -oE 'step 1/1 \| loss [0-9.]+' "$work/emu1.log")
  [ -n "${TZ_BENCH_CUDA_MODULE:-}" ] && l4=$l1
  [ -n "$a" ] && [ "$a" = "$b" ] && [ "$a" != "$c4" ] && [ -n "$l1" ] && [ "$l1" = "$l4" ] &&
    ok "llama-tiny on $where, TZ_TQ_CHUNKS=1 ${smem[*]}: allocator peak $b bytes, as planned (in 4 chunks $c4), the same ${l1#step 1/1 | }" ||
    bad "llama-tiny on $where, TZ_TQ_CHUNKS=1 ${smem[*]}: planned ${a:-?} bytes, allocator peak ${b:-?} (4 chunks: ${c4:-?}); '${l1:-?}' against '${l4:-?}'"
  TZ_TQ_CHUNKS=0 TZ_CUDA_MODULE=$emu "$tz" bench --preset llama-tiny $small --dry-run > "$work/emu0.log" 2>&1
  [ $? -ne 0 ] && grep -q 'TZ_TQ_CHUNKS=0: expected a whole number from 1 to 16' "$work/emu0.log" &&
    ok "TZ_TQ_CHUNKS=0 refused, naming the variable and what it takes" ||
    bad "TZ_TQ_CHUNKS=0: $(tail -1 "$work/emu0.log")"
  # flux-tiny streams 3 of its 4 blocks' codes through two slots: every copy into a slot and
  # every kernel reading one is checked for stream order by the emulation (with the saved
  # streams on the host, and without checkpointing, where nothing else orders the streams)
  for ck in true false; do
    fx="--set run.device=cuda --set train.steps=1 --set train.checkpointing=$ck"
    TZ_CUDA_MODULE=$emu "$tz" bench --preset flux-tiny $fx --no-split --set train.threads=2 > "$work/emuf.log" 2>&1 ||
      { bad "bench flux-tiny on $where (checkpointing $ck) failed"; grep -m2 -i "emulation\|fatal" "$work/emuf.log"; continue; }
    TZ_CUDA_MODULE=$emu "$tz" bench --preset flux-tiny $fx --dry-run > "$work/emuf-plan.log" 2>&1
    a=$(plan_bytes "$work/emuf-plan.log") b=$(peak "$work/emuf.log")
    [ -n "$a" ] && [ "$a" = "$b" ] &&
      ok "flux-tiny on $where, 3 blocks streamed, checkpointing $ck: stream order kept, allocator peak $b bytes, as planned" ||
      bad "flux-tiny on $where (checkpointing $ck): planned ${a:-?} bytes, allocator peak ${b:-?}"
    # the streamed blocks compute what resident ones do: the same losses to the digits printed
    # (with checkpointing, the recipe's setting; the other case costs 7 s of emulation more)
    [ $ck = true ] || continue
    TZ_CUDA_MODULE=$emu "$tz" bench --preset flux-tiny $fx --set quant.offload_blocks=0 \
      --no-split --set train.threads=2 > "$work/emuf0.log" 2>&1
    a=$(grep -oE 'step 1/1 \| loss [0-9.]+' "$work/emuf.log") b=$(grep -oE 'step 1/1 \| loss [0-9.]+' "$work/emuf0.log")
    [ -n "$a" ] && [ "$a" = "$b" ] && ok "flux-tiny, checkpointing $ck: streamed and resident blocks give the same ${a#step 1/1 | }" ||
      bad "flux-tiny, checkpointing $ck: streamed '${a:-?}', resident '${b:-?}'"
  done
else
  echo "skip the emulated device: $emu not built"
fi
finish bench_preset

#!/bin/bash
# Build the CUDA backend here and test and benchmark it on a GPU machine that lacks the
# MPI/HDF5 stack (docs/gpu.md). From the project root:
#
#   tests/gpu/device.sh pack    on the development machine: configures and builds build-cuda
#                               (-DTZ_CUDA=ON: fails when CUDA cannot be built), then fills
#                               .device/ (ignored by git) with the runtime packages, env.sh, the
#                               program, the CUDA module, the GPU test executables and the
#                               PyTorch anchors (TZ_DEVICE_KIT=folder of runtime-packages.txt,
#                               env.sh, anchor_peft.py, dit_anchor.py; default ../shared/device;
#                               TZ_DIT_REPO=a facebookresearch/DiT checkout: its models.py is
#                               carried for dit_anchor.py, which is skipped without it).
#   tests/gpu/device.sh run     on the GPU machine: every GPU test. Exit status: 0 all passed,
#                               1 a failure, 77 no GPU visible.
#   tests/gpu/device.sh bench   on the GPU machine: the Llama-2-7B LoRA-on-4-bit bench beside
#                               anchor_peft.py lora and full, then DiT-XL/2 beside dit_anchor.py
#                               when time allows; a table of both last.
#   tests/gpu/device.sh optimes on the GPU machine: the 7B and DiT-XL/2 steps' GPU time op by
#                               op (TZ_CUDA_OP_TIMES=1, two bench steps each), and the 7B's
#                               attention again with TZ_FA_ROWS=64 (the forward at 64 query
#                               rows a block), TZ_FA_ASYNC=0 (tiles staged, not copied ahead),
#                               TZ_FA_LDMATRIX=0 (fragments by plain reads) and TZ_FA_DS=0
#                               (dq's kernel computing the score gradients again).
#   tests/gpu/device.sh speed   on the GPU machine, after a kernel change: test_cuda_ops and
#                               test_gpu_model, the 7B bench beside anchor_peft.py lora,
#                               DiT-XL/2 (AdamW on the host: peak against the plan; then on
#                               the GPU), both presets' op times, Flux.1-dev (3 steps), then
#                               the 7B again with TZ_FA_DS=0, without a switch, with
#                               TZ_NARROW_GEMM=0, TZ_ATT_KEEP=0 and with TZ_TQ_CHUNKS=1, then
#                               at 64 tokens a step with and without TZ_TQ_FUSED=0, then
#                               `generate` on the 7B's shape (1,024 prompt tokens, 128 new)
#                               with and without it and after 3,000 prompt tokens, while time
#                               is left (TZ_DEVICE_BUDGET applies; about 140 s on an H200
#                               before the last eight).
#   tests/gpu/device.sh ab      on the GPU machine: the built CUDA module against another
#                               (TZ_AB_MODULE=path; TZ_AB_TURBOZERO=path: its program, where
#                               the change is in the program too), or against itself with
#                               switches set (TZ_AB_ENV="TZ_FA_ASYNC=0 ..."; with
#                               TZ_AB_MODULE, both apply to side 0): test_cuda_ops, the 7B and
#                               DiT-XL/2 op times with each, then their benches interleaved,
#                               TZ_AB_ROUNDS times (default 2).
#   tests/gpu/device.sh sweep   on the GPU machine: the 7B bench with each A/B switch of
#                               TZ_SWEEP (default TZ_FA_DS=0, TZ_FA_ROWS=64, TZ_FA_ASYNC=0,
#                               TZ_LORA_STACK=0,
#                               TZ_MLP_COLS=0, TZ_TQ_CHUNKS=1 and 2, TZ_TQ_DECODE_STREAM=0,
#                               TZ_WEIGHTS_STAGED=0, TZ_LINEAR_SHARED=0, TZ_ATT_KEEP=0,
#                               TZ_NARROW_GEMM=0) between runs without any, TZ_AB_ROUNDS
#                               rounds (default 1; about 23 runs of 25 s a round).
#   tests/gpu/device.sh sanitize on the GPU machine: compute-sanitizer memcheck, racecheck and
#                               synccheck over test_cuda_ops.
#   tests/gpu/device.sh ncu     on the GPU machine: Nsight Compute on named kernels of the 7B
#                               step (tests/gpu/ncu_top.sh: the flash attention kernels, decode,
#                               rotation, LoRA's narrow GEMM, one launch each; 12 of
#                               cuBLAS's GEMMs).
#   tests/gpu/device.sh all     run, bench, optimes and sanitize in one call of at most 10
#                               minutes (each part under a time limit, the table always printed;
#                               TZ_DEVICE_BUDGET=seconds, default 570).
# Logs go to $OUT (the device machine's returned folder) or ./device-out.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
build=${TZ_BUILD:-build-cuda}
# the test executables that need a GPU (label gpu, tests/gpu.cmake; test_offload_ops checks
# the offload's table entries on the CPU and, with a GPU, on the CUDA backend)
tests=(test_cuda_ops test_gpu_model test_offload_ops)
out=${OUT:-$root/device-out}
budget=${TZ_DEVICE_BUDGET:-570} # seconds for `all`: under the device machine's 10 minutes
start=$SECONDS

# Seconds left of the budget, less a reserve for what comes after.
left() { echo $((budget - (SECONDS - start) - ${1:-0})); }
# cap SECONDS: the smaller of SECONDS and what is left (less 20 s for the table), at least 1
cap() { local l; l=$(left 20); [ "$l" -lt "$1" ] && echo $((l > 1 ? l : 1)) || echo "$1"; }

setup() {
  [ -e .device/env.sh ] || { echo "no .device/env.sh: run 'tests/gpu/device.sh pack' first" >&2; exit 2; }
  # shellcheck disable=SC1091
  source .device/env.sh
  export TZ_CUDA_MODULE=${TZ_CUDA_MODULE:-$PWD/.device/$build/libtzcuda.so}
  tz=$PWD/.device/$build/turbozero
  mkdir -p "$out"
  nvidia-smi -L 2>/dev/null || echo "nvidia-smi: not available"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null > "$out/gpu.txt"
}

# GPU tests: each result also goes to $out/tests.txt for the table.
run_tests() {
  local status=0 skipped=0 rc t
  : > "$out/tests.txt"
  for t in "${tests[@]}"; do
    echo "== $t"
    timeout "$(cap 150)" ".device/$build/tests/$t" > "$out/$t.log" 2>&1
    rc=$?
    tail -15 "$out/$t.log"
    record "$t" $rc "$out/$t.log"
    if [ $rc -ne 0 ] && [ $rc -ne 77 ] && [ "$(left 20)" -gt 60 ]; then
      # again with every op synchronised and checked: the failing op by name
      echo "== $t again with TZ_CUDA_SYNC_DEBUG=1"
      TZ_CUDA_SYNC_DEBUG=1 timeout "$(cap 60)" ".device/$build/tests/$t" > "$out/$t.sync.log" 2>&1
      grep -m3 -E 'TZ_CUDA_SYNC_DEBUG: (op|before)|FAIL' "$out/$t.sync.log"
    fi
  done
  echo "== gpu_lora_bundled (tests/gpu/lora_gpu.sh)"
  timeout "$(cap 240)" bash tests/gpu/lora_gpu.sh "$tz" "$out/lora_gpu" > "$out/lora_gpu.log" 2>&1
  rc=$?
  cat "$out/lora_gpu.log"
  record gpu_lora_bundled $rc "$out/lora_gpu.log"
  echo "== bench_preset_gpu (tests/gpu/bench_preset_test.sh on the GPU: plan = allocator peak, Flux streaming)"
  TZ_BENCH_CUDA_MODULE=$TZ_CUDA_MODULE timeout "$(cap 120)" bash tests/gpu/bench_preset_test.sh "$tz" \
    "$out/bench_preset" > "$out/bench_preset_gpu.log" 2>&1
  rc=$?
  grep -E 'FAIL|device|flux' "$out/bench_preset_gpu.log" | tail -12
  record bench_preset_gpu $rc "$out/bench_preset_gpu.log"
  echo "== offload_gpu (tests/offload/offload_test.sh)"
  timeout "$(cap 200)" bash tests/offload/offload_test.sh "$tz" "$root" "$(command -v mpirun)" \
    > "$out/offload_gpu.log" 2>&1
  rc=$?
  tail -25 "$out/offload_gpu.log"
  record offload_gpu $rc "$out/offload_gpu.log"
  grep -q FAILED "$out/tests.txt" && status=1
  grep -q skipped "$out/tests.txt" && skipped=1
  [ $status -eq 0 ] && [ $skipped -eq 1 ] && return 77
  return $status
}
record() {
  local what
  case $2 in 0) what=passed ;; 77) what="skipped ($(grep -m1 -io 'skip: .*' "$3" 2>/dev/null))" ;;
    124) what="FAILED (out of time)" ;; *) what="FAILED (exit $2)" ;; esac
  echo "== $1: $what"
  echo "$1: $what" >> "$out/tests.txt"
}

# ours: "<units>/s peak_GiB used_GiB" from a bench log, or "-" fields
ours() {
  local f=$1 r p u
  r=$(grep -o 'bench: .*' "$f" 2>/dev/null | grep -oE '[0-9.]+ (tokens|images|samples)/s \|' | awk '{print $1}')
  p=$(grep -m1 -o 'allocator peak [0-9.]* GiB' "$f" 2>/dev/null | awk '{print $3}')
  # a run stopped before its summary: the last step's time, the memory after set-up
  [ -z "$r" ] && r=$(grep -oE 'bench step [0-9]+/[0-9]+ .* [0-9.]+ s$' "$f" 2>/dev/null | tail -1 | awk '{print "step:" $(NF-1) "s"}')
  [ -z "$p" ] && p=$(grep -m1 -oE 'memory per rank: device [0-9.]+ MiB' "$f" 2>/dev/null | awk '{printf "%.3f(setup)", $5 / 1024}')
  u=$(grep -m1 -oE 'GPU [0-9.]+ of' "$f" 2>/dev/null | awk '{print $2}')
  echo "${r:--} ${p:--} ${u:--}"
}
# the anchor's JSON line: "<units>/s peak_alloc_GiB peak_reserved_GiB"
anchor() {
  python3 - "$1" <<'PY' 2>/dev/null || echo "- - -"
import json, sys
line = [l for l in open(sys.argv[1]) if l.startswith("{")][-1]
d = json.loads(line)
r = d.get("tokens_per_s", d.get("images_per_s", "-"))
print(r, d.get("peak_alloc_GiB", "-"), d.get("peak_reserved_GiB", "-"))
PY
}

run_bench() {
  local dit_repo=.device/dit
  "$tz" --version > "$out/version.txt" 2>&1
  "$tz" bench --preset llama2-7b --dry-run > "$out/plan-llama2-7b.log" 2>&1
  grep -m1 'planned backend memory' "$out/plan-llama2-7b.log" | sed 's/^/   /'
  echo "== turbozero bench --preset llama2-7b (LoRA r16 on a 4-bit TurboQuant base, seq 2048)"
  timeout "$(cap 170)" "$tz" bench --preset llama2-7b --set train.steps=6 > "$out/bench-llama2-7b.log" 2>&1 ||
    echo "   (exit $?: see bench-llama2-7b.log)"
  grep -E 'bench:|bench memory|step split|host step|memory per rank' "$out/bench-llama2-7b.log" | sed 's/^/   /'
  anchor_run lora
  if [ "$(left 20)" -gt 140 ]; then
    echo "== turbozero bench --preset dit-xl-2 (full fine-tuning, batch 32)"
    timeout "$(cap 90)" "$tz" bench --preset dit-xl-2 --set train.steps=6 > "$out/bench-dit-xl-2.log" 2>&1 ||
      echo "   (exit $?: see bench-dit-xl-2.log)"
    grep -E 'bench:|bench memory|step split' "$out/bench-dit-xl-2.log" | sed 's/^/   /'
    if [ "$(left 20)" -gt 120 ]; then
      echo "== turbozero bench --preset dit-xl-2 --set optim.offload=false (AdamW on the GPU)"
      timeout "$(cap 90)" "$tz" bench --preset dit-xl-2 --set train.steps=6 --set optim.offload=false \
        > "$out/bench-dit-xl-2-gpuopt.log" 2>&1 || echo "   (exit $?: see bench-dit-xl-2-gpuopt.log)"
      grep -E 'bench:|bench memory|step split' "$out/bench-dit-xl-2-gpuopt.log" | sed 's/^/   /'
    fi
    if [ -e $dit_repo/models.py ] && [ "$(left 20)" -gt 45 ]; then
      echo "== dit_anchor.py full"
      timeout "$(cap 80)" python3 .device/anchor/dit_anchor.py $dit_repo full > "$out/anchor-dit-full.log" 2>&1 ||
        echo "   (exit $?: see anchor-dit-full.log)"
      grep '^{' "$out/anchor-dit-full.log" | sed 's/^/   /'
    else
      echo "== dit_anchor.py: not run ($([ -e $dit_repo/models.py ] && echo "out of time" || echo "no DiT models.py carried: pack with TZ_DIT_REPO"))"
    fi
  else
    echo "== DiT-XL/2: not run (out of time)"
  fi
  if [ "$(left 20)" -gt 120 ]; then
    "$tz" bench --preset flux-dev --dry-run > "$out/plan-flux-dev.log" 2>&1
    grep -m1 'planned backend memory' "$out/plan-flux-dev.log" | sed 's/^/   /'
    echo "== turbozero bench --preset flux-dev (LoRA r16 on a 4-bit TurboQuant base, 1024x1024)"
    timeout "$(cap 100)" "$tz" bench --preset flux-dev --set train.steps=4 > "$out/bench-flux-dev.log" 2>&1 ||
      echo "   (exit $?: see bench-flux-dev.log)"
    grep -E 'bench:|bench memory|step split' "$out/bench-flux-dev.log" | sed 's/^/   /'
  else
    echo "== Flux.1-dev: not run (out of time)"
  fi
}
anchor_full() {
  if [ "$(left 20)" -gt 120 ]; then anchor_run full; else echo "== anchor_peft.py full: not run (out of time)"; fi
}
anchor_run() {
  echo "== anchor_peft.py $1"
  timeout "$(cap 100)" python3 .device/anchor/anchor_peft.py "$1" > "$out/anchor-$1.log" 2>&1 ||
    echo "   (exit $?: see anchor-$1.log)"
  grep '^{' "$out/anchor-$1.log" | sed 's/^/   /'
}

# Where the GPU time goes, op by op (TZ_CUDA_OP_TIMES: every op synchronised and timed with
# events; docs/gpu.md), over two bench steps (the first a warm-up, counted too) of the 7B LoRA
# and the DiT-XL/2 presets.
run_optimes() {
  local p
  for p in llama2-7b dit-xl-2; do
    [ "$(left 20)" -gt 60 ] || { echo "== TZ_CUDA_OP_TIMES $p: not run (out of time)"; continue; }
    echo "== TZ_CUDA_OP_TIMES=1 turbozero bench --preset $p (2 steps)"
    TZ_CUDA_OP_TIMES=1 timeout "$(cap 100)" "$tz" bench --preset $p --set train.steps=2 \
      > "$out/optimes-$p.log" 2>&1 || echo "   (exit $?: see optimes-$p.log)"
    grep -A14 'TZ_CUDA_OP_TIMES on' "$out/optimes-$p.log" | sed 's/^/   /'
    grep -A6 'parts of ops' "$out/optimes-$p.log" | sed 's/^/   /' # attention_bwd's kernels
  done
  # attention's op times with each flash switch taking one step back: the forward at 64
  # query rows a block (TZ_FA_ROWS=64), the tiles staged instead of copied ahead
  # (TZ_FA_ASYNC=0), the B fragments by plain reads instead of ldmatrix (TZ_FA_LDMATRIX=0),
  # dq's kernel computing the score gradients again instead of reading dk/dv's (TZ_FA_DS=0)
  local sw
  for sw in TZ_FA_DS=0 TZ_FA_ROWS=64 TZ_FA_ASYNC=0 TZ_FA_LDMATRIX=0; do
    [ "$(left 20)" -gt 60 ] || { echo "== $sw op times: not run (out of time)"; continue; }
    echo "== $sw TZ_CUDA_OP_TIMES=1 turbozero bench --preset llama2-7b (2 steps; attention)"
    env "$sw" TZ_CUDA_OP_TIMES=1 timeout "$(cap 100)" "$tz" bench --preset llama2-7b \
      --set train.steps=2 > "$out/optimes-llama2-7b-${sw%%=*}.log" 2>&1 || echo "   (exit $?)"
    grep -E '^  attention|TZ_CUDA_OP_TIMES on' "$out/optimes-llama2-7b-${sw%%=*}.log" |
      sed 's/^/   /' # (the op rows and the parts rows of attention)
  done
}

# compute-sanitizer over test_cuda_ops: memcheck of the flash attention kernels, then of the
# narrow kernels' (k_narrow_part, k_narrow_tq; memcheck of every kernel did not finish in 120 s
# on an H200), then racecheck
# and synccheck of every kernel while time is left
run_sanitize() {
  local san tool rc only run
  san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  [ -x "$san" ] || { echo "== compute-sanitizer: not found"; return; }
  for run in memcheck:k_fa_ memcheck-narrow:k_narrow_ racecheck synccheck; do
    tool=${run%%[:-]*}
    [ "$(left 20)" -gt 45 ] || { echo "== compute-sanitizer ${run%%:*}: not run (out of time)"; continue; }
    only=() && [ "${run#*:}" != "$run" ] && only=(--kernel-name "kns=${run#*:}")
    run=${run%%:*}
    echo "== compute-sanitizer --tool $tool ${only[*]} test_cuda_ops"
    timeout "$(cap 120)" "$san" --tool $tool "${only[@]}" --error-exitcode 9 ".device/$build/tests/test_cuda_ops" \
      > "$out/sanitize-$run.log" 2>&1
    rc=$?
    grep -m5 -E 'ERROR SUMMARY|Invalid|Race|Barrier|hazard' "$out/sanitize-$run.log" | sed 's/^/   /'
    # the sanitizer's own verdict (exit 9) apart from the test's (a failed check: exit 1)
    [ $rc -ne 9 ] && [ $rc -ne 124 ] && grep -qE 'ERROR SUMMARY: 0 errors|0 hazards displayed \(0 errors' \
      "$out/sanitize-$run.log" && rc=0
    record "sanitizer-$run" $rc "$out/sanitize-$run.log"
  done
}

# speed_bench PRESET SUFFIX TITLE [ARGS...]: one bench of 6 steps (ARGS may override) into
# bench-PRESET[SUFFIX].log while at least 60 s are left; its summary lines echoed
speed_bench() {
  local p=$1 sfx=$2 title=$3 log
  shift 3
  log="$out/bench-$p$sfx.log"
  [ "$(left 20)" -gt 60 ] || { echo "== $title: not run (out of time)"; return; }
  echo "== $title"
  timeout "$(cap 90)" "$tz" bench --preset "$p" --set train.steps=6 "$@" > "$log" 2>&1 ||
    echo "   (exit $?: see $(basename "$log"))"
  grep -E 'bench:|bench memory|step split|allocator peak' "$log" | sed 's/^/   /'
}

# generate on the 7B's shape (random weights; LoRA r16 on a 4-bit base, as the bench preset):
# a prompt of PROMPT tokens (default 1,024; bytes of docs/guide.md), then 128 decode steps; the
# speed from generate's stderr line
gen_bench() {
  local sfx=$1 title=$2 log="$out/gen-llama2-7b$1.log" cfg="$out/gen-llama2-7b.cfg"
  local n=${PROMPT:-1024}
  [ "$(left 20)" -gt 60 ] || { echo "== $title: not run (out of time)"; return; }
  cat > "$cfg" <<CFG
model = { path = "preset:llama2-7b"; };
train = { mode = "lora"; };
lora = { rank = 16; alpha = 32.0; targets = ["q", "k", "v", "o", "gate", "up", "down"]; };
quant = { bits = 4; group = 128; };
CFG
  echo "== $title"
  timeout "$(cap 120)" "$tz" generate "$cfg" --prompt "$(head -c "$n" docs/guide.md | tr -c ' -~' ' ')" \
    --max-new 128 > /dev/null 2> "$log" || echo "   (exit $?: see $(basename "$log"))"
  grep -E '^generate:' "$log" | sed 's/^/   /'
}
# generate's decode steps a second, from its stderr line, or -
gen_speed() { sed -n 's/.*, \([0-9.]*\) tokens\/s after it.*/\1/p' "$1" 2>/dev/null | tail -1 | grep . || echo -; }

table() {
  local a b c d e
  {
    echo
    echo "GPU: $(cat "$out/gpu.txt" 2>/dev/null)   (elapsed $((SECONDS - start)) s)"
    [ -s "$out/tests.txt" ] && sed 's/^/test /' "$out/tests.txt"
    printf '%-44s %12s %14s %14s\n' "run" "units/s" "peak GiB" "device GiB"
    read -r a b c <<< "$(ours "$out/bench-llama2-7b.log")"
    printf '%-44s %12s %14s %14s\n' "turbozero llama2-7b LoRA r16, 4-bit, bf16" "$a tok" "$b alloc" "$c used"
    local sw # the 7B with a switch (speed's runs), where run
    for sw in -nods:TZ_FA_DS=0 -again:"again, no switch" -nonarrow:TZ_NARROW_GEMM=0 \
      -nokeep:TZ_ATT_KEEP=0 \
      -whole:TZ_TQ_CHUNKS=1 -s64:"seq 64 (fused 4-bit)" -s64-nofused:"seq 64, TZ_TQ_FUSED=0"; do
      [ -e "$out/bench-llama2-7b${sw%%:*}.log" ] || continue
      read -r a b c <<< "$(ours "$out/bench-llama2-7b${sw%%:*}.log")"
      printf '%-44s %12s %14s %14s\n' "turbozero llama2-7b, ${sw#*:}" "$a tok" "$b alloc" "$c used"
    done
    for sw in :" 1024+128" -nofused:" 1024+128, TZ_TQ_FUSED=0" -long:" 3000+128"; do
      [ -e "$out/gen-llama2-7b${sw%%:*}.log" ] || continue
      printf '%-44s %12s %14s %14s\n' "generate llama2-7b${sw#*:}" \
        "$(gen_speed "$out/gen-llama2-7b${sw%%:*}.log") tok" "-" "-"
    done
    read -r a b c <<< "$(anchor "$out/anchor-lora.log")"
    printf '%-44s %12s %14s %14s\n' "anchor peft LoRA r16, bf16" "$a tok" "$b alloc" "$c reserved"
    read -r a b c <<< "$(anchor "$out/anchor-full.log")"
    printf '%-44s %12s %14s %14s\n' "anchor full fwd+bwd, bf16" "$a tok" "$b alloc" "$c reserved"
    if [ -e "$out/bench-dit-xl-2.log" ]; then
      read -r a b c <<< "$(ours "$out/bench-dit-xl-2.log")"
      printf '%-44s %12s %14s %14s\n' "turbozero dit-xl-2 full, batch 32, bf16" "$a img" "$b alloc" "$c used"
    fi
    if [ -e "$out/bench-dit-xl-2-gpuopt.log" ]; then
      read -r a b c <<< "$(ours "$out/bench-dit-xl-2-gpuopt.log")"
      printf '%-44s %12s %14s %14s\n' "turbozero dit-xl-2 full, optim.offload=false" "$a img" "$b alloc" "$c used"
    fi
    if [ -e "$out/bench-flux-dev.log" ]; then
      read -r a b c <<< "$(ours "$out/bench-flux-dev.log")"
      printf '%-44s %12s %14s %14s\n' "turbozero flux-dev LoRA r16, 4-bit, 1024^2" "$a smp" "$b alloc" "$c used"
    fi
    if [ -e "$out/anchor-dit-full.log" ]; then
      read -r a b c <<< "$(anchor "$out/anchor-dit-full.log")"
      printf '%-44s %12s %14s %14s\n' "anchor DiT-XL/2 full, batch 32, bf16 autocast" "$a img" "$b alloc" "-"
    fi
    echo "(turbozero: allocator peak = its own count; used = cudaMemGetInfo, whole GPU. anchor:"
    echo " torch max_memory_allocated / max_memory_reserved. Logs: $out)"
  } | tee "$out/table.txt"
}

case "${1:-}" in
pack)
  set -e
  cmake -S . -B "$build" -DTZ_CUDA=ON -DTZ_NATIVE=OFF >/dev/null
  targets=(turbozero tzcuda "${tests[@]}")
  cmake --build "$build" -j"${TZ_JOBS:-2}" --target "${targets[@]}"
  files=("$build/turbozero" "$build/libtzcuda.so") # the CUDA backend is a loaded module
  for t in "${tests[@]}"; do files+=("$build/tests/$t"); done
  kit=${TZ_DEVICE_KIT:-$root/../shared/device}
  mkdir -p .device/debs .device/anchor
  if [ -z "$(ls .device/debs/*.deb 2>/dev/null)" ]; then
    # shellcheck disable=SC2046
    (cd .device/debs && apt-get download $(cat "$kit/runtime-packages.txt") >/dev/null 2>&1) ||
      { apt-get update -qq && (cd .device/debs && apt-get download $(cat "$kit/runtime-packages.txt")); }
  fi
  cp "$kit/env.sh" .device/env.sh
  cp "$kit/anchor_peft.py" "$kit/dit_anchor.py" .device/anchor/
  if [ -n "${TZ_DIT_REPO:-}" ]; then mkdir -p .device/dit && cp "$TZ_DIT_REPO/models.py" .device/dit/; fi
  for f in "${files[@]}"; do mkdir -p ".device/$(dirname "$f")"; cp -a "$f" ".device/$f"; done
  du -sh .device | awk '{print ".device: " $1 " (with the working tree, under 64 MiB)"}'
  echo "now carry .device/ to the GPU machine and run: tests/gpu/device.sh all"
  ;;
run)
  setup
  run_tests
  exit $?
  ;;
bench)
  setup
  run_bench
  anchor_full
  table
  ;;
speed)
  # after a kernel change: its op checks on the GPU (and the whole models against the CPU),
  # then the 7B beside the anchor (same call), DiT-XL/2 as planned and with AdamW on the GPU,
  # both presets' op times, Flux.1-dev, the A/B switches while time is left; a table last
  setup
  : > "$out/tests.txt"
  for t in test_cuda_ops test_gpu_model; do
    timeout "$(cap 90)" ".device/$build/tests/$t" > "$out/$t.log" 2>&1
    rc=$?
    grep FAIL "$out/$t.log" | head -5
    record $t $rc "$out/$t.log"
  done
  "$tz" bench --preset llama2-7b --dry-run > "$out/plan-llama2-7b.log" 2>&1
  speed_bench llama2-7b "" "turbozero bench --preset llama2-7b"
  anchor_run lora
  "$tz" bench --preset dit-xl-2 --dry-run > "$out/plan-dit-xl-2.log" 2>&1
  grep -m1 'planned backend memory' "$out/plan-dit-xl-2.log" | sed 's/^/   /'
  speed_bench dit-xl-2 "" "turbozero bench --preset dit-xl-2 (AdamW on the host: peak against the plan)"
  speed_bench dit-xl-2 -gpuopt "turbozero bench --preset dit-xl-2 --set optim.offload=false" \
    --set optim.offload=false
  run_optimes
  if [ "$(left 20)" -gt 90 ]; then
    "$tz" bench --preset flux-dev --dry-run > "$out/plan-flux-dev.log" 2>&1
    grep -m1 'planned backend memory' "$out/plan-flux-dev.log" | sed 's/^/   /'
    speed_bench flux-dev "" "turbozero bench --preset flux-dev (3 steps)" --set train.steps=3
  fi
  # the switches of the changes not yet measured, each beside a run without any (the runs
  # drift over a call by a few per cent: `sweep` settles them with more runs)
  TZ_FA_DS=0 speed_bench llama2-7b -nods \
    "TZ_FA_DS=0 turbozero bench --preset llama2-7b (attention's dq computing dS again)"
  speed_bench llama2-7b -again "turbozero bench --preset llama2-7b (again, between the switches)"
  TZ_NARROW_GEMM=0 speed_bench llama2-7b -nonarrow \
    "TZ_NARROW_GEMM=0 turbozero bench --preset llama2-7b (LoRA's rank-16 products by cuBLAS)"
  TZ_ATT_KEEP=0 speed_bench llama2-7b -nokeep \
    "TZ_ATT_KEEP=0 turbozero bench --preset llama2-7b (attention run again in the recomputation)"
  TZ_TQ_CHUNKS=1 speed_bench llama2-7b -whole \
    "TZ_TQ_CHUNKS=1 turbozero bench --preset llama2-7b (each weight decoded whole, one GEMM)"
  # 64 rows a step: every base product through the fused 4-bit narrow kernel (a decode
  # step's regime), then with the weights decoded and multiplied apart
  speed_bench llama2-7b -s64 "turbozero bench --preset llama2-7b --set data.seq_len=64" \
    --set data.seq_len=64
  TZ_TQ_FUSED=0 speed_bench llama2-7b -s64-nofused \
    "TZ_TQ_FUSED=0 turbozero bench --preset llama2-7b --set data.seq_len=64" --set data.seq_len=64
  # generation: decode steps through the fused kernel and the bf16 cache, then without the kernel
  gen_bench "" "turbozero generate on llama2-7b's shape: 1,024 prompt tokens, 128 new"
  TZ_TQ_FUSED=0 gen_bench -nofused "TZ_TQ_FUSED=0 turbozero generate on llama2-7b's shape"
  # a long context: the bf16 cache read each step (1.5 GiB at 3,072 positions) beside the codes
  PROMPT=3000 gen_bench -long "turbozero generate on llama2-7b's shape: 3,000 prompt tokens"
  table
  ;;
sweep)
  # the built module with each switch of TZ_SWEEP (default: every A/B switch not yet settled)
  # against none, on the 7B LoRA bench with AdamW on the GPU (the host's optimizer would set
  # the step), interleaved none, switch 1, none, switch 2, ..., none, TZ_AB_ROUNDS rounds
  # (default 1), so that each switch has a run without it on either side (the runs drift over
  # a call by as much as a switch can change); a table of the step times' medians last. Each
  # run without the step split's 2 extra synchronised steps (--no-split: a few seconds of
  # device time a run, for a line the sweep does not read).
  setup
  read -r -a sweep <<< "${TZ_SWEEP:-TZ_FA_DS=0 TZ_FA_ROWS=64 TZ_FA_ASYNC=0 TZ_LORA_STACK=0 TZ_MLP_COLS=0 TZ_TQ_CHUNKS=1 TZ_TQ_CHUNKS=2 TZ_TQ_DECODE_STREAM=0 TZ_WEIGHTS_STAGED=0 TZ_LINEAR_SHARED=0 TZ_ATT_KEEP=0 TZ_NARROW_GEMM=0}"
  sweep_run() { # sweep_run TAG [VAR=VALUE]: one 7B bench, its log sweep-TAG.log
    local tag=$1 log="$out/sweep-$1.log"
    shift
    [ "$(left 20)" -gt 35 ] || { echo "== sweep $tag: not run (out of time)"; return; }
    env "$@" timeout "$(cap 60)" "$tz" bench --preset llama2-7b --set train.steps=6 --no-split \
      --set optim.offload=false > "$log" 2>&1 || echo "   (sweep $tag: exit $?)"
    echo "== sweep $tag ${*:-(none)}: $(grep -o 'step time median [0-9.]* s' "$log")"
  }
  k=0 # (the logs numbered in the order they ran, for the table)
  for round in $(seq 1 "${TZ_AB_ROUNDS:-1}"); do
    sweep_run "$(printf %02d $k)-none"
    for sw in "${sweep[@]}"; do
      k=$((k + 1))
      sweep_run "$(printf %02d $k)-${sw%%=*}-${sw#*=}" "$sw"
      k=$((k + 1))
      sweep_run "$(printf %02d $k)-none"
    done
    k=$((k + 1))
  done
  {
    echo "GPU: $(cat "$out/gpu.txt")   (elapsed $((SECONDS - start)) s; llama2-7b, optim.offload = false)"
    for f in "$out"/sweep-*.log; do
      printf '%-40s %s\n' "$(basename "$f" .log)" "$(grep -o 'step time median [0-9.]* s' "$f")"
    done
  } | tee "$out/table.txt"
  ;;
ab)
  # one module against another in one call: TZ_AB_MODULE names the other (an older build
  # carried in .device, say), TZ_AB_TURBOZERO the program to run it with where the change is
  # in the program too (default: the built one); or the built module against itself with the
  # environment switches TZ_AB_ENV on side 0 (TZ_FA_ASYNC=0, TZ_TQ_DECODE_STREAM=0, ...);
  # test_cuda_ops with the built module, the presets' op times with each (TZ_AB_PRESETS,
  # default llama2-7b and dit-xl-2; flux-dev for Flux's kernels), then the benches
  # interleaved (0, 1, 0, 1, ...: TZ_AB_ROUNDS rounds) so that a drift over the call falls on
  # both alike; a table of step times and attention's op times last
  setup
  [ -n "${TZ_AB_ENV:-}" ] || [ -e "${TZ_AB_MODULE:-}" ] ||
    { echo "ab: neither TZ_AB_MODULE (a file) nor TZ_AB_ENV given" >&2; exit 2; }
  [ -z "${TZ_AB_MODULE:-}" ] || [ -e "$TZ_AB_MODULE" ] ||
    { echo "ab: TZ_AB_MODULE names no file" >&2; exit 2; }
  read -r -a abenv <<< "${TZ_AB_ENV:-}"
  : > "$out/tests.txt"
  timeout "$(cap 90)" ".device/$build/tests/test_cuda_ops" > "$out/test_cuda_ops.log" 2>&1
  rc=$?
  grep FAIL "$out/test_cuda_ops.log" | head -5
  record test_cuda_ops $rc "$out/test_cuda_ops.log"
  mods=("${TZ_AB_MODULE:-$TZ_CUDA_MODULE}" "$TZ_CUDA_MODULE")
  tzs=("${TZ_AB_TURBOZERO:-$tz}" "$tz")
  # runs a command as side i: its module, and side 0 with TZ_AB_ENV
  side() {
    local i=$1
    shift
    if [ "$i" = 0 ]; then env "${abenv[@]}" TZ_CUDA_MODULE="${mods[0]}" "$@"
    else env TZ_CUDA_MODULE="${mods[1]}" "$@"; fi
  }
  for p in ${TZ_AB_PRESETS:-llama2-7b dit-xl-2}; do
    for i in 0 1; do
      [ "$(left 20)" -gt 40 ] || continue
      side $i TZ_CUDA_OP_TIMES=1 timeout "$(cap 60)" "${tzs[$i]}" bench --preset $p \
        --set train.steps=2 --set optim.offload=false > "$out/ab-optimes-$p-$i.log" 2>&1
    done
  done
  for round in $(seq 1 "${TZ_AB_ROUNDS:-2}"); do
    for p in ${TZ_AB_PRESETS:-llama2-7b dit-xl-2}; do
      for i in 0 1; do
        [ "$(left 20)" -gt 30 ] || continue
        side $i timeout "$(cap 60)" "${tzs[$i]}" bench --preset $p --set train.steps=6 \
          --set optim.offload=false > "$out/ab-bench-$p-$i-$round.log" 2>&1
      done
    done
  done
  {
    echo "GPU: $(cat "$out/gpu.txt")   (elapsed $((SECONDS - start)) s; 0 = ${TZ_AB_MODULE:-built} ${TZ_AB_ENV:-}, 1 = built)"
    sed 's/^/test /' "$out/tests.txt"
    for f in "$out"/ab-bench-*.log; do
      printf '%-36s %s\n' "$(basename "$f" .log)" "$(grep -o 'step time median [0-9.]* s' "$f")"
    done
    for f in "$out"/ab-optimes-*.log; do
      printf '%-36s %s\n' "$(basename "$f" .log)" "$(grep -E '^ +attention_(fwd|bwd) ' "$f" |
        awk '{printf "%s %s us/call  ", $1, $6}')"
    done
  } | tee "$out/table.txt"
  ;;
optimes)
  setup
  run_optimes
  ;;
sanitize)
  setup
  run_sanitize
  ;;
ncu)
  setup
  echo "== ncu over the 7B LoRA bench step (tests/gpu/ncu_top.sh)"
  timeout "$(cap 300)" bash tests/gpu/ncu_top.sh "$tz" "$out/ncu"
  ;;
all)
  setup
  run_tests
  rc=$?
  run_bench
  run_sanitize
  run_optimes
  anchor_full
  table
  exit $rc
  ;;
*)
  # the usage: the comment at the top, every line of it
  awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0" | sed 's/^# \{0,1\}//'
  exit 2
  ;;
esac

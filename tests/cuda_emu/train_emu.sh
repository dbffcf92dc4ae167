#!/usr/bin/env bash
# Training on the emulated CUDA device (tests/cuda_emu/emu/, libtzcuda_emu.so) against the CPU: the same
# short runs with run.device = "cuda" (the CUDA backend's own host code and kernels, run on
# the CPU) and run.device = "cpu", which must agree:
#  1. a Llama LoRA run on a 4-bit TurboQuant base (tests/zero/make_model.py: vocab 97, MLP 171,
#     so q/k/v/o/gate/up are quantized and down stays dense): every op of the Llama path,
#     the rotation and decoding of quantized weights, the optimizer over device gradients;
#     and full fine-tuning of the dense model (norms and embedding trained as well);
#  2. a DiT pre-training run (init-model --preset tiny on Fashion-MNIST images, skipped when the
#     dataset is not installed): patchify, adaLN modulate/gate, LayerNorm, GELU, MSE;
#  3. a Flux LoRA run on a 4-bit base (init-model --preset flux-tiny, latents from
#     tests/flux/make_cache.py; skipped without python3-h5py): the joint blocks, RoPE tables;
#     again with one sample per step and checkpointing (the streams as slices of the joint rows).
#     Its AdamW has eps = 1e-4: LoRA's B starts at zero, and the first steps' updates
#     -lr g / (|g| + eps) of B's elements whose gradient is near zero by cancellation turn the
#     rounding of g into differences of order lr. With the default eps (1e-8) the adapters
#     differed by 2.9e-5 (to_q's B of the first block; the losses within 4e-8), with 1e-4 by
#     2.7e-6 (measured 2026-11-26), the same with the weights uploaded all at once.
#  4. in bf16, kept attention outputs against attention's forward run again in the
#     recomputation, and Flux's attention on bf16 inputs against fp32 ones: the same bytes.
# Every run has small ZeRO buckets, so the updated weights go back to the device in several
# buckets in forward order, each layer's ops waiting only for the bucket of its own weights
# (optim/zero.c; the start-up line says so): the emulation fails any read of a weight whose
# upload nothing orders before it, so a stage that did not wait for its weights fails here.
# Tolerance, for each step's loss (relative) and for each trained tensor (||a - b|| / ||a||,
# tests/zero/compare.py): 1e-5. Both sides are fp32 (run.precision = "fp32" on the device)
# and differ only in rounding: the order of
# the GEMM sums (cuBLAS emulated by plain loops against the CPU's blocked kernels), expf and
# the attention's online softmax against the CPU's two-pass one, each within the tolerances of
# test_cuda_ops (at most 3e-5 per op, typically 1e-7). Measured (2026-11-23; the CPU's
# portable, AVX2 and AVX-512 kernels alike): losses within 2e-8, tensors within 7.1e-7 (the
# LoRA adapter) and 1.3e-6 (the DiT), so 1e-5 leaves a margin of 7x over rounding, while a
# wrong op moves these figures far more (a 0.1% error in SwiGLU's backward: 5.5e-4 on the
# adapter). The emulated run must name its device a CPU emulation.
# usage: train_emu.sh TURBOZERO SOURCE_DIR LIBTZCUDA_EMU
set -u
tz=$1 src=$2 emu=$3
py=/usr/bin/python3
TOL=1e-5
work=$(mktemp -d "${TMPDIR:-/tmp}/tzemu.XXXXXX")
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/../lib.sh"
export TZ_CUDA_MODULE=$emu

losses() { grep -o '"loss": [0-9.e+-]*' "$1/metrics.jsonl" | awk '{print $2}'; }
# compare NAME DIR_CPU DIR_CUDA FILE STEPS
compare() {
  local name=$1 a=$2 b=$3 file=$4 steps=$5 worst
  grep -q "CPU emulation of CUDA" "$b.log" && ok "$name: the device names itself a CPU emulation" ||
    bad "$name: the emulated run does not name its device a CPU emulation"
  worst=$(paste <(losses "$a") <(losses "$b") | awk -v n=$steps '
    { d = $1 - $2; if (d < 0) d = -d; r = d / ($1 < 0 ? -$1 : $1); if (r > w) w = r; k++ }
    END { if (k != n) print "steps:" k; else printf "%.3e", w }')
  if [[ "$worst" =~ ^[0-9.e+-]+$ ]] && awk -v w="$worst" -v t=$TOL 'BEGIN {exit !(w <= t)}'; then
    ok "$name: the $steps losses agree with the CPU's (worst relative $worst, tol $TOL)"
  else
    bad "$name: losses cuda vs cpu: $worst (tol $TOL)"; paste <(losses "$a") <(losses "$b")
  fi
  grep -q "updated weights uploaded in forward order" "$b.log" &&
    ok "$name: the weights went back in forward order ($(grep -m1 -oE 'in [0-9]+ buckets' "$b.log"))" ||
    bad "$name: the device run did not upload its weights in forward order"
  if err=$($py "$src/tests/zero/compare.py" "$a/$file" "$b/$file" $TOL 2>&1); then
    ok "$name: trained tensors agree with the CPU's ($err)"
  else
    bad "$name: trained tensors cuda vs cpu: $err"
  fi
}
# run NAME DEVICE ARGS...: one training, its log in NAME.log
run() {
  local name=$1 dev=$2
  shift 2
  timeout 300 "$tz" train "$@" --set run.device=$dev --set run.precision=fp32 --set run.dir="$work/$name" > "$work/$name.log" 2>&1 ||
    { bad "$name ($dev) failed"; tail -5 "$work/$name.log"; }
}

# 1. Llama: LoRA on a 4-bit base
$py "$src/tests/zero/make_model.py" "$work/model" || exit 1
$py "$src/tests/guard/tokens97.py" "$src/inputs/data/jargon.tok" "$work/t97.tok" || exit 1
cat > "$work/llama.cfg" <<CFG
model = { path = "$work/model"; };
data = { train = "$work/t97.tok"; seq_len = 32; };
train = { steps = 5; micro_batch = 4; threads = 1; log_every = 1; };
optim = { lr = 3e-3; warmup = 2; weight_decay = 0.1; };
lora = { rank = 3; alpha = 6.0; targets = ["q", "v", "down"]; };
quant = { bits = 4; group = 64; };
zero = { bucket_mb = 0.004; };
CFG
for dev in cpu cuda; do run llama-$dev $dev "$work/llama.cfg"; done
compare "Llama LoRA on a 4-bit base" "$work/llama-cpu" "$work/llama-cuda" \
  adapter/adapter_model.safetensors 5
# full fine-tuning of the dense model: the norms' and the embedding's weights trained too
for dev in cpu cuda; do
  run llama-full-$dev $dev "$work/llama.cfg" --set train.mode=full --set quant.bits=0 \
    --set train.steps=3 --set optim.lr=1e-3
done
compare "Llama full fine-tuning" "$work/llama-full-cpu" "$work/llama-full-cuda" \
  model/model.safetensors 3
# attention's outputs kept for the recomputation (tz_llama.att_keep: a device with
# checkpointing; four layers, so the first two layers' go to the host and back) against
# attention's forward run again (TZ_ATT_KEEP=0): a bf16 training saves the same bytes either
# way; the start-up line shows the kept outputs in host memory, and only when kept
"$tz" init-model --arch llama --preset mini --vocab 97 --seed 2 --out "$work/mini" > /dev/null ||
  bad "init-model --arch llama --preset mini"
for keep in 1 0; do
  TZ_ATT_KEEP=$keep timeout 300 "$tz" train "$work/llama.cfg" --set model.path="$work/mini" \
    --set train.checkpointing=true --set train.steps=3 --set run.device=cuda \
    --set run.precision=bf16 --set run.dir="$work/keep-$keep" > "$work/keep-$keep.log" 2>&1 ||
    { bad "keep-$keep (cuda, bf16) failed"; tail -5 "$work/keep-$keep.log"; }
  grep -o 'activations on the host [0-9.]*' "$work/keep-$keep.log" | head -1 > "$work/hacts-$keep"
done
if [ -s "$work/keep-1/adapter/adapter_model.safetensors" ] &&
   cmp -s "$work/keep-1/adapter/adapter_model.safetensors" \
     "$work/keep-0/adapter/adapter_model.safetensors" &&
   ! cmp -s "$work/hacts-1" "$work/hacts-0"; then
  ok "Llama LoRA in bf16, 4 layers, checkpointing: the recomputation reading attention's kept outputs saves the adapter of attention run again, byte for byte ($(cat "$work/hacts-1") MiB against $(cat "$work/hacts-0" | grep -o '[0-9.]*$') MiB)"
else
  bad "Llama LoRA in bf16, kept attention outputs against attention run again: the adapters differ, or the host memory did not change ($(cat "$work/hacts-1" "$work/hacts-0" | tr '\n' ' '))"
fi

# 2. DiT
fm=/usr/share/datasets/fashion-mnist
if [ -f $fm/train-images-idx3-ubyte.gz ]; then
  "$tz" init-model --arch dit --preset tiny --seed 3 --out "$work/dit" > /dev/null || bad "init-model --arch dit"
  for dev in cpu cuda; do
    run dit-$dev $dev "$src/inputs/dit/pretrain.cfg" --set model.path="$work/dit" \
      --set data.train=$fm/train-images-idx3-ubyte.gz --set data.train_labels=$fm/train-labels-idx1-ubyte.gz \
      --set data.val=$fm/t10k-images-idx3-ubyte.gz --set data.val_labels=$fm/t10k-labels-idx1-ubyte.gz \
      --set data.classes=0-4 --set train.steps=3 --set train.micro_batch=4 --set train.eval_every=0 \
      --set train.eval_windows=4 --set optim.warmup=1 --set train.threads=1 --set train.log_every=1 \
      --set zero.bucket_mb=0.05
  done
  compare "DiT pre-training" "$work/dit-cpu" "$work/dit-cuda" model/model.safetensors 3
else
  echo "skip DiT: dataset-fashion-mnist is not installed"
fi
# 3. Flux
if $py -c "import h5py" 2>/dev/null; then
  "$tz" init-model --arch flux --preset flux-tiny --out "$work/flux" > /dev/null || bad "init-model --arch flux"
  $py "$src/tests/flux/make_cache.py" "$work/flux.h5" --n 8 --seed 1 || bad "make_cache.py"
  cat > "$work/flux.cfg" <<CFG
model = { arch = "flux"; path = "$work/flux"; };
data = { train = "$work/flux.h5"; };
train = { mode = "lora"; steps = 3; micro_batch = 2; eval_every = 0; log_every = 1; threads = 1; };
lora = { rank = 4; alpha = 8.0; targets = ["to_q", "to_k", "to_v", "to_out.0"]; };
optim = { lr = 2e-3; warmup = 1; eps = 1e-4; };
quant = { bits = 4; group = 64; };
zero = { bucket_mb = 0.01; };
CFG
  for dev in cpu cuda; do run flux-$dev $dev "$work/flux.cfg"; done
  compare "Flux LoRA on a 4-bit base" "$work/flux-cpu" "$work/flux-cuda" \
    adapter/adapter_model.safetensors 3
  # one sample per step, checkpointed: the streams worked on in place as slices of the joint
  # rows (no split, no merge), the residual streams kept on the host
  sed -e 's/micro_batch = 2;/micro_batch = 1; checkpointing = true;/' "$work/flux.cfg" > "$work/flux1.cfg"
  for dev in cpu cuda; do run flux1-$dev $dev "$work/flux1.cfg"; done
  compare "Flux LoRA, one sample per step, checkpointing" "$work/flux1-cpu" "$work/flux1-cuda" \
    adapter/adapter_model.safetensors 3
  # attention on bf16 inputs (tz_flux.att16: a device with bf16 GEMMs) against fp32 inputs
  # (TZ_FLUX_ATT16=0): the flash kernels round their inputs as they stage them, so a bf16
  # training saves the same bytes either way (and the switch changes the plan: it is on)
  for a16 in 1 0; do
    TZ_FLUX_ATT16=$a16 timeout 300 "$tz" train "$work/flux1.cfg" --set run.device=cuda \
      --set run.precision=bf16 --set run.dir="$work/flux16-$a16" > "$work/flux16-$a16.log" 2>&1 ||
      { bad "flux16-$a16 (cuda, bf16) failed"; tail -5 "$work/flux16-$a16.log"; }
    TZ_FLUX_ATT16=$a16 "$tz" bench --preset flux-tiny --dry-run 2>&1 |
      grep -m1 -o 'planned backend memory per rank: [0-9.]* GiB ([0-9]* bytes)' > "$work/plan16-$a16"
  done
  if cmp -s "$work/flux16-1/adapter/adapter_model.safetensors" \
       "$work/flux16-0/adapter/adapter_model.safetensors" &&
     ! cmp -s "$work/plan16-1" "$work/plan16-0" && [ -s "$work/plan16-1" ]; then
    ok "Flux LoRA in bf16: attention on bf16 inputs saves the adapter of fp32 inputs, byte for byte ($(cat "$work/plan16-1" | grep -o '[0-9]* bytes') planned against $(cat "$work/plan16-0" | grep -o '[0-9]* bytes'))"
  else
    bad "Flux LoRA in bf16: attention on bf16 inputs against fp32 inputs: the adapters differ, or the switch did not change the plan ($(cat "$work/plan16-1" "$work/plan16-0" | tr '\n' ' '))"
  fi
  # attention's outputs kept for the recomputation (the runs above) against attention run
  # again (TZ_ATT_KEEP=0): the same bytes; the first two blocks' went to the host and back
  TZ_ATT_KEEP=0 timeout 300 "$tz" train "$work/flux1.cfg" --set run.device=cuda \
    --set run.precision=bf16 --set run.dir="$work/fluxk0" > "$work/fluxk0.log" 2>&1 ||
    { bad "fluxk0 (cuda, bf16, TZ_ATT_KEEP=0) failed"; tail -5 "$work/fluxk0.log"; }
  if [ -s "$work/flux16-1/adapter/adapter_model.safetensors" ] &&
     cmp -s "$work/flux16-1/adapter/adapter_model.safetensors" "$work/fluxk0/adapter/adapter_model.safetensors" &&
     grep -q "activations on the host .*" "$work/flux16-1.log" &&
     [ "$(grep -o 'activations on the host [0-9.]*' "$work/flux16-1.log" | head -1)" != \
       "$(grep -o 'activations on the host [0-9.]*' "$work/fluxk0.log" | head -1)" ]; then
    ok "Flux LoRA in bf16, checkpointing: the recomputation reading attention's kept outputs saves the adapter of attention run again, byte for byte"
  else
    bad "Flux LoRA in bf16: kept attention outputs against attention run again: the adapters differ, or the host memory did not change"
  fi
else
  echo "skip Flux: python3-h5py is not installed"
fi
finish train_emu

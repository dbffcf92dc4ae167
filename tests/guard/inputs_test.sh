#!/usr/bin/env bash
# Inputs refused before they cost anything, each with a message naming the place:
#  1. ranks that see different inputs (rank 1 runs in a folder whose data file, then whose
#     model file, differs from rank 0's; same relative paths) stop the job naming the rank,
#     the key and the file;
#  2. a config.json that does not match the weights (num_hidden_layers 1000000, a wrong
#     intermediate_size) is refused naming the tensor before the model is allocated (peak
#     RSS stays far below what 1000000 layers would take);
#  3. LoRA ranks: lora.rank above a layer's smaller dimension, an adapter r above 4096;
#  4. a token file whose header claims 2^64-1 tokens is reported with that count, not a
#     wrapped byte size;
#  5. a warmup longer than the run trains, with a warning;
#  6. a weight finite in F32 but Inf in BF16 stops a save with run.save_dtype = "bf16",
#     naming the tensor and element; a DiT weights file with a NaN is refused naming it.
# usage: inputs_test.sh TURBOZERO SOURCE_DIR MPIEXEC
set -u
tz=$(realpath "$1") src=$2 mpiexec=$3
py=/usr/bin/python3
work=$(mktemp -d "${TMPDIR:-/tmp}/tzinputs.XXXXXX")
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/../lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
g=$src/tests/guard
# expect_error NAME PATTERN CMD...: CMD exits non-zero with PATTERN (grep -F) in its output
expect_error() {
  local name=$1 pattern=$2
  shift 2
  timeout -k 5 120 "$@" > "$work/out.log" 2>&1
  local rc=$?
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -qF -- "$pattern" "$work/out.log"; then
    ok "$name: $(grep -F -- "$pattern" "$work/out.log" | head -1 | cut -c1-170)"
  else
    bad "$name: exit $rc, expected '$pattern'"; tail -4 "$work/out.log"
  fi
}
mkdir -p "$work/a" "$work/b"
$py "$src/tests/zero/make_model.py" "$work/a/model" > /dev/null || exit 1
$py "$g/tokens97.py" "$src/inputs/data/jargon.tok" "$work/a/t97.tok" 20000 || exit 1
cat > "$work/rel.cfg" <<CFG
model = { path = "model"; };
data = { train = "t97.tok"; seq_len = 16; };
train = { steps = 2; micro_batch = 2; threads = 1; };
lora = { rank = 2; };
CFG
sed -e "s|\"model\"|\"$work/a/model\"|" -e "s|\"t97.tok\"|\"$work/a/t97.tok\"|" "$work/rel.cfg" > "$work/abs.cfg"

# 1. rank 1 sees other files under the same relative paths
cp -r "$work/a/model" "$work/b/model"
$py "$g/tokens97.py" "$src/inputs/data/jargon.tok" "$work/b/t97.tok" 19000 || exit 1
mpmd=(timeout -k 5 120 "$mpiexec" -np 1 -wdir "$work/a" "$tz" train "$work/rel.cfg" --set run.dir="$work/mm"
      : -np 1 -wdir "$work/b" "$tz" train "$work/rel.cfg" --set run.dir="$work/mm")
expect_error "different data on rank 1" \
  "[rank 0] inputs differ between ranks: rank 1 sees a different data.train file t97.tok (19064 bytes" "${mpmd[@]}"
cp "$work/a/t97.tok" "$work/b/t97.tok"
$py "$g/poison.py" "$work/b/model/model.safetensors" model.norm.weight 3 0.5 || exit 1
expect_error "different model on rank 1 (same size)" \
  "rank 1 sees a different model.path file model/model.safetensors" "${mpmd[@]}"

# 2. config.json against the weights, before allocation
cp -r "$work/a/model" "$work/huge"
$py - "$work/huge/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["num_hidden_layers"] = 1000000; json.dump(c, open(sys.argv[1], "w"))
PY
rss=()
[ -x /usr/bin/time ] && rss=(/usr/bin/time -f "peak_rss_kb %M")
expect_error "num_hidden_layers 1000000" \
  "tensor 'model.layers.2.input_layernorm.weight' is missing from the weights, but config.json says num_hidden_layers = 1000000" \
  "${rss[@]}" "$tz" train "$work/abs.cfg" --set model.path="$work/huge" --set run.dir="$work/r1"
if [ ${#rss[@]} -gt 0 ]; then
  kb=$(grep -o 'peak_rss_kb [0-9]*' "$work/out.log" | awk '{print $2}')
  if [ -n "$kb" ] && [ "$kb" -lt 1048576 ]; then ok "refused at a peak RSS of $((kb / 1024)) MiB"
  else bad "peak RSS '$kb' kB (expected < 1 GiB)"; fi
fi
cp -r "$work/a/model" "$work/wide"
sed -i 's/"intermediate_size": 171/"intermediate_size": 172/' "$work/wide/config.json"
expect_error "intermediate_size 172 against 171-wide weights" \
  "tensor 'model.layers.0.mlp.gate_proj.weight' has shape [171, 64] in the weights, config.json implies [172, 64] (intermediate_size = 172)" \
  "$tz" train "$work/abs.cfg" --set model.path="$work/wide" --set run.dir="$work/r2"

# 3. LoRA ranks
expect_error "lora.rank 65 on 64-wide projections" \
  "LoRA rank 65 exceeds the smaller dimension of model.layers.0.self_attn.q_proj.weight (64 x 64)" \
  "$tz" train "$work/abs.cfg" --set lora.rank=65 --set run.dir="$work/r3"
mkdir -p "$work/adapter"
echo '{"r": 5000, "lora_alpha": 16, "target_modules": ["q_proj"]}' > "$work/adapter/adapter_config.json"
expect_error "adapter r 5000" "adapter_config.json: r: expected an integer in 1..4096" \
  "$tz" train "$work/abs.cfg" --set model.adapter="$work/adapter" --set run.dir="$work/r4"
expect_error "run.precision bf16 on the CPU" \
  'run.precision = "bf16": the cpu backend computes in fp32 only' \
  "$tz" train "$work/abs.cfg" --set run.device=cpu --set run.precision=bf16 --set run.dir="$work/r4b"

# 4. a token count of 2^64-1
$py - "$work/a/t97.tok" "$work/wrap.tok" <<'PY'
import struct, sys
d = bytearray(open(sys.argv[1], "rb").read()); d[24:32] = struct.pack("<Q", 2**64 - 1)
open(sys.argv[2], "wb").write(bytes(d))
PY
expect_error "token count 2^64-1" \
  "wrap.tok: header says 18446744073709551615 tokens (more than 2^64 bytes) but the file has 20064 bytes" \
  "$tz" train "$work/abs.cfg" --set data.train="$work/wrap.tok" --set run.dir="$work/r5"

# 5. warmup longer than the run: a warning, and the run completes
if "$tz" train "$work/abs.cfg" --set optim.warmup=10 --set run.dir="$work/r6" > "$work/warm.log" 2>&1 &&
   grep -qF "optim.warmup 10 >= train.steps 2: the learning rate rises for the whole run and peaks at 4e-05" "$work/warm.log"; then
  ok "warmup 10 over 2 steps: trained, with the warning"
else
  bad "warmup warning"; tail -3 "$work/warm.log"
fi

# 6. BF16 overflow on save: row 60 of the embedding is 3.4e38 (finite in F32, Inf in BF16)
#    and never looked up (the data's tokens are below 50), so training leaves it as it is
$py "$g/tokens97.py" "$src/inputs/data/jargon.tok" "$work/t50.tok" 20000 50 || exit 1
cp -r "$work/a/model" "$work/big"
$py "$g/poison.py" "$work/big/model.safetensors" model.embed_tokens.weight 3840 3.4e38 || exit 1
expect_error "BF16 save of 3.4e38" \
  "tensor 'model.embed_tokens.weight': element 3840 = 3.4e+38 overflows to Inf in BF16; refusing to save it" \
  "$tz" train "$work/abs.cfg" --set model.path="$work/big" --set data.train="$work/t50.tok" \
  --set train.mode=full --set run.save_dtype=bf16 --set run.dir="$work/r7"
[ -e "$work/r7/model/model.safetensors" ] && bad "a refused BF16 save left model.safetensors behind"
fm=/usr/share/datasets/fashion-mnist
if [ -f $fm/t10k-images-idx3-ubyte.gz ]; then
  "$tz" init-model --arch dit --preset tiny --out "$work/dit" > /dev/null || bad "init-model dit"
  $py "$g/poison.py" "$work/dit/model.safetensors" blocks.1.attn.qkv.weight 5 nan || exit 1
  expect_error "DiT weights with a NaN" \
    "dit/model.safetensors: tensor 'blocks.1.attn.qkv.weight': element 5 is NaN" \
    "$tz" eval "$src/inputs/dit/pretrain.cfg" --set model.path="$work/dit" --set data.classes=0-1
else
  echo "skip DiT weights with a NaN: dataset-fashion-mnist is not installed"
fi
finish inputs

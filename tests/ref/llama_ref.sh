#!/usr/bin/env bash
# Drives tests/ref/llama_ref.py over tiny random models: tied/untied x lora/full (+ checkpointing),
# a Llama 3.1-style copy (llama3 rope_scaling, F16 shards), and Qwen2 and Qwen3 models.
# usage: llama_ref.sh TURBOZERO TZ_GRAD_DUMP REF_DIR
set -u
tz=$1 dump=$2 ref=$3
py=/usr/bin/python3
if ! $py -c "import torch" 2>/dev/null; then
  echo "python3-torch is not installed: cannot run the PyTorch reference" >&2
  exit 1
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/tzref.XXXXXX")
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/../lib.sh"
# case NAME MODEL MODE CKPT: the gradients of MODEL (tz_grad_dump) against the PyTorch reference
n_case=0
case_ref() {
  n_case=$((n_case + 1))
  local name=$1 model=$2 mode=$3 ckpt=$4 out="$work/d-$n_case.safetensors"
  if "$dump" --model "$model" --mode $mode --ckpt $ckpt --B 2 --T 13 --rank 4 --alpha 8 \
       --targets 127 --seed 3 --out "$out" >/dev/null &&
     $py "$ref/llama_ref.py" "$model" "$out" $mode 8 1e-4 > "$work/log" 2>&1; then
    pass=$((pass + 1)); echo "ok   $name: $(grep 'worst' "$work/log")"
  else
    fail=$((fail + 1)); echo "FAIL $name"; cat "$work/log"
  fi
}
for tied in 1 0; do
  "$tz" init-model --arch llama --preset tiny --vocab 97 --tied $tied --seed 7 --out "$work/m$tied" >/dev/null || exit 1
  for cfg in "lora 0" "full 0" "lora 1" "full 1"; do
    set -- $cfg
    case_ref "tied=$tied mode=$1 checkpointing=$2" "$work/m$tied" $1 $2
  done
done
# Llama 3.1-style: rope_scaling llama3 (original_max_position_embeddings 64 puts the tiny
# model's 16 frequencies in all three bands: kept, interpolated, divided), tied embeddings,
# F16 weights in two shards with model.safetensors.index.json
$py "$ref/reshard.py" "$work/m1" "$work/m3" 8 1 4 64 || exit 1
for mode in lora full; do
  case_ref "llama3 rope_scaling, F16 shards, tied, mode=$mode" "$work/m3" $mode 0
done
# Qwen2/Qwen2.5 (q, k, v biases, tied) and Qwen3 (q_norm, k_norm, head_dim 24 with hidden 64
# and 4 heads, untied): random models in the HF layout, written by qwen_model.py
for arch in qwen2 qwen3; do
  $py "$ref/qwen_model.py" "$work/$arch" $arch 11 || exit 1
  for cfg in "lora 0" "full 0" "full 1"; do
    set -- $cfg
    case_ref "$arch mode=$1 checkpointing=$2" "$work/$arch" $1 $2
  done
done
finish llama_ref

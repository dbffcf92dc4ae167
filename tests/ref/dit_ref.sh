#!/usr/bin/env bash
# Drives tests/ref/dit_ref.py: tiny random DiTs (lora/full x learn_sigma x ddpm/flow, one with
# checkpointing) and the two samplers on a fake model.
# usage: dit_ref.sh TZ_DIT_DUMP REF_DIR
set -u
dump=$1 ref=$2
py=/usr/bin/python3
if ! $py -c "import torch" 2>/dev/null; then
  echo "python3-torch is not installed: cannot run the PyTorch reference" >&2
  exit 1
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/tzditref.XXXXXX")
trap 'rm -rf "$work"' EXIT
pass=0 fail=0
run() { # name, then the check command; the log's summary lines are shown
  local name=$1; shift
  if "$@" > "$work/log" 2>&1; then
    pass=$((pass + 1)); echo "ok   $name: $(grep -E 'worst|sampler' "$work/log" | tr '\n' ' ')"
  else
    fail=$((fail + 1)); echo "FAIL $name"; cat "$work/log"
  fi
}
i=0
for cfg in "lora 0 ddpm 0" "full 0 ddpm 0" "lora 1 flow 0" "full 1 flow 0" "full 1 ddpm 1" "lora 0 flow 1"; do
  set -- $cfg
  mode=$1 sigma=$2 diff=$3 ckpt=$4
  i=$((i + 1))
  m="$work/m$i" out="$work/d$i.safetensors"
  run "mode=$mode learn_sigma=$sigma diffusion=$diff checkpointing=$ckpt" \
    bash -c "'$dump' --model-out '$m' --out '$out' --mode $mode --sigma $sigma --diffusion $diff \
             --ckpt $ckpt --B 7 --rank 4 --alpha 8 --targets 31 --seed $i >/dev/null &&
             $py '$ref/dit_ref.py' '$m' '$out' $mode 8 1e-4"
done
for s in ddim euler; do
  run "sampler $s (fake model, guidance 3)" \
    bash -c "'$dump' --sampler $s --out '$work/s-$s.safetensors' >/dev/null &&
             $py '$ref/dit_ref.py' --sampler $s '$work/s-$s.safetensors' 1e-5"
done
echo "dit_ref: $pass passed, $fail failed"
[ $fail -eq 0 ]

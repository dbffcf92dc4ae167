#!/usr/bin/env bash
# Drives tests/ref/flux_ref.py: small random Flux transformers in the diffusers layout (with
# and without a guidance embedder, double and single blocks, a text stream and a 3-axis RoPE
# grid), their flow-matching loss and every gradient from turbozero (tz_flux_dump) against the
# fp64 PyTorch reference, 1e-4 relative; once with checkpointing.
# usage: flux_ref.sh TZ_FLUX_DUMP REF_DIR
set -u
dump=$1 ref=$2
py=/usr/bin/python3
if ! $py -c "import torch" 2>/dev/null; then
  echo "python3-torch is not installed: cannot run the PyTorch reference" >&2
  exit 1
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/tzfluxref.XXXXXX")
trap 'rm -rf "$work"' EXIT
pass=0 fail=0
i=0
check() { # name, make args, inputs args, dump args
  local name=$1 margs=$2 iargs=$3 dargs=$4
  i=$((i + 1))
  local m="$work/m$i" in="$work/in$i.safetensors" r="$work/ref$i.safetensors" g="$work/got$i.safetensors"
  if $py "$ref/flux_ref.py" prepare "$m" "$in" "$r" --seed $i $margs $iargs > "$work/log" 2>&1 &&
     "$dump" "$m" "$in" "$g" $dargs >> "$work/log" 2>&1 &&
     $py "$ref/flux_ref.py" compare "$r" "$g" --tol 1e-4 > "$work/cmp" 2>&1; then
    pass=$((pass + 1)); echo "ok   $name: $(grep -E 'worst' "$work/cmp" | tail -1)"
  else
    fail=$((fail + 1)); echo "FAIL $name"; cat "$work/log"; grep -v '^ok' "$work/cmp" | head -20
  fi
}
check "2 double + 2 single blocks, guidance, B 2, 5 text + 3x4 image tokens" "" "" ""
check "1 double + 3 single blocks, no guidance, 3 heads of 8, B 3, 2 text + 2x5 image tokens" \
  "--layers 1 --single 3 --heads 3 --head-dim 8 --axes 2,2,4 --no-guidance" \
  "--batch 3 --txt 2 --grid 2,5" ""
check "the first model with checkpointing" "" "" "--ckpt 1"
check "double blocks only" "--layers 2 --single 0" "--batch 1 --txt 3 --grid 2,2" ""
check "the first model, one sample, checkpointing (streams as slices of the joint rows)" "" \
  "--batch 1" "--ckpt 1"
echo "flux_ref: $pass passed, $fail failed"
[ $fail -eq 0 ]

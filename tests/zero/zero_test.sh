#!/usr/bin/env bash
# Data parallel training over MPI ranks with ZeRO stages 0, 1, 2:
#  1. for one global batch, the loss after every step of a 20-step LoRA run and of a 20-step
#     full run (each step's loss, elementwise), and the final parameters (each tensor's
#     ||a - b|| / ||a||, see compare.py), agree for N = 1, 2, 3, 4 and every stage to a
#     relative 1e-6. Not bit for bit: with N ranks the gradient of the global batch is a sum
#     of N partial sums (and stage 2 sums bucket slices in a different order), and float
#     addition is not associative; the differences are rounding, ~1e-7 relative.
#     Awkward sizes on purpose: vocab 97 and MLP width 171 (tests/zero/make_model.py), so no
#     tensor is a multiple of the alignment; buckets of 0.02 MiB (5242 elements), smaller
#     than the largest tensors (6208 and 10944 elements), so tensors are cut across buckets.
#     Full fine-tuning of a 4-bit TurboQuant base (quant.bits = 4, group 64: the projections
#     whose rows are a multiple of 64 are quantized, down_proj's 171 stays dense), stages 1
#     and 2: every rank re-quantizes the groups it owns and all-gathers codes and scales.
#     Here 1e-6 cannot hold in general, and the test says why rather than hide it: the fp32
#     masters differ by rounding as above, and Q is discontinuous, so a value at a codebook
#     decision boundary (or a group scale at a bf16 rounding boundary, a 2^-8 step) takes
#     the neighbouring code at one N and not at another; from then on the two runs see
#     different weights and drift apart as any training does from a perturbation. Measured
#     (2026-11-23), worst over N = 2, 3, 4 and stages 1, 2: with the AVX-512 kernel, 4 code
#     bytes of 34,176 differ, losses 2.2e-5 apart, scales 3.6e-4 (norm-wise); with the AVX2
#     kernel (other rounding in attention), 141 code bytes (0.41%), losses 2.8e-4, scales
#     3.4e-3; with the portable kernel, within the AVX-512 figures. So quantized runs assert
#     losses within TOLQ = 2e-3, dense tensors and scales within SCALES = 2e-2 and at most
#     CODES = 2% differing code bytes (about 7x the worst measured). Where a slice lands and
#     which signs re-quantize it is checked exactly elsewhere (unit/test_zero_weights: every
#     slice at N = 1-4 gives the codes of quantizing the whole master), and what is exact here
#     is asserted exactly: where the sums are the same additions the results are the same
#     bits: N = 2 in stage 2 (one addition of two ranks' gradients per
#     bucket) equals N = 1 with grad_accum = 2 (the host accumulator adds the two
#     micro-batches), losses and model file alike, full and LoRA on the 4-bit base.
#  2. each rank's host shard is exactly its share: the per-rank bytes printed at start-up
#     are equal and sum to the one-rank figure plus at most one bucket padding per bucket.
#  3. a rank that fails alone (its data path does not exist in its working directory)
#     stops every rank with its message instead of hanging.
# usage: zero_test.sh TURBOZERO SOURCE_DIR MPIEXEC
set -u
tz=$1 src=$2 mpiexec=$3
py=/usr/bin/python3
TOL=1e-6
TOLQ=2e-3 SCALES=2e-2 CODES=0.02   # quantized full fine-tuning: see above
work=$(mktemp -d "${TMPDIR:-/tmp}/tzzero.XXXXXX")
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/../lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
$py "$src/tests/zero/make_model.py" "$work/model" || exit 1
cat > "$work/run.cfg" <<CFG
model = { path = "$work/model"; };
data = { train = "$src/inputs/data/jargon.tok"; seq_len = 32; };
train = { steps = 20; micro_batch = 12; grad_accum = 2; threads = 1; log_every = 20; };
optim = { lr = 3e-3; warmup = 3; weight_decay = 0.1; };
lora = { rank = 3; alpha = 6.0; targets = ["q", "v", "down"]; };
zero = { bucket_mb = 0.02; };
CFG
# the data's vocab (256) exceeds the model's (97): use a file of the bundled text mod 97
$py "$src/tests/guard/tokens97.py" "$src/inputs/data/jargon.tok" "$work/t97.tok" || exit 1
sed -i "s|$src/inputs/data/jargon.tok|$work/t97.tok|" "$work/run.cfg"

losses() { grep -o '"loss": [0-9.e+-]*' "$1/metrics.jsonl" | awk '{print $2}'; }
for mode in lora full; do
  out=$([ $mode = lora ] && echo adapter/adapter_model.safetensors || echo model/model.safetensors)
  ref=""
  for n in 1 2 3 4; do
    for stage in 0 1 2; do
      dir="$work/$mode-$n-$stage"
      if ! timeout 300 "$mpiexec" -np $n "$tz" train "$work/run.cfg" --set train.mode=$mode \
          --set train.micro_batch=$((12 / n)) --set zero.stage=$stage --set run.dir="$dir" > "$dir.log" 2>&1; then
        bad "$mode N=$n stage $stage: run failed"; tail -5 "$dir.log"; continue
      fi
      [ -n "$ref" ] || { ref=$dir; continue; }
      worst=$(paste <(losses "$ref") <(losses "$dir") | awk '
        { d = $1 - $2; if (d < 0) d = -d; r = d / $1; if (r > w) w = r; n++ }
        END { if (n != 20) print "steps:" n; else printf "%.3e", w }')
      pw=$($py "$src/tests/zero/compare.py" "$ref/$out" "$dir/$out" $TOL)
      prc=$?
      if [[ "$worst" =~ ^[0-9.e+-]+$ ]] && awk -v w="$worst" -v t=$TOL 'BEGIN {exit !(w <= t)}' && [ $prc -eq 0 ]; then
        ok "$mode N=$n stage $stage: 20 losses within $worst, final parameters within $pw of N=1 stage 0"
      else
        bad "$mode N=$n stage $stage: losses differ by $worst, parameters by $pw (tolerance $TOL)"
      fi
    done
  done
done

# full fine-tuning of a 4-bit base: every N and stages 1, 2 against N = 1 stage 0
q=(--set train.mode=full --set quant.bits=4 --set quant.group=64)
ref=""
for n in 1 2 3 4; do
  for stage in 0 1 2; do
    [ $n -gt 1 ] && [ $stage -eq 0 ] && continue
    [ $n -eq 1 ] && [ $stage -ne 0 ] && continue
    dir="$work/fullq-$n-$stage"
    if ! timeout 300 "$mpiexec" -np $n "$tz" train "$work/run.cfg" "${q[@]}" --set train.micro_batch=$((12 / n)) \
        --set zero.stage=$stage --set run.dir="$dir" > "$dir.log" 2>&1; then
      bad "fullq N=$n stage $stage: run failed"; tail -5 "$dir.log"; continue
    fi
    [ -n "$ref" ] || { ref=$dir; continue; }
    worst=$(paste <(losses "$ref") <(losses "$dir") | awk '
      { d = $1 - $2; if (d < 0) d = -d; r = d / $1; if (r > w) w = r; n++ }
      END { if (n != 20) print "steps:" n; else printf "%.3e", w }')
    pw=$($py "$src/tests/zero/compare.py" "$ref/model/model.safetensors" "$dir/model/model.safetensors" $SCALES $CODES)
    prc=$?
    if [[ "$worst" =~ ^[0-9.e+-]+$ ]] && awk -v w="$worst" -v t=$TOLQ 'BEGIN {exit !(w <= t)}' && [ $prc -eq 0 ]; then
      ok "full on a 4-bit base, N=$n stage $stage: 20 losses within $worst; dense tensors and scales within $pw"
    else
      bad "full on a 4-bit base, N=$n stage $stage: losses differ by $worst, parameters by $pw"
    fi
  done
done
# the same additions give the same bits: N = 2 stage 2 vs N = 1 with two accumulated micro-batches
for mode in full lora; do
  for r in a b; do
    np=$([ $r = a ] && echo 1 || echo 2) acc=$([ $r = a ] && echo 2 || echo 1)
    "$mpiexec" -np $np "$tz" train "$work/run.cfg" "${q[@]}" --set train.mode=$mode --set train.micro_batch=6 \
      --set train.grad_accum=$acc --set zero.stage=2 --set run.dir="$work/same-$mode-$r" > "$work/same-$mode-$r.log" 2>&1 ||
      bad "$mode on a 4-bit base, N=$np accum $acc: run failed"
  done
  out=$([ $mode = lora ] && echo adapter/adapter_model.safetensors || echo model/model.safetensors)
  if [ -s "$work/same-$mode-a/$out" ] && diff <(losses "$work/same-$mode-a") <(losses "$work/same-$mode-b") > /dev/null &&
     cmp -s "$work/same-$mode-a/$out" "$work/same-$mode-b/$out"; then
    ok "$mode on a 4-bit base: N=2 stage 2 = N=1 with grad_accum 2, bit for bit (losses and $out)"
  else
    bad "$mode on a 4-bit base: N=2 stage 2 differs from N=1 with grad_accum 2"
  fi
done

# host shard bytes per rank (stage 2 full runs): equal across ranks, sum = one-rank + padding
one=$(grep -o 'host shard [0-9]* bytes' "$work/full-1-2.log" | awk '{print $3}')
buckets=$(grep -o 'in [0-9]* buckets' "$work/full-1-2.log" | head -1 | awk '{print $2}')
for n in 2 3 4; do
  per=$(grep -o 'host shard [0-9]* bytes' "$work/full-$n-2.log" | awk '{print $3}')
  count=$(echo "$per" | wc -l) distinct=$(echo "$per" | sort -u | wc -l)
  sum=$(echo "$per" | awk '{s += $1} END {print s}')
  nb=$(grep -o 'in [0-9]* buckets' "$work/full-$n-2.log" | head -1 | awk '{print $2}')
  owned=$(grep -o 'owns [0-9]* of [0-9]*' "$work/full-$n-2.log" | awk '{s += $2; t = $4} END {print s, t}')
  bound=$((nb * n * 256 * 17))   # < N*A padding elements per bucket, 17 bytes each
  if [ "$count" -eq $n ] && [ "$distinct" -eq 1 ] && [ $((sum - one)) -ge 0 ] && [ $((sum - one)) -lt $bound ] &&
     [ "$(echo $owned | awk '{print $1 == $2}')" = 1 ]; then
    ok "N=$n: $n equal shards of $(echo "$per" | head -1) bytes sum to $sum = one rank's $one + $((sum - one)) padding (< $bound); owned parameters sum to the $(echo $owned | awk '{print $2}') trainable"
  else
    bad "N=$n: shard bytes [$(echo $per)] vs one rank's $one (buckets $buckets/$nb, bound $bound)"
  fi
done

# one rank fails alone: rank 1 runs in a folder without the (relative) data file
mkdir -p "$work/has" "$work/lacks"
cp "$work/t97.tok" "$work/has/t97.tok"
sed "s|$work/t97.tok|t97.tok|" "$work/run.cfg" > "$work/rel.cfg"
start=$(date +%s)
timeout 120 "$mpiexec" -np 1 -wdir "$work/has" "$tz" train "$work/rel.cfg" --set run.dir="$work/fail" : \
  -np 1 -wdir "$work/lacks" "$tz" train "$work/rel.cfg" --set run.dir="$work/fail" > "$work/fail.log" 2>&1
rc=$?
took=$(( $(date +%s) - start ))
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "\[rank 1\].*data.train: t97.tok: cannot open" "$work/fail.log"; then
  ok "a failing rank stops the job (exit $rc after ${took}s) with its message"
else
  bad "failing rank: exit $rc after ${took}s"; grep -F "[rank 1]" "$work/fail.log" | head -5
fi

finish zero

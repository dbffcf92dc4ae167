#!/usr/bin/env bash
# lora.init = "loftq" end to end, on the ZeRO test's awkward tiny Llama (tests/zero/) at 3 bits,
# group 64 (q and v quantized; down_proj, rows of 171, stays dense and keeps the default init):
#  1. the log reports the 4 weights re-quantized and their error against quantize(W) alone;
#  2. LoRA training agrees across ranks as every LoRA run does (tests/zero/zero_test.sh): N = 2
#     and 3, stage 2, within TOL of N = 1 (losses and adapter), and N = 2 stage 2 equals N = 1
#     with grad_accum 2 bit for bit, which needs both ranks to hold the same loftq base;
#     loftq_calibrated likewise at N = 2 against N = 1 with grad_accum 2, and resumed at N = 2;
#  3. resume: from the step-5 checkpoint of a 2-rank run, at N = 2 bit for bit as the
#     uninterrupted run, at N = 1 within TOL (the base is made again, the adapter read back);
#  4. eval of the saved adapter gives the training's final validation loss exactly, with the
#     config's lora.init = "loftq" and with "default" too (the adapter records its init and
#     seed, so its base is made again; a differing config is warned about); export --merge
#     folds it into that base, not the dense weights: the merged model evaluates the same;
#  5. on a dense base it warns and trains exactly as lora.init = "default";
#  6. a quantized model.path is refused with the reason and a hint.
# usage: loftq_test.sh TURBOZERO SOURCE_DIR MPIEXEC
set -u
tz=$1 src=$2 mpiexec=$3
py=/usr/bin/python3
TOL=1e-6
work=$(mktemp -d "${TMPDIR:-/tmp}/tzloftq.XXXXXX")
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/../lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
$py "$src/tests/zero/make_model.py" "$work/model" || exit 1
$py "$src/tests/guard/tokens97.py" "$src/inputs/data/jargon.tok" "$work/t97.tok" || exit 1
$py "$src/tests/guard/tokens97.py" "$src/inputs/data/jargon.val.tok" "$work/v97.tok" || exit 1
cat > "$work/run.cfg" <<CFG
model = { path = "$work/model"; };
data = { train = "$work/t97.tok"; val = "$work/v97.tok"; seq_len = 32; };
train = { steps = 10; micro_batch = 6; grad_accum = 2; threads = 1; log_every = 10;
          checkpoint_every = 5; keep_checkpoints = 0; };
optim = { lr = 3e-3; warmup = 3; weight_decay = 0.1; };
lora = { rank = 3; alpha = 6.0; targets = ["q", "v", "down"]; init = "loftq"; };
quant = { bits = 3; group = 64; };
zero = { bucket_mb = 0.02; };
CFG
# train N DIR [args...]: N ranks, 12 rows per step whatever N
train() {
  local n=$1 dir=$2; shift 2
  timeout 300 "$mpiexec" -np $n "$tz" train "$work/run.cfg" --set train.micro_batch=$((12 / n)) \
    --set train.grad_accum=1 --set run.dir="$dir" "$@" > "$dir.log" 2>&1
}
losses() { grep -o '"loss": [0-9.e+-]*' "$1/metrics.jsonl" | awk '{print $2}'; }
# "step loss" of every step after S of a run
losses_after() { grep -o '"step": [0-9]*, "loss": [0-9.e+-]*' "$2/metrics.jsonl" | tr -d '",' | awk -v s=$1 '$2 > s {print $2, $4}'; }
eval_last() { grep -o '"eval_loss": [0-9.e+-]*' "$1/metrics.jsonl" | tail -1 | awk '{print $2}'; }
worst() { # worst relative difference of two runs' step losses, or a reason
  paste <(losses "$1") <(losses "$2") | awk '{ d = $1 - $2; if (d < 0) d = -d; r = d / $1;
    if (r > w) w = r; n++ } END { if (n != 10) print "steps:" n; else printf "%.3e", w }'
}
agree() { # NAME REF DIR: losses and adapter within TOL
  local w pw prc
  w=$(worst "$2" "$3")
  pw=$($py "$src/tests/zero/compare.py" "$2/adapter/adapter_model.safetensors" "$3/adapter/adapter_model.safetensors" $TOL)
  prc=$?
  if [[ "$w" =~ ^[0-9.e+-]+$ ]] && awk -v w="$w" -v t=$TOL 'BEGIN {exit !(w <= t)}' && [ $prc -eq 0 ]; then
    ok "$1: 10 losses within $w, adapter within $pw"
  else
    bad "$1: losses differ by $w, adapter by $pw (tolerance $TOL)"
  fi
}

# 1, 2: ranks
train 1 "$work/n1" || { bad "N=1 run failed"; tail -5 "$work/n1.log"; }
line=$(grep -o "lora.init = loftq: 4 quantized weights.*" "$work/n1.log")
[ -n "$line" ] && ok "logged: $line" || bad "no loftq line for 4 weights in n1.log"
for n in 2 3; do
  train $n "$work/n$n" || { bad "N=$n run failed"; tail -5 "$work/n$n.log"; continue; }
  agree "N=$n stage 2 vs N=1" "$work/n1" "$work/n$n"
done
train 1 "$work/acc2" --set train.micro_batch=6 --set train.grad_accum=2 || bad "N=1 grad_accum 2 run failed"
if same_run "$work/acc2" "$work/n2" adapter/adapter_model.safetensors; then
  ok "N=2 stage 2 = N=1 with grad_accum 2, bit for bit (losses and adapter): the ranks' bases are the same"
else
  bad "N=2 stage 2 differs from N=1 with grad_accum 2"
fi

# 2b: loftq_calibrated (loftq's base, the adapters refitted on the inputs of the first training
# rows, the same rows on every rank): N = 2 stage 2 = N = 1 with grad_accum 2 bit for bit, not
# loftq's adapter, and a resume at N = 2 from step 5 bit for bit
cal=(--set lora.init=loftq_calibrated --set lora.calibration=8)
if train 2 "$work/c2" "${cal[@]}" && train 1 "$work/cacc2" "${cal[@]}" --set train.micro_batch=6 \
     --set train.grad_accum=2; then
  line=$(grep -o "lora.init = calibrated: 4 quantized weights.*" "$work/c2.log")
  [ -n "$line" ] && ok "logged: $line" || bad "no calibrated line for 4 weights in c2.log"
  same_run "$work/cacc2" "$work/c2" adapter/adapter_model.safetensors &&
    ! cmp -s "$work/c2/adapter/adapter_model.safetensors" "$work/n2/adapter/adapter_model.safetensors" &&
    ok "loftq_calibrated: N=2 stage 2 = N=1 with grad_accum 2, bit for bit, and not loftq's adapter" ||
    bad "loftq_calibrated: N=2 differs from N=1 with grad_accum 2, or equals loftq's adapter"
  if train 2 "$work/cres2" "${cal[@]}" --resume "$work/c2/checkpoints/step-5" &&
     [ -n "$(losses_after 5 "$work/cres2")" ] && cmp -s <(losses_after 5 "$work/c2") <(losses_after 5 "$work/cres2") &&
     cmp -s "$work/c2/adapter/adapter_model.safetensors" "$work/cres2/adapter/adapter_model.safetensors"; then
    ok "loftq_calibrated resumed at N=2 from step 5: losses and adapter bit for bit"
  else
    bad "loftq_calibrated: resume at N=2 differs from the uninterrupted run"; tail -3 "$work/cres2.log"
  fi
else
  bad "loftq_calibrated runs failed"; tail -5 "$work/c2.log" "$work/cacc2.log"
fi

# 3: resume from the 2-rank run's step-5 checkpoint
if train 2 "$work/res2" --resume "$work/n2/checkpoints/step-5" && [ -n "$(losses_after 5 "$work/res2")" ] &&
   cmp -s <(losses_after 5 "$work/n2") <(losses_after 5 "$work/res2") &&
   cmp -s "$work/n2/adapter/adapter_model.safetensors" "$work/res2/adapter/adapter_model.safetensors"; then
  ok "resumed at N=2 from step 5: losses and adapter bit for bit as the uninterrupted run"
else
  bad "resume at N=2 differs from the uninterrupted run"; tail -3 "$work/res2.log"
fi
if train 1 "$work/res1" --resume "$work/n2/checkpoints/step-5"; then
  w=$(paste <(losses_after 5 "$work/n2") <(losses_after 5 "$work/res1") | awk '{ if ($1 != $3) bad = 1;
      d = $2 - $4; if (d < 0) d = -d; r = d / $2; if (r > w) w = r; n++ } END { if (bad || n != 5) print "steps:" n; else printf "%.3e", w }')
  pw=$($py "$src/tests/zero/compare.py" "$work/n2/adapter/adapter_model.safetensors" "$work/res1/adapter/adapter_model.safetensors" $TOL)
  prc=$?
  if [[ "$w" =~ ^[0-9.e+-]+$ ]] && awk -v w="$w" -v t=$TOL 'BEGIN {exit !(w <= t)}' && [ $prc -eq 0 ]; then
    ok "written by 2 ranks, resumed by 1 at step 5: losses within $w, adapter within $pw"
  else
    bad "resumed by 1 rank: losses differ by $w, adapter by $pw"
  fi
else
  bad "resume at N=1 failed"; tail -3 "$work/res1.log"
fi

# 4: the adapter belongs to the loftq base
ev() { "$tz" eval "$work/run.cfg" --set model.adapter="$work/n1/adapter" --set train.threads=1 "$@" 2>&1 |
         tail -1 | sed -n 's/^eval_loss=\([0-9.]*\) .*/\1/p'; }
final=$(eval_last "$work/n1") with=$(ev) without=$(ev --set lora.init=default)
if [ -n "$final" ] && [ "$with" = "$final" ] && [ "$without" = "$final" ]; then
  ok "eval of the adapter: $with = training's final $final, with lora.init = loftq and with default (the adapter's record makes its base)"
else
  bad "eval of the adapter: loftq $with, default $without, training's final $final"
fi
"$tz" eval "$work/run.cfg" --set model.adapter="$work/n1/adapter" --set lora.init=default 2>&1 |
  grep -q 'was trained with lora.init = "loftq" (its adapter_config.json): its base is made so' &&
  ok "a config's lora.init = default under a loftq adapter: warned, not used" ||
  bad "no warning for a config's lora.init that the adapter's record overrides"
# export --merge folds the adapter into the loftq base (quantized as the training did), not
# into the dense weights: the merged dense model evaluates as base + adapter did
"$tz" export --model "$work/model" --adapter "$work/n1/adapter" --merge --dtype f32 --out "$work/merged" \
  > "$work/merge.log" 2>&1 || { bad "export --merge of the loftq adapter failed"; tail -3 "$work/merge.log"; }
merged=$("$tz" eval "$work/run.cfg" --set model.path="$work/merged" --set quant.bits=0 --set lora.init=default \
  --set train.threads=1 2>&1 | tail -1 | sed -n 's/^eval_loss=\([0-9.]*\) .*/\1/p')
if grep -q "trained on a loftq base" "$work/merge.log" && [ -n "$merged" ] &&
   awk -v a="$merged" -v b="$final" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-4 * b) }'; then
  ok "export --merge of a loftq adapter: the merged model's eval $merged = base + adapter's $final (1e-4)"
else
  bad "export --merge of a loftq adapter: merged eval $merged, base + adapter $final"; tail -2 "$work/merge.log"
fi

# 5: a dense base: the default init, with a warning
train 1 "$work/dl" --set quant.bits=0 --set train.micro_batch=6 --set train.grad_accum=2 || bad "dense loftq run failed"
train 1 "$work/dd" --set quant.bits=0 --set lora.init=default --set train.micro_batch=6 --set train.grad_accum=2 || bad "dense default run failed"
if grep -q 'warning: lora.init = "loftq": no adapted weight is quantized' "$work/dl.log" &&
   same_run "$work/dd" "$work/dl" adapter/adapter_model.safetensors; then
  ok "dense base: warned, and trained bit for bit as lora.init = default"
else
  bad "dense base with lora.init = loftq"; grep -i warn "$work/dl.log" | head -3
fi

# 6: a quantized folder has no dense weights to start from
"$tz" quantize --model "$work/model" --bits 3 --group 64 --out "$work/q3" > /dev/null 2>&1 || bad "quantize failed"
train 1 "$work/refused" --set model.path="$work/q3" --set quant.bits=0
rc=$?
if [ $rc -ne 0 ] && grep -q 'lora.init = "loftq" starts from the dense weights, but model.path .*q3 is already quantized (turboquant, 3 bits)' "$work/refused.log" &&
   grep -q "HINT: point model.path at the dense model" "$work/refused.log"; then
  ok "a quantized model.path is refused (exit $rc) with the reason and a hint"
else
  bad "quantized model.path: exit $rc"; tail -3 "$work/refused.log"
fi
finish loftq

#!/usr/bin/env bash
# Quality of quantized base weights on the bundled model, in its own domain (the KJV
# validation text it was pretrained for; its first 160 windows of 256 tokens, 41k tokens:
# measured 2026-11-26, the increases over dense at 4, 3, 2 bits are 0.0019, 0.0178, 0.1292 for
# TurboQuant and 0.0049, 0.0273, 0.2545 for absmax): validation loss of the dense model and of
# TurboQuant and the absmax baseline at 4, 3 and 2 bits, group 128 (group 64 where 128 does
# not divide a row). Requires, at every b: TurboQuant's loss increase over dense smaller than
# absmax's, and its total weight error smaller; both methods degrade monotonically with fewer
# bits. Then LoRA on KJV itself (the CI recipe: 40 steps of 8 x 128 tokens) from the 2-bit
# TurboQuant base and from the dense base must close more than half of the base gap:
# gap after <= RECOVERY x gap before (measured 2026-11-22: 0.1192 -> 0.0507, ratio 0.43, on
# the first 256 validation windows of 128 tokens; the dense run itself moves 1.0787 ->
# 1.0819). Needs the KJV text: inputs/data/kjv.tok and kjv.val.tok (inputs/data/make_data.sh),
# or the `bible` program (Debian bible-kjv) to make them here; exits 77 (skipped) with neither.
# usage: quant_quality.sh TURBOZERO SOURCE_DIR
set -u
tz=$1 src=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/tzqual.XXXXXX")
trap 'rm -rf "$work"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok   $*"; }
bad() { fail=$((fail + 1)); echo "FAIL $*"; }
cd "$src"
RECOVERY=0.5
val=inputs/data/kjv.val.tok train=inputs/data/kjv.tok
if [ ! -s "$val" ] || [ ! -s "$train" ]; then
  if ! command -v bible > /dev/null; then
    echo "SKIP: no $val and no bible program (apt-get install bible-kjv, or run inputs/data/make_data.sh)"
    exit 77
  fi
  bible -l0 "gen1:1-rev22:21" > "$work/kjv.txt" &&   # as inputs/data/make_data.sh does
    "$tz" prep text --tokenizer bytes --in "$work/kjv.txt" --out "$work/kjv.tok" \
      --val-fraction 0.02 --val-out "$work/kjv.val.tok" > /dev/null || { echo "FAIL making KJV data"; exit 1; }
  val=$work/kjv.val.tok train=$work/kjv.tok
fi
ev() { "$tz" eval inputs/llama/finetune.cfg --set data.val="$val" --set data.seq_len=256 --set train.eval_windows=160 \
         --set train.threads=2 "$@" 2>&1 | tail -1 | sed -n 's/^eval_loss=\([0-9.]*\) .*/\1/p'; }
dense=$(ev)
declare -A loss err
for m in turboquant absmax; do
  for b in 4 3 2; do
    "$tz" quantize --model inputs/llama/model --bits $b --group 128 --method $m --out "$work/$m$b" > "$work/$m$b.log" 2>&1 ||
      { bad "quantize $m $b"; cat "$work/$m$b.log"; }
    err[$m$b]=$(sed -n 's/^projections: .*relative error \([0-9.]*\)$/\1/p' "$work/$m$b.log")
    loss[$m$b]=$(ev --set model.path="$work/$m$b")
  done
done
echo "     KJV validation loss (nats/byte), dense $dense; increase over dense, and weight error:"
echo "      b | TurboQuant          | absmax"
for b in 4 3 2; do
  printf "      %s | %s %+.4f %.5f | %s %+.4f %.5f\n" $b "${loss[turboquant$b]}" \
    "$(awk -v a="${loss[turboquant$b]}" -v d="$dense" 'BEGIN {print a - d}')" "${err[turboquant$b]}" \
    "${loss[absmax$b]}" "$(awk -v a="${loss[absmax$b]}" -v d="$dense" 'BEGIN {print a - d}')" "${err[absmax$b]}"
done
for b in 4 3 2; do
  t=${loss[turboquant$b]} a=${loss[absmax$b]}
  if [ -n "$dense" ] && [ -n "$t" ] && [ -n "$a" ] && awk -v t="$t" -v a="$a" -v d="$dense" 'BEGIN {exit !(t - d < a - d)}'; then
    ok "b=$b: TurboQuant's loss increase $(awk -v t="$t" -v d="$dense" 'BEGIN {print t - d}') < absmax's $(awk -v a="$a" -v d="$dense" 'BEGIN {print a - d}')"
  else
    bad "b=$b: TurboQuant $t vs absmax $a (dense $dense)"
  fi
  awk -v t="${err[turboquant$b]}" -v a="${err[absmax$b]}" 'BEGIN {exit !(t != "" && t < a)}' &&
    ok "b=$b: TurboQuant's weight error ${err[turboquant$b]} < absmax's ${err[absmax$b]}" ||
    bad "b=$b: weight error TurboQuant ${err[turboquant$b]} vs absmax ${err[absmax$b]}"
done
for m in turboquant absmax; do
  awk -v d="$dense" -v l4="${loss[${m}4]}" -v l3="${loss[${m}3]}" -v l2="${loss[${m}2]}" \
    'BEGIN {exit !(d < l4 && l4 < l3 && l3 < l2)}' &&
    ok "$m: dense < 4 < 3 < 2 bits" || bad "$m: losses not ordered: $dense ${loss[${m}4]} ${loss[${m}3]} ${loss[${m}2]}"
done
# LoRA on the model's own text closes most of the 2-bit base's gap
common=(--set data.train="$train" --set data.val="$val" --set data.seq_len=128 --set train.steps=40
        --set train.micro_batch=8 --set train.eval_every=0 --set train.eval_windows=256
        --set train.log_every=10 --set optim.warmup=5 --set train.threads=2)
"$tz" train inputs/llama/finetune.cfg "${common[@]}" --set run.dir="$work/lora-dense" > "$work/ld.log" 2>&1 || bad "dense LoRA run"
"$tz" train inputs/llama/finetune.cfg "${common[@]}" --set run.dir="$work/lora-tq2" --set model.path="$work/turboquant2" > "$work/l2.log" 2>&1 ||
  bad "2-bit LoRA run"
losses() { grep -o '"eval_loss": [0-9.]*' "$1/metrics.jsonl" | awk '{print $2}'; }
d0=$(losses "$work/lora-dense" | head -1) d1=$(losses "$work/lora-dense" | tail -1)
q0=$(losses "$work/lora-tq2" | head -1) q1=$(losses "$work/lora-tq2" | tail -1)
echo "     LoRA on KJV, 40 steps: dense base $d0 -> $d1, 2-bit TurboQuant base $q0 -> $q1"
if [ -n "$q1" ] && [ -n "$d1" ] && awk -v d0="$d0" -v d1="$d1" -v q0="$q0" -v q1="$q1" -v r=$RECOVERY \
     'BEGIN {exit !(q0 - d0 > 0.05 && q1 - d1 <= r * (q0 - d0))}'; then
  ok "LoRA on the 2-bit base: gap $(awk -v a="$q0" -v b="$d0" 'BEGIN {print a - b}') -> $(awk -v a="$q1" -v b="$d1" 'BEGIN {print a - b}'), at most $RECOVERY of it left"
else
  bad "LoRA on the 2-bit base: gap $q0 - $d0 -> $q1 - $d1 (at most $RECOVERY of it may remain)"
fi
echo "quant quality: $pass passed, $fail failed"
[ $fail -eq 0 ]

#!/usr/bin/env bash
# Quality of quantized base weights on the bundled model, in its own domain (the KJV
# validation text it was pretrained for): validation loss of the dense model and of
# TurboQuant and the absmax baseline at 4, 3 and 2 bits, group 128 (group 64 where 128 does
# not divide a row). Requires, at every b: TurboQuant's loss increase over dense smaller than
# absmax's, and its total weight error smaller; both methods degrade monotonically with fewer
# bits. Needs the KJV text: inputs/data/kjv.val.tok (inputs/data/make_data.sh), or the
# `bible` program (Debian bible-kjv) to make it here; exits 77 (skipped) with neither.
# usage: quant_quality.sh TURBOZERO SOURCE_DIR
set -u
tz=$1 src=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/tzqual.XXXXXX")
trap 'rm -rf "$work"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok   $*"; }
bad() { fail=$((fail + 1)); echo "FAIL $*"; }
cd "$src"
val=inputs/data/kjv.val.tok
if [ ! -s "$val" ]; then
  if ! command -v bible > /dev/null; then
    echo "SKIP: no $val and no bible program (apt-get install bible-kjv, or run inputs/data/make_data.sh)"
    exit 77
  fi
  bible -l0 "gen1:1-rev22:21" > "$work/kjv.txt" &&   # as inputs/data/make_data.sh does
    "$tz" prep text --tokenizer bytes --in "$work/kjv.txt" --out "$work/kjv.tok" \
      --val-fraction 0.02 --val-out "$work/kjv.val.tok" > /dev/null || { echo "FAIL making KJV data"; exit 1; }
  val=$work/kjv.val.tok
fi
ev() { "$tz" eval inputs/llama/finetune.cfg --set data.val="$val" --set data.seq_len=256 \
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
echo "quant quality: $pass passed, $fail failed"
[ $fail -eq 0 ]

#!/usr/bin/env bash
# lora.init = "loftq" and "loftq_calibrated" on the bundled model at 3 bits, in its own domain
# (KJV), with LoRA rank 64 (alpha 128): LoRA from the dense base, from the plain 3-bit
# TurboQuant base, from the loftq base and from loftq_calibrated's, 40 steps of 8 x 128 tokens
# at lr 5e-4 (docs/benchmarks.md, "LoftQ init": at the fine-tuning recipe's 2e-3 the
# optimizer's noise over 40 steps swamps either start), validation on the first 256 windows of
# 128 tokens. gap = loss - the dense run's at the same step; the plain base's gap at step 0 is
# the quantization's. Requires, against the measured figures (2026-11-26, cpu-2c-epyc):
#   loftq's gap at step 0 <= START x the plain gap                   (measured 0.17)
#   loftq's share of the plain gap closed at the end >= RECOVERY      (measured 0.77)
#   loftq's final loss below the default init's final loss (measured 1.0862 vs 1.0939)
#   loftq_calibrated's gap at step 0 <= CAL_START x loftq's           (measured 0.19)
#   and its output error on the calibration inputs >= CAL_RATIO x below its base's (12.3)
#   loftq_calibrated's share of the plain gap closed at the end >= CAL_RECOVERY (measured
#   0.915: the issue's aim at 3 bits is 0.85; 300 steps of the study close 0.94)
# Needs the KJV text: inputs/data/kjv.tok and kjv.val.tok (inputs/data/make_data.sh), or the
# `bible` program (Debian bible-kjv) to make them here; exits 77 (skipped) with neither.
# usage: loftq_quality.sh TURBOZERO SOURCE_DIR
set -u
tz=$1 src=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/tzloftqq.XXXXXX")
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/../lib.sh"
cd "$src"
START=0.35 RECOVERY=0.6 CAL_START=0.5 CAL_RATIO=6 CAL_RECOVERY=0.85
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
common=(--set data.train="$train" --set data.val="$val" --set data.seq_len=128 --set train.steps=40
        --set train.micro_batch=8 --set train.eval_every=0 --set train.eval_windows=256
        --set train.log_every=10 --set optim.warmup=5 --set optim.lr=5e-4 --set train.threads=2
        --set lora.rank=64 --set lora.alpha=128)
for v in "dense" "plain --set quant.bits=3" "loftq --set quant.bits=3 --set lora.init=loftq" \
         "lcal --set quant.bits=3 --set lora.init=loftq_calibrated"; do
  set -- $v
  name=$1; shift
  "$tz" train inputs/llama/finetune.cfg "${common[@]}" --set run.dir="$work/$name" "$@" > "$work/$name.log" 2>&1 ||
    { bad "$name run failed"; tail -3 "$work/$name.log"; }
done
ev() { grep -o '"eval_loss": [0-9.]*' "$work/$1/metrics.jsonl" 2> /dev/null | awk '{print $2}' | sed -n "$2p"; }
d0=$(ev dense 1) d1=$(ev dense 2) p0=$(ev plain 1) p1=$(ev plain 2) l0=$(ev loftq 1) l1=$(ev loftq 2)
echo "     KJV validation loss, step 0 -> 40: dense $d0 -> $d1, 3-bit $p0 -> $p1, 3-bit loftq $l0 -> $l1"
grep -o "lora.init = loftq: .*" "$work/loftq.log" | sed 's/^/     /'
if [ -z "$l1" ] || [ -z "$p1" ] || [ -z "$d1" ]; then
  bad "missing evaluations"
  finish loftq_quality
  exit
fi
gap=$(awk -v a="$p0" -v b="$d0" 'BEGIN {print a - b}')
awk -v l="$l0" -v d="$d0" -v g="$gap" -v s=$START 'BEGIN {exit !(g > 0.01 && l - d <= s * g)}' &&
  ok "step 0: loftq's gap $(awk -v a="$l0" -v b="$d0" 'BEGIN {print a - b}') <= $START x the plain base's $gap" ||
  bad "step 0: loftq's gap $l0 - $d0 against the plain base's $gap (at most $START of it)"
rec=$(awk -v l="$l1" -v d="$d1" -v g="$gap" 'BEGIN {printf "%.3f", 1 - (l - d) / g}')
recp=$(awk -v l="$p1" -v d="$d1" -v g="$gap" 'BEGIN {printf "%.3f", 1 - (l - d) / g}')
awk -v r="$rec" -v m=$RECOVERY 'BEGIN {exit !(r >= m)}' &&
  ok "after 40 steps loftq has closed $rec of the 3-bit gap (at least $RECOVERY; the default init $recp)" ||
  bad "after 40 steps loftq has closed $rec of the 3-bit gap, less than $RECOVERY (default init: $recp)"
awk -v l="$l1" -v p="$p1" 'BEGIN {exit !(l < p)}' &&
  ok "loftq ends below the default init: $l1 < $p1" || bad "loftq ends at $l1, the default init at $p1"
# loftq_calibrated: the same base, the adapters refitted on the inputs of 32 training windows
c0=$(ev lcal 1) c1=$(ev lcal 2)
line=$(grep -o "lora.init = calibrated: .*" "$work/lcal.log")
echo "     3-bit loftq_calibrated $c0 -> $c1; $line"
ratio=$(echo "$line" | sed -n 's/.*(\([0-9.]*\)x).*/\1/p')
awk -v c="$c0" -v l="$l0" -v d="$d0" -v f=$CAL_START 'BEGIN {exit !(c != "" && c - d <= f * (l - d))}' &&
  awk -v r="$ratio" -v m=$CAL_RATIO 'BEGIN {exit !(r != "" && r >= m)}' &&
  ok "step 0: loftq_calibrated's gap $(awk -v a="$c0" -v b="$d0" 'BEGIN {print a - b}') <= $CAL_START x loftq's; its output error ${ratio}x below its base's (at least $CAL_RATIO)" ||
  bad "loftq_calibrated: step 0 $c0 (loftq $l0, dense $d0), output error ratio '$ratio'"
crec=$(awk -v l="$c1" -v d="$d1" -v g="$gap" 'BEGIN {if (l == "") print "none"; else printf "%.3f", 1 - (l - d) / g}')
awk -v r="$crec" -v m=$CAL_RECOVERY 'BEGIN {exit !(r != "none" && r >= m)}' &&
  ok "after 40 steps loftq_calibrated has closed $crec of the 3-bit gap (at least $CAL_RECOVERY)" ||
  bad "after 40 steps loftq_calibrated has closed $crec of the 3-bit gap, less than $CAL_RECOVERY"
# its adapter on its base, made again from what adapter_config.json records (lora_init loftq)
e=$("$tz" eval inputs/llama/finetune.cfg "${common[@]}" --set quant.bits=3 \
      --set model.adapter="$work/lcal/adapter" 2>&1 | tail -1 | sed -n 's/^eval_loss=\([0-9.]*\) .*/\1/p')
awk -v a="$e" -v b="$c1" 'BEGIN {d = a - b; exit !(a != "" && d < 1e-5 && d > -1e-5)}' &&
  ok "eval of the loftq_calibrated adapter (lora.init left at default) reproduces $c1" ||
  bad "eval of the loftq_calibrated adapter: $e vs $c1"
finish loftq_quality

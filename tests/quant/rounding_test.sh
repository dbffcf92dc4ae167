#!/usr/bin/env bash
# Full fine-tuning of a 3-bit TurboQuant base with quant.count_changes (optim/zero_weights.c):
#  - nearest re-quantization: every step after the first logs codes_changed, a small share (0 < x < 5%);
#  - stochastic (quant.rounding): each step redraws every code between its two centroids, so
#    it changes a larger share (more than 5x nearest's), the run still trains (validation
#    loss down), and the same seed gives the same model byte for byte.
# usage: rounding_test.sh TURBOZERO SOURCE_DIR
set -u
tz=$1 src=$2
cd "$src"
source tests/lib.sh
work=$(mktemp -d "${TMPDIR:-/tmp}/tzround.XXXXXX")
trap 'rm -rf "$work"' EXIT
c=(inputs/llama/finetune.cfg --set train.mode=full --set quant.bits=3 --set optim.lr=5e-4
   --set train.steps=6 --set train.micro_batch=4 --set data.seq_len=64 --set train.eval_every=0
   --set train.eval_windows=16 --set quant.count_changes=true --set run.overwrite=true)
for r in nearest stochastic stochastic2; do
  "$tz" train "${c[@]}" --set quant.rounding=${r%2} --set run.dir="$work/$r" > "$work/$r.log" 2>&1 ||
    { bad "$r: the run failed"; tail -3 "$work/$r.log"; }
done
read -r near sto trained < <(/usr/bin/python3 - "$work" <<'PY'
import json, sys
def rec(d):
    return [json.loads(l) for l in open(f"{sys.argv[1]}/{d}/metrics.jsonl")]
def changed(d):
    v = [r["codes_changed"] for r in rec(d) if "codes_changed" in r]
    assert len(v) == 5, v  # steps 2..6: the first has no earlier codes to compare
    return sum(v) / len(v)
ev = [r["eval_loss"] for r in rec("stochastic") if "eval_loss" in r]
print(changed("nearest"), changed("stochastic"), int(ev[-1] < ev[0]))
PY
)
awk -v n="${near:-0}" 'BEGIN { exit !(n > 0 && n < 0.05) }' &&
  ok "nearest: codes_changed logged at steps 2-6, mean share $near" || bad "nearest: codes_changed $near"
awk -v n="${near:-0}" -v s="${sto:-0}" 'BEGIN { exit !(s > 5 * n) }' && [ "${trained:-0}" = 1 ] &&
  ok "stochastic: mean share $sto (more than 5x nearest's), validation loss down" ||
  bad "stochastic: share $sto against nearest's $near, trained ${trained:-?}"
cmp -s "$work/stochastic/model/model.safetensors" "$work/stochastic2/model/model.safetensors" &&
  ok "stochastic: the same seed, the same model byte for byte" || bad "stochastic: two runs differ"
finish rounding

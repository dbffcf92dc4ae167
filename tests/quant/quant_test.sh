#!/usr/bin/env bash
# End-to-end checks of quantized base weights with the real binary (tests/quant_llama.cmake):
#  1. `quantize` at 4 bits, group 128: one table row per projection with the bits per weight
#     stored and a relative error near turboquant.md's 0.0091;
#  2. the quantized folder, quantize-at-load (quant.bits) and `export --dequantize` evaluate
#     alike: the first two bit for bit, the F32 export to float rounding; same for absmax;
#  3. LoRA on the 4-bit base with the CI recipe of tests/train/train_test.sh ends within
#     LORA_MARGIN of the fine-tuning gain of LoRA on the dense base; eval with its adapter on
#     the quantized base reproduces its final validation loss;
#  4. full fine-tuning of the quantized weights reaches nearly the dense run's gain, saves
#     a quantized model that eval and export read back, and starts from a quantized folder;
#  5. errors: conflicting quant.*, re-quantizing, a malformed file (bits 5) stop with a message.
# The quality table (TurboQuant vs absmax at 2-4 bits, in-domain) is quant_quality.sh.
# usage: quant_test.sh TURBOZERO SOURCE_DIR
set -u
tz=$1 src=$2
# LoRA on the 4-bit base must end at most this fraction of the dense run's gain (validation
# loss before - after) above the dense run. Measured (2026-11-22): dense base 3.6119 -> 2.4978
# (gain 1.114), 4-bit base 3.6011 -> 2.4933: 0.0045 below the dense run (-0.4% of the gain).
# On the Jargon text the 4-bit base starts 0.011 *below* the dense one (the pretrained model
# is out of its domain there and quantization noise flattens its predictions), so there is no
# base gap to recover on this set; the in-domain damage is measured by quant_quality.sh.
LORA_MARGIN=0.01
work=$(mktemp -d "${TMPDIR:-/tmp}/tzquant.XXXXXX")
trap 'rm -rf "$work"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok   $*"; }
bad() { fail=$((fail + 1)); echo "FAIL $*"; }
cd "$src"
cfg=inputs/llama/finetune.cfg
ev() { "$tz" eval $cfg --set train.threads=2 "$@" 2>&1 | tail -1 | sed -n 's/^eval_loss=\([0-9.]*\) .*/\1/p'; }
close() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN {d = a - b; exit !(a != "" && b != "" && d <= t && d >= -t)}'; }

# 1. quantize
"$tz" quantize --model inputs/llama/model --bits 4 --group 128 --out "$work/tq4" > "$work/tq4.log" 2>&1 ||
  { bad "quantize failed"; cat "$work/tq4.log"; }
nrow=$(grep -c '_proj.weight ' "$work/tq4.log")
# fields: name, "[out," "in]", group, bits/w, rel.error, bytes, stored
badrow=$(awk '/_proj.weight / && !(($4 == 128 && $5 == "4.125") || ($4 == 64 && $5 == "4.250")) {n++}
              /_proj.weight / && !($6 > 0.0080 && $6 < 0.0100) {n++} END {print n + 0}' "$work/tq4.log")
if [ "$nrow" = 28 ] && [ "$badrow" = 0 ] && grep -q '^projections: 28 quantized' "$work/tq4.log" &&
   [ -s "$work/tq4/model.safetensors" ] && grep -q '"quant_method": "turboquant"' "$work/tq4/config.json"; then
  ok "quantize: 28 projections, 4.125 (group 128) or 4.25 (group 64) bits per weight, relative errors in (0.008, 0.010)"
else
  bad "quantize: $nrow rows, $badrow outside expectations"; cat "$work/tq4.log"
fi

# 2. three ways to the same model
dense=$(ev) file=$(ev --set model.path="$work/tq4") load=$(ev --set quant.bits=4)
"$tz" export --model "$work/tq4" --dequantize --out "$work/tq4-f32" > "$work/export.log" 2>&1
f32=$(ev --set model.path="$work/tq4-f32")
echo "     Jargon validation loss: dense $dense, 4-bit folder $file, 4-bit at load $load, F32 export $f32"
[ -n "$file" ] && [ "$file" = "$load" ] && ok "quantized folder = quantize-at-load ($file)" ||
  bad "quantized folder $file vs quantize-at-load $load"
close "$f32" "$file" 2e-5 && grep -q '"torch_dtype": "float32"' "$work/tq4-f32/config.json" &&
  ! grep -q quantization_config "$work/tq4-f32/config.json" &&
  ok "export --dequantize: F32 HF layout, same loss to float rounding ($f32)" || bad "export: $f32 vs $file"
"$tz" quantize --model inputs/llama/model --bits 3 --method absmax --out "$work/am3" > /dev/null 2>&1
afile=$(ev --set model.path="$work/am3") aload=$(ev --set quant.bits=3 --set quant.method=absmax)
[ -n "$afile" ] && [ "$afile" = "$aload" ] && ok "absmax 3-bit: folder = at load ($afile)" ||
  bad "absmax folder $afile vs at load $aload"

# 3. LoRA on the 4-bit base vs the dense base, the CI recipe of train_test.sh
common=(--set data.seq_len=128 --set train.steps=40 --set train.micro_batch=8
        --set train.eval_every=0 --set train.eval_windows=0 --set train.log_every=10
        --set optim.warmup=5 --set train.threads=2)
"$tz" train $cfg "${common[@]}" --set run.dir="$work/lora-dense" > "$work/lora-dense.log" 2>&1 || bad "dense LoRA run failed"
"$tz" train $cfg "${common[@]}" --set run.dir="$work/lora-q4" --set model.path="$work/tq4" > "$work/lora-q4.log" 2>&1 ||
  { bad "4-bit LoRA run failed"; tail -40 "$work/lora-q4.log"; } # (a crash's whole backtrace)
losses() { grep -o '"eval_loss": [0-9.]*' "$1/metrics.jsonl" | awk '{print $2}'; }
d0=$(losses "$work/lora-dense" | head -1) d1=$(losses "$work/lora-dense" | tail -1)
q0=$(losses "$work/lora-q4" | head -1) q1=$(losses "$work/lora-q4" | tail -1)
echo "     LoRA, 40 steps: dense base $d0 -> $d1, 4-bit base $q0 -> $q1 (margin $LORA_MARGIN of the gain)"
if [ -n "$q1" ] && awk -v d0="$d0" -v d1="$d1" -v q1="$q1" -v m=$LORA_MARGIN \
     'BEGIN {exit !(d0 - d1 > 0.75 && q1 - d1 <= m * (d0 - d1))}'; then
  ok "LoRA on the 4-bit base: $q1, within $LORA_MARGIN of the dense run's gain of its final $d1"
else
  bad "LoRA on the 4-bit base: $q1 vs dense $d1 (dense gain $d0 -> $d1)"
fi
grep -q "base: 28 of 28 projections quantized (turboquant, 4 bits" "$work/lora-q4.log" &&
  ok "the training log states the quantized base" || bad "training log lacks the base line"
e=$(ev --set data.seq_len=128 --set model.path="$work/tq4" --set model.adapter="$work/lora-q4/adapter")
close "$e" "$q1" 1e-5 && ok "eval of the adapter on the quantized base reproduces $q1" || bad "eval with adapter: $e vs $q1"

# 4. full fine-tuning of the quantized weights (the same 40-step recipe, full mode, lr 5e-4):
# the share of the dense full run's validation gain reached from the same dense start,
# (dense before - quantized after) / (dense before - dense after), at least FULL4 at 4 bits
# and FULL3 at 3 bits. Measured (2026-11-23): dense 3.6119 -> 2.3296, 4 bits -> 2.3305
# (99.9%), 3 bits -> 2.3383 (99.3%), 2 bits -> 2.3352 (99.5%; out of its domain the base
# loses little to quantization, see quant_quality.sh for in-domain figures).
FULL4=0.90 FULL3=0.75
full=("${common[@]}" --set train.mode=full --set optim.lr=5e-4)
for b in 0 4 3; do
  "$tz" train $cfg "${full[@]}" --set quant.bits=$b --set run.dir="$work/full$b" > "$work/full$b.log" 2>&1 ||
    { bad "full fine-tuning at quant.bits=$b failed"; tail -5 "$work/full$b.log"; }
done
f0=$(losses "$work/full0" | head -1) f1=$(losses "$work/full0" | tail -1)
for b in 4 3; do
  fb=$(losses "$work/full$b" | tail -1) want=$([ $b = 4 ] && echo $FULL4 || echo $FULL3)
  share=$(awk -v a="$f0" -v d="$f1" -v q="$fb" 'BEGIN {if (a - d > 0.5 && q != "") printf "%.4f", (a - q) / (a - d)}')
  if [ -n "$share" ] && awk -v s="$share" -v w=$want 'BEGIN {exit !(s >= w)}'; then
    ok "full fine-tuning on a $b-bit base: $f0 -> $fb, $share of the dense run's gain ($f0 -> $f1; at least $want)"
  else
    bad "full fine-tuning on a $b-bit base: $f0 -> $fb vs dense $f0 -> $f1 (share '$share', at least $want)"
  fi
done
# memory per rank, as the backend's allocator counts it: the parts add up, and the 4-bit
# model's weights (codes + scales + the dense embeddings and norms) are a fraction of dense
mem() { grep -o 'memory per rank: .*' "$1" | head -1; }
m4=$(mem "$work/full4.log") m0=$(mem "$work/full0.log")
if echo "$m4" | awk -v d="$(echo "$m0" | sed -n 's/.* weights \([0-9.]*\) .*/\1/p')" '{
     t = $6; w = $10; q = $14 + 0; g = $19; s = $22; a = $25
     exit !(index($0, "other") == 0 && t - (w + g + s + a) < 0.015 && t - (w + g + s + a) > -0.015 &&
            q > 0 && d > 0 && w < 0.25 * d) }'; then
  ok "memory: $m4 (dense: $(echo "$m0" | sed -n 's/.* = \(weights [0-9.]*\) .*/\1/p') MiB)"
else
  bad "memory lines: [$m4] vs dense [$m0]"
fi
grep -q '"quant_method": "turboquant"' "$work/full4/model/config.json" 2>/dev/null &&
  grep -q 'q_proj.weight.tq_codes' "$work/full4/model/model.safetensors" &&
  ok "the fine-tuned 4-bit model is saved in the quantized layout" || bad "full4/model is not quantized"
e=$(ev --set data.seq_len=128 --set model.path="$work/full4/model")
close "$e" "$(losses "$work/full4" | tail -1)" 1e-5 && ok "eval of the saved 4-bit model reproduces its final loss ($e)" ||
  bad "eval of full4/model: $e vs $(losses "$work/full4" | tail -1)"
"$tz" export --model "$work/full4/model" --dequantize --out "$work/full4-f32" > /dev/null 2>&1
e32=$(ev --set data.seq_len=128 --set model.path="$work/full4-f32")
close "$e32" "$e" 2e-5 && ok "export --dequantize of it: the same loss to float rounding ($e32)" || bad "export: $e32 vs $e"
# from a quantized folder the master starts at the decoded weights. It learns more slowly
# (measured 3.6011 -> 2.5431 in these 40 steps, vs 2.3305 from the dense source): a decoded
# master sits exactly on the codebook's centroids, half a bin from every decision boundary,
# so updates change no code until they have moved that far; a dense master lies anywhere.
"$tz" train $cfg "${full[@]}" --set model.path="$work/tq4" --set run.dir="$work/fullf" > "$work/fullf.log" 2>&1 ||
  bad "full fine-tuning of a quantized folder failed"
g0=$(losses "$work/fullf" | head -1) g1=$(losses "$work/fullf" | tail -1)
awk -v a="$g0" -v b="$g1" 'BEGIN {exit !(a != "" && a - b > 0.75)}' &&
  ok "full fine-tuning of the quantized folder (master from the decoded weights): $g0 -> $g1" ||
  bad "full fine-tuning of the quantized folder: $g0 -> $g1"

# 5. errors
expect_error() { # name, expected text, command...
  local name=$1 want=$2; shift 2
  if "$@" > "$work/err.log" 2>&1; then bad "$name: succeeded"; return; fi
  grep -qF -- "$want" "$work/err.log" && ok "$name" || { bad "$name: message lacks '$want'"; cat "$work/err.log"; }
}
expect_error "quant.* against a quantized folder" "is already quantized (turboquant, 4 bits, group 128)" \
  "$tz" eval $cfg --set model.path="$work/tq4" --set quant.bits=3
expect_error "quantizing a quantized folder" "is already quantized" \
  "$tz" quantize --model "$work/tq4" --bits 2 --out "$work/e3"
expect_error "quant.group not a power of two" "quant.group=96: expected a power of two in 64..256" \
  "$tz" eval $cfg --set quant.group=96
cp -r "$work/tq4" "$work/bad"
# the metadata JSON sits as an escaped string in the header: \"bits\":4,\"group\":64
perl -0777 -pi -e 's/\\"bits\\":4,\\"group\\":64/\\"bits\\":5,\\"group\\":64/' "$work/bad/model.safetensors"
expect_error "malformed quantized file" "bad/model.safetensors: __metadata__ \"turbozero_quant\": tensor model.layers.0.mlp.gate_proj.weight: bits 5 out of range (1..4)" \
  "$tz" eval $cfg --set model.path="$work/bad"

# existing outputs: refused unless --force; the input never written over, even with --force
expect_error "quantize into an existing folder" "--out $work/tq4 already exists (a folder that is not empty)" \
  "$tz" quantize --model inputs/llama/model --bits 4 --out "$work/tq4"
expect_error "export into an existing file" "already exists (a file)" \
  "$tz" export --model "$work/tq4" --dequantize --out "$work/tq4.log"
expect_error "quantize over its own input" "turbozero never writes over its input" \
  "$tz" quantize --model "$work/tq4-f32" --bits 4 --out "$work/tq4-f32/." --force
expect_error "export into its own input" "turbozero never writes over its input" \
  "$tz" export --model "$work/tq4" --dequantize --out "$work/tq4/sub" --force
ln -s "$work/tq4" "$work/tq4-link"
expect_error "export over its input through a link" "turbozero never writes over its input" \
  "$tz" export --model "$work/tq4" --dequantize --out "$work/tq4-link" --force
expect_error "init-model into an existing folder" "already exists (a folder that is not empty)" \
  "$tz" init-model --arch llama --preset tiny --vocab 256 --out "$work/tq4-f32"
"$tz" export --model "$work/tq4" --dequantize --out "$work/tq4-f32" --force > /dev/null 2>&1 &&
  ok "export --force writes over an existing output folder" || bad "export --force failed"

# non-finite values: refused at load (file and tensor named), by quantize, eval and export
poison() { # folder, tensor-name substring, value bytes (hex) written over its first element
  /usr/bin/python3 - "$1/model.safetensors" "$2" "$3" <<'PY'
import json, struct, sys
p, part, val = sys.argv[1], sys.argv[2], bytes.fromhex(sys.argv[3])
b = bytearray(open(p, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
k = sorted(k for k in h if k != "__metadata__" and part in k)[0]
o = 8 + n + h[k]["data_offsets"][0]
b[o:o + len(val)] = val
open(p, "wb").write(b)
print(k)
PY
}
cp -r inputs/llama/model "$work/nan"
nt=$(poison "$work/nan" layers.0.self_attn.q_proj.weight c07f) # BF16 NaN
expect_error "quantize of a NaN model" "nan/model.safetensors: tensor '$nt': element 0 is NaN" \
  "$tz" quantize --model "$work/nan" --bits 4 --out "$work/nanq"
expect_error "eval of a NaN model" "tensor '$nt': element 0 is NaN" \
  "$tz" eval $cfg --set model.path="$work/nan"
cp -r "$work/tq4" "$work/infs"
st=$(poison "$work/infs" layers.1.mlp.up_proj.weight.tq_scales 807f) # BF16 +Inf
expect_error "eval with an Inf scale" "tensor '$st': scale 0 is Inf" \
  "$tz" eval $cfg --set model.path="$work/infs"
expect_error "export with an Inf scale" "tensor '$st': scale 0 is Inf" \
  "$tz" export --model "$work/infs" --dequantize --out "$work/infs-f32"

echo "quant: $pass passed, $fail failed"
[ $fail -eq 0 ]

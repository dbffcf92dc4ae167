#!/usr/bin/env bash
# generate and export --merge with the real binary on the bundled byte-level model:
#  1. greedy generation is deterministic, and so is sampling with a seed; a top-p that
#     keeps one token is greedy;
#  2. a fine-tuned adapter changes the greedy continuation of a prompt from its data;
#  3. export --merge (F32) gives the eval_loss of base + adapter (to 1e-5), BF16 within
#     bf16 rounding, and a 4-bit quantized base + adapter merges (dequantized) to the same
#     eval_loss as the quantized base + adapter; a DiT merges as well;
#  4. refusals: an existing --out, --merge without --adapter, a model without a tokenizer.
# (Greedy generation with the cache equals the forward pass's argmax continuation:
# tests/unit/test_llama_generate.c.)
# usage: generate_test.sh TURBOZERO SOURCE_DIR
set -u
tz=$1 src=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/tzgen.XXXXXX")
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/../lib.sh"
cd "$src"
cfg=inputs/llama/finetune.cfg
prompt=":hacker: n. [Usenet] "

"$tz" train $cfg --set data.seq_len=64 --set train.steps=8 --set train.micro_batch=4 \
  --set train.eval_every=0 --set train.eval_windows=0 --set optim.warmup=2 --set optim.lr=1e-2 \
  --set train.threads=2 --set run.dir="$work/a" > "$work/train.log" 2>&1 || { bad "LoRA run failed"; tail -20 "$work/train.log"; }
ad="$work/a/adapter"

gen() { "$tz" generate $cfg --prompt "$prompt" --max-new 40 "$@" 2> "$work/gen.err"; }
g1=$(gen) && g2=$(gen) && [ -n "$g1" ] && [ "$g1" == "$g2" ] &&
  ok "greedy generation is deterministic: '${g1//$'\n'/\\n}'" || { bad "greedy runs differ or failed"; cat "$work/gen.err"; }
s1=$(gen --temperature 0.9 --top-p 0.9 --seed 5) && s2=$(gen --temperature 0.9 --top-p 0.9 --seed 5) &&
  [ "$s1" == "$s2" ] && ok "sampling with a seed is reproducible" || bad "sampling with one seed differs"
t1=$(gen --temperature 1 --top-p 1e-6 --seed 9) && [ "$t1" == "$g1" ] &&
  ok "top-p small enough to keep one token is greedy" || bad "top-p 1e-6: '$t1', greedy: '$g1'"
ga=$(gen --set model.adapter="$ad") && [ -n "$ga" ] && [ "$ga" != "$g1" ] &&
  ok "the fine-tuned adapter changes the continuation: '${ga//$'\n'/\\n}'" ||
  { bad "with the adapter: '$ga', without: '$g1'"; cat "$work/gen.err"; }

evl() { "$tz" eval $cfg --set data.seq_len=128 "$@" 2>&1 | tail -1 | sed -n 's/^eval_loss=\([0-9.]*\) .*/\1/p'; }
close() { awk -v x="$1" -v y="$2" -v t="$3" 'BEGIN {d = x - y; exit !(x != "" && d < t && d > -t)}'; }
ref=$(evl --set model.adapter="$ad")
"$tz" export --model inputs/llama/model --adapter "$ad" --merge --out "$work/m32" > /dev/null &&
  m32=$(evl --set model.path="$work/m32") && close "$m32" "$ref" 1e-5 &&
  ok "merged F32 folder: eval_loss $m32 = base + adapter $ref" || bad "merged F32: eval_loss '$m32', base + adapter '$ref'"
# bf16 rounds every weight by up to 2^-9 relative; the loss moved by 1e-5 to 2e-4 here
"$tz" export --model inputs/llama/model --adapter "$ad" --merge --dtype bf16 --out "$work/m16" > /dev/null &&
  m16=$(evl --set model.path="$work/m16") && close "$m16" "$ref" 2e-3 &&
  grep -q '"torch_dtype": "bfloat16"' "$work/m16/config.json" &&
  ok "merged BF16 folder: eval_loss $m16 within bf16 rounding of $ref" || bad "merged BF16: eval_loss '$m16', base + adapter '$ref'"
"$tz" quantize --model inputs/llama/model --bits 4 --group 64 --out "$work/q4" > /dev/null &&
  qref=$(evl --set model.path="$work/q4" --set model.adapter="$ad") &&
  "$tz" export --model "$work/q4" --adapter "$ad" --merge --out "$work/mq" > /dev/null 2>&1 &&
  mq=$(evl --set model.path="$work/mq") && close "$mq" "$qref" 1e-5 &&
  ! grep -q quantization_config "$work/mq/config.json" &&
  ok "merged 4-bit base: dense eval_loss $mq = quantized base + adapter $qref" ||
  bad "merged 4-bit base: eval_loss '$mq', quantized base + adapter '$qref'"

# a DiT: a few LoRA steps, merged, evaluated (the data is the bundled config's Fashion-MNIST)
if [ -r /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz ]; then
  dcfg=inputs/dit/finetune.cfg
  "$tz" train $dcfg --set train.steps=4 --set train.micro_batch=16 --set train.eval_every=0 \
    --set train.eval_windows=64 --set train.threads=2 --set optim.warmup=1 --set run.dir="$work/dit" \
    > "$work/dit.log" 2>&1 || { bad "DiT LoRA run failed"; tail -5 "$work/dit.log"; }
  devl() { "$tz" eval $dcfg "$@" 2>&1 | tail -1 | sed -n 's/^eval_loss=\([0-9.]*\) .*/\1/p'; }
  dref=$(devl --set model.adapter="$work/dit/adapter")
  "$tz" export --model inputs/dit/model --adapter "$work/dit/adapter" --merge --out "$work/ditm" > /dev/null &&
    dm=$(devl --set model.path="$work/ditm") && close "$dm" "$dref" 1e-5 &&
    ok "merged DiT folder: eval_loss $dm = base + adapter $dref" || bad "merged DiT: eval_loss '$dm', base + adapter '$dref'"
else
  echo "skip the DiT merge: no Fashion-MNIST in /usr/share/datasets"
fi

out=$("$tz" export --model inputs/llama/model --adapter "$ad" --merge --out "$work/m32" 2>&1) &&
  bad "export over an existing folder was not refused" ||
  { grep -q "already exists" <<< "$out" && ok "export --merge refuses an existing --out"; } || bad "wrong refusal: $out"
out=$("$tz" export --model inputs/llama/model --merge --out "$work/x" 2>&1) &&
  bad "--merge without --adapter was not refused" ||
  { grep -q "needs --adapter" <<< "$out" && ok "--merge without --adapter is refused"; } || bad "wrong refusal: $out"
"$tz" init-model --arch llama --preset tiny --vocab 97 --out "$work/v97" > /dev/null
out=$("$tz" generate $cfg --set model.path="$work/v97" --prompt hi 2>&1) &&
  bad "a model without a tokenizer was not refused" ||
  { grep -q "tokenizer.json" <<< "$out" && ok "generate names the missing tokenizer.json"; } || bad "wrong refusal: $out"
finish generate

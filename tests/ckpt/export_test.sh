#!/usr/bin/env bash
# Exporting a checkpoint and keeping the best one (docs/guide.md, "Exporting a checkpoint"
# and "Keeping the best checkpoint"), on the tiny Llama of the ZeRO test:
#  1. `export run/checkpoints/step-4` of a 6-step LoRA run and of a 6-step full run (written
#     by 2 ranks, exported by 1): with a constant learning rate after the warm-up
#     (optim.min_lr_ratio = 1) the first 4 steps of a 6-step run are those of a 4-step run,
#     so the export equals that run's final adapter or model byte for byte; and `eval` of
#     the exported adapter gives the validation loss the 6-step run recorded at step 4.
#  2. a refused export: a damaged checkpoint, an --out that exists without --force.
#  3. train.keep_best with keep_checkpoints = 1: checkpoints/best links to the checkpoint of
#     the best evaluation, which survives the pruning, and run.dir/best/adapter holds its
#     weights (the export of that checkpoint, byte for byte; the final adapter when the last
#     evaluation was the best).
# usage: export_test.sh TURBOZERO SOURCE_DIR MPIEXEC
set -u
tz=$1 src=$2 mpiexec=$3
py=/usr/bin/python3
source "$(dirname "$0")/common.sh"
ckpt_setup tzexport 6   # then its own run.cfg:
cat > "$work/run.cfg" <<CFG
model = { path = "$work/model"; };
data = { train = "$work/t97.tok"; val = "$work/t97.tok"; seq_len = 32; };
train = { steps = 6; micro_batch = 6; grad_accum = 1; threads = 1; log_every = 6;
          checkpoint_every = 2; keep_checkpoints = 0; eval_every = 2; eval_windows = 8; };
optim = { lr = 3e-3; warmup = 2; min_lr_ratio = 1.0; weight_decay = 0.1; };
lora = { rank = 3; alpha = 6.0; targets = ["q", "v", "down"]; };
CFG
# train N DIR [args...]: N ranks, 12 rows per step whatever N
train() {
  local n=$1 dir=$2; shift 2
  timeout 300 "$mpiexec" -np $n "$tz" train "$work/run.cfg" --set train.micro_batch=$((12 / n)) \
    --set run.dir="$dir" "$@" > "$dir.log" 2>&1
}
eval_at() { # the eval_loss metrics.jsonl of $1 records at step $2
  $py -c 'import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if r.get("step") == int(sys.argv[2]) and "eval_loss" in r: print(r["eval_loss"])' "$1/metrics.jsonl" "$2"
}

# ---- 1. export step-4 against a 4-step run
for m in lora full; do
  [ $m = lora ] && f=adapter_model.safetensors || f=model.safetensors
  train 2 "$work/$m-6" --set train.mode=$m || { bad "$m: 6-step run failed"; tail -5 "$work/$m-6.log"; continue; }
  train 2 "$work/$m-4" --set train.mode=$m --set train.steps=4 || { bad "$m: 4-step run failed"; continue; }
  if "$tz" export "$work/$m-6/checkpoints/step-4" --out "$work/$m-x4" > "$work/$m-x.log" 2>&1; then
    if cmp -s "$work/$m-x4/$f" "$work/$m-4/$( [ $m = lora ] && echo adapter || echo model)/$f"; then
      ok "$m: export of step-4 (2 ranks, read by 1) = the 4-step run's final $f, byte for byte"
    else bad "$m: the export of step-4 differs from the 4-step run's $f"; fi
  else bad "$m: export failed"; tail -5 "$work/$m-x.log"; fi
done
if [ -d "$work/lora-x4" ]; then
  want=$(eval_at "$work/lora-6" 4)
  "$tz" eval "$work/run.cfg" --set model.adapter="$work/lora-x4" > "$work/eval.log" 2>&1
  got=$(sed -n 's/.*eval_loss=\([0-9.]*\).*/\1/p' "$work/eval.log")
  if [ -n "$got" ] && [ -n "$want" ] && $py -c 'import sys; sys.exit(0 if abs(float(sys.argv[1]) - float(sys.argv[2])) <= 1e-6 else 1)' "$got" "$want"; then
    ok "eval of the exported adapter: $got, the run's validation loss at step 4"
  else bad "eval of the exported adapter: '$got', the run recorded '$want' at step 4"; fi
fi

# ---- 2. refusals
if "$tz" export "$work/lora-6/checkpoints/step-4" --out "$work/lora-x4" > "$work/r1.log" 2>&1; then
  bad "export over an existing --out without --force"
elif grep -q "force" "$work/r1.log"; then ok "export refuses an existing --out without --force"
else bad "export refusal without --force"; tail -3 "$work/r1.log"; fi
cp -r "$work/lora-6/checkpoints/step-2" "$work/damaged-step-2"
printf 'x' | dd of="$work/damaged-step-2/rank-00000.h5" bs=1 seek=100 conv=notrunc 2> /dev/null
if "$tz" export "$work/damaged-step-2" --out "$work/x-dam" > "$work/r2.log" 2>&1; then
  bad "export of a damaged checkpoint"
elif grep -q "rank-00000.h5" "$work/r2.log" && [ ! -e "$work/x-dam" ]; then ok "a damaged checkpoint is refused, naming its shard"
else bad "damaged checkpoint: unclear refusal"; tail -3 "$work/r2.log"; fi

# ---- 3. train.keep_best, lr 0.1 on 1 rank: the evaluations (every 2 steps) fall to step 6,
# rise at 8, fall again at 10
best_run() { # DIR STEPS [args...]: the run, then its best_eval_step on stdout
  local d=$1 n=$2; shift 2
  train 1 "$d" --set train.keep_best=true --set train.keep_checkpoints=1 --set optim.lr=0.1 \
    --set train.steps=$n "$@" || { bad "keep_best run $d failed"; tail -5 "$d.log" >&2; }
  $py -c 'import json, sys
print([json.loads(l) for l in open(sys.argv[1])][-1]["best_eval_step"])' "$d/metrics.jsonl" 2> /dev/null
}
# 8 steps, no other checkpoints: best at 6, so best/adapter comes from checkpoint step-6
d="$work/best8" ck="$work/best8/checkpoints"
s=$(best_run "$d" 8 --set train.checkpoint_every=0)
if [ "$s" = 6 ] && [ "$(readlink "$ck/best")" = step-6 ] && [ -f "$ck/step-6/COMPLETE" ]; then
  ok "keep_best: best eval at step 6, checkpoints/best -> step-6"
else bad "keep_best: best eval at '$s', checkpoints/best '$(readlink "$ck/best")' ($(ls "$ck" | tr '\n' ' '))"; fi
"$tz" export "$ck/best" --out "$work/best8-x" > "$work/bx.log" 2>&1 &&
  cmp -s "$work/best8-x/adapter_model.safetensors" "$d/best/adapter/adapter_model.safetensors" &&
  ! cmp -s "$d/adapter/adapter_model.safetensors" "$d/best/adapter/adapter_model.safetensors" &&
  ok "keep_best: best/adapter = the export of checkpoints/best, not the final adapter" ||
  bad "keep_best: best/adapter of step 6"
# 10 steps, a checkpoint every 2 and only the newest kept: step-6 (best until the end) is
# kept beside step-8; the last evaluation is the best, so best/adapter = adapter
d="$work/best10" ck="$work/best10/checkpoints"
s=$(best_run "$d" 10 --set train.checkpoint_every=2)
if [ "$s" = 10 ] && [ "$(ls -d "$ck"/step-* | xargs -n1 basename | tr '\n' ' ')" = "step-6 step-8 " ] &&
   cmp -s "$d/best/adapter/adapter_model.safetensors" "$d/adapter/adapter_model.safetensors"; then
  ok "keep_best with keep_checkpoints = 1: step-6 kept beside the newest, step-8; best/ = final"
else bad "keep_best (10 steps): best '$s', checkpoints: $(ls "$ck" | tr '\n' ' ')"; fi
finish export_test

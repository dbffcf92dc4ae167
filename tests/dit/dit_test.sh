#!/usr/bin/env bash
# DiT end to end with the real binary, on Debian's Fashion-MNIST:
#  1. training a tiny random DiT (full) on a class subset lowers the diffusion validation
#     loss by more than MARGIN; a second run with the same seed gives identical losses and a
#     byte-identical model;
#  2. `turbozero eval` reproduces the final validation loss (fixed eval draws) and its last
#     line has the documented form;
#  3. LoRA fine-tuning of the bundled DiT (classes 0-4) on classes 5-9 lowers their loss, on
#     the dense base and on the base quantized at load (4 bits, group 64);
#  4. the bundled DiT's samples follow their class (tests/dit/class_means.py), and sampling
#     is deterministic for a seed (byte-identical PNGs);
#  5. a latent DiT (init-model --preset dit-tiny: 4x8x8 latents, learned sigma) trains on
#     latents in HDF5 (two class patterns) and samples to .h5, a PNG being refused;
#  6. bad image input stops with a message naming the key and file.
# usage: dit_test.sh TURBOZERO SOURCE_DIR
set -u
tz=$1 src=$2
fm=/usr/share/datasets/fashion-mnist
[ -f $fm/train-images-idx3-ubyte.gz ] || { echo "dataset-fashion-mnist is not installed" >&2; exit 1; }
py=/usr/bin/python3
MARGIN=0.2    # measured: 0.999 -> 0.64 after 40 steps of 32 images
work=$(mktemp -d "${TMPDIR:-/tmp}/tzdit.XXXXXX")
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/../lib.sh"
cd "$src"
data=(--set data.train=$fm/train-images-idx3-ubyte.gz --set data.train_labels=$fm/train-labels-idx1-ubyte.gz
      --set data.val=$fm/t10k-images-idx3-ubyte.gz --set data.val_labels=$fm/t10k-labels-idx1-ubyte.gz)
evals() { grep -o '"eval_loss": [0-9.]*' "$1/metrics.jsonl" | awk '{print $2}'; }

"$tz" init-model --arch dit --preset tiny --seed 3 --out "$work/init" > /dev/null || bad "init-model --arch dit"
for r in a b; do
  "$tz" train inputs/dit/pretrain.cfg --set model.path="$work/init" "${data[@]}" --set data.classes=0-4 \
    --set train.steps=40 --set train.micro_batch=32 --set train.eval_every=0 --set train.eval_windows=256 \
    --set optim.warmup=5 --set train.threads=2 --set run.dir="$work/$r" > "$work/$r.log" 2>&1 ||
    { bad "full run $r failed"; tail -5 "$work/$r.log"; }
done
before=$(evals "$work/a" | head -1) after=$(evals "$work/a" | tail -1)
echo "     validation loss before $before, after $after (margin $MARGIN)"
[ -n "$before" ] && awk -v b="$before" -v a="$after" -v m=$MARGIN 'BEGIN {exit !(a < b - m)}' &&
  ok "training a tiny DiT lowers the validation loss by more than $MARGIN" ||
  bad "DiT validation loss $before -> $after, expected a drop of more than $MARGIN"
same_run "$work/a" "$work/b" model/model.safetensors && ok "same seed: identical losses and model" ||
  bad "same seed: runs differ"

"$tz" eval inputs/dit/pretrain.cfg --set model.path="$work/a/model" "${data[@]}" --set data.classes=0-4 \
  --set train.micro_batch=32 > "$work/eval.log" 2>&1
last=$(tail -1 "$work/eval.log")
if [[ "$last" =~ ^eval_loss=([0-9.]+)\ images=([0-9]+)$ ]]; then
  full=${BASH_REMATCH[1]}
  "$tz" eval inputs/dit/pretrain.cfg --set model.path="$work/a/model" "${data[@]}" --set data.classes=0-4 \
    --set train.micro_batch=32 > "$work/eval2.log" 2>&1
  [ "$(tail -1 "$work/eval2.log")" = "$last" ] && ok "eval: '$last', the same twice (fixed draws)" ||
    bad "eval differs between two runs: '$last' vs '$(tail -1 "$work/eval2.log")'"
else
  bad "eval: last line is '$last'"; tail -5 "$work/eval.log"
fi

# LoRA on the bundled model: classes 5-9 were never seen in pretraining
"$tz" train inputs/dit/finetune.cfg "${data[@]}" --set train.steps=60 --set train.eval_every=0 \
  --set train.eval_windows=256 --set train.threads=2 --set run.dir="$work/lora" > "$work/lora.log" 2>&1 ||
  { bad "LoRA run failed"; tail -5 "$work/lora.log"; }
lb=$(evals "$work/lora" | head -1) la=$(evals "$work/lora" | tail -1)
# measured: 0.1015 -> 0.0880 after 60 steps of 64 images; required: a drop of more than 0.008
[ -n "$lb" ] && awk -v b="$lb" -v a="$la" 'BEGIN {exit !(a < b - 0.008)}' &&
  ok "LoRA on classes 5-9: validation loss $lb -> $la" || bad "LoRA on classes 5-9: $lb -> $la"
# lora.train_embeddings: the class table trains too, saved with the adapter (PEFT
# modules_to_save); rows of the classes trained (5-9, and the null class through label
# dropout) move, the others stay the base's bit for bit; eval with the adapter reproduces the
# run's final loss (the table read back from the adapter); a plain adapter holds no table
"$tz" train inputs/dit/finetune.cfg "${data[@]}" --set train.steps=20 --set train.eval_every=0 \
  --set train.eval_windows=256 --set train.threads=2 --set lora.train_embeddings=true \
  --set run.dir="$work/emb" > "$work/emb.log" 2>&1 || { bad "LoRA with train_embeddings failed"; tail -5 "$work/emb.log"; }
ea=$(evals "$work/emb" | tail -1)
if $py - "$work/emb/adapter" "$work/lora/adapter" inputs/dit/model/model.safetensors <<'PY'
import json, sys
sys.path.insert(0, "tests/ref")
import numpy as np
import st
name = "y_embedder.embedding_table.weight"
a = st.load(sys.argv[1] + "/adapter_model.safetensors")
cfg = json.load(open(sys.argv[1] + "/adapter_config.json"))
assert cfg["modules_to_save"] == ["y_embedder.embedding_table"], cfg["modules_to_save"]
plain = st.load(sys.argv[2] + "/adapter_model.safetensors")
assert "base_model.model." + name not in plain
assert json.load(open(sys.argv[2] + "/adapter_config.json"))["modules_to_save"] is None
t, base = a["base_model.model." + name].astype(np.float32), st.load(sys.argv[3])[name].astype(np.float32)
moved = [int(c) for c in range(t.shape[0]) if not np.array_equal(t[c], base[c])]
assert moved == [5, 6, 7, 8, 9, 10], moved  # 10: the null class
PY
then ok "lora.train_embeddings: the rows of classes 5-9 and the null class trained, saved as modules_to_save"
else bad "lora.train_embeddings: the saved table"; fi
e=$("$tz" eval inputs/dit/finetune.cfg "${data[@]}" --set train.eval_windows=256 --set train.threads=2 \
  --set model.adapter="$work/emb/adapter" 2>&1 | tail -1 | sed -n 's/^eval_loss=\([0-9.]*\) .*/\1/p')
awk -v a="$e" -v b="$ea" 'BEGIN {d = a - b; exit !(a != "" && d < 1e-6 && d > -1e-6)}' &&
  ok "eval with that adapter (its table read back) reproduces $ea" || bad "eval with the table: $e vs $ea"
# the same on a TurboQuant base (block weights quantized at load)
"$tz" train inputs/dit/finetune.cfg "${data[@]}" --set train.steps=60 --set train.eval_every=0 \
  --set train.eval_windows=256 --set train.threads=2 --set quant.bits=4 --set quant.group=64 \
  --set run.dir="$work/qlora" > "$work/qlora.log" 2>&1 || { bad "LoRA run on a quantized base failed"; tail -5 "$work/qlora.log"; }
qb=$(evals "$work/qlora" | head -1) qa=$(evals "$work/qlora" | tail -1)
# measured: 0.1099 -> 0.0889 after 60 steps of 64 images; required: a drop of more than 0.01
[ -n "$qb" ] && awk -v b="$qb" -v a="$qa" 'BEGIN {exit !(a < b - 0.01)}' &&
  ok "LoRA on a 4-bit TurboQuant base: validation loss $qb -> $qa" || bad "LoRA on a quantized base: $qb -> $qa"

# full fine-tuning of the 4-bit block weights (fp32 master on the host, codes in the model);
# the model is saved dequantized and evaluates as the run ended. Measured: 0.0986 -> 0.0855
# after 20 steps of 16 images on all 5000 validation images; required: a drop of more than 0.005
"$tz" train inputs/dit/finetune.cfg "${data[@]}" --set train.mode=full --set train.steps=20 \
  --set train.micro_batch=16 --set optim.lr=5e-4 --set train.eval_every=0 --set train.eval_windows=0 \
  --set train.threads=2 --set quant.bits=4 --set quant.group=64 --set run.dir="$work/qfull" > "$work/qfull.log" 2>&1 ||
  { bad "full fine-tuning of a quantized DiT failed"; tail -5 "$work/qfull.log"; }
fb=$(evals "$work/qfull" | head -1) fa=$(evals "$work/qfull" | tail -1)
fe=$("$tz" eval inputs/dit/finetune.cfg "${data[@]}" --set model.path="$work/qfull/model" --set train.eval_windows=0 --set train.threads=2 2>&1 | tail -1 | sed -n 's/^eval_loss=\([0-9.]*\) .*/\1/p')
[ -n "$fb" ] && awk -v b="$fb" -v a="$fa" -v e="$fe" 'BEGIN {d = e - a; exit !(a < b - 0.005 && d < 1e-5 && d > -1e-5)}' &&
  ok "full fine-tuning of a 4-bit DiT: $fb -> $fa; the saved model evaluates to $fe" ||
  bad "full fine-tuning of a 4-bit DiT: $fb -> $fa, saved model $fe"

# samples of the bundled model follow their class; same seed, same bytes
args=()
for c in 0 1 2 3 4; do
  "$tz" sample inputs/dit/pretrain.cfg --set model.path=inputs/dit/model --class $c --n 16 --steps 25 \
    --guidance 4 --seed 7 --out "$work/c$c.png" > /dev/null 2>&1 || bad "sample class $c"
  args+=("$c=$work/c$c.png")
done
$py tests/dit/class_means.py $fm/t10k-images-idx3-ubyte.gz $fm/t10k-labels-idx1-ubyte.gz 16 28 28 0.05 "${args[@]}" > "$work/means.log" 2>&1 &&
  ok "class-conditional samples: $(grep "of 5" "$work/means.log" | cut -d"(" -f1); $(grep smallest "$work/means.log")" ||
  { bad "class-conditional sampling"; cat "$work/means.log"; }
"$tz" sample inputs/dit/pretrain.cfg --set model.path=inputs/dit/model --class 1 --n 16 --steps 25 \
  --guidance 4 --seed 7 --out "$work/again.png" > /dev/null 2>&1
cmp -s "$work/c1.png" "$work/again.png" && ok "sampling is deterministic for a seed" || bad "sampling differs for one seed"
# --out .h5: the same samples as values (what a latent DiT writes for its VAE to decode)
"$tz" sample inputs/dit/pretrain.cfg --set model.path=inputs/dit/model --class 1 --n 16 --steps 25 \
  --guidance 4 --seed 7 --out "$work/c1.h5" > /dev/null 2>&1 &&
  $py - "$work/c1.h5" "$work/c1.png" <<'PY' && ok "sample --out .h5: the grid's samples as float32 [16, 1, 28, 28], labels 1" || bad "sample --out .h5"
import sys
import h5py
import numpy as np
sys.path.insert(0, "tests/dit")
from class_means import read_png_gray, tiles
f = h5py.File(sys.argv[1], "r")
x, y = np.asarray(f["images"]), np.asarray(f["labels"])
assert x.dtype == np.float32 and x.shape == (16, 1, 28, 28) and (y == 1).all(), (x.shape, y)
px = np.clip(np.rint((x[:, 0].astype(np.float64) + 1) * 127.5), 0, 255)
grid = tiles(read_png_gray(sys.argv[2]), 16, 28, 28)
assert np.abs(grid.reshape(16, 28, 28) - px / 127.5 + 1).max() < 1.5 / 127.5, "pixels differ"
PY

# a latent DiT on cached latents (the layout tools/latents.py dit-cache writes)
"$tz" init-model --arch dit --preset dit-tiny --seed 4 --out "$work/lat" > /dev/null &&
  $py - "$work" <<'PY' || bad "latent caches"
import sys
import h5py
import numpy as np
rng = np.random.default_rng(5)
pat = rng.standard_normal((2, 4, 8, 8)).astype(np.float32)
for name, n in (("train", 64), ("val", 16)):
    y = np.arange(n) % 2
    with h5py.File(f"{sys.argv[1]}/lat-{name}.h5", "w") as f:
        f["images"] = (pat[y] + 0.1 * rng.standard_normal((n, 4, 8, 8))).astype(np.float32)
        f["labels"] = y.astype(np.int32)
        f.attrs["num_classes"] = 10
PY
# (measured: 30 steps 1.0108 -> 0.2588; a fresh DiT's output layer is zero, so it trains in full)
"$tz" train inputs/dit/pretrain.cfg --set model.path="$work/lat" --set data.train="$work/lat-train.h5" \
  --set data.val="$work/lat-val.h5" --set data.train_labels= --set data.val_labels= --set data.classes= \
  --set train.steps=30 --set train.micro_batch=16 --set train.eval_every=0 --set optim.lr=3e-3 \
  --set optim.warmup=3 --set train.threads=2 --set run.dir="$work/latrun" > "$work/latrun.log" 2>&1 ||
  { bad "latent DiT run"; tail -3 "$work/latrun.log"; }
lb=$(evals "$work/latrun" | head -1) la=$(evals "$work/latrun" | tail -1)
[ -n "$lb" ] && awk -v b="$lb" -v a="$la" 'BEGIN {exit !(a < 0.5 * b)}' &&
  ok "a latent DiT (4x8x8, learned sigma) trains on HDF5 latents: $lb -> $la" ||
  bad "latent DiT: $lb -> $la"
"$tz" sample inputs/dit/pretrain.cfg --set model.path="$work/latrun/model" \
  --class 1 --n 3 --steps 10 --guidance 1 --out "$work/lat-s.h5" > "$work/lats.log" 2>&1 &&
  $py -c "import h5py, sys; f = h5py.File(sys.argv[1], 'r'); sys.exit(f['images'].shape != (3, 4, 8, 8))" "$work/lat-s.h5" &&
  ok "a latent DiT samples to .h5: [3, 4, 8, 8]" || { bad "latent DiT sample"; tail -3 "$work/lats.log"; }

expect_error() { # name, expected text, command...
  local name=$1 want=$2; shift 2
  if "$@" > "$work/err.log" 2>&1; then bad "$name: succeeded"; return; fi
  grep -qF -- "$want" "$work/err.log" && ok "$name" || { bad "$name: message lacks '$want'"; cat "$work/err.log"; }
}
expect_error "IDX images without labels" "needs its label file in data.train_labels" \
  "$tz" train inputs/dit/pretrain.cfg --set model.path=inputs/dit/model "${data[@]}" --set data.train_labels= \
  --set run.dir="$work/e1"
printf 'not an idx file at all' > "$work/bad.gz"
expect_error "malformed image file" "bad.gz" \
  "$tz" eval inputs/dit/pretrain.cfg --set model.path=inputs/dit/model "${data[@]}" --set data.val="$work/bad.gz"
mkdir -p "$work/photos" && : > "$work/DiT-XL-2-256x256.pt"
$py -c "import h5py, numpy as np, sys
with h5py.File(sys.argv[1], 'w') as f:
    f['images'] = np.zeros((2, 4, 28, 28), np.float32); f['labels'] = np.zeros(2, np.int32)" "$work/lat4.h5"
expect_error "a folder of images: the tool to make a file of it" "tools/latents.py images" \
  "$tz" eval inputs/dit/pretrain.cfg --set model.path=inputs/dit/model --set data.val="$work/photos"
expect_error "a .pt file as data: a checkpoint, not images" "looks like a model checkpoint" \
  "$tz" eval inputs/dit/pretrain.cfg --set model.path=inputs/dit/model --set data.val="$work/DiT-XL-2-256x256.pt"
expect_error "4-channel latents for a pixel DiT" "4 channels are SD-VAE latents" \
  "$tz" eval inputs/dit/pretrain.cfg --set model.path=inputs/dit/model --set data.val="$work/lat4.h5"
expect_error "a latent DiT's samples as a PNG" "--out samples.h5" \
  "$tz" sample inputs/dit/finetune.cfg --set model.path="$work/lat" --class 1 --n 1 --steps 2 --out "$work/x.png"
expect_error "bad class list" "data.classes = \"3-x\"" \
  "$tz" eval inputs/dit/pretrain.cfg --set model.path=inputs/dit/model "${data[@]}" --set data.classes=3-x
expect_error "quantized DiT: group must divide hidden_size" "must divide hidden_size 64" \
  "$tz" eval inputs/dit/pretrain.cfg --set model.path=inputs/dit/model "${data[@]}" --set quant.bits=4 --set quant.group=128
finish dit

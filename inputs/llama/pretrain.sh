#!/usr/bin/env bash
# Reproduces the bundled model inputs/llama/model: KJV token files from Debian's
# bible-kjv, a random "mini" Llama (seed 1), full training with inputs/llama/pretrain.cfg,
# then a copy of the result into inputs/llama/model. About 20 minutes on 2 CPU cores.
# usage: inputs/llama/pretrain.sh [TURBOZERO]   (from the repository root)
set -euo pipefail
tz=${1:-build/turbozero}
bash inputs/data/make_data.sh "$tz" kjv
"$tz" init-model --arch llama --preset mini --vocab 256 --seed 1 --out runs/pretrain-init
"$tz" train inputs/llama/pretrain.cfg --set run.overwrite=true
mkdir -p inputs/llama/model
cp runs/pretrain/model/config.json runs/pretrain/model/model.safetensors inputs/llama/model/
echo "bundled model updated: inputs/llama/model"

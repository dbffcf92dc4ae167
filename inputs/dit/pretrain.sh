#!/usr/bin/env bash
# Reproduces the bundled DiT inputs/dit/model: a random "tiny" DiT (seed 1), full training
# on Fashion-MNIST classes 0-4 with inputs/dit/pretrain.cfg, then a copy into
# inputs/dit/model. About 5 minutes on 2 CPU cores.
# usage: inputs/dit/pretrain.sh [TURBOZERO]   (from the repository root)
set -euo pipefail
tz=${1:-build/turbozero}
"$tz" init-model --arch dit --preset tiny --seed 1 --out runs/dit-init
"$tz" train inputs/dit/pretrain.cfg --set run.overwrite=true
mkdir -p inputs/dit/model
cp runs/dit-pretrain/model/config.json runs/dit-pretrain/model/model.safetensors inputs/dit/model/
echo "bundled DiT updated: inputs/dit/model"

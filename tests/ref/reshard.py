"""Rewrites a Llama folder as a Llama 3.1-style one for the reference test: rope_scaling of
type llama3 in config.json, torch_dtype float16, and the weights in F16 split over two shards
with model.safetensors.index.json.

usage: reshard.py IN_DIR OUT_DIR FACTOR LOW HIGH ORIGINAL_MAX"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st  # noqa: E402


def main():
    src, dst = sys.argv[1], sys.argv[2]
    factor, low, high, orig = float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6])
    os.makedirs(dst, exist_ok=True)
    cfg = json.load(open(os.path.join(src, "config.json")))
    cfg["rope_scaling"] = {"factor": factor, "low_freq_factor": low, "high_freq_factor": high,
                           "original_max_position_embeddings": orig, "rope_type": "llama3"}
    cfg["torch_dtype"] = "float16"
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w"), indent=2)
    W = st.load(os.path.join(src, "model.safetensors"))
    names = sorted(W)
    shards = [names[: len(names) // 2], names[len(names) // 2:]]
    wmap = {}
    for i, part in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-00002.safetensors"
        st.save(os.path.join(dst, fname), {n: W[n].astype(np.float16) for n in part})
        wmap.update({n: fname for n in part})
    json.dump({"metadata": {"total_size": 0}, "weight_map": wmap},
              open(os.path.join(dst, "model.safetensors.index.json"), "w"), indent=2)


if __name__ == "__main__":
    main()

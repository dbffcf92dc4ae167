"""Writes cached-latent HDF5 files (io/latents_h5.h's layout) for a Flux model in the tests:
N samples of Ti = h*w image tokens of C channels, Tt text tokens of J, a pooled vector of P;
the latents of each sample are one of four patterns picked by a one-hot in its text, so a
model can learn to predict them from the text. Extra modes write broken files.

usage: make_cache.py OUT.h5 --n N --grid h,w --c C --tt Tt --j J --p P --seed S [--broken KIND]"""
import argparse

import h5py
import numpy as np

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--n", type=int, default=40)
ap.add_argument("--grid", default="4,4")
ap.add_argument("--c", type=int, default=16)
ap.add_argument("--tt", type=int, default=8)
ap.add_argument("--j", type=int, default=32)
ap.add_argument("--p", type=int, default=24)
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--broken", default="")
a = ap.parse_args()
h, w = (int(x) for x in a.grid.split(","))
Ti = h * w
rng = np.random.default_rng(a.seed)
base = np.random.default_rng(1234).standard_normal((4, Ti, a.c)).astype(np.float32)
cls = rng.integers(0, 4, a.n)
lat = (base[cls] + 0.1 * rng.standard_normal((a.n, Ti, a.c))).astype(np.float32)
txt = rng.standard_normal((a.n, a.tt, a.j)).astype(np.float32)
txt[:, 0, :4] = np.eye(4, dtype=np.float32)[cls] * 3
ids = np.zeros((Ti, 3), np.float32)
ids[:, 1] = np.arange(Ti) // w
ids[:, 2] = np.arange(Ti) % w
with h5py.File(a.out, "w") as f:
    f["latents"] = lat if a.broken != "latents-f64" else lat.astype(np.float64)
    if a.broken != "no-txt":
        f["txt"] = txt
    f["pooled"] = rng.standard_normal((a.n, a.p)).astype(np.float32)
    f["img_ids"] = ids if a.broken != "ids" else ids[:-1]
    f["txt_ids"] = np.zeros((a.tt, 3), np.float32)

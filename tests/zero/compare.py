"""Compares the tensors of two safetensors files. The measure asserted is each tensor's
relative error ||a - b|| / ||a|| (largest over the tensors); the largest single-element
difference relative to the tensor's largest element is printed too, not asserted: AdamW
divides by sqrt(v), so an element whose gradient is near zero (and so dominated by
rounding) moves by an amount that rounding decides, up to ~lr * 1e-3 over a short run.
Quantized weights (NAME.tq_codes, U8): the codes are discrete, so the measure is the
fraction of differing code bytes, at most CODES (default 0): an fp32 master that differs by
rounding re-quantizes to the same codes except where a value sits at a decision boundary.
usage: compare.py A.safetensors B.safetensors TOL [CODES]"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ref"))
import st  # noqa: E402

a, b, tol = st.load(sys.argv[1]), st.load(sys.argv[2]), float(sys.argv[3])
codes_tol = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
if sorted(a) != sorted(b):
    print("tensor names differ")
    sys.exit(1)
worst = elem = 0.0
ncode = ndiff = 0
for k in a:
    if k.endswith(".tq_codes"):
        ncode += a[k].size
        ndiff += int((a[k] != b[k]).sum())
        continue
    x, y = a[k].astype(np.float64), b[k].astype(np.float64)
    worst = max(worst, float(np.linalg.norm(x - y) / max(np.linalg.norm(x), 1e-30)))
    elem = max(elem, float(np.abs(x - y).max() / max(np.abs(x).max(), 1e-30)))
codes = f", {ndiff} of {ncode} code bytes differ" if ncode else ""
print(f"{worst:.3e} (largest element difference {elem:.1e} of the tensor's largest{codes})")
sys.exit(0 if worst <= tol and ndiff <= codes_tol * ncode else 1)

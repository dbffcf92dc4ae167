"""Offline study, not a test: how much of a 3-bit quantization's output error each adapter
init leaves on the bundled Llama, in numpy/PyTorch with a TurboQuant-like quantizer (random
signs, an orthonormal Hadamard per group, 3-bit Lloyd-Max levels for a Gaussian, a
least-squares scale per group: the idea of quant/turboquant.c, not its bits). The inputs X of
every projection come from a forward pass over 16 random KJV windows of 256 tokens. Prints,
over the 28 projections, ||X (W - Q - L)^T||^2 / ||X W^T||^2 for: the plain base (L = 0),
loftq (5 alternations, rank 16), the adapter fitted in the norm of X on the plain base
("calibrated"), on loftq's base ("loftq_calibrated"), and loftq's alternation done in that norm.
usage: python3 tests/quant/loftq_proxy.py   (needs inputs/data/kjv.tok: inputs/data/make_data.sh)"""
import json
import math
import os
import sys

import numpy as np
import torch

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(root, "tests", "ref"))
import st  # noqa: E402
from llama_ref import rms_norm, rope  # noqa: E402

torch.set_default_dtype(torch.float64)
md = os.path.join(root, "inputs", "llama", "model")
cfg = json.load(open(os.path.join(md, "config.json")))
W = {k: torch.tensor(v.astype("float64")) for k, v in st.load(os.path.join(md, "model.safetensors")).items()}
toks = np.fromfile(os.path.join(root, "inputs", "data", "kjv.tok"), dtype=np.uint8)[64:]  # 64-byte header
B, T, RANK = 16, 256, 16
C, H, KV = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
D, eps = C // H, cfg["rms_norm_eps"]
starts = np.random.default_rng(0).integers(0, len(toks) - T, B)
inp = torch.tensor(np.stack([toks[s:s + T] for s in starts]).astype(np.int64))
X = {}


def linear(x, i, blk, proj):
    n = f"model.layers.{i}.{blk}.{proj}.weight"
    X[n] = x.reshape(-1, x.shape[-1]).numpy()
    return x @ W[n].t()


x = W["model.embed_tokens.weight"][inp]
mask = torch.full((T, T), float("-inf")).triu(1)
for i in range(cfg["num_hidden_layers"]):
    h = rms_norm(x, W[f"model.layers.{i}.input_layernorm.weight"], eps)
    q = linear(h, i, "self_attn", "q_proj").view(B, T, H, D).transpose(1, 2)
    k = linear(h, i, "self_attn", "k_proj").view(B, T, KV, D).transpose(1, 2)
    v = linear(h, i, "self_attn", "v_proj").view(B, T, KV, D).transpose(1, 2)
    q, k = rope(q, cfg["rope_theta"]), rope(k, cfg["rope_theta"])
    k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
    att = (torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D) + mask, dim=-1) @ v)
    x = x + linear(att.transpose(1, 2).reshape(B, T, C), i, "self_attn", "o_proj")
    h = rms_norm(x, W[f"model.layers.{i}.post_attention_layernorm.weight"], eps)
    g, u = linear(h, i, "mlp", "gate_proj"), linear(h, i, "mlp", "up_proj")
    x = x + linear(torch.nn.functional.silu(g) * u, i, "mlp", "down_proj")

LEVELS = np.array([-2.152, -1.344, -0.756, -0.245, 0.245, 0.756, 1.344, 2.152])


def hadamard(n):
    h = np.array([[1.0]])
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / math.sqrt(n)


def quant(w, g):
    m, n = w.shape
    s = np.random.default_rng(1).choice([-1.0, 1.0], n)
    hg = hadamard(g)
    wr = (w * s).reshape(m, n // g, g) @ hg.T
    z = wr / (np.sqrt((wr ** 2).mean(-1, keepdims=True)) + 1e-12)
    c = LEVELS[np.abs(z[..., None] - LEVELS).argmin(-1)]
    lam = (wr * c).sum(-1, keepdims=True) / ((c * c).sum(-1, keepdims=True) + 1e-12)
    return ((lam * c) @ hg).reshape(m, n) * s


def svd_r(r_, rank):
    u, sv, vt = np.linalg.svd(r_, full_matrices=False)
    return (u[:, :rank] * sv[:rank]) @ vt[:rank]


def loftq(w, g, fit):
    low = np.zeros_like(w)
    for _ in range(5):
        q_ = quant(w - low, g)
        low = fit(w - q_)
    return q_, low


tot = dict.fromkeys(["plain", "loftq", "calibrated", "loftq_calibrated", "loftq_in_x_norm"], 0.0)
ref = 0.0
for n, xa in X.items():
    w = W[n].numpy()
    g = 64 if w.shape[1] % 128 else 128
    hm = xa.T @ xa / len(xa)
    hm += 0.01 * np.mean(np.diag(hm)) * np.eye(len(hm))
    L = np.linalg.cholesky(hm)
    fit_x = lambda r_: np.linalg.solve(L.T, svd_r(r_ @ L, RANK).T).T  # noqa: E731
    fit_w = lambda r_: svd_r(r_, RANK)  # noqa: E731
    err = lambda e: ((xa @ e.T) ** 2).sum()  # noqa: E731
    q0 = quant(w, g)
    ql, ll = loftq(w, g, fit_w)
    qx, lx = loftq(w, g, fit_x)
    ref += err(w)
    tot["plain"] += err(w - q0)
    tot["loftq"] += err(w - ql - ll)
    tot["calibrated"] += err(w - q0 - fit_x(w - q0))
    tot["loftq_calibrated"] += err(w - ql - fit_x(w - ql))
    tot["loftq_in_x_norm"] += err(w - qx - lx)
for k, v in tot.items():
    print(f"{k:18s} {v / ref:.6f}")

"""Reference check of turbozero's DiT against PyTorch (fp64), written from the DiT paper and
its reference code's equations, not from the C code: the diffusion forward process, the loss
and the gradient of every trainable tensor; or (--sampler) the DDIM / Euler samplers with
classifier-free guidance on a fixed fake model.

usage: dit_ref.py MODEL_DIR DUMP.safetensors MODE(lora|full) ALPHA [TOL]
       dit_ref.py --sampler ddim|euler DUMP.safetensors [TOL]
Exits 1 if any relative error exceeds TOL (default 1e-4)."""
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st  # noqa: E402

torch.set_default_dtype(torch.float64)
T_STEPS = 1000


def alphas_cumprod():
    betas = np.linspace(1e-4, 0.02, T_STEPS, dtype=np.float64)
    return torch.tensor(np.cumprod(1.0 - betas))


def timestep_embedding(t, dim, max_period=10000):
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float64) / half)
    args = t[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def sincos_1d(dim, pos):
    omega = np.arange(dim // 2, dtype=np.float64) / (dim / 2.0)
    omega = 1.0 / 10000 ** omega
    out = np.einsum("m,d->md", pos.reshape(-1), omega)
    return np.concatenate([np.sin(out), np.cos(out)], axis=1)


def pos_embed_2d(dim, g):
    gh = np.arange(g, dtype=np.float32)
    gw = np.arange(g, dtype=np.float32)
    grid = np.stack(np.meshgrid(gw, gh), axis=0).reshape(2, 1, g, g)
    emb = np.concatenate([sincos_1d(dim // 2, grid[0]), sincos_1d(dim // 2, grid[1])], axis=1)
    return torch.tensor(emb)


def modulate(x, shift, scale):
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


def check_model(model_dir, dump_path, mode, alpha, tol):
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    W = {k: torch.tensor(v, dtype=torch.float64)
         for k, v in st.load(os.path.join(model_dir, "model.safetensors")).items()}
    dump = st.load(dump_path)
    C, S, p = cfg["in_channels"], cfg["input_size"], cfg["patch_size"]
    Hd, nh, depth = cfg["hidden_size"], cfg["num_heads"], cfg["depth"]
    sigma, flow = cfg["learn_sigma"], cfg["diffusion"] == "flow"
    fails = 0

    lora = {k[2:]: torch.tensor(v, dtype=torch.float64) for k, v in dump.items() if k.startswith("w:")}
    params = lora if mode == "lora" else {k: v for k, v in W.items() if k != "pos_embed"}
    for q in params.values():
        q.requires_grad_(True)

    # the forward process, from x0, noise and t
    x0 = torch.tensor(dump["x0"], dtype=torch.float64)
    eps = torch.tensor(dump["noise"], dtype=torch.float64)
    t = torch.tensor(dump["t"], dtype=torch.float64)
    y = torch.tensor(dump["y"].astype("int64"))
    B = x0.shape[0]
    if flow:
        tb = t.view(B, 1, 1, 1)
        x_t, target, t_model = (1 - tb) * x0 + tb * eps, eps - x0, 1000.0 * t
    else:
        ab = alphas_cumprod()[t.long()].view(B, 1, 1, 1)
        x_t, target, t_model = ab.sqrt() * x0 + (1 - ab).sqrt() * eps, eps, t
    xerr = ((torch.tensor(dump["x_t"], dtype=torch.float64) - x_t).norm() / x_t.norm()).item()
    print(f"x_t (forward process): rel err {xerr:.2e}")
    fails += xerr > 1e-6

    def linear(name, x):
        out = x @ W[name + ".weight"].t() + W[name + ".bias"]
        a = "base_model.model." + name + ".lora_A.weight"
        if a in lora:
            b = a.replace("lora_A", "lora_B")
            out = out + (alpha / lora[a].shape[0]) * ((x @ lora[a].t()) @ lora[b].t())
        return out

    x = F.conv2d(x_t, W["x_embedder.proj.weight"], W["x_embedder.proj.bias"], stride=p)
    x = x.flatten(2).transpose(1, 2) + pos_embed_2d(Hd, S // p).unsqueeze(0)
    temb = linear("t_embedder.mlp.2", F.silu(linear("t_embedder.mlp.0",
                                                    timestep_embedding(t_model, cfg["frequency_embedding_size"]))))
    c = temb + W["y_embedder.embedding_table.weight"][y]
    N = x.shape[1]
    D = Hd // nh
    for i in range(depth):
        blk = f"blocks.{i}"
        sh1, sc1, g1, sh2, sc2, g2 = linear(blk + ".adaLN_modulation.1", F.silu(c)).chunk(6, dim=1)
        h = modulate(F.layer_norm(x, (Hd,), eps=1e-6), sh1, sc1)
        qkv = linear(blk + ".attn.qkv", h).reshape(B, N, 3, nh, D).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        att = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(D), dim=-1) @ v
        att = att.transpose(1, 2).reshape(B, N, Hd)
        x = x + g1.unsqueeze(1) * linear(blk + ".attn.proj", att)
        h = modulate(F.layer_norm(x, (Hd,), eps=1e-6), sh2, sc2)
        mlp = linear(blk + ".mlp.fc2", F.gelu(linear(blk + ".mlp.fc1", h), approximate="tanh"))
        x = x + g2.unsqueeze(1) * mlp
    shift, scale = linear("final_layer.adaLN_modulation.1", F.silu(c)).chunk(2, dim=1)
    x = linear("final_layer.linear", modulate(F.layer_norm(x, (Hd,), eps=1e-6), shift, scale))
    cout = 2 * C if sigma else C
    g = S // p
    x = x.reshape(B, g, g, p, p, cout)
    out = torch.einsum("nhwpqc->nchpwq", x).reshape(B, cout, S, S)
    loss = ((out[:, :C] - target) ** 2).mean()
    loss.backward()

    lc = float(dump["loss"][0])
    lerr = abs(lc - loss.item()) / abs(loss.item())
    print(f"loss: turbozero {lc:.8f} torch {loss.item():.8f} rel err {lerr:.2e}")
    fails += lerr > tol
    checked, worst = 0, 0.0
    for name, q in params.items():
        key = "g:" + name
        if key not in dump:
            print(f"FAIL {name}: no gradient in the dump")
            fails += 1
            continue
        gc = torch.tensor(dump[key], dtype=torch.float64).reshape(q.shape)
        ref = q.grad
        err = (gc - ref).norm().item() / max(ref.norm().item(), 1e-30)
        worst = max(worst, err)
        checked += 1
        if err > tol or not torch.isfinite(gc).all() or ref.norm().item() == 0.0:
            print(f"FAIL {name}: rel err {err:.3e} (|ref| {ref.norm().item():.3e})")
            fails += 1
    extra = [k for k in dump if k.startswith("g:") and k[2:] not in params]
    if extra:
        print(f"FAIL gradients for tensors that should be frozen: {extra[:5]}")
        fails += 1
    print(f"{checked} gradients checked, worst rel err {worst:.3e}, tolerance {tol:g}")
    return fails


def fake_model(x, t, y):
    j = torch.arange(x.shape[1], dtype=torch.float64)
    return 0.5 * torch.sin(x) + 5e-4 * t[:, None] + 0.1 * (y[:, None] + 1) * torch.cos(j)[None]


def check_sampler(kind, dump_path, tol):
    dump = st.load(dump_path)
    x = torch.tensor(dump["noise"], dtype=torch.float64)
    y = torch.tensor(dump["labels"].astype("float64"))
    steps, w, null = (float(v) for v in dump["steps_guidance_null"])
    steps = int(steps)
    ab = alphas_cumprod()
    nullv = torch.full_like(y, null)
    for k in range(steps, 0, -1):
        if kind == "euler":
            t = 1000.0 * k / steps
        else:
            ti = (k - 1) * T_STEPS // steps
            t = float(ti)
        tt = torch.full_like(y, t)
        c, u = fake_model(x, tt, y), fake_model(x, tt, nullv)
        e = u + w * (c - u)
        if kind == "euler":
            x = x + ((k - 1) / steps - k / steps) * e
        else:
            a_t = ab[ti]
            a_prev = ab[(k - 2) * T_STEPS // steps] if k > 1 else torch.tensor(1.0)
            x0 = (x - (1 - a_t).sqrt() * e) / a_t.sqrt()
            x = a_prev.sqrt() * x0 + (1 - a_prev).sqrt() * e
    got = torch.tensor(dump["samples"], dtype=torch.float64)
    err = ((got - x).norm() / x.norm()).item()
    print(f"sampler {kind}: {steps} steps, guidance {w:g}: rel err {err:.2e} (tol {tol:g})")
    return int(err > tol)


def main():
    if sys.argv[1] == "--sampler":
        tol = float(sys.argv[4]) if len(sys.argv) > 4 else 1e-5
        fails = check_sampler(sys.argv[2], sys.argv[3], tol)
    else:
        tol = float(sys.argv[5]) if len(sys.argv) > 5 else 1e-4
        fails = check_model(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), tol)
    print(f"dit_ref: {'ok' if not fails else str(fails) + ' failed'}")
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()

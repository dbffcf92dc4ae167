"""Reference for turbozero's Flux.1 transformer (diffusers' FluxTransformer2DModel) in PyTorch
fp64, written from the published architecture: tiny random models and inputs in diffusers'
layout, the flow-matching loss with the gradient of every parameter, and the comparison of
those against the same tensors written by the C side.

usage: flux_ref.py make DIR --seed S [--layers Ld] [--single Ls] [--heads H] [--head-dim D]
                        [--axes a0,a1,a2] [--in C] [--joint J] [--pooled P] [--no-guidance]
       flux_ref.py inputs DIR OUT.safetensors --seed S [--batch B] [--txt Tt] [--grid h,w]
       flux_ref.py run DIR INPUTS.safetensors OUT.safetensors
       flux_ref.py prepare DIR INPUTS.safetensors OUT.safetensors --seed S [make's and
                           inputs' options]   (make, inputs and run in one process)
       flux_ref.py compare REF.safetensors GOT.safetensors [--tol 1e-4]
       flux_ref.py sample DIR PROMPTS.h5 SAMPLES.h5 [--shift X] [--tol 1e-4]
       flux_ref.py selftest

make writes DIR/config.json and DIR/diffusion_pytorch_model.safetensors (F32, every weight,
bias and norm weight nonzero). inputs writes F32 "latents" [B,Ti,Cin], "noise" [B,Ti,Cin],
"sigma" [B], "guidance" [B], "pooled" [B,P], "txt" [B,Tt,J], "img_ids" [Ti,3] (0, row, col;
row-major over the grid) and "txt_ids" [Tt,3] (zeros). run writes F64 "loss" [1] (the sum of
squared errors of the velocity prediction) and "grad.NAME" (NAME's shape) for every parameter.
compare prints max|got-ref|/max|ref| per tensor and exits 1 if any exceeds TOL, a value is
not finite, or a name is on one side only."""
import argparse
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
EPS = 1e-6
TIME_DIM = 256
WEIGHTS = "diffusion_pytorch_model.safetensors"


def sizes(cfg):
    D, H = cfg["attention_head_dim"], cfg["num_attention_heads"]
    cin = cfg["in_channels"]
    return D, H, H * D, cin, cfg.get("out_channels") or cin


def param_shapes(cfg):
    """name -> shape for every parameter, as diffusers names them (Linear weights [out, in])."""
    assert cfg.get("patch_size", 1) == 1, "patch_size must be 1"
    D, _, inner, cin, cout = sizes(cfg)
    assert sum(cfg["axes_dims_rope"]) == D, "axes_dims_rope must add up to attention_head_dim"
    s = {}

    def lin(name, i, o):
        s[name + ".weight"] = (o, i)
        s[name + ".bias"] = (o,)

    lin("x_embedder", cin, inner)
    lin("context_embedder", cfg["joint_attention_dim"], inner)
    tte = "time_text_embed."
    embedders = [("timestep_embedder", TIME_DIM), ("text_embedder", cfg["pooled_projection_dim"])]
    if cfg["guidance_embeds"]:
        embedders.append(("guidance_embedder", TIME_DIM))
    for e, d in embedders:
        lin(tte + e + ".linear_1", d, inner)
        lin(tte + e + ".linear_2", inner, inner)
    for i in range(cfg["num_layers"]):
        p = f"transformer_blocks.{i}."
        lin(p + "norm1.linear", inner, 6 * inner)
        lin(p + "norm1_context.linear", inner, 6 * inner)
        for n in ("to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj", "to_out.0", "to_add_out"):
            lin(p + "attn." + n, inner, inner)
        for n in ("norm_q", "norm_k", "norm_added_q", "norm_added_k"):
            s[p + "attn." + n + ".weight"] = (D,)
        for f in ("ff", "ff_context"):
            lin(p + f + ".net.0.proj", inner, 4 * inner)
            lin(p + f + ".net.2", 4 * inner, inner)
    for j in range(cfg["num_single_layers"]):
        p = f"single_transformer_blocks.{j}."
        lin(p + "norm.linear", inner, 3 * inner)
        lin(p + "proj_mlp", inner, 4 * inner)
        for n in ("to_q", "to_k", "to_v"):
            lin(p + "attn." + n, inner, inner)
        for n in ("norm_q", "norm_k"):
            s[p + "attn." + n + ".weight"] = (D,)
        lin(p + "proj_out", 5 * inner, inner)
    lin("norm_out.linear", inner, 2 * inner)
    lin("proj_out", inner, cout)
    return s


def random_model(cfg, seed):
    """F32 weights ~ N(0, 0.3/sqrt(fan_in)), biases ~ N(0, 0.05), norm weights ~ 1 + N(0, 0.1):
    nothing zero, so a term left out or a wrong chunk shows in the loss and the gradients."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in param_shapes(cfg).items():
        if len(shape) == 2:
            a = rng.normal(0, 0.3 / math.sqrt(shape[1]), shape)
        elif "norm_" in name:
            a = 1 + rng.normal(0, 0.1, shape)
        else:
            a = rng.normal(0, 0.05, shape)
        out[name] = a.astype(np.float32)
    return out


def random_inputs(cfg, seed, B, Tt, gh, gw):
    rng = np.random.default_rng(seed)
    cin = cfg["in_channels"]
    Ti = gh * gw
    img_ids = np.zeros((Ti, 3))
    img_ids[:, 1] = np.repeat(np.arange(gh), gw)
    img_ids[:, 2] = np.tile(np.arange(gw), gh)
    # sigma = k/1024 and guidance = 3.5 + k/8: exact in F32, and so are sigma*1000 and guidance*1000
    x = {"latents": rng.normal(0, 1, (B, Ti, cin)), "noise": rng.normal(0, 1, (B, Ti, cin)),
         "sigma": rng.integers(52, 973, B) / 1024.0, "guidance": 3.5 + rng.integers(-4, 5, B) / 8.0,
         "pooled": rng.normal(0, 1, (B, cfg["pooled_projection_dim"])),
         "txt": rng.normal(0, 1, (B, Tt, cfg["joint_attention_dim"])),
         "img_ids": img_ids, "txt_ids": np.zeros((Tt, 3))}
    return {k: v.astype(np.float32) for k, v in x.items()}


def timestep_features(t):
    # diffusers' Timesteps(256, flip_sin_to_cos=True, downscale_freq_shift=0): cos first
    half = TIME_DIM // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float64) / half)
    a = t[:, None] * freqs[None]
    return torch.cat([torch.cos(a), torch.sin(a)], dim=-1)


def rope_table(axes, ids):
    """cos, sin [T, D/2]: angle i of a token rotates the pair (2i, 2i+1) of each head."""
    ang = []
    for a, dim in enumerate(axes):
        freqs = 1.0 / 10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        ang.append(ids[:, a:a + 1] * freqs[None])
    ang = torch.cat(ang, dim=-1)
    return torch.cos(ang), torch.sin(ang)


def apply_rope(x, cos, sin):
    # x [B, T, H, D]; pairs are adjacent (diffusers' use_real_unbind_dim=-1)
    B, T, H, D = x.shape
    xr = x.reshape(B, T, H, D // 2, 2)
    a, b = xr[..., 0], xr[..., 1]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.stack([a * c - b * s, b * c + a * s], dim=-1).reshape(B, T, H, D)


def layer_norm(x):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + EPS)


def rms_norm(x, w):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


def gelu_tanh(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def modulate(x, shift, scale):
    return layer_norm(x) * (1 + scale[:, None]) + shift[:, None]


def forward(W, cfg, x, txt, pooled, t, g, img_ids, txt_ids):
    """diffusers' FluxTransformer2DModel.forward (patch_size 1): the velocity [B, Ti, Cout]."""
    D, H, inner, _, _ = sizes(cfg)
    B, Tt = txt.shape[0], txt.shape[1]

    def lin(n, v):
        return v @ W[n + ".weight"].t() + W[n + ".bias"]

    def embed(n, v):
        return lin(n + ".linear_2", F.silu(lin(n + ".linear_1", v)))

    temb = embed("time_text_embed.timestep_embedder", timestep_features(t * 1000))
    if cfg["guidance_embeds"]:
        temb = temb + embed("time_text_embed.guidance_embedder", timestep_features(g * 1000))
    temb = temb + embed("time_text_embed.text_embedder", pooled)
    stemb = F.silu(temb)
    cos, sin = rope_table(cfg["axes_dims_rope"], torch.cat([txt_ids, img_ids], dim=0))

    def heads(p, proj, norm, v):
        return rms_norm(lin(p + proj, v).reshape(B, v.shape[1], H, D), W[p + norm + ".weight"])

    def attention(q, k, v):
        # [B, T, H, D] each, text tokens first; RoPE on q and k, softmax over all tokens
        q, k = apply_rope(q, cos, sin).transpose(1, 2), apply_rope(k, cos, sin).transpose(1, 2)
        p = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(D), dim=-1)
        return (p @ v.transpose(1, 2)).transpose(1, 2).reshape(B, q.shape[2], inner)

    h, c = lin("x_embedder", x), lin("context_embedder", txt)
    for i in range(cfg["num_layers"]):
        p = f"transformer_blocks.{i}."
        sh, sc, ga, sh2, sc2, ga2 = lin(p + "norm1.linear", stemb).chunk(6, dim=1)
        csh, csc, cga, csh2, csc2, cga2 = lin(p + "norm1_context.linear", stemb).chunk(6, dim=1)
        nh, nc = modulate(h, sh, sc), modulate(c, csh, csc)
        a = p + "attn."
        q = torch.cat([heads(a, "add_q_proj", "norm_added_q", nc), heads(a, "to_q", "norm_q", nh)], dim=1)
        k = torch.cat([heads(a, "add_k_proj", "norm_added_k", nc), heads(a, "to_k", "norm_k", nh)], dim=1)
        v = torch.cat([lin(a + "add_v_proj", nc), lin(a + "to_v", nh)], dim=1).reshape(B, -1, H, D)
        o = attention(q, k, v)
        h = h + ga[:, None] * lin(a + "to_out.0", o[:, Tt:])
        c = c + cga[:, None] * lin(a + "to_add_out", o[:, :Tt])
        h = h + ga2[:, None] * lin(p + "ff.net.2", gelu_tanh(lin(p + "ff.net.0.proj", modulate(h, sh2, sc2))))
        c = c + cga2[:, None] * lin(p + "ff_context.net.2",
                                    gelu_tanh(lin(p + "ff_context.net.0.proj", modulate(c, csh2, csc2))))
    xs = torch.cat([c, h], dim=1)
    for j in range(cfg["num_single_layers"]):
        p = f"single_transformer_blocks.{j}."
        sh, sc, ga = lin(p + "norm.linear", stemb).chunk(3, dim=1)
        nx = modulate(xs, sh, sc)
        mlp = gelu_tanh(lin(p + "proj_mlp", nx))
        a = p + "attn."
        o = attention(heads(a, "to_q", "norm_q", nx), heads(a, "to_k", "norm_k", nx),
                      lin(a + "to_v", nx).reshape(B, -1, H, D))
        xs = xs + ga[:, None] * lin(p + "proj_out", torch.cat([o, mlp], dim=-1))
    # AdaLayerNormContinuous: scale first, then shift
    scale, shift = lin("norm_out.linear", stemb).chunk(2, dim=1)
    return lin("proj_out", modulate(xs[:, Tt:], shift, scale))


def to64(d):
    return {k: torch.tensor(np.asarray(v, dtype=np.float64)) for k, v in d.items()}


def flow_loss(W, cfg, inp):
    """sum over all elements of (model(x_t) - (noise - latents))^2, x_t = (1-s) latents + s noise."""
    s = inp["sigma"][:, None, None]
    x_t = (1 - s) * inp["latents"] + s * inp["noise"]
    pred = forward(W, cfg, x_t, inp["txt"], inp["pooled"], inp["sigma"], inp["guidance"],
                   inp["img_ids"], inp["txt_ids"])
    return ((pred - (inp["noise"] - inp["latents"])) ** 2).sum()


def load_model(d):
    cfg = json.load(open(os.path.join(d, "config.json")))
    W = to64(st.load(os.path.join(d, WEIGHTS)))
    want = param_shapes(cfg)
    missing = sorted(set(want) - set(W))
    extra = sorted(set(W) - set(want))
    if missing or extra:
        sys.exit(f"{d}: missing {missing[:5]}, unexpected {extra[:5]}")
    for k, s in want.items():
        if tuple(W[k].shape) != tuple(s):
            sys.exit(f"{d}: {k} has shape {tuple(W[k].shape)}, expected {s}")
    return cfg, W


def loss_and_grads(cfg, W, inp):
    W = {k: v.clone().requires_grad_(True) for k, v in W.items()}
    loss = flow_loss(W, cfg, inp)
    loss.backward()
    return loss.item(), {k: v.grad for k, v in W.items()}


def make_config(a):
    axes = [int(v) for v in a.axes.split(",")]
    return {"_class_name": "FluxTransformer2DModel", "patch_size": 1, "in_channels": a.in_ch,
            "out_channels": None, "num_layers": a.layers, "num_single_layers": a.single,
            "attention_head_dim": a.head_dim, "num_attention_heads": a.heads,
            "joint_attention_dim": a.joint, "pooled_projection_dim": a.pooled,
            "guidance_embeds": not a.no_guidance, "axes_dims_rope": axes}


def cmd_make(a):
    cfg = make_config(a)
    if sum(cfg["axes_dims_rope"]) != a.head_dim or any(v % 2 for v in cfg["axes_dims_rope"]):
        sys.exit("--axes must be even and add up to --head-dim")
    os.makedirs(a.dir, exist_ok=True)
    st.save(os.path.join(a.dir, WEIGHTS), random_model(cfg, a.seed))
    json.dump(cfg, open(os.path.join(a.dir, "config.json"), "w"), indent=1)


def cmd_inputs(a):
    cfg = json.load(open(os.path.join(a.dir, "config.json")))
    gh, gw = (int(v) for v in a.grid.split(","))
    st.save(a.out, random_inputs(cfg, a.seed, a.batch, a.txt, gh, gw))


def cmd_run(a):
    cfg, W = load_model(a.dir)
    loss, grads = loss_and_grads(cfg, W, to64(st.load(a.inputs)))
    out = {"loss": np.array([loss], dtype=np.float64)}
    out.update({"grad." + k: g.numpy() for k, g in grads.items()})
    st.save(a.out, out)
    print(f"loss {loss:.10g}, {len(grads)} gradients")


def cmd_prepare(a):
    """make, inputs and run in one process (the test runs many models: one torch start each)"""
    cmd_make(a)
    cmd_inputs(argparse.Namespace(dir=a.dir, out=a.inputs, seed=a.seed, batch=a.batch,
                                  txt=a.txt, grid=a.grid))
    cmd_run(argparse.Namespace(dir=a.dir, inputs=a.inputs, out=a.out))


def cmd_compare(a):
    ref, got = st.load(a.ref), st.load(a.got)
    fails, worst = 0, 0.0
    for name in sorted(set(ref) | set(got)):
        if name not in got or name not in ref:
            print(f"FAIL {name}: only in {'REF' if name in ref else 'GOT'}")
            fails += 1
            continue
        r, g = ref[name].astype(np.float64), got[name].astype(np.float64)
        if r.size != g.size:
            print(f"FAIL {name}: {g.size} values, expected {r.size} {list(r.shape)}")
            fails += 1
            continue
        g = g.reshape(r.shape)
        d = np.abs(g - r)
        idx = np.unravel_index(int(np.argmax(d)), r.shape) if r.size else ()
        scale = np.abs(r).max() if r.size else 0.0
        err = d.max() / scale if scale > 0 else d.max()
        bad = not np.isfinite(g).all() or not err <= a.tol
        worst = max(worst, err) if np.isfinite(err) else float("inf")
        wi = ",".join(str(int(v)) for v in idx)
        print(f"{'FAIL' if bad else 'ok  '} {name}: rel err {err:.3e} (worst [{wi}]: got {g[idx]:.8g}"
              f" ref {r[idx]:.8g}; max|ref| {scale:.3e})")
        fails += bad
    print(f"{len(ref)} tensors, worst rel err {worst:.3e}, tolerance {a.tol:g}")
    print(f"flux_ref: {'ok' if not fails else str(fails) + ' failed'}")
    sys.exit(1 if fails else 0)


def cmd_selftest(_):
    fails = 0
    ns = argparse.Namespace(layers=2, single=2, heads=2, head_dim=16, axes="4,6,6", in_ch=8,
                            joint=12, pooled=10, no_guidance=False)
    cfg = make_config(ns)
    W = to64(random_model(cfg, 1))
    inp = to64(random_inputs(cfg, 2, 3, 5, 3, 4))

    # RoPE against complex multiplication by exp(i angle)
    ids = torch.cat([inp["txt_ids"], inp["img_ids"]], dim=0)
    cos, sin = rope_table(cfg["axes_dims_rope"], ids)
    xq = torch.randn(2, ids.shape[0], 2, 16, generator=torch.Generator().manual_seed(3))
    z = torch.view_as_complex(xq.reshape(2, -1, 2, 8, 2).contiguous())
    z = z * torch.polar(torch.ones_like(cos), torch.atan2(sin, cos))[None, :, None, :]
    e = (torch.view_as_real(z).reshape(xq.shape) - apply_rope(xq, cos, sin)).abs().max().item()
    print(f"rope vs complex rotation: max abs diff {e:.2e}")
    fails += e > 1e-12

    # the gradients against central differences of the loss
    loss, grads = loss_and_grads(cfg, W, inp)
    zero = [k for k, g in grads.items() if not torch.isfinite(g).all() or g.abs().max() == 0]
    print(f"loss {loss:.10g}; {len(grads)} gradients, {len(zero)} zero or not finite {zero[:3]}")
    fails += len(zero) > 0
    h = 1e-5
    gen = np.random.default_rng(4)
    for name in ("time_text_embed.guidance_embedder.linear_1.weight",
                 "transformer_blocks.0.attn.norm_added_k.weight", "transformer_blocks.1.norm1.linear.weight",
                 "single_transformer_blocks.0.proj_out.weight", "x_embedder.bias"):
        g = grads[name]
        for _ in range(3):
            idx = tuple(int(gen.integers(n)) for n in g.shape)
            w = W[name]
            old = w[idx].item()
            with torch.no_grad():
                w[idx] = old + h
                lp = flow_loss(W, cfg, inp).item()
                w[idx] = old - h
                lm = flow_loss(W, cfg, inp).item()
                w[idx] = old
            fd = (lp - lm) / (2 * h)
            err = abs(fd - g[idx].item()) / g.abs().max().item()
            print(f"  {name}{list(idx)}: grad {g[idx].item():+.10e} fd {fd:+.10e} rel err {err:.1e}")
            fails += err > 1e-6

    # batch order: the output of a permuted batch is the permuted output, and equals each
    # sample run alone
    def out(sel):
        s = inp["sigma"][sel]
        x_t = (1 - s[:, None, None]) * inp["latents"][sel] + s[:, None, None] * inp["noise"][sel]
        return forward(W, cfg, x_t, inp["txt"][sel], inp["pooled"][sel], s, inp["guidance"][sel],
                       inp["img_ids"], inp["txt_ids"])
    with torch.no_grad():
        base = out(torch.arange(3))
        perm = torch.tensor([2, 0, 1])
        e1 = (out(perm) - base[perm]).abs().max().item()
        e2 = max((out(torch.tensor([b]))[0] - base[b]).abs().max().item() for b in range(3))
    print(f"batch order: max abs diff {e1:.2e}; one sample at a time: {e2:.2e} (|out| {base.abs().max():.3g})")
    fails += e1 > 1e-12 or e2 > 1e-12

    # without the guidance embedder the guidance input is ignored
    cfg2 = dict(cfg, guidance_embeds=False)
    W2 = to64(random_model(cfg2, 5))
    inp2 = dict(inp, guidance=inp["guidance"] + 1)
    e3 = abs(flow_loss(W2, cfg2, inp).item() - flow_loss(W2, cfg2, inp2).item())
    print(f"no guidance_embeds: {len(W2)} tensors, loss change with the guidance {e3:.1e}")
    fails += e3 != 0 or any("guidance" in k for k in W2)
    print(f"flux_ref selftest: {'ok' if not fails else str(fails) + ' failed'}")
    sys.exit(1 if fails else 0)


def cmd_sample(a):
    """diffusers' FluxPipeline sampling from the noise turbozero's sample started at (its file's
    "noise"): sigmas linspace(1, 1/S, S), shifted (calculate_shift and time_shift, as with
    use_dynamic_shifting, for a guidance model; none without guidance; or a static --shift),
    then Euler steps to sigma 0; exits 1 unless the latents agree to TOL of their largest."""
    import h5py
    cfg, W = load_model(a.dir)
    with h5py.File(a.prompts, "r") as f:
        txt, pooled = np.asarray(f["txt"]), np.asarray(f["pooled"])
        img_ids, txt_ids = np.asarray(f["img_ids"]), np.asarray(f["txt_ids"])
    with h5py.File(a.samples, "r") as f:
        got, noise = np.asarray(f["latents"]), np.asarray(f["noise"])
        rows, S = np.asarray(f.attrs["rows"]), int(f.attrs["steps"][0])
        guidance = float(f.attrs["guidance"][0])
    n, Ti = noise.shape[0], noise.shape[1]
    sig = np.linspace(1.0, 1.0 / S, S)
    if a.shift:
        sig = a.shift * sig / (1 + (a.shift - 1) * sig)
    elif cfg["guidance_embeds"]:
        m = (1.15 - 0.5) / (4096 - 256)
        mu = Ti * m + 0.5 - m * 256
        sig = math.exp(mu) / (math.exp(mu) + (1 / sig - 1))
    sig = np.append(sig, 0.0)
    t64 = lambda v: torch.tensor(np.asarray(v, dtype=np.float64))  # noqa: E731
    x = t64(noise)
    txt, pooled, img_ids, txt_ids = t64(txt[rows]), t64(pooled[rows]), t64(img_ids), t64(txt_ids)
    g = torch.full((n,), guidance)
    with torch.no_grad():
        for i in range(S):
            v = forward(W, cfg, x, txt, pooled, torch.full((n,), float(sig[i])), g, img_ids, txt_ids)
            x = x + float(sig[i + 1] - sig[i]) * v
    err = float((x - t64(got)).abs().max() / x.abs().max())
    print(f"{n} samples of {Ti} tokens, {S} steps: max|got-ref|/max|ref| {err:.3g}")
    sys.exit(0 if np.isfinite(err) and err <= a.tol else 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    def model_args(m):
        m.add_argument("--seed", type=int, required=True)
        m.add_argument("--layers", type=int, default=2)
        m.add_argument("--single", type=int, default=2)
        m.add_argument("--heads", type=int, default=2)
        m.add_argument("--head-dim", type=int, default=16)
        m.add_argument("--axes", default="4,6,6")
        m.add_argument("--in", dest="in_ch", type=int, default=8)
        m.add_argument("--joint", type=int, default=12)
        m.add_argument("--pooled", type=int, default=10)
        m.add_argument("--no-guidance", action="store_true")
    m = sub.add_parser("make")
    m.add_argument("dir")
    model_args(m)
    p = sub.add_parser("prepare")
    p.add_argument("dir")
    p.add_argument("inputs")
    p.add_argument("out")
    model_args(p)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--txt", type=int, default=5)
    p.add_argument("--grid", default="3,4")
    i = sub.add_parser("inputs")
    i.add_argument("dir")
    i.add_argument("out")
    i.add_argument("--seed", type=int, required=True)
    i.add_argument("--batch", type=int, default=2)
    i.add_argument("--txt", type=int, default=5)
    i.add_argument("--grid", default="3,4")
    r = sub.add_parser("run")
    r.add_argument("dir")
    r.add_argument("inputs")
    r.add_argument("out")
    c = sub.add_parser("compare")
    c.add_argument("ref")
    c.add_argument("got")
    c.add_argument("--tol", type=float, default=1e-4)
    sm = sub.add_parser("sample")
    sm.add_argument("dir")
    sm.add_argument("prompts")
    sm.add_argument("samples")
    sm.add_argument("--shift", type=float, default=0.0)
    sm.add_argument("--tol", type=float, default=1e-4)
    sub.add_parser("selftest")
    a = ap.parse_args()
    {"make": cmd_make, "prepare": cmd_prepare, "inputs": cmd_inputs, "run": cmd_run,
     "compare": cmd_compare, "sample": cmd_sample, "selftest": cmd_selftest}[a.cmd](a)


if __name__ == "__main__":
    main()

"""Reference check of turbozero's Llama against an independent PyTorch implementation of
HF LlamaForCausalLM semantics (fp64): loss and the gradient of every trainable tensor.

usage: llama_ref.py MODEL_DIR DUMP.safetensors MODE(lora|full) ALPHA [TOL]
MODEL_DIR may hold one model.safetensors or shards with model.safetensors.index.json (F32,
F16 or BF16), and rope_scaling of type llama3 in its config.json.
Exits 1 if any relative error exceeds TOL (default 1e-4)."""
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st  # noqa: E402

torch.set_default_dtype(torch.float64)


def rms_norm(x, w, eps):
    var = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(var + eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def llama3_inv_freq(inv, rs):
    # Llama 3.1's RoPE scaling (Meta's apply_scaling; HF rope_type "llama3"), in fp32:
    # wavelengths shorter than L / high_freq_factor are kept, longer than L / low_freq_factor
    # divided by factor, and in between interpolated by smooth = (L / wavelen - low) / (high - low).
    factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    L = rs["original_max_position_embeddings"]
    out = []
    for f in inv.tolist():
        f = torch.tensor(f, dtype=torch.float32)
        wl = 2 * math.pi / f
        if wl < L / high:
            g = f
        elif wl > L / low:
            g = f / factor
        else:
            smooth = (L / wl - low) / (high - low)
            g = (1 - smooth) * f / factor + smooth * f
        out.append(float(g))
    return torch.tensor(out, dtype=torch.float32)


def rope(x, theta, rs=None):
    # x: [B, H, T, D]; HF computes inv_freq and the angles in fp32
    D, T = x.shape[-1], x.shape[-2]
    inv = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))
    if rs is not None:
        inv = llama3_inv_freq(inv, rs)
    t = torch.arange(T, dtype=torch.int64).float()
    freqs = torch.outer(t.float(), inv.float()).to(torch.float32)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    return x * cos + rotate_half(x) * sin


def main():
    model_dir, dump_path, mode, alpha = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    tol = float(sys.argv[5]) if len(sys.argv) > 5 else 1e-4
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    index = os.path.join(model_dir, "model.safetensors.index.json")
    files = (sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index)
             else ["model.safetensors"])
    W = {}
    for f in files:
        W.update({k: torch.tensor(v.astype("float64")) for k, v in st.load(os.path.join(model_dir, f)).items()})
    rs = cfg.get("rope_scaling")
    if rs is not None:
        assert rs.get("rope_type", rs.get("type")) == "llama3", rs
    dump = st.load(dump_path)
    C = cfg["hidden_size"]
    H = cfg["num_attention_heads"]
    KV = cfg.get("num_key_value_heads", H)
    D = cfg.get("head_dim", C // H)
    eps = cfg.get("rms_norm_eps", 1e-6)
    theta = cfg.get("rope_theta", 10000.0)
    tied = cfg.get("tie_word_embeddings", False)
    L = cfg["num_hidden_layers"]

    lora = {}
    for k, v in dump.items():
        if k.startswith("w:"):
            lora[k[2:]] = torch.tensor(v, dtype=torch.float64)
    params = lora if mode == "lora" else W
    for p in params.values():
        p.requires_grad_(True)

    inputs = torch.tensor(dump["inputs"].astype("int64"))
    targets = torch.tensor(dump["targets"].astype("int64"))
    B, T = inputs.shape

    def linear(x, layer, blk, proj):
        name = f"model.layers.{layer}.{blk}.{proj}.weight"
        y = x @ W[name].t()
        bias = name[:-len("weight")] + "bias"  # Qwen2's q, k and v projections
        if bias in W:
            y = y + W[bias]
        a = f"base_model.model.model.layers.{layer}.{blk}.{proj}.lora_A.weight"
        if a in lora:
            b = a.replace("lora_A", "lora_B")
            r = lora[a].shape[0]
            y = y + (alpha / r) * ((x @ lora[a].t()) @ lora[b].t())
        return y

    x = W["model.embed_tokens.weight"][inputs]
    mask = torch.full((T, T), float("-inf")).triu(1)
    for i in range(L):
        h = rms_norm(x, W[f"model.layers.{i}.input_layernorm.weight"], eps)
        q = linear(h, i, "self_attn", "q_proj").view(B, T, H, D)
        k = linear(h, i, "self_attn", "k_proj").view(B, T, KV, D)
        if cfg.get("model_type") == "qwen3":  # Qwen3: each head through its RMSNorm
            q = rms_norm(q, W[f"model.layers.{i}.self_attn.q_norm.weight"], eps)
            k = rms_norm(k, W[f"model.layers.{i}.self_attn.k_norm.weight"], eps)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = linear(h, i, "self_attn", "v_proj").view(B, T, KV, D).transpose(1, 2)
        q, k = rope(q, theta, rs), rope(k, theta, rs)
        k = k.repeat_interleave(H // KV, dim=1)
        v = v.repeat_interleave(H // KV, dim=1)
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D) + mask, dim=-1) @ v
        att = att.transpose(1, 2).reshape(B, T, H * D)
        x = x + linear(att, i, "self_attn", "o_proj")
        h = rms_norm(x, W[f"model.layers.{i}.post_attention_layernorm.weight"], eps)
        g = linear(h, i, "mlp", "gate_proj")
        u = linear(h, i, "mlp", "up_proj")
        x = x + linear(torch.nn.functional.silu(g) * u, i, "mlp", "down_proj")
    x = rms_norm(x, W["model.norm.weight"], eps)
    head = W["model.embed_tokens.weight"] if tied else W["lm_head.weight"]
    logits = x @ head.t()
    loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1),
                                             ignore_index=-1)
    loss.backward()

    fails = 0
    lc = float(dump["loss"][0])
    lerr = abs(lc - loss.item()) / abs(loss.item())
    print(f"loss: turbozero {lc:.8f} torch {loss.item():.8f} rel err {lerr:.2e}")
    fails += lerr > tol
    checked = 0
    worst = 0.0
    for name, p in params.items():
        key = "g:" + name
        if key not in dump:
            print(f"FAIL {name}: no gradient in the dump")
            fails += 1
            continue
        gc = torch.tensor(dump[key], dtype=torch.float64)
        ref = p.grad
        err = (gc - ref).norm().item() / max(ref.norm().item(), 1e-30)
        worst = max(worst, err)
        checked += 1
        if err > tol or not torch.isfinite(gc).all():
            print(f"FAIL {name}: rel err {err:.3e} (|ref| {ref.norm().item():.3e})")
            fails += 1
    extra = [k for k in dump if k.startswith("g:") and k[2:] not in params]
    if extra:
        print(f"FAIL gradients for tensors that should be frozen: {extra[:5]}")
        fails += 1
    print(f"{checked} gradients checked, worst rel err {worst:.3e}, tolerance {tol:g}")
    print(f"llama_ref: {checked + 1 - fails} passed, {fails} failed")
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()

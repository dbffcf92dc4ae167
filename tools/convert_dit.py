#!/usr/bin/env python3
"""Convert a published DiT checkpoint into a turbozero DiT folder: config.json and
model.safetensors with the original DiT state_dict names (docs/dit.md, "Parameter names and
checkpoint conversion").

  convert_dit.py original CKPT.pt OUT_DIR [--image-size N | --input-size N]
                 [--num-classes N] [--num-heads N] [--dtype f32|bf16] [--allow-pickle] [--force]
  convert_dit.py diffusers DIR OUT_DIR [--dtype f32|bf16] [--force]

`original` reads a checkpoint of facebookresearch/DiT (DiT-XL-2-256x256.pt as published: a
plain state_dict; or a training checkpoint, whose "ema" weights are taken, else "model").
`diffusers` reads a DiTTransformer2DModel (pipeline folder with transformer/, or the
transformer folder itself; one safetensors file, a sharded one with its index, or a .bin).

Needs numpy; reading a .pt needs torch. No other package (safetensors is read and written
here). Bad input stops with a message naming the file and exit status 2.
"""
import argparse
import inspect
import json
import os
import re
import struct
import sys

import numpy as np

EXIT_BAD = 2
# DiT's standard widths (models.py): S, B, L, XL -> attention heads
STANDARD_HEADS = {384: 6, 768: 12, 1024: 16, 1152: 16}
# safetensors dtypes read (stored little-endian) and what they become in memory (float32)
READ_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2")}
TIMESTEP_NOTE = ("note: diffusers computes the timestep features with downscale_freq_shift=1; "
                 "turbozero uses the original DiT's features, those the published DiT weights "
                 "were trained with (a DiT trained in diffusers sees slightly different time "
                 "features here)")


class Bad(Exception):
    """Bad input: reported as one line and exit status 2."""


def prod(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def shape_str(shape):
    return "[" + ", ".join(str(s) for s in shape) + "]"


# ---------------------------------------------------------------- safetensors

def st_header(path):
    """(header dict, data start, file size) of a safetensors file, checked."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise Bad(f"{path}: cannot open: {e.strerror}")
    with f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(8)
        if len(head) < 8:
            raise Bad(f"{path}: not a safetensors file (shorter than 8 bytes)")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8 or n > (256 << 20):
            raise Bad(f"{path}: not a safetensors file (header length {n}, file size {size})")
        try:
            header = json.loads(f.read(n).decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise Bad(f"{path}: not a safetensors file (its header is not JSON)")
    if not isinstance(header, dict):
        raise Bad(f"{path}: not a safetensors file (its header is not a JSON object)")
    return header, 8 + n, size


def st_read(path, names=None):
    """Tensors of a safetensors file as float32 numpy arrays ({name: array}); names, when
    given, restricts the read to those (each must be present)."""
    header, base, size = st_header(path)
    if names is not None:
        for name in names:
            if name not in header or name == "__metadata__":
                raise Bad(f"{path}: missing tensor \"{name}\" (its index lists it in this file)")
    out = {}
    with open(path, "rb") as f:
        for name, t in header.items():
            if name == "__metadata__" or (names is not None and name not in names):
                continue
            try:
                dt, shape, (b, e) = t["dtype"], [int(s) for s in t["shape"]], t["data_offsets"]
                b, e = int(b), int(e)
            except (KeyError, TypeError, ValueError):
                raise Bad(f"{path}: tensor \"{name}\": malformed header entry")
            if dt not in READ_DTYPES:
                raise Bad(f"{path}: tensor \"{name}\" is {dt}; F32, F16 and BF16 are read")
            count = prod(shape)
            if min(shape, default=1) < 0 or b < 0 or e - b != count * READ_DTYPES[dt].itemsize \
                    or base + e > size:
                raise Bad(f"{path}: tensor \"{name}\": data_offsets [{b}, {e}] do not fit "
                          f"{dt} {shape_str(shape)} in a file of {size} bytes")
            f.seek(base + b)
            raw = np.fromfile(f, dtype=READ_DTYPES[dt], count=count)
            if raw.size != count:
                raise Bad(f"{path}: tensor \"{name}\": file truncated")
            if dt == "BF16":
                arr = (raw.astype(np.uint32) << 16).view(np.float32)
            else:
                arr = raw.astype(np.float32)
            out[name] = arr.reshape(shape)
    return out


def to_bf16_bits(a):
    """float32 -> bfloat16 bits, round to nearest even (NaN stays NaN)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(a)
    if nan.any():
        r[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return r


def write_atomic(path, write):
    """Runs write(file) on PATH.tmp.<pid> and renames it to PATH."""
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def st_write(path, tensors, dtype, metadata):
    """tensors ({name: float32 array}) as F32 or BF16 (dtype "f32" / "bf16"), names sorted."""
    order = sorted(tensors)
    width = 4 if dtype == "f32" else 2
    header, off = {"__metadata__": metadata}, 0
    for name in order:
        a = tensors[name]
        header[name] = {"dtype": "F32" if dtype == "f32" else "BF16", "shape": list(a.shape),
                        "data_offsets": [off, off + a.size * width]}
        off += a.size * width
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)

    def write(f):
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for name in order:
            a = tensors[name]
            data = np.ascontiguousarray(a, dtype="<f4") if dtype == "f32" else \
                to_bf16_bits(a).astype("<u2")
            f.write(data.tobytes())
    write_atomic(path, write)


# ---------------------------------------------------------------- the DiT layout

def dit_shapes(c):
    """The original DiT state_dict (pos_embed aside): name -> shape."""
    D, C, p, F = c["hidden_size"], c["in_channels"], c["patch_size"], c["mlp_width"]
    rows = c["num_classes"] + (1 if c["class_dropout_prob"] > 0 else 0)
    cout = 2 * C if c["learn_sigma"] else C
    s = {"x_embedder.proj.weight": [D, C, p, p], "x_embedder.proj.bias": [D],
         "t_embedder.mlp.0.weight": [D, c["frequency_embedding_size"]],
         "t_embedder.mlp.0.bias": [D], "t_embedder.mlp.2.weight": [D, D],
         "t_embedder.mlp.2.bias": [D], "y_embedder.embedding_table.weight": [rows, D]}
    for i in range(c["depth"]):
        b = f"blocks.{i}."
        s.update({b + "adaLN_modulation.1.weight": [6 * D, D], b + "adaLN_modulation.1.bias": [6 * D],
                  b + "attn.qkv.weight": [3 * D, D], b + "attn.qkv.bias": [3 * D],
                  b + "attn.proj.weight": [D, D], b + "attn.proj.bias": [D],
                  b + "mlp.fc1.weight": [F, D], b + "mlp.fc1.bias": [F],
                  b + "mlp.fc2.weight": [D, F], b + "mlp.fc2.bias": [D]})
    s.update({"final_layer.adaLN_modulation.1.weight": [2 * D, D],
              "final_layer.adaLN_modulation.1.bias": [2 * D],
              "final_layer.linear.weight": [p * p * cout, D], "final_layer.linear.bias": [p * p * cout]})
    return s


def pos_embed_table(D, grid):
    """DiT's get_2d_sincos_pos_embed(D, grid) as float32 [1, grid*grid, D] (same numpy steps)."""
    g = np.arange(grid, dtype=np.float32)
    mesh = np.stack(np.meshgrid(g, g), axis=0).reshape([2, 1, grid, grid])

    def one(dim, pos):
        omega = np.arange(dim // 2, dtype=np.float64)
        omega /= dim / 2.0
        omega = 1.0 / 10000 ** omega
        out = np.einsum("m,d->md", pos.reshape(-1), omega)
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)

    emb = np.concatenate([one(D // 2, mesh[0]), one(D // 2, mesh[1])], axis=1)
    return emb.astype(np.float32)[None]


def check_dims(c, src):
    D, H = c["hidden_size"], c["num_heads"]
    if D % H or D % 4:
        raise Bad(f"{src}: hidden size {D} must be a multiple of num_heads {H} and of 4")
    if c["input_size"] % c["patch_size"]:
        raise Bad(f"{src}: input size {c['input_size']} is not a multiple of the patch size "
                  f"{c['patch_size']}")
    if c["frequency_embedding_size"] % 2:
        raise Bad(f"{src}: timestep feature size {c['frequency_embedding_size']} is odd")


def check_tensors(c, tensors, where):
    """Every tensor of dit_shapes(c) present with its shape, nothing else (pos_embed aside).
    where(name) names the file (and source key) a tensor came from."""
    want = dit_shapes(c)
    for name, shape in want.items():
        if name not in tensors:
            raise Bad(f"{where(name)}: missing tensor \"{name}\"")
        if list(tensors[name].shape) != shape:
            raise Bad(f"{where(name)}: tensor \"{name}\" is {shape_str(tensors[name].shape)}, "
                      f"expected {shape_str(shape)} for this model")
    for name in tensors:
        if name not in want and name != "pos_embed":
            raise Bad(f"{where(name)}: unexpected tensor \"{name}\" (not part of a DiT)")
    if "pos_embed" in tensors:
        T = (c["input_size"] // c["patch_size"]) ** 2
        if list(tensors["pos_embed"].shape) != [1, T, c["hidden_size"]]:
            raise Bad(f"{where('pos_embed')}: tensor \"pos_embed\" is "
                      f"{shape_str(tensors['pos_embed'].shape)}, expected "
                      f"{shape_str([1, T, c['hidden_size']])}")


def classes_from_rows(rows, given, src, key):
    """(num_classes, class_dropout_prob) from the label table's row count: DiT keeps one more
    row (the null class) when class dropout is on, as its published models do (0.1)."""
    if given is None:
        if rows < 2:
            raise Bad(f"{src}: \"{key}\" has {rows} row(s); give --num-classes")
        return rows - 1, 0.1
    if rows == given + 1:
        return given, 0.1
    if rows == given:
        return given, 0.0
    raise Bad(f"{src}: \"{key}\" has {rows} rows, which fits neither {given} classes nor "
              f"{given} + 1 (the null class)")


def mlp_ratio_of(D, F, src, key):
    r = F / D
    if int(D * r) != F:
        raise Bad(f"{src}: \"{key}\" width {F} is not int({D} * mlp_ratio) for any ratio")
    return r


# ---------------------------------------------------------------- original DiT checkpoints

def torch_load(path, allow_pickle):
    try:
        import torch
    except ImportError:
        raise Bad(f"{path}: reading a .pt checkpoint needs PyTorch (torch), which this Python lacks")
    if not os.path.isfile(path):
        raise Bad(f"{path}: no such file")
    kw = {"map_location": "cpu"}
    safe = "weights_only" in inspect.signature(torch.load).parameters
    if safe:
        kw["weights_only"] = not allow_pickle
    try:
        obj = torch.load(path, **kw)
    except Exception as e:  # torch raises many kinds for a file that is no checkpoint
        msg = " ".join(str(e).split())
        if "WeightsUnpickler error:" in msg:
            why = msg.split("WeightsUnpickler error:", 1)[1].strip()[:200]
            raise Bad(f"{path}: holds more than tensors ({why}); if you trust the file, "
                      "--allow-pickle reads it with full unpickling")
        raise Bad(f"{path}: cannot be read as a PyTorch checkpoint ({type(e).__name__}: {msg[:200]})")
    return obj, torch


def original_state_dict(path, allow_pickle):
    obj, torch = torch_load(path, allow_pickle)
    if not isinstance(obj, dict):
        raise Bad(f"{path}: holds a {type(obj).__name__}, expected a state_dict (a dict of tensors)")
    if not any(isinstance(k, str) and k.startswith("blocks.") for k in obj):
        for key in ("ema", "model", "state_dict"):
            if isinstance(obj.get(key), dict):
                print(f"{path}: reading its \"{key}\" weights")
                obj = obj[key]
                break
        else:
            keys = ", ".join(str(k) for k in list(obj)[:6])
            raise Bad(f"{path}: no DiT state_dict (no blocks.* tensors, no \"ema\" or \"model\" "
                      f"entry; keys: {keys})")
    if obj and all(isinstance(k, str) and k.startswith("module.") for k in obj):
        obj = {k[len("module."):]: v for k, v in obj.items()}
    sd = {}
    for k, v in obj.items():
        if not isinstance(v, torch.Tensor):
            raise Bad(f"{path}: entry \"{k}\" is a {type(v).__name__}, not a tensor")
        if v.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise Bad(f"{path}: tensor \"{k}\" is {v.dtype}; float32, float16 and bfloat16 are read")
        sd[k] = v.detach().to(torch.float32).contiguous().numpy()
    if "pos_embed.proj.weight" in sd or any(k.startswith("transformer_blocks.") for k in sd):
        raise Bad(f"{path}: holds diffusers names (pos_embed.proj, transformer_blocks.*): "
                  "convert its folder with `diffusers`")
    return sd


def need(sd, path, name, ndim):
    if name not in sd:
        raise Bad(f"{path}: missing tensor \"{name}\"")
    if sd[name].ndim != ndim:
        raise Bad(f"{path}: tensor \"{name}\" is {shape_str(sd[name].shape)}, expected {ndim} dims")
    return sd[name].shape


def convert_original(args):
    path = args.src
    sd = original_state_dict(path, args.allow_pickle)
    D, C, p, p2 = need(sd, path, "x_embedder.proj.weight", 4)
    if p != p2:
        raise Bad(f"{path}: \"x_embedder.proj.weight\" has a {p}x{p2} kernel; DiT patches are square")
    freq = need(sd, path, "t_embedder.mlp.0.weight", 2)[1]
    rows = need(sd, path, "y_embedder.embedding_table.weight", 2)[0]
    idx = {int(m.group(1)) for k in sd for m in [re.match(r"blocks\.(\d+)\.", k)] if m}
    if not idx:
        raise Bad(f"{path}: missing tensor \"blocks.0.attn.qkv.weight\" (no blocks.* tensors)")
    depth = max(idx) + 1
    F = need(sd, path, "blocks.0.mlp.fc1.weight", 2)[0]
    out = need(sd, path, "final_layer.linear.weight", 2)[0]
    if out == p * p * C:
        sigma = False
    elif out == 2 * p * p * C:
        sigma = True
    else:
        raise Bad(f"{path}: \"final_layer.linear.weight\" has {out} outputs; a patch {p} model "
                  f"with {C} channels has {p * p * C} (or {2 * p * p * C} with learn_sigma)")
    heads = args.num_heads or STANDARD_HEADS.get(D)
    if not heads:
        raise Bad(f"{path}: hidden size {D} is none of DiT's standard sizes "
                  f"({', '.join(map(str, STANDARD_HEADS))}); give --num-heads")
    # latent side: --input-size, --image-size / 8 (the SD VAE), or pos_embed's token count
    from_pos = None
    if "pos_embed" in sd:
        pe = sd["pos_embed"].shape
        g = int(round((pe[-2] if len(pe) >= 2 else 0) ** 0.5))
        if len(pe) != 3 or g * g != pe[1]:
            raise Bad(f"{path}: tensor \"pos_embed\" is {shape_str(pe)}, expected [1, T, {D}] "
                      "with T a square")
        from_pos = g * p
    if args.input_size:
        size, how = args.input_size, f"--input-size {args.input_size}"
    elif args.image_size:
        if args.image_size % 8:
            raise Bad(f"--image-size {args.image_size} is not a multiple of 8 (the VAE's factor)")
        size, how = args.image_size // 8, f"--image-size {args.image_size}"
    elif from_pos:
        size, how = from_pos, None
    else:
        raise Bad(f"{path}: has no pos_embed to tell the input size: give --image-size "
                  "(256 or 512 for the published models) or --input-size (latent side)")
    if how and from_pos and size != from_pos:
        raise Bad(f"{path}: {how} means input size {size}, but its pos_embed is for "
                  f"{from_pos} (patch {p})")
    classes, drop = classes_from_rows(rows, args.num_classes, path, "y_embedder.embedding_table.weight")
    c = {"input_size": size, "patch_size": p, "in_channels": C, "hidden_size": D, "depth": depth,
         "num_heads": heads, "mlp_ratio": mlp_ratio_of(D, F, path, "blocks.0.mlp.fc1.weight"),
         "class_dropout_prob": drop, "num_classes": classes, "learn_sigma": sigma,
         "frequency_embedding_size": freq, "mlp_width": F}
    check_dims(c, path)
    check_tensors(c, sd, lambda name: path)
    return c, sd


# ---------------------------------------------------------------- diffusers folders

def read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        raise Bad(f"{path}: cannot read: {e.strerror}")
    except (UnicodeDecodeError, ValueError) as e:
        raise Bad(f"{path}: not valid JSON ({e})")


def diffusers_weights(tdir, allow_pickle):
    """{diffusers name: float32 array} and {name: file it came from}."""
    index = os.path.join(tdir, "diffusion_pytorch_model.safetensors.index.json")
    single = os.path.join(tdir, "diffusion_pytorch_model.safetensors")
    binf = os.path.join(tdir, "diffusion_pytorch_model.bin")
    tensors, origin = {}, {}
    if os.path.isfile(index):
        idx = read_json(index)
        wm = idx.get("weight_map") if isinstance(idx, dict) else None
        if not isinstance(wm, dict) or not wm:
            raise Bad(f"{index}: no \"weight_map\" object")
        shards = {}
        for name, shard in wm.items():
            if not isinstance(shard, str) or os.path.basename(shard) != shard:
                raise Bad(f"{index}: \"{name}\" maps to {shard!r}, not a file name beside the index")
            shards.setdefault(shard, []).append(name)
        for shard, names in sorted(shards.items()):
            sp = os.path.join(tdir, shard)
            if not os.path.isfile(sp):
                raise Bad(f"{index}: shard {shard} (holding \"{names[0]}\") does not exist")
            got = st_read(sp, set(names))
            tensors.update(got)
            origin.update({n: sp for n in got})
    elif os.path.isfile(single):
        tensors = st_read(single)
        origin = {n: single for n in tensors}
    elif os.path.isfile(binf):
        obj, torch = torch_load(binf, allow_pickle)
        if not isinstance(obj, dict):
            raise Bad(f"{binf}: holds a {type(obj).__name__}, expected a state_dict")
        for k, v in obj.items():
            if not isinstance(v, torch.Tensor) or v.dtype not in (torch.float32, torch.float16,
                                                                 torch.bfloat16):
                raise Bad(f"{binf}: entry \"{k}\" is not a float32, float16 or bfloat16 tensor")
            tensors[k] = v.detach().to(torch.float32).contiguous().numpy()
        origin = {n: binf for n in tensors}
    else:
        raise Bad(f"{tdir}: no weights (diffusion_pytorch_model.safetensors, its .index.json, "
                  "or diffusion_pytorch_model.bin)")
    return tensors, origin


def cfg_int(cfg, path, key, required=True, default=None):
    v = cfg.get(key, default)
    if v is None and not required:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise Bad(f"{path}: key \"{key}\" is {json.dumps(v) if key in cfg else 'missing'}, "
                  "expected a positive integer")
    return v


def convert_diffusers(args):
    src = args.src
    if not os.path.isdir(src):
        raise Bad(f"{src}: not a folder (expected a diffusers pipeline or transformer folder)")
    tdir = None
    for d in (os.path.join(src, "transformer"), src):
        if os.path.isfile(os.path.join(d, "config.json")):
            tdir = d
            break
    if tdir is None:
        raise Bad(f"{src}: no config.json (looked for {os.path.join(src, 'transformer', 'config.json')} "
                  f"and {os.path.join(src, 'config.json')})")
    cpath = os.path.join(tdir, "config.json")
    cfg = read_json(cpath)
    if not isinstance(cfg, dict):
        raise Bad(f"{cpath}: expected a JSON object")
    cls = cfg.get("_class_name")
    if cls not in (None, "DiTTransformer2DModel", "Transformer2DModel"):
        raise Bad(f"{cpath}: a {cls}, not a DiT (DiTTransformer2DModel or Transformer2DModel)")
    norm = cfg.get("norm_type", "layer_norm" if cls == "Transformer2DModel" else "ada_norm_zero")
    if norm != "ada_norm_zero":
        raise Bad(f"{cpath}: norm_type {json.dumps(norm)}: a DiT has \"ada_norm_zero\"")
    heads = cfg_int(cfg, cpath, "num_attention_heads")
    D = heads * cfg_int(cfg, cpath, "attention_head_dim")
    C = cfg_int(cfg, cpath, "in_channels")
    cout = cfg_int(cfg, cpath, "out_channels", required=False) or C
    depth = cfg_int(cfg, cpath, "num_layers")
    size = cfg_int(cfg, cpath, "sample_size")
    p = cfg_int(cfg, cpath, "patch_size")
    classes = cfg_int(cfg, cpath, "num_embeds_ada_norm")
    if cout not in (C, 2 * C):
        raise Bad(f"{cpath}: out_channels {cout} is neither in_channels {C} nor 2 x {C} (learn_sigma)")

    src_t, origin = diffusers_weights(tdir, args.allow_pickle)
    used = set()

    def take(name):
        if name not in src_t:
            files = sorted(set(origin.values())) or [tdir]
            raise Bad(f"{', '.join(files)}: missing tensor \"{name}\"")
        used.add(name)
        return src_t[name]

    sd, back = {}, {}

    def put(dst, *names):
        arrs = [take(n) for n in names]
        if len(arrs) > 1:
            if any(a.ndim != arrs[0].ndim or a.shape[1:] != arrs[0].shape[1:] for a in arrs):
                raise Bad(f"{origin[names[0]]}: {', '.join(names)} have shapes "
                          f"{', '.join(shape_str(a.shape) for a in arrs)}, which do not stack")
            sd[dst] = np.concatenate(arrs, axis=0)
        else:
            sd[dst] = arrs[0]
        back[dst] = f"{origin[names[0]]} (\"{names[0]}\")"

    emb = "transformer_blocks.0.norm1.emb."
    put("x_embedder.proj.weight", "pos_embed.proj.weight")
    put("x_embedder.proj.bias", "pos_embed.proj.bias")
    for a, b in (("0", "linear_1"), ("2", "linear_2")):
        for w in ("weight", "bias"):
            put(f"t_embedder.mlp.{a}.{w}", f"{emb}timestep_embedder.{b}.{w}")
    put("y_embedder.embedding_table.weight", f"{emb}class_embedder.embedding_table.weight")
    for i in range(depth):
        s, d = f"transformer_blocks.{i}.", f"blocks.{i}."
        for w in ("weight", "bias"):
            put(d + "adaLN_modulation.1." + w, s + "norm1.linear." + w)
            put(d + "attn.qkv." + w, *(s + f"attn1.to_{x}.{w}" for x in "qkv"))
            put(d + "attn.proj." + w, s + "attn1.to_out.0." + w)
            put(d + "mlp.fc1." + w, s + "ff.net.0.proj." + w)
            put(d + "mlp.fc2." + w, s + "ff.net.2." + w)
    for w in ("weight", "bias"):
        put("final_layer.adaLN_modulation.1." + w, "proj_out_1." + w)
        put("final_layer.linear." + w, "proj_out_2." + w)
    # every block holds a copy of the embedders; the model uses block 0's
    differ = None
    for i in range(1, depth):
        for tail in ("timestep_embedder.linear_1.weight", "timestep_embedder.linear_1.bias",
                     "timestep_embedder.linear_2.weight", "timestep_embedder.linear_2.bias",
                     "class_embedder.embedding_table.weight"):
            name = f"transformer_blocks.{i}.norm1.emb.{tail}"
            a = take(name)
            if differ is None and (a.shape != src_t[emb + tail].shape or
                                   not np.array_equal(a, src_t[emb + tail])):
                differ = name
    extra = sorted(set(src_t) - used)
    if extra:
        raise Bad(f"{origin[extra[0]]}: unexpected tensor \"{extra[0]}\" (not part of a DiT "
                  f"with num_layers {depth})")
    if differ:
        print(f"warning: \"{differ}\" differs from block 0's copy; turbozero (like the original "
              "DiT) has one timestep and label embedder and takes block 0's", file=sys.stderr)

    w = sd["x_embedder.proj.weight"]
    if list(w.shape) != [D, C, p, p]:
        raise Bad(f"{back['x_embedder.proj.weight']}: is {shape_str(w.shape)}, but {cpath} "
                  f"says {shape_str([D, C, p, p])} (hidden, in_channels, patch_size)")
    rows = sd["y_embedder.embedding_table.weight"].shape[0]
    classes, drop = classes_from_rows(rows, classes, back["y_embedder.embedding_table.weight"],
                                      f"{emb}class_embedder.embedding_table.weight")
    F = sd["blocks.0.mlp.fc1.weight"].shape[0] if sd["blocks.0.mlp.fc1.weight"].ndim == 2 else 0
    c = {"input_size": size, "patch_size": p, "in_channels": C, "hidden_size": D, "depth": depth,
         "num_heads": heads,
         "mlp_ratio": mlp_ratio_of(D, F, back["blocks.0.mlp.fc1.weight"], "ff.net.0.proj.weight"),
         "class_dropout_prob": drop, "num_classes": classes, "learn_sigma": cout == 2 * C,
         "frequency_embedding_size": sd["t_embedder.mlp.0.weight"].shape[-1], "mlp_width": F}
    check_dims(c, cpath)
    check_tensors(c, sd, lambda name: back.get(name, cpath))
    # written as DiT has it (a fixed table), so the folder loads into DiT's models.py strictly
    sd["pos_embed"] = pos_embed_table(D, size // p)
    print(TIMESTEP_NOTE, file=sys.stderr)
    return c, sd


# ---------------------------------------------------------------- output

CONFIG_KEYS = ("input_size", "patch_size", "in_channels", "hidden_size", "depth", "num_heads",
               "mlp_ratio", "class_dropout_prob", "num_classes", "learn_sigma",
               "frequency_embedding_size", "diffusion")


def config_text(c):
    c = dict(c, diffusion="ddpm", mlp_ratio=float(c["mlp_ratio"]),
             class_dropout_prob=float(c["class_dropout_prob"]))
    lines = ['  "architectures": ["DiT"]', '  "model_type": "dit"']
    lines += [f'  "{k}": {json.dumps(c[k])}' for k in CONFIG_KEYS]
    return "{\n" + ",\n".join(lines) + "\n}\n"


def check_out(out, force, src):
    """Refuses an OUT_DIR that is a file, the source, or not empty (unless force)."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise Bad(f"{out}: exists and is not a folder")
    real = os.path.realpath(out)
    if real in (os.path.realpath(src), os.path.realpath(os.path.join(src, "transformer"))):
        raise Bad(f"{out}: is the folder converted; write elsewhere")
    if os.path.isdir(out) and os.listdir(out) and not force:
        raise Bad(f"{out}: exists and is not empty (--force writes into it)")


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="convert_dit.py",
        description="Convert a DiT checkpoint (the original facebookresearch/DiT .pt, or a "
                    "diffusers DiTTransformer2DModel folder) into a turbozero DiT folder: "
                    "config.json and model.safetensors with the original DiT names.")
    sub = ap.add_subparsers(dest="source", metavar="original|diffusers")
    sub.required = True
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--dtype", choices=("f32", "bf16"), default="f32",
                        help="tensor type written (default f32: exact for F32, F16 and BF16 input)")
    common.add_argument("--force", action="store_true", help="write into an existing, non-empty OUT_DIR")
    common.add_argument("--allow-pickle", action="store_true",
                        help="read a .pt/.bin that holds more than tensors (full unpickling: "
                             "only for files you trust)")
    o = sub.add_parser("original", parents=[common], help="a facebookresearch/DiT checkpoint (.pt)")
    o.add_argument("src", metavar="CKPT.pt")
    o.add_argument("out", metavar="OUT_DIR")
    g = o.add_mutually_exclusive_group()
    g.add_argument("--image-size", type=int, help="image side in pixels (latent side = N / 8); "
                   "needed only when the checkpoint has no pos_embed")
    g.add_argument("--input-size", type=int, help="the model's input side (latent pixels)")
    o.add_argument("--num-classes", type=int,
                   help="class count (default: the label table's rows minus the null class)")
    o.add_argument("--num-heads", type=int,
                   help="attention heads (default: DiT's for widths 384, 768, 1024, 1152)")
    d = sub.add_parser("diffusers", parents=[common],
                       help="a diffusers DiT folder (pipeline with transformer/, or the transformer)")
    d.add_argument("src", metavar="DIR")
    d.add_argument("out", metavar="OUT_DIR")
    args = ap.parse_args(argv)
    for k in ("image_size", "input_size", "num_classes", "num_heads"):
        v = getattr(args, k, None)
        if v is not None and v <= 0:
            ap.error(f"--{k.replace('_', '-')} must be positive")
    try:
        if args.source == "original":
            if not os.path.isfile(args.src):
                raise Bad(f"{args.src}: no such file")
        elif not os.path.isdir(args.src):
            raise Bad(f"{args.src}: not a folder (expected a diffusers pipeline or transformer folder)")
        check_out(args.out, args.force, args.src)
        c, sd = convert_original(args) if args.source == "original" else convert_diffusers(args)
        os.makedirs(args.out, exist_ok=True)
        model = os.path.join(args.out, "model.safetensors")
        st_write(model, sd, args.dtype, {"format": "pt", "producer": "turbozero tools/convert_dit.py",
                                         "source": os.path.basename(os.path.normpath(args.src))})
        text = config_text(c)
        write_atomic(os.path.join(args.out, "config.json"), lambda f: f.write(text.encode()))
    except Bad as e:
        print(f"convert_dit: {e}", file=sys.stderr)
        return EXIT_BAD
    except OSError as e:
        print(f"convert_dit: {e.filename or args.out}: {e.strerror}", file=sys.stderr)
        return EXIT_BAD
    n = sum(a.size for k, a in sd.items() if k != "pos_embed")
    print(f"wrote {args.out}: DiT depth {c['depth']}, hidden {c['hidden_size']}, {c['num_heads']} "
          f"heads, patch {c['patch_size']}, input {c['input_size']}x{c['input_size']}x"
          f"{c['in_channels']}{', learn_sigma' if c['learn_sigma'] else ''}, {c['num_classes']} "
          f"classes, {n / 1e6:.2f} M parameters ({args.dtype})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""turbozero's image pipeline outside the C program: the VAE and the text encoders turn images
and captions into the cached-latent files training reads, and sampled latents back into PNGs.
The C program never runs the VAE or a text encoder (docs/dit.md, "Images and latents").

Flux (model.arch = "flux"), a diffusers Flux.1 folder or hub name (dev or schnell):
  latents.py flux-cache  IMAGES OUT.h5 --model M [--size WxH] [--batch B] [--device D]
      every image of IMAGES (captions beside them as NAME.txt, or IMAGES/metadata.jsonl with
      {"file_name": ..., "text": ...} per line) resized to cover WxH (default 1024x1024) and
      centre-cropped, VAE latents (shifted and scaled as the pipeline does, packed 2x2 into
      tokens of 64) and the T5 and CLIP embeddings of its caption: the layout of io/latents_h5.h
  latents.py flux-prompts OUT.h5 --model M (--prompt TEXT ... | --prompts FILE) [--size WxH]
      the text embeddings of prompts, for `turbozero sample --prompts OUT.h5` (the latents
      dataset holds zeros of the image size sampled)
  latents.py flux-decode SAMPLES.h5 OUTDIR --model M
      `turbozero sample`'s latents to OUTDIR/sample_NNNN.png
DiT (model.arch = "dit") on latents of the Stable Diffusion VAE (DiT-XL/2):
  latents.py dit-cache   IMAGES OUT.h5 [--vae V] [--size 256]
      class labels from IMAGES' subfolders (sorted names: 0, 1, ...), latents x 0.18215 as
      "images" [N, 4, size/8, size/8] with "labels": io/images_h5.h's layout
  latents.py dit-decode  SAMPLES.h5 OUTDIR [--vae V]
      `turbozero sample --out SAMPLES.h5` of a latent DiT to PNGs
Pixel-space DiT:
  latents.py images      IMAGES OUT.h5 --size S [--channels 1|3]
      images (PNG, JPEG, WebP, ...) as uint8 [N, C, S, S] with labels from subfolders

Needs numpy and h5py; the model commands need torch, diffusers and transformers, `images`
needs Pillow (pip install diffusers transformers sentencepiece pillow). Files are written to
a temporary name and renamed when complete."""
import argparse
import json
import os
import sys

import numpy as np

IMAGE_EXT = (".png", ".jpg", ".jpeg", ".webp", ".bmp")
SD_VAE_SCALE = 0.18215  # the Stable Diffusion VAE's latent scale, which DiT was trained with


class Refused(Exception):
    """Bad input: printed as one line naming what was wrong, exit status 2."""


# ---- the layout (numpy only: what the tests check) ----

def pack(lat):
    """VAE latents [N, C, H, W] -> Flux tokens [N, (H/2)(W/2), 4C] (diffusers' _pack_latents:
    token (r, c) holds channel k's 2x2 patch at index 4k + 2i + j)."""
    n, c, h, w = lat.shape
    if h % 2 or w % 2:
        raise Refused(f"latents of {h}x{w}: the packing takes an even height and width")
    x = lat.reshape(n, c, h // 2, 2, w // 2, 2).transpose(0, 2, 4, 1, 3, 5)
    return x.reshape(n, (h // 2) * (w // 2), c * 4)


def unpack(tok, h2, w2):
    """pack's inverse: tokens [N, h2 w2, 4C] on an h2 x w2 grid -> [N, C, 2 h2, 2 w2]."""
    n, t, c4 = tok.shape
    if t != h2 * w2 or c4 % 4:
        raise Refused(f"{t} tokens of {c4} do not fill a {h2}x{w2} grid of 2x2 patches")
    x = tok.reshape(n, h2, w2, c4 // 4, 2, 2).transpose(0, 3, 1, 4, 2, 5)
    return x.reshape(n, c4 // 4, 2 * h2, 2 * w2)


def image_ids(h2, w2):
    """RoPE positions of the image tokens: (0, row, col), row-major (_prepare_latent_image_ids)."""
    ids = np.zeros((h2 * w2, 3), np.float32)
    ids[:, 1] = np.repeat(np.arange(h2), w2)
    ids[:, 2] = np.tile(np.arange(w2), h2)
    return ids


def grid_of(img_ids):
    """The token grid (h2, w2) of row-major (0, row, col) ids."""
    h2, w2 = int(img_ids[:, 1].max()) + 1, int(img_ids[:, 2].max()) + 1
    if h2 * w2 != len(img_ids) or not np.array_equal(img_ids, image_ids(h2, w2)):
        raise Refused("img_ids are not a row-major grid of (0, row, col)")
    return h2, w2


class Writer:
    """An HDF5 file filled dataset by dataset and row by row, renamed into place on close()."""

    def __init__(self, path, attrs=None):
        import h5py
        self.path, self.tmp = path, f"{path}.tmp{os.getpid()}"
        self.f = h5py.File(self.tmp, "w")
        for k, v in (attrs or {}).items():
            self.f.attrs[k] = v

    def dataset(self, name, shape, dtype=np.float32, data=None):
        chunks = (1,) + tuple(shape[1:]) if len(shape) > 1 and shape[0] > 0 else None
        ds = self.f.create_dataset(name, shape, dtype=dtype, chunks=chunks,
                                   compression="gzip" if data is None else None)
        if data is not None:
            ds[...] = data
        return ds

    def close(self):
        self.f.close()
        os.replace(self.tmp, self.path)

    def abandon(self):
        self.f.close()
        os.remove(self.tmp)


def write_flux_cache(path, n, Ti, Tt, C, J, P, img_ids, txt_ids, rows, attrs=None):
    """A cache of n samples (io/latents_h5.h): rows yields (i, latents [b, Ti, C] or None for
    zeros, txt [b, Tt, J], pooled [b, P]) for consecutive row blocks starting at i."""
    w = Writer(path, attrs)
    try:
        lat = w.dataset("latents", (n, Ti, C))
        txt = w.dataset("txt", (n, Tt, J))
        pooled = w.dataset("pooled", (n, P))
        w.dataset("img_ids", img_ids.shape, data=img_ids.astype(np.float32))
        w.dataset("txt_ids", txt_ids.shape, data=txt_ids.astype(np.float32))
        done = 0
        for i, la, tx, po in rows:
            b = len(tx)
            if la is not None:
                lat[i:i + b] = la
            txt[i:i + b], pooled[i:i + b] = tx, po
            done += b
            print(f"  {done}/{n}", file=sys.stderr)
        if done != n:
            raise Refused(f"{path}: {done} rows written of {n}")
    except BaseException:
        w.abandon()
        raise
    w.close()


def write_images(path, x, labels, num_classes):
    """images [N, C, H, W] (float32, or uint8 pixels) + int32 labels (io/images_h5.h)."""
    w = Writer(path, {"num_classes": np.int64(num_classes)})
    try:
        w.dataset("images", x.shape, dtype=x.dtype, data=x)
        w.dataset("labels", labels.shape, dtype=np.int32, data=labels.astype(np.int32))
    except BaseException:
        w.abandon()
        raise
    w.close()


# ---- inputs ----

def parse_size(s):
    try:
        w, h = (int(v) for v in s.lower().split("x"))
    except ValueError:
        raise Refused(f"--size {s}: expected WxH, e.g. 1024x1024")
    if w <= 0 or h <= 0 or w % 16 or h % 16:
        raise Refused(f"--size {s}: width and height must be positive multiples of 16")
    return w, h


def list_images(folder, labels=False):
    """Image paths under folder (sorted), and with labels the subfolder index of each."""
    if not os.path.isdir(folder):
        kind = "a file" if os.path.exists(folder) else "missing"
        hint = " (a .pt checkpoint is converted with tools/convert_dit.py)" if folder.endswith(".pt") else ""
        raise Refused(f"{folder}: {kind}, expected a folder of images{hint}")
    if labels:
        classes = sorted(d for d in os.listdir(folder) if os.path.isdir(os.path.join(folder, d)))
        if not classes:
            raise Refused(f"{folder}: no subfolders; class labels come from subfolder names")
        out = []
        for k, c in enumerate(classes):
            for p in sorted(os.listdir(os.path.join(folder, c))):
                if p.lower().endswith(IMAGE_EXT):
                    out.append((os.path.join(folder, c, p), k))
        if not out:
            raise Refused(f"{folder}: no images ({', '.join(IMAGE_EXT)}) in its subfolders")
        return out, classes
    out = [os.path.join(folder, p) for p in sorted(os.listdir(folder)) if p.lower().endswith(IMAGE_EXT)]
    if not out:
        raise Refused(f"{folder}: no images ({', '.join(IMAGE_EXT)})")
    return out


def captions_of(folder, paths):
    """Each image's caption: NAME.txt beside it, else folder/metadata.jsonl's "text"."""
    meta = {}
    mpath = os.path.join(folder, "metadata.jsonl")
    if os.path.exists(mpath):
        for ln, line in enumerate(open(mpath, encoding="utf-8"), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                meta[rec["file_name"]] = rec["text"]
            except (ValueError, KeyError, TypeError):
                raise Refused(f"{mpath}:{ln}: expected {{\"file_name\": ..., \"text\": ...}}")
    out = []
    for p in paths:
        t = os.path.splitext(p)[0] + ".txt"
        if os.path.exists(t):
            out.append(open(t, encoding="utf-8").read().strip())
        elif os.path.basename(p) in meta:
            out.append(meta[os.path.basename(p)])
        else:
            raise Refused(f"{p}: no caption ({os.path.basename(t)} beside it, or a line of "
                          f"{mpath})")
    return out


def load_rgb(path, w, h, channels=3):
    """An image resized to cover w x h (bicubic) and centre-cropped, as float32 [C, h, w] in
    [-1, 1]."""
    from PIL import Image
    try:
        im = Image.open(path)
        im = im.convert("L" if channels == 1 else "RGB")
    except Exception as e:  # PIL raises many kinds for a bad file
        raise Refused(f"{path}: not an image Pillow reads ({e})")
    s = max(w / im.width, h / im.height)
    rw, rh = max(w, round(im.width * s)), max(h, round(im.height * s))
    im = im.resize((rw, rh), Image.BICUBIC)
    x0, y0 = (rw - w) // 2, (rh - h) // 2
    a = np.asarray(im.crop((x0, y0, x0 + w, y0 + h)), dtype=np.float32)
    a = a[None] if a.ndim == 2 else a.transpose(2, 0, 1)
    return a / 127.5 - 1.0


# ---- the models (torch, diffusers, transformers) ----

def need_diffusers():
    try:
        import diffusers  # noqa: F401
        import torch  # noqa: F401
    except ImportError as e:
        raise Refused(f"this command needs torch, diffusers and transformers ({e}): pip install "
                      "diffusers transformers sentencepiece pillow")


def device_of(a):
    import torch
    return a.device or ("cuda" if torch.cuda.is_available() else "cpu")


def dtype_of(dev):
    import torch
    return torch.bfloat16 if dev.startswith("cuda") else torch.float32


def flux_vae(a):
    from diffusers import AutoencoderKL
    dev = device_of(a)
    vae = AutoencoderKL.from_pretrained(a.model, subfolder="vae", torch_dtype=dtype_of(dev)).to(dev)
    return vae, dev


def flux_text(a):
    """encode(captions) -> T5 [b, Tt, 4096], pooled CLIP [b, 768], txt_ids [Tt, 3]."""
    import torch
    from diffusers import FluxPipeline
    dev = device_of(a)
    pipe = FluxPipeline.from_pretrained(a.model, transformer=None, vae=None,
                                        torch_dtype=dtype_of(dev)).to(dev)

    def encode(captions):
        with torch.no_grad():
            e, p, ids = pipe.encode_prompt(prompt=captions, prompt_2=None, device=dev,
                                           max_sequence_length=a.max_text)
        ids = ids.float().cpu().numpy()  # [Tt, 3]; [b, Tt, 3] in older diffusers
        return e.float().cpu().numpy(), p.float().cpu().numpy(), ids[0] if ids.ndim == 3 else ids
    return encode


def cmd_flux_cache(a):
    need_diffusers()
    import torch
    w, h = parse_size(a.size)
    paths = list_images(a.images)
    caps = captions_of(a.images, paths)
    vae, dev = flux_vae(a)
    sf, sh = vae.config.scaling_factor, vae.config.shift_factor or 0.0
    encode = flux_text(a)
    h2, w2 = h // 16, w // 16
    _, _, txt_ids = encode(caps[:1])

    def rows():
        for i in range(0, len(paths), a.batch):
            px = np.stack([load_rgb(p, w, h) for p in paths[i:i + a.batch]])
            with torch.no_grad():
                x = torch.from_numpy(px).to(dev, vae.dtype)
                lat = vae.encode(x).latent_dist.sample()
            lat = ((lat.float() - sh) * sf).cpu().numpy()
            e, p, _ = encode(caps[i:i + a.batch])
            yield i, pack(lat), e, p
    write_flux_cache(a.out, len(paths), h2 * w2, len(txt_ids), 64, 4096, 768, image_ids(h2, w2),
                     txt_ids, rows(), {"model": a.model, "size": a.size})
    print(f"wrote {a.out}: {len(paths)} samples of {w}x{h} ({h2 * w2} latent tokens)")


def cmd_flux_prompts(a):
    need_diffusers()
    w, h = parse_size(a.size)
    prompts = list(a.prompt or [])
    if a.prompts:
        prompts += [ln.strip() for ln in open(a.prompts, encoding="utf-8") if ln.strip()]
    if not prompts:
        raise Refused("no prompts: give --prompt TEXT (repeatable) or --prompts FILE (one a line)")
    encode = flux_text(a)
    e, p, txt_ids = encode(prompts)
    h2, w2 = h // 16, w // 16
    write_flux_cache(a.out, len(prompts), h2 * w2, e.shape[1], 64, e.shape[2], p.shape[1],
                     image_ids(h2, w2), txt_ids, iter([(0, None, e, p)]),
                     {"model": a.model, "size": a.size})
    print(f"wrote {a.out}: {len(prompts)} prompts for {w}x{h} samples")


def read_h5(path, names):
    import h5py
    if not os.path.isfile(path):
        raise Refused(f"{path}: no such file")
    try:
        f = h5py.File(path, "r")
    except OSError:
        raise Refused(f"{path}: not an HDF5 file")
    with f:
        missing = [n for n in names if n not in f]
        if missing:
            raise Refused(f"{path}: no dataset {missing[0]!r} (expected {', '.join(names)})")
        return [np.asarray(f[n]) for n in names]


def save_pngs(x, outdir, channels_last=False):
    from PIL import Image
    os.makedirs(outdir, exist_ok=True)
    px = np.clip(np.rint((x + 1) * 127.5), 0, 255).astype(np.uint8)
    for i, im in enumerate(px):
        im = im if channels_last else im.transpose(1, 2, 0)
        Image.fromarray(im[..., 0] if im.shape[-1] == 1 else im).save(
            os.path.join(outdir, f"sample_{i:04d}.png"))
    print(f"wrote {len(px)} PNGs to {outdir}")


def decode_batches(vae, lat, dev):
    import torch
    out = []
    for i in range(len(lat)):
        with torch.no_grad():
            x = vae.decode(torch.from_numpy(lat[i:i + 1]).to(dev, vae.dtype)).sample
        out.append(x.float().clamp(-1, 1).cpu().numpy())
    return np.concatenate(out)


def cmd_flux_decode(a):
    need_diffusers()
    tok, ids = read_h5(a.samples, ["latents", "img_ids"])
    if tok.ndim != 3 or tok.shape[2] != 64:
        raise Refused(f"{a.samples}: latents of shape {tok.shape}, expected [N, tokens, 64]")
    h2, w2 = grid_of(ids)
    vae, dev = flux_vae(a)
    sf, sh = vae.config.scaling_factor, vae.config.shift_factor or 0.0
    lat = unpack(tok, h2, w2) / sf + sh
    save_pngs(decode_batches(vae, lat.astype(np.float32), dev), a.outdir)


def sd_vae(a):
    from diffusers import AutoencoderKL
    dev = device_of(a)
    return AutoencoderKL.from_pretrained(a.vae, torch_dtype=dtype_of(dev)).to(dev), dev


def cmd_dit_cache(a):
    need_diffusers()
    import torch
    if a.size % 8:
        raise Refused(f"--size {a.size}: a multiple of 8 (the VAE downsamples 8x)")
    items, classes = list_images(a.images, labels=True)
    vae, dev = sd_vae(a)
    lat = []
    for i in range(0, len(items), a.batch):
        px = np.stack([load_rgb(p, a.size, a.size) for p, _ in items[i:i + a.batch]])
        with torch.no_grad():
            z = vae.encode(torch.from_numpy(px).to(dev, vae.dtype)).latent_dist.sample()
        lat.append((z.float() * SD_VAE_SCALE).cpu().numpy())
        print(f"  {min(i + a.batch, len(items))}/{len(items)}", file=sys.stderr)
    y = np.array([k for _, k in items], np.int32)
    write_images(a.out, np.concatenate(lat).astype(np.float32), y, len(classes))
    print(f"wrote {a.out}: {len(items)} latents of {a.size} px images, {len(classes)} classes "
          f"({', '.join(f'{k}={c}' for k, c in enumerate(classes))})")


def cmd_dit_decode(a):
    need_diffusers()
    (x,) = read_h5(a.samples, ["images"])
    if x.ndim != 4 or x.shape[1] != 4:
        raise Refused(f"{a.samples}: images of shape {x.shape}, expected SD-VAE latents [N, 4, h, w]")
    vae, dev = sd_vae(a)
    save_pngs(decode_batches(vae, (x / SD_VAE_SCALE).astype(np.float32), dev), a.outdir)


def cmd_images(a):
    try:
        import PIL  # noqa: F401
    except ImportError:
        raise Refused("`images` needs Pillow: pip install pillow (or apt install python3-pil)")
    if a.channels not in (1, 3):
        raise Refused(f"--channels {a.channels}: 1 (grayscale) or 3 (RGB)")
    items, classes = list_images(a.images, labels=True)
    x = np.stack([load_rgb(p, a.size, a.size, a.channels) for p, _ in items])
    px = np.clip(np.rint((x + 1) * 127.5), 0, 255).astype(np.uint8)
    write_images(a.out, px, np.array([k for _, k in items], np.int32), len(classes))
    print(f"wrote {a.out}: {len(items)} images of {a.channels}x{a.size}x{a.size}, "
          f"{len(classes)} classes ({', '.join(f'{k}={c}' for k, c in enumerate(classes))})")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    sub = ap.add_subparsers(dest="cmd", required=True)

    def common(p, model=True):
        if model:
            p.add_argument("--model", required=True, help="a diffusers Flux.1 folder or hub name")
        p.add_argument("--device", default="", help="cuda or cpu (default: cuda when present)")
        p.add_argument("--batch", type=int, default=4)
        p.add_argument("--max-text", type=int, default=512, help="T5 tokens (dev 512, schnell 256)")

    p = sub.add_parser("flux-cache")
    p.add_argument("images")
    p.add_argument("out")
    p.add_argument("--size", default="1024x1024")
    common(p)
    p = sub.add_parser("flux-prompts")
    p.add_argument("out")
    p.add_argument("--prompt", action="append")
    p.add_argument("--prompts")
    p.add_argument("--size", default="1024x1024")
    common(p)
    p = sub.add_parser("flux-decode")
    p.add_argument("samples")
    p.add_argument("outdir")
    common(p)
    for name in ("dit-cache", "dit-decode"):
        p = sub.add_parser(name)
        p.add_argument("images" if name == "dit-cache" else "samples")
        p.add_argument("out" if name == "dit-cache" else "outdir")
        p.add_argument("--vae", default="stabilityai/sd-vae-ft-ema")
        p.add_argument("--size", type=int, default=256)
        common(p, model=False)
    p = sub.add_parser("images")
    p.add_argument("images")
    p.add_argument("out")
    p.add_argument("--size", type=int, required=True)
    p.add_argument("--channels", type=int, default=3)
    a = ap.parse_args(argv)
    try:
        {"flux-cache": cmd_flux_cache, "flux-prompts": cmd_flux_prompts,
         "flux-decode": cmd_flux_decode, "dit-cache": cmd_dit_cache, "dit-decode": cmd_dit_decode,
         "images": cmd_images}[a.cmd](a)
    except Refused as e:
        print(f"latents.py {a.cmd}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Checks tools/latents.py's layout code without the models (numpy and h5py only), and that
turbozero reads what it writes:
  1. pack is diffusers' _pack_latents (token (r, c), value 4k + 2i + j = latent [k, 2r+i, 2c+j])
     and unpack its inverse; image_ids is row-major (0, row, col) and grid_of reads it back;
  2. a cache written by write_flux_cache (rows in blocks) is what turbozero evaluates, and a
     prompts file (latents left as zeros) is what `turbozero sample --prompts` takes;
  3. write_images writes io/images_h5.h's layout;
  4. bad input is refused with the file named: a .pt file or an empty folder for images, an
     image without a caption, a bad metadata.jsonl line (with its line number).
usage: latents_tool_test.py TURBOZERO WORKDIR CFG   (CFG: a flux run config whose data.val is
replaced)"""
import os
import subprocess
import sys

import h5py
import numpy as np

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "tools"))
import latents as L  # noqa: E402

tz, work, cfg = sys.argv[1:4]
rng = np.random.default_rng(3)
fails = 0


def check(cond, what):
    global fails
    print(("ok   " if cond else "FAIL ") + what)
    fails += not cond


# 1. packing
lat = rng.standard_normal((2, 3, 6, 8)).astype(np.float32)
tok = L.pack(lat)
want = np.empty((2, 12, 12), np.float32)
for n in range(2):
    for r in range(3):
        for c in range(4):
            for k in range(3):
                for i in range(2):
                    for j in range(2):
                        want[n, r * 4 + c, 4 * k + 2 * i + j] = lat[n, k, 2 * r + i, 2 * c + j]
check(np.array_equal(tok, want) and np.array_equal(L.unpack(tok, 3, 4), lat),
      "pack is diffusers' 2x2 packing (3x4 tokens of 12 from [3, 6, 8]) and unpack inverts it")
ids = L.image_ids(3, 4)
check(ids.shape == (12, 3) and (ids[:, 0] == 0).all() and list(ids[5]) == [0, 1, 1]
      and L.grid_of(ids) == (3, 4), "image_ids: row-major (0, row, col); grid_of reads (3, 4)")

# 2. caches turbozero reads (flux-tiny: 16 channels per token, text 32, pooled 24, 8 text tokens)
n, Ti, Tt, C, J, P = 6, 16, 8, 16, 32, 24
lat = rng.standard_normal((n, Ti, C)).astype(np.float32)
txt = rng.standard_normal((n, Tt, J)).astype(np.float32)
pooled = rng.standard_normal((n, P)).astype(np.float32)
rows = ((i, lat[i:i + 4], txt[i:i + 4], pooled[i:i + 4]) for i in range(0, n, 4))
cache = os.path.join(work, "tool.h5")
L.write_flux_cache(cache, n, Ti, Tt, C, J, P, L.image_ids(4, 4), np.zeros((Tt, 3)), rows)
with h5py.File(cache, "r") as f:
    same = all(np.array_equal(np.asarray(f[k]), v) for k, v in
               (("latents", lat), ("txt", txt), ("pooled", pooled)))
check(same and not os.path.exists(cache + f".tmp{os.getpid()}"),
      "write_flux_cache: two row blocks land in place, the file renamed into place")
r = subprocess.run([tz, "eval", cfg, "--set", f"data.val={cache}"], capture_output=True, text=True)
check(r.returncode == 0 and "eval_loss=" in r.stdout + r.stderr,
      "turbozero eval reads the tool's cache")
prompts = os.path.join(work, "prompts.h5")
L.write_flux_cache(prompts, 2, Ti, Tt, C, J, P, L.image_ids(4, 4), np.zeros((Tt, 3)),
                   iter([(0, None, txt[:2], pooled[:2])]))
with h5py.File(prompts, "r") as f:
    zeros = not np.asarray(f["latents"]).any()
out = os.path.join(work, "from_prompts.h5")
r = subprocess.run([tz, "sample", cfg, "--prompts", prompts, "--n", "2", "--steps", "2", "--out", out],
                   capture_output=True, text=True)
ok = r.returncode == 0 and zeros
if ok:
    with h5py.File(out, "r") as f:
        ok = f["latents"].shape == (2, Ti, C) and L.grid_of(np.asarray(f["img_ids"])) == (4, 4)
check(ok, "a prompts file (zero latents) drives turbozero sample; its latents unpack on a 4x4 grid")

# 3. images
x = rng.integers(0, 256, (5, 1, 4, 4)).astype(np.uint8)
ipath = os.path.join(work, "images.h5")
L.write_images(ipath, x, np.array([0, 1, 2, 1, 0]), 3)
with h5py.File(ipath, "r") as f:
    ok = (np.array_equal(np.asarray(f["images"]), x) and f["labels"].dtype == np.int32
          and int(f.attrs["num_classes"]) == 3)
check(ok, "write_images: uint8 images, int32 labels, num_classes")


# 4. refusals
def refused(fn, want, what):
    try:
        fn()
    except L.Refused as e:
        check(want in str(e), f"{what}: {e}")
        return
    check(False, f"{what}: accepted")


pt = os.path.join(work, "model.pt")
open(pt, "w").close()
refused(lambda: L.list_images(pt), "tools/convert_dit.py", "a .pt file for images")
empty = os.path.join(work, "empty")
os.makedirs(os.path.join(empty, "cats"), exist_ok=True)
refused(lambda: L.list_images(empty, labels=True), "no images", "a folder without images")
folder = os.path.join(work, "captioned")
os.makedirs(folder, exist_ok=True)
for name in ("a.png", "b.png"):
    open(os.path.join(folder, name), "w").close()
open(os.path.join(folder, "a.txt"), "w").write("a cat\n")
refused(lambda: L.captions_of(folder, L.list_images(folder)), "b.png: no caption",
        "an image without a caption")
open(os.path.join(folder, "metadata.jsonl"), "w").write('{"file_name": "b.png", "text": "a dog"}\n{"file_name": 3}\n')
refused(lambda: L.captions_of(folder, L.list_images(folder)), "metadata.jsonl:2",
        "a bad metadata.jsonl line")
os.remove(os.path.join(folder, "metadata.jsonl"))
open(os.path.join(folder, "metadata.jsonl"), "w").write('{"file_name": "b.png", "text": "a dog"}\n')
check(L.captions_of(folder, L.list_images(folder)) == ["a cat", "a dog"],
      "captions from NAME.txt and from metadata.jsonl")
refused(lambda: L.parse_size("1000x1024"), "multiples of 16", "--size 1000x1024")
r = subprocess.run([sys.executable, os.path.join(here, "..", "..", "tools", "latents.py"),
                    "flux-decode", os.path.join(work, "none.h5"), work, "--model", "x"],
                   capture_output=True, text=True)
check(r.returncode == 2 and "Traceback" not in r.stderr and "latents.py flux-decode:" in r.stderr,
      f"a command without its inputs exits 2 with one line: {r.stderr.strip()}")
sys.exit(1 if fails else 0)

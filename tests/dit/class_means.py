"""Checks that sampled images follow their class (one PNG grid per class, made by
`turbozero sample`): the sampled class means must differ from each other by more than
MIN_SEP (RMS, in [-1, 1] pixel units), and for most sampled classes (more than half) the
mean sampled image must be nearer to the mean of its own class's real images than to any
other sampled class's (Fashion-MNIST, IDX files). Prints the distance table. A tiny model
can mix up look-alike classes (dress and trouser are both tall and narrow), hence "most".
usage: class_means.py IMAGES.gz LABELS.gz N H W MIN_SEP c1=grid1.png c2=grid2.png ..."""
import gzip
import struct
import sys
import zlib

import numpy as np


def read_png_gray(path):
    """8-bit grayscale, non-interlaced PNG (what turbozero writes for 1 channel)."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    pos, idat, w = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and color == 0 and interlace == 0, "unexpected PNG format"
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw = zlib.decompress(idat)
    img = np.zeros((h, w), dtype=np.int32)
    prev = np.zeros(w, dtype=np.int32)
    for y in range(h):
        f = raw[y * (w + 1)]
        row = np.frombuffer(raw[y * (w + 1) + 1:(y + 1) * (w + 1)], dtype=np.uint8).astype(np.int32)
        out = np.zeros(w, dtype=np.int32)
        for x in range(w):
            a = out[x - 1] if x else 0
            b, c = prev[x], prev[x - 1] if x else 0
            if f == 0: p = 0
            elif f == 1: p = a
            elif f == 2: p = b
            elif f == 3: p = (a + b) // 2
            else:
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                p = a if pa <= pb and pa <= pc else b if pb <= pc else c
            out[x] = (row[x] + p) & 255
        img[y], prev = out, out
    return img


def tiles(img, n, H, W, pad=2):
    cols = int(np.ceil(np.sqrt(n)))
    res = []
    for i in range(n):
        r, c = divmod(i, cols)
        y, x = pad + r * (H + pad), pad + c * (W + pad)
        res.append(img[y:y + H, x:x + W] / 127.5 - 1.0)
    return np.array(res)


def main():
    images, labels, n, H, W, min_sep = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
    grids = {int(a.split("=")[0]): a.split("=")[1] for a in sys.argv[7:]}
    x = np.frombuffer(gzip.open(images).read()[16:], dtype=np.uint8).reshape(-1, H, W) / 127.5 - 1.0
    y = np.frombuffer(gzip.open(labels).read()[8:], dtype=np.uint8)
    real = {c: x[y == c].mean(0) for c in range(10)}
    fake = {c: tiles(read_png_gray(p), n, H, W).mean(0) for c, p in grids.items()}
    rms = lambda a, b: float(np.sqrt(((a - b) ** 2).mean()))
    fails = own = 0
    for c, m in fake.items():
        d = {k: rms(m, r) for k, r in real.items() if k in grids}
        near = min(d, key=d.get)
        print(f"class {c}: nearest real class mean {near} ({d[near]:.3f}); own {d[c]:.3f}; "
              + " ".join(f"{k}:{v:.3f}" for k, v in sorted(d.items())))
        own += near == c
    print(f"{own} of {len(fake)} sampled class means are nearest their own class (required: more than half)")
    fails += 2 * own <= len(fake)
    cs = sorted(fake)
    sep = min(rms(fake[a], fake[b]) for i, a in enumerate(cs) for b in cs[i + 1:])
    print(f"smallest RMS distance between two sampled class means: {sep:.3f} (required > {min_sep})")
    fails += sep <= min_sep
    print(f"class_means: {2 - fails} passed, {fails} failed")
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()

"""Sets element INDEX of tensor NAME (F32, F16 or BF16) of a safetensors file to VALUE (a float,
"nan" or "inf") in place. usage: poison.py FILE NAME INDEX VALUE"""
import json
import struct
import sys

import numpy as np

path, name, index, value = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
with open(path, "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    t = json.loads(f.read(n))[name]
    begin = 8 + n + t["data_offsets"][0]
    if t["dtype"] == "F32":
        raw = np.float32(value).tobytes()
    elif t["dtype"] == "F16":
        raw = np.float16(value).tobytes()
    elif t["dtype"] == "BF16":
        raw = np.float32(value).tobytes()[2:]
    else:
        sys.exit(f"{name}: dtype {t['dtype']} not handled")
    f.seek(begin + index * len(raw))
    f.write(raw)

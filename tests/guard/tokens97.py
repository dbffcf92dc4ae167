"""Writes a token file of the bundled text mod 97 (the vocab of tests/zero/make_model.py).
usage: tokens97.py JARGON_TOK OUT [MAX_TOKENS [MODULUS]] (tokens mod MODULUS, default 97)"""
import struct
import sys

d = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", d[24:32])[0]
cap = int(sys.argv[3]) if len(sys.argv) > 3 else 200000
mod = int(sys.argv[4]) if len(sys.argv) > 4 else 97
toks = bytes(b % mod for b in d[64:64 + min(n, cap)])
h = b"TZTOKENS" + struct.pack("<IIII", 1, 1, 97, 0) + struct.pack("<Q", len(toks)) + bytes(32)
open(sys.argv[2], "wb").write(h + toks)

#!/usr/bin/env python3
"""A slow, plain reference for ASCII texts: the Llama 3 pre-tokenizer regex written with
ASCII classes for Python's re (equal to \\p{L}, \\p{N}, \\s on ASCII), GPT-2's byte-to-unicode
map, ignore_merges, and BPE by repeatedly merging the lowest-ranked adjacent pair (leftmost
among equals); or, for a SentencePiece-style tokenizer.json, "▁" for spaces and a leading
"▁" with byte fallback. Reads JSON strings (one a line) on stdin, writes JSON id lists.
usage: naive_bpe.py TOKENIZER_JSON"""
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bytelevel import bpe, byte_char  # noqa: E402

tj = json.load(open(sys.argv[1], encoding="utf-8"))
model = tj["model"]
vocab = model["vocab"]
ranks = {}
for i, m in enumerate(model["merges"]):
    a, b = m.split(" ", 1) if isinstance(m, str) else m
    ranks.setdefault((a, b), i)
bytelevel = "ByteLevel" in json.dumps(tj["pre_tokenizer"])

L, N = "A-Za-z", "0-9"
pat = re.compile(
    rf"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n{L}{N}]?[{L}]+|[{N}]{{1,3}}| ?[^\s{L}{N}]+[\r\n]*"
    rf"|\s*[\r\n]+|\s+(?!\S)|\s+")


def encode(text):
    out = []
    if bytelevel:
        for piece in pat.findall(text):
            word = "".join(byte_char[b] for b in piece.encode("utf-8"))
            if model.get("ignore_merges") and word in vocab:
                out.append(vocab[word])
                continue
            out += [vocab[s] for s in bpe(list(word), ranks)]
    else:
        word = "\u2581" + text.replace(" ", "\u2581")
        for s in bpe(list(word), ranks):
            if s in vocab:
                out.append(vocab[s])
            else:
                out += [vocab["<0x%02X>" % b] for b in s.encode("utf-8")]
    return out


for line in sys.stdin:
    if line.strip():
        print(json.dumps(encode(json.loads(line))))

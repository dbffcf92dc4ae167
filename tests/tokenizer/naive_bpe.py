#!/usr/bin/env python3
"""A slow, plain reference for ASCII texts: the Llama 3 pre-tokenizer regex written with
ASCII classes for Python's re (equal to \\p{L}, \\p{N}, \\s on ASCII), GPT-2's byte-to-unicode
map, ignore_merges, and BPE by repeatedly merging the lowest-ranked adjacent pair (leftmost
among equals); or, for a SentencePiece-style tokenizer.json, "▁" for spaces and a leading
"▁" with byte fallback. Reads JSON strings (one a line) on stdin, writes JSON id lists.
usage: naive_bpe.py TOKENIZER_JSON"""
import json
import re
import sys

tj = json.load(open(sys.argv[1], encoding="utf-8"))
model = tj["model"]
vocab = model["vocab"]
ranks = {}
for i, m in enumerate(model["merges"]):
    a, b = m.split(" ", 1) if isinstance(m, str) else m
    ranks.setdefault((a, b), i)
bytelevel = "ByteLevel" in json.dumps(tj["pre_tokenizer"])

bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b)
        cs.append(256 + n)
        n += 1
byte_char = {b: chr(c) for b, c in zip(bs, cs)}

L, N = "A-Za-z", "0-9"
pat = re.compile(
    rf"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n{L}{N}]?[{L}]+|[{N}]{{1,3}}| ?[^\s{L}{N}]+[\r\n]*"
    rf"|\s*[\r\n]+|\s+(?!\S)|\s+")


def bpe(symbols):
    while len(symbols) > 1:
        best = None
        for i in range(len(symbols) - 1):
            r = ranks.get((symbols[i], symbols[i + 1]))
            if r is not None and (best is None or r < best[0]):
                best = (r, i)
        if best is None:
            break
        i = best[1]
        symbols = symbols[:i] + [symbols[i] + symbols[i + 1]] + symbols[i + 2:]
    return symbols


def encode(text):
    out = []
    if bytelevel:
        for piece in pat.findall(text):
            word = "".join(byte_char[b] for b in piece.encode("utf-8"))
            if model.get("ignore_merges") and word in vocab:
                out.append(vocab[word])
                continue
            out += [vocab[s] for s in bpe(list(word))]
    else:
        word = "\u2581" + text.replace(" ", "\u2581")
        for s in bpe(list(word)):
            if s in vocab:
                out.append(vocab[s])
            else:
                out += [vocab["<0x%02X>" % b] for b in s.encode("utf-8")]
    return out


for line in sys.stdin:
    if line.strip():
        print(json.dumps(encode(json.loads(line))))

#!/usr/bin/env python3
"""A tiny tokenizer.json shaped like Qwen2's (Qwen2, Qwen2.5, Qwen3): normalizer NFC, a Split
pre-tokenizer with Qwen2's regex (Llama 3's with single digits), ByteLevel without its own
regex, byte-level BPE with merges learned from a small corpus; and a plain reference encoder
for it (unicodedata's NFC, the regex with Python's Unicode letter class, BPE by repeated
lowest-rank merges).
usage: qwen_tok.py make DIR | qwen_tok.py encode TOKENIZER_JSON < JSON_LINES"""
import json
import os
import re
import sys
import unicodedata

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bytelevel import bpe, byte_char  # noqa: E402


# Qwen2's regex in Python's re: \p{L} is [^\W\d_] (str.isalpha) and \p{N} is \d on the texts
# used here (ASCII digits); "neither letter nor number" is (?:[^\w]|_)
L, NOT_LN = r"[^\W\d_]", r"(?:[^\r\n\w]|_)"
PAT = re.compile(rf"(?i:'s|'t|'re|'ve|'m|'ll|'d)|{NOT_LN}?{L}+|\d| ?(?:[^\s\w]|_)+[\r\n]*"
                 rf"|\s*[\r\n]+|\s+(?!\S)|\s+")
REGEX = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
         "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
CORPUS = ("the café of the cafés, naïve résumé 2024 12345 Ångström; the theme thereof "
          "한국어 문장 the end. It's 42 o'clock, we'll see: déjà vu!")


def pieces(text):
    out, i = [], 0
    while i < len(text):
        m = PAT.match(text, i)
        out.append(m.group(0))
        i = m.end()
    return out


def words(text):
    return ["".join(byte_char[b] for b in p.encode("utf-8"))
            for p in pieces(unicodedata.normalize("NFC", text))]


def make(d):
    vocab = {byte_char[b]: i for i, b in enumerate(range(256))}
    merges, ws = [], [list(w) for w in words(CORPUS)]
    for _ in range(60):  # learn merges: the most frequent adjacent pair, first seen on ties
        count = {}
        for w in ws:
            for a, b in zip(w, w[1:]):
                count[(a, b)] = count.get((a, b), 0) + 1
        if not count:
            break
        best = max(count.items(), key=lambda kv: kv[1])[0]
        merges.append(best)
        vocab.setdefault(best[0] + best[1], len(vocab))
        for w in ws:
            i = 0
            while i < len(w) - 1:
                if (w[i], w[i + 1]) == best:
                    w[i:i + 2] = [w[i] + w[i + 1]]
                i += 1
    # digit merges the single-digit regex never applies (Llama 3's {1,3} groups would)
    for pair in (("1", "2"), ("2", "0"), ("4", "5")):
        merges.append(pair)
        vocab.setdefault(pair[0] + pair[1], len(vocab))
    tj = {"version": "1.0", "truncation": None, "padding": None,
          "added_tokens": [{"id": len(vocab), "content": "<|endoftext|>", "single_word": False,
                            "lstrip": False, "rstrip": False, "normalized": False,
                            "special": True}],
          "normalizer": {"type": "NFC"},
          "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
              {"type": "Split", "pattern": {"Regex": REGEX}, "behavior": "Isolated",
               "invert": False},
              {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
               "use_regex": False}]},
          "post_processor": None,
          "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                      "use_regex": False},
          "model": {"type": "BPE", "dropout": None, "unk_token": None,
                    "continuing_subword_prefix": "", "end_of_word_suffix": "",
                    "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                    "vocab": vocab, "merges": [a + " " + b for a, b in merges]}}
    os.makedirs(d, exist_ok=True)
    json.dump(tj, open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8"),
              ensure_ascii=False)


def encode(path):
    tj = json.load(open(path, encoding="utf-8"))
    vocab = tj["model"]["vocab"]
    ranks = {tuple(m.split(" ", 1)): i for i, m in enumerate(tj["model"]["merges"])}
    for line in sys.stdin:
        ids = []
        for w in words(json.loads(line)):
            ids += [vocab[x] for x in bpe(w, ranks)]
        print(json.dumps(ids))


if __name__ == "__main__":
    make(sys.argv[2]) if sys.argv[1] == "make" else encode(sys.argv[2])

"""What the plain Python encoders of the tokenizer tests share (naive_bpe.py, qwen_tok.py):
GPT-2's byte-to-unicode map of byte-level BPE, and BPE by repeatedly merging the
lowest-ranked adjacent pair (leftmost among equals)."""

_bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
_cs, _n = _bs[:], 0
for _b in range(256):
    if _b not in _bs:
        _bs.append(_b)
        _cs.append(256 + _n)
        _n += 1
byte_char = {b: chr(c) for b, c in zip(_bs, _cs)}


def bpe(symbols, ranks):
    """symbols merged by ranks {(left, right): rank} until no ranked pair is left."""
    symbols = list(symbols)
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

#!/usr/bin/env python3
"""Cases for test_nfc (io/nfc.c against Python's unicodedata.normalize("NFC")): every code
point with a canonical decomposition or a combining class, alone and after "a"; every Hangul
syllable's jamo; then random strings over the characters where NFC does work (Latin with
marks in any order, Greek, Vietnamese, Hangul jamo, CJK compatibility ideographs, Indic and
Tibetan vowel signs) mixed with ASCII. One line per case: the input and the expected output
as hex UTF-8. usage: nfc_cases.py SEED"""
import random
import sys
import unicodedata as ud

rng = random.Random(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
special = [cp for cp in range(0x110000)
           if not 0xD800 <= cp < 0xE000 and
           ((ud.decomposition(chr(cp)) and not ud.decomposition(chr(cp)).startswith("<")) or
            ud.combining(chr(cp)))]
cases = []
for cp in special:
    cases.append(chr(cp))
    cases.append("a" + chr(cp) + "b")
for s in range(0xAC00, 0xD7A4, 7):
    cases.append(ud.normalize("NFD", chr(s)))
pool = ([chr(c) for c in special] + list("aeiouAEIOUnc ") +
        [chr(c) for c in range(0x1100, 0x1113)] + [chr(c) for c in range(0x1161, 0x1176)] +
        [chr(c) for c in range(0x11A8, 0x11C3)] + ["\u0301", "\u0308", "\u0323", "\u0327"] * 20)
for _ in range(6000):
    cases.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 12))))
for c in cases:
    print(c.encode("utf-8").hex(), ud.normalize("NFC", c).encode("utf-8").hex())

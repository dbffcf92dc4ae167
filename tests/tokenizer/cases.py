#!/usr/bin/env python3
"""Writes tokenizer test cases, one JSON string per line: hand-picked texts (contractions,
digits, whitespace runs, newlines, punctuation, emoji, CJK, combining marks, special tokens)
and seeded random mixes of them. U+FEFF is left out: JavaScript's \\s (the reference under node)
counts it as a space, Unicode's White_Space (Rust's and Oniguruma's \\s, as in HF tokenizers)
does not. usage: cases.py N_RANDOM SEED [KJV_TEXT]"""
import json
import random
import sys

fixed = [
    "Hello world", " Hello world", "Hello  world", "hello\nworld", "Hello, world! 12345",
    "I'm you're we've they'll she'd IT'S DON'T it'S 'll 's", "1234567890 3.14159 -42 1e10",
    "   leading and trailing   ", "\t\ttabs\tand\r\nCRLF\r\n\r\n", "a\n\n\nb\n \n c", " \n ",
    "日本語のテキスト、中文文本。한국어 텍스트", "emoji 🙂🎉👩‍👩‍👧‍👦 ❤️ 🇫🇷", "e\u0301 n\u0303 a\u0308\u0301 ǅ Ǆ",
    "x²³ ½ Ⅷ ٣٤٥ १२३", "naïve café résumé Straße ΑΒΓ αβγ Привет мир",
    "<|begin_of_text|>Hi<|eot_id|>", "<s>hi</s> <unk>", "<|start_header_id|>user<|end_header_id|>\n\nQ?",
    "def f(x):\n    return x ** 2  # square\n", "{\"key\": [1, 2, 3], 'b': None}",
    "!!!???... --- ___ ***", "  ", " ", "\n", "a", "\u00a0non\u00a0breaking\u2003em\u3000ideo",
    "URL: https://example.com/a?b=c&d=e#f", "The quick brown fox jumps over the lazy dog.",
    "ALLCAPS lowercase MiXeD CamelCase snake_case kebab-case",
    "zero\u200bwidth\u200djoiner", "\x01\x02 control \x7f", "¿¡«»“”‘’—–…",
]
pool = [c for s in fixed for c in s] + list(" \n\t'0123456789") + ["'s", "'LL", "  ", "\r\n"]
rng = random.Random(int(sys.argv[2]))
cases = list(fixed)
for _ in range(int(sys.argv[1])):
    cases.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 40))))
if len(sys.argv) > 3:
    with open(sys.argv[3], encoding="utf-8") as f:
        lines = f.read().split("\n")
    for i in range(0, min(len(lines), 4000), 40):
        cases.append("\n".join(lines[i:i + 40]))
for c in cases:
    print(json.dumps(c))

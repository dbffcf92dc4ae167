#!/usr/bin/env bash
# Rebuilds the bundled instruction set inputs/data/proverbs.jsonl from the King James Bible
# (public domain; Debian package bible-kjv): one record per verse of Proverbs 10-15,
#   {"prompt": "Quote Proverbs 10:1.\n", "response": "The proverbs of Solomon. ...\n"}
# so that a fine-tune learns to answer a request in a fixed format (only the responses are
# trained: `turbozero prep jsonl` masks the prompts). usage: inputs/data/make_instruct.sh
set -euo pipefail
command -v bible > /dev/null || { echo "bible missing: apt-get install bible-kjv" >&2; exit 1; }
here=$(cd "$(dirname "$0")" && pwd)
bible -l0 "prov10:1-15:33" | python3 -c '
import json, re, sys
chapter = None
for line in sys.stdin:
    m = re.match(r"^Proverbs (\d+)$", line.strip())
    if m:
        chapter = int(m.group(1))
        continue
    m = re.match(r"^\s+(\d+) (.*\S)\s*$", line)
    if m and chapter:
        rec = {"prompt": "Quote Proverbs %d:%s.\n" % (chapter, m.group(1)),
               "response": m.group(2) + "\n"}
        print(json.dumps(rec, ensure_ascii=False))
' > "$here/proverbs.jsonl"
echo "wrote $here/proverbs.jsonl ($(wc -l < "$here/proverbs.jsonl") records)"

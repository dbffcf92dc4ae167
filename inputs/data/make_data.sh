#!/usr/bin/env bash
# Rebuilds the bundled token files from Debian packages, byte-level (vocab 256):
#   jargon.tok / jargon.val.tok  fine-tuning text: the Jargon File 4.4.7 lexicon (public
#                                domain; Debian package jargon-text)
#   kjv.tok / kjv.val.tok        pretraining text: the King James Bible (public domain;
#                                Debian package bible-kjv-text), not committed (4 MB)
# usage: inputs/data/make_data.sh TURBOZERO [jargon|kjv|all]
set -euo pipefail
tz=${1:?usage: make_data.sh TURBOZERO [jargon|kjv|all]}
what=${2:-all}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if [ "$what" = jargon ] || [ "$what" = all ]; then
  src=/usr/share/doc/jargon-text/jargon.txt.gz
  [ -f $src ] || { echo "$src missing: apt-get install jargon-text" >&2; exit 1; }
  zcat $src > "$tmp/jargon.txt"
  # The lexicon entries (":word: ..."), without the per-letter index lists, dedented;
  # the first 640 KiB, of which the last 5% is held out for validation.
  start=$(grep -n "^   :abbrev:" "$tmp/jargon.txt" | head -1 | cut -d: -f1)
  end=$(grep -n "^Appendix.*Hacker Folklore$" "$tmp/jargon.txt" | tail -1 | cut -d: -f1)
  awk -v s="$start" -v e="$end" 'NR >= s && NR < e {
      if ($0 ~ /^  [A-Z]$/) skip = 1; if ($0 ~ /^   :/) skip = 0; if (!skip) print }' \
    "$tmp/jargon.txt" | sed 's/^   //' | cat -s > "$tmp/all.txt"
  head -c 655360 "$tmp/all.txt" > "$tmp/lexicon.txt"
  "$tz" prep text --tokenizer bytes --in "$tmp/lexicon.txt" --out "$here/jargon.tok" \
    --val-fraction 0.05 --val-out "$here/jargon.val.tok"
fi

if [ "$what" = kjv ] || [ "$what" = all ]; then
  command -v bible >/dev/null || { echo "bible missing: apt-get install bible-kjv" >&2; exit 1; }
  # Whole text, one verse per line; the last 2% (end of Revelation) held out.
  bible -l0 "gen1:1-rev22:21" > "$tmp/kjv.txt"
  "$tz" prep text --tokenizer bytes --in "$tmp/kjv.txt" --out "$here/kjv.tok" \
    --val-fraction 0.02 --val-out "$here/kjv.val.tok"
fi

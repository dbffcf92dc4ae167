#!/usr/bin/env python3
"""Compares two files of JSON id lists line by line (cases beside them for the report).
usage: compare.py CASES EXPECTED GOT NAME; exits 1 on any difference."""
import json
import sys

cases = [l for l in open(sys.argv[1], encoding="utf-8").read().split("\n") if l]
exp = [json.loads(l) for l in open(sys.argv[2]).read().split("\n") if l]
got = [json.loads(l) for l in open(sys.argv[3]).read().split("\n") if l]
if len(exp) != len(cases) or len(got) != len(cases):
    print(f"{sys.argv[4]}: {len(cases)} cases, {len(exp)} expected, {len(got)} got")
    sys.exit(1)
bad = [i for i in range(len(cases)) if exp[i] != got[i]]
for i in bad[:3]:
    print(f"  case {cases[i][:200]}\n  expected {exp[i][:40]}\n  got      {got[i][:40]}")
print(f"{sys.argv[4]}: {len(cases) - len(bad)} of {len(cases)} cases agree")
sys.exit(1 if bad else 0)

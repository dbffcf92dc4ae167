#!/usr/bin/env bash
# The op-case table (tests/ops/) on the emulated CUDA backend, in its forward thread order: every
# row must pass, and every op of the backend table (TZ_BACKEND_OPS, src/core/backend.h) must be
# called by one: test_op_table runs with TZ_CUDA_OP_TIMES=1,
# whose table at the backend's end counts every op called; each op of the list but destroy
# (the table's own end) must have been called. test_op_table checks by name that a row names
# every op; this checks that the rows call them. A new op without a row fails here, named.
# usage: op_coverage.sh TEST_OP_TABLE BACKEND_H EMU_MODULE
set -u
ops=$1 header=$2 module=$3
work=$(mktemp -d "${TMPDIR:-/tmp}/tzcov.XXXXXX")
trap 'rm -rf "$work"' EXIT
TZ_CUDA_OP_TIMES=1 TZ_CUDA_MODULE=$module "$ops" cuda > "$work/a.out" 2> "$work/a.err"
rc=$?
grep -q "^test_op_table: " "$work/a.out" ||
  { echo "FAIL the op table did not run to its end"; tail -5 "$work/a.out" "$work/a.err"; exit 1; }
# the table's own verdict on the emulation (forward thread order): its lines, then the counts
grep -v '^ok' "$work/a.out"
[ $rc -eq 0 ] || { echo "FAIL the op table on the emulation (exit $rc)"; exit 1; }
python3 - "$header" "$work/a.err" <<'PY'
import re, sys
h = open(sys.argv[1]).read()
m = re.search(r"#define TZ_BACKEND_OPS\(X\)(.*?)\n\n", h, re.S)
ops = re.findall(r"X\((\w+)\)", m.group(1)) if m else []
seen = set()
for line in open(sys.argv[2]):
    mm = re.match(r"  (\w+)\s+(\d+)\s", line)
    if mm and int(mm.group(2)) > 0:
        seen.add(mm.group(1))
missing = [o for o in ops if o != "destroy" and o not in seen]
if len(ops) < 40:
    print(f"FAIL only {len(ops)} ops found in TZ_BACKEND_OPS")
    sys.exit(1)
if missing:
    print("FAIL ops of the table that no row of the op-case table calls: " + ", ".join(missing))
    sys.exit(1)
print(f"ok   every op of the table but destroy is called by the op-case table: {len(ops) - 1} "
      "ops on the emulated CUDA backend")
PY

#!/usr/bin/env bash
# Every op of the backend table (TZ_BACKEND_OPS, src/core/backend.h) has a case: test_cuda_ops
# and test_offload_ops run on the emulated CUDA backend with TZ_CUDA_OP_TIMES=1, whose table
# at the backend's end counts every op called; each op of the list but destroy (the table's
# own end) must have been called. A new op without a case in those tests fails here, named.
# usage: op_coverage.sh TEST_CUDA_OPS TEST_OFFLOAD_OPS BACKEND_H EMU_MODULE
set -u
ops=$1 off=$2 header=$3 module=$4
work=$(mktemp -d "${TMPDIR:-/tmp}/tzcov.XXXXXX")
trap 'rm -rf "$work"' EXIT
# the op-time check of test_cuda_ops expects the variable in its own child only: its
# verdict here is not this test's; both must run to their summary line
TZ_CUDA_OP_TIMES=1 TZ_CUDA_MODULE=$module "$ops" > "$work/a.out" 2> "$work/a.err"
TZ_CUDA_OP_TIMES=1 TZ_CUDA_MODULE=$module "$off" > "$work/b.out" 2> "$work/b.err"
grep -q "^test_cuda_ops: " "$work/a.out" && grep -q "^test_offload_ops: " "$work/b.out" ||
  { echo "FAIL the op tests did not run to their end"; tail -5 "$work/a.out" "$work/b.out"; exit 1; }
python3 - "$header" "$work/a.err" "$work/b.err" <<'PY'
import re, sys
h = open(sys.argv[1]).read()
m = re.search(r"#define TZ_BACKEND_OPS\(X\)(.*?)\n\n", h, re.S)
ops = re.findall(r"X\((\w+)\)", m.group(1)) if m else []
seen = set()
for f in sys.argv[2:]:
    for line in open(f):
        mm = re.match(r"  (\w+)\s+(\d+)\s", line)
        if mm and int(mm.group(2)) > 0:
            seen.add(mm.group(1))
missing = [o for o in ops if o != "destroy" and o not in seen]
if len(ops) < 40:
    print(f"FAIL only {len(ops)} ops found in TZ_BACKEND_OPS")
    sys.exit(1)
if missing:
    print("FAIL ops of the table without a case in test_cuda_ops or test_offload_ops: " +
          ", ".join(missing))
    sys.exit(1)
print(f"ok   every op of the table but destroy has a case: {len(ops) - 1} ops called on the "
      "emulated CUDA backend")
PY

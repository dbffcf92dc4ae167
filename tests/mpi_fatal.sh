#!/bin/sh
# One rank's TZ_FATAL (or MPI error through MPI_CHECK) must stop every rank: runs tz_comm_check
# under `timeout 60 mpirun`, checks the exit status, the message on stderr, and no hang.
set -u
MPIEXEC=${1:?usage: mpi_fatal.sh MPIEXEC NUMPROC_FLAG TZ_COMM_CHECK}
NPFLAG=${2:?usage: mpi_fatal.sh MPIEXEC NUMPROC_FLAG TZ_COMM_CHECK}
TOOL=${3:?usage: mpi_fatal.sh MPIEXEC NUMPROC_FLAG TZ_COMM_CHECK}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/tzfatal.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT
pass=0
fail=0

ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() {
    echo "FAIL $1"
    sed 's/^/    | /' "$TMP/err" | tail -n 20
    fail=$((fail + 1))
}

# run NAME NP ARGS...: runs the tool; sets rc and took
run() {
    name=$1 np=$2
    shift 2
    start=$(date +%s)
    timeout -k 10 60 "$MPIEXEC" "$NPFLAG" "$np" --oversubscribe "$TOOL" "$@" \
        >"$TMP/out" 2>"$TMP/err"
    rc=$?
    took=$(($(date +%s) - start))
}

# expect NAME PATTERN: after run, non-zero exit without timeout, PATTERN (grep -E) on stderr,
# and no rank went past the collective.
expect() {
    name=$1 pattern=$2
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        bad "$name: timed out after ${took}s (the other ranks hung)"
        return
    fi
    if [ "$rc" -eq 0 ]; then
        bad "$name: exited 0"
    else
        ok "$name: exit status $rc after ${took}s"
    fi
    if grep -Eq -- "$pattern" "$TMP/err"; then
        ok "$name: stderr has the tagged message"
    else
        bad "$name: stderr lacks: $pattern"
    fi
    if grep -q 'were not stopped' "$TMP/out"; then
        bad "$name: the other ranks went on past the collective"
    else
        ok "$name: the other ranks did not go on"
    fi
}

for np in 2 3; do
    run "np $np" "$np" --fatal-rank 1
    expect "np $np, TZ_FATAL on rank 1" '^\[rank 1\] deliberate failure on rank 1'
done
run "np 3" 3 --mpi-error-rank 2
expect "np 3, MPI error on rank 2 through MPI_CHECK" '^\[rank 2\] MPI_Bcast\(.*\) failed: .*MPI error'
export TZ_DEBUG=1
run "np 2, TZ_DEBUG=1" 2 --fatal-rank 1
unset TZ_DEBUG
expect "np 2, TZ_DEBUG=1 keeps the source location" \
    '^\[rank 1\] .*tz_comm_check\.c:[0-9]+ main: deliberate failure on rank 1'
echo "mpi_fatal: $pass passed, $fail failed"
[ "$fail" -eq 0 ]

#!/usr/bin/env bash
# A checkpoint shard that cannot be written out (docs/guide.md, "Surviving preemption": a
# full disk stops the run with the error on every rank and keeps the previous checkpoint).
# The failure is a real one: the rank that writes the shard runs under a file size limit
# (ulimit -f, SIGXFSZ ignored, so a write past it fails with EFBIG) of half its shard, so
# HDF5's own writes fail, mostly those it makes while closing the datasets and the file.
# At N = 1 and N = 2 (the last rank limited), a run with checkpoint step-2 is resumed under
# the limit: its step-4 checkpoint fails with the shard's name and the reason on every rank,
# the run exits with an error status (not a signal: HDF5 used to segfault there, exit 139),
# step-2 stays as it was, no step-4 or temporary folder is left, and a --resume without the
# limit then ends bit for bit as the uninterrupted run (metrics.jsonl and adapter).
# usage: full_disk_test.sh TURBOZERO SOURCE_DIR MPIEXEC
set -u
tz=$1 src=$2 mpiexec=$3
py=/usr/bin/python3
source "$(dirname "$0")/common.sh"
ckpt_setup tzfull 6
out=adapter/adapter_model.safetensors
# The ranks run under this wrapper: rank LIMIT_RANK gets a file size limit of LIMIT_KIB.
# (Set inside the rank, not around mpirun: the launcher's own files must not be limited.)
cat > "$work/limit.sh" <<'SH'
#!/usr/bin/env bash
trap '' XFSZ
r=${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-0}}
if [ -n "${LIMIT_KIB:-}" ] && [ "$r" = "$LIMIT_RANK" ]; then ulimit -f "$LIMIT_KIB" || exit 1; fi
exec "$@"
SH
chmod +x "$work/limit.sh"

# run N DIR [args...]: N ranks through mpirun and the wrapper, 12 rows per step whatever N
run() {
  local n=$1 dir=$2; shift 2
  timeout 300 "$mpiexec" -np $n "$work/limit.sh" "$tz" train "$work/run.cfg" \
    --set train.micro_batch=$((12 / n)) --set run.dir="$dir" "$@" > "$dir.log" 2>&1
}

for n in 1 2; do
  ref="$work/ref$n" d="$work/full$n" last=$((n - 1))
  run $n "$ref" || { bad "uninterrupted run at N=$n failed"; tail -5 "$ref.log"; continue; }
  TZ_CKPT_FAULT=rank=0,at=step,step=3,do=kill run $n "$d"
  if [ ! -f "$d/checkpoints/step-2/COMPLETE" ]; then
    bad "N=$n: no step-2 checkpoint before the failing write"; tail -5 "$d.log"; continue
  fi
  cp -a "$d/checkpoints" "$d.kept"
  shard=$(printf "rank-%05d.h5" $last)
  kib=$(( $(stat -c %s "$d/checkpoints/step-2/$shard") / 2048 ))
  LIMIT_RANK=$last LIMIT_KIB=$kib run $n "$d" --resume
  rc=$?
  msg="rank $last failed: .*checkpoints/.tmp-step-4/$shard: File too large"
  every=1
  for r in $(seq 0 $last); do grep -q "\[rank $r\] .*$msg" "$d.log" || every=0; done
  if [ $rc -ne 0 ] && [ $rc -lt 128 ] && [ $every = 1 ] && ! grep -q "Segmentation\|signal 11" "$d.log" &&
     grep -q "step-4 was not written; earlier checkpoints are kept" "$d.log"; then
    ok "N=$n: shard $shard over the file size limit ($kib KiB): exit $rc, the error named on every rank"
  else
    bad "N=$n: failing shard write: exit $rc"; tail -8 "$d.log"
  fi
  if diff -r "$d.kept" "$d/checkpoints" > /dev/null; then
    ok "N=$n: step-2 unchanged, no step-4 and no temporary folder left"
  else
    bad "N=$n: checkpoints changed: $(ls -a "$d/checkpoints" | tr '\n' ' ')"
  fi
  if run $n "$d" --resume && grep -q "resumed from .*step-2" "$d.log" && same_run "$ref" "$d" $out; then
    ok "N=$n: --resume from step-2 then ends bit for bit as the uninterrupted run"
  else
    bad "N=$n: --resume after the failed write"; tail -5 "$d.log"
  fi
done

finish full_disk

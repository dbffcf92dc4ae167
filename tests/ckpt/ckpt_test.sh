#!/usr/bin/env bash
# Checkpoints and resume (docs/guide.md, "Surviving preemption"), on the awkward tiny Llama
# and the ZeRO test's configuration and tolerances (tests/zero/zero_test.sh, compare.py):
#  1. resume at N = 1, 2, 3 from checkpoints written by 4 and by 2 ranks, LoRA on a dense
#     base, full fine-tuning of a dense and of a 4-bit base: the losses after the resumed
#     step and the final parameters equal the uninterrupted run's within the ZeRO test's
#     tolerances (TOL; TOLQ, SCALES, CODES for the 4-bit base); at the writing N, bit for bit.
#  2. a 2-rank run killed (SIGKILL) before a marker, while a rank writes its shard, before
#     the rename and between steps, then stopped by SIGUSR1 (exit status 75), resumed each
#     time: every earlier checkpoint's shards stay byte-identical to the uninterrupted
#     run's, and the end result equals the uninterrupted run bit for bit (losses, adapter).
#  3. a truncated shard, a flipped byte, a missing shard, a folder without its marker: each
#     refused with its name, --resume falls back to the previous complete checkpoint and
#     still ends bit for bit where the uninterrupted run does; one named checkpoint that is
#     damaged is refused outright; so is a resume with another global batch.
#  4. a shard write that fails (a full disk, simulated) and a checkpoint folder that cannot
#     be made: an error on every rank, the earlier checkpoint kept.
#  5. SIGTERM: the step finishes, a checkpoint is written, the exit status is 75 (SIGUSR1,
#     forwarded by mpirun, is part of 2); SIGINT twice stops at once without a checkpoint.
# The fault points come from TZ_CKPT_FAULT (train/checkpoint.h), a test hook.
# usage: ckpt_test.sh TURBOZERO SOURCE_DIR MPIEXEC
set -u
tz=$1 src=$2 mpiexec=$3
py=/usr/bin/python3
TOL=1e-6
TOLQ=2e-3 SCALES=2e-2 CODES=0.02   # 4-bit base: see tests/zero/zero_test.sh
source "$(dirname "$0")/common.sh"
ckpt_setup tzckpt 6

# train N DIR [args...]: N ranks, 12 rows per step whatever N
train() {
  local n=$1 dir=$2; shift 2
  timeout 300 "$mpiexec" -np $n "$tz" train "$work/run.cfg" --set train.micro_batch=$((12 / n)) \
    --set run.dir="$dir" "$@" > "$dir.log" 2>&1
}
# the "loss" of step S of a run, one line per step > S: "S loss"
losses_after() {
  grep -o '"step": [0-9]*, "loss": [0-9.e+-]*' "$2/metrics.jsonl" | tr -d '",' |
    awk -v s=$1 '$2 > s {print $2, $4}'
}
worst_rel() { # worst relative loss difference of two "step loss" lists (files), or a reason
  paste "$1" "$2" | awk '{ if ($1 != $3) { bad = 1 } d = $2 - $4; if (d < 0) d = -d; r = d / $2;
    if (r > w) w = r; n++ } END { if (bad || n == 0) print "steps:" n; else printf "%.3e", w }'
}
out_of() { [ $1 = lora ] && echo adapter/adapter_model.safetensors || echo model/model.safetensors; }
args_of() {
  case $1 in
    lora) echo "--set train.mode=lora" ;;
    full) echo "--set train.mode=full" ;;
    fullq) echo "--set train.mode=full --set quant.bits=4 --set quant.group=64" ;;
  esac
}

# ---- 1. resume at another N (and the same N, bit for bit)
# variant: the writing N's, then writer:reader pairs
declare -A writers=([lora]="4 2" [full]="2" [fullq]="4 2")
declare -A plan=([lora]="4:1 4:3" [full]="2:1 2:2" [fullq]="4:2 2:3 2:2")
for v in lora full fullq; do
  a=$(args_of $v) out=$(out_of $v)
  for w in ${writers[$v]}; do
    train $w "$work/$v-ref$w" $a || { bad "$v: uninterrupted run at N=$w failed"; tail -5 "$work/$v-ref$w.log"; }
  done
  for wn in ${plan[$v]}; do
    w=${wn%:*} n=${wn#*:} ref="$work/$v-ref$w" dir="$work/$v-from$w-n$n"
    from=$([ $n = 2 ] && [ $w = 2 ] && echo 4 || echo 2)   # bitwise case: resume late
    if ! train $n "$dir" $a --resume "$ref/checkpoints/step-$from"; then
      bad "$v: resume at N=$n from the step-$from checkpoint of N=$w failed"; tail -5 "$dir.log"; continue
    fi
    losses_after $from "$ref" > "$dir.ref.l"
    losses_after $from "$dir" > "$dir.l"
    if [ $w = $n ]; then
      if [ -s "$dir.l" ] && cmp -s "$dir.ref.l" "$dir.l" && cmp -s "$ref/$out" "$dir/$out"; then
        ok "$v: written and resumed at N=$n (step $from): losses and $out bit for bit"
      else
        bad "$v: N=$n resume differs from the uninterrupted run"
      fi
      continue
    fi
    worst=$(worst_rel "$dir.ref.l" "$dir.l")
    if [ $v = fullq ]; then
      pw=$($py "$src/tests/zero/compare.py" "$ref/$out" "$dir/$out" $SCALES $CODES); prc=$? tol=$TOLQ
    else
      pw=$($py "$src/tests/zero/compare.py" "$ref/$out" "$dir/$out" $TOL); prc=$? tol=$TOL
    fi
    if [[ "$worst" =~ ^[0-9.e+-]+$ ]] && awk -v x="$worst" -v t=$tol 'BEGIN {exit !(x <= t)}' && [ $prc -eq 0 ]; then
      ok "$v: written by $w ranks, resumed by $n at step $from: losses within $worst, parameters within $pw"
    else
      bad "$v: written by $w, resumed by $n: losses differ by $worst, parameters by $pw"
    fi
  done
done
grep -q "resumed from .*step-2: step 2, written by 4 ranks (zero stage 2), read by 3" "$work/lora-from4-n3.log" &&
  ok "the resume names its checkpoint and both rank counts" || bad "no resume line in lora-from4-n3.log"

# ---- 2. SIGKILL at several moments and SIGUSR1, resumed each time (LoRA, 2 ranks)
ref="$work/lora-ref2" k="$work/kill"
intact() { # intact STEP...: those checkpoints of $k are complete, shards equal the reference's
  for st in "$@"; do
    [ -f "$k/checkpoints/step-$st/COMPLETE" ] && cmp -s "$k/checkpoints/step-$st/rank-00000.h5" "$ref/checkpoints/step-$st/rank-00000.h5" &&
      cmp -s "$k/checkpoints/step-$st/rank-00001.h5" "$ref/checkpoints/step-$st/rank-00001.h5" || return 1
  done
}
# fault, the complete checkpoints expected after it, the one that must not exist
n=0
for row in "rank=0,at=meta,step=2;;2" "rank=1,at=shard,step=4;2;4" "rank=0,at=rename,step=4;2;4" "rank=1,at=step,step=5;2 4;6"; do
  IFS=';' read -r fault kept absent <<< "$row"
  n=$((n + 1))
  resume=$([ $n -gt 1 ] && echo --resume)
  TZ_CKPT_FAULT=$fault,do=kill train 2 "$k" --set train.mode=lora $resume
  rc=$?
  if [ $rc -ne 0 ] && grep -q "TZ_CKPT_FAULT: kill" "$k.log" && intact $kept && [ ! -e "$k/checkpoints/step-$absent" ]; then
    ok "killed at $fault (exit $rc): complete checkpoints [$kept] byte-identical to the uninterrupted run's, no step-$absent"
  else
    bad "killed at $fault: exit $rc, checkpoints: $(ls -a "$k/checkpoints" 2>&1 | tr '\n' ' ')"; tail -3 "$k.log"
  fi
  [ $n -eq 2 ] && { grep -q "no checkpoint in .* yet: starting from step 0" "$k.log" && ok "--resume with no checkpoint yet starts from step 0" ||
    bad "--resume without a checkpoint"; }
done
wait_for() { # wait_for FILE PATTERN: up to 120 s
  for _ in $(seq 1 600); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.2; done; return 1
}
# SIGUSR1 to mpirun (which forwards it to the ranks) while rank 0 waits after step 5
TZ_CKPT_FAULT=rank=0,at=step,step=5,do=pause "$mpiexec" -np 2 "$tz" train "$work/run.cfg" --set train.micro_batch=6 \
  --set run.dir="$k" --set train.mode=lora --resume > "$k.log" 2>&1 &
pid=$!
wait_for "$k.log" "TZ_CKPT_FAULT: pause" && kill -USR1 $pid
wait $pid
rc=$?
if [ $rc -eq 75 ] && grep -q "SIGUSR1 received" "$k.log" && intact 2 4 && [ -f "$k/checkpoints/step-5/COMPLETE" ]; then
  ok "SIGUSR1 after step 5: checkpoint step-5 written, exit status 75"
else
  bad "SIGUSR1: exit $rc"; tail -5 "$k.log"
fi
# a stopped run (its checkpoints and staged log) is neither replaced nor mixed by a new run
# that forgets --resume
if ! train 2 "$k" --set train.mode=lora && grep -q "already holds a run (.*checkpoints)" "$k.log" &&
   [ -f "$k/checkpoints/step-5/COMPLETE" ] && [ -f "$k/staging/metrics.jsonl" ]; then
  ok "a new run without --resume on the stopped run's folder: refused, its checkpoints and log kept"
else
  bad "a new run without --resume on a stopped run's folder"; tail -3 "$k.log"
fi
if train 2 "$k" --set train.mode=lora --resume && grep -q "resumed from .*step-5" "$k.log" &&
   same_run "$ref" "$k" adapter/adapter_model.safetensors; then
  ok "after four kills and a SIGUSR1 the run equals the uninterrupted one bit for bit (metrics.jsonl and adapter)"
else
  bad "the interrupted run differs from the uninterrupted one"; tail -3 "$k.log"
fi

# ---- 3. damaged checkpoints: refused by name, fall back to the previous complete one
d="$work/damaged" c="$work/damaged/checkpoints"
cp -r "$ref" "$d"
rm -rf "$d/adapter"
mkdir "$d/staging" && mv "$d/metrics.jsonl" "$d/staging/"   # as a run stopped would leave it
for s in 5 6 7 8; do   # newer copies of step 4, stamped as steps 5-8 (marker too), each damaged
  cp -r "$c/step-4" "$c/step-$s"
  $py - "$c/step-$s" $s <<'PY'
import json, sys, zlib
d, s = sys.argv[1], int(sys.argv[2])
m = json.load(open(d + "/checkpoint.json"))
m["step"], m["steps"], m["data"]["next_row"] = s, max(m["steps"], s + 1), s * m["data"]["global_batch"]
t = json.dumps(m, indent=1).encode()
open(d + "/checkpoint.json", "wb").write(t)
open(d + "/COMPLETE", "w").write("step %d\ncheckpoint.json %d %08x\n" % (s, len(t), zlib.crc32(t)))
PY
done
truncate -s 20000 "$c/step-8/rank-00001.h5"
$py - "$c/step-7/rank-00000.h5" <<'PY'
import sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read()); b[len(b) // 2] ^= 0x10; open(p, "wb").write(b)
PY
rm "$c/step-6/rank-00001.h5"
rm "$c/step-5/COMPLETE"
mkdir "$work/kept" && cp -r "$c/step-7" "$work/kept/"   # the resume below retires step-5..8
if train 2 "$d" --set train.mode=lora --resume; then
  for pat in "step-8/rank-00001.h5: 20000 bytes, expected" "step-7/rank-00000.h5: CRC-32 .* (damaged)" \
             "step-6/rank-00001.h5: missing shard" "step-5: no COMPLETE marker" \
             "falling back to the previous checkpoint, .*step-4" "resumed from .*step-4.*refused above"; do
    grep -q "$pat" "$d.log" && ok "damaged: '$pat'" || bad "damaged: no '$pat' in the log"
  done
  same_run "$ref" "$d" adapter/adapter_model.safetensors && ok "the fallback resume ends bit for bit as the uninterrupted run" ||
    bad "the fallback resume differs"
  [ "$(ls "$c")" = "$(printf 'step-2\nstep-4')" ] && [ ! -e "$d/checkpoints.replaced" ] &&
    ok "the refused newer checkpoints were set aside and went with the commit: $(ls "$c" | tr '\n' ' ')" ||
    bad "after the fallback run.dir/checkpoints holds: $(ls "$c" | tr '\n' ' ')"
else
  bad "resume past damaged checkpoints failed"; tail -5 "$d.log"
fi
if ! train 2 "$work/named" --set train.mode=lora --resume "$work/kept/step-7" && grep -q "step-7/rank-00000.h5: CRC-32" "$work/named.log" &&
   grep -q "the checkpoint is incomplete, damaged or inconsistent" "$work/named.log"; then
  ok "a named damaged checkpoint is refused outright, with the file named"
else
  bad "--resume of a damaged named checkpoint"; tail -3 "$work/named.log"
fi

if ! train 3 "$work/batch" --set train.mode=lora --set train.micro_batch=2 --resume "$ref/checkpoints/step-2" &&
   grep -q "the checkpoint's steps are 12 rows each, this run's 6" "$work/batch.log"; then
  ok "a resume that would change the global batch (and so the data order) is refused"
else
  bad "resume with another global batch"; tail -3 "$work/batch.log"
fi

# ---- 4. a failing write: an error on every rank, the earlier checkpoint kept
e="$work/full-disk"
TZ_CKPT_FAULT=rank=1,at=shard,step=4,do=fail train 2 "$e" --set train.mode=lora
rc=$?
if [ $rc -ne 0 ] && grep -q "\[rank 0\] .*rank 1 failed: .*rank-00001.h5: No space left on device" "$e.log" &&
   grep -q "\[rank 1\] .*rank 1 failed: .*No space left on device" "$e.log" && grep -q "was not written; earlier checkpoints are kept" "$e.log" &&
   k=$e && intact 2 && [ ! -e "$e/checkpoints/step-4" ] && [ ! -e "$e/checkpoints/.tmp-step-4" ]; then
  ok "a failed shard write: exit $rc, the error on both ranks, step-2 kept intact"
else
  bad "failed shard write: exit $rc"; tail -5 "$e.log"
fi
u="$work/unwritable"
mkdir -p "$u" && : > "$u/checkpoints"   # a file where the folder should be
train 2 "$u" --set train.mode=lora --set run.overwrite=true
rc=$?
if [ $rc -ne 0 ] && grep -q "\[rank 1\] .*rank 0 failed: .*checkpoints" "$u.log" && grep -q "\[rank 0\] .*rank 0 failed: .*checkpoints" "$u.log"; then
  ok "a checkpoint folder that cannot be made: exit $rc, the error on both ranks"
else
  bad "unwritable checkpoint folder: exit $rc"; tail -5 "$u.log"
fi

# ---- 5. signals
t="$work/term"   # one process without mpirun
TZ_CKPT_FAULT=rank=0,at=step,step=3,do=pause "$tz" train "$work/run.cfg" --set train.micro_batch=12 --set run.dir="$t" > "$t.log" 2>&1 &
pid=$!
wait_for "$t.log" "TZ_CKPT_FAULT: pause" && kill -TERM $pid
wait $pid
rc=$?
[ $rc -eq 75 ] && [ -f "$t/checkpoints/step-3/COMPLETE" ] && ok "SIGTERM: checkpoint step-3, exit status 75" ||
  { bad "SIGTERM: exit $rc"; tail -3 "$t.log"; }
i="$work/int"
TZ_CKPT_FAULT=rank=0,at=begin,step=2,do=hold "$tz" train "$work/run.cfg" --set train.micro_batch=12 --set run.dir="$i" > "$i.log" 2>&1 &
pid=$!
wait_for "$i.log" "TZ_CKPT_FAULT: hold" && kill -INT $pid && sleep 0.5 && kill -0 $pid && kill -INT $pid
wait $pid
rc=$?
[ $rc -eq 130 ] && [ ! -e "$i/checkpoints/step-2" ] && ok "SIGINT twice: stopped at once (exit $rc), no checkpoint" ||
  { bad "SIGINT twice: exit $rc"; tail -3 "$i.log"; }

finish ckpt

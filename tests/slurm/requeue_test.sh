#!/usr/bin/env bash
# Preemption under a real (local, one-node) Slurm with the sbatch template: a 2-rank job
# gets USR1 in its batch shell (what #SBATCH --signal=B:USR1@<seconds> delivers ahead of the
# time limit), the script forwards it to srun, the ranks finish the step, write a
# checkpoint and exit with 75, the script requeues the job, and the requeued job resumes
# (SLURM_RESTART_COUNT) and finishes: the same losses and adapter, bit for bit, as an
# uninterrupted `mpirun -np 2` run. Rank 0 waits after step 3 (TZ_CKPT_FAULT, a test hook)
# so the signal arrives at a known step.
# usage: requeue_test.sh TURBOZERO SOURCE_DIR MPIEXEC   (skips, exit 77, without Slurm)
set -u
tz=$1 src=$2 mpiexec=$3
for c in slurmctld slurmd munged sbatch srun squeue scontrol scancel; do
  command -v $c >/dev/null || { echo "$c not installed: skipping the Slurm requeue test"; exit 77; }
done
[ "$(id -u)" -eq 0 ] || { echo "the local Slurm cluster needs root: skipping"; exit 77; }
work=$(mktemp -d "${TMPDIR:-/tmp}/tzrequeue.XXXXXX")
chmod 755 "$work"   # munged wants every folder above its socket searchable
cleanup() { bash "$src/slurm/local-cluster.sh" stop "$work/cluster"; rm -rf "$work"; }
trap cleanup EXIT
source "$(dirname "$0")/../lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
unset TZ_CKPT_FAULT
conf=$(bash "$src/slurm/local-cluster.sh" start "$work/cluster") || { echo "the local Slurm did not start"; exit 1; }
eval "$conf"
cd "$src"
set -- --set train.steps=6 --set data.seq_len=64 --set train.micro_batch=4 --set train.eval_every=2 \
       --set train.eval_windows=16 --set train.threads=1 --set zero.bucket_mb=0.25
id=$(TZ_CKPT_FAULT=rank=0,at=step,step=3,do=pause TZ_BIN="$tz" sbatch --parsable --ntasks-per-node=2 \
       --cpus-per-task=1 -o "$work/job.out" slurm/train.sbatch inputs/llama/finetune.cfg "$@" --set run.dir="$work/srun")
for _ in $(seq 1 600); do grep -q "TZ_CKPT_FAULT: pause" "$work/job.out" 2>/dev/null && break; sleep 0.2; done
scancel --batch --signal=USR1 "$id"   # to the batch shell only, as --signal=B:USR1 does
for _ in $(seq 1 1500); do  # the requeued job starts again after about 11 s (local-cluster.sh)
  [ -z "$(squeue -h -j "$id" 2>/dev/null)" ] && break
  sleep 0.2
done
show=$(scontrol show job "$id")
state=$(echo "$show" | grep -o 'JobState=[A-Z]*') code=$(echo "$show" | grep -o ' ExitCode=[0-9:]*')
restarts=$(echo "$show" | grep -o 'Restarts=[0-9]*')
if [ "$state" = JobState=COMPLETED ] && [ "$code" = " ExitCode=0:0" ] && [ "$restarts" = Restarts=1 ]; then
  ok "sbatch job $id: USR1, requeued once, then $state$code"
else
  bad "sbatch job $id: $state$code $restarts"; tail -20 "$work/job.out"
fi
grep -q "SIGUSR1 received" "$work/job.out" && grep -q "requeueing job $id" "$work/job.out" &&
  grep -q "resumed from .*step-3: step 3, written by 2 ranks" "$work/job.out" &&
  ok "the ranks wrote step-3 on USR1, the job was requeued and resumed from it" ||
  { bad "no checkpoint, requeue or resume line in the job's log"; tail -20 "$work/job.out"; }
"$mpiexec" -np 2 --oversubscribe "$tz" train inputs/llama/finetune.cfg "$@" --set run.dir="$work/mpirun" > "$work/mpirun.log" 2>&1 ||
  bad "mpirun -np 2 failed"
if same_run "$work/srun" "$work/mpirun" adapter/adapter_model.safetensors; then
  ok "the preempted and requeued job equals an uninterrupted run bit for bit (losses, evaluations, adapter)"
else
  bad "the requeued job differs from the uninterrupted run"
  diff <(strip_timing "$work/srun/metrics.jsonl") <(strip_timing "$work/mpirun/metrics.jsonl") | head
fi
finish requeue

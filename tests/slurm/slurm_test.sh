#!/usr/bin/env bash
# The sbatch template on a real (local, one-node) Slurm: slurm/train.sbatch with 2 tasks
# launched by srun --mpi=pmix must train exactly like `mpirun -np 2` (identical losses:
# the same ranks do the same arithmetic), with local ranks 0/2 and 1/2 from MPI.
# usage: slurm_test.sh TURBOZERO SOURCE_DIR MPIEXEC   (skips, exit 77, without Slurm)
set -u
tz=$1 src=$2 mpiexec=$3
for c in slurmctld slurmd munged sbatch srun squeue scontrol; do
  command -v $c >/dev/null || { echo "$c not installed: skipping the Slurm test"; exit 77; }
done
[ "$(id -u)" -eq 0 ] || { echo "the local Slurm cluster needs root: skipping"; exit 77; }
work=$(mktemp -d "${TMPDIR:-/tmp}/tzslurm.XXXXXX")
chmod 755 "$work"   # munged wants every folder above its socket searchable
cleanup() { bash "$src/slurm/local-cluster.sh" stop "$work/cluster"; rm -rf "$work"; }
trap cleanup EXIT
source "$(dirname "$0")/../lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
conf=$(bash "$src/slurm/local-cluster.sh" start "$work/cluster") || { echo "the local Slurm did not start"; exit 1; }
eval "$conf"
cd "$src"
set -- --set train.steps=8 --set data.seq_len=64 --set train.micro_batch=4 \
       --set train.eval_windows=16 --set train.threads=1 --set zero.bucket_mb=0.25
id=$(TZ_BIN="$tz" sbatch --parsable --ntasks-per-node=2 --cpus-per-task=1 -o "$work/job.out" \
       slurm/train.sbatch inputs/llama/finetune.cfg "$@" --set run.dir="$work/srun")
for _ in $(seq 1 600); do
  [ -z "$(squeue -h -j "$id" 2>/dev/null)" ] && break
  sleep 0.2
done
state=$(scontrol show job "$id" | grep -o 'JobState=[A-Z]*') code=$(scontrol show job "$id" | grep -o ' ExitCode=[0-9:]*')
if [ "$state" = JobState=COMPLETED ] && [ "$code" = " ExitCode=0:0" ]; then ok "sbatch job $id: $state$code"
else bad "sbatch job $id: $state$code"; tail -20 "$work/job.out"; fi
grep -q "\[rank 1\] rank 1/2 | local rank 1/2" "$work/job.out" && grep -q "\[rank 0\] rank 0/2 | local rank 0/2" "$work/job.out" &&
  ok "two ranks, local ranks from MPI" || bad "rank lines missing"
"$mpiexec" -np 2 --oversubscribe "$tz" train inputs/llama/finetune.cfg "$@" --set run.dir="$work/mpirun" > "$work/mpirun.log" 2>&1 ||
  bad "mpirun -np 2 failed"
if same_run "$work/srun" "$work/mpirun" adapter/adapter_model.safetensors; then
  ok "srun and mpirun runs give identical losses and adapters"
else
  bad "srun and mpirun runs differ"
fi
finish slurm

#!/usr/bin/env bash
# A real one-node Slurm cluster in a private folder, for tests and trying the sbatch
# template without a cluster: munged with its own key and socket, slurmctld and slurmd on
# non-default ports, 8 CPUs (config_overrides lets several tasks share 2 cores). A requeued
# job waits out its credential's lifetime (cred_expire, 10 s here, 120 by default) and is then
# started by the main scheduling pass, run every second here (sched_interval; 60 by default,
# which left a requeued job pending for up to a minute).
#   slurm/local-cluster.sh start DIR   -> prints "export SLURM_CONF=DIR/slurm.conf" (stdout)
#                                         and the node's CPUs and memory (stderr)
#   slurm/local-cluster.sh stop DIR
# Needs root and the Debian packages slurmctld slurmd slurm-client munge.
set -euo pipefail
cmd=${1:?usage: local-cluster.sh start|stop DIR} dir=${2:?usage: local-cluster.sh start|stop DIR}
stop_pid() { [ -f "$1" ] && kill "$(cat "$1")" 2>/dev/null || true; }
if [ "$cmd" = stop ]; then
  stop_pid "$dir/slurmd.pid"; stop_pid "$dir/slurmctld.pid"; stop_pid "$dir/munged.pid"
  exit 0
fi
mkdir -p "$dir/munge" "$dir/sock" "$dir/state" "$dir/spool"
chmod 700 "$dir/munge"   # the key's folder is private; the socket's must be searchable
chmod 755 "$dir" "$dir/sock"
dd if=/dev/urandom of="$dir/munge/key" bs=1024 count=1 2>/dev/null
chmod 400 "$dir/munge/key"
munged --key-file="$dir/munge/key" --socket="$dir/sock/munge.sock" --pid-file="$dir/munged.pid" \
  --log-file="$dir/munged.log" --seed-file="$dir/munge/seed"
port=$((20000 + RANDOM % 20000))
cat > "$dir/slurm.conf" <<CONF
ClusterName=tzlocal
SlurmctldHost=localhost
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/sock/munge.sock,cred_expire=10
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmix
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MailProg=/bin/true
ReturnToService=2
MinJobAge=300
SlurmdParameters=config_overrides
NodeName=localhost NodeAddr=127.0.0.1 CPUs=8 RealMemory=4000
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF="$dir/slurm.conf"
slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF" -N localhost
for _ in $(seq 1 150); do
  if srun -n1 -t1 true 2>/dev/null; then
    # what a job may ask for (to stderr: stdout is the line to eval)
    scontrol show node localhost | tr ' ' '\n' | grep -E '^(CPUTot|RealMemory|Partitions)=' |
      tr '\n' ' ' | sed 's/^/local cluster: node localhost: /; s/ $/ (a job fits when ntasks x cpus-per-task <= CPUTot)\n/' >&2
    echo "export SLURM_CONF=$SLURM_CONF"
    exit 0
  fi
  sleep 0.2
done
echo "local Slurm did not come up; logs in $dir" >&2
exit 1

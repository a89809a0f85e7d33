#!/usr/bin/env bash
# A one-node Slurm cluster on localhost, without systemd, for the sweep tests:
#   cluster.sh up DIR     writes DIR/slurm.conf, starts munged (unless one runs), slurmctld and
#                         slurmd, waits until the node is idle; clients then need
#                         SLURM_CONF=DIR/slurm.conf
#   cluster.sh down DIR   stops what `up` started
# Needs Debian's slurmctld, slurmd, slurm-client and munge packages, and root (slurmd starts
# jobs; munged runs as the munge user).
set -euo pipefail
action=${1:?usage: cluster.sh up|down DIR}
dir=$(mkdir -p "${2:?usage: cluster.sh up|down DIR}" && cd "$2" && pwd)
export SLURM_CONF="$dir/slurm.conf"

stop_pid_file() {
    local file=$1
    [ -f "$file" ] || return 0
    local pid
    pid=$(cat "$file")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$file"
}

if [ "$action" = down ]; then
    stop_pid_file "$dir/slurmd.pid"
    stop_pid_file "$dir/slurmctld.pid"
    if [ -f "$dir/munged.started" ]; then
        stop_pid_file /run/munge/munged.pid
        rm -f "$dir/munged.started"
    fi
    exit 0
fi
[ "$action" = up ] || { echo "usage: cluster.sh up|down DIR" >&2; exit 2; }

if pgrep -x slurmctld >/dev/null; then
    echo "slurm: a slurmctld is already running on this host; stop it first" >&2
    exit 1
fi
node=$(hostname -s)
cpus=$(nproc)
mkdir -p "$dir/state" "$dir/spool"
cat > "$SLURM_CONF" <<CONF
ClusterName=lra-test
SlurmctldHost=$node(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MinJobAge=10
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF

if ! pgrep -x munged >/dev/null; then
    mkdir -p /run/munge
    chown munge:munge /run/munge
    chmod 0755 /run/munge
    runuser -u munge -- /usr/sbin/munged
    touch "$dir/munged.started"
fi
/usr/sbin/slurmctld -f "$SLURM_CONF"
/usr/sbin/slurmd -f "$SLURM_CONF" -N "$node"
for _ in $(seq 120); do
    state=$(sinfo --noheader --format=%T 2>/dev/null | head -1 || true)
    if [ "$state" = idle ]; then
        echo "slurm: node $node idle ($cpus CPUs), SLURM_CONF=$SLURM_CONF"
        exit 0
    fi
    sleep 0.5
done
echo "slurm: the node did not come up (state: ${state:-none}); see $dir/slurmctld.log and $dir/slurmd.log" >&2
exit 1

#!/usr/bin/env bash
# Start a single-node Slurm on this machine (Debian's slurm-wlm and munge), for the `slurm` tests.
#
# Installs the packages when they are missing (apt-get, as root), writes /etc/slurm/slurm.conf for
# this host (its real CPU count and memory as `slurmd -C` reports them, one partition `debug`),
# starts munged, slurmctld and slurmd, and waits until `sinfo` shows the node idle.
# Idempotent: when `sinfo` already answers, it does nothing. Stop it with .ci/slurm_down.sh.
set -euo pipefail

log() { echo "slurm_up: $*" >&2; }

if command -v sinfo >/dev/null 2>&1 && timeout 10 sinfo -h >/dev/null 2>&1; then
    log "a Slurm controller already answers; leaving it as it is"
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    log "not root: cannot install or start Slurm"
    exit 1
fi

if ! command -v slurmctld >/dev/null 2>&1 || ! command -v munged >/dev/null 2>&1; then
    log "installing slurm-wlm and munge"
    export DEBIAN_FRONTEND=noninteractive
    timeout 600 apt-get update -q >/dev/null
    timeout 900 apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null
fi

# munge: a key (the package makes one; make it when a minimal image did not) and the daemon.
install -d -o munge -g munge -m 0700 /etc/munge /var/lib/munge /var/log/munge
install -d -o munge -g munge -m 0755 /run/munge
if [ ! -s /etc/munge/munge.key ]; then
    runuser -u munge -- mungekey --create --keyfile=/etc/munge/munge.key
fi
chown munge:munge /etc/munge/munge.key
chmod 0400 /etc/munge/munge.key
if ! munge -n >/dev/null 2>&1; then
    runuser -u munge -- /usr/sbin/munged
    for _ in $(seq 50); do munge -n >/dev/null 2>&1 && break; sleep 0.1; done
fi
munge -n | unmunge >/dev/null

# slurm.conf: this host, its CPUs and memory, partition `debug`. The daemons run as root (no
# accounting database, no cgroups: a container or CI runner has neither).
host=$(hostname -s)
node=$(slurmd -C | head -n 1)  # NodeName=<host> CPUs=.. Boards=.. ... RealMemory=..
install -d /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/slurm
cat >/etc/slurm/slurm.conf <<EOF
# Written by opsynth's .ci/slurm_up.sh: a single-node cluster for tests.
ClusterName=opsynth-ci
SlurmctldHost=${host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurm/slurmctld.pid
SlurmdPidFile=/run/slurm/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
MpiDefault=none
ReturnToService=2
KillWait=5
MinJobAge=30
${node} NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=debug Nodes=${host} Default=YES MaxTime=INFINITE State=UP
EOF
log "$(grep -E '^(NodeName|PartitionName)' /etc/slurm/slurm.conf | tr '\n' ' ')"

/usr/sbin/slurmctld
/usr/sbin/slurmd
for _ in $(seq 120); do
    state=$(sinfo -h -N -o %T 2>/dev/null | head -n 1 || true)
    case "$state" in
        idle|mixed|allocated)
            # The node must also run a job: a runner that cannot would fail the tests instead of skipping them.
            if timeout 60 srun -N1 -n1 -t 1 true; then
                log "node $host is $state and runs jobs"
                exit 0
            fi
            log "node $host is $state but cannot run a job (srun failed); stopping"
            bash "$(dirname "$0")/slurm_down.sh"
            exit 1 ;;
        down*|drain*) scontrol update NodeName="$host" State=RESUME >/dev/null 2>&1 || true ;;
    esac
    sleep 0.5
done
log "sinfo did not show the node idle within 60 s (last state: ${state:-none}); see /var/log/slurm/"
exit 1

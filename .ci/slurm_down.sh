#!/usr/bin/env bash
# Stop the daemons .ci/slurm_up.sh started (slurmctld, slurmd, munged), by their pid files.
set -uo pipefail

stop() {  # stop <pidfile>: SIGTERM the process it names, wait up to 10 s
    local pid
    [ -s "$1" ] || return 0
    pid=$(cat "$1")
    kill "$pid" 2>/dev/null || return 0
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
}

[ -f /etc/slurm/slurm.conf ] && grep -q "opsynth's .ci/slurm_up.sh" /etc/slurm/slurm.conf || exit 0
scancel --user="$(id -un)" 2>/dev/null || true
stop /run/slurm/slurmd.pid
stop /run/slurm/slurmctld.pid
stop /run/munge/munged.pid
exit 0

#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for the Slurm executor's tests (tests/slurm_util.py)
# and for trying `bisect-cli runner --executor slurm` by hand: Debian's slurm-wlm and munge,
# slurmctld and slurmd on this host, task/cgroup with ConstrainRAMSpace (cgroup v1 or v2, as
# the host mounts it), a GRES "gpu" on a dummy device file so that GPU routing can be tested,
# SlurmdTimeout short enough that a killed slurmd fails its jobs (NODE_FAIL) within seconds,
# and MinJobAge long enough that `scontrol show job` still knows a job an hour after it ended
# (the executor reads outcomes there; no slurmdbd is needed).
#
# Idempotent: a cluster that already answers is left as it is. Root only (it writes
# /etc/slurm and starts daemons). Prints the seconds it took.
set -euo pipefail
start=$(date +%s.%N)
if sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
    echo "slurm: already up"
    exit 0
fi
if ! command -v slurmctld >/dev/null 2>&1 || ! command -v munged >/dev/null 2>&1; then
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
        slurm-wlm munge >/dev/null
fi

host=$(hostname -s)
mem_mib=$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
cpus=$(nproc)
if [ -f /sys/fs/cgroup/cgroup.controllers ] && grep -qw memory /sys/fs/cgroup/cgroup.controllers
then plugin=cgroup/v2; else plugin=cgroup/v1; fi
# The dummy GPU: a character device file (the same device as /dev/null), so that Slurm's
# gres/gpu plugin can stat it; nothing ever opens it.
[ -e /dev/leakbisect-gpu0 ] || mknod -m 0666 /dev/leakbisect-gpu0 c 1 3

mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge
chown slurm:slurm /var/spool/slurmctld
cat >/etc/slurm/slurm.conf <<EOF
# Written by leakbisect's .ci/slurm.sh: a one-node test cluster.
ClusterName=leakbisect
SlurmctldHost=$host
AuthType=auth/munge
SlurmUser=slurm
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup
JobAcctGatherType=jobacct_gather/cgroup
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
ReturnToService=2
SlurmdTimeout=6
MessageTimeout=5
MinJobAge=3600
KillWait=5
SchedulerParameters=sched_interval=2
NodeName=$host CPUs=$cpus RealMemory=$mem_mib Gres=gpu:1 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
cat >/etc/slurm/cgroup.conf <<EOF
CgroupPlugin=$plugin
ConstrainRAMSpace=yes
ConstrainSwapSpace=yes
AllowedSwapSpace=0
ConstrainDevices=no
EOF
cat >/etc/slurm/gres.conf <<EOF
NodeName=$host Name=gpu File=/dev/leakbisect-gpu0
EOF

if ! pgrep -x munged >/dev/null; then
    [ -s /etc/munge/munge.key ] || { mungekey --create 2>/dev/null \
        || dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 2>/dev/null; }
    chown munge:munge /etc/munge/munge.key /run/munge && chmod 0400 /etc/munge/munge.key
    su -s /bin/sh munge -c /usr/sbin/munged
fi
pgrep -x slurmctld >/dev/null || /usr/sbin/slurmctld
pgrep -x slurmd >/dev/null || /usr/sbin/slurmd
for _ in $(seq 60); do
    state=$(sinfo -h -n "$host" -o %T 2>/dev/null || true)
    case "$state" in idle*|mixed*|allocated*) break ;; esac
    # A node left down by an earlier run (slurmd killed by a test) is resumed.
    case "$state" in down*|drain*) scontrol update nodename="$host" state=resume || true ;; esac
    sleep 1
done
state=$(sinfo -h -n "$host" -o %T 2>/dev/null || true)
case "$state" in
    idle*|mixed*|allocated*) ;;
    *) echo "slurm: node $host is '${state:-unknown}' after 60 s; see /var/log/slurm" >&2
       exit 1 ;;
esac
printf 'slurm: one-node cluster up on %s (%s) in %.1f s\n' "$host" "$plugin" \
    "$(echo "$(date +%s.%N) - $start" | bc)"

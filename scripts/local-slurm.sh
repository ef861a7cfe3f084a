#!/usr/bin/env bash
# A real Slurm cluster on this machine, to try the Slurm engine without a cluster (and for the
# tests): munged, slurmctld and 4 slurmd (nodes n1..n4, each with an address of its own,
# 127.0.0.11..14), everything under one state directory, on ports that cannot clash with a
# system Slurm (controller 16817, nodes 17001-17004 by default).
#
#   scripts/local-slurm.sh up       install slurm-wlm + munge when missing (Debian, as root),
#                                   start the daemons (idempotent), write the profile
#                                   `local-slurm` (python -m jupyter_dlc.clusters put ...)
#   scripts/local-slurm.sh status   what runs, and sinfo
#   scripts/local-slurm.sh down     cancel every job, stop the daemons, remove the state
#                                   directory and the profile: nothing is left
#
# Environment: DLC_SLURM_DIR (state, default /tmp/dlc-slurm), DLC_SLURM_PORT (controller
# port, default 16817; nodes use PORT+184 .. PORT+187), PYTHON (with jupyter_dlc, default
# python3), DLC_CLUSTERS (the profile file, see jupyter_dlc/clusters.py), DLC_SLURM_PRIVATE_DIR
# (NODE:PATH, e.g. n2:/tmp/x: that node sees an empty tmpfs of its own at PATH, as a node
# without the shared filesystem would; the tests' unshared checkpoint directory; `all:PATH`:
# every node has its own, e.g. over the launcher's data directory, which the nodes then
# truly cannot see), DLC_SLURM_SHARED (false: the profile says shared_filesystem: false),
# DLC_SLURM_CHECKPOINT_DIR (the profile's checkpoint_dir: a directory every node sees).
set -euo pipefail

STATE="${DLC_SLURM_DIR:-/tmp/dlc-slurm}"
PORT="${DLC_SLURM_PORT:-16817}"
NODE_PORT=$((PORT + 184))
PYTHON="${PYTHON:-python3}"
CONF="$STATE/slurm.conf"
# munged runs as user munge, which must reach its files: they live outside STATE (which may
# sit in a private directory, as pytest's tmp dirs do), in a directory named after STATE.
MUNGE="${DLC_SLURM_MUNGE_DIR:-/tmp/dlc-munge-$(printf '%s' "$STATE" | md5sum | cut -c1-10)}"
SOCKET="$MUNGE/munge.sock"
PROFILE="${DLC_SLURM_PROFILE:-local-slurm}"
PRIVATE="${DLC_SLURM_PRIVATE_DIR:-}"
NODES=(n1 n2 n3 n4)
# Every daemon carries this variable, so `down` finds what `up` started and nothing else.
TAG="DLC_LOCAL_SLURM=$STATE"

say() { echo "local-slurm: $*" >&2; }

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

install() {
    local missing=()
    for bin in slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client munged:munge; do
        command -v "${bin%%:*}" >/dev/null 2>&1 || [ -x "/usr/sbin/${bin%%:*}" ] || missing+=("${bin#*:}")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
        say "needs ${missing[*]} (Debian: apt-get install slurmctld slurmd slurm-client munge, as root)"
        exit 3
    fi
    say "installing ${missing[*]}"
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurmctld slurmd slurm-client munge >&2
}

write_config() {
    mkdir -p "$STATE/state" "$MUNGE" "$STATE/log"
    for node in "${NODES[@]}"; do mkdir -p "$STATE/spool/$node"; done
    if [ ! -f "$MUNGE/munge.key" ]; then
        dd if=/dev/urandom of="$MUNGE/munge.key" bs=1024 count=1 status=none
    fi
    # munged refuses a key others can read, and a socket dir that is not 0711.
    chown munge:munge "$MUNGE/munge.key" "$MUNGE"
    chmod 0400 "$MUNGE/munge.key"
    chmod 0711 "$MUNGE"
    cat > "$CONF" <<EOF
# Written by scripts/local-slurm.sh: 4 emulated nodes on this machine.
ClusterName=dlclocal
SlurmctldHost=localhost
SlurmctldPort=$PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SOCKET
StateSaveLocation=$STATE/state
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdPidFile=$STATE/slurmd-%n.pid
SlurmdLogFile=$STATE/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
SlurmdParameters=config_overrides
ReturnToService=2
# A cancelled step gets SIGKILL this long after SIGTERM (the launcher keeps its own grace).
KillWait=5
NodeName=n[1-4] NodeHostname=localhost NodeAddr=127.0.0.1[1-4] Port=[$NODE_PORT-$((NODE_PORT + 3))] CPUs=2 RealMemory=2000
PartitionName=debug Nodes=n[1-4] Default=YES MaxTime=INFINITE State=UP
EOF
}

start() {
    export SLURM_CONF="$CONF"
    if ! alive "$STATE/munged.pid"; then
        env "$TAG" runuser -u munge -- munged --socket="$SOCKET" --key-file="$MUNGE/munge.key" \
            --pid-file="$MUNGE/munged.pid" --log-file="$MUNGE/munged.log" \
            --seed-file="$MUNGE/munged.seed"
        for _ in $(seq 50); do [ -S "$SOCKET" ] && break; sleep 0.1; done
        cp "$MUNGE/munged.pid" "$STATE/munged.pid"
    fi
    if ! alive "$STATE/slurmctld.pid"; then
        env "$TAG" setsid slurmctld -D -f "$CONF" > "$STATE/log/slurmctld.out" 2>&1 < /dev/null &
        echo $! > "$STATE/slurmctld.pid"
    fi
    for node in "${NODES[@]}"; do
        if ! alive "$STATE/slurmd-$node.pid"; then
            slurmd=(slurmd -D -f "$CONF" -N "$node")
            if [ -n "$PRIVATE" ] && { [ "${PRIVATE%%:*}" = "$node" ] || [ "${PRIVATE%%:*}" = all ]; }; then
                # This node alone sees an empty directory of its own at that path (a mount
                # namespace with a tmpfs over it): a filesystem the nodes do not share.
                mkdir -p "${PRIVATE#*:}"
                slurmd=(unshare -m --propagation private bash -c 'mount -t tmpfs dlc-private "$1" && shift && exec "$@"'
                        bash "${PRIVATE#*:}" "${slurmd[@]}")
            fi
            env "$TAG" setsid "${slurmd[@]}" > "$STATE/log/slurmd-$node.out" 2>&1 < /dev/null &
            echo $! > "$STATE/slurmd-$node.pid"
        fi
    done
    for _ in $(seq 300); do
        idle=$(sinfo -h -N -o "%t" 2>/dev/null | grep -c -E '^(idle|mix|alloc)' || true)
        [ "$idle" = "${#NODES[@]}" ] && break
        sleep 0.1
    done
    if [ "${idle:-0}" != "${#NODES[@]}" ]; then
        say "the nodes did not come up; see $STATE/log"
        sinfo -N >&2 || true
        exit 1
    fi
    # The profile as JSON, made by Python: a path is a value there, never JSON text.
    "$PYTHON" -m jupyter_dlc.clusters put "$PROFILE" "$("$PYTHON" -c 'import json, sys
shared, conf, ckpt = sys.argv[1] != "false", sys.argv[2], sys.argv[3]
print(json.dumps(dict({"engine": "slurm", "partition": "debug", "shared_filesystem": shared,
                       "description": "4 emulated nodes on this machine (scripts/local-slurm.sh)",
                       "env": {"SLURM_CONF": conf}}, **({"checkpoint_dir": ckpt} if ckpt else {}))))' \
        "${DLC_SLURM_SHARED:-true}" "$CONF" "${DLC_SLURM_CHECKPOINT_DIR:-}")" > /dev/null
    say "up: ${#NODES[@]} nodes, SLURM_CONF=$CONF, profile $PROFILE"
}

tagged_pids() {
    for env in /proc/[0-9]*/environ; do
        pid="${env#/proc/}"; pid="${pid%/environ}"
        grep -qxzF "$TAG" "$env" 2>/dev/null && echo "$pid"
    done
    return 0
}

down() {
    if [ -f "$CONF" ] && alive "$STATE/slurmctld.pid"; then
        export SLURM_CONF="$CONF"
        scancel --full --signal=KILL --user="$(id -un)" 2>/dev/null || true
        for _ in $(seq 100); do
            [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
            sleep 0.1
        done
    fi
    # Daemons first by their pid files, then anything else they started (slurmstepd).
    for pidfile in "$STATE"/slurmd-n*.pid "$STATE/slurmctld.pid" "$STATE/munged.pid"; do
        alive "$pidfile" && kill -TERM "$(cat "$pidfile")" 2>/dev/null || true
    done
    for _ in $(seq 50); do
        [ -z "$(tagged_pids)" ] && break
        sleep 0.1
    done
    for pid in $(tagged_pids); do kill -KILL "$pid" 2>/dev/null || true; done
    "$PYTHON" -m jupyter_dlc.clusters remove "$PROFILE" > /dev/null 2>&1 || true
    rm -rf "$STATE" "$MUNGE"
    say "down"
}

status() {
    local any=0
    for pidfile in "$STATE/munged.pid" "$STATE/slurmctld.pid" "$STATE"/slurmd-n*.pid; do
        [ -f "$pidfile" ] || continue
        name="$(basename "$pidfile" .pid)"
        if alive "$pidfile"; then echo "$name: running (pid $(cat "$pidfile"))"; any=1
        else echo "$name: not running"; fi
    done
    if [ "$any" = 0 ]; then
        echo "local-slurm: down"
        return 1
    fi
    SLURM_CONF="$CONF" sinfo -N || true
    SLURM_CONF="$CONF" squeue || true
}

case "${1:-}" in
    up) install; write_config; start ;;
    down) down ;;
    status) status ;;
    *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# SSH hosts on this machine, to try the SSH engine without other machines (and for the tests):
# N network namespaces (default 2), each joined by a veth pair to a bridge in the root
# namespace, each with an address of its own and an sshd of its own (key auth only: no PAM,
# no passwords), reached with a key generated here, and a cluster profile `local-ssh`.
#
#   scripts/ssh-hosts.sh up       install openssh-server when missing (Debian, as root), make
#                                 the namespaces, bridge and sshds (idempotent), write the
#                                 profile (python -m jupyter_dlc.clusters put ...)
#   scripts/ssh-hosts.sh status   what runs, and whether each host answers over ssh
#   scripts/ssh-hosts.sh down     stop every process in the namespaces, remove namespaces,
#                                 bridge, state directory and profile: nothing is left
#
# The launcher must listen where the hosts reach it: the bridge's address (printed by `up`),
# e.g. `DLC_LAUNCHER_HOST=10.231.0.254 jupyter-dlc launcher start`.
#
# Environment: DLC_SSH_DIR (state, default /tmp/dlc-ssh), DLC_SSH_PREFIX (names of
# namespaces, bridge and links, default dlcssh; at most 8 characters), DLC_SSH_NET (the
# first three octets, default 10.231.0: hosts .1..N, bridge .254), DLC_SSH_HOSTS (N),
# DLC_SSH_PORT (sshd port, default 2222), DLC_SSH_PROFILE (default local-ssh), PYTHON (with
# jupyter_dlc and torch, default python3), DLC_CLUSTERS (the profile file).
set -euo pipefail

STATE="${DLC_SSH_DIR:-/tmp/dlc-ssh}"
PREFIX="${DLC_SSH_PREFIX:-dlcssh}"
NET="${DLC_SSH_NET:-10.231.0}"
COUNT="${DLC_SSH_HOSTS:-2}"
PORT="${DLC_SSH_PORT:-2222}"
PROFILE="${DLC_SSH_PROFILE:-local-ssh}"
PYTHON="${PYTHON:-python3}"
BRIDGE="${PREFIX}br"
BRIDGE_ADDR="$NET.254"
IFACE=dlc0  # the hosts' interface, the same name in every namespace (GLOO_SOCKET_IFNAME)

say() { echo "ssh-hosts: $*" >&2; }

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

install() {
    command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ] && return 0
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
        say "needs openssh-server (Debian: apt-get install openssh-server, as root)"
        exit 3
    fi
    say "installing openssh-server"
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server >&2
}

need_root() {
    if [ "$(id -u)" != 0 ]; then
        say "network namespaces need root"
        exit 3
    fi
}

keys() {
    mkdir -p "$STATE"
    chmod 0700 "$STATE"
    [ -f "$STATE/id_ed25519" ] || ssh-keygen -q -t ed25519 -N "" -C "jupyter-dlc ssh-hosts" -f "$STATE/id_ed25519"
    cp "$STATE/id_ed25519.pub" "$STATE/authorized_keys"
    chmod 0600 "$STATE/authorized_keys"
    : > "$STATE/known_hosts.tmp"
    for k in $(seq "$COUNT"); do
        local dir="$STATE/host$k"
        mkdir -p "$dir"
        [ -f "$dir/ssh_host_ed25519_key" ] || ssh-keygen -q -t ed25519 -N "" -f "$dir/ssh_host_ed25519_key"
        echo "[$NET.$k]:$PORT $(cut -d' ' -f1,2 "$dir/ssh_host_ed25519_key.pub")" >> "$STATE/known_hosts.tmp"
        cat > "$dir/sshd_config" <<EOF
# Written by scripts/ssh-hosts.sh: host $k ($NET.$k), keys only.
ListenAddress $NET.$k
Port $PORT
HostKey $dir/ssh_host_ed25519_key
PidFile $dir/sshd.pid
AuthorizedKeysFile $STATE/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
PermitRootLogin prohibit-password
PermitUserEnvironment no
# The state dir may sit under /tmp (world-writable): the modes of its own files are ours.
StrictModes no
# A client that vanished (a cut link) ends its session, so the remote command learns of it.
ClientAliveInterval 1
ClientAliveCountMax 3
MaxStartups 64:30:128
MaxSessions 64
LogLevel ERROR
EOF
    done
    mv "$STATE/known_hosts.tmp" "$STATE/known_hosts"
}

network() {
    if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
        ip link add "$BRIDGE" type bridge
        ip addr add "$BRIDGE_ADDR/24" dev "$BRIDGE"
    fi
    ip link set "$BRIDGE" up
    for k in $(seq "$COUNT"); do
        local ns="${PREFIX}$k" outer="${PREFIX}h$k"
        ip netns list | grep -qw "^$ns" || ip netns add "$ns"
        if ! ip link show "$outer" >/dev/null 2>&1; then
            ip link add "$outer" type veth peer name "${PREFIX}n$k"
            ip link set "${PREFIX}n$k" netns "$ns"
            ip -n "$ns" link set "${PREFIX}n$k" name "$IFACE"
            ip -n "$ns" addr add "$NET.$k/24" dev "$IFACE"
            ip link set "$outer" master "$BRIDGE"
        fi
        ip link set "$outer" up
        ip -n "$ns" link set lo up
        ip -n "$ns" link set "$IFACE" up
    done
}

start() {
    mkdir -p /run/sshd  # sshd's privilege-separation directory
    for k in $(seq "$COUNT"); do
        local dir="$STATE/host$k"
        alive "$dir/sshd.pid" && continue
        ip netns exec "${PREFIX}$k" /usr/sbin/sshd -f "$dir/sshd_config" -E "$dir/sshd.log"
    done
    local opts=(-o BatchMode=yes -o IdentitiesOnly=yes -o "UserKnownHostsFile=$STATE/known_hosts"
                -o StrictHostKeyChecking=yes -o ConnectTimeout=5 -i "$STATE/id_ed25519" -p "$PORT")
    for k in $(seq "$COUNT"); do
        local ok=0
        for _ in $(seq 50); do
            if ssh "${opts[@]}" "root@$NET.$k" true 2>/dev/null; then ok=1; break; fi
            sleep 0.1
        done
        if [ "$ok" != 1 ]; then
            say "host $k ($NET.$k) does not answer over ssh; see $STATE/host$k/sshd.log"
            exit 1
        fi
    done
    local hosts
    hosts=$(seq -s, -f "\"$NET.%g\"" "$COUNT")
    "$PYTHON" -m jupyter_dlc.clusters put "$PROFILE" "$(cat <<EOF
{"engine": "ssh", "hosts": [$hosts], "user": "root", "port": $PORT,
 "key": "$STATE/id_ed25519", "known_hosts": "$STATE/known_hosts",
 "interface": "$IFACE", "python": "$PYTHON", "shared_filesystem": true,
 "description": "$COUNT network namespaces on this machine (scripts/ssh-hosts.sh)"}
EOF
)" > /dev/null
    say "up: $COUNT hosts $NET.1..$COUNT (port $PORT), launcher address $BRIDGE_ADDR, profile $PROFILE"
}

down() {
    for k in $(seq "$COUNT"); do
        local ns="${PREFIX}$k"
        if ip netns list | grep -qw "^$ns"; then
            # Everything that runs in the namespace: its sshd, sessions, and what they started.
            for _ in $(seq 50); do
                pids=$(ip netns pids "$ns")
                [ -z "$pids" ] && break
                kill -KILL $pids 2>/dev/null || true
                sleep 0.1
            done
            ip netns del "$ns"
        fi
        ip link del "${PREFIX}h$k" 2>/dev/null || true
    done
    ip link del "$BRIDGE" 2>/dev/null || true
    "$PYTHON" -m jupyter_dlc.clusters remove "$PROFILE" > /dev/null 2>&1 || true
    rm -rf "$STATE"
    say "down"
}

status() {
    local any=0
    ip link show "$BRIDGE" >/dev/null 2>&1 && echo "bridge $BRIDGE: $BRIDGE_ADDR" && any=1
    for k in $(seq "$COUNT"); do
        local dir="$STATE/host$k"
        if ! ip netns list | grep -qw "^${PREFIX}$k"; then echo "host$k: no namespace"; continue; fi
        any=1
        if alive "$dir/sshd.pid" && ssh -o BatchMode=yes -o IdentitiesOnly=yes -o ConnectTimeout=3 \
                -o "UserKnownHostsFile=$STATE/known_hosts" -i "$STATE/id_ed25519" -p "$PORT" \
                "root@$NET.$k" true 2>/dev/null; then
            echo "host$k: $NET.$k:$PORT answering (sshd pid $(cat "$dir/sshd.pid"))"
        else
            echo "host$k: $NET.$k:$PORT not answering"
        fi
    done
    if [ "$any" = 0 ]; then
        echo "ssh-hosts: down"
        return 1
    fi
}

case "${1:-}" in
    up) need_root; install; keys; network; start ;;
    down) need_root; down ;;
    status) status ;;
    *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac

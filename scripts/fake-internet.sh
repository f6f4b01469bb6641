#!/usr/bin/env bash
# A fake internet for tests and demos (the shell twin of berth-net's `testing::FakeInternet`):
# a network namespace behind a veth to the host with test hosts 198.18.N.1..K (and
# 198.19.N.1, a host meant to sit outside a ceiling), each serving HTTP on port 80.
# The host side of the link is 198.19.N.254. Run as root. Traffic stays on this machine.
#
#   bash scripts/fake-internet.sh up   NAME N [K]   # N: 1..250 (the /24 block), K hosts (default 2)
#   bash scripts/fake-internet.sh down NAME
#
# Give berth the ceiling `--egress-allow 198.18.N.0/24`.
set -euo pipefail

cmd=${1:?up or down}
name=${2:?name}
link="bfi-${name:0:10}"

case "$cmd" in
up)
    block=${3:?block number 1..250}
    hosts=${4:-2}
    ip netns add "bfi-$name"
    ip link add "$link" type veth peer name eth0 netns "bfi-$name"
    ip link set "$link" up
    ip addr add "198.19.$block.254/32" dev "$link"
    ip route add "198.18.$block.0/24" dev "$link"
    ip route add "198.19.$block.0/24" dev "$link"
    ip -n "bfi-$name" link set lo up
    ip -n "bfi-$name" link set eth0 up
    addrs=("198.19.$block.1")
    for i in $(seq 1 "$hosts"); do addrs+=("198.18.$block.$i"); done
    for addr in "${addrs[@]}"; do
        ip -n "bfi-$name" addr add "$addr/32" dev eth0
        ip netns exec "bfi-$name" setsid python3 -m http.server --bind "$addr" 80 \
            </dev/null >/dev/null 2>&1 &
    done
    ip -n "bfi-$name" route add default dev eth0
    for addr in "${addrs[@]}"; do
        for _ in $(seq 100); do
            ip netns exec "bfi-$name" ss -Hltn "src $addr" | grep -q . && break
            sleep 0.1
        done
    done
    echo "test hosts: ${addrs[*]:1}; outside host: ${addrs[0]}; host side: 198.19.$block.254"
    ;;
down)
    # The servers die with the namespace's processes; list them by namespace, not name.
    for pid in $(ip netns pids "bfi-$name" 2>/dev/null); do kill "$pid" 2>/dev/null || true; done
    ip link del "$link" 2>/dev/null || true
    ip netns del "bfi-$name" 2>/dev/null || true
    ;;
*)
    echo "usage: $0 up NAME N [K] | down NAME" >&2
    exit 2
    ;;
esac

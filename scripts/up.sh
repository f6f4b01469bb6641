#!/usr/bin/env bash
# Runs berth on this machine (Debian/Ubuntu, as root): installs the system packages the
# runtime needs, builds the release binaries (berth, berth-launch, and the static
# berth-envd, berth-interpreter and mcp-gateway that go into sandboxes),
# then execs `berth up` with the arguments given. On first run `berth up` builds the
# `base` template (debootstrap, a few minutes, with progress) and creates an API key.
#
#   bash scripts/up.sh [--listen 127.0.0.1:3000] [--state-dir /var/lib/berth]
#
# When stdout is not a terminal, the same progress also goes to
# /var/log/berth/up-<time>.log (BERTH_LOG_DIR to change); the first API key is then not
# printed (make one with `berth keys create`).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

step() { printf '\n==> %s\n' "$*" >&2; }

[[ $EUID -eq 0 ]] || { echo "berth needs root (namespaces, cgroups, mounts)" >&2; exit 1; }

# Not on a terminal (a pipe, a service, CI): everything shown is also kept in a log.
if [[ ! -t 1 ]]; then
    log_dir="${BERTH_LOG_DIR:-/var/log/berth}"
    mkdir -p -m 0700 "$log_dir"
    log="$log_dir/up-$(date -u +%Y%m%dT%H%M%SZ).log"
    echo "berth: progress and output are also written to $log" >&2
    # The log writers ignore SIGTERM, SIGINT and SIGHUP and end when berth closes its
    # output: a service manager (or a shell) that signals the whole group must not take
    # berth's stdout and stderr away while berth is still draining and removing its
    # sandboxes.
    exec > >(trap '' TERM INT HUP; exec tee -a "$log") 2> >(trap '' TERM INT HUP; exec tee -a "$log" >&2)
fi

# lxcfs: berth runs its own (not the lxcfs service) to show each sandbox its own memory
# and CPUs in free, nproc and /proc.
packages=(debootstrap e2fsprogs util-linux iproute2 ca-certificates curl build-essential pkg-config libnftables-dev nftables lxcfs)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
    step "installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" </dev/null >&2
fi

if ! command -v cargo >/dev/null; then
    [[ -x "$HOME/.cargo/bin/cargo" ]] || {
        step "installing the Rust toolchain (rustup, stable)"
        curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal >&2
    }
    export PATH="$HOME/.cargo/bin:$PATH"
fi

target_dir="${CARGO_TARGET_DIR:-$PWD/target}"
step "building berth (release)"
cargo build --release -p berth -p berth-runtime --bins >&2
step "building berth-envd (static)"
envd="$(bash crates/envd/build-static.sh)"
install -m 0755 "$envd" "$target_dir/release/berth-envd"
# The servers of the installed templates code-interpreter-v1 (port 49999) and
# mcp-gateway (port 50005), static like envd: berth copies them into those templates
# when it builds them on first use.
step "building berth-interpreter (static, for code-interpreter-v1)"
interpreter="$(bash crates/interpreter/build-static.sh)"
install -m 0755 "$interpreter" "$target_dir/release/berth-interpreter"
step "building mcp-gateway (static, for the mcp-gateway template)"
gateway="$(bash crates/mcp-gateway/build-static.sh)"
install -m 0755 "$gateway" "$target_dir/release/mcp-gateway"

step "starting berth up"
exec "$target_dir/release/berth" up "$@"

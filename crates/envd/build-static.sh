#!/usr/bin/env bash
# Builds berth-envd as a fully static x86_64 binary (glibc, crt-static): it is
# bind-mounted into sandboxes whose libc we do not control. envd uses no NSS (it reads
# /etc/passwd and /etc/group itself), so static glibc is safe for it.
# Prints the path of the binary on stdout; everything else goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/../.."
target_dir="${CARGO_TARGET_DIR:-$PWD/target}"
cargo rustc --release -p berth-envd --bin berth-envd \
    --target x86_64-unknown-linux-gnu -- -C target-feature=+crt-static -C strip=debuginfo >&2
binary="$target_dir/x86_64-unknown-linux-gnu/release/berth-envd"
if ! file "$binary" | grep -Eq 'statically linked|static-pie linked'; then
    echo "build-static.sh: $binary is not statically linked: $(file "$binary")" >&2
    exit 1
fi
echo "$binary"

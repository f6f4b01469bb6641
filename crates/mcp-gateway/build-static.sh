#!/usr/bin/env bash
# Builds mcp-gateway as a fully static x86_64 binary (glibc, crt-static), so it runs on
# any sandbox rootfs (the mcp-gateway template is Debian bookworm). It resolves no user
# or host names itself (git does, as its own process), so static glibc's NSS limits do
# not apply.
# Prints the path of the binary on stdout; everything else goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/../.."
target_dir="${CARGO_TARGET_DIR:-$PWD/target}"
cargo rustc --release -p berth-mcp-gateway --bin mcp-gateway \
    --target x86_64-unknown-linux-gnu -- -C target-feature=+crt-static -C strip=debuginfo >&2
binary="$target_dir/x86_64-unknown-linux-gnu/release/mcp-gateway"
if ! file "$binary" | grep -Eq 'statically linked|static-pie linked'; then
    echo "build-static.sh: $binary is not statically linked: $(file "$binary")" >&2
    exit 1
fi
echo "$binary"

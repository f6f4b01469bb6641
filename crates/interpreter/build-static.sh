#!/usr/bin/env bash
# Builds berth-interpreter as a fully static x86_64 binary (glibc, crt-static), so it
# runs on any sandbox rootfs (the code-interpreter-v1 template is Debian bookworm) as
# the template's start command. It resolves no user or host names (addresses only),
# so static glibc's NSS limits do not apply.
# Prints the path of the binary on stdout; everything else goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/../.."
target_dir="${CARGO_TARGET_DIR:-$PWD/target}"
cargo rustc --release -p berth-interpreter --bin berth-interpreter \
    --target x86_64-unknown-linux-gnu -- -C target-feature=+crt-static -C strip=debuginfo >&2
binary="$target_dir/x86_64-unknown-linux-gnu/release/berth-interpreter"
if ! file "$binary" | grep -Eq 'statically linked|static-pie linked'; then
    echo "build-static.sh: $binary is not statically linked: $(file "$binary")" >&2
    exit 1
fi
echo "$binary"

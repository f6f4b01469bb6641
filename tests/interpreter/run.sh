#!/usr/bin/env bash
# Runs every berth-interpreter test against real kernels: the crate's tests (raw HTTP
# edge cases, including the #[ignore]d ones that need kernels), the Python SDK suite
# and the JS SDK suite. Needs `bash scripts/interpreter-env.sh` first. As root it runs
# in a private network namespace (only loopback), because the SDKs' debug mode uses
# the fixed ports 49999 and 49983.
#
#   bash tests/interpreter/run.sh            # everything
#   BERTH_TEST_ONLY=python bash tests/interpreter/run.sh   # rust|python|js
#
# To run the SDK suites against another server (a real sandbox), see the README of
# this directory: the suites only need the SDK's own environment variables.
set -uo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo_root"
target_dir="${CARGO_TARGET_DIR:-$repo_root/target}"

cargo build -q -p berth-interpreter -p berth-envd || exit 1
export BERTH_INTERPRETER_BIN="${BERTH_INTERPRETER_BIN:-$target_dir/debug/berth-interpreter}"
export BERTH_ENVD_BIN="${BERTH_ENVD_BIN:-$target_dir/debug/berth-envd}"

in_private_netns() {
    if [[ $EUID -eq 0 ]] && unshare --net true 2>/dev/null; then
        unshare --net -- bash -c 'ip link set lo up && exec "$@"' _ "$@"
    else
        "$@"
    fi
}

failed=0
want() { [[ -z "${BERTH_TEST_ONLY:-}" || "$1" =~ ${BERTH_TEST_ONLY} ]]; }
if want rust; then
    cargo test -p berth-interpreter -- --include-ignored || failed=1
fi
if want python; then
    (cd tests/interpreter && in_private_netns ../../.venv-interpreter/bin/python -m pytest -q) || failed=1
fi
if want js; then
    in_private_netns node --test --test-concurrency=1 --test-timeout=600000 tests/interpreter/js/ || failed=1
fi
exit "$failed"

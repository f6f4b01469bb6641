#!/usr/bin/env bash
# Runs every berth-interpreter test: the crate's tests (raw HTTP edge cases, including
# the #[ignore]d ones that need kernels on this host: `bash scripts/interpreter-env.sh`
# first), then the Python and JS SDK suites against code-interpreter-v1 sandboxes of a
# real `berth up` (berth_env.py; needs BERTH_BIN / BERTH_INTERPRETER_BIN or
# <target>/dist/ as scripts/test.sh lays it out). Run as root.
#
#   bash tests/interpreter/run.sh            # everything
#   BERTH_TEST_ONLY=python bash tests/interpreter/run.sh   # rust|python|js
set -uo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo_root"

failed=0
want() { [[ -z "${BERTH_TEST_ONLY:-}" || "$1" =~ ${BERTH_TEST_ONLY} ]]; }
if want rust; then
    cargo test -p berth-interpreter -- --include-ignored || failed=1
fi
if want python; then
    (cd tests/interpreter && ../../.venv-interpreter/bin/python -m pytest -q) || failed=1
fi
if want js; then
    .venv-interpreter/bin/python tests/interpreter/berth_env.py run -- \
        node --test --test-concurrency=1 --test-timeout=600000 tests/interpreter/js/ || failed=1
fi
exit "$failed"

#!/usr/bin/env bash
# Interpreter benchmark (see bench.py). Needs scripts/interpreter-env.sh. Uses the
# release binary (cargo build --release -p berth-interpreter) unless
# BERTH_INTERPRETER_BIN is set. As root it runs in a private network namespace.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo_root"
if [[ -z "${BERTH_INTERPRETER_BIN:-}" ]]; then
    cargo build -q --release -p berth-interpreter
fi
cmd=(.venv-interpreter/bin/python bench/interpreter/bench.py "${1:-200}")
if [[ $EUID -eq 0 ]] && unshare --net true 2>/dev/null; then
    exec unshare --net -- bash -c 'ip link set lo up && exec "$@"' _ "${cmd[@]}"
fi
exec "${cmd[@]}"

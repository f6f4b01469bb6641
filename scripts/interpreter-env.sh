#!/usr/bin/env bash
# Prepares this host like the code-interpreter-v1 template, for the berth-interpreter
# tests (no template build system needed). Run as root on Debian 12; idempotent.
#
#   bash scripts/interpreter-env.sh
#
#   - apt packages of the template (templates/code-interpreter-v1/apt-packages.txt)
#   - the template's kernels under .interpreter-env/ (its install-kernels.sh: Python
#     venv with the scientific stack and ipykernel, bash_kernel, JJava; Deno; kernelspecs;
#     berth's IPython extension)
#   - .venv-interpreter/ with tests/interpreter/requirements.txt (e2b-code-interpreter)
#   - tests/interpreter/js/node_modules (@e2b/code-interpreter@2.8.0, from its lock)
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
template=templates/code-interpreter-v1
step() { printf '\n==> %s\n' "$*"; }

step "apt packages ($template/apt-packages.txt)"
mapfile -t packages < <(grep -v '^#' "$template/apt-packages.txt" | grep -v '^$')
missing=()
for pinned in "${packages[@]}"; do
    name="${pinned%%=*}"
    dpkg-query -W -f='${Status}' "$name" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pinned")
done
command -v npm >/dev/null || missing+=(npm)
if ((${#missing[@]})); then
    [[ $EUID -eq 0 ]] || { echo "missing apt packages (${missing[*]}) and not root" >&2; exit 1; }
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${missing[@]}" </dev/null
else
    echo "    all present"
fi

step "kernels (.interpreter-env)"
bash "$template/install-kernels.sh" .interpreter-env crates/interpreter/python/berth_kernel.py

step "Python SDK suite venv (.venv-interpreter)"
stamp=.venv-interpreter/.requirements.sha256
wanted="$(sha256sum tests/interpreter/requirements.txt | cut -d' ' -f1)"
if [[ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]]; then
    [[ -x .venv-interpreter/bin/python ]] || python3 -m venv .venv-interpreter
    .venv-interpreter/bin/python -m pip install --disable-pip-version-check -q -r tests/interpreter/requirements.txt
    printf '%s\n' "$wanted" >"$stamp"
fi

step "JS SDK suite (tests/interpreter/js)"
js_stamp=tests/interpreter/js/node_modules/.package-lock.sha256
wanted_js="$(sha256sum tests/interpreter/js/package-lock.json | cut -d' ' -f1)"
if [[ "$(cat "$js_stamp" 2>/dev/null)" != "$wanted_js" ]]; then
    (cd tests/interpreter/js && npm ci --no-audit --no-fund --loglevel=error)
    printf '%s\n' "$wanted_js" >"$js_stamp"
fi
step "interpreter environment ready"

#!/usr/bin/env bash
# Installs the kernels of the code-interpreter-v1 template under PREFIX:
#   PREFIX/venv                     Python venv with requirements.txt (ipykernel, the
#                                   scientific stack, bash_kernel, jjava)
#   PREFIX/js/node_modules          Deno (package.json / package-lock.json)
#   PREFIX/share/jupyter/kernels/   kernelspecs python3, deno, bash, java
# and berth's IPython extension (berth_kernel.py) into the venv's site-packages.
# R's kernelspec (`ir`) comes from Debian's r-cran-irkernel in /usr/share/jupyter.
#
#   install-kernels.sh PREFIX BERTH_KERNEL_PY
#
# Used by the template build (inside the rootfs) and by scripts/interpreter-env.sh
# (on a test host), so both get the same environment. Needs python3 with venv, npm,
# and the package registries. Idempotent.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
prefix="${1:?usage: install-kernels.sh PREFIX BERTH_KERNEL_PY}"
extension="${2:?usage: install-kernels.sh PREFIX BERTH_KERNEL_PY}"
mkdir -p "$prefix"
prefix="$(cd "$prefix" && pwd)"

# --- Python -------------------------------------------------------------------------
stamp="$prefix/venv/.requirements.sha256"
wanted="$(sha256sum "$here/requirements.txt" | cut -d' ' -f1)"
if [[ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]]; then
    [[ -x "$prefix/venv/bin/python" ]] || python3 -m venv "$prefix/venv"
    "$prefix/venv/bin/python" -m pip install --disable-pip-version-check --no-cache-dir -q \
        -r "$here/requirements.txt"
    printf '%s\n' "$wanted" >"$stamp"
fi
site="$("$prefix/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
install -m 0644 "$extension" "$site/berth_kernel.py"

# --- JavaScript / TypeScript (Deno) -------------------------------------------------
js_stamp="$prefix/js/node_modules/.package-lock.sha256"
wanted_js="$(sha256sum "$here/js/package-lock.json" | cut -d' ' -f1)"
if [[ "$(cat "$js_stamp" 2>/dev/null)" != "$wanted_js" ]]; then
    mkdir -p "$prefix/js"
    cp "$here/js/package.json" "$here/js/package-lock.json" "$prefix/js/"
    (cd "$prefix/js" && npm ci --no-audit --no-fund --loglevel=error)
    printf '%s\n' "$wanted_js" >"$js_stamp"
fi
deno="$prefix/js/node_modules/@deno/linux-x64-glibc/deno"
[[ -x "$deno" ]] || { echo "install-kernels.sh: no Deno binary at $deno" >&2; exit 1; }

# --- kernelspecs --------------------------------------------------------------------
kernels="$prefix/share/jupyter/kernels"
mkdir -p "$kernels/python3" "$kernels/deno" "$kernels/bash"
python="$prefix/venv/bin/python"
cat >"$kernels/python3/kernel.json" <<JSON
{
  "argv": ["$python", "-m", "ipykernel_launcher", "-f", "{connection_file}", "--ext=berth_kernel"],
  "display_name": "Python 3 (berth)",
  "language": "python",
  "interrupt_mode": "signal"
}
JSON
# Deno exits on SIGINT (the server then restarts it: an interrupted JS/TS context loses
# its state); its interrupt_request leaves the kernel answering without output, so
# signal mode is the one that keeps the context usable.
cat >"$kernels/deno/kernel.json" <<JSON
{
  "argv": ["$deno", "jupyter", "--kernel", "--conn", "{connection_file}"],
  "display_name": "Deno (JavaScript, TypeScript)",
  "language": "typescript",
  "interrupt_mode": "signal",
  "env": {"NO_COLOR": "1"}
}
JSON
cat >"$kernels/bash/kernel.json" <<JSON
{
  "argv": ["$python", "-m", "bash_kernel", "-f", "{connection_file}"],
  "display_name": "Bash",
  "language": "bash",
  "interrupt_mode": "signal",
  "env": {"PS1": "$"}
}
JSON
# JJava ships its kernelspec (jars + kernel.json using {resource_dir}) in the venv.
rm -rf "$kernels/java"
cp -r "$prefix/venv/share/jupyter/kernels/java" "$kernels/java"
echo "kernels installed under $kernels"

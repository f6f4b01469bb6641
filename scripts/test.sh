#!/usr/bin/env bash
# The project's test command (see README): lint, unit and integration tests, then the
# acceptance suites that drive the real berth-envd with the official E2B SDKs.
# Run as root after scripts/install-deps.sh:
#
#   bash scripts/test.sh
#
# Every step runs even when an earlier one failed; the summary at the end lists them
# all and the exit status is non-zero if any failed. Adding a suite is one `step` line
# at the bottom. BERTH_TEST_ONLY=<regex> runs only the steps whose name matches (for
# local iteration; CI runs everything).
set -uo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
target_dir="${CARGO_TARGET_DIR:-$repo_root/target}"
[[ "$target_dir" = /* ]] || target_dir="$repo_root/$target_dir"

summary=()
failed=0

# step NAME COMMAND...: runs COMMAND, records pass/fail and its duration.
step() {
    local name="$1"
    shift
    if [[ -n "${BERTH_TEST_ONLY:-}" && ! "$name" =~ $BERTH_TEST_ONLY ]]; then
        return 0
    fi
    printf '\n==> %s\n' "$name"
    local started=$SECONDS
    if "$@" </dev/null; then
        summary+=("$(printf 'PASS  %4ss  %s' $((SECONDS - started)) "$name")")
    else
        summary+=("$(printf 'FAIL  %4ss  %s' $((SECONDS - started)) "$name")")
        failed=1
    fi
}

# Builds berth-envd and exports BERTH_ENVD_BIN for the SDK suites. Uses envd's static
# build script when present (it prints the binary's path as its last line of stdout).
build_envd() {
    local binary=""
    if [[ -f crates/envd/build-static.sh ]]; then
        local output
        output="$(bash crates/envd/build-static.sh)" || return 1
        printf '%s\n' "$output"
        binary="$(printf '%s\n' "$output" | tail -n 1)"
    else
        cargo build -p berth-envd --bin berth-envd || return 1
        binary="$target_dir/debug/berth-envd"
    fi
    if [[ ! -x "$binary" ]]; then
        echo "berth-envd binary not found (looked for: $binary)" >&2
        return 1
    fi
    export BERTH_ENVD_BIN="$binary"
    echo "BERTH_ENVD_BIN=$BERTH_ENVD_BIN"
}

# Runs a command in a private network namespace with only loopback up, when possible
# (root with unshare): the SDK debug mode's fixed port 49983 is then never shared with
# anything else on the machine, and the suite can reach nothing but loopback.
in_private_netns() {
    if [[ $EUID -eq 0 ]] && unshare --net true 2>/dev/null; then
        unshare --net -- bash -c 'ip link set lo up && exec "$@"' _ "$@"
    else
        "$@"
    fi
}

python_sdk_suite() {
    [[ -n "${BERTH_ENVD_BIN:-}" ]] || { echo "no berth-envd binary (build step failed)" >&2; return 1; }
    in_private_netns .venv/bin/python -m pytest tests/sdk
}

js_sdk_suite() {
    [[ -n "${BERTH_ENVD_BIN:-}" ]] || { echo "no berth-envd binary (build step failed)" >&2; return 1; }
    in_private_netns node --test --test-concurrency=1 --test-timeout=300000 tests/sdk/js/*.test.mjs
}

# Builds `berth` and `berth-launch` (debug) and puts them beside the static envd in
# <target>/dist, the layout `berth up` expects; exports BERTH_BIN for the suites that
# drive `berth up`.
build_berth() {
    [[ -n "${BERTH_ENVD_BIN:-}" ]] || { echo "no berth-envd binary (build step failed)" >&2; return 1; }
    cargo build -p berth -p berth-runtime --bins || return 1
    local dist="$target_dir/dist"
    mkdir -p "$dist"
    install -m 0755 "$target_dir/debug/berth" "$target_dir/debug/berth-launch" "$BERTH_ENVD_BIN" "$dist/" || return 1
    export BERTH_BIN="$dist/berth"
    echo "BERTH_BIN=$BERTH_BIN"
}

control_plane_suite() {
    [[ -n "${BERTH_BIN:-}" ]] || { echo "no berth binary (build step failed)" >&2; return 1; }
    (cd tests/sdk/control_plane && in_private_netns ../../../.venv/bin/python -m pytest)
}

control_plane_js() {
    [[ -n "${BERTH_BIN:-}" ]] || { echo "no berth binary (build step failed)" >&2; return 1; }
    in_private_netns node --test --test-concurrency=1 --test-timeout=600000 tests/sdk/control_plane/js/
}

# The template build suite: Python SDK Template builder, images from a loopback
# registry, Dockerfiles, tags, teams, the berth and E2B CLIs (tests/templates).
templates_suite() {
    [[ -n "${BERTH_BIN:-}" ]] || { echo "no berth binary (build step failed)" >&2; return 1; }
    (cd tests/templates && in_private_netns ../../.venv/bin/python -m pytest)
}

templates_js() {
    [[ -n "${BERTH_BIN:-}" ]] || { echo "no berth binary (build step failed)" >&2; return 1; }
    in_private_netns node --test --test-concurrency=1 --test-timeout=600000 tests/templates/js/
}

# Operating berth (tests/ops): the CLI's REST verbs (shell through tmux), against berth up.
ops_suite() {
    [[ -n "${BERTH_BIN:-}" ]] || { echo "no berth binary (build step failed)" >&2; return 1; }
    (cd tests/ops && in_private_netns ../../.venv/bin/python -m pytest)
}

mcp_suite() {
    [[ -n "${BERTH_BIN:-}" ]] || { echo "no berth binary (build step failed)" >&2; return 1; }
    in_private_netns .venv/bin/python -m pytest tests/mcp -p no:cacheprovider \
        --ignore=tests/mcp/test_conformance.py
}

# The official MCP conformance suite (npm, pinned in tests/mcp/conformance) against
# berth up's /mcp, with tests/mcp/conformance/expected-failures.yml as its baseline.
mcp_conformance() {
    [[ -n "${BERTH_BIN:-}" ]] || { echo "no berth binary (build step failed)" >&2; return 1; }
    in_private_netns .venv/bin/python -m pytest tests/mcp/test_conformance.py -p no:cacheprovider -s
}

step "cargo fmt --check" cargo fmt --all -- --check
step "cargo clippy -D warnings" cargo clippy --workspace --all-targets -- -D warnings
# The unprivileged tier first: crates whose tests need no root (the control plane, the
# proxy and the agent tools run against berth-envd as a host process through
# berth_runtime::HostRuntime). Then the privileged tier: real namespaces, cgroups, CRIU,
# nftables, registries.
unprivileged_crates=(berth-api berth-store berth-proxy berth-envd-proto berth-client berth-mcp berth-server berth-interpreter berth-bench)
step "cargo test: unprivileged tier" cargo test "${unprivileged_crates[@]/#/-p=}"
step "cargo test: privileged tier" cargo test --workspace "${unprivileged_crates[@]/#/--exclude=}"
step "build berth-envd" build_envd
step "Python SDK suite (tests/sdk)" python_sdk_suite
step "JS SDK smoke (tests/sdk/js)" js_sdk_suite
step "build berth" build_berth
step "control plane: Python SDK suite" control_plane_suite
step "control plane: JS SDK smoke" control_plane_js
step "templates: Python SDK suite (tests/templates)" templates_suite
step "templates: JS SDK (tests/templates/js)" templates_js
step "ops: CLI (tests/ops)" ops_suite
step "MCP suite (tests/mcp)" mcp_suite
step "MCP conformance (tests/mcp/conformance)" mcp_conformance

printf '\n==> summary (%ss total)\n' "$SECONDS"
printf '    %s\n' "${summary[@]}"
exit "$failed"

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
#
# Artifacts: what is worth keeping from a run goes to one directory, $CI_ARTIFACTS_DIR
# (default <target>/ci-artifacts): the dashboard suite's screenshots
# (dashboard-screenshots/, unless BERTH_SCREENSHOT_DIR says elsewhere), and for every
# failed suite of the lanes its output and the `berth up` logs it kept
# (failed/<step>/), plus summary.txt.
set -uo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
# A toolchain install-deps.sh put in ~/.cargo is used without a new login shell.
command -v cargo >/dev/null || export PATH="$HOME/.cargo/bin:$PATH"
target_dir="${CARGO_TARGET_DIR:-$repo_root/target}"
[[ "$target_dir" = /* ]] || target_dir="$repo_root/$target_dir"

summary=()
failed=0

artifacts_dir="${CI_ARTIFACTS_DIR:-$target_dir/ci-artifacts}"
[[ "$artifacts_dir" = /* ]] || artifacts_dir="$repo_root/$artifacts_dir"
mkdir -p "$artifacts_dir"
# Only what this script puts there is cleared: the directory may be the CI's own.
rm -rf "$artifacts_dir/failed" "$artifacts_dir/dashboard-screenshots" "$artifacts_dir/summary.txt"
export BERTH_SCREENSHOT_DIR="${BERTH_SCREENSHOT_DIR:-$artifacts_dir/dashboard-screenshots}"

# keep_failure NAME LOG LOGS: copies a failed step's output, the `berth up` logs its
# suites left in LOGS (their BERTH_TEST_LOG_DIR: a log stays there only when its tests
# failed) and every other `berth up` log its output names that still exists, into
# $artifacts_dir/failed/<step>/.
keep_failure() {
    local name="$1" log="$2" logs="$3" slug dir path
    slug="$(printf '%s' "$name" | tr -c 'A-Za-z0-9' '-' | tr -s '-' | sed 's/^-//; s/-$//')"
    dir="$artifacts_dir/failed/$slug"
    mkdir -p "$dir"
    cp "$log" "$dir/output.log"
    { find "$logs" -name 'berth-up.log' 2>/dev/null; grep -oE '/[^ :]*berth-up\.log' "$log"; } |
        sort -u | while read -r path; do
            [[ -f "$path" ]] && cp "$path" "$dir/$(printf '%s' "${path#/}" | tr '/' '_')"
        done
    return 0
}

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

# lanes NAME FUNCTION [NAME FUNCTION]... -- NAME FUNCTION ... : runs each lane (the steps
# between `--` separators, in order) concurrently with the others, each step's output
# kept in a log and printed whole when its lane is done. The suites in different lanes
# start their own `berth up` each (own state dir, sandbox pool and private network
# namespace), so they share nothing but the CPUs.
lanes() {
    local logdir
    logdir="$(mktemp -d)"
    local lane=0 pids=() lane_logs=()
    local specs=()
    launch_lane() {
        local dir="$logdir/lane$lane"
        mkdir -p "$dir"
        (
            local index=0
            while (($#)); do
                local name="$1" fn="$2"
                shift 2
                index=$((index + 1))
                if [[ -n "${BERTH_TEST_ONLY:-}" && ! "$name" =~ $BERTH_TEST_ONLY ]]; then
                    continue
                fi
                local started=$SECONDS
                printf '%s\n' "$name" >"$dir/$index.name"
                # The suite's `berth up` logs, kept below when it fails.
                export BERTH_TEST_LOG_DIR="$dir/$index.berth-logs"
                if "$fn" </dev/null >"$dir/$index.log" 2>&1; then
                    echo PASS >"$dir/$index.status"
                else
                    echo FAIL >"$dir/$index.status"
                    keep_failure "$name" "$dir/$index.log" "$BERTH_TEST_LOG_DIR"
                fi
                echo $((SECONDS - started)) >"$dir/$index.secs"
            done
        ) &
        pids+=($!)
        lane_logs+=("$dir")
        lane=$((lane + 1))
    }
    while (($#)); do
        if [[ "$1" == "--" ]]; then
            launch_lane "${specs[@]}"
            specs=()
        else
            specs+=("$1")
        fi
        shift
    done
    ((${#specs[@]})) && launch_lane "${specs[@]}"
    local i dir index
    for i in "${!pids[@]}"; do
        wait "${pids[$i]}"
        dir="${lane_logs[$i]}"
        for index in $(ls "$dir" | sed -n 's/^\([0-9]*\)\.name$/\1/p' | sort -n); do
            local name status secs
            name="$(cat "$dir/$index.name")"
            status="$(cat "$dir/$index.status" 2>/dev/null || echo FAIL)"
            secs="$(cat "$dir/$index.secs" 2>/dev/null || echo 0)"
            printf '\n==> %s (lane %s)\n' "$name" "$i"
            cat "$dir/$index.log"
            summary+=("$(printf '%s  %4ss  %s' "$status" "$secs" "$name")")
            [[ "$status" == PASS ]] || failed=1
        done
    done
    rm -rf "$logdir"
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
export -f in_private_netns

# Runs a command with root's shell startup files shown as empty files, in its own mount
# namespace (slave: the host's mounts reach it, its own never reach the host). The suites
# that run berth-envd as a host process start `bash -l` as root, which would otherwise
# run this machine's dotfiles: where root's ~/.bashrc runs `pyenv rehash`, one login
# shell killed mid-rehash leaves pyenv's lock file behind and every later login shell
# waits 60 s for it, so every command of those suites times out. A sandbox has its
# template's home, never the host's; these suites get a clean one the same way.
# COMMAND may be one of this script's functions that `export -f` exports.
with_clean_root_dotfiles() {
    if [[ $EUID -ne 0 ]] || ! unshare --mount --propagation slave true 2>/dev/null; then
        "$@"
        return
    fi
    local empty status
    empty="$(mktemp)"
    unshare --mount --propagation slave -- bash -c '
        empty="$1"
        shift
        for dotfile in .bashrc .profile .bash_profile .bash_login .bash_logout; do
            if [[ -f "/root/$dotfile" ]]; then
                mount --bind -o ro "$empty" "/root/$dotfile" || exit 1
            fi
        done
        "$@"' _ "$empty" "$@"
    status=$?
    rm -f "$empty"
    return "$status"
}

python_sdk_suite() {
    [[ -n "${BERTH_ENVD_BIN:-}" ]] || { echo "no berth-envd binary (build step failed)" >&2; return 1; }
    with_clean_root_dotfiles in_private_netns .venv/bin/python -m pytest tests/sdk
}

js_sdk_suite() {
    [[ -n "${BERTH_ENVD_BIN:-}" ]] || { echo "no berth-envd binary (build step failed)" >&2; return 1; }
    with_clean_root_dotfiles in_private_netns node --test --test-concurrency=1 --test-timeout=300000 tests/sdk/js/*.test.mjs
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

# The dashboard in a real browser (tests/dashboard): Debian's chromium through
# Playwright against a real berth up; screenshots land in $BERTH_SCREENSHOT_DIR
# (here <artifacts>/dashboard-screenshots), kept by CI as an artifact.
dashboard_suite() {
    [[ -n "${BERTH_BIN:-}" ]] || { echo "no berth binary (build step failed)" >&2; return 1; }
    (cd tests/dashboard && in_private_netns ../../.venv/bin/python -m pytest)
}

# The code interpreter (tests/interpreter): the static berth-interpreter beside berth,
# code-interpreter-v1 built once by `berth provision --template` into the suites' state
# dir (kept under the target dir: later runs reuse the build, or its step cache), then
# both SDKs against sandboxes of it. Not in a private netns: the build installs from the
# package registries (by name, through the host's resolver), which is also all the
# suites' egress ceiling admits.
build_interpreter() {
    [[ -n "${BERTH_BIN:-}" ]] || { echo "no berth binary (build step failed)" >&2; return 1; }
    local output binary
    output="$(bash crates/interpreter/build-static.sh)" || return 1
    binary="$(printf '%s\n' "$output" | tail -n 1)"
    install -m 0755 "$binary" "$(dirname "$BERTH_BIN")/berth-interpreter" || return 1
    export BERTH_INTERPRETER_BIN="$(dirname "$BERTH_BIN")/berth-interpreter"
    echo "BERTH_INTERPRETER_BIN=$BERTH_INTERPRETER_BIN"
}

# The MCP gateway (tests/mcp_gateway): the static mcp-gateway beside berth, which
# berth up puts into its mcp-gateway template.
build_mcp_gateway() {
    [[ -n "${BERTH_BIN:-}" ]] || { echo "no berth binary (build step failed)" >&2; return 1; }
    local output binary
    output="$(bash crates/mcp-gateway/build-static.sh)" || return 1
    binary="$(printf '%s\n' "$output" | tail -n 1)"
    install -m 0755 "$binary" "$(dirname "$BERTH_BIN")/mcp-gateway" || return 1
    export BERTH_MCP_GATEWAY_BIN="$(dirname "$BERTH_BIN")/mcp-gateway"
    echo "BERTH_MCP_GATEWAY_BIN=$BERTH_MCP_GATEWAY_BIN"
}

# Python and JS SDKs create gateways whose servers come from a fake internet's git host;
# the template's build downloads nothing, so the suite runs in a private netns.
mcp_gateway_suite() {
    [[ -n "${BERTH_MCP_GATEWAY_BIN:-}" ]] || { echo "no mcp-gateway (build step failed)" >&2; return 1; }
    (cd tests/mcp_gateway && in_private_netns ../../.venv/bin/python -m pytest)
}

interpreter_template() {
    [[ -n "${BERTH_INTERPRETER_BIN:-}" ]] || { echo "no berth-interpreter (build step failed)" >&2; return 1; }
    .venv-interpreter/bin/python tests/interpreter/berth_env.py provision
}

interpreter_python() {
    [[ -n "${BERTH_INTERPRETER_BIN:-}" ]] || { echo "no berth-interpreter (build step failed)" >&2; return 1; }
    (cd tests/interpreter && ../../.venv-interpreter/bin/python -m pytest)
}

interpreter_js() {
    [[ -n "${BERTH_INTERPRETER_BIN:-}" ]] || { echo "no berth-interpreter (build step failed)" >&2; return 1; }
    .venv-interpreter/bin/python tests/interpreter/berth_env.py run -- \
        node --test --test-concurrency=1 --test-timeout=600000 tests/interpreter/js/
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

# A split deployment on this machine (tests/cluster): a throwaway Postgres, three berth
# nodes and two berth apis, driven by the official SDK through either API instance.
cluster_suite() {
    [[ -n "${BERTH_BIN:-}" ]] || { echo "no berth binary (build step failed)" >&2; return 1; }
    (cd tests/cluster && in_private_netns ../../.venv/bin/python -m pytest)
}

# The Kubernetes chart (deploy/helm/berth): rendered by helm for every values file in its
# ci/, each manifest validated strictly against two Kubernetes versions' API schemas.
deploy_suite() {
    (cd tests/deploy && ../../.venv-deploy/bin/python -m pytest -p no:cacheprovider)
}

step "cargo fmt --check" cargo fmt --all -- --check
step "deploy: render and validate the Helm chart (tests/deploy)" deploy_suite
step "cargo clippy -D warnings" cargo clippy --workspace --all-targets -- -D warnings
# The unprivileged tier first: crates whose tests need no root (the control plane, the
# proxy and the agent tools run against berth-envd as a host process through
# berth_runtime::HostRuntime, so with clean root dotfiles). Then the privileged tier: real namespaces, cgroups, CRIU,
# nftables, registries.
unprivileged_crates=(berth-api berth-store berth-proxy berth-envd-proto berth-leftover-body berth-client berth-dashboard berth-mcp berth-server berth-interpreter berth-bench berth-ca berth-mcp-gateway)
step "cargo test: unprivileged tier" with_clean_root_dotfiles cargo test "${unprivileged_crates[@]/#/-p=}"
step "cargo test: privileged tier" cargo test --workspace "${unprivileged_crates[@]/#/--exclude=}"
# The store's tests again on Postgres (the `postgres::` half the unprivileged tier leaves
# ignored), on a throwaway cluster of Debian's server that the script removes afterwards.
step "cargo test: store on Postgres" scripts/with-postgres.sh cargo test -p berth-store -- --ignored
step "build berth-envd" build_envd
step "Python SDK suite (tests/sdk)" python_sdk_suite
step "JS SDK smoke (tests/sdk/js)" js_sdk_suite
step "build berth" build_berth
step "build berth-interpreter (static)" build_interpreter
step "build mcp-gateway (static)" build_mcp_gateway
# The suites that drive `berth up`, in lanes of about equal length (the interpreter's
# lane starts with its template build, the longest single step).
lanes \
    "control plane: Python SDK suite" control_plane_suite \
    "control plane: JS SDK suite" control_plane_js \
    -- \
    "templates: Python SDK suite (tests/templates)" templates_suite \
    "templates: JS SDK (tests/templates/js)" templates_js \
    "dashboard: browser suite (tests/dashboard)" dashboard_suite \
    "cluster: berth api + berth node on Postgres (tests/cluster)" cluster_suite \
    -- \
    "MCP suite (tests/mcp)" mcp_suite \
    "MCP conformance (tests/mcp/conformance)" mcp_conformance \
    "ops: CLI, metrics, doctor, gc, limits (tests/ops)" ops_suite \
    "MCP gateway: Python and JS SDKs (tests/mcp_gateway)" mcp_gateway_suite \
    -- \
    "interpreter: build code-interpreter-v1" interpreter_template \
    "interpreter: Python SDK suite (tests/interpreter)" interpreter_python \
    "interpreter: JS SDK (tests/interpreter/js)" interpreter_js

printf '\n==> summary (%ss total)\n' "$SECONDS"
printf '    %s\n' "${summary[@]}"
printf '%s\n' "${summary[@]}" >"$artifacts_dir/summary.txt"
echo "artifacts (screenshots, failed suites' logs): $artifacts_dir"
exit "$failed"

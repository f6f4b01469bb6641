#!/usr/bin/env bash
# A throwaway Postgres cluster (Debian's `postgresql` package) for tests:
#
#   scripts/with-postgres.sh COMMAND...   runs COMMAND with a cluster, then removes it
#   scripts/with-postgres.sh --start DIR  starts one in the empty directory DIR and
#                                         prints its variables (KEY=VALUE lines)
#   scripts/with-postgres.sh --stop DIR   stops it and removes DIR
#
# The cluster listens on a unix socket inside its own directory only (no TCP port, so
# nothing is shared with other runs or reachable from elsewhere), runs as the
# unprivileged `berth-pgtest` user when started as root (Postgres refuses root;
# install-deps.sh makes the user, `nobody` stands in without it), with fsync off, and
# ICU's en-US as the default collation: the store must order text by bytes all the same.
# Its variables:
#   BERTH_TEST_DATABASE_URL           superuser `postgres`, trusted, database `postgres`
#   BERTH_TEST_DATABASE_PASSWORD_URL  role `berth_pw` (password auth), its own database
#   BERTH_TEST_DATABASE_PASSWORD      that role's password (not in the URL)
# The wrapper form stops and removes the cluster however COMMAND ends (and on INT/TERM).
set -euo pipefail

bin_dir() {
    local dir
    dir="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)"
    if [[ -z "$dir" || ! -x "$dir/initdb" ]]; then
        echo "with-postgres: no Postgres server binaries under /usr/lib/postgresql; install Debian's postgresql package (scripts/install-deps.sh does)" >&2
        return 1
    fi
    printf '%s\n' "$dir"
}

# as_owner COMMAND...: runs COMMAND as the cluster's owner.
as_owner() {
    if [[ $EUID -eq 0 ]]; then
        runuser -u "$(owner)" -- "$@"
    else
        "$@"
    fi
}

owner() {
    if [[ $EUID -ne 0 ]]; then
        id -un
    elif id berth-pgtest >/dev/null 2>&1; then
        echo berth-pgtest
    else
        echo nobody
    fi
}

# The socket's port number: only names the socket file, nothing listens on TCP.
readonly PORT=5432

url() {
    local user="$1" database="$2" dir="$3" host
    host="$(printf '%s' "$dir/sock" | sed 's|/|%2F|g')"
    printf 'postgres://%s@%s:%s/%s\n' "$user" "$host" "$PORT" "$database"
}

start() {
    local dir="$1" bin password
    bin="$(bin_dir)"
    [[ -d "$dir" && -z "$(ls -A "$dir")" ]] || { echo "with-postgres: $dir must be an empty directory" >&2; return 1; }
    chmod 0755 "$dir"
    mkdir -m 0700 "$dir/data"
    mkdir -m 0755 "$dir/sock"
    if [[ $EUID -eq 0 ]]; then
        chown "$(owner):" "$dir/data" "$dir/sock"
    fi
    as_owner "$bin/initdb" -D "$dir/data" -U postgres --auth-local=trust --auth-host=reject \
        --encoding=UTF8 --locale=C.UTF-8 --locale-provider=icu --icu-locale=en-US >"$dir/initdb.log" 2>&1 ||
        { cat "$dir/initdb.log" >&2; return 1; }
    # The password role authenticates (first matching line wins); everyone else is trusted.
    as_owner sh -c "{ echo 'local all berth_pw scram-sha-256'; cat '$dir/data/pg_hba.conf'; } >'$dir/data/pg_hba.new' && mv '$dir/data/pg_hba.new' '$dir/data/pg_hba.conf'"
    as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/data/server.log" -w -t 60 \
        -o "-c listen_addresses='' -k $dir/sock -p $PORT -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=300" \
        start >/dev/null || { cat "$dir/data/server.log" >&2; return 1; }
    password="$(head -c 18 /dev/urandom | od -An -tx1 | tr -d ' \n')"
    "$bin/psql" -X -q -v ON_ERROR_STOP=1 -h "$dir/sock" -p "$PORT" -U postgres -d postgres \
        -c "CREATE ROLE berth_pw LOGIN PASSWORD '$password'" \
        -c "CREATE DATABASE berth_pw OWNER berth_pw" >/dev/null
    printf 'BERTH_TEST_DATABASE_URL=%s\n' "$(url postgres postgres "$dir")"
    printf 'BERTH_TEST_DATABASE_PASSWORD_URL=%s\n' "$(url berth_pw berth_pw "$dir")"
    printf 'BERTH_TEST_DATABASE_PASSWORD=%s\n' "$password"
}

stop() {
    local dir="$1" bin
    bin="$(bin_dir)"
    if [[ -f "$dir/data/postmaster.pid" ]]; then
        as_owner "$bin/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1 || true
    fi
    rm -rf "$dir"
}

case "${1:-}" in
--start) start "$2" ;;
--stop) stop "$2" ;;
"") echo "usage: $0 COMMAND... | --start DIR | --stop DIR" >&2; exit 2 ;;
*)
    cluster="$(mktemp -d /tmp/berth-pg.XXXXXX)"
    trap 'stop "$cluster"' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    while IFS='=' read -r key value; do
        export "$key=$value"
    done < <(start "$cluster")
    [[ -n "${BERTH_TEST_DATABASE_URL:-}" ]] || { echo "with-postgres: the cluster did not start" >&2; exit 1; }
    "$@"
    ;;
esac

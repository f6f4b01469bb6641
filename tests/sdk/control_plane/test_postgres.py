"""`berth up --database postgres://…`: the control plane's state in Postgres.

A throwaway Postgres cluster (scripts/with-postgres.sh: Debian's server, a unix socket
in its own directory, removed afterwards), a second `berth up` of its own state dir
given the cluster's URL, a key made by `berth keys create` through BERTH_DATABASE_URL,
and the official Python SDK creating, listing and killing a sandbox through it. The
rows are read back with psql: the state is in Postgres, and no berth.db was made.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from conftest import REPO_ROOT, Berth, berth_binary, free_loopback_port, log_root, remove_state_dir, sandbox_network_env
from internet import FakeInternet

CLUSTER = REPO_ROOT / "scripts" / "with-postgres.sh"
E2B_VARS = ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY")


def psql(url: str, sql: str) -> str:
    psql_bin = shutil.which("psql") or "/usr/lib/postgresql/15/bin/psql"
    result = subprocess.run(
        [psql_bin, "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", url, "-c", sql],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, f"psql: {result.stderr}"
    return result.stdout.strip()


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    cluster = Path(tempfile.mkdtemp(prefix="berth-pg-"))
    try:
        started = subprocess.run(
            [str(CLUSTER), "--start", str(cluster)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert started.returncode == 0, f"starting Postgres failed:\n{started.stderr}"
        variables = dict(line.split("=", 1) for line in started.stdout.splitlines() if "=" in line)
        yield variables["BERTH_TEST_DATABASE_URL"]
    finally:
        subprocess.run([str(CLUSTER), "--stop", str(cluster)], stdin=subprocess.DEVNULL, timeout=120)


@pytest.fixture(scope="module")
def postgres_berth(request: pytest.FixtureRequest, internet: FakeInternet, postgres_url: str) -> Iterator[Berth]:
    """A `berth up` of its own whose state is in the cluster; the session's E2B_*
    variables are put back afterwards."""
    saved = {var: os.environ.get(var) for var in E2B_VARS}
    state_dir = Path(tempfile.mkdtemp(prefix="berth-pg-state-"))
    templates = Path(os.environ.get("BERTH_TEMPLATES_DIR", "/var/lib/berth/templates"))
    if templates.is_dir():
        (state_dir / "templates").symlink_to(templates)
    log_dir = Path(tempfile.mkdtemp(prefix="berth-pg-log-", dir=log_root()))
    instance = Berth(
        binary=berth_binary(),
        state_dir=state_dir,
        listen=f"127.0.0.1:{free_loopback_port()}",
        log_path=log_dir / "berth-up.log",
        network_env={
            **sandbox_network_env(),
            "BERTH_EGRESS_ALLOW": internet.ceiling,
            "BERTH_DNS_UPSTREAM": f"{internet.dns_ip}:53",
        },
        database_url=postgres_url,
    )
    failed_before = request.session.testsfailed
    try:
        instance.start()
        yield instance
    finally:
        code = instance.stop()
        remove_state_dir(state_dir)
        for var, value in saved.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value
        if request.session.testsfailed > failed_before or not instance.env:
            print(f"\nberth up (Postgres) exited with {code}; its log is kept at {instance.log_path}")
        else:
            shutil.rmtree(log_dir, ignore_errors=True)


def test_the_sdk_creates_lists_and_kills_a_sandbox_with_state_in_postgres(
    postgres_berth: Berth, postgres_url: str
) -> None:
    from e2b import Sandbox

    log = postgres_berth.log_path.read_text(errors="replace")
    assert "state: Postgres postgres://postgres@" in log, log[-4000:]
    assert not (postgres_berth.state_dir / "berth.db").exists(), "SQLite was used"

    sandbox = Sandbox.create(timeout=120)
    try:
        assert sandbox.commands.run("echo from-postgres").stdout.strip() == "from-postgres"
        listed = [info.sandbox_id for info in Sandbox.list().next_items()]
        assert sandbox.sandbox_id in listed
        assert psql(postgres_url, f"SELECT status FROM sandboxes WHERE id = '{sandbox.sandbox_id}'") == "running"
    finally:
        sandbox.kill()
    assert sandbox.sandbox_id not in [info.sandbox_id for info in Sandbox.list().next_items()]
    assert psql(postgres_url, f"SELECT status FROM sandboxes WHERE id = '{sandbox.sandbox_id}'") == "killed"
    events = psql(
        postgres_url,
        f"SELECT string_agg(event_type, ',' ORDER BY seq) FROM events WHERE sandbox_id = '{sandbox.sandbox_id}'",
    )
    assert "sandbox.lifecycle.created" in events and "sandbox.lifecycle.killed" in events, events


def test_keys_made_while_berth_up_runs_work_at_once(postgres_berth: Berth, postgres_url: str) -> None:
    """`berth keys create` is another process on the same database."""
    import httpx

    key = postgres_berth.create_key("second-team")
    teams = psql(postgres_url, "SELECT string_agg(name, ',' ORDER BY name) FROM teams")
    assert "second-team" in teams.split(","), teams
    listed = httpx.get(f"{postgres_berth.api_url}/v2/sandboxes", headers={"X-API-Key": key}, timeout=30)
    assert listed.status_code == 200, listed.text
    assert listed.json() == []
    assert key not in psql(postgres_url, "SELECT string_agg(key_hash, ',') FROM api_keys"), "raw key stored"

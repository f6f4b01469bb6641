"""Operator limits: `--max-sandbox-lifetime` (24 h by default, `unlimited` allowed) and
`--team-max-sandboxes` (E2B's 429 `{code, message}` beyond it), on a second `berth up`
of this module's own (state dir, pool and ceiling as the session's)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from conftest import Berth, Cli, control_plane


@pytest.fixture(scope="module")
def limited(berth: Berth, internet) -> Iterator[Berth]:
    state_dir = Path(tempfile.mkdtemp(prefix="berth-ops-limits-"))
    templates = berth.state_dir / "templates"
    if templates.is_symlink():
        (state_dir / "templates").symlink_to(templates.resolve())
    log_dir = Path(tempfile.mkdtemp(prefix="berth-ops-limits-log-"))
    instance = Berth(
        binary=berth.binary,
        state_dir=state_dir,
        listen=f"127.0.0.1:{control_plane.free_loopback_port()}",
        log_path=log_dir / "berth-up.log",
        network_env={
            **control_plane.sandbox_network_env(),
            "BERTH_EGRESS_ALLOW": internet.ceiling,
            "BERTH_DNS_UPSTREAM": f"{internet.dns_ip}:53",
            "BERTH_METRICS_LISTEN": f"127.0.0.1:{control_plane.free_loopback_port()}",
            "BERTH_MAX_SANDBOX_LIFETIME": "unlimited",
            "BERTH_TEAM_MAX_SANDBOXES": "1",
            "BERTH_POOL_SIZE": "0",
        },
    )
    session_env = dict(berth.env)
    try:
        instance.start()
        yield instance
    finally:
        if instance.process is not None and instance.env:
            control_plane.kill_all_sandboxes(instance.api_url, instance.api_key)
        instance.stop()
        # start() exported this instance's variables: give the session's back.
        import os
        os.environ.update(session_env)
        control_plane.remove_state_dir(state_dir)
        shutil.rmtree(log_dir, ignore_errors=True)


def test_lifetime_is_24_hours_by_default(api: httpx.Client) -> None:
    refused = api.post("/sandboxes", json={"templateID": "base", "timeout": 2 * 24 * 3600})
    assert refused.status_code == 400 and "86400" in refused.json()["message"]


def test_unlimited_lifetime_and_team_quota(limited: Berth, cli: Cli) -> None:
    env = {"E2B_API_URL": limited.api_url, "E2B_API_KEY": limited.api_key, "E2B_SANDBOX_URL": limited.sandbox_url}
    with httpx.Client(base_url=limited.api_url, headers={"X-API-Key": limited.api_key}, timeout=120) as client:
        first = client.post("/sandboxes", json={"templateID": "base", "timeout": 400 * 24 * 3600})
        assert first.status_code == 201, first.text
        sandbox_id = first.json()["sandboxID"]
        over = client.post("/sandboxes", json={"templateID": "base", "timeout": 60})
        assert over.status_code == 429
        assert over.json() == {"code": 429, "message": over.json()["message"]}
        assert "maximum number of concurrent E2B sandboxes (1)" in over.json()["message"]
        by_cli = cli.run("sandbox", "create", env=env)
        assert by_cli.returncode != 0 and "HTTP 429" in by_cli.stderr and "kill or pause" in by_cli.stderr
        forked = client.post(f"/sandboxes/{sandbox_id}/fork", json={"count": 1})
        assert forked.status_code == 429
        # A paused sandbox frees its place; resuming it while another runs is refused.
        assert client.post(f"/sandboxes/{sandbox_id}/pause").status_code == 204
        second = client.post("/sandboxes", json={"templateID": "base", "timeout": 60})
        assert second.status_code == 201, second.text
        assert client.post(f"/sandboxes/{sandbox_id}/resume", json={"timeout": 60}).status_code == 429
        assert client.delete(f"/sandboxes/{second.json()['sandboxID']}").status_code == 204
        assert client.post(f"/sandboxes/{sandbox_id}/resume", json={"timeout": 60}).status_code == 201
        client.delete(f"/sandboxes/{sandbox_id}")

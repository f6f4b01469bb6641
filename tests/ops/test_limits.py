"""Operator limits: `--max-sandbox-lifetime` (24 h by default, `unlimited` allowed),
`--team-max-sandboxes` (E2B's 429 `{code, message}` beyond it), and the `--config`
file: team CPU, memory and snapshot storage quotas (the official SDK's
RateLimitException), retention of paused sandboxes and snapshots (oldest first, never a
snapshot in use, each eviction an event), reloaded on SIGHUP and on change without a
restart, a bad file refused naming its key. On a second `berth up` of this module's own
(state dir, pool and ceiling as the session's)."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Iterator
from urllib.parse import quote

import httpx
import pytest

from conftest import Berth, Cli, control_plane, poll

MIB = 1024 * 1024


@pytest.fixture(scope="module")
def limited(request: pytest.FixtureRequest, berth: Berth, internet) -> Iterator[Berth]:
    state_dir = Path(tempfile.mkdtemp(prefix="berth-ops-limits-"))
    templates = berth.state_dir / "templates"
    if templates.is_symlink():
        (state_dir / "templates").symlink_to(templates.resolve())
    log_dir = Path(tempfile.mkdtemp(prefix="berth-ops-limits-log-", dir=control_plane.log_root()))
    config = log_dir / "limits.toml"
    config.write_text("# limits of test_limits.py, rewritten by its tests\n")
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
            "BERTH_CONFIG": str(config),
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
        if request.session.testsfailed:
            print(f"\nthe limits module's berth up log is kept at {instance.log_path}")
        else:
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


def config_file(berth: Berth) -> Path:
    return Path(berth.network_env["BERTH_CONFIG"])


def log_lines(berth: Berth) -> list[str]:
    return berth.log_path.read_text(errors="replace").splitlines()


def reload(berth: Berth, text: str, signal_it: bool = True) -> None:
    """Writes the config file and waits until berth has put it in force: after a SIGHUP,
    or (signal_it False) by noticing the change itself."""
    seen = len([line for line in log_lines(berth) if "limits reloaded" in line])
    config_file(berth).write_text(text)
    if signal_it:
        assert berth.process is not None
        os.kill(berth.process.pid, signal.SIGHUP)

    def reloaded() -> bool:
        return len([line for line in log_lines(berth) if "limits reloaded" in line]) > seen

    poll(reloaded, timeout=30, what="berth to reload its config")


def sdk_env(berth: Berth) -> dict[str, str]:
    return {"api_key": berth.api_key, "api_url": berth.api_url, "sandbox_url": berth.sandbox_url}


def events(client: httpx.Client, sandbox_id: str, event_type: str) -> list[dict]:
    listed = client.get(
        f"/events/sandboxes/{sandbox_id}", params={"types": event_type, "limit": 100, "orderAsc": "true"}
    )
    assert listed.status_code == 200, listed.text
    return listed.json()


@pytest.fixture
def client(limited: Berth) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=limited.api_url, headers={"X-API-Key": limited.api_key}, timeout=120) as client:
        yield client
    control_plane.kill_all_sandboxes(limited.api_url, limited.api_key)
    for snapshot in httpx.get(
        f"{limited.api_url}/snapshots", headers={"X-API-Key": limited.api_key}, timeout=30
    ).json():
        httpx.delete(
            f"{limited.api_url}/templates/{quote(snapshot['snapshotID'], safe='')}",
            headers={"X-API-Key": limited.api_key},
            timeout=30,
        )


def test_cpu_quota_raises_the_sdks_error_and_a_reload_changes_it_without_restart(
    limited: Berth, client: httpx.Client
) -> None:
    from e2b import RateLimitException, Sandbox

    pid = limited.process.pid if limited.process else None
    # base sandboxes get 2 CPUs each: room for one under 3.
    reload(limited, "[team_quotas]\nmax_sandboxes = \"unlimited\"\nmax_cpu = 3\n")
    first = Sandbox.create(timeout=120, **sdk_env(limited))
    with pytest.raises(RateLimitException) as refused:
        Sandbox.create(timeout=120, **sdk_env(limited))
    message = str(refused.value)
    assert "limit of 3 CPUs" in message and "team_quotas.max_cpu" in message, message

    # A bad file is refused, naming its key; the quota in force stays.
    refusals = len([line for line in log_lines(limited) if "config refused" in line])
    config_file(limited).write_text("[team_quotas]\nmax_sandboxes = \"unlimited\"\nmax_cpu = -4\n")
    os.kill(limited.process.pid, signal.SIGHUP)  # type: ignore[union-attr]

    def refused_with_key() -> bool:
        lines = [line for line in log_lines(limited) if "config refused" in line]
        return len(lines) > refusals and "team_quotas.max_cpu" in lines[-1]

    poll(refused_with_key, timeout=30, what="a log line refusing the config and naming its key")
    with pytest.raises(RateLimitException):
        Sandbox.create(timeout=120, **sdk_env(limited))

    # Raised by editing the file alone (berth notices the change): the create passes.
    reload(limited, "[team_quotas]\nmax_sandboxes = \"unlimited\"\nmax_cpu = 4\n", signal_it=False)
    second = Sandbox.create(timeout=120, **sdk_env(limited))
    assert second.commands.run("echo ok").stdout.strip() == "ok"
    # Memory counts the same way: two 512 MiB sandboxes run, a third would pass 1100.
    reload(limited, "[team_quotas]\nmax_sandboxes = \"unlimited\"\nmax_memory_mb = 1100\n")
    over = client.post("/sandboxes", json={"templateID": "base", "timeout": 60})
    assert over.status_code == 429, over.text
    assert over.json()["code"] == 429 and "team_quotas.max_memory_mb" in over.json()["message"]
    assert limited.process is not None and limited.process.pid == pid, "berth up was not restarted"
    first.kill()
    second.kill()


def test_snapshot_storage_quota_refuses_snapshots_beyond_it_and_keeps_none_of_them(
    limited: Berth, client: httpx.Client
) -> None:
    from e2b import RateLimitException, Sandbox

    reload(limited, "[team_quotas]\nmax_sandboxes = \"unlimited\"\nmax_snapshot_storage_mb = 3\n")
    sandbox = Sandbox.create(timeout=300, **sdk_env(limited))
    small = sandbox.create_snapshot(name="small")
    # With 4 MiB more on its disk, the next snapshot is known too big once it is taken.
    sandbox.commands.run("head -c 4M /dev/urandom > /home/user/blob")
    with pytest.raises(RateLimitException) as refused:
        sandbox.create_snapshot(name="big")
    assert "team_quotas.max_snapshot_storage_mb" in str(refused.value)
    assert [info["snapshotID"] for info in client.get("/snapshots").json()] == [small.snapshot_id]
    # Once the team is at its limit, a snapshot is refused before it is taken.
    reload(limited, "[team_quotas]\nmax_sandboxes = \"unlimited\"\nmax_snapshot_storage_mb = 1\n")
    with pytest.raises(RateLimitException):
        sandbox.create_snapshot(name="more")
    assert [info["snapshotID"] for info in client.get("/snapshots").json()] == [small.snapshot_id]
    assert sandbox.commands.run("echo still-running").stdout.strip() == "still-running"
    sandbox.kill()


def test_retention_evicts_the_oldest_snapshot_not_in_use_with_an_event(
    limited: Berth, client: httpx.Client
) -> None:
    from e2b import Sandbox

    reload(limited, "[team_quotas]\nmax_sandboxes = \"unlimited\"\n")
    source = Sandbox.create(timeout=300, **sdk_env(limited))
    taken = {name: source.create_snapshot(name=name) for name in ("snap-1", "snap-2", "snap-3")}
    # snap-1 is in use: a sandbox runs from it.
    child = Sandbox.create(taken["snap-1"].snapshot_id, timeout=300, **sdk_env(limited))
    sizes = [event["eventData"]["sizeBytes"] for event in events(client, source.sandbox_id, "sandbox.lifecycle.checkpointed")]
    assert len(sizes) == 3, sizes
    # Room for snap-1 and snap-3: the oldest snapshot not in use (snap-2) must go, and
    # nothing else.
    limit_mb = -(-(sizes[0] + sizes[2]) // MIB)
    assert sum(sizes) > limit_mb * MIB
    reload(
        limited,
        f"[team_quotas]\nmax_sandboxes = \"unlimited\"\n[retention]\nsnapshot_max_storage_mb = {limit_mb}\n",
    )

    def deleted() -> list[dict]:
        return events(client, source.sandbox_id, "sandbox.snapshot.deleted")

    poll(lambda: len(deleted()) >= 1, timeout=60, what="retention to delete a snapshot")
    [event] = deleted()
    assert event["eventData"]["name"] == "snap-2"
    assert event["eventData"]["reason"] == "retention"
    assert event["eventData"]["rule"] == "retention.snapshot_max_storage_mb"
    names = sorted(info["snapshotID"] for info in client.get("/snapshots").json())
    assert names == sorted([taken["snap-1"].snapshot_id, taken["snap-3"].snapshot_id])
    # Once its sandbox is gone, snap-1 is no longer in use and is the oldest: it goes.
    child.kill()
    reload(
        limited,
        f"[team_quotas]\nmax_sandboxes = \"unlimited\"\n[retention]\nsnapshot_max_storage_mb = {-(-sizes[2] // MIB)}\n",
    )
    poll(lambda: len(deleted()) >= 2, timeout=60, what="retention to delete the snapshot no longer in use")
    assert deleted()[1]["eventData"]["name"] == "snap-1"
    assert [info["snapshotID"] for info in client.get("/snapshots").json()] == [taken["snap-3"].snapshot_id]
    logged = [line for line in log_lines(limited) if "retention deleted a snapshot" in line]
    assert "snap-2" in logged[0] and "snap-1" in logged[1], logged
    source.kill()


def test_retention_kills_the_longest_paused_sandbox_first(limited: Berth, client: httpx.Client) -> None:
    from e2b import Sandbox

    reload(limited, "[team_quotas]\nmax_sandboxes = \"unlimited\"\n")
    older = Sandbox.create(timeout=300, **sdk_env(limited))
    newer = Sandbox.create(timeout=300, **sdk_env(limited))
    older.pause()
    newer.pause()
    reload(limited, "[team_quotas]\nmax_sandboxes = \"unlimited\"\n[retention]\npaused_max_count = 1\n")

    def killed(sandbox_id: str) -> list[dict]:
        return events(client, sandbox_id, "sandbox.lifecycle.killed")

    poll(lambda: bool(killed(older.sandbox_id)), timeout=60, what="retention to kill the older paused sandbox")
    [event] = killed(older.sandbox_id)
    assert event["eventData"]["reason"] == "retention"
    assert event["eventData"]["rule"] == "retention.paused_max_count"
    assert client.get(f"/sandboxes/{older.sandbox_id}").status_code == 404
    assert client.get(f"/sandboxes/{newer.sandbox_id}").json()["state"] == "paused"
    assert not killed(newer.sandbox_id)
    # By age: paused longer than a second.
    reload(limited, "[team_quotas]\nmax_sandboxes = \"unlimited\"\n[retention]\npaused_max_age = 1\n")
    poll(lambda: bool(killed(newer.sandbox_id)), timeout=60, what="retention to kill a sandbox paused too long")
    assert killed(newer.sandbox_id)[0]["eventData"]["rule"] == "retention.paused_max_age"
    reload(limited, "[team_quotas]\nmax_sandboxes = \"unlimited\"\n")

"""Restarting `berth up` while sandboxes run: each is listed and usable, or reported
killed with nothing of it left running. Runs last (it restarts the session's server)."""

from __future__ import annotations

import secrets
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox, SandboxQuery
from e2b.exceptions import NotFoundException

from conftest import Berth, poll


def host_processes_with(marker: str) -> list[int]:
    """PIDs on the host whose command line contains `marker` (the host sees sandbox processes)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            pids.append(int(proc.name))
    return pids


@pytest.mark.restarts_berth
def test_restart_keeps_or_cleanly_reports_sandboxes(berth: Berth, api: httpx.Client) -> None:
    tag = f"restart-{secrets.token_hex(4)}"
    sandboxes = [Sandbox.create(timeout=900, metadata={"tag": tag}) for _ in range(3)]
    markers = {}
    try:
        for sandbox in sandboxes:
            marker = f"berth-restart-probe-{secrets.token_hex(6)}"
            markers[sandbox.sandbox_id] = marker
            sandbox.files.write("/home/user/before-restart.txt", sandbox.sandbox_id)
            sandbox.commands.run(f"exec -a {marker} sleep 3600", background=True)
            poll(lambda: bool(host_processes_with(marker)), timeout=60, what=f"probe process {marker}")

        berth.restart()

        listed = Sandbox.list(query=SandboxQuery(metadata={"tag": tag}), limit=100).next_items()
        listed_ids = {info.sandbox_id for info in listed}
        assert listed_ids <= {sandbox.sandbox_id for sandbox in sandboxes}, "ghost sandboxes listed"
        for sandbox in sandboxes:
            marker = markers[sandbox.sandbox_id]
            if sandbox.sandbox_id in listed_ids:
                # Listed means usable: envd answers through the proxy, state is intact.
                again = Sandbox.connect(sandbox.sandbox_id)
                assert again.files.read("/home/user/before-restart.txt") == sandbox.sandbox_id
                assert again.commands.run("echo after-restart").stdout == "after-restart\n"
                assert host_processes_with(marker), "a listed sandbox lost its processes"
            else:
                with pytest.raises(NotFoundException):
                    Sandbox.get_info(sandbox.sandbox_id)
                events = api.get(f"/events/sandboxes/{sandbox.sandbox_id}", params={"limit": 1}).json()
                assert events and events[0]["type"] == "sandbox.lifecycle.killed"
                poll(
                    lambda: not host_processes_with(marker),
                    timeout=60,
                    what=f"processes of the reported-killed sandbox {sandbox.sandbox_id} to be gone",
                )
                proxied = httpx.get(
                    f"{berth.sandbox_url}/health",
                    headers={"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "49983"},
                    timeout=30,
                )
                assert proxied.status_code == 502
    finally:
        for sandbox in sandboxes:
            try:
                Sandbox.kill(sandbox.sandbox_id)
            except Exception:  # already reported killed
                pass
    for marker in markers.values():
        poll(lambda: not host_processes_with(marker), timeout=60, what=f"{marker} to be gone after kill")


@pytest.mark.restarts_berth
def test_paused_sandboxes_and_snapshots_survive_a_restart(berth: Berth, api: httpx.Client) -> None:
    from test_pause import ask_holder, start_holder

    paused = Sandbox.create(timeout=900)
    source = Sandbox.create(timeout=900)
    name = f"restart-snap-{secrets.token_hex(4)}"
    children: list[str] = []
    try:
        start_holder(paused, 8000)
        secret, hits = ask_holder(paused, 8000)
        paused.pause()
        start_holder(source, 8000)
        snap_secret, snap_hits = ask_holder(source, 8000)
        source.create_snapshot(name=name)

        berth.restart()

        assert api.get(f"/sandboxes/{paused.sandbox_id}").json()["state"] == "paused"
        resumed = Sandbox.connect(paused.sandbox_id, timeout=600)
        assert ask_holder(resumed, 8000) == (secret, hits + 1)
        child = Sandbox.create(name, timeout=300)
        children.append(child.sandbox_id)
        assert ask_holder(child, 8000) == (snap_secret, snap_hits + 1)
    finally:
        for sandbox_id in [paused.sandbox_id, source.sandbox_id, *children]:
            try:
                Sandbox.kill(sandbox_id)
            except Exception:
                pass
        api.delete(f"/templates/{name}")


@pytest.mark.restarts_berth
def test_network_policy_survives_a_restart(berth: Berth, internet) -> None:
    """The policy lives in the runtime's network record and the row: after a restart the
    sandbox is reattached under the same rules, and the egress path works again."""
    from test_network import curl, with_ca

    allowed, denied = internet.web_ips
    sandbox = with_ca(
        Sandbox.create(timeout=600, network={"deny_out": ["0.0.0.0/0"], "allow_out": [allowed]}), internet
    )
    try:
        assert curl(sandbox, f"http://{allowed}/")[0] == 0
        berth.restart()
        again = Sandbox.connect(sandbox.sandbox_id)
        assert curl(again, f"http://{allowed}/")[0] == 0
        assert curl(again, f"http://{denied}/")[0] != 0
        info = Sandbox.get_info(sandbox.sandbox_id)
        assert info.network is not None and info.network.get("deny_out") == ["0.0.0.0/0"]
    finally:
        Sandbox.kill(sandbox.sandbox_id)

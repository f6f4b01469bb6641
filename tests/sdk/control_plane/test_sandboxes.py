"""Sandbox lifecycle through the official SDK: create, info, list, connect, timeout, metrics, kill."""

from __future__ import annotations

import datetime as dt
import re
import secrets

import httpx
import pytest
from e2b import Sandbox, SandboxQuery, SandboxState
from e2b.exceptions import NotFoundException, SandboxException

from conftest import Berth, poll


def unique(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(4)}"


def test_create_with_template_timeout_metadata_envs(berth: Berth) -> None:
    tag = unique("create")
    before = dt.datetime.now(dt.timezone.utc)
    sandbox = Sandbox.create(
        template="base",
        timeout=120,
        metadata={"suite": "control-plane", "tag": tag},
        envs={"BERTH_SUITE_VAR": "from-create", "SECOND": "two words"},
    )
    try:
        assert re.fullmatch(r"[a-z0-9]+", sandbox.sandbox_id), sandbox.sandbox_id

        info = sandbox.get_info()
        assert info.sandbox_id == sandbox.sandbox_id
        assert info.metadata == {"suite": "control-plane", "tag": tag}
        assert info.state == SandboxState.RUNNING
        assert info.template_id
        # The end time reflects the requested timeout (bounds, not timing).
        lifetime = (info.end_at - info.started_at).total_seconds()
        assert 110 <= lifetime <= 130, lifetime
        assert info.started_at >= before - dt.timedelta(minutes=5)
        assert info.cpu_count >= 1 and info.memory_mb >= 1
        assert info.envd_version

        result = sandbox.commands.run('printf "%s|%s" "$BERTH_SUITE_VAR" "$SECOND"')
        assert result.exit_code == 0
        assert result.stdout == "from-create|two words"
        assert sandbox.is_running()
    finally:
        sandbox.kill()


def test_every_sandbox_is_secured(berth: Berth) -> None:
    sandbox = Sandbox.create(timeout=120, secure=True)
    try:
        token = sandbox._envd_access_token
        assert token, "the create response carries no envdAccessToken"
        envd = {"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "49983"}
        url = f"{berth.sandbox_url}/process.Process/List"
        refused = httpx.post(url, json={}, headers=envd, timeout=30)
        assert refused.status_code == 401, refused.text
        wrong = httpx.post(url, json={}, headers={**envd, "X-Access-Token": "x" + token}, timeout=30)
        assert wrong.status_code == 401, wrong.text
        allowed = httpx.post(url, json={}, headers={**envd, "X-Access-Token": token}, timeout=30)
        assert allowed.status_code == 200, allowed.text
        # The SDK itself sends the token.
        assert sandbox.commands.run("echo secured").stdout == "secured\n"
    finally:
        sandbox.kill()


def test_get_info_set_timeout_and_connect(berth: Berth) -> None:
    sandbox = Sandbox.create(timeout=60)
    try:
        first_end = sandbox.get_info().end_at
        sandbox.set_timeout(600)
        extended = sandbox.get_info().end_at
        assert extended > first_end + dt.timedelta(seconds=400)

        # set_timeout may shorten, connect never shortens.
        sandbox.set_timeout(300)
        shortened = sandbox.get_info().end_at
        assert shortened < extended

        connected = Sandbox.connect(sandbox.sandbox_id, timeout=30)
        assert connected.sandbox_id == sandbox.sandbox_id
        assert connected.get_info().end_at >= shortened
        assert connected.commands.run("echo connected").stdout == "connected\n"

        connected_longer = Sandbox.connect(sandbox.sandbox_id, timeout=900)
        assert connected_longer.get_info().end_at > shortened + dt.timedelta(seconds=500)
    finally:
        sandbox.kill()


def test_kill_then_everything_reports_it_gone(berth: Berth) -> None:
    sandbox = Sandbox.create(timeout=120)
    sandbox_id = sandbox.sandbox_id
    sandbox.kill()
    assert not sandbox.is_running()
    with pytest.raises(NotFoundException):
        Sandbox.get_info(sandbox_id)
    assert Sandbox.kill(sandbox_id) is False
    with pytest.raises(SandboxException):
        Sandbox.connect(sandbox_id)
    listed = Sandbox.list(query=SandboxQuery(state=[SandboxState.RUNNING]), limit=100).next_items()
    assert sandbox_id not in {info.sandbox_id for info in listed}
    # The proxy answers the SDK's "not found" 502 for the dead sandbox.
    answer = httpx.get(
        f"{berth.sandbox_url}/health",
        headers={"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": "49983"},
        timeout=30,
    )
    assert answer.status_code == 502
    assert answer.json() == {"sandboxId": sandbox_id, "message": "The sandbox was not found", "code": 502}


def test_list_filters_and_paging(berth: Berth) -> None:
    tag = unique("list")
    created = [
        Sandbox.create(timeout=300, metadata={"tag": tag, "index": str(index), "parity": str(index % 2)})
        for index in range(5)
    ]
    try:
        ids = {sandbox.sandbox_id for sandbox in created}

        def collect(query: SandboxQuery, limit: int) -> list:
            paginator = Sandbox.list(query=query, limit=limit)
            pages = []
            while paginator.has_next:
                page = paginator.next_items()
                assert len(page) <= limit
                pages.append(page)
                assert len(pages) <= 20, "paging never ended"
            return pages

        pages = collect(SandboxQuery(metadata={"tag": tag}), limit=2)
        assert [len(page) for page in pages] == [2, 2, 1]
        seen = [info.sandbox_id for page in pages for info in page]
        assert len(seen) == len(set(seen)) == 5
        assert set(seen) == ids

        odd = [info for page in collect(SandboxQuery(metadata={"tag": tag, "parity": "1"}), 10) for info in page]
        assert sorted(info.metadata["index"] for info in odd) == ["1", "3"]

        running = collect(SandboxQuery(metadata={"tag": tag}, state=[SandboxState.RUNNING]), 10)
        assert {info.sandbox_id for page in running for info in page} == ids
        paused = collect(SandboxQuery(metadata={"tag": tag}, state=[SandboxState.PAUSED]), 10)
        assert [info for page in paused for info in page] == []

        by_template = collect(SandboxQuery(metadata={"tag": tag}, template="base"), 10)
        assert {info.sandbox_id for page in by_template for info in page} == ids
        other_template = collect(SandboxQuery(metadata={"tag": tag}, template="no-such-template"), 10)
        assert [info for page in other_template for info in page] == []

        future = dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=1)
        late = collect(SandboxQuery(metadata={"tag": tag}, started_after=future), 10)
        assert [info for page in late for info in page] == []

        created[0].kill()
        remaining = collect(SandboxQuery(metadata={"tag": tag}), 10)
        assert {info.sandbox_id for page in remaining for info in page} == ids - {created[0].sandbox_id}
    finally:
        for sandbox in created:
            try:
                sandbox.kill()
            except SandboxException:
                pass


def test_list_headers_on_the_wire(berth: Berth, api: httpx.Client) -> None:
    tag = unique("wire")
    created = [Sandbox.create(timeout=300, metadata={"tag": tag}) for _ in range(3)]
    try:
        first = api.get("/v2/sandboxes", params={"metadata": f"tag={tag}", "limit": 2})
        assert first.status_code == 200
        assert len(first.json()) == 2
        token = first.headers.get("x-next-token")
        assert token
        assert int(first.headers["x-total-running"]) >= 3
        second = api.get("/v2/sandboxes", params={"metadata": f"tag={tag}", "limit": 2, "nextToken": token})
        assert second.status_code == 200
        assert len(second.json()) == 1
        assert not second.headers.get("x-next-token")
        listed = {item["sandboxID"] for item in first.json() + second.json()}
        assert listed == {sandbox.sandbox_id for sandbox in created}
        for item in first.json():
            assert {"sandboxID", "templateID", "startedAt", "endAt", "state", "metadata", "clientID"} <= item.keys()
        legacy = api.get("/sandboxes", params={"metadata": f"tag={tag}"})
        assert legacy.status_code == 200
        assert {item["sandboxID"] for item in legacy.json()} == listed
    finally:
        for sandbox in created:
            sandbox.kill()


def test_get_metrics(sandbox: Sandbox) -> None:
    # A little work so the cgroup has something to report.
    sandbox.commands.run("head -c 5000000 /dev/urandom | sha256sum > /dev/null")

    def has_metrics() -> bool:
        return bool(sandbox.get_metrics())

    poll(has_metrics, timeout=120, interval=1, what="a first metrics sample")
    metrics = sandbox.get_metrics()
    latest = metrics[-1]
    assert latest.cpu_count >= 1
    assert 0 <= latest.cpu_used_pct <= 100 * latest.cpu_count
    assert 0 < latest.mem_used <= latest.mem_total
    assert latest.mem_cache >= 0
    assert 0 < latest.disk_used <= latest.disk_total
    assert latest.timestamp.tzinfo is not None
    timestamps = [metric.timestamp for metric in metrics]
    assert timestamps == sorted(timestamps)

"""Snapshots and fork through `berth up` with the official SDK, and races between
pause, resume, kill and fork on one sandbox."""

from __future__ import annotations

import secrets
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import httpx
import pytest
from e2b import Sandbox

from conftest import Berth
from test_pause import ask_holder, sandbox_state, start_holder


@pytest.fixture
def source(berth: Berth) -> Iterator[Sandbox]:
    created = Sandbox.create(timeout=600, metadata={"role": "source"}, envs={"MARK": "from-source"})
    try:
        yield created
    finally:
        Sandbox.kill(created.sandbox_id)


def kill_quietly(sandbox_id: str) -> None:
    try:
        Sandbox.kill(sandbox_id)
    except Exception:
        pass


def test_snapshot_then_three_sandboxes_from_it(berth: Berth, api: httpx.Client, source: Sandbox) -> None:
    start_holder(source, 8000)
    secret, hits = ask_holder(source, 8000)
    source.files.write("/home/user/state.txt", "snapshotted")
    name = f"snap-{secrets.token_hex(4)}"

    info = source.create_snapshot(name=name)
    # E2B's full name: the team's namespace, the name, the default tag.
    namespace, _, rest = info.snapshot_id.partition("/")
    assert namespace and rest == f"{name}:default", info.snapshot_id
    assert info.names == [info.snapshot_id]
    assert ask_holder(source, 8000) == (secret, hits + 1), "the source keeps running"
    listed = api.get("/snapshots", params={"sandboxID": source.sandbox_id}).json()
    assert [s["snapshotID"] for s in listed] == [info.snapshot_id]
    types = [e["type"] for e in api.get(f"/events/sandboxes/{source.sandbox_id}").json()]
    assert "sandbox.lifecycle.checkpointed" in types

    with ThreadPoolExecutor(3) as pool:
        children = list(pool.map(lambda _: Sandbox.create(info.snapshot_id, timeout=300), range(3)))
    try:
        ids = {child.sandbox_id for child in children} | {source.sandbox_id}
        assert len(ids) == 4
        for child in children:
            answer, child_hits = ask_holder(child, 8000)
            assert answer == secret, "the snapshot's memory"
            assert child_hits == hits + 1, "each starts from the snapshot's instant"
            assert child.files.read("/home/user/state.txt") == "snapshotted"
            seen = child.commands.run("echo $MARK $E2B_SANDBOX_ID; hostname").stdout.split()
            assert seen == ["from-source", child.sandbox_id, child.sandbox_id]
            assert child.get_info().name == name
        children[0].files.write("/home/user/state.txt", "changed in one")
        assert children[1].files.read("/home/user/state.txt") == "snapshotted"
        assert source.files.read("/home/user/state.txt") == "snapshotted"
    finally:
        for child in children:
            kill_quietly(child.sandbox_id)

    assert api.delete(f"/templates/{name}").status_code == 204
    assert api.get("/snapshots", params={"name": name}).json() == []
    assert api.post("/v2/sandboxes", json={"templateID": name}).status_code == 404
    assert api.delete(f"/templates/{name}").status_code == 404


def test_filesystem_only_snapshot_boots_fresh_on_its_files(api: httpx.Client, source: Sandbox) -> None:
    start_holder(source, 8000)
    source.files.write("/home/user/state.txt", "files only")
    name = f"fs-snap-{secrets.token_hex(4)}"
    source.create_snapshot(name=name, mode="filesystem")
    child = Sandbox.create(name, timeout=300)
    try:
        assert child.files.read("/home/user/state.txt") == "files only"
        assert "holder.py" not in child.commands.run("ps -eo args").stdout, "no process comes along"
        seen = child.commands.run("echo $MARK $E2B_SANDBOX_ID; whoami").stdout.split()
        assert seen == ["from-source", child.sandbox_id, "user"]
    finally:
        kill_quietly(child.sandbox_id)
        api.delete(f"/templates/{name}")


def test_snapshot_input_is_checked(api: httpx.Client, source: Sandbox) -> None:
    bad = api.post(f"/sandboxes/{source.sandbox_id}/snapshots", json={"name": "no spaces"})
    assert bad.status_code == 400 and "name" in bad.json()["message"]
    clash = api.post(f"/sandboxes/{source.sandbox_id}/snapshots", json={"name": "base"})
    assert clash.status_code == 409
    missing = api.post("/sandboxes/inotthere0000000000000/snapshots", json={})
    assert missing.status_code == 404


def test_fork_five_share_memory_then_diverge(api: httpx.Client, source: Sandbox) -> None:
    start_holder(source, 8000)
    secret, hits = ask_holder(source, 8000)
    source.commands.run("echo parent > /home/user/who")

    results = source.fork(count=5, timeout=300)
    forks = [r for r in results if isinstance(r, Sandbox)]
    try:
        assert len(results) == 5 and len(forks) == 5, results
        for index, child in enumerate(forks):
            answer, child_hits = ask_holder(child, 8000)
            assert answer == secret and child_hits == hits + 1
            child.commands.run(f"echo fork-{index} > /home/user/who")
        for index, child in enumerate(forks):
            assert child.files.read("/home/user/who").strip() == f"fork-{index}", "no crosstalk"
        assert source.files.read("/home/user/who").strip() == "parent"
        assert ask_holder(source, 8000) == (secret, hits + 1), "the parent keeps running"
        assert sandbox_state(api, source.sandbox_id) == "running"
        uid_maps = {
            child.commands.run("cat /proc/self/uid_map", user="root").stdout.split()[1] for child in forks
        }
        assert len(uid_maps) == 5, "each fork has its own host uid range"
    finally:
        for child in forks:
            kill_quietly(child.sandbox_id)


def test_fork_input_and_paused_source(api: httpx.Client, source: Sandbox) -> None:
    assert api.post(f"/sandboxes/{source.sandbox_id}/fork", json={"count": 0}).status_code == 400
    assert api.post(f"/sandboxes/{source.sandbox_id}/fork", json={"count": 101}).status_code == 400
    assert api.post("/sandboxes/inotthere0000000000000/fork", json={}).status_code == 404
    source.pause()
    paused = api.post(f"/sandboxes/{source.sandbox_id}/fork", json={"count": 1})
    assert paused.status_code == 409, paused.text


def test_concurrent_lifecycle_calls_leave_a_consistent_state(api: httpx.Client) -> None:
    sandbox = Sandbox.create(timeout=600)
    sid = sandbox.sandbox_id
    calls = (
        [("post", f"/sandboxes/{sid}/pause", {})] * 4
        + [("post", f"/sandboxes/{sid}/resume", {"timeout": 300})] * 4
        + [("post", f"/v2/sandboxes/{sid}/connect", {"timeout": 300})] * 4
        + [("post", f"/sandboxes/{sid}/fork", {"count": 1})] * 2
        + [("delete", f"/sandboxes/{sid}", None)]
    )
    statuses: list[int] = []
    forked: list[str] = []

    def call(spec: tuple[str, str, object]) -> None:
        method, path, body = spec
        response = api.request(method, path, json=body) if body is not None else api.request(method, path)
        statuses.append(response.status_code)
        if path.endswith("/fork") and response.status_code == 201:
            forked.extend(r["sandbox"]["sandboxID"] for r in response.json() if r.get("sandbox"))

    try:
        with ThreadPoolExecutor(len(calls)) as pool:
            list(pool.map(call, calls))
        assert set(statuses) <= {200, 201, 204, 404, 409}, statuses
        assert api.get(f"/sandboxes/{sid}").status_code == 404, "the kill won in the end"
        for fork_id in forked:
            assert sandbox_state(api, fork_id) == "running"
            assert Sandbox.connect(fork_id).commands.run("echo ok").stdout.strip() == "ok"
    finally:
        kill_quietly(sid)
        for fork_id in forked:
            kill_quietly(fork_id)

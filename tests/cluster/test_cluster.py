"""A split deployment with the official Python SDK: three `berth node`s and two `berth
api`s on one machine sharing one database (conftest.py). The SDK talks to one API
instance, then the other, and never to a node.

The tests run in file order on one cluster; the node-loss test is last because it
leaves a node restarted.
"""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import pytest
from e2b import NotFoundException, Sandbox

from conftest import LEASE_SECS, Cluster, poll

NODES = ("node-a", "node-b", "node-c")


def counts(cluster: Cluster) -> dict[str, int]:
    return {name: node["sandboxes"] for name, node in cluster.node_list().items()}


def placed_on(cluster: Cluster, before: dict[str, int]) -> str:
    """The node that gained one sandbox since `before` (the tests create one at a time)."""
    after = counts(cluster)
    gained = [name for name in after if after[name] > before.get(name, 0)]
    assert len(gained) == 1, (before, after)
    return gained[0]


def test_sandboxes_spread_over_every_node_and_work_through_either_api(cluster: Cluster):
    created = []
    try:
        for index in range(30):
            cluster.use(index % 2)
            created.append(Sandbox.create(timeout=900))
        per_node = counts(cluster)
        assert sum(per_node.values()) == 30, per_node
        for name in NODES:
            assert per_node[name] >= 8, per_node
        for index, sandbox in enumerate(created[:6]):
            api = 1 - index % 2
            cluster.use(api)
            again = Sandbox.connect(sandbox.sandbox_id)
            again.files.write("/home/user/through.txt", f"through api {api}")
            assert again.commands.run("cat /home/user/through.txt").stdout == f"through api {api}"
            assert again.commands.run("hostname").stdout.strip() == sandbox.sandbox_id
        # A retried create (same Idempotency-Key) through the other API instance finds
        # the sandbox its first try made, on whichever node that was.
        cluster.use(0)
        first = Sandbox.create(timeout=900, idempotency_key="cluster-retry-1")
        created.append(first)
        cluster.use(1)
        assert Sandbox.create(timeout=900, idempotency_key="cluster-retry-1").sandbox_id == first.sandbox_id
        listed = {s.sandbox_id for s in Sandbox.list(limit=100).next_items()}
        assert {s.sandbox_id for s in created} <= listed
        # Sandboxes of different nodes cannot reach each other (nor those of one node).
        server, client = created[0], created[1]
        address = server.commands.run("hostname -I").stdout.split()[0]
        server.commands.run("python3 -m http.server 8000 --bind 0.0.0.0", background=True)
        assert server.commands.run("curl -s -o /dev/null -w '%{http_code}' --retry 20 --retry-connrefused --retry-delay 0 http://127.0.0.1:8000/").stdout == "200"
        probe = client.commands.run(f"curl -s -m 3 -o /dev/null http://{address}:8000/ || echo unreachable")
        assert probe.stdout.strip() == "unreachable", probe.stdout
    finally:
        for sandbox in created:
            sandbox.kill()
    assert sum(counts(cluster).values()) == 0


def test_a_snapshot_made_on_one_node_starts_on_another_with_its_state(cluster: Cluster):
    cluster.use(0)
    before = counts(cluster)
    source = Sandbox.create(timeout=900)
    home = placed_on(cluster, before)
    made = []
    snapshot = None
    try:
        source.files.write("/home/user/state.txt", f"made on {home}")
        holder = source.commands.run("sleep 3600", background=True)
        # Forks stay on the source's node (its checkpoint is there).
        before = counts(cluster)
        forks = source.fork(count=2)
        made += forks
        after = counts(cluster)
        assert after[home] == before[home] + 2, (before, after)
        for fork in forks:
            assert fork.files.read("/home/user/state.txt") == f"made on {home}"

        snapshot = source.create_snapshot(name="moved")
        cluster.berth("node", "drain", home)
        try:
            cluster.use(1)
            before = counts(cluster)
            started = Sandbox.create("moved", timeout=900)
            made.append(started)
            elsewhere = placed_on(cluster, before)
        finally:
            cluster.berth("node", "drain", home, "--undo")
        assert elsewhere != home
        assert started.files.read("/home/user/state.txt") == f"made on {home}"
        # Memory came too: the process running at the snapshot runs there.
        assert started.commands.run(f"test -d /proc/{holder.pid} && echo alive").stdout.strip() == "alive"
        assert started.commands.run("hostname").stdout.strip() == started.sandbox_id
    finally:
        for sandbox in [source, *made]:
            sandbox.kill()
        if snapshot is not None:
            Sandbox.delete_snapshot(snapshot.snapshot_id)


def test_draining_a_node_moves_its_paused_sandboxes_with_their_memory(cluster: Cluster):
    cluster.use(0)
    before = counts(cluster)
    sandbox = Sandbox.create(timeout=900)
    home = placed_on(cluster, before)
    try:
        sandbox.files.write("/home/user/state.txt", f"paused on {home}")
        holder = sandbox.commands.run("sleep 3600", background=True)
        sandbox.pause()
        cluster.berth("node", "drain", home)
        try:
            poll(lambda: counts(cluster)[home] == 0, 180, f"{home}'s paused sandbox to move away", interval=0.5)
        finally:
            cluster.berth("node", "drain", home, "--undo")
        assert sum(counts(cluster).values()) == 1
        cluster.use(1)
        resumed = Sandbox.connect(sandbox.sandbox_id)
        assert resumed.files.read("/home/user/state.txt") == f"paused on {home}"
        assert resumed.commands.run(f"test -d /proc/{holder.pid} && echo alive").stdout.strip() == "alive"
    finally:
        sandbox.kill()


def cgroup_of(sandbox_id: str) -> Path:
    return Path("/sys/fs/cgroup/pids/berth") / sandbox_id


def test_a_lost_node_is_reported_avoided_and_reconciled_when_it_returns(cluster: Cluster):
    cluster.use(0)
    created: dict[str, list[Sandbox]] = {name: [] for name in NODES}
    for _ in range(6):
        before = counts(cluster)
        sandbox = Sandbox.create(timeout=900)
        created[placed_on(cluster, before)].append(sandbox)
    assert all(created[name] for name in NODES), {k: len(v) for k, v in created.items()}
    lost = created["node-c"]
    kept = created["node-a"] + created["node-b"]
    try:
        for sandbox in lost:
            assert cgroup_of(sandbox.sandbox_id).is_dir()
        cluster.nodes["node-c"].stop(signal.SIGKILL)
        # Reported lost within the lease (and the API's check interval): a bound, not a
        # measurement.
        cluster.wait_node_state("node-c", "lost", timeout=LEASE_SECS * 5)
        for sandbox in lost:
            with pytest.raises(NotFoundException):
                Sandbox.get_info(sandbox.sandbox_id)
            events = httpx.get(
                f"{cluster.api_urls[1]}/events/sandboxes/{sandbox.sandbox_id}",
                headers={"X-API-Key": cluster.key},
                timeout=30,
            ).json()
            assert any(event["type"] == "sandbox.lifecycle.killed" for event in events), events
        # The others keep working, through either API instance.
        for index, sandbox in enumerate(kept):
            cluster.use(index % 2)
            assert Sandbox.connect(sandbox.sandbox_id).commands.run("echo still").stdout == "still\n"
        # New creates avoid the lost node.
        cluster.use(1)
        for _ in range(3):
            before = counts(cluster)
            sandbox = Sandbox.create(timeout=900)
            kept.append(sandbox)
            assert placed_on(cluster, before) != "node-c"

        # Back: it reconciles, killing what the database says is gone; no ghost remains.
        cluster.start_node("node-c")
        for sandbox in lost:
            poll(lambda: not cgroup_of(sandbox.sandbox_id).exists(), 60, f"lost sandbox {sandbox.sandbox_id} gone")
        assert counts(cluster)["node-c"] == 0
        before = counts(cluster)
        back = Sandbox.create(timeout=900)
        kept.append(back)
        assert back.commands.run("echo back").stdout == "back\n"
    finally:
        for sandbox in kept:
            sandbox.kill()


def test_a_node_stopping_cleanly_takes_nothing_new_and_keeps_its_sandboxes(cluster: Cluster):
    # A node of its own with a long lease: its restart must fit in it whatever the load.
    cluster.add_node("node-d", lease_secs=300)
    cluster.wait_node_state("node-d", "up")
    for name in NODES:
        cluster.berth("node", "drain", name)
    made = []
    try:
        cluster.use(0)
        kept = Sandbox.create(timeout=900)
        made.append(kept)
        assert counts(cluster)["node-d"] == 1
        cluster.nodes["node-d"].stop()
        cluster.wait_node_state("node-d", "stopping", timeout=30)
        # Nothing else takes sandboxes now: creates are refused, not sent to it.
        with pytest.raises(Exception, match="503|sandbox_capacity_unavailable|no node"):
            Sandbox.create(timeout=900)
        cluster.start_node("node-d")
        assert Sandbox.connect(kept.sandbox_id).commands.run("echo kept").stdout == "kept\n"
        made.append(Sandbox.create(timeout=900))
        assert counts(cluster)["node-d"] == 2
    finally:
        for name in NODES:
            cluster.berth("node", "drain", name, "--undo")
        for sandbox in made:
            sandbox.kill()

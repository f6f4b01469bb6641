#!/usr/bin/env python3
"""Cluster benchmark (not a test): creates per second and create latency through the
official Python SDK against a split deployment with 1, 2 and 3 `berth node`s behind one
`berth api`, beside the same workload against a standalone `berth up` in the same run
(the floor: what the split adds is placement, the relay to a node and the tunnel).

Each create is `Sandbox.create()` → `commands.run("true")` → `kill()`, run by
`--concurrency` threads until `--creates` are done; the table gives creates per second
over the whole run and the create → first command latency (p50 / p99). Everything runs
on this machine, so more nodes add processes, not CPUs: read the ratios, not the
absolute rates.

Usage (repo root, as root, after scripts/test.sh's build steps or with BERTH_BIN):
  .venv/bin/python bench/cluster/bench.py [--creates 60] [--concurrency 6]

It starts a throwaway Postgres (scripts/with-postgres.sh), the nodes and API of
tests/cluster/conftest.py's harness, and a `berth up` of bench/speed's, with their own
state dirs, address pools and an egress ceiling admitting only the benchmarking range,
and stops them all by PID at the end.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from load_module import REPO, load  # noqa: E402


harness = load("cluster_harness", REPO / "tests" / "cluster" / "conftest.py")
speed = load("speed_bench", REPO / "bench" / "speed" / "bench.py")


def workload(env: dict[str, str], creates: int, concurrency: int) -> tuple[float, list[float]]:
    """Runs `creates` create → command → kill cycles; returns (creates/s, latencies ms)."""
    from e2b import Sandbox

    os.environ.update(env)
    latencies: list[float] = []
    errors: list[BaseException] = []
    left = [creates]
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if left[0] == 0 or errors:
                    return
                left[0] -= 1
            try:
                started = time.perf_counter()
                sandbox = Sandbox.create(timeout=600)
                sandbox.commands.run("true")
                elapsed = (time.perf_counter() - started) * 1000
                sandbox.kill()
                with lock:
                    latencies.append(elapsed)
            except BaseException as error:  # noqa: BLE001 - reported below
                with lock:
                    errors.append(error)

    # One round first, so nothing measured pays a first-use cost.
    Sandbox.create(timeout=600).kill()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    if errors:
        raise SystemExit(f"a create failed: {errors[0]!r}")
    return creates / wall, latencies


ANSI = re.compile(r"\x1b\[[0-9;]*m")
SERVED = re.compile(r"method=POST path=/v2/sandboxes.*request served status=201 duration_ms=(\d+)")


def create_durations(log: Path) -> list[int]:
    """The server-side durations (ms) of the creates a berth process logged."""
    text = ANSI.sub("", log.read_text(errors="replace"))
    return [int(match.group(1)) for match in SERVED.finditer(text)]


def row(what: str, rate: float, latencies: list[float], floor_rate: float, floor_p50: float, relay: str) -> str:
    p50, p99 = statistics.median(latencies), speed.percentile(latencies, 99)
    return (
        f"| {what} | {rate:.1f} | {rate / floor_rate:.2f}× | {p50:.1f} / {p99:.1f} | "
        f"{p50 - floor_p50:+.1f} | {relay} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--creates", type=int, default=60)
    parser.add_argument("--concurrency", type=int, default=6)
    args = parser.parse_args()
    berth = harness.berth_binary()
    load_before = os.getloadavg()[0]

    standalone = speed.Daemon(str(berth), harness.SHARED_TEMPLATES, pool_size=0)
    try:
        floor_rate, floor = workload(standalone.env, args.creates, args.concurrency)
    finally:
        standalone.stop()
    floor_p50 = statistics.median(floor)
    lines = [
        f"| `berth up` (floor) | {floor_rate:.1f} | 1.00× | {floor_p50:.1f} / {speed.percentile(floor, 99):.1f} | | |"
    ]

    pg = Path(tempfile.mkdtemp(prefix="berth-bench-pg-"))
    started = subprocess.run(
        ["bash", str(REPO / "scripts" / "with-postgres.sh"), "--start", str(pg)], capture_output=True, text=True
    )
    if started.returncode != 0:
        shutil.rmtree(pg, ignore_errors=True)
        raise SystemExit(f"Postgres did not start:\n{started.stderr}")
    database = dict(line.split("=", 1) for line in started.stdout.splitlines() if "=" in line)["BERTH_TEST_DATABASE_URL"]
    try:
        for nodes in (1, 2, 3):
            root = Path(tempfile.mkdtemp(prefix="berth-bench-cluster-"))
            os.chmod(root, 0o711)
            token = root / "node-token"
            token.write_text(os.urandom(32).hex() + "\n")
            cluster = harness.Cluster(berth, root, database, token)
            try:
                for index in range(nodes):
                    cluster.add_node(f"bench-{nodes}-{index}")
                for name in cluster.nodes:
                    cluster.wait_node_state(name, "up")
                cluster.add_api()
                cluster.key = cluster.berth("keys", "create", "--name", f"bench-{nodes}").strip().splitlines()[-1]
                try:
                    rate, latencies = workload(cluster.sdk_env(0), args.creates, args.concurrency)
                except BaseException:
                    for name, node in cluster.nodes.items():
                        print(f"--- {name} ---\n{node.tail(3000)}", file=sys.stderr)
                    print(f"--- api ---\n{cluster.apis[0].tail(3000)}", file=sys.stderr)
                    raise
                # Placement and relay: the API instance's own time for a create beyond the
                # node's, each as the process itself logged it.
                at_api = create_durations(cluster.apis[0].log)
                at_nodes = [d for node in cluster.nodes.values() for d in create_durations(node.log)]
                relay = f"{statistics.median(at_api) - statistics.median(at_nodes):+.1f}" if at_api and at_nodes else "n/a"
                lines.append(
                    row(f"`berth api` + {nodes} node{'s' if nodes > 1 else ''}", rate, latencies, floor_rate, floor_p50, relay)
                )
            finally:
                cluster.kill_every_sandbox()
                for process in [*cluster.apis, *cluster.nodes.values()]:
                    process.stop()
                # The nodes' rows stay in this run's database only; it goes below.
                shutil.rmtree(root, ignore_errors=True)
    finally:
        subprocess.run(["bash", str(REPO / "scripts" / "with-postgres.sh"), "--stop", str(pg)])

    print(
        f"\nCluster: {args.creates} × (create → commands.run('true') → kill) at concurrency "
        f"{args.concurrency}, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
        f"load average {load_before:.1f} at start, {os.cpu_count()} CPUs.\n"
    )
    print(
        "| deployment | creates/s | ÷ floor | create → first command p50 / p99 (ms) | p50 over the floor (ms) "
        "| placement + relay per create, p50 (ms: the API's create time minus the node's) |"
    )
    print("|---|---|---|---|---|---|")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

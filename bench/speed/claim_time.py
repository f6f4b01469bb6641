#!/usr/bin/env python3
"""Warm-pool claims one at a time (benchmark, not a test): the server's own create time
beside what the SDK sees.

For each of N claims (pool of 2, refilled and idle before each): the server's create
time (`berth_sandbox_operation_duration_seconds` sum over count for operation="create",
read before and after), `Sandbox.create()` through the SDK, and the first
`commands.run("true")` after it; p50 of each.

Usage (repo root, as root): .venv/bin/python bench/speed/claim_time.py --berth <berth> [--claims 25]
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402

POOL = 2


def server_create_s(daemon: bench.Daemon) -> tuple[float, float]:
    text = daemon.metrics()

    def value(kind: str) -> float:
        pattern = rf'berth_sandbox_operation_duration_seconds_{kind}\{{operation="create",outcome="ok"\}} (\S+)'
        found = re.search(pattern, text)
        return float(found.group(1)) if found else 0.0

    return value("sum"), value("count")


def main() -> None:
    parser = argparse.ArgumentParser()
    bench.add_daemon_args(parser)
    parser.add_argument("--claims", type=int, default=25)
    args = parser.parse_args()
    daemon = bench.Daemon(args.berth, Path(args.templates), pool_size=POOL)
    try:
        daemon.use()
        from e2b import Sandbox

        # A template's pool fills once the template has been asked for.
        Sandbox.create(timeout=60).kill()
        server, creates, commands = [], [], []
        for _ in range(args.claims):
            bench.wait_for_pool(daemon, POOL)
            time.sleep(0.3)
            sum_before, count_before = server_create_s(daemon)
            started = time.perf_counter()
            sandbox = Sandbox.create(timeout=300)
            created = time.perf_counter()
            sandbox.commands.run("true")
            ran = time.perf_counter()
            sum_after, count_after = server_create_s(daemon)
            sandbox.kill()
            if count_after - count_before == 1:
                server.append((sum_after - sum_before) * 1000)
            creates.append((created - started) * 1000)
            commands.append((ran - created) * 1000)
        print(
            f"p50 of {len(creates)} claims: server's create {statistics.median(server):.2f} ms, "
            f"Sandbox.create() {statistics.median(creates):.2f}, first command {statistics.median(commands):.2f}, "
            f"create → first command {statistics.median(a + b for a, b in zip(creates, commands)):.2f}"
        )
    finally:
        daemon.stop()


if __name__ == "__main__":
    main()

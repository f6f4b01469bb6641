#!/usr/bin/env python3
"""Density benchmark (not a test): idle sandboxes through `berth up` with networking on,
and the host memory each one costs.

It starts a `berth up` of bench/speed's (its own state dir and address pool, an egress
ceiling admitting only the benchmarking range, no warm pool), then creates sandboxes
with `POST /sandboxes` (`allow_internet_access` on, so each gets its veth, address,
routes, nftables set elements and egress policy), `--concurrency` at a time, until
`--count` are up or one fails. With all of them up it checks a sample through the SDK
(a command runs; the sandbox has its address and default route) and reads:

- host `MemAvailable` dropped, per sandbox (after `sync` and a pause), and how much came
  back once they were all killed;
- the growth of kernel slab (namespaces, netdevs, mounts, nftables elements);
- the sum of the sandboxes' own memory-cgroup usage (`GET /sandboxes/{id}/metrics`);
- the resident size of the `berth up` process itself, before and after.

Usage (repo root, as root, after scripts/test.sh's build steps or with --berth):
  .venv/bin/python bench/density/bench.py [--count 1000] [--concurrency 4]
"""

from __future__ import annotations

import argparse
import datetime
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from load_module import REPO, load  # noqa: E402
MIB = 1024 * 1024


speed = load("speed_bench", REPO / "bench" / "speed" / "bench.py")


def meminfo() -> dict[str, int]:
    fields = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, value = line.split(":", 1)
        fields[name] = int(value.split()[0]) * 1024
    return fields


def settled_meminfo() -> dict[str, int]:
    """/proc/meminfo after writeback and RCU-freed memory had time to settle."""
    os.sync()
    time.sleep(3)
    return meminfo()


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def veth_count() -> int:
    out = subprocess.run(["ip", "-o", "link", "show", "type", "veth"], capture_output=True, text=True).stdout
    return len(out.splitlines())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--berth", default=os.environ.get("BERTH_BIN", "target/dist/berth"))
    parser.add_argument("--templates", default="/var/lib/berth/templates")
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--sample", type=int, default=10, help="sandboxes checked through the SDK once all are up")
    args = parser.parse_args()

    load_before = os.getloadavg()[0]
    daemon = speed.Daemon(args.berth, Path(args.templates), pool_size=0)
    ids: list[str] = []
    try:
        api = httpx.Client(
            base_url=daemon.env["E2B_API_URL"],
            headers={"X-API-Key": daemon.env["E2B_API_KEY"]},
            timeout=120,
        )
        # One create and kill first, so first-use costs (template load, caches) are
        # not counted against the sandboxes.
        first = api.post("/sandboxes", json={"templateID": "base", "timeout": 3600})
        first.raise_for_status()
        api.delete(f"/sandboxes/{first.json()['sandboxID']}").raise_for_status()

        veths_before = veth_count()
        berth_rss_before = rss(daemon.proc.pid)
        before = settled_meminfo()
        lock = threading.Lock()
        failure: list[str] = []
        create_ms: list[float] = []

        def create(_: int) -> None:
            if failure:
                return
            started = time.perf_counter()
            response = api.post(
                "/sandboxes", json={"templateID": "base", "timeout": 3600, "allow_internet_access": True}
            )
            elapsed = (time.perf_counter() - started) * 1000
            with lock:
                if response.status_code != 201:
                    failure.append(f"sandbox {len(ids) + 1}: {response.status_code} {response.text[:300]}")
                    return
                ids.append(response.json()["sandboxID"])
                create_ms.append(elapsed)
                if len(ids) % 100 == 0:
                    print(f"density: {len(ids)} up", file=sys.stderr, flush=True)

        started = time.perf_counter()
        with ThreadPoolExecutor(args.concurrency) as pool:
            list(pool.map(create, range(args.count)))
        create_wall = time.perf_counter() - started
        after = settled_meminfo()
        berth_rss_after = rss(daemon.proc.pid)
        veths = veth_count() - veths_before

        # Every one of them is a working, networked sandbox: a sample runs a command and
        # sees its own address and default route.
        daemon.use()
        from e2b import Sandbox

        checked = 0
        for sandbox_id in random.sample(ids, min(args.sample, len(ids))):
            sandbox = Sandbox.connect(sandbox_id)
            result = sandbox.commands.run("cat /proc/net/route; cat /proc/net/fib_trie")
            routes = [line.split() for line in result.stdout.splitlines()[1:] if line.startswith("eth0")]
            assert any(fields[1] == "00000000" for fields in routes), f"{sandbox_id} has no default route"
            checked += 1

        cgroup_bytes = 0
        for sandbox_id in ids:
            metrics = api.get(f"/sandboxes/{sandbox_id}/metrics")
            if metrics.status_code == 200 and metrics.json():
                cgroup_bytes += metrics.json()[-1].get("memUsed", 0)

        kill_started = time.perf_counter()
        with ThreadPoolExecutor(args.concurrency) as pool:
            list(pool.map(lambda i: api.delete(f"/sandboxes/{i}").raise_for_status(), ids))
        kill_wall = time.perf_counter() - kill_started
        killed = list(ids)
        ids.clear()
        released = settled_meminfo()
    finally:
        if ids:
            for sandbox_id in ids:
                try:
                    api.delete(f"/sandboxes/{sandbox_id}")
                except httpx.HTTPError:
                    pass
        daemon.stop()

    n = len(killed)
    if n == 0:
        raise SystemExit(f"no sandbox was created: {failure[0] if failure else 'unknown'}")
    drop = before["MemAvailable"] - after["MemAvailable"]
    back = released["MemAvailable"] - after["MemAvailable"]
    print(
        f"\nDensity through `berth up`, networking on: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
        f"load average {load_before:.1f} at start, {os.cpu_count()} CPUs, "
        f"{meminfo()['MemTotal'] / 2**30:.1f} GiB.\n"
    )
    print(f"- {n} idle sandboxes up ({'stopped: ' + failure[0] if failure else f'the --count of {args.count}'}); "
          f"{veths} veth links; {checked} checked through the SDK (command, address, default route)")
    print(f"- create p50 / p99 {statistics.median(create_ms):.1f} / {speed.percentile(create_ms, 99):.1f} ms "
          f"at concurrency {args.concurrency}; {n / create_wall:.1f} creates/s; killing all took {kill_wall:.1f} s")
    print("")
    print("| per sandbox | MiB |")
    print("|---|---|")
    print(f"| host `MemAvailable` drop while up | {drop / n / MIB:.2f} |")
    print(f"| host `MemAvailable` back after killing | {back / n / MIB:.2f} |")
    print(f"| kernel slab growth | {(after['Slab'] - before['Slab']) / n / MIB:.2f} |")
    print(f"| the sandbox's own memory cgroup | {cgroup_bytes / n / MIB:.2f} |")
    print(f"| `berth up` resident growth | {(berth_rss_after - berth_rss_before) / n / MIB:.3f} |")
    verdict = "ok" if drop / n <= 4 * MIB else "OVER"
    print(f"\nTarget (issue 15): ≤ 4 MiB of host memory per idle sandbox with networking on: {drop / n / MIB:.2f} MiB — {verdict}")


if __name__ == "__main__":
    main()

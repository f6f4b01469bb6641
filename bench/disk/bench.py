#!/usr/bin/env python3
"""Disk I/O isolation benchmark (not a test): a neighbour's synchronous-write latency
while another sandbox storms its disk, with berth's per-sandbox disk limits off and on,
each beside the neighbour's own latency with no writer (the floor), measured in the
same run and inside the neighbour sandbox.

  floor        the neighbour alone: 4 KiB O_DSYNC writes, one at a time
  storm        the same while the writer loops 1 MiB O_DIRECT writes of 512 MiB
               (`dd oflag=direct`), which bypass the page cache and reach the host disk
               at once
  limits off   `berth up --sandbox-disk-write-mibps 0 --sandbox-disk-read-mibps 0`
  limits on    berth's defaults (`--sandbox-disk-write-mibps 256`), and a tighter
               `--sandbox-disk-write-mibps 64`

Traffic: none leaves loopback; `berth up` runs in a private network namespace with an
egress ceiling admitting only the tests' own range (ENVIRONMENT.md's network rule).

Usage (repo root, as root, after scripts/install-deps.sh and a `berth` build):
  .venv/bin/python bench/disk/bench.py --berth target/dist/berth [--samples 300]
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench" / "speed"))

from bench import Daemon, percentile  # noqa: E402

# Inside the neighbour: `samples` 4 KiB O_DSYNC writes, one latency (ms) per line.
PROBE = """
import os, sys, time
fd = os.open("/home/user/probe", os.O_WRONLY | os.O_CREAT | os.O_DSYNC, 0o644)
for i in range(int(sys.argv[1])):
    start = time.perf_counter()
    os.pwrite(fd, b"x" * 4096, (i % 64) * 4096)
    print((time.perf_counter() - start) * 1000)
"""

STORM = (
    "while true; do dd if=/dev/zero of=/home/user/storm bs=1M count=512 oflag=direct 2>&1 | tail -1 >> /tmp/rates; "
    "rm -f /home/user/storm; done"
)


def probe(sandbox, samples: int) -> list[float]:
    sandbox.files.write("/home/user/probe.py", PROBE)
    out = sandbox.commands.run(f"python3 /home/user/probe.py {samples}", timeout=900).stdout
    return [float(line) for line in out.split()]


def measure(samples: int) -> tuple[list[float], list[float], list[str]]:
    from e2b import Sandbox

    neighbour = Sandbox.create(timeout=900)
    writer = Sandbox.create(timeout=900)
    try:
        probe(neighbour, 20)  # warm: python, the probe file's blocks
        floor = probe(neighbour, samples)
        storm = writer.commands.run(STORM, background=True, user="root")
        try:
            # Let the first writes reach the disk before sampling.
            threading.Event().wait(2)
            stormed = probe(neighbour, samples)
        finally:
            storm.kill()
        rates = writer.commands.run("cat /tmp/rates 2>/dev/null || true", user="root").stdout.splitlines()
        return floor, stormed, rates
    finally:
        neighbour.kill()
        writer.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--berth", default=os.environ.get("BERTH_BIN", "target/dist/berth"))
    parser.add_argument("--templates", default="/var/lib/berth/templates")
    parser.add_argument("--samples", type=int, default=300)
    args = parser.parse_args()
    if os.environ.get("BERTH_BENCH_PRIVATE_NETNS") != "1":
        os.environ["BERTH_BENCH_PRIVATE_NETNS"] = "1"
        command = [sys.executable, *sys.argv]
        os.execvp("unshare", ["unshare", "--net", "--", "sh", "-c", 'ip link set lo up && exec "$@"', "_", *command])

    rows = []
    for label, env in (
        ("limits off", {"BERTH_SANDBOX_DISK_WRITE_MIBPS": "0", "BERTH_SANDBOX_DISK_READ_MIBPS": "0"}),
        ("limits on (defaults: 256 MiB/s write)", {}),
        ("limits on, `--sandbox-disk-write-mibps 64`", {"BERTH_SANDBOX_DISK_WRITE_MIBPS": "64"}),
    ):
        daemon = Daemon(args.berth, Path(args.templates), pool_size=0, extra_env=env)
        try:
            daemon.use()
            floor, stormed, rates = measure(args.samples)
        finally:
            daemon.stop()
        f50, f99 = statistics.median(floor), percentile(floor, 99)
        s50, s99 = statistics.median(stormed), percentile(stormed, 99)
        # dd's summary ends in its rate; only whole 512 MiB runs finished during the probe.
        rate = rates[0].rsplit(",", 1)[-1].strip() if rates else "no 512 MiB run finished during the probe"
        rows.append(
            f"| {label} | {s50:.2f} / {s99:.2f} ms | {f50:.2f} / {f99:.2f} ms | {s50 / f50:.2f}× / {s99 / f99:.2f}× | {rate} |"
        )

    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"Command: `.venv/bin/python bench/disk/bench.py --berth {args.berth} --samples {args.samples}`")
    print(f"Date (UTC): {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M}; "
          f"{os.cpu_count()} CPUs; load average {load}\n")
    print("| berth up | neighbour 4 KiB O_DSYNC write with a storm next door, p50 / p99 | floor: the neighbour alone, same run | ratio p50 / p99 | the writer's rate |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Control-plane benchmark (not a test): the official Python SDK against `berth up`.

One sample = `Sandbox.create()` → `commands.run("echo hi")` → `kill()`, timed end to end
(and the create part alone), at several concurrency levels: `c=N` is N threads each
starting its next sample as soon as the previous one finished. Prints p50/p99 per level.

Usage (repo root, as root, after scripts/install-deps.sh):
  .venv/bin/python bench/control_plane/bench.py --berth target/dist/berth [--samples 100] [--concurrency 1,10,50]

It starts its own `berth up` on a free loopback port with a temporary state dir whose
`templates/` links to the shared template store, and stops it by PID at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def start_berth(berth: str, templates: Path) -> tuple[subprocess.Popen, dict[str, str], Path]:
    state = Path(tempfile.mkdtemp(prefix="berth-bench-cp-"))
    os.chmod(state, 0o711)
    (state / "templates").symlink_to(templates)
    port = free_port()
    proc = subprocess.Popen(
        [berth, "up", "--listen", f"127.0.0.1:{port}", "--state-dir", str(state)],
        # A pool of its own and an egress ceiling admitting only the benchmarking range.
        env={**os.environ, "BERTH_SANDBOX_CIDR": "10.201.0.0/16", "BERTH_EGRESS_ALLOW": "198.18.0.0/15"},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    env: dict[str, str] = {}
    assert proc.stdout is not None
    while not {"E2B_API_URL", "E2B_SANDBOX_URL"} <= env.keys():
        line = proc.stdout.readline()
        if not line:
            raise SystemExit("berth up exited before printing its E2B_* lines")
        if line.startswith("E2B_") and "=" in line:
            key, value = line.strip().split("=", 1)
            env[key] = value
    # berth up prints its first key only to a terminal: make one for the benchmark.
    created = subprocess.run([berth, "keys", "create", "--state-dir", str(state)], capture_output=True, text=True, check=True)
    env["E2B_API_KEY"] = created.stdout.strip().splitlines()[-1].split("=")[-1]
    return proc, env, state


def sample(durations: list[float], creates: list[float], lock: threading.Lock) -> None:
    from e2b import Sandbox

    started = time.perf_counter()
    sandbox = Sandbox.create()
    created = time.perf_counter()
    try:
        result = sandbox.commands.run("echo hi")
        assert result.stdout.strip() == "hi", result.stdout
    finally:
        sandbox.kill()
    done = time.perf_counter()
    with lock:
        durations.append((done - started) * 1000)
        creates.append((created - started) * 1000)


def run_level(concurrency: int, samples: int) -> tuple[list[float], list[float]]:
    durations: list[float] = []
    creates: list[float] = []
    lock = threading.Lock()
    remaining = [samples]

    def worker() -> None:
        while True:
            with lock:
                if remaining[0] == 0:
                    return
                remaining[0] -= 1
            sample(durations, creates, lock)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return durations, creates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--berth", default=os.environ.get("BERTH_BIN", "target/dist/berth"))
    parser.add_argument("--templates", default="/var/lib/berth/templates")
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--concurrency", default="1,10,50")
    args = parser.parse_args()

    proc, env, state = start_berth(args.berth, Path(args.templates))
    try:
        os.environ.update(env)
        print(f"{'c':>4}  {'samples':>7}  {'create→run→kill p50':>20}  {'p99':>9}  {'create p50':>11}  {'p99':>9}")
        for level in (int(c) for c in args.concurrency.split(",")):
            run_level(level, min(level, 3))  # warm-up, untimed
            durations, creates = run_level(level, max(args.samples, level))
            print(
                f"{level:>4}  {len(durations):>7}  {statistics.median(durations):>17.1f} ms"
                f"  {percentile(durations, 99):>6.1f} ms  {statistics.median(creates):>8.1f} ms"
                f"  {percentile(creates, 99):>6.1f} ms"
            )
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    main()

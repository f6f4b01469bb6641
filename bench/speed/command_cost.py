#!/usr/bin/env python3
"""What one `commands.run("true")` costs inside the sandbox (benchmark, not a test).

Prints, for one sandbox of a `berth up` this script starts:
  envd's own cost   a Connect `Start` of `bash -l -c true` sent straight to envd inside
                    the sandbox (127.0.0.1:49983, no proxy) minus Python's `subprocess`
                    of the same command there, alternated, p50 of each
  CPU per command   the sandbox cgroup's `cpuacct.usage` over N `commands.run("true")`
                    through the SDK, with envd's spawner thread and its other threads
                    apart (`/proc/<envd>/task/*/schedstat`), and the wall time per command

Usage (repo root, as root): .venv/bin/python bench/speed/command_cost.py --berth <berth> [--samples 200]
"""

from __future__ import annotations

import argparse
import base64
import collections
import glob
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402

# Runs inside the sandbox: the same `bash -l -c true` through envd's Start and through
# Python's subprocess, alternated in blocks.
INSIDE = r"""
import http.client, json, struct, subprocess, sys, time
headers, n = json.loads(sys.argv[1]), int(sys.argv[2])
body = json.dumps({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "true"]}}).encode()
message = struct.pack(">BI", 0, len(body)) + body
conn = http.client.HTTPConnection("127.0.0.1", 49983)
def start():
    conn.request("POST", "/process.Process/Start", body=message,
                 headers={**headers, "Content-Type": "application/connect+json"})
    r = conn.getresponse(); data = r.read(); assert r.status == 200 and b'"end"' in data, data
def shell():
    subprocess.run(["/bin/bash", "-l", "-c", "true"], check=True)
out = {"envd": [], "subprocess": []}
for _ in range(4):
    for name, fn in (("envd", start), ("subprocess", shell)):
        for _ in range(3): fn()
        for _ in range(n // 4):
            t = time.perf_counter(); fn(); out[name].append((time.perf_counter() - t) * 1000)
print(json.dumps(out))
"""


def thread_cpu_ms(pid: str) -> collections.Counter:
    out: collections.Counter = collections.Counter()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            out[name] += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0]) / 1e6
        except OSError:
            continue
    return out


def envd_pid(sandbox_id: str) -> str:
    """The sandbox's init (envd): the berth-envd whose cgroups name the sandbox."""
    for proc in glob.glob("/proc/[0-9]*"):
        try:
            if Path(proc, "comm").read_text().strip() == "berth-envd" and sandbox_id in Path(proc, "cgroup").read_text():
                return proc.rsplit("/", 1)[1]
        except OSError:
            continue
    raise SystemExit(f"no berth-envd process in sandbox {sandbox_id}'s cgroups")


def main() -> None:
    parser = argparse.ArgumentParser()
    bench.add_daemon_args(parser)
    parser.add_argument("--samples", type=int, default=200)
    args = parser.parse_args()
    daemon = bench.Daemon(args.berth, Path(args.templates), pool_size=0)
    try:
        daemon.use()
        from e2b import Sandbox

        sandbox = Sandbox.create(timeout=600)
        try:
            headers = {"Authorization": "Basic " + base64.b64encode(b"user:").decode()}
            if sandbox._envd_access_token:
                headers["X-Access-Token"] = sandbox._envd_access_token
            sandbox.files.write("/tmp/command_cost.py", INSIDE)
            inside = json.loads(
                sandbox.commands.run(
                    f"python3 /tmp/command_cost.py '{json.dumps(headers)}' {args.samples}", timeout=600
                ).stdout
            )
            envd, shell = statistics.median(inside["envd"]), statistics.median(inside["subprocess"])
            print(f"inside the sandbox, p50: envd Start {envd:.2f} ms, subprocess {shell:.2f} ms, envd's own {envd - shell:.2f} ms")
            usage = glob.glob(f"/sys/fs/cgroup/cpuacct*/berth*/{sandbox.sandbox_id}/cpuacct.usage") + glob.glob(
                f"/sys/fs/cgroup/berth*/{sandbox.sandbox_id}/cpu.stat"
            )
            if not usage:
                raise SystemExit("the sandbox's cgroup CPU counter was not found")
            pid = envd_pid(sandbox.sandbox_id)

            def cgroup_cpu_ms() -> float:
                text = Path(usage[0]).read_text()
                if usage[0].endswith("cpu.stat"):
                    return int(text.split("usage_usec")[1].split()[0]) / 1e3
                return int(text) / 1e6

            for _ in range(20):
                sandbox.commands.run("true")
            for _ in range(3):
                threads_before, cpu_before = thread_cpu_ms(pid), cgroup_cpu_ms()
                started = time.perf_counter()
                for _ in range(args.samples):
                    sandbox.commands.run("true")
                wall = (time.perf_counter() - started) * 1000 / args.samples
                threads_after, cpu_after = thread_cpu_ms(pid), cgroup_cpu_ms()
                per = {k: (threads_after[k] - threads_before[k]) / args.samples for k in threads_after}
                spawner = per.get("envd-spawn", 0.0)
                others = sum(v for k, v in per.items() if k != "envd-spawn")
                print(
                    f"per commands.run: wall {wall:.2f} ms, sandbox CPU {(cpu_after - cpu_before) / args.samples:.2f} ms, "
                    f"envd's spawner {spawner:.2f}, envd's other threads {others:.2f} CPU-ms"
                )
        finally:
            sandbox.kill()
    finally:
        daemon.stop()


if __name__ == "__main__":
    main()

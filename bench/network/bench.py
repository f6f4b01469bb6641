#!/usr/bin/env python3
"""Networking, volumes and secrets benchmark (not a test), each row beside its floor in
the same run:

  egress throughput         a sandbox downloading from a fake-internet host through NAT,
                            beside the same download from the host side of that link
  request latency, direct   curl of a fake-internet host from inside (default policy)
  … through the domain      the same with `allow_out` naming the host's domain (TCP 80
     proxy                  goes through berth-egress's transparent proxy)
  HTTPS with an injected    curl over HTTPS with a `network.rules` header filled from a
     secret                 secret (TLS intercepted and re-originated by berth-egress),
                            beside the same HTTPS request sent directly
  volume write / read       256 MiB `dd` into a mounted volume, beside the sandbox's own
                            disk

Traffic goes only to loopback and to the fake internet this benchmark makes in its own
network namespaces (tests/sdk/control_plane/internet.py), and `berth up` runs with an
egress ceiling admitting only those hosts (ENVIRONMENT.md's network rule).

Usage (repo root, as root, after scripts/install-deps.sh and a `berth` build):
  .venv/bin/python bench/network/bench.py --berth target/dist/berth [--requests 100]
It re-executes itself in a private network namespace with only loopback up.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench" / "speed"))
sys.path.insert(0, str(REPO / "tests" / "sdk" / "control_plane"))

from bench import Daemon, percentile  # noqa: E402
from internet import ZONE, FakeInternet  # noqa: E402

BULK_MIB = 256


def bulk_server(internet: FakeInternet) -> str:
    """A static server of one BULK_MIB file on the first web host, port 8000."""
    directory = Path(tempfile.mkdtemp(prefix="berth-bench-bulk-", dir=internet.dir))
    with (directory / "bulk").open("wb") as out:
        out.truncate(BULK_MIB * 1024 * 1024)
    host = internet.web_ips[0]
    internet._spawn("python3", "-m", "http.server", "8000", "--bind", host, "--directory", str(directory))
    internet._wait_listening([f"{host}:8000"])
    return f"http://{host}:8000/bulk"


def curl_speed_mib_s(output: str) -> float:
    return float(output.strip()) / (1024 * 1024)


def inside_latencies(sandbox, url: str, requests: int, extra: str = "") -> list[float]:
    script = (
        f"for i in $(seq {requests + 5}); do curl -s -o /dev/null -m 10 {extra} "
        f"-w '%{{time_total}}\\n' {url}; done"
    )
    lines = sandbox.commands.run(script, timeout=600).stdout.split()
    return [float(v) * 1000 for v in lines[5:]]


def row(what: str, samples: list[float], floor_name: str, floor: list[float]) -> str:
    p50, p99 = statistics.median(samples), percentile(samples, 99)
    f50, f99 = statistics.median(floor), percentile(floor, 99)
    return f"| {what} | {p50:.2f} / {p99:.2f} ms | {floor_name} | {f50:.2f} / {f99:.2f} ms | {p50 / f50:.2f}× |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--berth", default=os.environ.get("BERTH_BIN", "target/dist/berth"))
    parser.add_argument("--templates", default="/var/lib/berth/templates")
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sandbox-mbps", type=int, default=None, help="berth up's per-sandbox bandwidth cap (default: berth's)")
    args = parser.parse_args()
    if os.environ.get("BERTH_BENCH_PRIVATE_NETNS") != "1":
        os.environ["BERTH_BENCH_PRIVATE_NETNS"] = "1"
        command = [sys.executable, *sys.argv]
        os.execvp("unshare", ["unshare", "--net", "--", "sh", "-c", 'ip link set lo up && exec "$@"', "_", *command])

    internet = FakeInternet(block=205)
    lines: list[str] = []
    try:
        url = bulk_server(internet)
        daemon = Daemon(
            args.berth,
            Path(args.templates),
            pool_size=0,
            extra_env={
                "BERTH_EGRESS_ALLOW": internet.ceiling,
                "BERTH_DNS_UPSTREAM": f"{internet.dns_ip}:53",
                "BERTH_EGRESS_EXTRA_ROOTS": str(internet.ca_file),
                **({"BERTH_SANDBOX_MBPS": str(args.sandbox_mbps)} if args.sandbox_mbps else {}),
            },
        )
        try:
            daemon.use()
            os.environ["E2B_VOLUME_API_URL"] = daemon.env["E2B_API_URL"]
            lines += measure(internet, url, args.requests, args.rounds)
        finally:
            daemon.stop()
    finally:
        internet.stop()

    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"Command: `.venv/bin/python bench/network/bench.py --berth {args.berth} --requests {args.requests} --rounds {args.rounds}"
          f"{f' --sandbox-mbps {args.sandbox_mbps}' if args.sandbox_mbps else ''}`")
    print(f"Date (UTC): {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M}; "
          f"{os.cpu_count()} CPUs; load average {load}\n")
    print("| in the sandbox | p50 / p99 (or MiB/s) | floor (same run) | floor | ratio |")
    print("|---|---|---|---|---|")
    print("\n".join(lines))


def measure(internet: FakeInternet, bulk_url: str, requests: int, rounds: int) -> list[str]:
    import secrets as random

    from e2b import Sandbox, Secret, Volume

    lines = []
    web1 = f"web1.{ZONE}"
    download = f"curl -s -o /dev/null -w '%{{speed_download}}' {bulk_url}"
    sandbox = Sandbox.create(timeout=900)
    try:
        inside = [curl_speed_mib_s(sandbox.commands.run(download, timeout=600).stdout) for _ in range(rounds)]
        host = [
            curl_speed_mib_s(subprocess.run(download, shell=True, capture_output=True, text=True, check=True).stdout)
            for _ in range(rounds)
        ]
        lines.append(
            f"| egress download {BULK_MIB} MiB through NAT | {statistics.median(inside):.0f} MiB/s "
            f"| host side of the same link | {statistics.median(host):.0f} MiB/s "
            f"| {statistics.median(inside) / statistics.median(host):.2f}× |"
        )
        direct = inside_latencies(sandbox, f"http://{internet.web_ips[0]}/", requests)
        sandbox.files.write("/tmp/test-ca.pem", internet.ca_pem)
        direct_tls = inside_latencies(sandbox, f"https://{web1}/", requests, "--cacert /tmp/test-ca.pem")
    finally:
        sandbox.kill()

    proxied = Sandbox.create(timeout=900, network={"allow_out": [web1], "deny_out": ["0.0.0.0/0"]})
    try:
        through_proxy = inside_latencies(proxied, f"http://{web1}/", requests)
    finally:
        proxied.kill()
    lines.append(row("HTTP request via the domain proxy (`allow_out` a domain)", through_proxy,
                     "same request, default policy (NAT)", direct))

    name = f"bench-{random.token_hex(4)}"
    Secret.create(name, random.token_hex(16))
    rules = {web1: [{"transform": {"headers": {"X-Api-Key": Secret.fill(name)}}}]}
    injecting = Sandbox.create(timeout=900, network={"rules": rules})
    try:
        injected = inside_latencies(injecting, f"https://{web1}/", requests)
    finally:
        injecting.kill()
        Secret.destroy(name)
    lines.append(row("HTTPS request with an injected secret header", injected, "same request sent directly", direct_tls))

    volume = Volume.create(f"bench-{random.token_hex(4)}")
    mounted = Sandbox.create(timeout=900, volume_mounts={"/mnt/bench": volume})
    try:
        def dd(path: str) -> tuple[float, float]:
            out = mounted.commands.run(
                f"dd if=/dev/zero of={path} bs=1M count={BULK_MIB} conv=fdatasync 2>&1 | tail -1; "
                f"sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; "
                f"dd if={path} of=/dev/null bs=1M 2>&1 | tail -1; rm -f {path}",
                user="root",
                timeout=600,
            ).stdout.strip().splitlines()
            return parse_dd(out[0]), parse_dd(out[1])

        vol = [dd("/mnt/bench/f") for _ in range(rounds)]
        disk = [dd("/home/user/f") for _ in range(rounds)]
    finally:
        mounted.kill()
        Volume.destroy(volume.volume_id)
    for index, what in ((0, "write"), (1, "read")):
        v = statistics.median(x[index] for x in vol)
        d = statistics.median(x[index] for x in disk)
        lines.append(
            f"| volume {what} {BULK_MIB} MiB (`dd`) | {v:.0f} MiB/s | the sandbox's own disk | {d:.0f} MiB/s | {v / d:.2f}× |"
        )
    return lines


def parse_dd(line: str) -> float:
    """MiB/s from dd's summary line (`… copied, 0.5 s, 512 MB/s`)."""
    value, unit = line.rsplit(",", 1)[1].split()
    scale = {"kB/s": 1e3, "MB/s": 1e6, "GB/s": 1e9, "B/s": 1}[unit]
    return float(value) * scale / (1024 * 1024)


if __name__ == "__main__":
    main()

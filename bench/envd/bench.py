#!/usr/bin/env python3
"""envd benchmark (not a test): the official Python SDK in debug mode against berth-envd.

Measures
  - `sandbox.commands.run("true")` round trip, p50/p99, beside spawning `bash -lc true`
    directly (what envd itself has to do per command) — the ratio is envd's overhead;
  - 100 MiB upload and download through `sandbox.files`, MiB/s (median of a few runs),
    beside writing/reading the same bytes to/from a file directly.

Usage (repo root, after scripts/install-deps.sh):
  .venv/bin/python bench/envd/bench.py [--runs 500] [--transfers 5] [--envd-bin PATH]

It starts its own berth-envd on 127.0.0.1:49983 (the SDK debug mode's fixed address)
and kills it by PID at the end; pass --use-running to measure an envd already there.
Binary: --envd-bin, else $BERTH_ENVD_BIN, else `cargo build --release -p berth-envd`.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pwd
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ["E2B_DEBUG"] = "true"
for _var in ("E2B_SANDBOX_URL", "E2B_API_URL", "E2B_DOMAIN"):
    os.environ.pop(_var, None)

import httpx  # noqa: E402  (after the SDK environment is set)
from e2b import Sandbox  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
ENVD_ADDRESS = "127.0.0.1:49983"
ENVD_URL = f"http://{ENVD_ADDRESS}"
MIB = 1 << 20
TRANSFER_SIZE = 100 * MIB


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


def healthy() -> bool:
    try:
        return httpx.get(f"{ENVD_URL}/health", timeout=1.0).status_code == 204
    except httpx.TransportError:
        return False


def envd_binary(configured: str | None) -> Path:
    if configured:
        return Path(configured)
    if os.environ.get("BERTH_ENVD_BIN"):
        return Path(os.environ["BERTH_ENVD_BIN"])
    print("building berth-envd (release)…", file=sys.stderr)
    subprocess.run(["cargo", "build", "--release", "-p", "berth-envd", "--bin", "berth-envd"], cwd=REPO_ROOT, check=True)
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO_ROOT / "target"))
    return (target if target.is_absolute() else REPO_ROOT / target) / "release" / "berth-envd"


class Envd:
    """A berth-envd started for the benchmark, stopped by PID."""

    def __init__(self, binary: Path, workdir: Path) -> None:
        self.log = open(workdir / "envd.log", "wb")
        self.process = subprocess.Popen(
            [str(binary), "--listen", ENVD_ADDRESS],
            cwd=workdir,
            env={**os.environ, "HOME": str(workdir), "RUST_LOG": "warn"},
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while not healthy():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                sys.exit(f"berth-envd did not come up; see {workdir / 'envd.log'}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.log.close()


def direct_spawn_options(user: str | None) -> dict:
    """subprocess options that start `bash -lc` the way envd does for `user`."""
    if user is None:
        return {}
    entry = pwd.getpwnam(user)
    return {
        "user": entry.pw_uid,
        "group": entry.pw_gid,
        "extra_groups": os.getgrouplist(user, entry.pw_gid),
        "cwd": entry.pw_dir,
        "env": {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": entry.pw_dir,
            "USER": user,
            "LOGNAME": user,
            "SHELL": entry.pw_shell,
        },
    }


def time_calls(call, runs: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        call()
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        call()
        samples.append(time.perf_counter() - started)
    return samples


def throughput(call, transfers: int) -> float:
    """Median MiB/s of `transfers` runs of `call` (which moves TRANSFER_SIZE bytes)."""
    rates = []
    for _ in range(transfers):
        started = time.perf_counter()
        call()
        rates.append(TRANSFER_SIZE / MIB / (time.perf_counter() - started))
    return statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=500, help="timed commands.run calls (default 500)")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--transfers", type=int, default=5, help="100 MiB transfers per direction (default 5)")
    parser.add_argument("--envd-bin", help="berth-envd binary to start")
    parser.add_argument("--use-running", action="store_true", help="measure the envd already on 127.0.0.1:49983")
    parser.add_argument("--json", action="store_true", help="print the results as JSON too")
    parser.add_argument(
        "--user",
        help="run commands as this existing OS user (both through envd and directly); default: envd's default user",
    )
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="berth-envd-bench-"))
    envd = None
    try:
        if args.use_running:
            if not healthy():
                sys.exit(f"--use-running: nothing answers {ENVD_URL}/health")
        else:
            if healthy():
                sys.exit(f"something already answers on {ENVD_URL}; stop it or pass --use-running")
            envd = Envd(envd_binary(args.envd_bin), workdir)

        sandbox = Sandbox.create()
        results: dict[str, dict] = {}

        sdk = time_calls(lambda: sandbox.commands.run("true", user=args.user), args.runs, args.warmup)
        direct_options = direct_spawn_options(args.user)
        direct = time_calls(
            lambda: subprocess.run(["bash", "-lc", "true"], check=True, stdin=subprocess.DEVNULL, **direct_options),
            args.runs,
            args.warmup,
        )
        results["run_true_sdk"] = {"p50_ms": percentile(sdk, 0.5) * 1e3, "p99_ms": percentile(sdk, 0.99) * 1e3}
        results["run_true_direct"] = {
            "p50_ms": percentile(direct, 0.5) * 1e3,
            "p99_ms": percentile(direct, 0.99) * 1e3,
        }

        payload = os.urandom(TRANSFER_SIZE)
        target = workdir / "transfer.bin"
        results["upload_multipart"] = {"mib_s": throughput(lambda: sandbox.files.write(str(target), payload), args.transfers)}
        results["upload_octet_stream"] = {
            "mib_s": throughput(lambda: sandbox.files.write(str(target), io.BytesIO(payload)), args.transfers)
        }

        def download_bytes() -> None:
            assert len(sandbox.files.read(str(target), format="bytes")) == TRANSFER_SIZE

        def download_stream() -> None:
            size = 0
            with sandbox.files.read(str(target), format="stream") as stream:
                for block in stream:
                    size += len(block)
            assert size == TRANSFER_SIZE

        results["download_bytes"] = {"mib_s": throughput(download_bytes, args.transfers)}
        results["download_stream"] = {"mib_s": throughput(download_stream, args.transfers)}

        # The same transfers over plain HTTP (httpx), to tell envd's share from the SDK's.
        with httpx.Client(base_url=ENVD_URL, timeout=None) as raw:

            def raw_upload() -> None:
                response = raw.post(
                    "/files",
                    params={"path": str(target)},
                    content=payload,
                    headers={"Content-Type": "application/octet-stream"},
                )
                response.raise_for_status()

            def raw_download(accept_encoding: str) -> None:
                size = 0
                headers = {"Accept-Encoding": accept_encoding}
                with raw.stream("GET", "/files", params={"path": str(target)}, headers=headers) as response:
                    response.raise_for_status()
                    for block in response.iter_bytes(MIB):
                        size += len(block)
                assert size == TRANSFER_SIZE

            results["raw_http_upload"] = {"mib_s": throughput(raw_upload, args.transfers)}
            results["raw_http_download"] = {"mib_s": throughput(lambda: raw_download("identity"), args.transfers)}
            # httpx's default Accept-Encoding, which the SDK's download requests carry too.
            results["raw_http_download_gzip"] = {
                "mib_s": throughput(lambda: raw_download("gzip, deflate"), args.transfers)
            }

        direct_target = workdir / "direct.bin"
        results["direct_file_write"] = {"mib_s": throughput(lambda: direct_target.write_bytes(payload), args.transfers)}
        results["direct_file_read"] = {"mib_s": throughput(lambda: direct_target.read_bytes(), args.transfers)}
    finally:
        if envd is not None:
            envd.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    sdk_row, direct_row = results["run_true_sdk"], results["run_true_direct"]
    who = args.user or "envd's default user"
    print(f"\nberth-envd benchmark ({args.runs} runs as {who}, {args.transfers} × 100 MiB per transfer row)\n")
    print(f"{'what':<44} {'p50':>10} {'p99':>10}")
    for label, row in [
        ('commands.run("true") via Python SDK', sdk_row),
        ("bash -lc true, spawned directly", direct_row),
    ]:
        print(f"{label:<44} {row['p50_ms']:>8.2f}ms {row['p99_ms']:>8.2f}ms")
    print(
        f"{'ratio SDK / direct':<44} {sdk_row['p50_ms'] / direct_row['p50_ms']:>9.2f}x "
        f"{sdk_row['p99_ms'] / direct_row['p99_ms']:>9.2f}x"
    )
    print(f"\n{'what':<44} {'MiB/s':>10}")
    for key, label in [
        ("upload_multipart", "upload 100 MiB (bytes → multipart)"),
        ("upload_octet_stream", "upload 100 MiB (file object → octet-stream)"),
        ("download_bytes", "download 100 MiB (format=bytes)"),
        ("download_stream", "download 100 MiB (format=stream)"),
        ("raw_http_upload", "upload 100 MiB, plain HTTP (httpx, no SDK)"),
        ("raw_http_download", "download 100 MiB, plain HTTP, identity"),
        ("raw_http_download_gzip", "download 100 MiB, plain HTTP, gzip, deflate"),
        ("direct_file_write", "direct file write (peer, no envd)"),
        ("direct_file_read", "direct file read (peer, no envd)"),
    ]:
        print(f"{label:<44} {results[key]['mib_s']:>10.0f}")
    if args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

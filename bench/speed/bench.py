#!/usr/bin/env python3
"""Speed benchmark (not a test): the official Python SDK through `berth up`, each row
beside a floor measured in the same run, in the same place.

Rows and their floors:
  commands.run("true")      the same `bash -l -c true` timed inside the sandbox (envd
                            runs every command through a login shell)
  first output of a busy    `echo` then a CPU-bound loop: from the call to the first
  command                   stdout callback, beside the same command's first line read
                            from its pipe inside the sandbox (a start that waits for the
                            command's CPU burst shows here, not in `true`; the floor's
                            Python parent shares the sandbox's CPU cgroup with the
                            command, so it can wait the same way and hide some of it)
  files.read / files.write  the same envd call made inside the sandbox, straight to envd
  of 1 KiB                  on 127.0.0.1:49983 (no proxy, no host hop)
  100 MiB upload, and       a 100 MiB copy over a loopback TCP socket on the host
  download as a stream
  100 MiB download (bytes)  the SDK's own download client reading the same 100 MiB as
                            bytes from a loopback server that sends it with sendfile(2)
                            (the client's share: buffering and copying the body)
  create → first command    `unshare` of the runtime's namespaces spawning /bin/true
  (warm pool, cold)         (the kernel part of a sandbox start)
  50 concurrent creates     the same floor at concurrency 50, twice: from one client
                            process (50 threads sharing one GIL, so the slowest create
                            cannot finish before the client work of all 50 is done),
                            and from 50 client processes, one per create, as 50 agents
                            would make them (each warmed up by one create first, as the
                            one process is); each beside all the CPU the host spent
                            meanwhile (the clients', berth's, the rest: sandboxes and
                            kernel), whose share per CPU no burst can end before
  pause / connect → command the `criu dump` / `criu restore` that very pause or resume
  at 64 and 512 MiB         ran, spawn → exit, from berth's own metrics
  resident (512 in a 1 GB
  template it builds),
  resumed from images       (`berth_criu_duration_seconds`: its sum and count before and
                            after each call, one call at a time), on a daemon that keeps
                            no paused processes (`BERTH_KEEP_PAUSED_SECS=0`)
  the same, kept            (berth up's default: the pause leaves the dumped tree frozen
                            and the resume thaws it, running no CRIU) the dump beside the
                            pause; beside the resume, the same connect → command against
                            the running sandbox
  fork(count=10)            of the 64 MiB sandbox, beside its memory floor: ten copies of
                            64 MiB read from tmpfs into fresh anonymous memory on all
                            CPUs, as CRIU's restorer reads pages (on this host the page
                            faults, not the copy, are most of it); then the CRIU runs
                            inside each fork (one dump, ten restores at most four at a time)

A row whose p50 exceeds 1.5 × its floor + 2 ms (or a transfer under 500 MiB/s, a target
missed) is marked `OVER` in the output: the run never fails, the output says so loudly.

Usage (repo root, as root, after scripts/install-deps.sh and a `berth` build):
  .venv/bin/python bench/speed/bench.py --berth target/dist/berth [--samples 200]

It starts its own `berth up` daemons (with a warm pool, and without one for cold
creates) on free loopback ports, with temporary state dirs whose `templates/` link to the
shared template store, an address pool of their own and an egress ceiling admitting only
the benchmarking range; they are stopped by PID at the end.
"""

from __future__ import annotations

import argparse
import datetime
import json
import mmap
import os
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from sandbox_pool import free_sandbox_pool  # noqa: E402

MIB = 1024 * 1024
TRANSFER_BYTES = 100 * MIB


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


class Daemon:
    """One `berth up` of this benchmark."""

    def __init__(self, berth: str, templates: Path, pool_size: int, extra_env: Optional[dict[str, str]] = None) -> None:
        self.state = Path(tempfile.mkdtemp(prefix="berth-bench-speed-"))
        os.chmod(self.state, 0o711)
        (self.state / "templates").symlink_to(templates)
        port = free_port()
        self.metrics_port = free_port()
        self.log = Path(tempfile.mkstemp(prefix="berth-bench-speed-", suffix=".log")[1])
        self.proc = subprocess.Popen(
            [
                berth,
                "up",
                "--listen",
                f"127.0.0.1:{port}",
                "--state-dir",
                str(self.state),
                "--metrics-listen",
                f"127.0.0.1:{self.metrics_port}",
            ],
            env={
                **os.environ,
                "BERTH_SANDBOX_CIDR": free_sandbox_pool(),
                "BERTH_EGRESS_ALLOW": "198.18.0.0/15",
                "BERTH_POOL_SIZE": str(pool_size),
                **(extra_env or {}),
            },
            stdout=subprocess.PIPE,
            stderr=self.log.open("w"),
            text=True,
        )
        self.env: dict[str, str] = {}
        assert self.proc.stdout is not None
        while not {"E2B_API_URL", "E2B_SANDBOX_URL"} <= self.env.keys():
            line = self.proc.stdout.readline()
            if not line:
                self.stop()
                tail = self.log.read_text()[-2000:]
                raise SystemExit(f"berth up exited before printing its E2B_* lines:\n{tail}")
            if line.startswith("E2B_") and "=" in line:
                key, value = line.strip().split("=", 1)
                self.env[key] = value
        # berth up prints its first key only to a terminal: make one for the benchmark.
        created = subprocess.run(
            [berth, "keys", "create", "--state-dir", str(self.state)], capture_output=True, text=True, check=True
        )
        self.env["E2B_API_KEY"] = created.stdout.strip().splitlines()[-1].split("=")[-1]
        # Keep draining its stdout so it never blocks on a full pipe.
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()

    def use(self) -> None:
        os.environ.update(self.env)

    def metrics(self) -> str:
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as response:
            return response.read().decode()

    def pooled(self) -> int:
        """Sandboxes ready in the warm pools (`pool_sandboxes`, summed over templates):
        prepared, answering and confined, so none is still being made."""
        return sum(
            int(float(line.rsplit(" ", 1)[1]))
            for line in self.metrics().splitlines()
            if line.startswith("berth_pool_sandboxes")
        )

    def criu_runs(self) -> dict[str, tuple[float, int]]:
        """Seconds and count of the successful CRIU runs so far, per action (`dump`,
        `restore`), from `berth_criu_duration_seconds`."""
        runs: dict[str, tuple[float, int]] = {"dump": (0.0, 0), "restore": (0.0, 0)}
        for line in self.metrics().splitlines():
            for action in runs:
                labels = f'{{action="{action}",outcome="ok"}}'
                seconds, count = runs[action]
                if line.startswith(f"berth_criu_duration_seconds_sum{labels} "):
                    runs[action] = (float(line.rsplit(" ", 1)[1]), count)
                elif line.startswith(f"berth_criu_duration_seconds_count{labels} "):
                    runs[action] = (seconds, int(float(line.rsplit(" ", 1)[1])))
        return runs

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        # Never delete through a mount berth left behind (a cgroup hierarchy would lose
        # its empty groups): say so and keep the directory.
        left = mounts_under(self.state)
        if left:
            print(f"berth up left mounts under {self.state}, kept: {', '.join(left)}", file=sys.stderr)
        else:
            shutil.rmtree(self.state, ignore_errors=True)
        self.log.unlink(missing_ok=True)


def mounts_under(directory: Path) -> list[str]:
    """Mount points at or below `directory`, from /proc/self/mountinfo."""
    prefix = str(directory.resolve())
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        # Field 5 is the mount point, with spaces and the like octal-escaped.
        point = line.split(" ")[4].encode().decode("unicode_escape")
        if point == prefix or point.startswith(prefix + "/"):
            points.append(point)
    return points


class Report:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.over: list[str] = []

    def latency(self, what: str, samples: list[float], floor_name: str, floor: list[float]) -> None:
        p50, p99 = statistics.median(samples), percentile(samples, 99)
        f50, f99 = statistics.median(floor), percentile(floor, 99)
        verdict = "ok"
        if p50 > 1.5 * f50 + 2.0:
            verdict = "OVER"
            self.over.append(what)
        self.lines.append(
            f"| {what} | {p50:.2f} / {p99:.2f} | {floor_name} | {f50:.2f} / {f99:.2f} | {p50 / f50:.2f}× | {verdict} |"
        )

    def throughput(self, what: str, mib_s: float, floor_name: str, floor_mib_s: float) -> None:
        verdict = "ok" if mib_s >= 500 else "OVER"
        if verdict == "OVER":
            self.over.append(what)
        self.lines.append(
            f"| {what} | {mib_s:.0f} MiB/s | {floor_name} | {floor_mib_s:.0f} MiB/s | {mib_s / floor_mib_s:.2f}× | {verdict} |"
        )

    def figure(self, what: str, value: str, note: str) -> None:
        self.lines.append(f"| {what} | {value} | {note} | | | |")

    def plain(self, what: str, samples: list[float], note: str) -> None:
        self.lines.append(
            f"| {what} | {statistics.median(samples):.1f} / {percentile(samples, 99):.1f} | {note} | | | |"
        )


def timed(fn: Callable[[], object], samples: int, warmup: int = 5) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(samples):
        started = time.perf_counter()
        fn()
        out.append((time.perf_counter() - started) * 1000)
    return out


# Runs inside the sandbox: times `bash -l -c true`, and envd's file calls straight to
# envd on loopback with the sandbox's token, the same requests the SDK makes.
INSIDE = r"""
import http.client, json, subprocess, sys, time
samples, token = int(sys.argv[1]), sys.argv[2]
def timed(fn):
    for _ in range(5): fn()
    out = []
    for _ in range(samples):
        t = time.perf_counter(); fn(); out.append((time.perf_counter() - t) * 1000)
    return out
headers = {"X-Access-Token": token} if token else {}
conn = http.client.HTTPConnection("127.0.0.1", 49983)
def read():
    conn.request("GET", "/files?path=/tmp/bench-1k&username=user", headers={**headers, "Accept-Encoding": "gzip, deflate"})
    r = conn.getresponse(); r.read(); assert r.status == 200, r.status
boundary = "benchboundary"
body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"bench-w\"\r\n"
        f"Content-Type: application/octet-stream\r\n\r\n").encode() + b"x" * 1024 + f"\r\n--{boundary}--\r\n".encode()
def write():
    conn.request("POST", "/files?path=/tmp/bench-w&username=user", body=body,
                 headers={**headers, "Content-Type": f"multipart/form-data; boundary={boundary}"})
    r = conn.getresponse(); r.read(); assert r.status == 200, r.status
shell = timed(lambda: subprocess.run(["/bin/bash", "-l", "-c", "true"], check=True))
busy = sys.argv[3]
def first_line():
    started = time.perf_counter()
    child = subprocess.Popen(["/bin/bash", "-l", "-c", busy], stdout=subprocess.PIPE)
    child.stdout.readline()
    elapsed = (time.perf_counter() - started) * 1000
    child.wait()
    return elapsed
for _ in range(3):
    first_line()
first = [first_line() for _ in range(max(1, samples // 4))]
print(json.dumps({"shell": shell, "read": timed(read), "write": timed(write), "first": first}))
"""

# Prints a line, then keeps its CPU busy for a few milliseconds.
BUSY_COMMAND = "echo started; i=0; while [ $i -lt 5000 ]; do i=$((i+1)); done"


def first_output(sandbox) -> float:
    """Milliseconds from `commands.run(BUSY_COMMAND)` to its first stdout callback."""
    seen: list[float] = []
    started = time.perf_counter()
    sandbox.commands.run(BUSY_COMMAND, on_stdout=lambda _: seen or seen.append(time.perf_counter()))
    return (seen[0] - started) * 1000


def interactive(report: Report, samples: int) -> None:
    from e2b import Sandbox

    sandbox = Sandbox.create(timeout=600)
    try:
        sandbox.files.write("/tmp/bench-1k", "x" * 1024)
        sandbox.files.write("/tmp/inside.py", INSIDE)
        run = timed(lambda: sandbox.commands.run("true"), samples)
        read = timed(lambda: sandbox.files.read("/tmp/bench-1k"), samples)
        write = timed(lambda: sandbox.files.write("/tmp/bench-w", "x" * 1024), samples)
        for _ in range(3):
            first_output(sandbox)
        first = [first_output(sandbox) for _ in range(max(1, samples // 4))]
        token = sandbox._envd_access_token or ""
        inside = json.loads(
            sandbox.commands.run(
                f"python3 /tmp/inside.py {samples} {shlex.quote(token)} {shlex.quote(BUSY_COMMAND)}", timeout=600
            ).stdout
        )
        report.latency('`commands.run("true")`', run, "`bash -l -c true` inside", inside["shell"])
        report.latency("first stdout of a busy command", first, "its first line from a pipe inside", inside["first"])
        report.latency("`files.read` 1 KiB", read, "same GET to envd inside", inside["read"])
        report.latency("`files.write` 1 KiB", write, "same POST to envd inside", inside["write"])
        transfers(report, sandbox)
    finally:
        sandbox.kill()


def loopback_copy_mib_s() -> float:
    """A 100 MiB copy over a loopback TCP connection (1 MiB writes and reads)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    chunk = b"\0" * MIB

    def send() -> None:
        conn, _ = listener.accept()
        with conn:
            for _ in range(TRANSFER_BYTES // MIB):
                conn.sendall(chunk)

    sender = threading.Thread(target=send)
    sender.start()
    started = time.perf_counter()
    with socket.create_connection(listener.getsockname()) as client:
        got = 0
        while got < TRANSFER_BYTES:
            data = client.recv(MIB)
            if not data:
                break
            got += len(data)
    elapsed = time.perf_counter() - started
    sender.join()
    listener.close()
    return TRANSFER_BYTES / MIB / elapsed


class SendfileServer:
    """An HTTP/1.1 server on loopback that answers every GET with `payload` through
    sendfile(2): the kernel copies page cache to the socket, so a client's time against
    it is the client's own (the floor of what any server could give that client)."""

    def __init__(self, payload: bytes) -> None:
        self.file = tempfile.TemporaryFile(dir="/dev/shm")
        self.file.write(payload)
        self.file.flush()
        self.size = len(payload)
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(4)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self.answer, args=(conn,), daemon=True).start()

    def answer(self, conn: socket.socket) -> None:
        with conn:
            pending = b""
            while True:
                while b"\r\n\r\n" not in pending:
                    data = conn.recv(65536)
                    if not data:
                        return
                    pending += data
                pending = pending.split(b"\r\n\r\n", 1)[1]
                conn.sendall(
                    f"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {self.size}\r\n\r\n".encode()
                )
                conn.sendfile(self.file, 0, self.size)

    def close(self) -> None:
        self.listener.close()
        self.file.close()


def transfers(report: Report, sandbox, rounds: int = 3) -> None:
    from e2b.api.client_sync import get_envd_api
    from e2b.envd.api import ENVD_API_FILE_DOWNLOAD_HTTP_VERSION

    payload = os.urandom(TRANSFER_BYTES)
    uploads, downloads, streamed = [], [], []
    for _ in range(rounds):
        started = time.perf_counter()
        sandbox.files.write("/tmp/bench-100m", payload)
        uploads.append(time.perf_counter() - started)
        started = time.perf_counter()
        data = sandbox.files.read("/tmp/bench-100m", format="bytes")
        downloads.append(time.perf_counter() - started)
        assert len(data) == TRANSFER_BYTES
        del data
        started = time.perf_counter()
        got = sum(len(chunk) for chunk in sandbox.files.read("/tmp/bench-100m", format="stream"))
        streamed.append(time.perf_counter() - started)
        assert got == TRANSFER_BYTES
    sandbox.commands.run("rm -f /tmp/bench-100m")
    # The client's floor for `files.read(format="bytes")`: the SDK's own download client
    # and the same body handling (`bytearray(response.content)`), against a server that
    # costs nothing. What it loses to the loopback copy is the client's, not berth's.
    server = SendfileServer(payload)
    try:
        client = get_envd_api(sandbox.connection_config, server.url, http_version=ENVD_API_FILE_DOWNLOAD_HTTP_VERSION)
        client_floor = []
        for _ in range(rounds):
            started = time.perf_counter()
            data = bytearray(client.get("/files").content)
            client_floor.append(time.perf_counter() - started)
            assert len(data) == TRANSFER_BYTES
            del data
    finally:
        server.close()
    floor = statistics.median(loopback_copy_mib_s() for _ in range(rounds))
    report.throughput("100 MiB upload (`files.write`)", 100 / statistics.median(uploads), "loopback TCP copy", floor)
    report.throughput(
        "100 MiB download (`files.read` bytes)",
        100 / statistics.median(downloads),
        "the SDK's client, sendfile server",
        100 / statistics.median(client_floor),
    )
    report.throughput(
        "100 MiB download (`files.read` stream)", 100 / statistics.median(streamed), "loopback TCP copy", floor
    )


def unshare_floor(samples: int, concurrency: int = 1) -> list[float]:
    """`unshare` of a sandbox's namespaces spawning /bin/true, at `concurrency`."""
    command = ["unshare", "--mount", "--pid", "--fork", "--net", "--uts", "--ipc", "--cgroup", "/bin/true"]
    return concurrent(lambda: subprocess.run(command, check=True), samples, concurrency)


def concurrent(fn: Callable[[], object], samples: int, concurrency: int) -> list[float]:
    durations: list[float] = []
    lock = threading.Lock()
    remaining = [samples]

    def worker() -> None:
        while True:
            with lock:
                if remaining[0] == 0:
                    return
                remaining[0] -= 1
            started = time.perf_counter()
            fn()
            elapsed = (time.perf_counter() - started) * 1000
            with lock:
                durations.append(elapsed)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return durations


def create_then_run(created: Optional[list] = None) -> None:
    from e2b import Sandbox

    sandbox = Sandbox.create(timeout=300)
    sandbox.commands.run("true")
    if created is None:
        sandbox.kill()
    else:
        created.append(sandbox)


def add_daemon_args(parser: argparse.ArgumentParser) -> None:
    """`--berth` and `--templates`: the binary every bench script's `berth up` runs, and
    the template store its state dir links to."""
    parser.add_argument("--berth", default=os.environ.get("BERTH_BIN", "target/dist/berth"))
    parser.add_argument("--templates", default="/var/lib/berth/templates")


def wait_for_pool(daemon: Daemon, want: int, limit_s: float = 600) -> None:
    deadline = time.monotonic() + limit_s
    while daemon.pooled() < want:
        if time.monotonic() > deadline:
            raise SystemExit(f"the warm pool did not reach {want} in {limit_s:.0f} s")
        time.sleep(0.2)


def creates(report: Report, daemon: Daemon, cold: Daemon, samples: int, pool_size: int) -> None:
    floor = unshare_floor(samples)
    def sample() -> float:
        """One create → first command (ms); the kill after it is not timed."""
        created: list = []
        started = time.perf_counter()
        create_then_run(created)
        elapsed = (time.perf_counter() - started) * 1000
        created[0].kill()
        return elapsed

    daemon.use()
    create_then_run()  # starts the template's pool
    warm = []
    for _ in range(samples):
        wait_for_pool(daemon, pool_size)
        warm.append(sample())
    report.latency("create → first command, warm pool", warm, "`unshare` → /bin/true", floor)
    cold.use()
    for _ in range(2):
        sample()
    cold_samples = [sample() for _ in range(samples)]
    report.latency("create → first command, cold (no pool)", cold_samples, "`unshare` → /bin/true", floor)


def burst_client(ready, go, done, results) -> None:
    """One create → first command from its own process, started when the parent says
    go; puts (CLOCK_MONOTONIC at the end, CPU ms, sandbox id) on `results`, or (None,
    0, what failed), and exits only when the parent says the burst is done (a Python
    process's exit costs tens of CPU-ms, which must not land inside the burst)."""
    # A warm client, as in the one-process burst: the SDK's first call in a process
    # costs tens of CPU-ms more than the next ones (imports, its HTTP stacks).
    create_then_run()
    ready.wait()
    go.wait()
    cpu_before = time.process_time()
    created: list = []
    try:
        create_then_run(created)
    except Exception as error:  # reported by the parent, which ends the run
        results.put((None, 0.0, repr(error)))
    else:
        ended = time.clock_gettime(time.CLOCK_MONOTONIC)
        results.put((ended, (time.process_time() - cpu_before) * 1000, created[0].sandbox_id))
    done.wait(timeout=600)


def burst_from_processes(daemon: Daemon, size: int) -> tuple[list[float], float, "CpuWindow"]:
    """`size` creates → first command at once, each from its own warmed-up client
    process, once `daemon`'s pool is full again, timed from one go on the system-wide
    monotonic clock (a client's wake-up counts); their durations (ms), the clients'
    summed CPU (ms) and the host's CPU over the burst."""
    import multiprocessing
    from e2b import Sandbox

    context = multiprocessing.get_context("spawn")
    ready, go, done, results = context.Barrier(size + 1), context.Event(), context.Event(), context.Queue()
    clients = [context.Process(target=burst_client, args=(ready, go, done, results)) for _ in range(size)]
    for client in clients:
        client.start()
    try:
        ready.wait(timeout=300)
        wait_for_pool(daemon, size)
        wait_for_quiet_host()
        window = CpuWindow(daemon)
        started = time.clock_gettime(time.CLOCK_MONOTONIC)
        go.set()
        outcomes = [results.get(timeout=300) for _ in range(size)]
        window.close()
    finally:
        done.set()
        for client in clients:
            client.join(timeout=60)
            if client.is_alive():
                client.kill()
    failed = [detail for ended, _, detail in outcomes if ended is None]
    for ended, _, sandbox_id in outcomes:
        if ended is not None:
            Sandbox.kill(sandbox_id)
    if failed:
        raise SystemExit(f"{len(failed)} of {size} creates from client processes failed: {failed[0]}")
    durations = [(ended - started) * 1000 for ended, _, _ in outcomes]
    return durations, sum(cpu for _, cpu, _ in outcomes), window


def wait_for_quiet_host(limit_s: float = 60) -> None:
    """Waits until the host's CPUs are mostly idle (under 15 % busy over 250 ms), or
    `limit_s`: the kernel tears a killed sandbox's namespaces down in the background,
    and a burst must not share the CPUs with the teardown of the sandboxes before it."""
    deadline = time.monotonic() + limit_s
    cpus = os.cpu_count() or 1
    while time.monotonic() < deadline:
        before = CpuWindow.host_busy_ms()
        time.sleep(0.25)
        if CpuWindow.host_busy_ms() - before < 0.15 * cpus * 250:
            return


class CpuWindow:
    """CPU time spent from its making to `close()`: by the whole host (all CPUs busy,
    from /proc/stat) and by `berth up` (its threads, from /proc/<pid>/stat), in ms."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.started = time.perf_counter()
        self.host, self.berth = self.host_busy_ms(), self.process_ms(daemon.proc.pid)
        self.wall = 0.0
        self.refilled = 0

    @staticmethod
    def host_busy_ms() -> float:
        # user nice system idle iowait irq softirq: everything but idle and iowait.
        user, nice, system, _idle, _iowait, irq, softirq = (
            int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8]
        )
        return (user + nice + system + irq + softirq) * 1000 / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def process_ms(pid: int) -> float:
        # utime and stime, fields 14 and 15; the fields after the name start at field 3.
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        self.wall = (time.perf_counter() - self.started) * 1000
        self.host = self.host_busy_ms() - self.host
        self.berth = self.process_ms(self.daemon.proc.pid) - self.berth
        self.refilled = self.daemon.pooled()

    def report(self, report: Report, clients_ms: float, clients: str) -> None:
        cpus = os.cpu_count() or 1
        report.figure(
            "all CPU the host spent during those creates",
            f"{self.host:.0f} ms on {cpus} CPUs in a {self.wall:.0f} ms burst: {clients} {clients_ms:.0f}, "
            f"`berth up` {self.berth:.0f}, the rest {self.host - clients_ms - self.berth:.0f}; "
            f"{self.refilled} pooled again by its end",
            f"the rest: the sandboxes' envd and `bash -l`, the kernel; the burst cannot end before {self.host / cpus:.0f} ms",
        )


def burst(report: Report, berth: str, templates: Path, size: int) -> None:
    daemon = Daemon(berth, templates, pool_size=size)
    try:
        daemon.use()
        create_then_run()
        wait_for_pool(daemon, size)
        wait_for_quiet_host()
        created: list = []
        cpu_before, window = os.times(), CpuWindow(daemon)
        durations = concurrent(lambda: create_then_run(created), size, size)
        cpu_after = os.times()
        window.close()
        client_cpu = (cpu_after.user + cpu_after.system - cpu_before.user - cpu_before.system) * 1000
        for sandbox in created:
            sandbox.kill()
        floor = unshare_floor(size, size)
        report.latency(
            f"{size} concurrent creates → first command (pool of {size}), one client process",
            durations,
            f"`unshare` at c={size}",
            floor,
        )
        window.report(report, client_cpu, "the client (one Python process, one GIL)")
        durations, client_cpu, window = burst_from_processes(daemon, size)
        report.latency(
            f"{size} concurrent creates → first command (pool of {size}), {size} client processes",
            durations,
            f"`unshare` at c={size}",
            floor,
        )
        window.report(report, client_cpu, f"the {size} clients")
    finally:
        daemon.stop()


def criu_during(daemon: Daemon, call: Callable[[], object]) -> tuple[float, dict[str, tuple[float, int]]]:
    """Times `call` (ms) and returns it with the CRIU runs berth made meanwhile: per
    action, their total ms and count."""
    before = daemon.criu_runs()
    started = time.perf_counter()
    call()
    elapsed = (time.perf_counter() - started) * 1000
    after = daemon.criu_runs()
    return elapsed, {
        action: ((after[action][0] - before[action][0]) * 1000, after[action][1] - before[action][1])
        for action in after
    }


def only_run(runs: dict[str, tuple[float, int]], action: str, what: str) -> float:
    """The ms of the one CRIU `action` run inside `what` (nothing else runs CRIU meanwhile)."""
    total_ms, count = runs[action]
    if count != 1:
        raise RuntimeError(f"{what} made {count} successful CRIU {action} runs; its floor needs exactly one")
    return total_ms


def holding(mib: int, template: str = "base"):
    """A sandbox of `template` with `mib` MiB resident in a Python process."""
    from e2b import Sandbox

    sandbox = Sandbox.create(template, timeout=600)
    sandbox.commands.run(
        f"python3 -c 'import os,time; b=os.urandom({mib}<<20); time.sleep(86400)' >/dev/null 2>&1 &"
    )
    # Until the bytes are drawn (about 0.3 s per 100 MiB here) the process is still growing.
    time.sleep(2 + mib / 200)
    return sandbox


def large_template() -> str:
    """A template with room for 512 MiB resident (installed templates get 512 MB in all):
    built from `base` on the daemon in use, named by this benchmark."""
    from e2b import Template

    name = "bench-speed-1g"
    Template.build(Template().from_template("base").run_cmd("true"), name, cpu_count=2, memory_mb=1024)
    return name


def holding_on(daemon: Daemon, mib: int):
    """`holding` on `daemon` (made the one in use), in a template with room for `mib`."""
    daemon.use()
    return holding(mib, "base" if mib <= 256 else large_template())


def pause_rounds(
    daemon: Daemon, sandbox, iterations: int, kept: bool, gap_s: float = 0.0
) -> tuple[list, list, list, list]:
    """`iterations` rounds of pause, then (`gap_s` later) connect → `commands.run("true")`:
    their times and the CRIU dump and restore each ran (a kept pause's resume must run none)."""
    from e2b import Sandbox

    pauses, resumes, dumps, restores = [], [], [], []

    def resume_and_run() -> None:
        Sandbox.connect(sandbox.sandbox_id, timeout=600).commands.run("true")

    for _ in range(iterations):
        elapsed, runs = criu_during(daemon, sandbox.beta_pause)
        pauses.append(elapsed)
        dumps.append(only_run(runs, "dump", "pause"))
        time.sleep(gap_s)
        elapsed, runs = criu_during(daemon, resume_and_run)
        resumes.append(elapsed)
        if kept:
            if runs["restore"][1] != 0:
                raise RuntimeError("a resume of a kept pause restored its images: the tree was not kept")
        else:
            restores.append(only_run(runs, "restore", "connect"))
    return pauses, resumes, dumps, restores


def pause_and_resume(report: Report, kept_daemon: Daemon, images_daemon: Daemon, iterations: int, mib: int) -> None:
    """Pause and connect → first command at `mib` MiB resident, resumed from images and
    kept."""
    from e2b import Sandbox

    sandbox = holding_on(images_daemon, mib)
    try:
        pauses, resumes, dumps, restores = pause_rounds(images_daemon, sandbox, iterations, kept=False)
        report.latency(f"pause, {mib} MiB resident (not kept)", pauses, "the `criu dump` it ran", dumps)
        report.latency(
            f"connect (resume from images) → first command, {mib} MiB", resumes, "the `criu restore` it ran", restores
        )
    finally:
        sandbox.kill()

    sandbox = holding_on(kept_daemon, mib)
    try:
        pauses, resumes, dumps, _ = pause_rounds(kept_daemon, sandbox, iterations, kept=True)
        running = timed(lambda: Sandbox.connect(sandbox.sandbox_id, timeout=600).commands.run("true"), iterations * 3)
        report.latency(f"pause, {mib} MiB resident (kept)", pauses, "the `criu dump` it ran", dumps)
        report.latency(
            f"connect (resume, kept) → first command, {mib} MiB",
            resumes,
            "connect → command, running",
            running,
        )
        if mib == 64:
            fork_ten(report, kept_daemon, sandbox, iterations)
    finally:
        sandbox.kill()


def fresh_memory_fill(mib: int, copies: int, samples: int) -> list[float]:
    """ms to read `copies` × `mib` MiB from a tmpfs file into fresh private anonymous
    mappings, spread over every CPU (threads: `preadv` runs without the GIL). A memory
    restore cannot do less: CRIU's restorer reads each dumped page into a fresh mapping
    the same way, so the page faults that fill it are its floor as much as the copy."""
    size = mib << 20
    workers = os.cpu_count() or 1
    shares = [copies // workers + (1 if i < copies % workers else 0) for i in range(workers)]
    with tempfile.NamedTemporaryFile(dir="/dev/shm", prefix="berth-bench-fill-") as source:
        source.write(os.urandom(size))
        source.flush()

        def fill(count: int, into: list) -> None:
            for _ in range(count):
                mapping = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
                if os.preadv(source.fileno(), [mapping], 0) != size:
                    raise RuntimeError("short read from the tmpfs source")
                into.append(mapping)

        out = []
        for _ in range(samples + 1):
            filled: list = []
            threads = [threading.Thread(target=fill, args=(n, filled)) for n in shares if n]
            started = time.perf_counter()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            out.append((time.perf_counter() - started) * 1000)
            # Unmapped outside the timing: a fork's restored pages are freed only when it ends.
            for mapping in filled:
                mapping.close()
            if len(filled) != copies:
                raise RuntimeError(f"filled {len(filled)} of {copies} mappings")
        return out[1:]


def fork_ten(report: Report, daemon: Daemon, sandbox, iterations: int) -> None:
    forks, fork_dumps, fork_restores = [], [], []
    for _ in range(max(1, iterations // 2)):
        results: list = []
        elapsed, runs = criu_during(daemon, lambda: results.extend(sandbox.fork(count=10, timeout=300)))
        forks.append(elapsed)
        fork_dumps.append(only_run(runs, "dump", "fork"))
        restore_ms, restore_count = runs["restore"]
        if restore_count != 10:
            raise RuntimeError(f"fork(count=10) made {restore_count} successful CRIU restores")
        fork_restores.append(restore_ms / restore_count)
        for fork in results:
            if isinstance(fork, Exception):
                raise fork
            fork.kill()
    fills = fresh_memory_fill(64, 10, max(3, len(forks)))
    report.latency(
        "`fork(count=10)`, 64 MiB (target ≤ 400 ms)",
        forks,
        "10 × 64 MiB into fresh memory, all CPUs",
        fills,
    )
    report.figure(
        "the CRIU inside each `fork(count=10)` (median)",
        f"dump {statistics.median(fork_dumps):.1f}, restore {statistics.median(fork_restores):.1f} each",
        "ten restores, at most four at a time",
    )


def stateful(report: Report, kept_daemon: Daemon, images_daemon: Daemon, iterations: int, sizes: list[int]) -> None:
    for mib in sizes:
        pause_and_resume(report, kept_daemon, images_daemon, iterations, mib)


SECTIONS = ("interactive", "creates", "stateful", "burst")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_daemon_args(parser)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--create-samples", type=int, default=30)
    parser.add_argument("--pool-size", type=int, default=2)
    parser.add_argument("--burst", type=int, default=50, help="concurrent creates against a pool of this size (0: skip)")
    parser.add_argument("--stateful-iterations", type=int, default=6)
    parser.add_argument(
        "--resident-mib",
        default="64,512",
        help="comma-separated MiB resident for the pause/resume rows (fork runs at 64)",
    )
    parser.add_argument(
        "--only",
        default=",".join(SECTIONS),
        help=f"comma-separated sections to run, of {', '.join(SECTIONS)} (to compare two builds alternately)",
    )
    args = parser.parse_args()
    templates = Path(args.templates)
    only = set(args.only.split(","))
    if not only <= set(SECTIONS):
        parser.error(f"--only: unknown section(s) {', '.join(sorted(only - set(SECTIONS)))}")

    report = Report()
    warm = Daemon(args.berth, templates, pool_size=args.pool_size)
    try:
        # Also the daemon whose pauses keep no processes: every resume restores images.
        cold = Daemon(args.berth, templates, pool_size=0, extra_env={"BERTH_KEEP_PAUSED_SECS": "0"})
    except BaseException:
        warm.stop()
        raise
    try:
        warm.use()
        if "interactive" in only:
            interactive(report, args.samples)
        if "creates" in only:
            creates(report, warm, cold, args.create_samples, args.pool_size)
        if "stateful" in only:
            stateful(report, warm, cold, args.stateful_iterations, [int(mib) for mib in args.resident_mib.split(",")])
    finally:
        warm.stop()
        cold.stop()
    if args.burst and "burst" in only:
        burst(report, args.berth, templates, args.burst)

    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"Command: `.venv/bin/python bench/speed/bench.py --berth {args.berth} --samples {args.samples} --create-samples {args.create_samples}"
          f" --pool-size {args.pool_size} --burst {args.burst}"
          + ("" if only == set(SECTIONS) else f" --only {args.only}") + "`")
    print(f"Date (UTC): {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M}; "
          f"{os.cpu_count()} CPUs; load average {load}; latencies in ms, p50 / p99\n")
    print("| through the SDK | p50 / p99 | floor (same run) | floor p50 / p99 | ratio p50 | verdict |")
    print("|---|---|---|---|---|---|")
    print("\n".join(report.lines))
    if report.over:
        print(f"\nOVER its floor + margin (or under target): {', '.join(report.over)}")


if __name__ == "__main__":
    main()

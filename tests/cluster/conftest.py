"""A split deployment on one machine, for the multi-node suite: a throwaway Postgres
(scripts/with-postgres.sh: a unix socket in its own directory, no TCP), berth api
instances and berth node processes, each with its own state dir (the shared `base`
template store linked in), sandbox address pool and an egress ceiling admitting only the
benchmarking range, all sharing one node token. Every process is stopped by PID at the
end, and every sandbox the suite's key can see is killed first.

`BERTH_CLUSTER_DATABASE_URL` points the suite at an existing database instead (then the
caller owns it; `sqlite:DIR` works for a quick run, the acceptance run is Postgres's).

Run as root from this directory (BERTH_BIN: berth with berth-envd and berth-launch
beside it; scripts/test.sh lays out <target>/dist):

    cd tests/cluster && ../../.venv/bin/pytest
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Optional

import httpx
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "tests"))
from sandbox_pool import free_sandbox_pool  # noqa: E402

for _var in ("E2B_DEBUG", "E2B_DOMAIN", "E2B_ACCESS_TOKEN", "E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY"):
    os.environ.pop(_var, None)

# A node silent this long is reported lost: short, so the loss test waits seconds.
LEASE_SECS = 4
SHARED_TEMPLATES = Path(os.environ.get("BERTH_TEMPLATES_DIR", "/var/lib/berth/templates"))


def berth_binary() -> Path:
    configured = os.environ.get("BERTH_BIN")
    binary = Path(configured) if configured else REPO_ROOT / "target" / "dist" / "berth"
    if not os.access(binary, os.X_OK):
        pytest.exit(f"{binary} is not an executable berth (scripts/test.sh's build steps make it)", returncode=2)
    return binary


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def poll(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.2) -> None:
    """Poll until `predicate()` holds; fail after `timeout` s (a bound, never a measurement)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


@dataclass
class Process:
    """One berth process of the cluster."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    proc: Optional[subprocess.Popen] = None

    def start(self) -> None:
        log = open(self.log, "ab")
        self.proc = subprocess.Popen(
            self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=self.env, start_new_session=True
        )
        log.close()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if not self.alive():
            return
        assert self.proc is not None
        self.proc.send_signal(sig)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def tail(self, size: int = 6000) -> str:
        try:
            return self.log.read_text(errors="replace")[-size:]
        except OSError:
            return "<no log>"


@dataclass
class Cluster:
    binary: Path
    root: Path
    database: str
    token_file: Path
    apis: list[Process] = field(default_factory=list)
    nodes: dict[str, Process] = field(default_factory=dict)
    api_urls: list[str] = field(default_factory=list)
    key: str = ""

    def berth(self, *args: str) -> str:
        out = subprocess.run(
            [str(self.binary), *args], capture_output=True, text=True, timeout=120, env=self.base_env()
        )
        if out.returncode != 0:
            raise AssertionError(f"berth {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}")
        return out.stdout

    def base_env(self) -> dict[str, str]:
        return {
            **os.environ,
            "RUST_LOG": os.environ.get("RUST_LOG", "info"),
            "BERTH_DATABASE_URL": self.database,
            "BERTH_NODE_TOKEN_FILE": str(self.token_file),
            "BERTH_CRIU_STATE_DIR": os.environ.get("BERTH_CRIU_STATE_DIR", "/var/lib/berth"),
        }

    def add_node(self, name: str, lease_secs: int = LEASE_SECS) -> Process:
        state = self.root / name
        state.mkdir(mode=0o711)
        if SHARED_TEMPLATES.is_dir():
            (state / "templates").symlink_to(SHARED_TEMPLATES)
        port = free_port()
        env = {
            **self.base_env(),
            "BERTH_SANDBOX_CIDR": free_sandbox_pool(),
            "BERTH_EGRESS_ALLOW": "198.18.0.0/15",
            "BERTH_POOL_SIZE": "0",
        }
        node = Process(
            name,
            [
                str(self.binary), "node", "--state-dir", str(state), "--listen", f"127.0.0.1:{port}",
                "--node-name", name, "--lease-secs", str(lease_secs), "--skip-base",
                # Equal and small, so placement spreads by free memory.
                "--cpus", "64", "--memory-mb", "16384",
            ],
            env,
            self.root / f"{name}.log",
        )
        self.nodes[name] = node
        node.start()
        return node

    def start_node(self, name: str) -> None:
        self.nodes[name].start()
        self.wait_node_state(name, "up")

    def add_api(self) -> str:
        state = self.root / f"api{len(self.apis)}"
        state.mkdir(mode=0o711)
        port = free_port()
        api = Process(
            state.name,
            [str(self.binary), "api", "--state-dir", str(state), "--listen", f"127.0.0.1:{port}", "--lease-check-secs", "1"],
            self.base_env(),
            self.root / f"{state.name}.log",
        )
        self.apis.append(api)
        api.start()
        url = f"http://127.0.0.1:{port}"

        def answers() -> bool:
            if not api.alive():
                raise AssertionError(f"berth api exited:\n{api.tail()}")
            try:
                return httpx.get(f"{url}/health", timeout=2).status_code < 300
            except httpx.HTTPError:
                return False

        poll(answers, 120, "berth api to answer")
        self.api_urls.append(url)
        return url

    def node_list(self) -> dict[str, dict]:
        return {node["name"]: node for node in json.loads(self.berth("node", "ls", "--json"))}

    def wait_node_state(self, name: str, state: str, timeout: float = 300) -> None:
        def reached() -> bool:
            process = self.nodes.get(name)
            if state == "up" and process is not None and not process.alive():
                raise AssertionError(f"node {name} exited:\n{process.tail()}")
            return self.node_list().get(name, {}).get("state") == state

        poll(reached, timeout, f"node {name} to be {state}", interval=0.5)

    def sdk_env(self, api: int = 0) -> dict[str, str]:
        url = self.api_urls[api]
        return {"E2B_API_URL": url, "E2B_SANDBOX_URL": url, "E2B_API_KEY": self.key}

    def use(self, api: int) -> None:
        """Points the SDK (which reads its environment per call) at API instance `api`."""
        os.environ.update(self.sdk_env(api))

    def kill_every_sandbox(self) -> None:
        if not self.key or not self.api_urls:
            return
        headers = {"X-API-Key": self.key}
        try:
            listed = httpx.get(
                f"{self.api_urls[0]}/v2/sandboxes", params={"state": "running,paused", "limit": 100}, headers=headers, timeout=30
            ).json()
            for sandbox in listed:
                httpx.delete(f"{self.api_urls[0]}/sandboxes/{sandbox['sandboxID']}", headers=headers, timeout=60)
        except (httpx.HTTPError, ValueError):
            pass


@pytest.fixture(scope="session")
def database() -> Iterator[str]:
    given = os.environ.get("BERTH_CLUSTER_DATABASE_URL")
    if given:
        yield given
        return
    if os.geteuid() != 0:
        pytest.exit("the cluster runs sandboxes: run the suite as root", returncode=2)
    directory = Path(tempfile.mkdtemp(prefix="berth-cluster-pg-"))
    started = subprocess.run(
        ["bash", str(REPO_ROOT / "scripts" / "with-postgres.sh"), "--start", str(directory)],
        capture_output=True, text=True,
    )
    if started.returncode != 0:
        shutil.rmtree(directory, ignore_errors=True)
        pytest.exit(f"Postgres did not start:\n{started.stderr}", returncode=2)
    variables = dict(line.split("=", 1) for line in started.stdout.splitlines() if "=" in line)
    try:
        yield variables["BERTH_TEST_DATABASE_URL"]
    finally:
        subprocess.run(["bash", str(REPO_ROOT / "scripts" / "with-postgres.sh"), "--stop", str(directory)])


@pytest.fixture(scope="session")
def cluster(database: str) -> Iterator[Cluster]:
    root = Path(tempfile.mkdtemp(prefix="berth-cluster-"))
    os.chmod(root, 0o711)
    token_file = root / "node-token"
    token_file.write_text(os.urandom(32).hex() + "\n")
    os.chmod(token_file, 0o600)
    cluster = Cluster(berth_binary(), root, database, token_file)
    try:
        for name in ("node-a", "node-b", "node-c"):
            cluster.add_node(name)
        for name in ("node-a", "node-b", "node-c"):
            cluster.wait_node_state(name, "up")
        cluster.add_api()
        cluster.add_api()
        cluster.key = cluster.berth("keys", "create", "--name", "cluster-suite").strip().splitlines()[-1]
        cluster.use(0)
        yield cluster
    finally:
        cluster.kill_every_sandbox()
        for process in [*cluster.apis, *cluster.nodes.values()]:
            process.stop()
        for name, node in cluster.nodes.items():
            if "panicked" in node.tail(200000):
                print(f"--- {name} log ---\n{node.tail()}", file=sys.stderr)
        shutil.rmtree(root, ignore_errors=True)

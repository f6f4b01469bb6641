"""Fixtures for the MCP gateway suite: a real `berth up` whose `mcp-gateway` template is
built by `berth provision --template mcp-gateway`, a fake internet whose git host serves
the MCP servers' repositories, and the official clients (e2b 2.63.0, JS e2b 2.51.0, the
Python `mcp` client).

State: a fresh state dir per session whose template store holds the shared `base`
(`BERTH_TEMPLATES_DIR`, default /var/lib/berth/templates: its manifest copied, its layers
linked) and builds its own `mcp-gateway` (a host template's build must not land in the
shared store, where other daemons would see it).

Network (ENVIRONMENT.md's rule): `FakeInternet(block=202, git=True)` (see
tests/sdk/control_plane/internet.py); berth's egress ceiling admits only its hosts and
sandboxes resolve names through its DNS, so `github/<owner>/<repo>` is cloned from
`http://git.test-internet.example/<owner>/<repo>` (`--mcp-git-url`). The template's build
downloads nothing.

Binaries: `BERTH_BIN` (berth with berth-envd and berth-launch beside it, default
`<target>/dist/berth` as scripts/test.sh lays it out) and the static mcp-gateway
(`BERTH_MCP_GATEWAY_BIN`, default beside berth; crates/mcp-gateway/build-static.sh).

    cd tests/mcp_gateway && ../../.venv/bin/pytest
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Iterator, Optional

import httpx
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "tests"))
sys.path.insert(0, str(REPO_ROOT / "tests" / "sdk" / "control_plane"))
sys.path.insert(0, str(REPO_ROOT / "tests" / "interpreter"))
from berth_env import import_base  # noqa: E402  (the shared base, linked in)
from internet import FakeInternet  # noqa: E402
from sandbox_pool import free_sandbox_pool  # noqa: E402

for _var in ("E2B_DEBUG", "E2B_DOMAIN", "E2B_ACCESS_TOKEN", "E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY"):
    os.environ.pop(_var, None)

E2B_LINE = re.compile(r"^\s*(E2B_API_URL|E2B_SANDBOX_URL|E2B_DOMAIN)=(\S+)\s*$")
ECHO_SERVER = (REPO_ROOT / "crates" / "mcp-gateway" / "tests" / "data" / "echo_server.py").read_text()
TEMPLATE = "mcp-gateway"


def target_dir() -> Path:
    configured = os.environ.get("CARGO_TARGET_DIR")
    if configured:
        path = Path(configured)
        return path if path.is_absolute() else REPO_ROOT / path
    return REPO_ROOT / "target"


def berth_binary() -> Path:
    return Path(os.environ.get("BERTH_BIN", target_dir() / "dist" / "berth"))


def gateway_binary() -> Path:
    return Path(os.environ.get("BERTH_MCP_GATEWAY_BIN", berth_binary().parent / "mcp-gateway"))


def poll(predicate: Callable[[], bool], timeout: float = 60.0, what: str = "condition") -> None:
    """Polls until `predicate()` holds; fails after `timeout` s (a bound, never a measurement)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


class Berth:
    """`berth up` on the session's state dir, on a free loopback port."""

    def __init__(self, state_dir: Path, internet: FakeInternet, log_path: Path) -> None:
        self.state_dir = state_dir
        self.log_path = log_path
        self.env: dict[str, str] = {}
        self.process: Optional[subprocess.Popen] = None
        self.process_env = {
            **os.environ,
            "RUST_LOG": os.environ.get("RUST_LOG", "info"),
            "BERTH_STATE_DIR": str(state_dir),
            "BERTH_CRIU_STATE_DIR": os.environ.get("BERTH_CRIU_STATE_DIR", "/var/lib/berth"),
            "BERTH_MCP_GATEWAY_BIN": str(gateway_binary()),
            "BERTH_MCP_GIT_URL": internet.git_url,
            "BERTH_SANDBOX_CIDR": free_sandbox_pool(),
            "BERTH_EGRESS_ALLOW": internet.ceiling,
            "BERTH_DNS_UPSTREAM": f"{internet.dns_ip}:53",
            "BERTH_POOL_SIZE": "1",
        }

    @property
    def ca_file(self) -> Path:
        """The listener's serving CA, what TLS clients trust."""
        return self.state_dir / "serving-ca" / "ca.crt"

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    def provision(self) -> None:
        with open(self.log_path, "ab") as log:
            subprocess.run([str(berth_binary()), "provision", "--template", TEMPLATE], env=self.process_env,
                           stdin=subprocess.DEVNULL, stdout=log, stderr=log, check=True, timeout=900)

    def start(self) -> None:
        port = free_port()
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [str(berth_binary()), "up", "--listen", f"127.0.0.1:{port}"],
            env=self.process_env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
            start_new_session=True,
        )
        found: dict[str, str] = {}
        ready = threading.Event()
        process = self.process

        def read() -> None:
            assert process.stdout is not None
            for raw in process.stdout:
                log.write(raw)
                log.flush()
                match = E2B_LINE.match(raw.decode(errors="replace"))
                if match:
                    found[match.group(1)] = match.group(2)
                    if len(found) == 3:
                        ready.set()
            log.close()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(600) or len(found) < 3:
            self.stop()
            pytest.exit(f"berth up did not start; see {self.log_path}", returncode=2)
        key = subprocess.run(
            [str(berth_binary()), "keys", "create", "--name", "mcp-gateway-suite"],
            env=self.process_env, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=True,
        ).stdout.strip().splitlines()[-1]
        self.env = {"E2B_API_URL": found["E2B_API_URL"], "E2B_SANDBOX_URL": found["E2B_SANDBOX_URL"],
                    "E2B_API_KEY": key}
        self.domain = found["E2B_DOMAIN"]
        self.port = port

        def healthy() -> bool:
            try:
                return httpx.get(f"{self.env['E2B_API_URL']}/health", timeout=2).status_code < 500
            except httpx.TransportError:
                return False

        poll(healthy, what="berth up to answer /health")
        os.environ.update(self.env)

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None and self.env:
            kill_sandboxes(self.env)
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def kill_sandboxes(env: dict[str, str]) -> None:
    headers = {"X-API-Key": env["E2B_API_KEY"]}
    try:
        listed = httpx.get(f"{env['E2B_API_URL']}/v2/sandboxes", headers=headers, params={"limit": 100}, timeout=30)
        for sandbox in listed.json() if listed.status_code == 200 else []:
            httpx.delete(f"{env['E2B_API_URL']}/sandboxes/{sandbox['sandboxID']}", headers=headers, timeout=60)
    except httpx.TransportError:
        pass


def mounted_under(directory: Path) -> list[str]:
    prefix = str(directory.resolve())
    points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    return [p for p in points if p == prefix or p.startswith(prefix + "/")]


@pytest.fixture(scope="session")
def internet() -> Iterator[FakeInternet]:
    if os.geteuid() != 0:
        pytest.exit("berth up runs sandboxes: run the suite as root", returncode=2)
    hosts = FakeInternet(block=202, git=True)
    try:
        # The repositories the tests name: the echo server under two names, and one
        # whose server cannot start.
        for repo in ("echo", "other"):
            hosts.add_git_repository("acme", repo, {"server.py": ECHO_SERVER, "README.md": f"acme/{repo}\n"})
        hosts.add_git_repository("acme", "broken", {"README.md": "no server here\n"})
        yield hosts
    finally:
        hosts.stop()


@pytest.fixture(scope="session")
def berth(request: pytest.FixtureRequest, internet: FakeInternet) -> Iterator[Berth]:
    for binary in (berth_binary(), gateway_binary()):
        if not os.access(binary, os.X_OK):
            pytest.exit(f"{binary} is missing: run scripts/test.sh's build steps, or set BERTH_BIN / "
                        "BERTH_MCP_GATEWAY_BIN (crates/mcp-gateway/build-static.sh)", returncode=2)
    state_dir = Path(tempfile.mkdtemp(prefix="berth-mcpgw-state-"))
    log_dir = Path(tempfile.mkdtemp(prefix="berth-mcpgw-log-"))
    import_base(state_dir)
    instance = Berth(state_dir, internet, log_dir / "berth.log")
    started = False
    try:
        instance.provision()
        instance.start()
        started = True
        yield instance
    finally:
        instance.stop()
        leftover = mounted_under(state_dir)
        if leftover:
            print(f"\nleaving {state_dir}: still mounted inside: {leftover[:5]}")
        else:
            shutil.rmtree(state_dir, ignore_errors=True)
        if request.session.testsfailed or not started:
            print(f"\nberth's log is kept at {instance.log_path}")
        else:
            shutil.rmtree(log_dir, ignore_errors=True)

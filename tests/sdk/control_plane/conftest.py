"""Fixtures for the control-plane conformance suite.

The suite starts the real `berth up` on a free loopback port with a fresh state
directory, reads the `E2B_API_URL=` and `E2B_SANDBOX_URL=` lines it prints, makes an
API key with `berth keys create` (`berth up` prints its first key only to a terminal,
never into a pipe or log), exports exactly those three variables, and drives it with the official Python
SDK (`e2b==2.63.0`) and plain HTTP. At the end every sandbox the suite's keys can see
is killed through the API and `berth up` is stopped by PID.

Binary: `BERTH_BIN` if set, else `cargo build -p berth -p berth-envd -p berth-runtime
--bins` into `$CARGO_TARGET_DIR` (default `<repo>/target`): `berth up` runs the
`berth-envd` and `berth-launch` binaries found beside its own.

Templates: the state directory's `templates/` is a symlink to the shared template store
(`BERTH_TEMPLATES_DIR`, default `/var/lib/berth/templates`) when that exists, so the
base template is not rebuilt for every run.

Run from this directory (its pytest.ini keeps the envd suite's conftest out):

    cd tests/sdk/control_plane && ../../../.venv/bin/pytest
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Optional

import httpx
import pytest

from internet import FakeInternet

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from sandbox_pool import free_sandbox_pool  # noqa: E402

if TYPE_CHECKING:
    from e2b import Sandbox

# Everything the SDK may pick up besides the three variables under test.
for _var in ("E2B_DEBUG", "E2B_DOMAIN", "E2B_ACCESS_TOKEN", "E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY"):
    os.environ.pop(_var, None)

REPO_ROOT = Path(__file__).resolve().parents[3]
STARTUP_TIMEOUT_S = float(os.environ.get("BERTH_STARTUP_TIMEOUT", "900"))
STOP_TIMEOUT_S = 60.0
E2B_LINE = re.compile(r"^\s*(?:export\s+)?(E2B_API_URL|E2B_SANDBOX_URL|E2B_API_KEY)=(\S+)\s*$")
KEY_SHAPE = re.compile(r"e2b_[0-9a-f]+")


def target_dir() -> Path:
    configured = os.environ.get("CARGO_TARGET_DIR")
    if configured:
        path = Path(configured)
        return path if path.is_absolute() else REPO_ROOT / path
    return REPO_ROOT / "target"


def berth_binary() -> Path:
    configured = os.environ.get("BERTH_BIN")
    if configured:
        binary = Path(configured)
        if not os.access(binary, os.X_OK):
            pytest.exit(f"BERTH_BIN={binary} is not an executable file", returncode=2)
        return binary
    # `berth up` runs envd and the launcher from beside its own binary.
    build = subprocess.run(
        ["cargo", "build", "-p", "berth", "-p", "berth-envd", "-p", "berth-runtime", "--bins"],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    if build.returncode != 0:
        pytest.exit(f"cargo build of berth, berth-envd, berth-launch failed:\n{build.stdout[-6000:]}", returncode=2)
    return target_dir() / "debug" / "berth"


def log_root() -> Optional[str]:
    """Where `berth up` logs are made: `BERTH_TEST_LOG_DIR` when set (scripts/test.sh
    points it at a directory per suite, and keeps what a failed suite left there as a CI
    artifact), else the system's temp dir. A log is removed when its tests pass."""
    root = os.environ.get("BERTH_TEST_LOG_DIR")
    if root:
        os.makedirs(root, exist_ok=True)
    return root or None


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def poll(predicate: Callable[[], bool], timeout: float = 60.0, interval: float = 0.1, what: str = "condition") -> None:
    """Poll until `predicate()` holds; fail after `timeout` s (a bound, never a measurement)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)



def sandbox_network_env() -> dict[str, str]:
    """Network flags for one `berth up` under test: a sandbox pool of its own and an
    egress ceiling admitting only the benchmarking range tests place their fake
    internet hosts in (ENVIRONMENT.md's network rule)."""
    return {
        "BERTH_SANDBOX_CIDR": free_sandbox_pool(),
        "BERTH_EGRESS_ALLOW": os.environ.get("BERTH_EGRESS_ALLOW", "198.18.0.0/15"),
    }


@dataclass
class Berth:
    """A running `berth up` and what it printed."""

    binary: Path
    state_dir: Path
    listen: str
    log_path: Path
    process: Optional[subprocess.Popen] = None
    env: dict[str, str] = field(default_factory=dict)
    # Kept across restarts: a restarted daemon must find its sandboxes' pool again.
    network_env: dict[str, str] = field(default_factory=lambda: sandbox_network_env())
    # The state's Postgres URL (`--database`); None: SQLite in the state dir.
    database_url: Optional[str] = None
    _reader: Optional[threading.Thread] = None

    @property
    def api_url(self) -> str:
        return self.env["E2B_API_URL"]

    @property
    def sandbox_url(self) -> str:
        return self.env["E2B_SANDBOX_URL"]

    @property
    def api_key(self) -> str:
        return self.env["E2B_API_KEY"]

    def log_tail(self, size: int = 8000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-size:]
        except OSError:
            return "<no log>"

    def start(self) -> None:
        """Start `berth up`; wait for its E2B_* lines and for it to answer.

        stdout is a pipe, so no key is printed: the first start makes one with `berth
        keys create`; a restart keeps it.
        """
        found: dict[str, str] = {}
        required = {"E2B_API_URL", "E2B_SANDBOX_URL"}
        ready = threading.Event()
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [
                str(self.binary), "up", "--listen", self.listen, "--state-dir", str(self.state_dir),
                # The suite's webhook receivers listen on loopback, which berth refuses by default.
                "--webhook-allow", "127.0.0.1/32",
                *(["--database", self.database_url] if self.database_url else []),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            start_new_session=True,
            env={
                **os.environ,
                "RUST_LOG": os.environ.get("RUST_LOG", "info"),
                # The CRIU `berth provision` set up for the machine, not one per test run.
                "BERTH_CRIU_STATE_DIR": os.environ.get("BERTH_CRIU_STATE_DIR", "/var/lib/berth"),
                **self.network_env,
                # Small volumes, so the volume-full test fills one quickly.
                "BERTH_VOLUME_SIZE_MB": os.environ.get("BERTH_VOLUME_SIZE_MB", "128"),
            },
        )
        process = self.process

        def read_stdout() -> None:
            assert process.stdout is not None
            for raw in process.stdout:
                log.write(raw)
                log.flush()
                match = E2B_LINE.match(raw.decode(errors="replace"))
                if match:
                    found[match.group(1)] = match.group(2)
                    if required <= found.keys():
                        ready.set()
            log.close()
            ready.set()

        self._reader = threading.Thread(target=read_stdout, daemon=True)
        self._reader.start()
        if not ready.wait(STARTUP_TIMEOUT_S) or not required <= found.keys():
            self.stop()
            pytest.exit(
                f"berth up did not print {sorted(required)} (got {sorted(found)}, "
                f"exit code {process.poll()}):\n{self.log_tail()}",
                returncode=2,
            )
        assert "E2B_API_KEY" not in found, "berth up printed an API key into a pipe"
        self.env = {**self.env, **found}
        if "E2B_API_KEY" not in self.env:
            self.env["E2B_API_KEY"] = self.create_key("default")

        def healthy() -> bool:
            try:
                return httpx.get(f"{self.api_url}/health", timeout=2.0).status_code < 500
            except httpx.TransportError:
                return False

        poll(healthy, timeout=60, what="berth up to answer /health")
        os.environ.update(self.env)

    def stop(self) -> Optional[int]:
        """SIGTERM by PID, SIGKILL if it does not exit in time; returns the exit code."""
        process = self.process
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._reader is not None:
            self._reader.join(10)
        self.process = None
        return process.returncode

    def restart(self) -> None:
        self.stop()
        self.start()

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        """Runs `berth <args> --state-dir DIR` against this instance's state (its
        database named by BERTH_DATABASE_URL when it has one)."""
        env = {**os.environ}
        env.pop("BERTH_DATABASE_URL", None)
        if self.database_url:
            env["BERTH_DATABASE_URL"] = self.database_url
        return subprocess.run(
            [str(self.binary), *args, "--state-dir", str(self.state_dir)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            env=env,
        )

    def create_key(self, team: str) -> str:
        result = self.cli("keys", "create", "--team", team)
        assert result.returncode == 0, f"berth keys create failed: {result.stderr}"
        lines = [line.strip() for line in result.stdout.splitlines() if line.strip()]
        assert lines, "berth keys create printed nothing"
        key = lines[-1].split("=")[-1]
        assert KEY_SHAPE.fullmatch(key), f"unexpected key line {lines[-1]!r}"
        return key


def kill_all_sandboxes(api_url: str, api_key: str) -> None:
    """Kills every sandbox the key can see (cleanup; errors are ignored)."""
    headers = {"X-API-Key": api_key}
    for _ in range(20):
        try:
            listed = httpx.get(f"{api_url}/v2/sandboxes", headers=headers, params={"limit": 100}, timeout=30)
        except httpx.TransportError:
            return
        if listed.status_code != 200 or not listed.json():
            return
        for sandbox in listed.json():
            try:
                httpx.delete(f"{api_url}/sandboxes/{sandbox['sandboxID']}", headers=headers, timeout=30)
            except httpx.TransportError:
                pass


def mounts_under(directory: Path) -> list[str]:
    """Mount points at or below `directory` (from /proc/self/mountinfo)."""
    prefix = str(directory.resolve())
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mount_point = line.split()[4].replace("\\040", " ")
        if mount_point == prefix or mount_point.startswith(prefix + "/"):
            found.append(mount_point)
    return found


def remove_state_dir(state_dir: Path) -> None:
    """Removes the state dir unless something is still mounted inside it (a sandbox that
    outlived `berth up`): deleting through a mount could reach beyond the test's files."""
    leftover = mounts_under(state_dir)
    if leftover:
        print(f"\nleaving {state_dir}: still mounted inside: {leftover[:5]}")
        return
    shutil.rmtree(state_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def internet() -> Iterator[FakeInternet]:
    """The session's fake internet (see internet.py); `berth up` resolves through its
    DNS server and its egress ceiling admits exactly its hosts."""
    if os.geteuid() != 0:
        pytest.exit("berth up runs sandboxes: run the suite as root", returncode=2)
    hosts = FakeInternet(block=200)
    try:
        yield hosts
    finally:
        hosts.stop()


@pytest.fixture(scope="session")
def berth(request: pytest.FixtureRequest, internet: FakeInternet) -> Iterator[Berth]:
    binary = berth_binary()
    state_dir = Path(tempfile.mkdtemp(prefix="berth-cp-state-"))
    templates = Path(os.environ.get("BERTH_TEMPLATES_DIR", "/var/lib/berth/templates"))
    if templates.is_dir():
        (state_dir / "templates").symlink_to(templates)
    log_dir = Path(tempfile.mkdtemp(prefix="berth-cp-log-", dir=log_root()))
    instance = Berth(
        binary=binary,
        state_dir=state_dir,
        listen=f"127.0.0.1:{free_loopback_port()}",
        log_path=log_dir / "berth-up.log",
        network_env={
            **sandbox_network_env(),
            "BERTH_EGRESS_ALLOW": internet.ceiling,
            "BERTH_DNS_UPSTREAM": f"{internet.dns_ip}:53",
            # The egress proxy verifies rule domains' servers: the fake internet's CA.
            "BERTH_EGRESS_EXTRA_ROOTS": str(internet.ca_file),
        },
    )
    try:
        instance.start()
        yield instance
    finally:
        if instance.process is not None and instance.process.poll() is None and instance.env:
            for key in [instance.api_key, *_issued_keys]:
                kill_all_sandboxes(instance.api_url, key)
        code = instance.stop()
        remove_state_dir(state_dir)
        if request.session.testsfailed or not instance.env:
            print(f"\nberth up exited with {code}; its log is kept at {instance.log_path}")
        else:
            shutil.rmtree(log_dir, ignore_errors=True)


# Keys issued during the session, cleaned up (their sandboxes killed) at the end.
_issued_keys: list[str] = []


@pytest.fixture(scope="session")
def other_team_key(berth: Berth) -> str:
    """A key of a second team, `other`."""
    key = berth.create_key("other")
    _issued_keys.append(key)
    return key


@pytest.fixture(scope="session")
def api(berth: Berth) -> Iterator[httpx.Client]:
    """Raw HTTP client on the API with the default team's key."""
    with httpx.Client(base_url=berth.api_url, headers={"X-API-Key": berth.api_key}, timeout=120) as client:
        yield client


@pytest.fixture
def sandbox(berth: Berth) -> Iterator[Sandbox]:
    """A fresh base sandbox, killed after the test."""
    from e2b import Sandbox

    created = Sandbox.create(timeout=600)
    try:
        yield created
    finally:
        try:
            created.kill()
        except Exception:  # already gone is fine for cleanup
            pass


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that restart `berth up` run last so no other test sees the restart."""
    items.sort(key=lambda item: item.get_closest_marker("restarts_berth") is not None)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "restarts_berth: the test restarts the session's berth up")

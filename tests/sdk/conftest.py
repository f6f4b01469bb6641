"""Fixtures for the SDK acceptance suite.

The suite drives the real `berth-envd` binary with the official Python SDK in its debug
mode: `E2B_DEBUG=true` makes the SDK skip the REST API and talk to envd at
`localhost:49983`, so exactly one envd serves the whole session and the tests run
serially. The machine itself is the "sandbox": the tests run as root and check their
effects (files, owners, xattrs) directly on disk.

Binary: `BERTH_ENVD_BIN` if set, else `cargo build -p berth-envd` into
`$CARGO_TARGET_DIR` (default `<repo>/target`) and `<target>/debug/berth-envd`.
"""

from __future__ import annotations

import base64
import ctypes
import grp
import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import httpx
import pytest

# The SDK reads these when a Sandbox is created; set them before anything imports it.
os.environ["E2B_DEBUG"] = "true"
for _var in ("E2B_SANDBOX_URL", "E2B_API_URL", "E2B_DOMAIN", "E2B_ACCESS_TOKEN"):
    os.environ.pop(_var, None)
os.environ.setdefault("E2B_API_KEY", "e2b_" + "0" * 40)

REPO_ROOT = Path(__file__).resolve().parents[2]
PR_SET_PDEATHSIG = 1


def _interrupt_on_sigterm(signum: int, frame: object) -> None:
    # `timeout`, CI cancellation: unwind like Ctrl-C so fixtures tear down (envd, user).
    raise KeyboardInterrupt(f"signal {signum}")


signal.signal(signal.SIGTERM, _interrupt_on_sigterm)


def _die_with_parent() -> None:
    """In the envd child: be SIGKILLed if pytest itself dies without tearing down."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
ENVD_HOST = "127.0.0.1"
ENVD_PORT = 49983
ENVD_URL = f"http://{ENVD_HOST}:{ENVD_PORT}"
STARTUP_TIMEOUT_S = 60.0


def _target_dir() -> Path:
    configured = os.environ.get("CARGO_TARGET_DIR")
    if configured:
        path = Path(configured)
        return path if path.is_absolute() else REPO_ROOT / path
    return REPO_ROOT / "target"


def _envd_binary() -> Path:
    configured = os.environ.get("BERTH_ENVD_BIN")
    if configured:
        binary = Path(configured)
        if not os.access(binary, os.X_OK):
            pytest.exit(f"BERTH_ENVD_BIN={binary} is not an executable file", returncode=2)
        return binary
    build = subprocess.run(
        ["cargo", "build", "-p", "berth-envd", "--bin", "berth-envd"],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    if build.returncode != 0:
        pytest.exit(f"cargo build -p berth-envd failed:\n{build.stdout[-6000:]}", returncode=2)
    return _target_dir() / "debug" / "berth-envd"


def _port_answers() -> bool:
    try:
        httpx.get(f"{ENVD_URL}/health", timeout=1.0)
        return True
    except httpx.TransportError:
        return False


def kill_processes_of_uid(uid: int) -> None:
    """SIGKILL, by pid, every process whose real uid is `uid` (only the test user's)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            status = (proc / "status").read_text()
        except OSError:
            continue
        match = re.search(r"^Uid:\s+(\d+)", status, re.MULTILINE)
        if match and int(match.group(1)) == uid:
            try:
                os.kill(int(proc.name), signal.SIGKILL)
            except ProcessLookupError:
                pass


@dataclass
class TestUser:
    """An OS user created for the session (envd reads /etc/passwd itself)."""

    name: str
    uid: int
    gid: int
    home: Path
    extra_group: str
    extra_gid: int

    def basic_auth(self) -> dict[str, str]:
        token = base64.b64encode(f"{self.name}:".encode()).decode()
        return {"Authorization": f"Basic {token}"}


@pytest.fixture(scope="session")
def test_user() -> Iterator[TestUser]:
    """A fresh user with a home dir and one supplementary group; removed at the end.

    Created before envd starts, the way a template's users exist before its envd.
    """
    if os.geteuid() != 0:
        pytest.exit("the SDK suite runs as root (it creates an OS user)", returncode=2)
    suffix = secrets.token_hex(3)
    name = f"berthsdk{suffix}"
    extra_group = f"berthsdkg{suffix}"
    # Outside pytest's root-only (0700) temp tree, so the user can reach its home.
    base = Path(tempfile.mkdtemp(prefix="berth-sdk-users-"))
    base.chmod(0o755)
    home = base / name
    subprocess.run(["groupadd", extra_group], check=True)
    try:
        subprocess.run(
            ["useradd", "--create-home", "--home-dir", str(home), "--shell", "/bin/bash",
             "--user-group", "--groups", extra_group, name],
            check=True,
        )
        entry = pwd.getpwnam(name)
        try:
            yield TestUser(
                name=name,
                uid=entry.pw_uid,
                gid=entry.pw_gid,
                home=home,
                extra_group=extra_group,
                extra_gid=grp.getgrnam(extra_group).gr_gid,
            )
        finally:
            # Processes a test left behind as this user would block userdel.
            kill_processes_of_uid(entry.pw_uid)
            subprocess.run(["userdel", "--remove", name], check=False, stderr=subprocess.DEVNULL)
    finally:
        subprocess.run(["groupdel", extra_group], check=False, stderr=subprocess.DEVNULL)
        shutil.rmtree(base, ignore_errors=True)


@dataclass
class EnvdProcess:
    pid: int
    url: str
    workdir: Path
    log_path: Path

    def log_tail(self, size: int = 8000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-size:]
        except OSError:
            return "<no log>"


@pytest.fixture(scope="session")
def envd(test_user: TestUser) -> Iterator[EnvdProcess]:
    """One berth-envd on 127.0.0.1:49983 for the whole session, killed by PID at the end."""
    if _port_answers():
        pytest.exit(f"something already listens on {ENVD_URL}; the SDK debug mode needs that port", returncode=2)
    binary = _envd_binary()
    workdir = Path(tempfile.mkdtemp(prefix="berth-envd-sdk-"))
    log_path = workdir / "envd.log"
    env = dict(os.environ)
    env["HOME"] = str(workdir)
    env.setdefault("RUST_LOG", "info")
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [str(binary), "--listen", f"{ENVD_HOST}:{ENVD_PORT}"],
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
    handle = EnvdProcess(pid=process.pid, url=ENVD_URL, workdir=workdir, log_path=log_path)
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if process.poll() is not None:
                pytest.exit(f"berth-envd exited with {process.returncode} during startup:\n{handle.log_tail()}", returncode=2)
            try:
                if httpx.get(f"{ENVD_URL}/health", timeout=2.0).status_code == 204:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.exit(f"berth-envd did not answer /health within {STARTUP_TIMEOUT_S}s:\n{handle.log_tail()}", returncode=2)
            time.sleep(0.05)
        yield handle
        if process.poll() is not None:
            print(f"\nberth-envd died during the session (status {process.returncode}):\n{handle.log_tail()}", file=sys.stderr)
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def sandbox(envd: EnvdProcess):
    from e2b import Sandbox

    return Sandbox.create()


@pytest.fixture()
def scratch(tmp_path: Path) -> Path:
    """A per-test directory for files the test creates through envd (removed by pytest)."""
    return tmp_path


@pytest.fixture()
def user_scratch(test_user: TestUser) -> Iterator[Path]:
    """A per-test directory inside the test user's home, owned by that user."""
    path = test_user.home / f"t-{secrets.token_hex(4)}"
    path.mkdir()
    os.chown(path, test_user.uid, test_user.gid)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def envd_still_alive(request: pytest.FixtureRequest) -> Iterator[None]:
    """After every test that used envd, envd must still be up (nothing crashes it)."""
    yield
    if "envd" not in request.fixturenames:
        return
    handle: EnvdProcess = request.getfixturevalue("envd")
    try:
        status = httpx.get(f"{handle.url}/health", timeout=10.0).status_code
    except httpx.TransportError as error:
        pytest.fail(f"envd stopped answering after this test ({error}):\n{handle.log_tail()}")
    assert status == 204, f"/health answered {status} after this test"

"""Fixtures for the code-interpreter SDK suite.

The official `e2b-code-interpreter` SDK runs unmodified in its debug mode
(`E2B_DEBUG=true`): it skips the REST API and sends the interpreter's requests to
`http://localhost:49999` and envd's to `localhost:49983`. The session starts the real
`berth-interpreter` on 127.0.0.1:49999 with the kernels of the code-interpreter-v1
template (installed on this host by `scripts/interpreter-env.sh`), and the real
`berth-envd` on 127.0.0.1:49983 initialised with sandbox-level env vars, which the
interpreter reads from envd's `/envs` as it does inside a sandbox.

Both ports are fixed by the SDK, so run the suite in a private network namespace
(`tests/interpreter/run.sh` does).

Against real sandboxes: `BERTH_INTERPRETER_EXTERNAL=1` plus the SDK's own variables
(`E2B_API_URL`, `E2B_SANDBOX_URL`, `E2B_API_KEY`) makes the session create one
`code-interpreter-v1` sandbox (with the sandbox env vars below) instead of starting
anything locally.

Binaries: `BERTH_INTERPRETER_BIN` / `BERTH_ENVD_BIN`, else `cargo build` into
`$CARGO_TARGET_DIR` (default `<repo>/target`). Kernels: `BERTH_INTERPRETER_PREFIX`
(default `<repo>/.interpreter-env`).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

EXTERNAL = os.environ.get("BERTH_INTERPRETER_EXTERNAL") == "1"
if not EXTERNAL:
    os.environ["E2B_DEBUG"] = "true"
    for _var in ("E2B_SANDBOX_URL", "E2B_API_URL", "E2B_DOMAIN", "E2B_ACCESS_TOKEN"):
        os.environ.pop(_var, None)
    os.environ.setdefault("E2B_API_KEY", "e2b_" + "0" * 40)

REPO_ROOT = Path(__file__).resolve().parents[2]
INTERPRETER_URL = "http://127.0.0.1:49999"
ENVD_URL = "http://127.0.0.1:49983"
# What berth-envd's /init gives the sandbox: every kernel must see it.
SANDBOX_ENV = {"BERTH_SANDBOX_VAR": "from-the-sandbox", "TEST_ENV_VAR": "supertest"}
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _target_dir() -> Path:
    configured = os.environ.get("CARGO_TARGET_DIR")
    if configured:
        path = Path(configured)
        return path if path.is_absolute() else REPO_ROOT / path
    return REPO_ROOT / "target"


def _binary(env_var: str, package: str, name: str) -> Path:
    configured = os.environ.get(env_var)
    if configured:
        return Path(configured)
    subprocess.run(["cargo", "build", "-q", "-p", package, "--bin", name], cwd=REPO_ROOT, check=True)
    return _target_dir() / "debug" / name


def _wait(url: str, status: int, process: subprocess.Popen, log: Path, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            pytest.exit(f"{url}: process exited with {process.returncode}:\n{log.read_text()[-4000:]}", returncode=2)
        try:
            if httpx.get(url, timeout=2.0).status_code == status:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            pytest.exit(f"{url} not ready within {timeout}s:\n{log.read_text()[-4000:]}", returncode=2)
        time.sleep(0.05)


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.fixture(scope="session")
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="berth-interp-sdk-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def envd(workdir: Path) -> Iterator[str]:
    if EXTERNAL:
        yield ""
        return
    binary = _binary("BERTH_ENVD_BIN", "berth-envd", "berth-envd")
    log = workdir / "envd.log"
    env = dict(os.environ, HOME=str(workdir))
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [str(binary), "--listen", "127.0.0.1:49983"],
            cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=_die_with_parent,
        )
    try:
        _wait(f"{ENVD_URL}/health", 204, process, log)
        httpx.post(f"{ENVD_URL}/init", json={"envVars": SANDBOX_ENV}, timeout=10).raise_for_status()
        yield ENVD_URL
    finally:
        _stop(process)


@pytest.fixture(scope="session")
def interpreter(workdir: Path, envd: str) -> Iterator[Path]:
    """berth-interpreter on :49999; yields the default cwd of its contexts."""
    if EXTERNAL:
        yield Path("/home/user")
        return
    binary = _binary("BERTH_INTERPRETER_BIN", "berth-interpreter", "berth-interpreter")
    prefix = Path(os.environ.get("BERTH_INTERPRETER_PREFIX", REPO_ROOT / ".interpreter-env"))
    jupyter = prefix / "share" / "jupyter"
    if not (jupyter / "kernels" / "python3" / "kernel.json").exists():
        pytest.exit(f"no kernels under {prefix}: run `bash scripts/interpreter-env.sh`", returncode=2)
    cwd = workdir / "home"
    cwd.mkdir()
    log = workdir / "interpreter.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [str(binary), "--listen", "127.0.0.1:49999", "--jupyter-path", str(jupyter),
             "--default-cwd", str(cwd), "--warm", "python,javascript", "--envd-url", envd,
             "--runtime-dir", str(workdir / "runtime")],
            cwd=workdir, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=_die_with_parent,
        )
    try:
        _wait(f"{INTERPRETER_URL}/health", 200, process, log)
        yield cwd
    finally:
        _stop(process)
        if process.returncode not in (0, None):
            print(log.read_text()[-4000:])


@pytest.fixture(scope="session")
def sandbox(interpreter: Path):
    from e2b_code_interpreter import Sandbox

    if not EXTERNAL:
        yield Sandbox.create()
        return
    sandbox = Sandbox.create(envs=SANDBOX_ENV)
    yield sandbox
    sandbox.kill()


@pytest.fixture(scope="session")
def interpreter_endpoint(sandbox) -> tuple[str, dict[str, str]]:
    """Base URL and headers for raw requests to the interpreter."""
    if not EXTERNAL:
        return INTERPRETER_URL, {}
    return sandbox._jupyter_url, {"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "49999"}


@pytest.fixture()
def cwd(interpreter: Path) -> Path:
    return interpreter

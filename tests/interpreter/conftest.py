"""Fixtures for the code-interpreter SDK suite: the official `e2b-code-interpreter` SDK,
unmodified, against `code-interpreter-v1` sandboxes of a real `berth up`.

The session starts `berth up` (berth_env.py: the suite's state dir, where the template
is built once by berth's own build system and then reused; its own sandbox pool; an
egress ceiling admitting only the package registries) and sets the SDK's variables
(`E2B_API_URL`, `E2B_SANDBOX_URL`, `E2B_API_KEY`) from what it printed. One sandbox
(with the sandbox env vars below) serves most tests; pause/resume and fork tests make
their own.

Against another E2B-compatible endpoint (a berth already running, E2B's cloud):
`BERTH_INTERPRETER_EXTERNAL=1` plus the SDK's own variables.

Run as root (berth up runs sandboxes) from this directory:

    cd tests/interpreter && ../../.venv-interpreter/bin/python -m pytest
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import berth_env  # noqa: E402

EXTERNAL = os.environ.get("BERTH_INTERPRETER_EXTERNAL") == "1"
if not EXTERNAL:
    for _var in ("E2B_DEBUG", "E2B_DOMAIN", "E2B_ACCESS_TOKEN", "E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY"):
        os.environ.pop(_var, None)

# What the sandbox is created with: every kernel must see it.
SANDBOX_ENV = {"BERTH_SANDBOX_VAR": "from-the-sandbox", "TEST_ENV_VAR": "supertest"}
# The template's default user's home: the default cwd of its contexts.
HOME = Path("/home/user")


@pytest.fixture(scope="session")
def berth() -> Iterator[dict[str, str]]:
    """The SDK's environment: of the `berth up` this session started, or the caller's."""
    if EXTERNAL:
        yield {name: os.environ[name] for name in ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY") if name in os.environ}
        return
    if os.geteuid() != 0:
        pytest.exit("berth up runs sandboxes: run the suite as root", returncode=2)
    instance = berth_env.Berth()
    try:
        env = instance.start()
    except (RuntimeError, OSError, SystemExit) as error:
        instance.stop()
        pytest.exit(f"{error}; berth up's log: {instance.log_path}", returncode=2)
    os.environ.update(env)
    try:
        yield env
    finally:
        instance.stop()


@pytest.fixture(scope="session")
def sandbox(berth):
    from e2b_code_interpreter import Sandbox

    sandbox = Sandbox.create(envs=SANDBOX_ENV, timeout=1800)
    yield sandbox
    sandbox.kill()


@pytest.fixture(scope="session")
def interpreter_endpoint(sandbox, berth) -> tuple[str, dict[str, str]]:
    """Base URL and headers for raw requests to the sandbox's interpreter (berth's proxy
    routes by E2B's sandbox headers)."""
    headers = {"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "49999"}
    return os.environ.get("E2B_SANDBOX_URL", sandbox._jupyter_url), headers


@pytest.fixture()
def cwd() -> Path:
    return HOME

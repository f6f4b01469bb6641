"""Fixtures for the operations suite (the `berth` CLI's REST verbs, and later /metrics,
doctor and gc): the control-plane suite's `berth up` (tests/sdk/control_plane/conftest.py:
its own state dir, sandbox address pool, fake internet and egress ceiling), reused as is.

Its `berth` fixture exports E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY, so the CLI
under test (`BERTH_BIN`, else the binary that fixture builds) picks them up like any
E2B client. Run as root from this directory:

    cd tests/ops && ../../.venv/bin/pytest

Needs tests/ops/requirements.txt (prometheus-client's parser) besides the SDK suite's.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import pytest

CONTROL_PLANE = Path(__file__).resolve().parents[1] / "sdk" / "control_plane"
sys.path.insert(0, str(CONTROL_PLANE))  # its conftest imports `internet` from there
_spec = importlib.util.spec_from_file_location("control_plane_conftest", CONTROL_PLANE / "conftest.py")
assert _spec is not None and _spec.loader is not None
control_plane = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = control_plane  # dataclasses look their module up there
_spec.loader.exec_module(control_plane)

# `berth up` serves /metrics on a listener of its own (the fixture passes the
# environment through to it).
METRICS_ADDR = f"127.0.0.1:{control_plane.free_loopback_port()}"
os.environ["BERTH_METRICS_LISTEN"] = METRICS_ADDR
# Its log as JSON lines, so tests can find a request's lines by its id.
os.environ["BERTH_LOG_FORMAT"] = "json"

Berth = control_plane.Berth
poll = control_plane.poll
internet = control_plane.internet
berth = control_plane.berth
api = control_plane.api
other_team_key = control_plane.other_team_key


class Cli:
    """Runs the real `berth` binary's client verbs against the session's `berth up`."""

    def __init__(self, berth: Berth) -> None:
        self.berth = berth

    def run(
        self,
        *args: str,
        input: Optional[str] = None,
        env: Optional[dict[str, str]] = None,
        timeout: float = 300,
    ) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(self.berth.binary), *args],
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            timeout=timeout,
            env={**os.environ, **(env or {})} if env is not None else None,
        )

    def ok(self, *args: str, input: Optional[str] = None) -> subprocess.CompletedProcess:
        result = self.run(*args, input=input)
        assert result.returncode == 0, f"berth {' '.join(args)} exited {result.returncode}:\n{result.stderr}"
        return result

    def json(self, *args: str, input: Optional[str] = None) -> Any:
        # Right after the verb: after `exec … --` every word belongs to the command.
        return json.loads(self.ok(*args[:2], "--json", *args[2:], input=input).stdout)


@pytest.fixture(scope="session")
def cli(berth: Berth) -> Cli:
    return Cli(berth)

"""schemathesis against the OpenAPI document berth serves: no 5xx, no crash.

The one tolerated 5xx is a 501 to a method the document does not list (berth's
deliberate answer for E2B endpoints it does not implement yet); see schemathesis_hooks.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import pytest

from conftest import REPO_ROOT, Berth, _issued_keys, kill_all_sandboxes

# Where berth may serve its document; the first that answers with an OpenAPI object wins.
SCHEMA_PATHS = ["/openapi.json", "/openapi.yaml", "/openapi.yml", "/docs/openapi.json", "/api/openapi.json"]


def served_schema_url(berth: Berth) -> str:
    for path in SCHEMA_PATHS:
        try:
            answer = httpx.get(f"{berth.api_url}{path}", timeout=30)
        except httpx.TransportError:
            continue
        if answer.status_code == 200 and "openapi" in answer.text[:2000]:
            return f"{berth.api_url}{path}"
    pytest.fail(f"berth serves no OpenAPI document at any of {SCHEMA_PATHS}")


def schemathesis_binary() -> str:
    """$BERTH_SCHEMATHESIS, else <repo>/.venv-schemathesis (see requirements-schemathesis.txt),
    else one beside this Python, else on PATH."""
    candidates = [
        os.environ.get("BERTH_SCHEMATHESIS", ""),
        str(REPO_ROOT / ".venv-schemathesis" / "bin" / "schemathesis"),
        str(Path(sys.executable).parent / "schemathesis"),
        shutil.which("schemathesis") or "",
    ]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    pytest.fail("schemathesis is not installed: see tests/sdk/control_plane/requirements-schemathesis.txt")


def test_no_server_errors_on_generated_requests(berth: Berth) -> None:
    schema_url = served_schema_url(berth)
    # Its own team, so whatever the fuzzer creates is cleaned up without touching others.
    key = berth.create_key("schemathesis")
    _issued_keys.append(key)
    report_dir = Path(tempfile.mkdtemp(prefix="berth-schemathesis-"))
    try:
        run = subprocess.run(
            [
                schemathesis_binary(), "run", schema_url,
                "--url", berth.api_url,
                "--checks", "no_server_error_except_undocumented_501",
                "--header", f"X-API-Key: {key}",
                "--phases", "examples,coverage,fuzzing",
                "--max-examples", os.environ.get("BERTH_SCHEMATHESIS_EXAMPLES", "30"),
                "--seed", "20261129",
                "--workers", "1",
                "--request-timeout", "120",
                "--suppress-health-check", "all",
                "--report", "junit",
                "--report-dir", str(report_dir),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=1800,
            # schemathesis keeps a crash cache in its working directory; a fresh temp dir
            # keeps it out of the repo and makes every run start from the same seed alone.
            cwd=report_dir,
            env={
                **os.environ,
                "NO_COLOR": "1",
                "SCHEMATHESIS_HOOKS": "schemathesis_hooks",
                "PYTHONPATH": str(Path(__file__).resolve().parent),
            },
        )
        assert run.returncode == 0, f"schemathesis found failures:\n{run.stdout[-12000:]}"
    finally:
        kill_all_sandboxes(berth.api_url, key)
        shutil.rmtree(report_dir, ignore_errors=True)
    assert httpx.get(f"{berth.api_url}/health", timeout=30).status_code < 500
    assert berth.process is not None and berth.process.poll() is None, "berth up crashed"

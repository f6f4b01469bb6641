"""The official MCP conformance suite (@modelcontextprotocol/conformance, pinned in
conformance/package.json) against `/mcp` on a real `berth up`.

Runs every active server scenario through conformance/run.mjs (which adds the API key
on a loopback proxy) with conformance/expected-failures.yml as the baseline: the test
fails on a scenario that fails but is not listed, and on a listed one that passes.
Run as its own step of scripts/test.sh; needs BERTH_BIN and `npm ci` in conformance/
(scripts/install-deps.sh).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from berth_up import BerthUp

HERE = Path(__file__).resolve().parent / "conformance"


def test_server_scenarios(tmp_path):
    binary = os.environ.get("BERTH_BIN")
    if not binary:
        pytest.exit("test_conformance.py needs BERTH_BIN (the berth binary)", returncode=2)
    suite = HERE / "node_modules/@modelcontextprotocol/conformance/dist/index.js"
    assert suite.exists(), f"{suite} missing: run scripts/install-deps.sh (npm ci in {HERE})"
    berth = BerthUp(binary)
    try:
        results = tmp_path / "results"
        run = subprocess.run(
            ["node", str(HERE / "run.mjs"), f"{berth.api_url}/mcp", str(results)],
            env={**os.environ, "BERTH_MCP_API_KEY": berth.api_key},
            capture_output=True,
            text=True,
            timeout=1800,
        )
        print(run.stdout)
        print(run.stderr)
        outcomes = {}
        for checks in sorted(results.glob("*/checks.json")):
            statuses = {check["status"] for check in json.loads(checks.read_text())}
            failed = statuses & {"FAILURE", "WARNING"}
            scenario = re.sub(r"^server-|-\d{4}-\d\d-\d\dT[\d-]+Z$", "", checks.parent.name)
            outcomes[scenario] = ",".join(sorted(failed)) if failed else "pass"
        print("scenario outcomes:\n" + "\n".join(f"  {name}: {outcome}" for name, outcome in outcomes.items()))
        assert run.returncode == 0, f"conformance run failed (exit {run.returncode}):\n{run.stdout[-6000:]}\n{run.stderr[-3000:]}"
    finally:
        berth.shutdown()
        berth.remove_state()

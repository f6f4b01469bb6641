"""`berth up --log-format json`: every stderr line is a JSON object; a request's lines
carry its id (a W3C traceparent's trace id when the client sent one), which comes back
in `X-Request-Id`; lines about a sandbox name it."""

from __future__ import annotations

import json
import uuid

import httpx

from conftest import Berth, Cli, poll


def log_lines(berth: Berth) -> list[dict]:
    lines = []
    for raw in berth.log_path.read_text(errors="replace").splitlines():
        if raw.startswith("{"):
            lines.append(json.loads(raw))
    return lines


def test_json_logs_carry_request_and_sandbox_ids(berth: Berth, api: httpx.Client, cli: Cli) -> None:
    trace_id = uuid.uuid4().hex
    created = api.post(
        "/sandboxes",
        json={"templateID": "base", "timeout": 60},
        headers={"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"},
    )
    assert created.status_code == 201, created.text
    assert created.headers["x-request-id"] == trace_id
    sandbox_id = created.json()["sandboxID"]
    try:
        mine = lambda: [line for line in log_lines(berth) if line.get("span", {}).get("request_id") == trace_id]  # noqa: E731
        poll(lambda: bool(mine()), timeout=30, what="a log line of the request")
        for line in mine():
            assert line["span"]["method"] == "POST" and line["span"]["path"] == "/sandboxes"
            assert {"timestamp", "level", "fields"} <= line.keys()
        served = [line for line in mine() if line["fields"].get("message") == "request served"]
        assert served and served[-1]["fields"]["status"] == 201
        # Proxied (envd) requests name their sandbox.
        cli.ok("sandbox", "exec", sandbox_id, "--", "true")
        poll(lambda: any(line.get("span", {}).get("sandbox_id") == sandbox_id for line in log_lines(berth)),
             timeout=30, what="a log line naming the sandbox")
        plain = api.get("/v2/sandboxes", headers={"x-request-id": "ops-check-1"})
        assert plain.headers["x-request-id"] == "ops-check-1"
        assert len(api.get("/v2/sandboxes").headers["x-request-id"]) == 32
    finally:
        api.delete(f"/sandboxes/{sandbox_id}")
    # The fixture's log also holds berth up's stdout (the key it printed): only the log
    # lines proper must not carry it.
    assert all(berth.api_key not in json.dumps(line) for line in log_lines(berth))

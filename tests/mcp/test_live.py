"""End-to-end tests of the MCP server against a live `berth up`.

Needs BERTH_BIN (the berth binary with `up` and `keys`); the run fails loudly without
it. Starts `berth up` on a free loopback port with a fresh state directory (templates
shared from /var/lib/berth/templates when present), connects identities through
`berth-mcp-dev connect` and the connect page, and drives the tools with the official
Python MCP client over stdio and streamable HTTP.

    BERTH_BIN=/path/to/berth CARGO_TARGET_DIR=... pytest tests/mcp/test_live.py
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import anyio
import httpx
import pytest

import seeds
from berth_up import BerthUp, free_port, wait_for
from conftest import server_command, stdio_session

# Every tool output seen in this module; scanned for keys at the end.
OUTPUTS: list[str] = []


@pytest.fixture(scope="module")
def berth():
    binary = os.environ.get("BERTH_BIN")
    if not binary:
        pytest.exit("test_live.py needs BERTH_BIN (the berth binary)", returncode=2)
    instance = BerthUp(binary)
    try:
        yield instance
    finally:
        instance.shutdown()
        # berth up prints its own key once on stdout (E2B_API_KEY=...); nothing else may.
        logs = instance.logs_without_key_lines()
        instance.remove_state()
        for key in instance.keys():
            assert key not in logs, "an API key appeared in the berth up log"
            assert key not in "".join(OUTPUTS), "an API key appeared in a tool output"


@pytest.fixture
def mcp_state(tmp_path):
    return tmp_path


def connect_cli(state_dir: Path, user: str, berth: BerthUp, key: str) -> None:
    command = server_command()
    result = subprocess.run(
        command
        + ["connect", "--state-dir", str(state_dir), "--user", user, "--api-url", berth.api_url,
           "--sandbox-url", berth.sandbox_url],
        input=key,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert key not in result.stdout + result.stderr


def storage_dir(state_dir: Path, session_id: str) -> Path:
    name = hashlib.sha256(session_id.encode()).hexdigest()[:32]
    return state_dir / "mcp" / "sessions" / name / "storage"


async def call(session, name: str, arguments: dict | None = None):
    result = await session.call_tool(name, arguments or {})
    text = "".join(getattr(block, "text", "") for block in result.content)
    OUTPUTS.append(text + json.dumps(result.structured_content))
    return result


def scan_server_logs(state_dir: Path, keys: list[str]) -> None:
    for log in state_dir.glob("stderr-*.log"):
        content = log.read_text(errors="replace")
        for key in keys:
            assert key not in content, f"key leaked into {log.name}"


def test_connection_required_then_connect_page(berth, mcp_state):
    """No connection → structured result with a one-time link; the page validates keys."""
    port = free_port()
    public_url = f"http://127.0.0.1:{port}"
    http_server = subprocess.Popen(
        server_command()
        + ["http", "--state-dir", str(mcp_state), "--listen", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=open(mcp_state / "stderr-http.log", "ab"),
    )
    try:
        wait_for(lambda: _answers(public_url), 60, "the MCP HTTP server")

        async def run():
            async with stdio_session(mcp_state, "--public-url", public_url) as session:
                for tool in ("e2b_create_sandbox", "e2b_list_sandboxes", "e2b_list_volumes"):
                    result = await call(session, tool)
                    assert result.is_error
                    assert result.structured_content["connection_required"] is True
                    link = result.structured_content["connect_url"]
                    assert link.startswith(f"{public_url}/mcp/connect/")
                return link

        link = anyio.run(run)
        page = httpx.get(link)
        assert page.status_code == 200 and "api_key" in page.text
        bad = httpx.post(link, data={"api_url": berth.api_url, "api_key": "e2b_00000bad"})
        assert bad.status_code == 400
        assert "e2b_00000bad" not in bad.text
        good = httpx.post(
            link,
            data={"api_url": berth.api_url, "api_key": berth.api_key, "sandbox_url": berth.sandbox_url},
        )
        assert good.status_code == 200, good.text
        assert berth.api_key not in good.text
        reused = httpx.post(link, data={"api_url": berth.api_url, "api_key": berth.api_key})
        assert reused.status_code == 404

        async def connected():
            async with stdio_session(mcp_state, "--public-url", public_url) as session:
                result = await call(session, "e2b_list_volumes")
                assert "connection_required" not in (result.structured_content or {})

        anyio.run(connected)
    finally:
        http_server.terminate()
        http_server.wait(30)
    scan_server_logs(mcp_state, [berth.api_key])


def _answers(url: str) -> bool:
    try:
        httpx.get(f"{url}/mcp/connect/none", timeout=2)
        return True
    except httpx.TransportError:
        return False


def test_session_tools_end_to_end(berth, mcp_state):
    connect_cli(mcp_state, "alice", berth, berth.api_key)
    session_id = "live-session-1"
    storage = storage_dir(mcp_state, session_id)
    storage.mkdir(parents=True)
    (storage / "input.txt").write_text("from session storage\n")

    async def run():
        async with stdio_session(mcp_state, "--toolset", "session", "--session", session_id) as s:
            created = await call(
                s,
                "e2b_create_sandbox",
                {
                    "title": "live test",
                    "env_vars": {"GREETING": "hello"},
                    "upload_files": [{"session_path": "input.txt", "sandbox_path": "/home/user/input.txt"}],
                },
            )
            assert not created.is_error, created.structured_content
            info = created.structured_content
            assert set(info) == {"sandbox_id", "status", "template", "workspace_path", "timeout_seconds", "files_uploaded"}
            assert info["template"] == "base" and info["timeout_seconds"] == 3600
            assert info["files_uploaded"] == 1
            sandbox_id = info["sandbox_id"]

            details = httpx.get(f"{berth.api_url}/sandboxes/{sandbox_id}", headers={"X-API-Key": berth.api_key}).json()
            assert details["metadata"]["berth.session_id"] == session_id
            assert details["metadata"]["berth.title"] == "live test"

            ran = await call(s, "e2b_exec", {"sandbox_id": sandbox_id, "command": "cat input.txt; echo $GREETING; pwd; echo oops >&2; exit 3"})
            out = ran.structured_content
            assert out["stdout"] == "from session storage\nhello\n/home/user\n"
            assert out["stderr"] == "oops\n"
            assert out["exit_code"] == 3 and out["success"] is False
            assert out["truncated"] is False and out["total_lines"] == 4
            assert out["cwd"] == "/home/user"

            long = await call(s, "e2b_exec", {"sandbox_id": sandbox_id, "command": "seq 1 5000", "cwd": "/tmp"})
            out = long.structured_content
            assert out["truncated"] is True and out["total_lines"] == 5000
            assert "output truncated" in out["stdout"] and out["cwd"] == "/tmp"

            slow = await call(s, "e2b_exec", {"sandbox_id": sandbox_id, "command": "sleep 5; echo done", "timeout_ms": 500})
            out = slow.structured_content
            assert out["success"] is False and out["stdout"] == ""
            assert out["error"].startswith("deadline_exceeded")

            missing = await call(s, "e2b_read_file", {"sandbox_id": sandbox_id, "path": "/nonexistent"})
            assert missing.is_error and missing.structured_content["error"]["status"] == 404

            written = await call(s, "e2b_write_file", {"sandbox_id": sandbox_id, "path": "/home/user/lines.txt", "content": "a\nb\nc\nd\n"})
            assert written.structured_content == {"sandbox_id": sandbox_id, "path": "/home/user/lines.txt", "success": True}
            window = await call(s, "e2b_read_file", {"sandbox_id": sandbox_id, "path": "/home/user/lines.txt", "offset": 1, "limit": 2})
            assert window.structured_content["content"] == "b\nc\n"
            whole = await call(s, "e2b_read_file", {"sandbox_id": sandbox_id, "path": "/home/user/lines.txt"})
            assert whole.structured_content["content"] == "a\nb\nc\nd\n"

            listed = await call(s, "e2b_list_sandboxes")
            assert listed.structured_content["count"] == 1
            assert listed.structured_content["sandboxes"][0]["sandbox_id"] == sandbox_id

            paused = await call(s, "e2b_manage_sandbox", {"sandbox_id": sandbox_id, "action": "pause"})
            if paused.is_error:
                # Where the API does not pause yet, its own error must come through unchanged.
                direct = httpx.post(f"{berth.api_url}/sandboxes/{sandbox_id}/pause", headers={"X-API-Key": berth.api_key})
                assert paused.structured_content["error"] == {"status": direct.status_code, "body": direct.json()}
                print(f"\npause/resume: API answered {direct.status_code} {direct.json()}")
            else:
                assert paused.structured_content == {"sandbox_id": sandbox_id, "action": "pause", "success": True}
                resumed = await call(s, "e2b_manage_sandbox", {"sandbox_id": sandbox_id, "action": "resume", "timeout_seconds": 600})
                assert resumed.structured_content == {"sandbox_id": sandbox_id, "action": "resume", "success": True}
                again = await call(s, "e2b_exec", {"sandbox_id": sandbox_id, "command": "cat /home/user/lines.txt"})
                assert again.structured_content["stdout"] == "a\nb\nc\nd\n"
            deleted = await call(s, "e2b_manage_sandbox", {"sandbox_id": sandbox_id, "action": "delete"})
            assert deleted.structured_content == {"sandbox_id": sandbox_id, "action": "delete", "success": True}
            listed = await call(s, "e2b_list_sandboxes")
            assert listed.structured_content["count"] == 0

    anyio.run(run)
    scan_server_logs(mcp_state, [berth.api_key])


def test_identities_are_isolated_and_ended_sessions_are_swept(berth, mcp_state):
    bob_key = berth.create_key("bob-team")
    connect_cli(mcp_state, "alice", berth, berth.api_key)
    connect_cli(mcp_state, "bob", berth, bob_key)

    async def alice_creates():
        async with stdio_session(mcp_state, "--toolset", "session", user="alice") as s:
            created = await call(s, "e2b_create_sandbox", {"title": "forgotten"})
            assert not created.is_error, created.structured_content
            sandbox_id = created.structured_content["sandbox_id"]

            async with stdio_session(mcp_state, "--toolset", "session", user="bob") as bob:
                listed = await call(bob, "e2b_list_sandboxes")
                assert listed.structured_content["count"] == 0
                denied = await call(bob, "e2b_exec", {"sandbox_id": sandbox_id, "command": "true"})
                assert denied.is_error
            return sandbox_id

    sandbox_id = anyio.run(alice_creates)
    # The session ended when the client closed stdin: its lease expired and the server
    # released the sandbox before exiting.
    gone = httpx.get(f"{berth.api_url}/sandboxes/{sandbox_id}", headers={"X-API-Key": berth.api_key})
    assert gone.status_code == 404, gone.text
    scan_server_logs(mcp_state, [berth.api_key, bob_key])


# Arguments per connector tool for a live call; ids that do not exist make the API
# answer with its own error, which must come through unchanged.
def connector_arguments(sandbox_id: str) -> dict[str, dict]:
    return {
        "e2b_get_sandbox": {"sandbox_id": sandbox_id},
        "e2b_get_sandbox_logs": {"sandbox_id": sandbox_id},
        "e2b_get_sandbox_metrics": {"sandbox_id": sandbox_id},
        "e2b_get_secret": {"secret_id": "mcp_live_secret"},
        "e2b_get_team_max_metric": {"metric": "concurrent_sandboxes", "team_id": "unknown-team"},
        "e2b_get_team_metrics": {"team_id": "unknown-team"},
        "e2b_get_template": {"template_id": "base"},
        "e2b_get_template_build_logs": {"template_id": "base", "build_id": "00000000-0000-0000-0000-000000000000"},
        "e2b_get_template_build_status": {"template_id": "base", "build_id": "00000000-0000-0000-0000-000000000000"},
        "e2b_get_template_by_alias": {"alias": "base"},
        "e2b_get_volume": {"volume_id": "00000000-0000-0000-0000-000000000000"},
        "e2b_list_events": {},
        "e2b_list_sandbox_events": {"sandbox_id": sandbox_id},
        "e2b_list_sandbox_metrics": {"sandbox_ids": sandbox_id},
        "e2b_list_sandboxes": {"state": "running"},
        "e2b_list_secrets": {},
        "e2b_list_snapshots": {},
        "e2b_list_template_tags": {"template_id": "base"},
        "e2b_list_templates": {},
        "e2b_list_volumes": {},
        "e2b_assign_template_tags": {"target": "base:nonexistent-tag", "tags": ["mcp-live"]},
        "e2b_connect_sandbox": {"sandbox_id": sandbox_id, "timeout": 600},
        "e2b_create_sandbox": {"template_id": "base", "timeout": 120, "allow_internet_access": False},
        "e2b_create_secret": {"name": "mcp_live_secret", "value": "s3cr3t-value"},
        "e2b_create_snapshot": {"sandbox_id": sandbox_id, "name": "mcp-live-snapshot"},
        "e2b_create_volume": {"name": "mcp-live-volume"},
        "e2b_fork_sandbox": {"sandbox_id": sandbox_id, "count": 1, "timeout": 120},
        "e2b_pause_sandbox": {"sandbox_id": "inotexisting0000000000"},
        "e2b_refresh_sandbox": {"sandbox_id": sandbox_id, "duration": 300},
        "e2b_set_sandbox_timeout": {"sandbox_id": sandbox_id, "timeout": 900},
        "e2b_update_sandbox_network": {"sandbox_id": sandbox_id, "deny_out": ["0.0.0.0/0"]},
        "e2b_update_secret": {"secret_id": "mcp_live_secret", "value": "n3w-value"},
        "e2b_update_template": {"template_id": "inotexistingtemplate", "public": False},
        "e2b_delete_secret": {"secret_id": "mcp_live_secret"},
        "e2b_delete_template": {"template_id": "inotexistingtemplate"},
        "e2b_delete_template_tags": {"name": "inotexistingtemplate", "tags": ["v1"]},
        "e2b_delete_volume": {"volume_id": "00000000-0000-0000-0000-000000000000"},
        "e2b_kill_sandbox": {"sandbox_id": sandbox_id},
    }


def test_every_connector_tool_against_the_live_api(berth, mcp_state):
    """Each tool either succeeds with a 2xx from the API or returns the API's error,
    which must equal what the same REST request returns when sent directly."""
    connect_cli(mcp_state, "alice", berth, berth.api_key)
    headers = {"X-API-Key": berth.api_key}
    created = httpx.post(f"{berth.api_url}/sandboxes", headers=headers, json={"templateID": "base", "timeout": 600}, timeout=120)
    assert created.status_code == 201, created.text
    sandbox_id = created.json()["sandboxID"]
    arguments = connector_arguments(sandbox_id)
    assert sorted(arguments) == sorted(t.name for t in seeds.connector_tools())
    table = {t["name"]: t for t in json.loads((Path(__file__).resolve().parents[2] / "crates/mcp/data/connector_tools.json").read_text())["tools"]}
    outcomes = {}

    async def run():
        async with stdio_session(mcp_state, "--toolset", "connector") as s:
            for seed_tool in seeds.connector_tools():
                name = seed_tool.name
                result = await call(s, name, arguments[name])
                content = result.structured_content
                assert "connection_required" not in content
                if result.is_error:
                    error = content["error"]
                    assert "status" in error, (name, content)
                    direct = replay(berth, table[name], arguments[name])
                    assert error["status"] == direct.status_code, (name, error, direct.text)
                    if direct.content:
                        assert error["body"] == direct.json(), (name, error, direct.text)
                    outcomes[name] = f"API error {error['status']}"
                else:
                    assert 200 <= content["status"] < 300, (name, content)
                    outcomes[name] = f"ok {content['status']}"
                    if name == "e2b_create_sandbox":
                        extra = content["result"]["sandboxID"]
                        detail = httpx.get(f"{berth.api_url}/sandboxes/{extra}", headers=headers).json()
                        assert "berth.session_id" in detail["metadata"]
                        assert detail["allowInternetAccess"] is False, detail
                    if name == "e2b_update_sandbox_network":
                        detail = httpx.get(f"{berth.api_url}/sandboxes/{sandbox_id}", headers=headers).json()
                        assert detail["network"]["denyOut"] == ["0.0.0.0/0"], detail
                        httpx.delete(f"{berth.api_url}/sandboxes/{extra}", headers=headers)

    anyio.run(run)
    # Backed by the API now: network policy (create and live update), snapshots, fork.
    for backed in ("e2b_create_sandbox", "e2b_update_sandbox_network", "e2b_create_snapshot", "e2b_fork_sandbox"):
        assert outcomes[backed].startswith("ok"), (backed, outcomes[backed])
    print("\nconnector outcomes:\n" + "\n".join(f"  {k}: {v}" for k, v in sorted(outcomes.items())))
    assert "s3cr3t-value" not in "".join(OUTPUTS) and "n3w-value" not in "".join(OUTPUTS)
    scan_server_logs(mcp_state, [berth.api_key])


def replay(berth: BerthUp, tool: dict, arguments: dict) -> httpx.Response:
    """The REST request a connector tool makes, sent directly (independent of the Rust
    request builder: path, query and body are rebuilt here from the table)."""
    path = tool["path"]
    query: list[tuple[str, str]] = []
    body: dict = {}
    has_body = False
    for param in tool["params"]:
        value = arguments.get(param["name"], param.get("default"))
        if param["in"] == "body":
            has_body = True
        if value is None:
            continue
        if param["in"] == "path":
            path = path.replace("{" + param["name"] + "}", str(value))
        elif param["in"] == "query":
            items = value if isinstance(value, list) else [value]
            for item in items:
                query.append((param["wire"], json.dumps(item) if isinstance(item, bool) else str(item)))
        else:
            target = body
            *parents, leaf = param["wire"].split(".")
            for parent in parents:
                target = target.setdefault(parent, {})
            target[leaf] = value
    return httpx.request(
        tool["method"],
        f"{berth.api_url}{path}",
        params=query,
        json=body if has_body else None,
        headers={"X-API-Key": berth.api_key},
        timeout=120,
    )


def test_streamable_http_lists_and_calls(berth, mcp_state):
    connect_cli(mcp_state, "carol", berth, berth.api_key)
    port = free_port()
    server = subprocess.Popen(
        server_command() + ["http", "--state-dir", str(mcp_state), "--listen", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=open(mcp_state / "stderr-http.log", "ab"),
    )
    try:
        wait_for(lambda: _answers(f"http://127.0.0.1:{port}"), 60, "the MCP HTTP server")

        async def run():
            from mcp import ClientSession
            from mcp.client.streamable_http import streamable_http_client
            import httpx2

            session_ids: list[str] = []

            async def remember_session(response):
                if "mcp-session-id" in response.headers:
                    session_ids.append(response.headers["mcp-session-id"])

            base = f"http://127.0.0.1:{port}"
            async with httpx2.AsyncClient(
                headers={"X-Berth-User": "carol"}, timeout=120, event_hooks={"response": [remember_session]}
            ) as client:
                async with streamable_http_client(f"{base}/mcp", http_client=client) as (read, write):
                    async with ClientSession(read, write) as session:
                        await session.initialize()
                        tools = (await session.list_tools()).tools
                        assert len(tools) == 42
                        assert session_ids, "the server sent no Mcp-Session-Id"
                        upload_url = f"{base}/mcp/sessions/{session_ids[-1]}/storage/data/in.txt"
                        uploaded = httpx.put(upload_url, content=b"uploaded over http\n", headers={"X-Berth-User": "carol"})
                        assert uploaded.status_code == 201, uploaded.text
                        foreign = httpx.put(upload_url, content=b"x", headers={"X-Berth-User": "mallory"})
                        assert foreign.status_code == 404
                        escape = httpx.put(f"{base}/mcp/sessions/{session_ids[-1]}/storage/..%2F..%2Fx", content=b"x", headers={"X-Berth-User": "carol"})
                        assert escape.status_code in (400, 404)
                        created = await call(
                            session,
                            "e2b_create_sandbox",
                            {"title": "over http", "upload_files": [{"session_path": "data/in.txt", "sandbox_path": "/home/user/in.txt"}]},
                        )
                        assert not created.is_error, created.structured_content
                        assert created.structured_content["files_uploaded"] == 1
                        assert created.structured_content["sandbox"]["sandboxID"] == created.structured_content["sandbox_id"]
                        sandbox_id = created.structured_content["sandbox_id"]
                        ran = await call(session, "e2b_exec", {"sandbox_id": sandbox_id, "command": "cat in.txt; echo hi"})
                        assert ran.structured_content["stdout"] == "uploaded over http\nhi\n"
                        deleted = await call(session, "e2b_manage_sandbox", {"sandbox_id": sandbox_id, "action": "delete"})
                        assert deleted.structured_content["success"] is True

        anyio.run(run)
    finally:
        server.terminate()
        server.wait(30)
    scan_server_logs(mcp_state, [berth.api_key])


def start_http_server(state_dir: Path, port: int, *extra: str) -> subprocess.Popen:
    server = subprocess.Popen(
        server_command()
        + ["http", "--state-dir", str(state_dir), "--listen", f"127.0.0.1:{port}", *extra],
        stdout=subprocess.DEVNULL,
        stderr=open(state_dir / "stderr-http.log", "ab"),
    )
    wait_for(lambda: _answers(f"http://127.0.0.1:{port}"), 60, "the MCP HTTP server")
    return server


def test_leases_survive_a_restart_and_expired_ones_are_swept(berth, mcp_state):
    """A sandbox created through a server that then dies (SIGKILL, no cleanup) is released
    by the next server process once its lease runs out."""
    connect_cli(mcp_state, "dave", berth, berth.api_key)
    port = free_port()
    first = start_http_server(mcp_state, port, "--lease-ttl", "2", "--sweep-interval", "3600")
    try:

        async def create():
            from mcp import ClientSession
            from mcp.client.streamable_http import streamable_http_client
            import httpx2

            async with httpx2.AsyncClient(headers={"X-Berth-User": "dave"}, timeout=120) as client:
                async with streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=client) as (read, write):
                    async with ClientSession(read, write) as session:
                        await session.initialize()
                        created = await call(session, "e2b_create_sandbox", {"title": "left behind"})
                        assert not created.is_error, created.structured_content
                        return created.structured_content["sandbox_id"]

        sandbox_id = anyio.run(create)
    finally:
        first.kill()
        first.wait(30)
    headers = {"X-API-Key": berth.api_key}
    assert httpx.get(f"{berth.api_url}/sandboxes/{sandbox_id}", headers=headers).status_code == 200
    second = start_http_server(mcp_state, free_port(), "--lease-ttl", "2", "--sweep-interval", "1")
    try:
        wait_for(
            lambda: httpx.get(f"{berth.api_url}/sandboxes/{sandbox_id}", headers=headers).status_code == 404,
            60,
            "the restarted server to sweep the expired lease",
        )
    finally:
        second.terminate()
        second.wait(30)
    scan_server_logs(mcp_state, [berth.api_key])

"""`/mcp` on a real `berth up`, driven with the official Python MCP client's streamable
HTTP transport. The identity of a request is the team of its `X-API-Key`.

Covers: tools/list for each tool set (`berth up --mcp-toolset`), checked against the seed
documents; a session-tool round trip (create → exec `echo hi` → delete) with no connect
step, because berth up vouches for the key it just checked (and keeps it out of its state
in clear); missing and invalid keys (a 401 with a JSON-RPC error the client surfaces, and
the server keeps serving); two teams' keys not seeing each other's sandboxes or MCP
sessions.

Needs BERTH_BIN (the berth binary, with berth-envd and berth-launch beside it). Every
`berth up` started here is stopped by PID and its state directory removed, and every
sandbox its keys can see is killed, also when a test fails.
"""

from __future__ import annotations

import json
import os
from contextlib import asynccontextmanager

import anyio
import httpx
import pytest

from berth_up import BerthUp
from test_tools_list import VERIFY

# Every tool output seen in this module; scanned for keys at the end.
OUTPUTS: list[str] = []


def berth_binary() -> str:
    binary = os.environ.get("BERTH_BIN")
    if not binary:
        pytest.exit("test_berth_up_http.py needs BERTH_BIN (the berth binary)", returncode=2)
    return binary


@pytest.fixture(scope="module")
def berth():
    instance = BerthUp(berth_binary(), "--mcp-allowed-host", "berth.test")
    try:
        yield instance
    finally:
        instance.shutdown()
        logs = instance.logs_without_key_lines()
        instance.remove_state()
        for key in instance.keys():
            assert key not in logs, "an API key appeared in the berth up log"
            assert key not in "".join(OUTPUTS), "an API key appeared in a tool output"


@asynccontextmanager
async def mcp_session(berth: BerthUp, key: str | None, session_ids: list[str] | None = None,
                      session_id: str | None = None):
    """An initialized ClientSession to `<berth>/mcp`; `session_ids` collects the
    Mcp-Session-Id the server assigns. With `session_id`, tool calls carry that id instead
    of the client's own (to try another client's session)."""
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    import httpx2

    headers = {"X-API-Key": key} if key is not None else {}

    async def remember(response):
        if session_ids is not None and "mcp-session-id" in response.headers:
            session_ids.append(response.headers["mcp-session-id"])

    async def impersonate(request):
        if session_id is not None and request.method == "POST" and b'"tools/call"' in request.content:
            request.headers["mcp-session-id"] = session_id

    async with httpx2.AsyncClient(
        headers=headers, timeout=120, event_hooks={"response": [remember], "request": [impersonate]}
    ) as client:
        async with streamable_http_client(f"{berth.api_url}/mcp", http_client=client) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                yield session


async def call(session, name: str, arguments: dict | None = None):
    result = await session.call_tool(name, arguments or {})
    text = "".join(getattr(block, "text", "") for block in result.content)
    OUTPUTS.append(text + json.dumps(result.structured_content))
    return result


def list_tools(berth: BerthUp) -> dict:
    async def run():
        async with mcp_session(berth, berth.api_key) as session:
            return {tool.name: tool for tool in (await session.list_tools()).tools}

    return anyio.run(run)


@pytest.mark.parametrize("toolset", ["session", "connector", "all"])
def test_tools_list_per_toolset(berth, toolset):
    if toolset == "all":
        VERIFY["all"](list_tools(berth))
        return
    instance = BerthUp(berth_binary(), "--mcp-toolset", toolset)
    try:
        VERIFY[toolset](list_tools(instance))
    finally:
        instance.shutdown()
        instance.remove_state()


def post_initialize(berth, headers: dict) -> httpx.Response:
    """A raw MCP `initialize` POST to /mcp with `headers` added."""
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "berth-test", "version": "0"}},
    }
    return httpx.post(
        f"{berth.api_url}/mcp",
        json=initialize,
        headers={**headers, "Accept": "application/json, text/event-stream"},
        timeout=30,
    )


@pytest.mark.parametrize("key", [None, "", "e2b_0000000000000000000000000000000000000000"],
                         ids=["missing", "empty", "invalid"])
def test_requests_without_a_valid_key_get_a_clear_401(berth, key):
    headers = {"X-API-Key": key} if key is not None else {}
    raw = post_initialize(berth, headers)
    assert raw.status_code == 401, raw.text
    body = raw.json()
    assert body["error"]["code"] == -32001 and "X-API-Key" in body["error"]["message"], body

    from mcp.shared.exceptions import MCPError

    async def run():
        # The client's task groups wrap the MCPError in exception groups.
        with pytest.raises(BaseExceptionGroup) as refused:
            async with mcp_session(berth, key):
                pass
        errors = leaf_errors(refused.value)
        assert [type(error) for error in errors] == [MCPError], errors
        assert "X-API-Key" in str(errors[0])
        # The refusal did not hurt the server: a valid key still gets a session.
        async with mcp_session(berth, berth.api_key) as session:
            assert len((await session.list_tools()).tools) == 42

    anyio.run(run)


def leaf_errors(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in leaf_errors(inner)]
    return [error]


def test_session_tools_create_exec_kill(berth):
    async def run():
        async with mcp_session(berth, berth.api_key) as session:
            created = await call(session, "e2b_create_sandbox", {"title": "berth up /mcp"})
            assert not created.is_error, created.structured_content
            sandbox_id = created.structured_content["sandbox_id"]
            details = httpx.get(f"{berth.api_url}/sandboxes/{sandbox_id}",
                                headers={"X-API-Key": berth.api_key}, timeout=30)
            assert details.status_code == 200, details.text
            assert details.json()["metadata"]["berth.title"] == "berth up /mcp"

            ran = await call(session, "e2b_exec", {"sandbox_id": sandbox_id, "command": "echo hi"})
            assert not ran.is_error, ran.structured_content
            assert ran.structured_content["stdout"] == "hi\n"
            assert ran.structured_content["exit_code"] == 0 and ran.structured_content["success"] is True

            listed = await call(session, "e2b_list_sandboxes")
            assert [s["sandbox_id"] for s in listed.structured_content["sandboxes"]] == [sandbox_id]

            deleted = await call(session, "e2b_manage_sandbox", {"sandbox_id": sandbox_id, "action": "delete"})
            assert deleted.structured_content == {"sandbox_id": sandbox_id, "action": "delete", "success": True}
            return sandbox_id

    sandbox_id = anyio.run(run)
    gone = httpx.get(f"{berth.api_url}/sandboxes/{sandbox_id}", headers={"X-API-Key": berth.api_key}, timeout=30)
    assert gone.status_code == 404, gone.text


def test_a_valid_key_needs_no_connect_step(berth):
    """A team that never connected anything: its first tool call already reaches berth
    with the key it presented, the sandbox belongs to that team, and the key appears in
    no MCP state file in clear. Without a key the same server answers 401."""
    key = berth.create_key("mcp-trusted-team")

    async def run():
        async with mcp_session(berth, key) as session:
            created = await call(session, "e2b_create_sandbox", {"title": "trusted key"})
            assert not created.is_error, created.structured_content
            assert "connection_required" not in created.structured_content
            sandbox_id = created.structured_content["sandbox_id"]
            try:
                mine = httpx.get(f"{berth.api_url}/sandboxes/{sandbox_id}", headers={"X-API-Key": key}, timeout=30)
                assert mine.status_code == 200, mine.text
                other = httpx.get(f"{berth.api_url}/sandboxes/{sandbox_id}",
                                  headers={"X-API-Key": berth.api_key}, timeout=30)
                assert other.status_code == 404, other.text
                ran = await call(session, "e2b_exec", {"sandbox_id": sandbox_id, "command": "echo hi"})
                assert not ran.is_error, ran.structured_content
                assert ran.structured_content["stdout"] == "hi\n"
            finally:
                deleted = await call(session, "e2b_manage_sandbox", {"sandbox_id": sandbox_id, "action": "delete"})
            assert deleted.structured_content == {"sandbox_id": sandbox_id, "action": "delete", "success": True}

    anyio.run(run)
    state_files = [path for path in (berth.state_dir / "mcp").rglob("*") if path.is_file()]
    assert state_files, "berth up kept no MCP state"
    for path in state_files:
        assert key.encode() not in path.read_bytes(), f"the key is in {path} in clear"
    refused = post_initialize(berth, {})
    assert refused.status_code == 401, refused.text
    assert "X-API-Key" in refused.json()["error"]["message"]


def test_two_teams_do_not_see_each_others_sandboxes(berth):
    alice_key = berth.api_key
    bob_key = berth.create_key("mcp-other-team")

    async def run():
        alice_sessions: list[str] = []
        async with mcp_session(berth, alice_key, alice_sessions) as alice:
            created = await call(alice, "e2b_create_sandbox", {"title": "alice's"})
            assert not created.is_error, created.structured_content
            sandbox_id = created.structured_content["sandbox_id"]
            try:
                async with mcp_session(berth, bob_key) as bob:
                    session_scope = await call(bob, "e2b_list_sandboxes")
                    assert session_scope.structured_content["count"] == 0
                    project = await call(bob, "e2b_list_sandboxes", {"scope": "project"})
                    assert sandbox_id not in json.dumps(project.structured_content)
                    got = await call(bob, "e2b_get_sandbox", {"sandbox_id": sandbox_id})
                    assert got.is_error and got.structured_content["error"]["status"] == 404, got.structured_content
                    ran = await call(bob, "e2b_exec", {"sandbox_id": sandbox_id, "command": "echo hi"})
                    assert ran.is_error, ran.structured_content
                    killed = await call(bob, "e2b_kill_sandbox", {"sandbox_id": sandbox_id})
                    assert killed.is_error and killed.structured_content["error"]["status"] == 404

                # Bob's key with Alice's MCP session id: the session belongs to her team.
                async with mcp_session(berth, bob_key, session_id=alice_sessions[0]) as hijack:
                    stolen = await call(hijack, "e2b_exec", {"sandbox_id": sandbox_id, "command": "echo hi"})
                    assert stolen.is_error
                    assert "belongs to another user" in json.dumps(stolen.structured_content), stolen

                still = await call(alice, "e2b_exec", {"sandbox_id": sandbox_id, "command": "echo hi"})
                assert still.structured_content["stdout"] == "hi\n"
                mine = await call(alice, "e2b_list_sandboxes", {"scope": "project"})
                assert sandbox_id in json.dumps(mine.structured_content)
            finally:
                await call(alice, "e2b_manage_sandbox", {"sandbox_id": sandbox_id, "action": "delete"})

    anyio.run(run)


@pytest.mark.parametrize("host, allowed", [("berth.test", True), ("berth.test:8080", True), ("evil.test", False)])
def test_mcp_checks_the_host_header(berth, host, allowed):
    """The DNS-rebinding guard: only loopback names, the listen address, --domain and
    --mcp-allowed-host names reach /mcp."""
    answer = post_initialize(berth, {"X-API-Key": berth.api_key, "Host": host})
    if allowed:
        assert answer.status_code == 200, answer.text
    else:
        assert answer.status_code == 403, answer.text

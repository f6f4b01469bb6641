"""The agent tools as an agent meets them: `/mcp` on a real `berth up`, driven with the
official Python MCP client (streamable HTTP), checked against what the seed documents
promise.

Covers: `e2b_exec` / `e2b_read_file` on a sandbox the agent paused (through the session
tool or the connector tool) resume it transparently, memory kept; a killed sandbox
answers a structured error naming its state and the fix; `e2b_exec` past `timeout_ms`
says "timed out after N ms" and the command is really killed; API errors reach the agent
as one sentence (first text block and `error.message`) plus the API's body; the session
tool set's results never carry the envd access token or the API key, in the `session`
and `all` tool sets, while the connector tools that document tokens (seed 003) return
them; every tool has an `outputSchema` and every successful structured result seen
here validates against it (jsonschema, besides the client's own check); both protocol
revisions negotiated per request on `/mcp` and on `berth mcp` (stdio): 2026-07-28 through
`server/discover` with no session id, 2025-11-25 through `initialize`; stateless clients
keep sessions apart with the explicit handle `_meta["dev.berth/session"]`.

Needs BERTH_BIN. Every `berth up` is stopped by PID and its state removed; every sandbox
its key can see is killed, also when a test fails.
"""

from __future__ import annotations

import json
import os
import time
from contextlib import asynccontextmanager

import anyio
import httpx
import jsonschema
import pytest

from berth_up import BerthUp

# (tool name, structured content) of every successful call, validated at the end.
RESULTS: list[tuple[str, dict]] = []
# Every tool output of the session tool set, scanned for tokens and keys.
SESSION_OUTPUTS: list[str] = []
SESSION_TOOLS = {"e2b_create_sandbox", "e2b_exec", "e2b_read_file", "e2b_write_file",
                 "e2b_list_sandboxes", "e2b_manage_sandbox"}


def berth_binary() -> str:
    binary = os.environ.get("BERTH_BIN")
    if not binary:
        pytest.exit("test_agent_tools.py needs BERTH_BIN (the berth binary)", returncode=2)
    return binary


@pytest.fixture(scope="module")
def berth():
    instance = BerthUp(berth_binary())
    try:
        yield instance
    finally:
        instance.shutdown()
        instance.remove_state()


@asynccontextmanager
async def mcp_session(berth: BerthUp):
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    import httpx2

    async with httpx2.AsyncClient(headers={"X-API-Key": berth.api_key}, timeout=120) as client:
        async with streamable_http_client(f"{berth.api_url}/mcp", http_client=client) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                yield session


async def call(session, name: str, arguments: dict | None = None):
    result = await session.call_tool(name, arguments or {})
    text = "".join(getattr(block, "text", "") for block in result.content)
    if name in SESSION_TOOLS:
        SESSION_OUTPUTS.append(text + json.dumps(result.structured_content))
    if not result.is_error:
        RESULTS.append((name, result.structured_content))
    return result


def rest(berth: BerthUp, method: str, path: str, **kwargs) -> httpx.Response:
    return httpx.request(method, f"{berth.api_url}{path}", headers={"X-API-Key": berth.api_key},
                         timeout=60, **kwargs)


async def create(session) -> str:
    created = await call(session, "e2b_create_sandbox", {"title": "agent tools"})
    assert not created.is_error, created.structured_content
    return created.structured_content["sandbox_id"]


@pytest.mark.parametrize("pause_with", ["e2b_manage_sandbox", "e2b_pause_sandbox", "rest"])
def test_tools_on_a_paused_sandbox_resume_it(berth, pause_with):
    async def run():
        async with mcp_session(berth) as session:
            sandbox_id = await create(session)
            try:
                # A process kept in memory across the pause shows the resume kept memory.
                started = await call(session, "e2b_exec", {
                    "sandbox_id": sandbox_id,
                    "command": "echo before > /tmp/note; (sleep 3600 & echo $! > /tmp/pid)"})
                assert started.structured_content["success"], started.structured_content
                if pause_with == "e2b_manage_sandbox":
                    paused = await call(session, pause_with, {"sandbox_id": sandbox_id, "action": "pause"})
                    assert not paused.is_error, paused.structured_content
                elif pause_with == "e2b_pause_sandbox":
                    paused = await call(session, pause_with, {"sandbox_id": sandbox_id})
                    assert not paused.is_error, paused.structured_content
                else:
                    answer = rest(berth, "POST", f"/sandboxes/{sandbox_id}/pause")
                    assert answer.status_code == 204, answer.text
                assert rest(berth, "GET", f"/sandboxes/{sandbox_id}").json()["state"] == "paused"

                ran = await call(session, "e2b_exec", {
                    "sandbox_id": sandbox_id, "command": "cat /tmp/note; kill -0 $(cat /tmp/pid) && echo alive"})
                assert not ran.is_error, ran.structured_content
                assert ran.structured_content["stdout"] == "before\nalive\n", ran.structured_content
                assert rest(berth, "GET", f"/sandboxes/{sandbox_id}").json()["state"] == "running"

                # Paused again: a file read resumes it too.
                assert rest(berth, "POST", f"/sandboxes/{sandbox_id}/pause").status_code == 204
                read = await call(session, "e2b_read_file", {"sandbox_id": sandbox_id, "path": "/tmp/note"})
                assert not read.is_error, read.structured_content
                assert read.structured_content["content"] == "before\n"
                listed = await call(session, "e2b_list_sandboxes")
                assert [s["status"] for s in listed.structured_content["sandboxes"]] == ["running"]
            finally:
                await call(session, "e2b_manage_sandbox", {"sandbox_id": sandbox_id, "action": "delete"})

    anyio.run(run)


def test_a_killed_sandbox_answers_its_state_and_the_fix(berth):
    async def run():
        async with mcp_session(berth) as session:
            sandbox_id = await create(session)
            assert rest(berth, "DELETE", f"/sandboxes/{sandbox_id}").status_code == 204
            ran = await call(session, "e2b_exec", {"sandbox_id": sandbox_id, "command": "echo hi"})
            assert ran.is_error
            error = ran.structured_content["error"]
            assert error["state"] == "killed" and error["sandbox_id"] == sandbox_id, error
            assert "e2b_create_sandbox" in error["message"] and "no longer exists" in error["message"]
            assert ran.content[0].text == error["message"]
            # The session stops tracking it.
            listed = await call(session, "e2b_list_sandboxes")
            assert listed.structured_content["count"] == 0

    anyio.run(run)


def test_exec_past_timeout_ms_is_killed_and_says_so(berth):
    async def run():
        async with mcp_session(berth) as session:
            sandbox_id = await create(session)
            try:
                began = time.monotonic()
                ran = await call(session, "e2b_exec", {
                    "sandbox_id": sandbox_id, "timeout_ms": 1500,
                    "command": "echo started; sleep 4; echo late > /tmp/late"})
                elapsed = time.monotonic() - began
                assert not ran.is_error, ran.structured_content
                result = ran.structured_content
                assert result["error"].startswith("timed out after 1500 ms"), result
                assert result["success"] is False and result["stdout"] == "started\n", result
                assert elapsed < 4, f"the call took {elapsed:.1f}s"
                await anyio.sleep(4)
                check = await call(session, "e2b_exec", {
                    "sandbox_id": sandbox_id,
                    "command": "test -e /tmp/late && echo ran-on || echo killed; pgrep -x sleep || true"})
                assert check.structured_content["stdout"] == "killed\n", check.structured_content
            finally:
                await call(session, "e2b_manage_sandbox", {"sandbox_id": sandbox_id, "action": "delete"})

    anyio.run(run)


def test_api_errors_are_one_sentence_plus_the_body(berth):
    async def run():
        async with mcp_session(berth) as session:
            got = await call(session, "e2b_get_sandbox", {"sandbox_id": "inotasandbox000000000"})
            assert got.is_error
            error = got.structured_content["error"]
            assert error["status"] == 404 and isinstance(error["body"], dict), error
            sentence = error["message"]
            assert sentence.startswith("The server refused the call with HTTP 404 (Not Found): "), sentence
            assert error["body"]["message"].rstrip(".") in sentence
            assert sentence.count(". ") <= 2 and "\n" not in sentence
            assert got.content[0].text == sentence
            assert json.loads(got.content[1].text) == got.structured_content

    anyio.run(run)


def all_session_tools_once(session, sandbox_id_box: list):
    async def run():
        sandbox_id = await create(session)
        sandbox_id_box.append(sandbox_id)
        for name, arguments in [
            ("e2b_exec", {"sandbox_id": sandbox_id, "command": "env"}),
            ("e2b_write_file", {"sandbox_id": sandbox_id, "path": "/tmp/a.txt", "content": "a\nb\n"}),
            ("e2b_read_file", {"sandbox_id": sandbox_id, "path": "/tmp/a.txt", "offset": 1}),
            ("e2b_list_sandboxes", {}),
            ("e2b_manage_sandbox", {"sandbox_id": sandbox_id, "action": "pause"}),
            ("e2b_manage_sandbox", {"sandbox_id": sandbox_id, "action": "resume"}),
        ]:
            result = await call(session, name, arguments)
            assert not result.is_error, (name, result.structured_content)
    return run()


@pytest.mark.parametrize("toolset", ["all", "session"])
def test_session_tools_never_show_tokens_or_keys(berth, toolset):
    instance = berth if toolset == "all" else BerthUp(berth_binary(), "--mcp-toolset", "session")
    SESSION_OUTPUTS.clear()
    try:
        async def run():
            box: list[str] = []
            async with mcp_session(instance) as session:
                await all_session_tools_once(session, box)
                sandbox_id = box[0]
                token = httpx.get(f"{instance.api_url}/sandboxes/{sandbox_id}",
                                  headers={"X-API-Key": instance.api_key}, timeout=30).json()["envdAccessToken"]
                assert token, "berth returns the envd token on GET /sandboxes/{id}"
                if toolset == "all":
                    # The connector tools return what seed 003 documents, tokens included.
                    connected = await call(session, "e2b_connect_sandbox", {"sandbox_id": sandbox_id})
                    assert connected.structured_content["result"]["envdAccessToken"], connected.structured_content
                    got = await call(session, "e2b_get_sandbox", {"sandbox_id": sandbox_id})
                    assert got.structured_content["result"]["envdAccessToken"] == token
                await call(session, "e2b_manage_sandbox", {"sandbox_id": sandbox_id, "action": "delete"})
                return token

        token = anyio.run(run)
        seen = "".join(SESSION_OUTPUTS)
        assert len(SESSION_OUTPUTS) >= 7
        for secret in (token, instance.api_key):
            assert secret not in seen, "a session tool result carries a token or the API key"
        for field in ("envdAccessToken", "trafficAccessToken", "accessToken"):
            assert field not in seen, field
    finally:
        if instance is not berth:
            instance.shutdown()
            instance.remove_state()


def test_connector_toolset_create_returns_the_documented_fields():
    instance = BerthUp(berth_binary(), "--mcp-toolset", "connector")
    seen_before = len(RESULTS)
    try:
        async def run():
            async with mcp_session(instance) as session:
                created = await call(session, "e2b_create_sandbox", {"template_id": "base"})
                assert not created.is_error, created.structured_content
                result = created.structured_content["result"]
                # Seed 003: sandboxID, templateID, alias, envdVersion, envdAccessToken,
                # trafficAccessToken and domain.
                for name in ("sandboxID", "templateID", "envdVersion", "envdAccessToken",
                             "trafficAccessToken", "domain"):
                    assert name in result, (name, result)
                assert result["envdAccessToken"]
                killed = await call(session, "e2b_kill_sandbox", {"sandbox_id": result["sandboxID"]})
                assert not killed.is_error, killed.structured_content
                tools = (await session.list_tools()).tools
                assert all(tool.output_schema for tool in tools)
                check_results({tool.name: tool.output_schema for tool in tools}, RESULTS[seen_before:])

        anyio.run(run)
    finally:
        # These results belong to the connector tool set's schemas, not to `all`'s.
        del RESULTS[seen_before:]
        instance.shutdown()
        instance.remove_state()


def check_results(schemas: dict[str, dict], results: list[tuple[str, dict]]) -> None:
    for name, content in results:
        if name in schemas:
            jsonschema.validate(content, schemas[name])


def test_every_tool_has_an_output_schema_its_results_match(berth):
    """Runs after the tests above (file order): every result they saw from the `all`
    tool set, plus one call of each read-only listing tool, validates."""
    async def run():
        async with mcp_session(berth) as session:
            tools = {tool.name: tool for tool in (await session.list_tools()).tools}
            assert len(tools) == 42
            for tool in tools.values():
                assert tool.output_schema and tool.output_schema["type"] == "object", tool.name
                jsonschema.Draft202012Validator.check_schema(tool.output_schema)
            for name, tool in tools.items():
                required = tool.input_schema.get("required", [])
                if name.startswith("e2b_list_") and not required:
                    result = await call(session, name, {})
                    assert not result.is_error, (name, result.structured_content)
            return {name: tool.output_schema for name, tool in tools.items()}

    schemas = anyio.run(run)
    check_results(schemas, RESULTS)
    called = {name for name, _ in RESULTS}
    assert {"e2b_exec", "e2b_read_file", "e2b_write_file", "e2b_manage_sandbox", "e2b_create_sandbox",
            "e2b_list_sandboxes", "e2b_get_sandbox", "e2b_connect_sandbox", "e2b_pause_sandbox",
            "e2b_list_templates", "e2b_list_snapshots"} <= called, called


@asynccontextmanager
async def modern_session(berth: BerthUp, seen_headers: list | None = None):
    """A ClientSession that speaks 2026-07-28: `server/discover`, no `initialize`, no
    protocol session; `seen_headers` collects every response's headers."""
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    import httpx2

    async def remember(response):
        if seen_headers is not None:
            seen_headers.append(dict(response.headers))

    async with httpx2.AsyncClient(headers={"X-API-Key": berth.api_key}, timeout=120,
                                  event_hooks={"response": [remember]}) as client:
        async with streamable_http_client(f"{berth.api_url}/mcp", http_client=client) as (read, write):
            async with ClientSession(read, write) as session:
                yield session


def test_both_revisions_are_negotiated_per_request(berth):
    """A 2026-07-28 client discovers and calls without a session; a handshake client in
    the same server still negotiates 2025-11-25."""
    async def run():
        headers: list[dict] = []
        async with modern_session(berth, headers) as modern:
            discovered = await modern.discover()
            assert "2026-07-28" in discovered.supported_versions, discovered
            assert "2025-11-25" in discovered.supported_versions, discovered
            assert modern.protocol_version == "2026-07-28"
            tools = (await modern.list_tools()).tools
            assert len(tools) == 42 and all(tool.output_schema for tool in tools)
            listed = await call(modern, "e2b_list_sandboxes")
            assert not listed.is_error, listed.structured_content
        assert headers and not any("mcp-session-id" in h for h in headers), headers
        async with mcp_session(berth) as legacy:
            assert legacy.protocol_version == "2025-11-25"
            assert not (await call(legacy, "e2b_list_sandboxes")).is_error

    anyio.run(run)


def test_stateless_clients_track_sessions_by_an_explicit_handle(berth):
    """`_meta["dev.berth/session"]` names the session of a stateless call: two handles
    see only their own sandboxes, the same handle over a new connection sees its own."""
    async def run():
        first = {"dev.berth/session": "conversation-1"}
        second = {"dev.berth/session": "conversation-2"}
        async with modern_session(berth) as modern:
            await modern.discover()
            created = await modern.call_tool("e2b_create_sandbox", {"title": "handle 1"}, meta=first)
            assert not created.is_error, created.structured_content
            sandbox_id = created.structured_content["sandbox_id"]
            try:
                mine = await modern.call_tool("e2b_list_sandboxes", {}, meta=first)
                assert [s["sandbox_id"] for s in mine.structured_content["sandboxes"]] == [sandbox_id]
                other = await modern.call_tool("e2b_list_sandboxes", {}, meta=second)
                assert other.structured_content["count"] == 0
                refused = await modern.call_tool("e2b_exec", {"sandbox_id": sandbox_id, "command": "true"},
                                                 meta=second)
                assert refused.is_error and "not a live sandbox of this session" in refused.content[0].text
            finally:
                async with modern_session(berth) as again:
                    await again.discover()
                    ran = await again.call_tool("e2b_exec", {"sandbox_id": sandbox_id, "command": "echo same"},
                                                meta=first)
                    assert ran.structured_content["stdout"] == "same\n", ran.structured_content
                    deleted = await again.call_tool("e2b_manage_sandbox",
                                                    {"sandbox_id": sandbox_id, "action": "delete"}, meta=first)
                    assert not deleted.is_error, deleted.structured_content

    anyio.run(run)


def test_stdio_speaks_both_revisions(tmp_path):
    """`berth mcp` over stdio: a 2026-07-28 client discovers and calls, a handshake client
    gets 2025-11-25; both see the same tools (no connection yet: a structured link)."""
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(
        command=berth_binary(),
        args=["mcp", "--state-dir", str(tmp_path), "--user", "stdio-user"],
    )

    async def run():
        for modern in (True, False):
            with open(tmp_path / "stderr.log", "a") as errlog:
                async with stdio_client(params, errlog=errlog) as (read, write):
                    async with ClientSession(read, write) as session:
                        if modern:
                            await session.discover()
                        else:
                            await session.initialize()
                        assert session.protocol_version == ("2026-07-28" if modern else "2025-11-25")
                        tools = (await session.list_tools()).tools
                        assert len(tools) == 42 and all(tool.output_schema for tool in tools)
                        listed = await session.call_tool("e2b_list_sandboxes", {})
                        assert listed.is_error and listed.structured_content["connection_required"] is True
                        assert listed.content[0].text.startswith("No E2B-compatible API key is connected")

    anyio.run(run)

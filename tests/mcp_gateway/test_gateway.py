"""E2B's MCP gateway on berth, through the official clients: `Sandbox.create(mcp={...})`
(e2b 2.63.0) starts custom servers cloned from the fake internet's git host, the Python
`mcp` client reaches them at `get_mcp_url()` over TLS (trusting berth's serving CA) with
`get_mcp_token()`, and a server that cannot start fails the create and leaves no sandbox.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx
import pytest
from e2b import Sandbox, SandboxException, SandboxQuery

from conftest import REPO_ROOT, Berth

ECHO = {"run_cmd": "python3 server.py"}


def create(mcp: dict, **kwargs) -> Sandbox:
    return Sandbox.create(mcp=mcp, timeout=600, **kwargs)


@asynccontextmanager
async def mcp_session(berth: Berth, url: str, token: str, statuses: list[int] | None = None):
    """An `mcp` ClientSession on the gateway over TLS; `statuses` collects every HTTP
    status the client saw."""
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async def remember(response) -> None:
        if statuses is not None:
            statuses.append(response.status_code)

    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, verify=berth.ssl_context(),
                                  timeout=120, event_hooks={"response": [remember]}) as client:
        async with streamable_http_client(url, http_client=client) as (read, write):
            async with ClientSession(read, write) as session:
                yield session


def tool_text(result) -> str:
    assert not result.is_error, result
    return result.content[0].text


def call_tools(berth: Berth, url: str, token: str, calls: list[tuple[str, dict]], modern: bool = False):
    """Lists the gateway's tools and makes `calls`: (sorted tool names, texts)."""

    async def run():
        async with mcp_session(berth, url, token) as session:
            if modern:
                await session.discover()
                assert session.protocol_version == "2026-07-28"
            else:
                await session.initialize()
            names = sorted(tool.name for tool in (await session.list_tools()).tools)
            texts = [tool_text(await session.call_tool(name, args)) for name, args in calls]
            return names, texts

    return anyio.run(run)


def live(sandbox_id: str) -> bool:
    return any(s.sandbox_id == sandbox_id for s in Sandbox.list().next_items())


def test_a_custom_server_answers_through_the_gateway(berth: Berth) -> None:
    sandbox = create({"github/acme/echo": {
        "run_cmd": "python3 server.py",
        "install_cmd": "echo from-install > installed.txt",
        "envs": {"GREETING": "hello from envs"},
    }})
    try:
        url = sandbox.get_mcp_url()
        assert url == f"https://50005-{sandbox.sandbox_id}.{berth.domain}/mcp"
        token = sandbox.get_mcp_token()
        # A client that did not create the sandbox reads the token where the SDK does.
        assert Sandbox.connect(sandbox.sandbox_id).get_mcp_token() == token
        for modern in (False, True):
            names, texts = call_tools(berth, url, token, [("echo", {"text": "hi"}), ("info", {})], modern)
            assert names == ["echo", "info"]
            assert texts[0] == "hi"
        info = json.loads(texts[1])
        assert info.pop("pid") > 0
        assert info == {"cwd": "/opt/mcp-servers/acme/echo", "greeting": "hello from envs",
                        "installed": "from-install", "token_visible": False}
        # Inside the sandbox the gateway is plain HTTP on localhost:50005, where E2B has it.
        inside = sandbox.commands.run(
            f"curl -s -o /dev/null -w '%{{http_code}}' -X POST http://localhost:50005/mcp "
            f"-H 'Authorization: Bearer {token}' -H 'Content-Type: application/json' "
            "-H 'Accept: application/json, text/event-stream' "
            "-d '{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{\"protocolVersion\":"
            "\"2025-06-18\",\"capabilities\":{},\"clientInfo\":{\"name\":\"curl\",\"version\":\"1\"}}}'"
        )
        assert inside.stdout == "200"
        log = sandbox.files.read("/var/log/mcp-gateway/gateway.log", user="root")
        assert "echo server '' starting" in log and "serving 1 MCP server(s)" in log, log
    finally:
        sandbox.kill()


def test_a_wrong_or_missing_token_is_refused(berth: Berth) -> None:
    sandbox = create({"github/acme/echo": ECHO})
    try:
        url = sandbox.get_mcp_url()
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        headers = {"Accept": "application/json, text/event-stream"}
        with httpx.Client(verify=berth.ssl_context(), timeout=60) as client:
            for auth in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic " + sandbox.get_mcp_token()}):
                response = client.post(url, json=body, headers={**headers, **auth})
                assert response.status_code == 401, (auth, response.text)
                assert response.headers["www-authenticate"].startswith("Bearer")
            ok = client.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "httpx", "version": "1"}}},
                headers={**headers, "Authorization": f"Bearer {sandbox.get_mcp_token()}"})
            assert ok.status_code == 200, ok.text

        statuses: list[int] = []

        async def refused():
            async with mcp_session(berth, url, "not-the-token", statuses) as session:
                await session.initialize()

        with pytest.raises(BaseException):
            anyio.run(refused)
        assert statuses == [401], statuses
    finally:
        sandbox.kill()


def test_two_servers_are_aggregated_under_their_own_tool_names(berth: Berth) -> None:
    sandbox = create({
        "github/acme/echo": ECHO,
        "github/acme/other": {"runCmd": "python3 server.py other_"},
    })
    try:
        names, texts = call_tools(berth, sandbox.get_mcp_url(), sandbox.get_mcp_token(),
                                  [("echo", {"text": "one"}), ("other_echo", {"text": "two"}), ("other_info", {})])
        assert names == ["echo", "info", "other_echo", "other_info"]
        assert texts[:2] == ["one", "two"]
        assert json.loads(texts[2])["cwd"] == "/opt/mcp-servers/acme/other"
    finally:
        sandbox.kill()


def assert_create_fails_and_leaves_no_sandbox(mcp: dict, *expected: str) -> str:
    tag = uuid.uuid4().hex
    with pytest.raises(SandboxException) as raised:
        create(mcp, metadata={"test": tag})
    message = str(raised.value)
    assert message.startswith("Failed to start MCP gateway: "), message
    for text in expected:
        assert text in message, message
    running = Sandbox.list(query=SandboxQuery(metadata={"test": tag})).next_items()
    assert running == [], "the SDK killed the sandbox"
    return message


def test_a_server_that_fails_to_start_fails_the_create_and_the_sandbox_is_gone(berth: Berth) -> None:
    assert_create_fails_and_leaves_no_sandbox(
        {"github/acme/echo": ECHO, "github/acme/broken": {"run_cmd": "python3 server.py"}},
        '"github/acme/broken"', "exit status 2", "can't open file", "server.py",
    )
    assert_create_fails_and_leaves_no_sandbox(
        {"github/acme/echo": {"run_cmd": "python3 server.py", "install_cmd": "echo missing dependency >&2; exit 7"}},
        '"github/acme/echo"', "install_cmd failed (exit status 7)", "missing dependency",
    )
    assert_create_fails_and_leaves_no_sandbox(
        {"github/acme/missing": ECHO}, '"github/acme/missing"', "cloning http://git.test-internet.example/acme/missing",
    )


def test_catalog_servers_are_refused_by_name(berth: Berth) -> None:
    assert_create_fails_and_leaves_no_sandbox(
        {"airtable": {"airtableApiKey": "key"}}, '"airtable"', "Docker MCP Catalog", "github/<owner>/<repo>",
    )


def test_catalog_servers_cannot_be_pulled_into_a_template(berth: Berth) -> None:
    """`Template().from_template("mcp-gateway").add_mcp_server(...)` runs `mcp-gateway
    pull` in the build: refused by name, so the build fails saying why."""
    from e2b import BuildException, Template

    template = Template().from_template("mcp-gateway").add_mcp_server(["exa", "brave"])
    with pytest.raises(BuildException) as failure:
        Template.build(template, f"mcp-pull-{uuid.uuid4().hex[:8]}")
    assert "cannot pull exa, brave" in str(failure.value), failure.value
    assert "Docker images" in str(failure.value), failure.value


def test_a_malformed_mcp_object_is_a_400_naming_it(berth: Berth) -> None:
    response = httpx.post(f"{berth.env['E2B_API_URL']}/sandboxes", headers={"X-API-Key": berth.env["E2B_API_KEY"]},
                          json={"templateID": "mcp-gateway", "mcp": ["github/acme/echo"]}, timeout=60)
    assert response.status_code == 400, response.text
    assert response.json()["message"].startswith("mcp must be an object"), response.text


def test_the_gateway_keeps_serving_across_pause_resume_and_fork(berth: Berth) -> None:
    sandbox = create({"github/acme/echo": ECHO})
    forks: list[Sandbox] = []
    try:
        url, token = sandbox.get_mcp_url(), sandbox.get_mcp_token()
        before = json.loads(call_tools(berth, url, token, [("info", {})])[1][0])
        sandbox.pause()
        assert Sandbox.get_info(sandbox.sandbox_id).state == "paused"
        resumed = Sandbox.connect(sandbox.sandbox_id)
        names, texts = call_tools(berth, resumed.get_mcp_url(), resumed.get_mcp_token(),
                                  [("echo", {"text": "after resume"}), ("info", {})])
        assert names == ["echo", "info"]
        assert texts[0] == "after resume"
        assert json.loads(texts[1]) == before, "the same server process answers, restored with its memory"
        # A fork is a copy of the running gateway: its own URL, the same token (the
        # copied token file), the same servers.
        forks = resumed.fork(count=1)
        fork = forks[0]
        assert fork.get_mcp_token() == token
        assert fork.get_mcp_url() == f"https://50005-{fork.sandbox_id}.{berth.domain}/mcp"
        _, texts = call_tools(berth, fork.get_mcp_url(), fork.get_mcp_token(), [("echo", {"text": "in the fork"})])
        assert texts == ["in the fork"]
    finally:
        for copy in forks:
            copy.kill()
        sandbox.kill()


def test_the_js_sdk_creates_a_gateway_the_mcp_client_calls(berth: Berth) -> None:
    """The JS SDK's `Sandbox.create({mcp})`, `getMcpUrl()`, `getMcpToken()` and the
    official TypeScript MCP client, in Node (tests/mcp_gateway/js/happy_path.mjs)."""
    script = Path(__file__).parent / "js" / "happy_path.mjs"
    result = subprocess.run(
        ["node", str(script)], env={**os.environ, **berth.env, "BERTH_SERVING_CA": str(berth.ca_file)},
        capture_output=True, text=True, timeout=300, cwd=REPO_ROOT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["tools"] == ["echo", "info"]
    assert report["echo"] == "from js"
    assert report["url"].startswith("https://50005-") and report["url"].endswith("/mcp")
    assert report["killed"] is True

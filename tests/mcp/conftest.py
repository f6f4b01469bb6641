"""Fixtures for the MCP tests: a stdio server per test (berth-mcp-dev, or `berth mcp`
once the berth binary wires it in) with its own state directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

REPO = Path(__file__).resolve().parents[2]


def server_command() -> list[str]:
    """The MCP server command: $BERTH_MCP_CMD (split on spaces), else the dev example."""
    configured = os.environ.get("BERTH_MCP_CMD")
    if configured:
        return configured.split()
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    binary = target / "debug" / "examples" / "berth-mcp-dev"
    if not binary.exists():
        subprocess.run(
            ["cargo", "build", "-q", "-p", "berth-mcp", "--example", "berth-mcp-dev"],
            cwd=REPO,
            check=True,
        )
    return [str(binary)]


@pytest.fixture
def state_dir():
    directory = tempfile.mkdtemp(prefix="berth-mcp-test-")
    yield Path(directory)
    shutil.rmtree(directory, ignore_errors=True)


@asynccontextmanager
async def stdio_session(state_dir: Path, *extra: str, user: str = "alice", env: dict | None = None):
    """An initialized MCP ClientSession over stdio to a fresh server process."""
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    command = server_command()
    params = StdioServerParameters(
        command=command[0],
        args=command[1:]
        + ["stdio", "--state-dir", str(state_dir), "--user", user, *extra],
        env={**os.environ, **(env or {})},
    )
    with open(state_dir / f"stderr-{user}.log", "a") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                yield session

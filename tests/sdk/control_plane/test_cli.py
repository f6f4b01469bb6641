"""The E2B CLI (`@e2b/cli@2.19.0`, installed into tests/templates/e2b-cli by
scripts/install-deps.sh) against `berth up`, driven through a real terminal (tmux) as a
user types it: sandbox list/info/create/connect/exec/kill/pause/resume/logs/metrics,
sandbox snapshot create/list/delete and template list."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
import uuid
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from conftest import Berth, poll

REPO_ROOT = Path(__file__).resolve().parents[3]
E2B_CLI = REPO_ROOT / "tests" / "templates" / "e2b-cli" / "node_modules" / ".bin" / "e2b"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")

pytestmark = pytest.mark.skipif(
    not E2B_CLI.exists(), reason="the E2B CLI is not installed: run scripts/install-deps.sh"
)


class Terminal:
    """One tmux session on a private socket (never another session's server)."""

    def __init__(self, berth: Berth, home: Path) -> None:
        self.socket = f"berth-parity-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        env = {
            "E2B_API_URL": berth.api_url,
            "E2B_SANDBOX_URL": berth.sandbox_url,
            "E2B_API_KEY": berth.api_key,
            "NO_UPDATE_NOTIFIER": "1",
            "HOME": str(home),
            "TERM": "xterm-256color",
        }
        flags = [arg for name, value in env.items() for arg in ("-e", f"{name}={value}")]
        self.tmux("new-session", "-d", "-s", "cli", "-x", "220", "-y", "50", *flags, "bash --norc --noprofile")
        self.count = 0

    def tmux(self, *args: str) -> str:
        return subprocess.run(
            ["tmux", "-L", self.socket, *args], check=True, capture_output=True, text=True, timeout=30
        ).stdout

    def screen(self) -> str:
        return ANSI.sub("", self.tmux("capture-pane", "-p", "-J", "-S", "-5000", "-t", "cli"))

    def type(self, text: str) -> None:
        self.tmux("send-keys", "-t", "cli", "-l", text)
        self.tmux("send-keys", "-t", "cli", "Enter")

    def wait_for(self, pattern: str, timeout: float = 120) -> re.Match[str]:
        found: list[re.Match[str]] = []

        def seen() -> bool:
            match = re.search(pattern, self.screen(), re.MULTILINE)
            if match:
                found.append(match)
            return match is not None

        try:
            poll(seen, timeout=timeout, interval=0.2, what=f"{pattern!r} on the terminal")
        except AssertionError as missing:
            raise AssertionError(f"{missing}; screen:\n{self.screen()[-3000:]}") from None
        return found[0]

    def run(self, command: str, timeout: float = 120) -> tuple[int, str]:
        """Types `command` at the shell prompt; its output and exit code."""
        self.count += 1
        marker = f"DONE{self.count}"
        self.tmux("send-keys", "-t", "cli", "clear", "Enter")
        self.tmux("clear-history", "-t", "cli")
        self.type(f"{command}; echo {marker}=$?")
        match = self.wait_for(rf"^{marker}=(\d+)$", timeout)
        return int(match.group(1)), self.screen()

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=30)


@pytest.fixture
def terminal(berth: Berth, tmp_path: Path) -> Iterator[Terminal]:
    term = Terminal(berth, tmp_path)
    try:
        yield term
    finally:
        term.close()


def cli(*args: str) -> str:
    return " ".join(shlex.quote(arg) for arg in (str(E2B_CLI), *args))


def test_sandbox_commands_through_a_terminal(berth: Berth, api: httpx.Client, terminal: Terminal) -> None:
    from e2b import Sandbox

    sandbox = Sandbox.create(timeout=600, metadata={"cli": "parity"})
    try:
        sid = sandbox.sandbox_id
        code, screen = terminal.run(cli("sandbox", "list"))
        assert code == 0 and sid in screen, screen

        code, screen = terminal.run(cli("sandbox", "info", sid, "--format", "json"))
        assert code == 0, screen
        assert sid in screen and "running" in screen, screen

        code, screen = terminal.run(cli("sandbox", "exec", sid, "--", "sh", "-c", "echo exec-$((6*7))"))
        assert code == 0 and "exec-42" in screen, screen
        code, screen = terminal.run(cli("sandbox", "exec", sid, "--", "sh", "-c", "exit 3"))
        assert code == 3, screen

        # A real terminal through the PTY: type into the sandbox's shell, then leave.
        terminal.type(cli("sandbox", "connect", sid))
        terminal.wait_for(r"user@")
        terminal.type("echo pty-$((6*7)) $TERM")
        terminal.wait_for(r"pty-42 xterm")
        terminal.type("exit")
        terminal.wait_for(r"Closing terminal connection")
        assert terminal.run("true")[0] == 0, "the CLI gave the terminal back"

        code, screen = terminal.run(cli("sandbox", "metrics", sid, "--format", "json"), timeout=180)
        assert code == 0, screen

        code, screen = terminal.run(cli("sandbox", "pause", sid))
        assert code == 0, screen
        assert api.get(f"/sandboxes/{sid}").json()["state"] == "paused"
        code, screen = terminal.run(cli("sandbox", "resume", sid))
        assert code == 0, screen
        assert api.get(f"/sandboxes/{sid}").json()["state"] == "running"

        code, screen = terminal.run(cli("sandbox", "logs", sid, "--format", "json"))
        assert code == 0, screen
        lines = [json.loads(line) for line in screen.splitlines() if line.startswith("{")]
        assert lines, screen
        assert all({"timestamp", "level", "msg"} <= line.keys() for line in lines), lines
        assert any("resumed" in line["msg"] for line in lines), lines
        code, screen = terminal.run(cli("sandbox", "logs", sid))
        assert code == 0 and "INFO" in screen, screen

        code, screen = terminal.run(cli("sandbox", "kill", sid))
        assert code == 0, screen
        poll(lambda: not sandbox.is_running(), timeout=30, what="the sandbox to be killed")
    finally:
        try:
            sandbox.kill()
        except Exception:
            pass


def test_sandbox_create_opens_a_terminal_in_a_new_sandbox(berth: Berth, api: httpx.Client, terminal: Terminal) -> None:
    before = {s["sandboxID"] for s in api.get("/v2/sandboxes", params={"limit": 100}).json()}
    terminal.type(cli("sandbox", "create", "base"))
    terminal.wait_for(r"user@")
    terminal.type("echo created-$((6*7))")
    terminal.wait_for(r"created-42")
    after = {s["sandboxID"] for s in api.get("/v2/sandboxes", params={"limit": 100}).json()}
    new = after - before
    assert len(new) == 1, (before, after)
    terminal.type("exit")
    terminal.wait_for(r"Closing terminal connection")
    assert terminal.run("true")[0] == 0, "the CLI gave the terminal back"
    # `create` kills the sandbox it made when its terminal closes.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and new & {
        s["sandboxID"] for s in api.get("/v2/sandboxes", params={"limit": 100}).json()
    }:
        time.sleep(0.5)
    for sid in new:
        httpx.delete(f"{berth.api_url}/sandboxes/{sid}", headers={"X-API-Key": berth.api_key}, timeout=30)


def test_snapshot_commands_and_template_list_through_a_terminal(berth: Berth, api: httpx.Client, terminal: Terminal) -> None:
    from e2b import Sandbox

    sandbox = Sandbox.create(timeout=600)
    name = f"cli-snap-{uuid.uuid4().hex[:8]}"
    snapshot_ids: list[str] = []
    try:
        sid = sandbox.sandbox_id
        sandbox.files.write("/home/user/snapped.txt", "in the snapshot")
        code, screen = terminal.run(cli("sandbox", "snapshot", "create", sid, "--name", name), timeout=300)
        assert code == 0, screen
        listed = api.get("/snapshots", params={"sandboxID": sid}).json()
        snapshot_ids = [s["snapshotID"] for s in listed]
        assert len(snapshot_ids) == 1 and name in snapshot_ids[0], listed
        assert snapshot_ids[0] in screen, screen

        code, screen = terminal.run(cli("sandbox", "snapshot", "list", "--format", "json"))
        assert code == 0, screen
        listed_json = json.loads(screen[screen.index("["):screen.rindex("]") + 1])
        assert snapshot_ids[0] in [s["snapshotId"] for s in listed_json], screen  # the CLI's own JSON
        code, screen = terminal.run(cli("sandbox", "snapshot", "list", sid))
        assert code == 0 and name in screen, screen
        code, screen = terminal.run(cli("sandbox", "snapshot", "list", "--name", name))
        assert code == 0 and name in screen, screen

        restored = Sandbox.create(snapshot_ids[0], timeout=300)
        try:
            assert restored.files.read("/home/user/snapped.txt") == "in the snapshot"
        finally:
            restored.kill()

        code, screen = terminal.run(cli("sandbox", "snapshot", "delete", snapshot_ids[0]))
        assert code == 0, screen
        assert api.get("/snapshots", params={"sandboxID": sid}).json() == []
        snapshot_ids = []

        code, screen = terminal.run(cli("template", "list", "--format", "json"))
        assert code == 0, screen
        templates = json.loads(screen[screen.index("["):screen.rindex("]") + 1])
        assert "base" in [alias for t in templates for alias in t["aliases"]], screen
        code, screen = terminal.run(cli("template", "list"))
        assert code == 0 and "base" in screen, screen
    finally:
        for snapshot_id in snapshot_ids:
            api.delete(f"/templates/{snapshot_id}")
        sandbox.kill()

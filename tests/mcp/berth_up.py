"""A real `berth up` for the MCP tests: started on a free loopback port with a private
state directory (templates shared from /var/lib/berth/templates when present), its
E2B_* lines read from stdout, stopped by PID (SIGTERM, then SIGKILL)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sandbox_pool import free_sandbox_pool  # noqa: E402

E2B_LINE = re.compile(r"^\s*(?:export\s+)?(E2B_API_URL|E2B_SANDBOX_URL|E2B_API_KEY)=(\S+)\s*$")
STARTUP_TIMEOUT_S = float(os.environ.get("BERTH_STARTUP_TIMEOUT", "900"))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]



def sandbox_network_env() -> dict[str, str]:
    """Network flags for one `berth up` under test: a sandbox pool of its own and an
    egress ceiling admitting only the benchmarking range tests place their fake
    internet hosts in (ENVIRONMENT.md's network rule)."""
    return {
        "BERTH_SANDBOX_CIDR": free_sandbox_pool(),
        "BERTH_EGRESS_ALLOW": os.environ.get("BERTH_EGRESS_ALLOW", "198.18.0.0/15"),
    }


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.2)


class BerthUp:
    """`berth up ARGS…`; raises (after stopping it and removing its state) when it does
    not print its two E2B_*_URL lines. stdout is a pipe, so berth up prints no key: the
    first one is made with `berth keys create`."""

    def __init__(self, binary: str, *args: str):
        self.binary = binary
        self.state_dir = Path(tempfile.mkdtemp(prefix="berth-mcp-live-"))
        templates = Path(os.environ.get("BERTH_TEMPLATES_DIR", "/var/lib/berth/templates"))
        if templates.is_dir():
            (self.state_dir / "templates").symlink_to(templates)
        self.log_path = self.state_dir / "berth-up.log"
        self.env: dict[str, str] = {}
        self.extra_keys: list[str] = []
        listen = f"127.0.0.1:{free_port()}"
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [binary, "up", "--listen", listen, "--state-dir", str(self.state_dir), *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            start_new_session=True,
            env={**os.environ, **sandbox_network_env()},
        )
        ready = threading.Event()

        def read() -> None:
            for raw in self.process.stdout:
                log.write(raw)
                log.flush()
                match = E2B_LINE.match(raw.decode(errors="replace"))
                if match:
                    self.env[match.group(1)] = match.group(2)
                    if {"E2B_API_URL", "E2B_SANDBOX_URL"} <= self.env.keys():
                        ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(STARTUP_TIMEOUT_S) or len(self.env) != 2:
            self.stop()
            tail = self.log_path.read_text(errors="replace")[-4000:]
            self.remove_state()
            raise AssertionError(f"berth up did not start:\n{tail}")
        self.env["E2B_API_KEY"] = self.create_key("default")
        self.extra_keys.remove(self.env["E2B_API_KEY"])

    @property
    def api_url(self) -> str:
        return self.env["E2B_API_URL"]

    @property
    def sandbox_url(self) -> str:
        return self.env["E2B_SANDBOX_URL"]

    @property
    def api_key(self) -> str:
        return self.env["E2B_API_KEY"]

    def keys(self) -> list[str]:
        return [self.api_key, *self.extra_keys]

    def create_key(self, team: str) -> str:
        result = subprocess.run(
            [self.binary, "keys", "create", "--team", team, "--state-dir", str(self.state_dir)],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        key = result.stdout.strip().splitlines()[-1].split("=")[-1]
        self.extra_keys.append(key)
        return key

    def logs_without_key_lines(self) -> str:
        """The log minus the E2B_* lines berth up prints once on stdout (its own key)."""
        return "\n".join(
            line
            for line in self.log_path.read_text(errors="replace").splitlines()
            if not E2B_LINE.match(line)
        )

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def remove_state(self) -> None:
        shutil.rmtree(self.state_dir, ignore_errors=True)

    def shutdown(self) -> None:
        """Kill every sandbox the known keys can see, stop berth up (state kept for log
        checks; call remove_state after)."""
        for key in self.keys():
            try:
                kill_all(self.api_url, key)
            except httpx.HTTPError:
                pass
        self.stop()


def kill_all(api_url: str, key: str) -> None:
    headers = {"X-API-Key": key}
    listed = httpx.get(f"{api_url}/v2/sandboxes", headers=headers, params={"limit": 100}, timeout=30)
    if listed.status_code == 200:
        for sandbox in listed.json():
            httpx.delete(f"{api_url}/sandboxes/{sandbox['sandboxID']}", headers=headers, timeout=30)

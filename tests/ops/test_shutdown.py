"""`berth up` stopped the way a service manager stops a process group: whoever read its
output is gone first. It still shuts down whole (the sandbox network it made is
removed) and exits 0; writing its shutdown lines to a closed pipe must not end it."""

from __future__ import annotations

import ipaddress
import os
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from conftest import control_plane


def tables_naming(cidr: str) -> list[str]:
    """nftables tables whose rules name the sandbox pool `cidr`."""
    ruleset = subprocess.run(["nft", "list", "ruleset"], capture_output=True, text=True, check=True).stdout
    return [name for name, body in re.findall(r"^table \S+ (\S+) \{(.*?)^\}", ruleset, re.M | re.S) if cidr in body]


def links_in(cidr: str) -> list[str]:
    """Host links with an IPv4 address inside `cidr` (the pool's gateway link)."""
    pool = ipaddress.ip_network(cidr)
    shown = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, check=True).stdout
    found = []
    for line in shown.splitlines():
        fields = line.split()
        address = ipaddress.ip_interface(fields[3]).ip
        if address in pool:
            found.append(fields[1])
    return found


def test_a_stop_after_its_output_is_gone_still_removes_the_sandbox_network() -> None:
    binary = control_plane.berth_binary()
    state = Path(tempfile.mkdtemp(prefix="berth-ops-shutdown-"))
    templates = Path(os.environ.get("BERTH_TEMPLATES_DIR", "/var/lib/berth/templates"))
    if templates.is_dir():
        (state / "templates").symlink_to(templates)
    network = control_plane.sandbox_network_env()
    cidr = network["BERTH_SANDBOX_CIDR"]
    read_end, write_end = os.pipe()
    process = subprocess.Popen(
        [str(binary), "up", "--listen", f"127.0.0.1:{control_plane.free_loopback_port()}", "--state-dir", str(state)],
        stdin=subprocess.DEVNULL,
        stdout=write_end,
        stderr=write_end,
        start_new_session=True,
        env={
            # Not the session's metrics listener (conftest exports its address).
            **{key: value for key, value in os.environ.items() if key != "BERTH_METRICS_LISTEN"},
            "RUST_LOG": "info",
            "BERTH_LOG_FORMAT": "text",
            "BERTH_CRIU_STATE_DIR": os.environ.get("BERTH_CRIU_STATE_DIR", "/var/lib/berth"),
            "BERTH_POOL_SIZE": "0",
            **network,
        },
    )
    os.close(write_end)
    try:
        output = b""
        with os.fdopen(read_end, "rb", buffering=0) as reader:
            deadline = time.monotonic() + control_plane.STARTUP_TIMEOUT_S
            while b"E2B_SANDBOX_URL=" not in output:
                assert time.monotonic() < deadline and process.poll() is None, output.decode(errors="replace")
                chunk = reader.read(65536)
                if not chunk:
                    break
                output += chunk
            assert b"E2B_SANDBOX_URL=" in output, output.decode(errors="replace")
            # A bench of its own: the sandbox network exists while berth up runs.
            control_plane.poll(lambda: bool(tables_naming(cidr)), timeout=30, what="berth's nftables table")
            assert links_in(cidr), "no gateway link in the sandbox pool"
        # The reader is gone: every line berth writes from now on meets a closed pipe.
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=control_plane.STOP_TIMEOUT_S)
        assert code == 0, f"berth up exited {code} once its output was closed"
        assert tables_naming(cidr) == [], "the sandbox network's nftables table was left behind"
        assert links_in(cidr) == [], "the sandbox network's gateway link was left behind"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        # What a failed shutdown left of the network (the pool is this test's alone).
        for table in tables_naming(cidr):
            subprocess.run(["nft", "delete", "table", "inet", table], capture_output=True)
        for link in links_in(cidr):
            subprocess.run(["ip", "link", "del", link.split("@")[0]], capture_output=True)
        # This berth up started no sandbox: whatever a failed shutdown left mounted in its
        # state dir (envd's tmpfs, the resource views) is the dead daemon's own.
        for mount_point in sorted(control_plane.mounts_under(state), key=len, reverse=True):
            subprocess.run(["umount", "-l", mount_point], capture_output=True)
        control_plane.remove_state_dir(state)

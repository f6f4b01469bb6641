"""`berth doctor`: every check passes on this machine (time sync may only warn: no
systemd or chrony answers here); with features hidden in a private mount namespace it
fails and names them with their fixes; a dead LXCFS in the state dir is a warning with
its fix."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from conftest import control_plane

CHECKS = {
    "kernel",
    "user namespaces",
    "overlayfs",
    "cgroups",
    "CRIU",
    "nftables",
    "loop devices",
    "resource views",
    "disk space",
    "time sync",
}


def doctor(*args: str) -> subprocess.CompletedProcess:
    binary = control_plane.berth_binary()
    return subprocess.run([str(binary), "doctor", *args], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def test_doctor_passes_here() -> None:
    result = doctor("--json")
    assert result.returncode == 0, result.stdout + result.stderr
    checks = {check["name"]: check for check in json.loads(result.stdout)}
    assert set(checks) == CHECKS
    for name, check in checks.items():
        expected = {"ok", "warn"} if name == "time sync" else {"ok"}
        assert check["verdict"] in expected, check
    human = doctor()
    assert human.returncode == 0 and "ok    kernel" in human.stdout


def test_doctor_names_what_is_missing(tmp_path: Path) -> None:
    filesystems = tmp_path / "filesystems"
    filesystems.write_text("".join(line + "\n" for line in Path("/proc/filesystems").read_text().splitlines() if "overlay" not in line))
    binary = control_plane.berth_binary()
    # A private mount namespace: /dev without loop-control or fuse, /proc/filesystems
    # without overlay. Nothing outside the namespace changes.
    script = (
        f"mount -t tmpfs berth-ops-doctor-dev /dev && mount --bind {filesystems} /proc/filesystems && "
        f"exec {binary} doctor"
    )
    result = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAIL  loop devices" in result.stdout and "modprobe loop" in result.stdout
    assert "FAIL  overlayfs" in result.stdout and "modprobe overlay" in result.stdout
    assert "ok    kernel" in result.stdout
    assert "warn  resource views" in result.stdout and "modprobe fuse" in result.stdout


def test_a_dead_lxcfs_is_reported_with_its_fix(tmp_path: Path) -> None:
    """The LXCFS a state dir's sandboxes read their views from has died: its files
    answer nothing. doctor says so and how berth recovers. (Laid out as berth lays it
    out: LXCFS's `proc` bound at `<state>/views/proc`.)"""
    lxcfs = shutil.which("lxcfs")
    assert lxcfs, "lxcfs is not installed (scripts/install-deps.sh installs it)"
    state = tmp_path / "state"
    views = state / "views"
    root = tmp_path / "lxcfs"
    (views / "proc").mkdir(parents=True)
    root.mkdir()
    server = subprocess.Popen(
        [lxcfs, "--foreground", "--pidfile", str(tmp_path / "lxcfs.pid"), str(root)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not os.path.ismount(root):
            assert server.poll() is None and time.monotonic() < deadline, "lxcfs did not mount"
            time.sleep(0.01)
        subprocess.run(["mount", "--bind", str(root / "proc"), str(views / "proc")], check=True)
        alive = doctor("--state-dir", str(state))
        assert f"serving {views}" in alive.stdout, alive.stdout
        server.send_signal(signal.SIGKILL)
        server.wait(timeout=30)
        dead = doctor("--state-dir", str(state))
        assert "warn  resource views" in dead.stdout and "has died" in dead.stdout, dead.stdout
        assert "restart berth up" in dead.stdout
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(timeout=30)
        for mountpoint in (views / "proc", root):
            subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True)

"""`berth doctor`: every check passes on this machine (time sync may only warn: no
systemd or chrony answers here); with features hidden in a private mount namespace it
fails and names them with their fixes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from conftest import control_plane

CHECKS = {"kernel", "user namespaces", "overlayfs", "cgroups", "CRIU", "nftables", "loop devices", "disk space", "time sync"}


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
    # A private mount namespace: /dev without loop-control, /proc/filesystems without
    # overlay. Nothing outside the namespace changes.
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

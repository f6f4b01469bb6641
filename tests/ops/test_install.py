"""`berth install --root DIR`: the unit and env file are written under DIR and the unit is
enabled by the real `systemctl --root` (no running systemd needed); a second install
keeps the operator's env file; `--now` without a running systemd is refused before
anything is written. A real `systemctl stop/start` of the unit, under the host's systemd
booted as PID 1 of private namespaces, is test_systemd.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from conftest import control_plane


def install(root: Path, *args: str) -> subprocess.CompletedProcess:
    binary = control_plane.berth_binary()
    return subprocess.run([str(binary), "install", "--root", str(root), "--state-dir", "/srv/berth", *args],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def test_install_writes_and_enables_the_unit(tmp_path: Path) -> None:
    done = install(tmp_path, "--listen", "0.0.0.0:3000")
    assert done.returncode == 0, done.stderr
    unit = (tmp_path / "etc/systemd/system/berth.service").read_text()
    binary = os.path.realpath(control_plane.berth_binary())
    assert f"ExecStart={binary} up\n" in unit and "EnvironmentFile=-/etc/default/berth" in unit
    wanted = tmp_path / "etc/systemd/system/multi-user.target.wants/berth.service"
    assert wanted.is_symlink() and os.readlink(wanted) == "/etc/systemd/system/berth.service"
    env = tmp_path / "etc/default/berth"
    assert "BERTH_STATE_DIR=/srv/berth\n" in env.read_text() and "BERTH_LISTEN=0.0.0.0:3000\n" in env.read_text()
    assert env.stat().st_mode & 0o777 == 0o600
    env.write_text("BERTH_LISTEN=127.0.0.1:4000\n")
    again = install(tmp_path)
    assert again.returncode == 0 and "kept" in again.stderr
    assert env.read_text() == "BERTH_LISTEN=127.0.0.1:4000\n"


def test_now_needs_a_running_systemd(tmp_path: Path) -> None:
    refused = install(tmp_path, "--now")
    assert refused.returncode != 0 and "systemd is not running" in refused.stderr
    assert not any(tmp_path.iterdir()), "nothing is written when the unit cannot be started"

"""`berth gc`: a sandbox whose state directory a test deletes under it (while it runs) is
found — its cgroups and the processes in them, and its network namespace pin — and
removed with --yes; a `berth/<id>` cgroup that no claim and no state dir accounts for is
found and removed too; the daemon's other sandbox keeps running untouched."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

from conftest import Berth, Cli, poll


def gc(berth: Berth, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(berth.binary), "gc", "--state-dir", str(berth.state_dir), *args],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def is_mount_point(path: Path) -> bool:
    target = str(path)
    return any(line.split()[4] == target for line in Path("/proc/self/mountinfo").read_text().splitlines())


def test_gc_collects_an_unclaimed_cgroup_and_its_process(berth: Berth, cli: Cli) -> None:
    keeper = cli.ok("sandbox", "create", "--timeout", "300").stdout.strip()
    stray = f"gc-test-{uuid.uuid4().hex[:12]}"
    dirs = [Path("/sys/fs/cgroup") / controller / "berth" / stray for controller in ("pids", "memory")]
    process = subprocess.Popen(["sleep", "600"], stdin=subprocess.DEVNULL)
    try:
        for directory in dirs:
            directory.mkdir()
            (directory / "cgroup.procs").write_text(str(process.pid))
        garbage = json.loads(gc(berth, "--json").stdout)
        found = [g for g in garbage if g["kind"] == "unclaimed_cgroup" and g["sandbox"] == stray]
        assert len(found) == 1, garbage
        assert sorted(Path(d) for d in found[0]["dirs"]) == sorted(dirs) and found[0]["pids"] == [process.pid]
        # A live sandbox's cgroup is claimed: never listed.
        assert all(g.get("sandbox") != keeper for g in garbage)

        removed = gc(berth, "--yes")
        assert removed.returncode == 0, removed.stderr
        assert process.wait(timeout=30) == -9
        assert not any(d.exists() for d in dirs)
        assert cli.json("sandbox", "exec", keeper, "--", "echo alive")["stdout"] == "alive\n"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for directory in dirs:
            if directory.exists():
                directory.rmdir()
        cli.run("sandbox", "kill", keeper)


def test_gc_collects_an_orphan_and_nothing_else(cli: Cli, berth: Berth) -> None:
    keeper = cli.ok("sandbox", "create", "--timeout", "300").stdout.strip()
    victim = cli.ok("sandbox", "create", "--timeout", "300").stdout.strip()
    try:
        cli.ok("sandbox", "exec", victim, "--", "sleep 1000 &")
        assert not [g for g in json.loads(gc(berth, "--json").stdout) if g.get("sandbox") in (keeper, victim)]

        shutil.rmtree(berth.state_dir / "sandboxes" / victim)
        found = gc(berth, "--json")
        assert found.returncode == 0, found.stderr
        garbage = json.loads(found.stdout)
        mine = [g for g in garbage if g["kind"] == "sandbox_cgroup" and g["sandbox"] == victim]
        assert len(mine) == 1, garbage
        pins = [g for g in garbage if g["kind"] == "netns_pin" and g["sandbox"] == victim]
        pin = berth.state_dir / "net" / "netns" / victim
        assert [Path(p["path"]) for p in pins] == [pin], garbage
        assert is_mount_point(pin)
        assert mine[0]["pids"], "the orphan's processes are still running"
        assert all(g.get("sandbox") != keeper for g in garbage)
        pids = mine[0]["pids"]
        dirs = [Path(d) for d in mine[0]["dirs"]]
        assert all(d.is_dir() for d in dirs)
        assert "run again with --yes" in gc(berth).stderr

        removed = gc(berth, "--yes")
        assert removed.returncode == 0, removed.stderr
        assert not any(d.exists() for d in dirs)
        assert not is_mount_point(pin) and not pin.exists()
        poll(lambda: not any(Path(f"/proc/{pid}").exists() and f"/berth/{victim}" in Path(f"/proc/{pid}/cgroup").read_text(errors="replace") for pid in pids if Path(f"/proc/{pid}").exists()),
             timeout=30, what="the orphan's processes to be gone")
        assert [g for g in json.loads(gc(berth, "--json").stdout) if g.get("sandbox") == victim] == []
        # The live sandbox of the same daemon was not touched.
        assert cli.json("sandbox", "exec", keeper, "--", "echo alive")["stdout"] == "alive\n"
    finally:
        cli.run("sandbox", "kill", keeper)
        cli.run("sandbox", "kill", victim)

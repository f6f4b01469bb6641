"""Sandbox-sized resource views through `berth up` with the official SDK: `free`,
`/proc/meminfo`, `nproc`, `/proc/cpuinfo`, `/proc/stat`, `/sys/devices/system/cpu/online`
and `df` inside a sandbox show the resources of its template (cpuCount, memoryMB,
diskSizeMB), not the host's, and `/proc/uptime` counts from the sandbox's boot. The views
hold after a pause with memory, in a fork, in a sandbox from a snapshot and across a
restart of `berth up` (LXCFS, which serves them, outlives it)."""

from __future__ import annotations

import os
import secrets
import time
from dataclasses import dataclass
from typing import Iterator

import httpx
import pytest
from e2b import Sandbox, Template

from conftest import Berth

CPUS = 1
MEMORY_MB = 768
DISK_MB = 1024

PROBE = r"""
grep ^MemTotal: /proc/meminfo | awk '{print $2}'
grep ^MemFree: /proc/meminfo | awk '{print $2}'
free -m | awk '/^Mem:/ {print $2}'
nproc
grep -c ^processor /proc/cpuinfo
cat /sys/devices/system/cpu/online
grep -c '^cpu[0-9]' /proc/stat
python3 -c 'import os; print(os.cpu_count())'
df -m --output=size / | tail -1
cut -d' ' -f1 /proc/uptime
"""


@dataclass
class Seen:
    mem_total_kib: int
    mem_free_kib: int
    free_total_mib: int
    nproc: int
    processors: int
    online: str
    stat_cpus: int
    python_cpus: int
    root_size_mib: int
    uptime_s: float


def seen(sandbox: Sandbox) -> Seen:
    """What a command of the sandbox's user sees."""
    lines = sandbox.commands.run(PROBE).stdout.split()
    assert len(lines) == 10, lines
    return Seen(
        mem_total_kib=int(lines[0]),
        mem_free_kib=int(lines[1]),
        free_total_mib=int(lines[2]),
        nproc=int(lines[3]),
        processors=int(lines[4]),
        online=lines[5],
        stat_cpus=int(lines[6]),
        python_cpus=int(lines[7]),
        root_size_mib=int(lines[8]),
        uptime_s=float(lines[9]),
    )


def count_cpus(cpu_list: str) -> int:
    total = 0
    for part in cpu_list.split(","):
        first, _, last = part.partition("-")
        total += int(last or first) - int(first) + 1
    return total


def assert_sized(sandbox: Sandbox, cpus: int, memory_mb: int, disk_mb: int) -> Seen:
    view = seen(sandbox)
    assert view.mem_total_kib == memory_mb * 1024, view
    assert view.free_total_mib == memory_mb, view
    assert view.nproc == view.processors == view.stat_cpus == view.python_cpus == cpus, view
    assert count_cpus(view.online) == cpus, view
    # ext4 keeps a few percent of the image for itself.
    assert disk_mb * 0.85 <= view.root_size_mib <= disk_mb, view
    return view


@pytest.fixture(scope="module")
def sized(berth: Berth) -> Iterator[str]:
    """A template of the base image with its own resources."""
    name = f"views-{secrets.token_hex(4)}"
    Template.build(
        Template().from_template("base").run_cmd("true"),
        name,
        cpu_count=CPUS,
        memory_mb=MEMORY_MB,
    )
    try:
        yield name
    finally:
        with httpx.Client(base_url=berth.api_url, headers={"X-API-Key": berth.api_key}, timeout=120) as api:
            api.delete(f"/templates/{name}")


def kill_quietly(sandbox_id: str) -> None:
    try:
        Sandbox.kill(sandbox_id)
    except Exception:  # noqa: BLE001 - already gone is fine for cleanup
        pass


def test_a_sandbox_sees_its_resources_through_pause_fork_and_snapshot(api: httpx.Client, sized: str) -> None:
    started = time.monotonic()
    sandbox = Sandbox.create(sized, timeout=600)
    made = [sandbox.sandbox_id]
    snapshot = None
    try:
        first = assert_sized(sandbox, CPUS, MEMORY_MB, DISK_MB)
        # Counted from the sandbox's boot, not the host's.
        assert first.uptime_s <= time.monotonic() - started + 1, first
        assert "up " in sandbox.commands.run("uptime").stdout

        # Memory kept: the same views, the clock going on from where it stood.
        assert sandbox.pause() is True
        sandbox = Sandbox.connect(sandbox.sandbox_id, timeout=600)
        after_pause = assert_sized(sandbox, CPUS, MEMORY_MB, DISK_MB)
        assert after_pause.uptime_s >= first.uptime_s, (first, after_pause)

        # A fork sees its own cgroups: memory it takes is its own, not the source's.
        forks = [child for child in sandbox.fork(count=1, timeout=300) if isinstance(child, Sandbox)]
        assert len(forks) == 1
        fork = forks[0]
        made.append(fork.sandbox_id)
        assert_sized(fork, CPUS, MEMORY_MB, DISK_MB)
        source_before, fork_before = seen(sandbox).mem_free_kib, seen(fork).mem_free_kib
        fork.commands.run("head -c 200M /dev/zero > /dev/shm/ballast")
        source_after, fork_after = seen(sandbox).mem_free_kib, seen(fork).mem_free_kib
        assert fork_after <= fork_before - 190 * 1024, (fork_before, fork_after)
        assert source_after > source_before - 100 * 1024, (source_before, source_after)

        # A sandbox from a snapshot: the snapshot's resources.
        snapshot = sandbox.create_snapshot(name=f"views-snap-{secrets.token_hex(4)}")
        child = Sandbox.create(snapshot.snapshot_id, timeout=300)
        made.append(child.sandbox_id)
        assert_sized(child, CPUS, MEMORY_MB, DISK_MB)
    finally:
        for sandbox_id in made:
            kill_quietly(sandbox_id)
        if snapshot is not None:
            api.delete(f"/templates/{snapshot.snapshot_id}")


def test_base_sandboxes_see_the_default_resources(sandbox: Sandbox) -> None:
    """`base` runs with `berth up`'s defaults: 2 CPUs (or the host's, if fewer), 512 MiB,
    1 GiB of disk."""
    assert_sized(sandbox, min(2, os.cpu_count() or 1), 512, 1024)
    # envd's files API reads the views like any file.
    meminfo = sandbox.files.read("/proc/meminfo")
    assert meminfo.splitlines()[0].split() == ["MemTotal:", str(512 * 1024), "kB"], meminfo[:80]
    assert sandbox.files.read("/sys/devices/system/cpu/online").strip() == seen(sandbox).online


@pytest.mark.restarts_berth
def test_views_survive_a_restart_of_berth_up(berth: Berth, sized: str) -> None:
    running = Sandbox.create(sized, timeout=900)
    paused = Sandbox.create(sized, timeout=900)
    try:
        assert_sized(running, CPUS, MEMORY_MB, DISK_MB)
        assert paused.pause() is True
        pidfile = berth.state_dir / "views" / "lxcfs.pid"
        lxcfs = pidfile.read_text().strip()

        berth.restart()

        # LXCFS, detached from berth, served the running sandbox all along.
        assert pidfile.read_text().strip() == lxcfs
        assert os.path.exists(f"/proc/{lxcfs}")
        running = Sandbox.connect(running.sandbox_id, timeout=600)
        assert_sized(running, CPUS, MEMORY_MB, DISK_MB)
        paused = Sandbox.connect(paused.sandbox_id, timeout=600)
        assert_sized(paused, CPUS, MEMORY_MB, DISK_MB)
    finally:
        kill_quietly(running.sandbox_id)
        kill_quietly(paused.sandbox_id)

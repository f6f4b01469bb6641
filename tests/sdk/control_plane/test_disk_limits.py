"""`berth up` limits each sandbox's disk (blk-throttle rules on its loop device in the
root blkio group, cgroup v1): the rule exists while the sandbox runs, goes when it
pauses and comes back with the resume."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2b import Sandbox

from conftest import Berth

BLKIO = Path("/sys/fs/cgroup/blkio")
DEFAULT_WRITE_BPS = 256 << 20
DEFAULT_READ_BPS = 512 << 20


def disk_device(berth: Berth, sandbox_id: str) -> str | None:
    """`major:minor` of the loop device backing the sandbox's disk image, if any."""
    image = (berth.state_dir / "sandboxes" / sandbox_id / "disk.img").resolve()
    for block in Path("/sys/block").glob("loop*"):
        backing = block / "loop" / "backing_file"
        if backing.exists() and Path(backing.read_text().strip()) == image:
            return (block / "dev").read_text().strip()
    return None


def rules(name: str) -> list[str]:
    return (BLKIO / name).read_text().splitlines()


@pytest.mark.skipif(not BLKIO.is_dir(), reason="cgroup v1 blkio only")
def test_each_sandbox_disk_is_limited_while_it_runs(berth: Berth, sandbox: Sandbox) -> None:
    device = disk_device(berth, sandbox.sandbox_id)
    assert device is not None
    assert f"{device} {DEFAULT_WRITE_BPS}" in rules("blkio.throttle.write_bps_device")
    assert f"{device} {DEFAULT_READ_BPS}" in rules("blkio.throttle.read_bps_device")

    assert sandbox.pause() is True
    assert not any(rule.startswith(f"{device} ") for rule in rules("blkio.throttle.write_bps_device"))

    resumed = Sandbox.connect(sandbox.sandbox_id, timeout=600)
    device = disk_device(berth, resumed.sandbox_id)
    assert device is not None
    assert f"{device} {DEFAULT_WRITE_BPS}" in rules("blkio.throttle.write_bps_device")
    # Writes past the limit are slowed, never failed.
    resumed.commands.run("dd if=/dev/zero of=/home/user/f bs=1M count=16 oflag=direct && rm /home/user/f")

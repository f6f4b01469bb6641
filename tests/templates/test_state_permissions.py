"""berth's state is root's alone: after a template build, a create, a pause, a resume, a
snapshot, a sandbox from that snapshot and a fork, an unprivileged host uid (nobody,
65534) can read no file and list no directory anywhere under the state directory, and
the database and its WAL (keys' hashes, envd tokens, webhook secrets) are 0600.

The walk is made by root (it lists everything, never following symlinks: `base`'s
layers are symlinks into the shared template store, and never entering LXCFS's files
bound at `views/proc` and `views/cpu-online`: FUSE views of `/proc` and `/sys` that
show each reader its own numbers and hold no state), the check by one process that
`setpriv` runs as uid and gid 65534 without supplementary groups, opening each path.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import httpx
from e2b import Sandbox, Template

from conftest import Berth, unique

NOBODY = 65534

# Run as nobody: reads paths (one JSON list on stdin), prints those it could read.
CHECKER = """
import json, os, sys
readable = []
for path, is_dir in json.load(sys.stdin):
    try:
        if is_dir:
            os.listdir(path)
        else:
            os.close(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK))
        readable.append(path)
    except OSError:
        pass
json.dump(readable, sys.stdout)
"""


def lxcfs_mounts() -> set[str]:
    """Mount points of LXCFS filesystems on the host."""
    found = set()
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[fields.index("-") + 1] == "fuse.lxcfs":
            found.add(fields[4].replace("\\040", " "))
    return found


def every_path(root: Path) -> list[tuple[str, bool]]:
    paths: list[tuple[str, bool]] = [(str(root), True)]
    views = lxcfs_mounts()
    for directory, dirs, files in os.walk(root, followlinks=False):
        dirs[:] = [name for name in dirs if str(Path(directory) / name) not in views]
        files = [name for name in files if str(Path(directory) / name) not in views]
        for name in dirs + files:
            path = Path(directory) / name
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                continue
            paths.append((str(path), stat.S_ISDIR(mode)))
    return paths


def readable_by_nobody(paths: list[tuple[str, bool]]) -> list[str]:
    result = subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "/usr/bin/python3", "-c", CHECKER],
        input=json.dumps(paths),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_nothing_under_the_state_dir_is_readable_by_another_user(berth: Berth, api: httpx.Client) -> None:
    secret = unique("secret")
    name = unique("perms")
    Template.build(Template().from_template("base").run_cmd(f"echo {secret} > ~/built"), name)
    source = Sandbox.create(name, timeout=300)
    paused = Sandbox.create(name, timeout=300)
    made: list[Sandbox] = [source, paused]
    snapshot = None
    try:
        source.files.write("/home/user/state.txt", secret)
        source.beta_pause()
        source = Sandbox.connect(source.sandbox_id, timeout=300)
        assert source.files.read("/home/user/state.txt") == secret
        snapshot = source.create_snapshot(name=unique("snap"))
        restored = Sandbox.create(snapshot.snapshot_id, timeout=300)
        made.append(restored)
        assert restored.files.read("/home/user/state.txt") == secret
        forks = [child for child in source.fork(count=1, timeout=300) if isinstance(child, Sandbox)]
        made.extend(forks)
        assert len(forks) == 1 and forks[0].files.read("/home/user/built").strip() == secret
        # One sandbox stays paused during the walk: its memory image is on disk.
        paused.beta_pause()

        state = berth.state_dir
        for database in ("berth.db", "berth.db-wal"):
            mode = stat.S_IMODE((state / database).stat().st_mode)
            assert mode == 0o600, f"{database} is {oct(mode)}"
        paths = every_path(state)
        assert len(paths) > 100, "the walk saw the state"
        assert any("/checkpoints/" in p for p, _ in paths), "snapshot and template checkpoints were walked"
        assert any(p.endswith("disk.img") for p, _ in paths), "sandbox disks were walked"
        leaked = readable_by_nobody(paths)
        # The one exception: the envd binaries sandboxes bind (`envd/<hash>/berth-envd`,
        # world-readable as shipped, holding no state; a process that execs a file it
        # cannot read could not be checkpointed).
        binaries = {p for p, is_dir in paths if not is_dir and Path(p).parent.parent == state / "envd"}
        assert binaries, "the envd filesystem was walked"
        leaked = [p for p in leaked if p not in binaries]
        # The other: LXCFS's files (not walked, see above), reached through the 0711
        # `views/`, which nobody can list.
        views = state / "views"
        assert {str(views / "proc"), str(views / "cpu-online")} <= lxcfs_mounts(), "the views are served"
        assert str(views) not in leaked
        assert leaked == [], f"readable by uid {NOBODY}: {leaked[:20]}"
        # The checker itself can read what is readable (a control for the check).
        control = readable_by_nobody([("/etc/hostname", False), ("/", True)])
        assert control == ["/etc/hostname", "/"], control
    finally:
        for sandbox in made:
            try:
                sandbox.kill()
            except Exception:  # noqa: BLE001 - best-effort cleanup
                pass
        if snapshot is not None:
            api.delete(f"/templates/{snapshot.snapshot_id}")
        api.delete(f"/templates/{name}")

"""`sandbox.files` through the official Python SDK against berth-envd.

envd runs on this machine, so every effect is also checked directly on disk.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import random
import stat as stat_module
from datetime import timezone
from pathlib import Path
from typing import Iterator

import pytest
from e2b import (
    AsyncSandbox,
    FileNotFoundException,
    FilesystemEventType,
    FileType,
    InvalidArgumentException,
    SandboxException,
)

from helpers import poll

MIB = 1 << 20
BIG = 100 * MIB


def chunks_of(seed: int, total: int, chunk: int = 4 * MIB) -> Iterator[bytes]:
    """Deterministic pseudo-random data, produced lazily (a 100 MiB upload never sits in memory)."""
    rng = random.Random(seed)
    remaining = total
    while remaining:
        size = min(chunk, remaining)
        yield rng.randbytes(size)
        remaining -= size


def digest_of(seed: int, total: int) -> str:
    hasher = hashlib.sha256()
    for part in chunks_of(seed, total):
        hasher.update(part)
    return hasher.hexdigest()


def file_digest(path: Path) -> str:
    hasher = hashlib.sha256()
    with open(path, "rb") as source:
        while block := source.read(4 * MIB):
            hasher.update(block)
    return hasher.hexdigest()


# --- write / read -----------------------------------------------------------------------


def test_write_and_read_text(sandbox, scratch: Path):
    target = scratch / "hello.txt"
    info = sandbox.files.write(str(target), "héllo, berth\n")
    assert info.path == str(target)
    assert info.name == "hello.txt"
    assert info.type == FileType.FILE
    assert target.read_text() == "héllo, berth\n"
    assert sandbox.files.read(str(target)) == "héllo, berth\n"


def test_write_and_read_bytes(sandbox, scratch: Path):
    payload = bytes(range(256)) * 16
    target = scratch / "all-bytes.bin"
    sandbox.files.write(str(target), payload)
    assert target.read_bytes() == payload
    read = sandbox.files.read(str(target), format="bytes")
    assert isinstance(read, bytearray)
    assert bytes(read) == payload


def test_write_empty_file(sandbox, scratch: Path):
    target = scratch / "empty"
    sandbox.files.write(str(target), b"")
    assert target.read_bytes() == b""
    assert sandbox.files.read(str(target), format="bytes") == bytearray()


def test_write_overwrites(sandbox, scratch: Path):
    target = scratch / "over"
    sandbox.files.write(str(target), "a much longer first version")
    sandbox.files.write(str(target), "short")
    assert target.read_text() == "short"


def test_write_creates_parent_directories(sandbox, scratch: Path):
    target = scratch / "a" / "b" / "c" / "deep.txt"
    sandbox.files.write(str(target), "deep")
    assert target.read_text() == "deep"


def test_write_octet_stream_from_file_object(sandbox, scratch: Path):
    payload = os.urandom(3 * MIB + 17)
    target = scratch / "from-fileobj"
    sandbox.files.write(str(target), io.BytesIO(payload))
    assert target.read_bytes() == payload


def test_write_multipart_explicitly(sandbox, scratch: Path):
    payload = os.urandom(MIB + 3)
    target = scratch / "multipart"
    sandbox.files.write(str(target), payload, use_octet_stream=False)
    assert target.read_bytes() == payload


def test_gzip_upload_and_download(sandbox, scratch: Path):
    payload = b"compressible " * 50_000
    target = scratch / "gz.txt"
    sandbox.files.write(str(target), payload, gzip=True)
    assert target.read_bytes() == payload
    assert bytes(sandbox.files.read(str(target), format="bytes", gzip=True)) == payload


def test_write_files_many(sandbox, scratch: Path):
    entries = [{"path": str(scratch / f"multi-{i}.txt"), "data": f"content {i}"} for i in range(5)]
    infos = sandbox.files.write_files(entries)
    assert sorted(info.path for info in infos) == sorted(entry["path"] for entry in entries)
    for i in range(5):
        assert (scratch / f"multi-{i}.txt").read_text() == f"content {i}"


def test_stream_upload_and_download_100_mib(sandbox, scratch: Path):
    target = scratch / "big-stream.bin"
    info = sandbox.files.write(str(target), chunks_of(seed=7, total=BIG))
    assert info.path == str(target)
    expected = digest_of(seed=7, total=BIG)
    assert target.stat().st_size == BIG
    assert file_digest(target) == expected

    hasher = hashlib.sha256()
    size = 0
    with sandbox.files.read(str(target), format="stream") as stream:
        for block in stream:
            hasher.update(block)
            size += len(block)
    assert size == BIG
    assert hasher.hexdigest() == expected


def test_bytes_upload_and_download_100_mib(sandbox, scratch: Path):
    payload = b"".join(chunks_of(seed=11, total=BIG))
    target = scratch / "big-bytes.bin"
    sandbox.files.write(str(target), payload)
    assert target.stat().st_size == BIG
    assert file_digest(target) == hashlib.sha256(payload).hexdigest()
    read = sandbox.files.read(str(target), format="bytes")
    assert len(read) == BIG
    assert hashlib.sha256(read).hexdigest() == hashlib.sha256(payload).hexdigest()


def test_read_missing_file_raises_file_not_found(sandbox, scratch: Path):
    with pytest.raises(FileNotFoundException):
        sandbox.files.read(str(scratch / "nope.txt"))


def test_read_directory_is_an_error(sandbox, scratch: Path):
    with pytest.raises(SandboxException) as caught:
        sandbox.files.read(str(scratch))
    assert not isinstance(caught.value, FileNotFoundException)


# --- metadata ---------------------------------------------------------------------------


def test_metadata_is_stored_as_xattrs_and_reported(sandbox, scratch: Path):
    target = scratch / "with-meta.txt"
    info = sandbox.files.write(str(target), "m", metadata={"Owner": "alice", "purpose": "test"})
    assert info.metadata == {"owner": "alice", "purpose": "test"}
    assert os.getxattr(target, "user.e2b.owner") == b"alice"
    assert os.getxattr(target, "user.e2b.purpose") == b"test"
    assert sandbox.files.get_info(str(target)).metadata == {"owner": "alice", "purpose": "test"}
    listed = {entry.name: entry for entry in sandbox.files.list(str(scratch))}
    assert listed["with-meta.txt"].metadata == {"owner": "alice", "purpose": "test"}


def test_metadata_set_out_of_band_is_reported(sandbox, scratch: Path):
    target = scratch / "xattr-by-hand"
    target.write_text("x")
    os.setxattr(target, "user.e2b.source", b"manual")
    os.setxattr(target, "user.unrelated", b"hidden")
    assert sandbox.files.get_info(str(target)).metadata == {"source": "manual"}


def test_no_metadata_reads_as_none(sandbox, scratch: Path):
    target = scratch / "plain"
    target.write_text("x")
    assert sandbox.files.get_info(str(target)).metadata is None


# --- list / exists / get_info -----------------------------------------------------------


@pytest.fixture()
def tree(scratch: Path) -> Path:
    root = scratch / "tree"
    (root / "a" / "b" / "c").mkdir(parents=True)
    (root / "top.txt").write_text("top")
    (root / "a" / "mid.txt").write_text("mid")
    (root / "a" / "b" / "low.txt").write_text("low")
    (root / "a" / "b" / "c" / "bottom.txt").write_text("bottom")
    return root


def listed_paths(sandbox, root: Path, depth: int) -> set[str]:
    return {str(Path(entry.path).relative_to(root)) for entry in sandbox.files.list(str(root), depth=depth)}


def test_list_depth_one(sandbox, tree: Path):
    entries = {entry.name: entry for entry in sandbox.files.list(str(tree))}
    assert set(entries) == {"a", "top.txt"}
    assert entries["a"].type == FileType.DIR
    assert entries["top.txt"].type == FileType.FILE
    assert entries["top.txt"].size == 3
    assert entries["top.txt"].path == str(tree / "top.txt")


def test_list_with_depth(sandbox, tree: Path):
    assert listed_paths(sandbox, tree, 2) == {"a", "top.txt", "a/b", "a/mid.txt"}
    assert listed_paths(sandbox, tree, 3) == {"a", "top.txt", "a/b", "a/mid.txt", "a/b/c", "a/b/low.txt"}
    assert listed_paths(sandbox, tree, 10) == {
        "a", "top.txt", "a/b", "a/mid.txt", "a/b/c", "a/b/low.txt", "a/b/c/bottom.txt",
    }


def test_list_depth_zero_is_rejected_by_the_sdk(sandbox, tree: Path):
    with pytest.raises(InvalidArgumentException):
        sandbox.files.list(str(tree), depth=0)


def test_list_missing_directory(sandbox, scratch: Path):
    with pytest.raises(FileNotFoundException):
        sandbox.files.list(str(scratch / "missing"))


def test_list_a_file_is_invalid(sandbox, tree: Path):
    with pytest.raises(InvalidArgumentException):
        sandbox.files.list(str(tree / "top.txt"))


def test_exists(sandbox, tree: Path):
    assert sandbox.files.exists(str(tree / "top.txt")) is True
    assert sandbox.files.exists(str(tree / "a")) is True
    assert sandbox.files.exists(str(tree / "nothing-here")) is False


def test_get_info_of_a_file(sandbox, scratch: Path):
    target = scratch / "info.txt"
    target.write_text("12345")
    target.chmod(0o640)
    on_disk = target.stat()
    info = sandbox.files.get_info(str(target))
    assert info.name == "info.txt"
    assert info.path == str(target)
    assert info.type == FileType.FILE
    assert info.size == 5
    assert info.mode & 0o777 == 0o640
    assert info.permissions == "-rw-r-----"
    assert info.owner == "root"
    assert info.group == "root"
    assert info.symlink_target is None
    modified = info.modified_time.astimezone(timezone.utc).timestamp()
    assert abs(modified - on_disk.st_mtime) < 1.0, "modified_time must be the file's mtime"


def test_get_info_of_a_directory(sandbox, scratch: Path):
    directory = scratch / "dir"
    directory.mkdir(mode=0o755)
    directory.chmod(0o755)
    info = sandbox.files.get_info(str(directory))
    assert info.type == FileType.DIR
    assert info.mode & 0o777 == 0o755
    assert info.permissions == "drwxr-xr-x"


def test_get_info_of_a_symlink(sandbox, scratch: Path):
    (scratch / "target.txt").write_text("t")
    link = scratch / "link"
    link.symlink_to(scratch / "target.txt")
    info = sandbox.files.get_info(str(link))
    # As E2B's envd: the target's type, with the link's target named.
    assert info.type == FileType.FILE
    assert info.symlink_target == str(scratch / "target.txt")


def test_get_info_missing(sandbox, scratch: Path):
    with pytest.raises(FileNotFoundException):
        sandbox.files.get_info(str(scratch / "missing"))


# --- make_dir / rename / remove ---------------------------------------------------------


def test_make_dir(sandbox, scratch: Path):
    target = scratch / "x" / "y" / "z"
    assert sandbox.files.make_dir(str(target)) is True
    assert target.is_dir()
    assert sandbox.files.make_dir(str(target)) is False


def test_make_dir_over_a_file_is_invalid(sandbox, scratch: Path):
    (scratch / "file").write_text("f")
    with pytest.raises(InvalidArgumentException):
        sandbox.files.make_dir(str(scratch / "file"))


def test_rename_file(sandbox, scratch: Path):
    source = scratch / "old.txt"
    source.write_text("moving")
    info = sandbox.files.rename(str(source), str(scratch / "new.txt"))
    assert info.path == str(scratch / "new.txt")
    assert info.name == "new.txt"
    assert not source.exists()
    assert (scratch / "new.txt").read_text() == "moving"


def test_rename_directory_into_new_parent(sandbox, tree: Path, scratch: Path):
    info = sandbox.files.rename(str(tree / "a"), str(scratch / "moved" / "a2"))
    assert info.type == FileType.DIR
    assert (scratch / "moved" / "a2" / "b" / "low.txt").read_text() == "low"
    assert not (tree / "a").exists()


def test_rename_missing_source(sandbox, scratch: Path):
    with pytest.raises(FileNotFoundException):
        sandbox.files.rename(str(scratch / "ghost"), str(scratch / "still-ghost"))


def test_remove_file_and_directory(sandbox, tree: Path):
    sandbox.files.remove(str(tree / "top.txt"))
    assert not (tree / "top.txt").exists()
    sandbox.files.remove(str(tree / "a"))
    assert not (tree / "a").exists()
    assert list(tree.iterdir()) == []


# --- users and ownership ----------------------------------------------------------------


def owner_of(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_uid, stat.st_gid


def test_write_as_user_owns_file_and_new_parents(sandbox, test_user, user_scratch: Path):
    target = user_scratch / "new-dir" / "owned.txt"
    sandbox.files.write(str(target), "mine", user=test_user.name)
    assert owner_of(target) == (test_user.uid, test_user.gid)
    assert owner_of(target.parent) == (test_user.uid, test_user.gid)
    info = sandbox.files.get_info(str(target), user=test_user.name)
    assert info.owner == test_user.name
    assert info.group == test_user.name


def test_write_as_root_is_owned_by_root(sandbox, scratch: Path):
    target = scratch / "root-owned"
    sandbox.files.write(str(target), "r", user="root")
    assert owner_of(target) == (0, 0)


def test_relative_and_tilde_paths_resolve_in_the_users_home(sandbox, test_user, user_scratch: Path):
    relative = f"{user_scratch.name}/relative.txt"
    sandbox.files.write(relative, "rel", user=test_user.name)
    assert (user_scratch / "relative.txt").read_text() == "rel"
    assert sandbox.files.read(f"~/{user_scratch.name}/relative.txt", user=test_user.name) == "rel"
    assert owner_of(user_scratch / "relative.txt") == (test_user.uid, test_user.gid)


def test_make_dir_as_user(sandbox, test_user, user_scratch: Path):
    target = user_scratch / "p" / "q"
    assert sandbox.files.make_dir(str(target), user=test_user.name) is True
    assert owner_of(target) == (test_user.uid, test_user.gid)
    assert owner_of(target.parent) == (test_user.uid, test_user.gid)


# --- watch ------------------------------------------------------------------------------


def test_watch_dir_recursive_sees_all_event_kinds(sandbox, scratch: Path):
    root = scratch / "watched"
    (root / "sub").mkdir(parents=True)
    handle = sandbox.files.watch_dir(str(root), recursive=True)
    try:
        seen: list = []

        def collect_until(predicate) -> None:
            def check() -> bool:
                seen.extend(handle.get_new_events())
                return predicate()

            poll(check, interval=0.05, what="watch events")

        sandbox.files.write(str(root / "sub" / "inner.txt"), "inner")
        sandbox.files.write(str(root / "top.txt"), "top")
        (root / "top.txt").chmod(0o600)
        sandbox.files.rename(str(root / "top.txt"), str(root / "renamed.txt"))
        sandbox.files.remove(str(root / "renamed.txt"))
        wanted = {
            ("sub/inner.txt", FilesystemEventType.CREATE),
            ("sub/inner.txt", FilesystemEventType.WRITE),
            ("top.txt", FilesystemEventType.CREATE),
            ("top.txt", FilesystemEventType.CHMOD),
            ("top.txt", FilesystemEventType.RENAME),
            ("renamed.txt", FilesystemEventType.REMOVE),
        }
        collect_until(lambda: wanted <= {(e.name, e.type) for e in seen})
    finally:
        handle.stop()


def test_watch_dir_non_recursive_ignores_subdirectories(sandbox, scratch: Path):
    root = scratch / "flat"
    (root / "sub").mkdir(parents=True)
    handle = sandbox.files.watch_dir(str(root))
    try:
        (root / "sub" / "hidden.txt").write_text("not reported")
        (root / "marker.txt").write_text("reported")
        seen: list = []

        def marker_seen() -> bool:
            seen.extend(handle.get_new_events())
            return any(e.name == "marker.txt" for e in seen)

        poll(marker_seen, interval=0.05, what="the marker event")
        assert not any("hidden" in e.name for e in seen)
    finally:
        handle.stop()


def test_watch_dir_include_entry(sandbox, scratch: Path):
    root = scratch / "entries"
    root.mkdir()
    handle = sandbox.files.watch_dir(str(root), include_entry=True)
    try:
        (root / "e.txt").write_text("12345")
        seen: list = []

        def created() -> bool:
            seen.extend(handle.get_new_events())
            return any(e.name == "e.txt" and e.type == FilesystemEventType.CREATE for e in seen)

        poll(created, interval=0.05, what="the create event")
        event = next(e for e in seen if e.name == "e.txt" and e.type == FilesystemEventType.CREATE)
        assert event.entry is not None
        assert event.entry.path == str(root / "e.txt")
        assert event.entry.type == FileType.FILE
    finally:
        handle.stop()


def test_watch_missing_directory(sandbox, scratch: Path):
    with pytest.raises(FileNotFoundException):
        sandbox.files.watch_dir(str(scratch / "missing"))


def test_watch_stopped_handle_is_gone(sandbox, scratch: Path):
    handle = sandbox.files.watch_dir(str(scratch))
    handle.stop()
    with pytest.raises(SandboxException):
        handle.get_new_events()


def test_async_watch_dir_stream_recursive(envd, scratch: Path):
    """AsyncSandbox uses the streaming WatchDir RPC (the sync SDK polls CreateWatcher)."""
    root = scratch / "streamed"
    (root / "deep").mkdir(parents=True)

    async def scenario() -> list:
        sandbox = await AsyncSandbox.create()
        events: list = []
        changed = asyncio.Event()

        def on_event(event) -> None:
            events.append(event)
            changed.set()

        handle = await sandbox.files.watch_dir(str(root), on_event=on_event, recursive=True, timeout=0)
        try:
            await sandbox.files.write(str(root / "deep" / "x.txt"), "x")
            await sandbox.files.write(str(root / "y.txt"), "y")
            wanted = {("deep/x.txt", FilesystemEventType.CREATE), ("y.txt", FilesystemEventType.CREATE)}

            async def until_seen() -> None:
                while not wanted <= {(e.name, e.type) for e in events}:
                    changed.clear()
                    await changed.wait()

            await asyncio.wait_for(until_seen(), timeout=30)
        finally:
            await handle.stop()
        return events

    events = asyncio.run(scenario())
    assert any(e.name == "deep/x.txt" for e in events)


def test_written_file_is_a_regular_0644_file(sandbox, scratch: Path):
    target = scratch / "mode.txt"
    sandbox.files.write(str(target), "m")
    assert stat_module.S_ISREG(target.stat().st_mode)
    assert target.stat().st_mode & 0o777 == 0o644

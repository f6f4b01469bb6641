"""Volumes through `berth up` with the official SDK (e2b==2.63.0): the volumes API, the
volume content API (`Volume` file methods, no sandbox needed; the SDK finds it through
`E2B_VOLUME_API_URL`), mounts shared by sandboxes, data across kill, pause/resume, fork
and a restart, a full volume, the delete-while-mounted refusal, and team isolation."""

from __future__ import annotations

import os
import secrets
from typing import Iterator

import httpx
import pytest
from e2b import Sandbox, Volume
from e2b.exceptions import NotFoundException, VolumeException

from conftest import Berth


@pytest.fixture(scope="module", autouse=True)
def volume_api(berth: Berth) -> Iterator[None]:
    os.environ["E2B_VOLUME_API_URL"] = berth.api_url
    yield


@pytest.fixture
def volume(berth: Berth) -> Iterator[Volume]:
    created = Volume.create(f"vol-{secrets.token_hex(4)}")
    try:
        yield created
    finally:
        Volume.destroy(created.volume_id)


def mounted(volume: Volume, path: str = "/mnt/data", **kwargs) -> Sandbox:
    return Sandbox.create(timeout=600, volume_mounts={path: volume}, **kwargs)


def test_volume_crud(api: httpx.Client) -> None:
    name = f"crud-{secrets.token_hex(4)}"
    vol = Volume.create(name)
    try:
        assert vol.name == name and vol.token
        info = Volume.get_info(vol.volume_id)
        assert (info.volume_id, info.name, info.token) == (vol.volume_id, name, vol.token)
        assert any(v.volume_id == vol.volume_id for v in Volume.list())
        with pytest.raises(Exception):
            Volume.create(name)
        assert api.post("/volumes", json={"name": "bad/name"}).status_code == 400
    finally:
        assert Volume.destroy(vol.volume_id) is True
    assert Volume.destroy(vol.volume_id) is False
    with pytest.raises(NotFoundException):
        Volume.get_info(vol.volume_id)


def test_volume_file_methods_without_a_sandbox(volume: Volume) -> None:
    written = volume.write_file("/notes/hello.txt", "hello volume")
    assert written.name == "hello.txt" and written.size == len("hello volume")
    assert written.uid == 1000 and written.gid == 1000, "new files belong to the volume's user"
    assert volume.read_file("/notes/hello.txt") == "hello volume"
    assert volume.read_file("notes/hello.txt", format="bytes") == b"hello volume"
    made = volume.make_dir("/a/b/c", force=True)
    assert made.type.value == "directory" and made.path == "/a/b/c"
    with pytest.raises(Exception):
        volume.make_dir("/x/y")  # missing parent without force
    names = {entry.name for entry in volume.list("/")}
    assert {"notes", "a"} <= names
    deep = {entry.path for entry in volume.list("/a", depth=3)}
    assert {"/a/b", "/a/b/c"} <= deep
    stat = volume.get_info("/notes/hello.txt")
    assert stat.type.value == "file" and stat.mode == 0o644
    assert volume.exists("/notes/hello.txt") and not volume.exists("/nope")
    updated = volume.update_metadata("/notes/hello.txt", mode=0o600)
    assert updated.mode == 0o600
    big = os.urandom(3 * 1024 * 1024)
    volume.write_file("/big.bin", big)
    assert volume.read_file("/big.bin", format="bytes") == big
    volume.remove("/a")
    assert not volume.exists("/a/b/c")
    with pytest.raises(NotFoundException):
        volume.read_file("/a/b/c")
    with pytest.raises(Exception):
        volume.read_file("/../../etc/passwd")


def test_two_sandboxes_share_a_volume_and_data_outlives_them(api: httpx.Client, volume: Volume) -> None:
    a = mounted(volume, "/mnt/data")
    b = mounted(volume, "/home/user/shared")
    try:
        a.files.write("/mnt/data/from-a.txt", "written by a")
        assert b.files.read("/home/user/shared/from-a.txt") == "written by a"
        b.commands.run("echo from-b >> /home/user/shared/from-a.txt")
        assert a.commands.run("cat /mnt/data/from-a.txt").stdout == "written by afrom-b\n"
        assert a.commands.run("stat -c %U /mnt/data/from-a.txt").stdout.strip() == "user"
        detail = api.get(f"/sandboxes/{a.sandbox_id}").json()
        assert detail["volumeMounts"] == [{"name": volume.name, "path": "/mnt/data"}]
        # The content API sees the sandboxes' writes, and they see its.
        assert "from-b" in volume.read_file("/from-a.txt")
        volume.write_file("/from-api.txt", "api")
        assert a.files.read("/mnt/data/from-api.txt") == "api"
        a.commands.run("echo user-writes > /mnt/data/by-user.txt")
    finally:
        a.kill()
        b.kill()
    c = mounted(volume, "/data")
    try:
        assert c.files.read("/data/by-user.txt") == "user-writes\n"
    finally:
        c.kill()


def test_deleting_a_mounted_volume_is_refused_naming_the_sandbox(api: httpx.Client, volume: Volume) -> None:
    sandbox = mounted(volume)
    try:
        refused = api.delete(f"/volumes/{volume.volume_id}")
        assert refused.status_code == 409, refused.text
        assert sandbox.sandbox_id in refused.json()["message"]
        sandbox.pause()
        refused = api.delete(f"/volumes/{volume.volume_id}")
        assert refused.status_code == 409 and sandbox.sandbox_id in refused.json()["message"]
    finally:
        Sandbox.kill(sandbox.sandbox_id)
    # Killed: the volume is free again (the fixture deletes it).


def test_mount_paths_and_names_are_validated(api: httpx.Client, volume: Volume) -> None:
    for path in ["relative", "/", "/proc/x", "/etc", "/usr/lib/x"]:
        response = api.post(
            "/v2/sandboxes",
            json={"templateID": "base", "volumeMounts": [{"name": volume.name, "path": path}]},
        )
        assert response.status_code == 400, (path, response.text)
    duplicate = api.post(
        "/v2/sandboxes",
        json={
            "templateID": "base",
            "volumeMounts": [{"name": volume.name, "path": "/mnt/a"}, {"name": volume.name, "path": "/mnt/a/"}],
        },
    )
    assert duplicate.status_code == 400, duplicate.text
    missing = api.post("/v2/sandboxes", json={"templateID": "base", "volumeMounts": [{"name": "no-such-volume", "path": "/mnt/a"}]})
    assert missing.status_code == 400 and "no-such-volume" in missing.text


def test_a_volume_across_pause_resume_and_in_a_fork(volume: Volume) -> None:
    sandbox = mounted(volume)
    try:
        sandbox.commands.run("echo before-pause > /mnt/data/state")
        # A process keeps a file of the volume open across the checkpoints.
        sandbox.commands.run(
            "sh -c 'exec 3>>/mnt/data/held; while sleep 0.1; do if [ -e /mnt/data/go ]; then echo tick >&3; rm /mnt/data/go; fi; done'",
            background=True,
        )
        assert sandbox.pause() is True
        assert volume.read_file("/state") == "before-pause\n", "paused: files stay reachable"
        resumed = Sandbox.connect(sandbox.sandbox_id, timeout=600)
        resumed.files.write("/mnt/data/go", "")
        poll_content(volume, "/held", "tick")
        forks = [f for f in resumed.fork(count=1, timeout=300) if isinstance(f, Sandbox)]
        assert len(forks) == 1
        fork = forks[0]
        try:
            fork.commands.run("echo from-fork > /mnt/data/fork.txt")
            assert resumed.files.read("/mnt/data/fork.txt") == "from-fork\n", "the fork mounts the same volume"
            assert volume.read_file("/fork.txt") == "from-fork\n"
        finally:
            fork.kill()
    finally:
        Sandbox.kill(sandbox.sandbox_id)


def poll_content(volume: Volume, path: str, text: str) -> None:
    import time

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if volume.exists(path) and text in volume.read_file(path):
            return
        time.sleep(0.1)
    raise AssertionError(f"{path} never contained {text!r}")


def test_a_full_volume_is_enospc_inside(volume: Volume) -> None:
    sandbox = mounted(volume)
    try:
        result = sandbox.commands.run(
            "dd if=/dev/zero of=/mnt/data/fill bs=1M count=400 2>&1; echo status=$?", timeout=120
        )
        assert "No space left on device" in result.stdout, result.stdout
        assert "status=0" not in result.stdout
        # The sandbox's own disk is untouched by the full volume.
        sandbox.files.write("/home/user/ok.txt", "still writable")
        with pytest.raises(Exception):
            volume.write_file("/more.bin", os.urandom(1024 * 1024))
        sandbox.commands.run("rm /mnt/data/fill")
        volume.write_file("/more.bin", b"x")
    finally:
        sandbox.kill()


def test_other_teams_cannot_see_mount_or_read_a_volume(berth: Berth, other_team_key: str, volume: Volume) -> None:
    other = {"api_key": other_team_key}
    assert all(v.volume_id != volume.volume_id for v in Volume.list(**other))
    with pytest.raises(NotFoundException):
        Volume.get_info(volume.volume_id, **other)
    assert Volume.destroy(volume.volume_id, **other) is False
    with httpx.Client(base_url=berth.api_url, headers={"X-API-Key": other_team_key}) as client:
        created = client.post(
            "/v2/sandboxes",
            json={"templateID": "base", "volumeMounts": [{"name": volume.name, "path": "/mnt/x"}]},
        )
        assert created.status_code == 400, created.text
    # The content API needs this volume's own token: another volume's token is refused.
    theirs = Volume.create(f"theirs-{secrets.token_hex(4)}", **other)
    try:
        volume.write_file("/private.txt", "mine")
        intruder = Volume(volume.volume_id, volume.name, token=theirs.token)
        with pytest.raises(Exception):
            intruder.read_file("/private.txt")
        response = httpx.get(
            f"{berth.api_url}/volumecontent/{volume.volume_id}/file",
            params={"path": "/private.txt"},
            headers={"Authorization": f"Bearer {theirs.token}"},
        )
        assert response.status_code == 401
        no_token = httpx.get(f"{berth.api_url}/volumecontent/{volume.volume_id}/dir", params={"path": "/"})
        assert no_token.status_code == 401
    finally:
        Volume.destroy(theirs.volume_id, **other)


@pytest.mark.restarts_berth
def test_volume_data_survives_a_restart(berth: Berth) -> None:
    vol = Volume.create(f"restart-{secrets.token_hex(4)}")
    sandbox = mounted(vol)
    try:
        sandbox.files.write("/mnt/data/before.txt", "before restart")
        berth.restart()
        assert vol.read_file("/before.txt") == "before restart"
        again = mounted(vol, "/srv/data")
        try:
            again.files.write("/srv/data/after.txt", "after restart")
            if sandbox.sandbox_id in {s.sandbox_id for s in Sandbox.list().next_items()}:
                assert Sandbox.connect(sandbox.sandbox_id).files.read("/mnt/data/after.txt") == "after restart"
        finally:
            again.kill()
    finally:
        try:
            Sandbox.kill(sandbox.sandbox_id)
        except Exception:  # reported killed by the restart
            pass
        Volume.destroy(vol.volume_id)

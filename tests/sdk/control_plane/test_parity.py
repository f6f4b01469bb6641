"""E2B parity (issue 16): behaviours a user of the official SDKs meets that must match
E2B's cloud — signed file URLs that name no sandbox, and the rest of the sweep."""

from __future__ import annotations

import time
import urllib.error
import urllib.request

import httpx
from e2b import Sandbox

from conftest import Berth, poll


def fetch(url: str, data: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """`urllib` as a user's script or a browser would: no SDK, no routing headers."""
    request = urllib.request.Request(url, data=data, headers=headers or {}, method="POST" if data else "GET")
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read()


def test_signed_file_urls_name_no_sandbox_and_reach_the_one_that_signed(berth: Berth) -> None:
    first = Sandbox.create(timeout=300, secure=True)
    second = Sandbox.create(timeout=300, secure=True)
    try:
        first.files.write("/home/user/note.txt", "first's note")
        second.files.write("/home/user/note.txt", "second's note")

        url = first.download_url("/home/user/note.txt")
        assert url.startswith(f"{berth.sandbox_url}/files?"), url
        assert first.sandbox_id not in url and "signature=" in url
        assert fetch(url) == (200, b"first's note")
        assert fetch(second.download_url("/home/user/note.txt")) == (200, b"second's note")

        expiring = first.download_url("/home/user/note.txt", use_signature_expiration=120)
        assert "signature_expiration=" in expiring
        assert fetch(expiring) == (200, b"first's note")

        # Uploads: multipart POST to the signed upload URL, as the SDK documents.
        upload = second.upload_url("/home/user/uploaded.txt", use_signature_expiration=120)
        answer = httpx.post(upload, files={"file": ("uploaded.txt", b"sent by a link")}, timeout=60)
        assert answer.status_code == 200, answer.text
        assert second.files.read("/home/user/uploaded.txt") == "sent by a link"
        assert not first.files.exists("/home/user/uploaded.txt")

        # A read link grants no write, and a link for one path no other path.
        read_link = first.download_url("/home/user/note.txt")
        status, _ = fetch(read_link, data=b"x", headers={"Content-Type": "application/octet-stream"})
        assert status == 401
        other_path = read_link.replace("note.txt", "other.txt", 1)
        assert fetch(other_path)[0] == 401

        # Expired: signed for a moment already past.
        expired = first.download_url("/home/user/note.txt", use_signature_expiration=-5)
        status, body = fetch(expired)
        assert status == 401 and b"expired" in body, body
    finally:
        first.kill()
        second.kill()


def test_forged_signed_urls_reveal_nothing(berth: Berth) -> None:
    sandbox = Sandbox.create(timeout=120, secure=True)
    try:
        genuine = sandbox.download_url("/home/user/.bashrc")
        assert fetch(genuine)[0] == 200
        forged = fetch(f"{berth.sandbox_url}/files?path=%2Fhome%2Fuser%2F.bashrc&signature=v1_AAAA")
        garbage = fetch(f"{berth.sandbox_url}/files?path=x&signature=nonsense&signature_expiration=1")
        not_a_number = fetch(f"{berth.sandbox_url}/files?path=x&signature=v1_x&signature_expiration=soon")
    finally:
        sandbox.kill()
    # The same answer once no sandbox exists at all: the refusal says nothing about who runs.
    after_kill = fetch(genuine)
    for status, body in (forged, garbage, not_a_number, after_kill):
        assert status == 401, body
        assert body == forged[1], body
        assert sandbox.sandbox_id.encode() not in body
    # Unsigned, sandbox-less `/files` is not a sandbox request at all.
    assert httpx.get(f"{berth.sandbox_url}/files", params={"path": "x"}, timeout=30).status_code == 404


def test_symlinks_report_their_targets_type_and_path(sandbox: Sandbox) -> None:
    from e2b import FileType

    sandbox.files.write("/home/user/links/real.txt", "target")
    sandbox.files.make_dir("/home/user/links/realdir")
    watch = sandbox.files.watch_dir("/home/user/links", include_entry=True)
    try:
        sandbox.commands.run(
            "cd /home/user/links && ln -s real.txt file-link && ln -s realdir dir-link && ln -s gone broken"
        )
        expected = {
            "file-link": (FileType.FILE, "/home/user/links/real.txt"),
            "dir-link": (FileType.DIR, "/home/user/links/realdir"),
            "broken": (None, "/home/user/links/broken"),
        }
        for name, (kind, target) in expected.items():
            info = sandbox.files.get_info(f"/home/user/links/{name}")
            assert (info.type, info.symlink_target) == (kind, target), name
            assert info.permissions.startswith("L"), info.permissions
        listed = {entry.name: entry for entry in sandbox.files.list("/home/user/links")}
        # A dangling link has no type, which the SDK's `list` skips (as against E2B).
        assert "broken" not in listed
        for name, (kind, target) in expected.items():
            if kind is not None:
                assert (listed[name].type, listed[name].symlink_target) == (kind, target), name
        assert listed["real.txt"].symlink_target is None

        seen: dict[str, object] = {}

        def all_seen() -> bool:
            for event in watch.get_new_events():
                if event.entry is not None:
                    seen[event.name] = event.entry
            return set(expected) <= seen.keys()

        poll(all_seen, timeout=30, what="create events of the three links")
        for name, (kind, target) in expected.items():
            entry = seen[name]
            assert (entry.type, entry.symlink_target) == (kind, target), name
    finally:
        watch.stop()


def test_procfs_and_sysfs_files_are_read_in_every_mode(berth: Berth, sandbox: Sandbox) -> None:
    # `stat` says 0 bytes (procfs) or a page (sysfs) for these; their content is what
    # `cat` prints. (`/proc/meminfo` is a resource view with a true size: test_views.py.)
    for path in ("/proc/self/status", "/proc/filesystems", "/sys/kernel/mm/transparent_hugepage/enabled"):
        if path.startswith("/sys") and sandbox.commands.run(f"test -r {path}").exit_code != 0:
            continue
        assert sandbox.commands.run(f"stat -c %s {path}").stdout.strip() in ("0", "4096")
        text = sandbox.files.read(path)
        assert text, f"{path} read empty"
        first_line = sandbox.commands.run(f"head -n 1 {path}").stdout.split(":")[0]
        assert text.startswith(first_line), (path, text[:80])

    routing = {"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "49983"}
    if sandbox._envd_access_token:
        routing["X-Access-Token"] = sandbox._envd_access_token
    version = sandbox.commands.run("cat /proc/version").stdout
    url = f"{berth.sandbox_url}/files"
    plain = httpx.get(
        url, params={"path": "/proc/version"}, headers={**routing, "Accept-Encoding": "identity"}, timeout=30
    )
    assert plain.status_code == 200 and plain.text == version
    assert plain.headers["content-length"] == str(len(version.encode()))
    gzipped = httpx.get(
        url, params={"path": "/proc/version"}, headers={**routing, "Accept-Encoding": "gzip"}, timeout=30
    )
    assert gzipped.headers.get("content-encoding") == "gzip" and gzipped.text == version
    ranged = httpx.get(url, params={"path": "/proc/version"}, headers={**routing, "Range": "bytes=0-4"}, timeout=30)
    assert ranged.status_code == 206 and ranged.text == version[:5]
    assert ranged.headers["content-range"] == f"bytes 0-4/{len(version.encode())}"


def test_a_sandbox_killed_mid_command_raises_not_running(berth: Berth) -> None:
    import threading

    import pytest
    from e2b import SandboxNotRunningException

    sandbox = Sandbox.create(timeout=120)
    started = threading.Event()

    def kill_once_streaming() -> None:
        started.wait(60)
        Sandbox.kill(sandbox.sandbox_id)

    killer = threading.Thread(target=kill_once_streaming)
    killer.start()
    began = time.monotonic()
    try:
        with pytest.raises(SandboxNotRunningException) as raised:
            sandbox.commands.run("echo streaming; sleep 100", on_stdout=lambda _: started.set(), timeout=0)
    finally:
        started.set()
        killer.join()
    assert "killed or reached its end of life" in str(raised.value)
    # Well before any read timeout: the stream ends when the sandbox does.
    assert time.monotonic() - began < 30


def test_each_resume_is_a_new_execution(berth: Berth, api: httpx.Client) -> None:
    sandbox = Sandbox.create(timeout=300)
    try:
        sandbox.pause()
        sandbox.connect()  # resumes
        sandbox.pause()
        Sandbox.connect(sandbox.sandbox_id)
    finally:
        sandbox.kill()
    events = api.get(f"/events/sandboxes/{sandbox.sandbox_id}", params={"orderAsc": "true", "limit": 100}).json()
    kinds = [event["type"].rsplit(".", 1)[-1] for event in events]
    assert kinds == ["created", "paused", "resumed", "paused", "resumed", "killed"], kinds
    executions = [event["sandboxExecutionId"] for event in events]
    # created+paused share the first execution, each resume starts the next.
    assert executions[0] == executions[1]
    assert executions[2] == executions[3]
    assert executions[4] == executions[5]
    assert len({executions[0], executions[2], executions[4]}) == 3
    assert sandbox.sandbox_id not in executions


def test_two_teams_each_have_a_snapshot_called_ready(
    berth: Berth, api: httpx.Client, other_team_key: str
) -> None:
    ours = Sandbox.create(timeout=300)
    theirs = Sandbox.create(timeout=300, api_key=other_team_key)
    children: list[Sandbox] = []
    try:
        ours.files.write("/home/user/who", "ours")
        theirs.files.write("/home/user/who", "theirs")
        mine = ours.create_snapshot(name="ready")
        other = theirs.create_snapshot(name="ready")
        assert mine.snapshot_id.endswith("/ready:default") and other.snapshot_id.endswith("/ready:default")
        assert mine.snapshot_id != other.snapshot_id, "namespaced by team"
        assert mine.names == [mine.snapshot_id]
        # Every spelling of the name starts from the caller's own snapshot.
        namespace = mine.snapshot_id.split("/")[0]
        for reference in ("ready", "ready:default", f"{namespace}/ready", mine.snapshot_id):
            child = Sandbox.create(reference, timeout=120)
            children.append(child)
            assert child.files.read("/home/user/who") == "ours", reference
        child = Sandbox.create("ready", timeout=120, api_key=other_team_key)
        children.append(child)
        assert child.files.read("/home/user/who") == "theirs"
        # Another team's full name is not ours to start from.
        refused = api.post("/v2/sandboxes", json={"templateID": other.snapshot_id, "timeout": 60})
        assert refused.status_code in (400, 404), refused.text
        listed = api.get("/snapshots", params={"name": "ready"}).json()
        assert [s["snapshotID"] for s in listed] == [mine.snapshot_id]
    finally:
        for sandbox in (*children, ours, theirs):
            try:
                sandbox.kill()
            except Exception:
                pass
        for key, info in ((berth.api_key, "ready"), (other_team_key, "ready")):
            httpx.delete(f"{berth.api_url}/templates/{info}", headers={"X-API-Key": key}, timeout=60)


def test_get_host_urls_resolve_and_reach_the_sandbox(berth: Berth, sandbox: Sandbox) -> None:
    import re
    import socket

    # The startup lines, however much the suite has logged since.
    printed = re.findall(r"^E2B_DOMAIN=(\S+)$", berth.log_path.read_text(errors="replace"), re.MULTILINE)
    assert printed, "berth up printed no E2B_DOMAIN line"
    domain = printed[-1]
    port = berth.api_url.rsplit(":", 1)[1]
    assert domain == f"localhost:{port}", domain

    host = sandbox.get_host(8000)
    assert host == f"8000-{sandbox.sandbox_id}.{domain}", host
    name = host.rsplit(":", 1)[0]
    try:
        socket.getaddrinfo(name, None)
    except socket.gaierror as missing:
        raise AssertionError(
            f"{name} does not resolve: install libnss-myhostname (scripts/install-deps.sh)"
        ) from missing

    sandbox.files.write("/home/user/site/index.html", "reached by get_host")
    sandbox.commands.run("cd /home/user/site && python3 -m http.server 8000", background=True)

    def serving() -> bool:
        try:
            return httpx.get(f"http://{host}/index.html", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    poll(serving, timeout=30, what="the sandbox's web server through get_host")
    assert httpx.get(f"http://{host}/index.html", timeout=30).text == "reached by get_host"
    assert fetch(f"http://{host}/index.html") == (200, b"reached by get_host")

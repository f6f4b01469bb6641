"""Pause and resume through `berth up` with the official SDK: memory kept (processes
continue), memory dropped (files kept, fresh boot), auto-pause at the end time and
auto-resume on traffic, streams cut by a pause, and kill of a paused sandbox."""

from __future__ import annotations

import secrets
import threading
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest
from e2b import Sandbox

from conftest import Berth, poll

# A Python process holding a secret only in memory and serving it over HTTP.
HOLDER = """
import http.server, secrets, sys
secret = secrets.token_hex(16)
hits = 0
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        global hits
        hits += 1
        body = ('%s %d' % (secret, hits)).encode()
        self.send_response(200)
        self.send_header('content-length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(('0.0.0.0', int(sys.argv[1])), Handler).serve_forever()
"""


def sandbox_state(api: httpx.Client, sandbox_id: str) -> str:
    response = api.get(f"/sandboxes/{sandbox_id}")
    assert response.status_code == 200, response.text
    return response.json()["state"]


def start_holder(sandbox: Sandbox, port: int) -> None:
    sandbox.files.write("/home/user/holder.py", HOLDER)
    sandbox.commands.run(f"python3 /home/user/holder.py {port}", background=True)

    def serving() -> bool:
        return sandbox.commands.run(f"curl -sf localhost:{port}/ || true").stdout != ""

    poll(serving, timeout=60, interval=0.2, what=f"the holder on port {port}")


def ask_holder(sandbox: Sandbox, port: int) -> tuple[str, int]:
    secret, hits = sandbox.commands.run(f"curl -sf localhost:{port}/").stdout.split()
    return secret, int(hits)


def boot(sandbox: Sandbox) -> tuple[str, float]:
    """The sandbox's boot id and its uptime in seconds."""
    out = sandbox.commands.run("cat /proc/sys/kernel/random/boot_id; cut -d' ' -f1 /proc/uptime").stdout.split()
    return out[0], float(out[1])


HOST_BOOT_ID = Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def checkpoint_dirs(berth: Berth, sandbox_id: str) -> list[Path]:
    return list((berth.state_dir / "sandboxes" / sandbox_id).glob("checkpoint*"))


@pytest.fixture
def pausable(berth: Berth) -> Iterator[Sandbox]:
    created = Sandbox.create(timeout=600, metadata={"suite": "pause"}, envs={"MARK": "kept"})
    try:
        yield created
    finally:
        try:
            Sandbox.kill(created.sandbox_id)
        except Exception:
            pass


def test_pause_then_connect_continues_processes(berth: Berth, api: httpx.Client, pausable: Sandbox) -> None:
    start_holder(pausable, 8000)
    pausable.commands.run("python3 -m http.server 8001 --directory /home/user", background=True)
    pausable.files.write("/home/user/note.txt", "before pause")
    # Serving before the pause: a resume that thaws kept processes gives a server still
    # starting no more time than it had.
    poll(
        lambda: pausable.commands.run("curl -sf localhost:8001/note.txt || true").stdout == "before pause",
        timeout=60,
        interval=0.2,
        what="the background HTTP server",
    )
    pausable.commands.run("mkdir -p /tmp/work")
    secret, hits = ask_holder(pausable, 8000)
    boot_id, uptime = boot(pausable)
    assert boot_id != HOST_BOOT_ID

    assert pausable.pause() is True
    assert sandbox_state(api, pausable.sandbox_id) == "paused"
    assert checkpoint_dirs(berth, pausable.sandbox_id), "a paused sandbox keeps its checkpoint"
    # A second pause is a conflict, reported by the SDK as "already paused".
    assert Sandbox.pause(pausable.sandbox_id) is False
    listed = api.get("/v2/sandboxes", params={"state": "paused"}).json()
    assert pausable.sandbox_id in [s["sandboxID"] for s in listed]

    resumed = Sandbox.connect(pausable.sandbox_id, timeout=600)
    assert resumed.sandbox_id == pausable.sandbox_id
    assert sandbox_state(api, pausable.sandbox_id) == "running"
    again, later_hits = ask_holder(resumed, 8000)
    assert again == secret and later_hits == hits + 1, "the holder's memory survived"
    kept_id, later = boot(resumed)
    assert kept_id == boot_id and later >= uptime, "a memory resume is the same boot, its clock going on"
    served = resumed.commands.run("curl -sf localhost:8001/note.txt").stdout
    assert served == "before pause", "the background HTTP server still answers"
    assert resumed.files.read("/home/user/note.txt") == "before pause"
    assert resumed.commands.run("echo $MARK").stdout.strip() == "kept"
    info = resumed.get_info()
    assert info.metadata == {"suite": "pause"}
    assert not checkpoint_dirs(berth, pausable.sandbox_id), "the checkpoint goes once resumed"

    # Connect on a running sandbox is a plain connect (200, nothing resumed).
    assert Sandbox.connect(pausable.sandbox_id).sandbox_id == pausable.sandbox_id
    types = [e["type"] for e in api.get(f"/events/sandboxes/{pausable.sandbox_id}", params={"orderAsc": "true"}).json()]
    assert types[:3] == [
        "sandbox.lifecycle.created",
        "sandbox.lifecycle.paused",
        "sandbox.lifecycle.resumed",
    ]


def test_pause_without_memory_keeps_files_and_boots_fresh(api: httpx.Client, pausable: Sandbox) -> None:
    start_holder(pausable, 8000)
    pausable.files.write("/home/user/kept.txt", "on disk")
    boot_id, _ = boot(pausable)
    assert pausable.pause(keep_memory=False) is True
    assert sandbox_state(api, pausable.sandbox_id) == "paused"

    connected_at = time.monotonic()
    resumed = Sandbox.connect(pausable.sandbox_id, timeout=600)
    assert resumed.files.read("/home/user/kept.txt") == "on disk"
    new_id, uptime = boot(resumed)
    assert new_id not in (boot_id, HOST_BOOT_ID), "a resume without memory is a new boot"
    assert uptime <= time.monotonic() - connected_at + 1.0, f"uptime {uptime} s counts from the new boot"
    processes = resumed.commands.run("ps -eo args").stdout
    assert "holder.py" not in processes, "processes start fresh after a pause without memory"
    assert resumed.commands.run("echo $MARK $E2B_SANDBOX_ID").stdout.split() == ["kept", pausable.sandbox_id]
    assert resumed.commands.run("whoami").stdout.strip() == "user"


def test_resume_endpoint_and_conflicts(api: httpx.Client, pausable: Sandbox) -> None:
    sid = pausable.sandbox_id
    assert api.post(f"/sandboxes/{sid}/resume", json={"timeout": 60}).status_code == 409
    assert api.post(f"/sandboxes/{sid}/pause", json={"memory": "yes"}).status_code == 400
    assert api.post(f"/sandboxes/{sid}/pause").status_code == 204
    assert api.post(f"/sandboxes/{sid}/pause", json={}).status_code == 409
    assert api.post(f"/sandboxes/{sid}/timeout", json={"timeout": 60}).status_code == 409
    resumed = api.post(f"/sandboxes/{sid}/resume", json={"timeout": 120})
    assert resumed.status_code == 201, resumed.text
    assert resumed.json()["sandboxID"] == sid
    assert pausable.commands.run("echo alive").stdout.strip() == "alive"
    assert api.post("/sandboxes/inotthere0000000000000/pause").status_code == 404


def test_kill_of_a_paused_sandbox_deletes_its_checkpoint(berth: Berth, api: httpx.Client) -> None:
    sandbox = Sandbox.create(timeout=600)
    sandbox.pause()
    directory = berth.state_dir / "sandboxes" / sandbox.sandbox_id
    assert checkpoint_dirs(berth, sandbox.sandbox_id)
    assert Sandbox.kill(sandbox.sandbox_id) is True

    def gone() -> bool:
        return not directory.exists()

    poll(gone, timeout=60, what="the paused sandbox's directory to be deleted")
    assert api.get(f"/sandboxes/{sandbox.sandbox_id}").status_code == 404
    assert Sandbox.kill(sandbox.sandbox_id) is False


def test_auto_pause_at_end_time_and_auto_resume_on_traffic(berth: Berth, api: httpx.Client) -> None:
    sandbox = Sandbox.create(timeout=600, lifecycle={"on_timeout": "pause", "auto_resume": True})
    try:
        start_holder(sandbox, 8000)
        secret, _ = ask_holder(sandbox, 8000)
        sandbox.set_timeout(2)
        poll(
            lambda: sandbox_state(api, sandbox.sandbox_id) == "paused",
            timeout=120,
            interval=0.5,
            what="the sandbox to pause at its end time",
        )
        # Plain traffic to a user port, through the proxy, wakes it up.
        answer = httpx.get(f"{berth.sandbox_url}/proxy/{sandbox.sandbox_id}/8000/", timeout=120)
        assert answer.status_code == 200, answer.text
        assert answer.text.split()[0] == secret
        assert sandbox_state(api, sandbox.sandbox_id) == "running"
    finally:
        Sandbox.kill(sandbox.sandbox_id)


def test_paused_without_auto_resume_is_not_woken_by_traffic(berth: Berth, api: httpx.Client, pausable: Sandbox) -> None:
    start_holder(pausable, 8000)
    pausable.pause()
    answer = httpx.get(f"{berth.sandbox_url}/proxy/{pausable.sandbox_id}/8000/", timeout=60)
    assert answer.status_code == 502
    assert sandbox_state(api, pausable.sandbox_id) == "paused"


def test_lifecycle_combinations_are_validated(api: httpx.Client) -> None:
    response = api.post(
        "/v2/sandboxes",
        json={"templateID": "base", "autoPause": True, "autoPauseMemory": False, "autoResume": {"enabled": True}},
    )
    assert response.status_code == 400
    assert "autoResume" in response.json()["message"]


def test_pause_ends_an_active_stream_and_connect_reattaches(pausable: Sandbox) -> None:
    marker = secrets.token_hex(4)
    handle = pausable.commands.run(
        f"for i in $(seq 1 100000); do echo {marker}-$i; sleep 0.05; done", background=True
    )
    seen: list[str] = []
    ended = threading.Event()
    outcome: list[BaseException] = []

    def follow() -> None:
        try:
            handle.wait(on_stdout=seen.append)
        except BaseException as err:  # the stream may end with an error: it was cut
            outcome.append(err)
        finally:
            ended.set()

    threading.Thread(target=follow, daemon=True).start()
    poll(lambda: len(seen) > 3, timeout=30, what="the command's first lines")
    pausable.pause()
    assert ended.wait(60), "the stream must end when its sandbox pauses"

    resumed = Sandbox.connect(pausable.sandbox_id, timeout=600)
    running = [p for p in resumed.commands.list() if p.pid == handle.pid]
    assert running, "the command is still running after resume"
    reattached = resumed.commands.connect(handle.pid)
    more: list[str] = []

    def follow_again() -> None:
        try:
            reattached.wait(on_stdout=more.append)
        except BaseException:
            pass

    threading.Thread(target=follow_again, daemon=True).start()
    poll(lambda: len(more) > 3, timeout=30, what="output after reattaching")
    numbers = [int(line.strip().rsplit("-", 1)[1]) for chunk in more for line in chunk.splitlines() if marker in line]
    last_before = max(int(line.strip().rsplit("-", 1)[1]) for chunk in seen for line in chunk.splitlines() if marker in line)
    assert numbers and min(numbers) > last_before, "the loop continued where it was"
    reattached.kill()


# A process keeps a deleted file open (CRIU carries it in the dump as a "ghost" and
# recreates it on restore under `<name>.cr.<hex id>.ghost`); root then creates every
# name such a restore could need, which once made every later resume fail.
GHOST_TRAP = (
    "echo held-data > /home/user/held; "
    "setsid sh -c 'exec 3</home/user/held; exec sleep 1000' >/dev/null 2>&1 & "
    "echo $!; sleep 0.5; rm /home/user/held; "
    "for i in $(seq 1 64); do touch /home/user/held.cr.$(printf %x $i).ghost; done"
)


def test_a_name_in_the_way_of_a_deleted_file_fails_pause_snapshot_and_fork(
    api: httpx.Client, pausable: Sandbox
) -> None:
    holder = pausable.commands.run(GHOST_TRAP, user="root").stdout.strip()
    sandbox_id = pausable.sandbox_id
    for path, body in (("pause", None), ("snapshots", {}), ("fork", {"count": 1})):
        refused = api.post(f"/sandboxes/{sandbox_id}/{path}", json=body)
        assert refused.status_code == 409, (path, refused.text)
        message = refused.json()["message"]
        assert "/home/user/held.cr." in message and "/home/user/held " in message, message
        assert sandbox_state(api, sandbox_id) == "running"
    # The refused dumps left the sandbox as it was: the holder and its file live on.
    assert pausable.commands.run(f"cat /proc/{holder}/fd/3", user="root").stdout == "held-data\n"

    # Without the names in the way the same sandbox pauses and resumes, file and all.
    pausable.commands.run("rm /home/user/held.cr.*.ghost", user="root")
    assert pausable.pause() is True
    resumed = Sandbox.connect(sandbox_id, timeout=600)
    assert resumed.commands.run(f"cat /proc/{holder}/fd/3", user="root").stdout == "held-data\n"

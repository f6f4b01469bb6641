"""Commands, files, PTY and user ports inside a sandbox, all through berth's proxy."""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

import httpx
import pytest
from e2b import CommandExitException, PtySize, Sandbox

from conftest import Berth, poll


def test_commands(sandbox: Sandbox) -> None:
    result = sandbox.commands.run("whoami; pwd; echo to-stderr >&2")
    assert result.exit_code == 0
    assert result.stdout.splitlines() == ["user", "/home/user"]
    assert result.stderr == "to-stderr\n"

    as_root = sandbox.commands.run("id -u", user="root")
    assert as_root.stdout.strip() == "0"

    with pytest.raises(CommandExitException) as failed:
        sandbox.commands.run("exit 7")
    assert failed.value.exit_code == 7

    streamed: list[str] = []
    result = sandbox.commands.run(
        "for i in 1 2 3; do echo line-$i; done", on_stdout=streamed.append, cwd="/tmp", envs={"X": "y"}
    )
    assert "".join(streamed) == "line-1\nline-2\nline-3\n"

    background = sandbox.commands.run("sleep 600", background=True)
    assert background.pid in {process.pid for process in sandbox.commands.list()}
    assert sandbox.commands.kill(background.pid)
    poll(
        lambda: background.pid not in {process.pid for process in sandbox.commands.list()},
        timeout=60,
        what="the killed background command to disappear",
    )


def test_the_base_login_profile_sets_debian_paths_without_running_a_program(sandbox: Sandbox) -> None:
    """`bash -l` (every command) reads /etc/profile; in `base` it takes the uid from
    bash's EUID instead of running `id`, with the PATHs Debian's profile sets. `sh` has
    no EUID and still runs `id`."""
    login = "env -i HOME=/nonexistent PATH={} {} -l -c 'echo $PATH'"
    user_path = "/usr/local/bin:/usr/bin:/bin:/usr/local/games:/usr/games\n"
    root_path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"
    for user, expected in (("user", user_path), ("root", root_path)):
        # With no PATH to find `id` in, a profile that ran it would fail on stderr.
        bash = sandbox.commands.run(login.format("/nowhere", "/bin/bash"), user=user)
        assert (bash.stdout, bash.stderr) == (expected, ""), user
        sh = sandbox.commands.run(login.format("/usr/bin:/bin", "/bin/sh"), user=user)
        assert (sh.stdout, sh.stderr) == (expected, ""), user


def test_commands_start_with_the_default_time_slice(sandbox: Sandbox) -> None:
    """envd's spawner thread runs with the scheduler's shortest slice, so it answers
    before a new command's first CPU burst ends; the commands it starts must not
    inherit it: they get the slice envd's other threads have."""
    script = (
        'for t in /proc/1/task/*; do [ "$(cat $t/comm)" = envd-spawn ] && grep ^se.slice $t/sched; done; '
        "grep ^se.slice /proc/1/sched; grep ^se.slice /proc/self/sched"
    )
    if tuple(int(part) for part in os.uname().release.split(".")[:2]) < (6, 12):
        pytest.skip("custom scheduler slices need Linux 6.12")
    lines = sandbox.commands.run(script, user="root").stdout.splitlines()
    spawner, envd, command = (int(line.rsplit(":", 1)[1]) for line in lines)
    assert spawner == 100_000, lines
    assert command == envd > spawner, lines


def test_base_template_has_what_e2b_base_has(sandbox: Sandbox) -> None:
    """What agents call without asking: `python` is Python 3, `pip` installs for `user`
    (no venv needed), node, npm, git and curl are there, the locale and TERM are set."""
    assert sandbox.commands.run("python --version").stdout.startswith("Python 3.")
    assert "python 3." in sandbox.commands.run("pip --version").stdout
    tools = sandbox.commands.run("for t in node npm git curl sudo; do command -v $t; done")
    assert len(tools.stdout.split()) == 5, tools.stdout

    # A UTF-8 locale and a terminal type, as tools expect.
    assert sandbox.commands.run("echo $LANG $TERM").stdout == "C.UTF-8 xterm-256color\n"
    assert sandbox.commands.run("locale charmap").stdout == "UTF-8\n"
    assert sandbox.commands.run("python -c 'print(\"\\u00e9t\\u00e9\")'").stdout == "\u00e9t\u00e9\n"
    assert sandbox.commands.run("tput cols").exit_code == 0

    # `pip install` as `user`, with no venv and no index: a package made on the spot.
    sandbox.files.write("/home/user/pkg/pyproject.toml", '[project]\nname = "berth-probe"\nversion = "1.0"\n')
    sandbox.files.write("/home/user/pkg/berth_probe.py", "ANSWER = 42\n")
    installed = sandbox.commands.run("pip install --no-index --no-build-isolation ./pkg", cwd="/home/user", timeout=300)
    assert "Successfully installed berth-probe-1.0" in installed.stdout, installed.stdout + installed.stderr
    assert sandbox.commands.run("cd / && python -c 'import berth_probe; print(berth_probe.ANSWER)'").stdout == "42\n"


def test_files_round_trip_and_large_upload(sandbox: Sandbox) -> None:
    sandbox.files.write("/home/user/hello.txt", "hello from the suite")
    assert sandbox.files.read("/home/user/hello.txt") == "hello from the suite"
    entries = {entry.name for entry in sandbox.files.list("/home/user")}
    assert "hello.txt" in entries
    owner = sandbox.commands.run("stat -c %U /home/user/hello.txt").stdout.strip()
    assert owner == "user"

    payload = os.urandom(64 * 1024 * 1024)
    sandbox.files.write("/tmp/large.bin", io.BytesIO(payload))
    digest = sandbox.commands.run("sha256sum /tmp/large.bin | cut -d' ' -f1").stdout.strip()
    assert digest == hashlib.sha256(payload).hexdigest()
    downloaded = sandbox.files.read("/tmp/large.bin", format="bytes")
    assert hashlib.sha256(bytes(downloaded)).hexdigest() == digest

    sandbox.files.make_dir("/home/user/dir/sub")
    sandbox.files.rename("/home/user/hello.txt", "/home/user/dir/sub/moved.txt")
    assert sandbox.files.exists("/home/user/dir/sub/moved.txt")
    sandbox.files.remove("/home/user/dir")
    assert not sandbox.files.exists("/home/user/dir")


def test_signed_file_urls_work_without_the_access_token(berth: Berth, sandbox: Sandbox) -> None:
    sandbox.files.write("/home/user/signed.txt", "signed content")
    routing = {"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "49983"}
    url = sandbox.download_url("/home/user/signed.txt")
    assert "signature=" in url
    path_and_query = url[url.index("/files"):]
    answer = httpx.get(f"{berth.sandbox_url}{path_and_query}", headers=routing, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.text == "signed content"
    unsigned = httpx.get(
        f"{berth.sandbox_url}/files", params={"path": "/home/user/signed.txt"}, headers=routing, timeout=30
    )
    assert unsigned.status_code == 401


def test_pty(sandbox: Sandbox) -> None:
    handle = sandbox.pty.create(PtySize(rows=24, cols=80))
    sandbox.pty.send_stdin(handle.pid, b"echo marker-$((6*7)) $TERM; exit 3\n")
    output = bytearray()
    try:
        handle.wait(on_pty=output.extend)
        exit_code = 0
    except CommandExitException as exited:
        exit_code = exited.exit_code
    assert "marker-42 xterm-256color" in output.decode(errors="replace")
    assert exit_code == 3


def test_user_port_by_headers_host_and_path(berth: Berth, sandbox: Sandbox) -> None:
    sandbox.files.write("/home/user/site/index.html", "served from the sandbox")
    sandbox.commands.run("cd /home/user/site && python3 -m http.server 8000", background=True)
    by_headers = {"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "8000"}

    def serving() -> bool:
        answer = httpx.get(f"{berth.sandbox_url}/index.html", headers=by_headers, timeout=30)
        return answer.status_code == 200

    poll(serving, timeout=60, interval=0.2, what="the sandbox's http.server on port 8000")
    answer = httpx.get(f"{berth.sandbox_url}/index.html", headers=by_headers, timeout=30)
    assert answer.text == "served from the sandbox"

    by_host = httpx.get(
        f"{berth.sandbox_url}/index.html", headers={"Host": sandbox.get_host(8000)}, timeout=30
    )
    assert by_host.status_code == 200, by_host.text
    assert by_host.text == "served from the sandbox"

    by_path = httpx.get(f"{berth.sandbox_url}/proxy/{sandbox.sandbox_id}/8000/index.html", timeout=30)
    assert by_path.status_code == 200, by_path.text
    assert by_path.text == "served from the sandbox"

    closed = httpx.get(
        f"{berth.sandbox_url}/", headers={**by_headers, "E2b-Sandbox-Port": "8001"}, timeout=30
    )
    assert closed.status_code == 502
    assert "port is not open" in closed.json()["message"]


def test_internal_envd_routes_are_refused(berth: Berth, sandbox: Sandbox) -> None:
    routing = {
        "E2b-Sandbox-Id": sandbox.sandbox_id,
        "E2b-Sandbox-Port": "49983",
        "X-Access-Token": sandbox._envd_access_token or "",
    }
    for path in ["/init", "/freeze", "/unfreeze", "/collapse", "/fsfreeze", "/fsthaw", "//init", "/%69nit"]:
        answer = httpx.post(f"{berth.sandbox_url}{path}", json={}, headers=routing, timeout=30)
        assert answer.status_code == 403, (path, answer.status_code, answer.text)
    assert sandbox.commands.run("echo still-fine").stdout == "still-fine\n"


def test_invalid_sandbox_ids_are_rejected(berth: Berth) -> None:
    for sandbox_id in ["UPPER", "with-dash", "../etc", "a b"]:
        answer = httpx.get(
            f"{berth.sandbox_url}/health",
            headers={"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": "49983"},
            timeout=30,
        )
        assert answer.status_code == 400, (sandbox_id, answer.text)


def test_private_traffic_needs_the_traffic_token(berth: Berth) -> None:
    sandbox = Sandbox.create(timeout=300, network={"allow_public_traffic": False})
    try:
        token = sandbox.traffic_access_token
        assert token, "no trafficAccessToken for a sandbox without public traffic"
        sandbox.commands.run("cd /tmp && python3 -m http.server 8000", background=True)
        routing = {"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "8000"}

        def serving() -> bool:
            answer = httpx.get(
                f"{berth.sandbox_url}/", headers={**routing, "e2b-traffic-access-token": token}, timeout=30
            )
            return answer.status_code == 200

        poll(serving, timeout=60, interval=0.2, what="http.server behind the traffic token")
        refused = httpx.get(f"{berth.sandbox_url}/", headers=routing, timeout=30)
        assert refused.status_code == 403
    finally:
        sandbox.kill()


def test_mountinfo_names_no_host_paths(berth: Berth, sandbox: Sandbox) -> None:
    """What a sandbox learns of its host from its mounts, before and after a CRIU round
    trip: no state-dir path (sandbox ids, disk images, layers), no loop device, and for
    the envd binary neither its host path nor the host's block device: it is bound from a
    tmpfs of berth's own (`berth-envd`). (Mount options still show host uids and the
    host's memory size: see SECURITY.md.)"""
    envd_host_path = str(berth.binary.parent / "berth-envd")
    host_devices = [f"/dev/{dev.name}" for dev in Path("/sys/block").iterdir() if not dev.name.startswith("loop")]

    def check(when: str) -> None:
        for path in ("/proc/self/mountinfo", "/proc/self/mounts", "/proc/1/mountinfo"):
            text = sandbox.commands.run(f"cat {path}", user="root").stdout
            assert text, path
            for host_detail in (str(berth.state_dir), "/var/lib/berth", "/dev/loop", sandbox.sandbox_id, envd_host_path, *host_devices):
                assert host_detail not in text, f"{when}: {path} names {host_detail}:\n{text}"
        envd = [line for line in sandbox.commands.run("cat /proc/1/mountinfo").stdout.splitlines() if " /run/berth/berth-envd " in line]
        assert len(envd) == 1 and " - tmpfs berth-envd " in envd[0], envd

    check("created")
    sandbox.pause()
    sandbox.connect()
    check("resumed")

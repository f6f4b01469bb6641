"""`sandbox.commands` through the official Python SDK against berth-envd."""

from __future__ import annotations

import hashlib
import os
import secrets
import shlex
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from e2b import CommandExitException, InvalidArgumentException, NotFoundException, TimeoutException

from helpers import poll, wait_until_running

NO_SUCH_PID = 4_000_000_000  # a valid uint32 that is never a pid


def stop(sandbox, pid: int, program: str) -> None:
    """Cleanup: kill `pid` if it still runs, once it runs `program` (see wait_until_running)."""
    if pid in {process.pid for process in sandbox.commands.list()}:
        wait_until_running(pid, program)
        sandbox.commands.kill(pid)


def kill_if_listed(sandbox, marker: str, program: str) -> None:
    """Kill every process whose command line carries `marker`, once it runs `program`."""
    for process in sandbox.commands.list():
        if any(marker in arg for arg in process.args):
            wait_until_running(process.pid, program)
            sandbox.commands.kill(process.pid)


# --- foreground -------------------------------------------------------------------------


def test_run_returns_stdout_and_exit_code(sandbox):
    result = sandbox.commands.run("echo hello")
    assert result.stdout == "hello\n"
    assert result.stderr == ""
    assert result.exit_code == 0
    assert result.error is None


def test_run_separates_stderr(sandbox):
    result = sandbox.commands.run("echo out; echo err >&2")
    assert result.stdout == "out\n"
    assert result.stderr == "err\n"


def test_nonzero_exit_raises_command_exit_exception(sandbox):
    with pytest.raises(CommandExitException) as caught:
        sandbox.commands.run("echo partial; echo broken >&2; exit 3")
    assert caught.value.exit_code == 3
    assert caught.value.stdout == "partial\n"
    assert caught.value.stderr == "broken\n"


def test_missing_program_exits_127(sandbox):
    with pytest.raises(CommandExitException) as caught:
        sandbox.commands.run("definitely-not-a-program-berth")
    assert caught.value.exit_code == 127
    assert "not found" in caught.value.stderr


def test_runs_in_a_login_bash(sandbox):
    result = sandbox.commands.run("shopt -q login_shell && echo login; echo $BASH_VERSION")
    lines = result.stdout.splitlines()
    assert lines[0] == "login"
    assert lines[1], "the command must run in bash"


def test_envs_are_passed(sandbox):
    result = sandbox.commands.run(
        'printf "%s|%s|%s" "$BERTH_A" "$BERTH_B" "$(command -v sh)"',
        envs={"BERTH_A": "alpha", "BERTH_B": "two words"},
    )
    assert result.stdout.split("|")[:2] == ["alpha", "two words"]
    assert result.stdout.split("|")[2].endswith("/sh"), "PATH must still be usable"


def test_cwd_is_honoured(sandbox, scratch: Path):
    result = sandbox.commands.run("pwd; touch created-here", cwd=str(scratch))
    assert result.stdout == f"{scratch}\n"
    assert (scratch / "created-here").is_file()


def test_missing_cwd_is_invalid_argument(sandbox, scratch: Path):
    missing = scratch / "does-not-exist"
    with pytest.raises(InvalidArgumentException) as caught:
        sandbox.commands.run("pwd", cwd=str(missing))
    assert str(missing) in str(caught.value)


def test_large_output_is_complete_and_ordered(sandbox):
    result = sandbox.commands.run("seq 1 200000")
    assert result.stdout == "".join(f"{n}\n" for n in range(1, 200001))


def test_stdout_and_stderr_keep_order_per_stream(sandbox):
    result = sandbox.commands.run("for i in $(seq 1 2000); do echo out$i; echo err$i >&2; done")
    assert result.stdout == "".join(f"out{i}\n" for i in range(1, 2001))
    assert result.stderr == "".join(f"err{i}\n" for i in range(1, 2001))


def test_utf8_output_survives_chunking(sandbox):
    # 3-byte characters in a long run: chunk borders fall inside characters.
    result = sandbox.commands.run("for i in $(seq 1 5000); do printf '✓é'; done; echo")
    assert result.stdout == "✓é" * 5000 + "\n"


def test_binary_safe_output_roundtrip(sandbox, scratch: Path):
    payload = bytes(range(256)) * 64
    source = scratch / "blob"
    source.write_bytes(payload)
    result = sandbox.commands.run(f"sha256sum {shlex.quote(str(source))}")
    assert result.stdout.split()[0] == hashlib.sha256(payload).hexdigest()


# --- streaming callbacks ----------------------------------------------------------------


def test_on_stdout_streams_before_the_command_ends(sandbox, scratch: Path):
    """The command only finishes after the test saw its first line: proves streaming."""
    flag = scratch / "flag"
    seen: list[str] = []

    def on_stdout(chunk: str) -> None:
        seen.append(chunk)
        if "first" in "".join(seen):
            flag.touch()

    script = (
        "echo first; "
        f"for i in $(seq 1 1200); do [ -e {shlex.quote(str(flag))} ] && break; sleep 0.05; done; "
        f"[ -e {shlex.quote(str(flag))} ] || exit 9; echo second"
    )
    result = sandbox.commands.run(script, on_stdout=on_stdout)
    assert result.exit_code == 0
    assert "".join(seen) == "first\nsecond\n"
    assert result.stdout == "first\nsecond\n"


def test_on_stderr_streams_before_the_command_ends(sandbox, scratch: Path):
    flag = scratch / "flag"
    seen: list[str] = []

    def on_stderr(chunk: str) -> None:
        seen.append(chunk)
        if "warming" in "".join(seen):
            flag.touch()

    script = (
        "echo warming >&2; "
        f"for i in $(seq 1 1200); do [ -e {shlex.quote(str(flag))} ] && break; sleep 0.05; done; "
        f"[ -e {shlex.quote(str(flag))} ] || exit 9; echo done >&2"
    )
    result = sandbox.commands.run(script, on_stderr=on_stderr)
    assert "".join(seen) == "warming\ndone\n"
    assert result.stdout == ""


# --- timeout ----------------------------------------------------------------------------


def test_timeout_raises_timeout_exception(sandbox, test_user):
    # As the test user: envd may end the process when the deadline passes, possibly while
    # its login shell still reads the profile; the test user's profile is harmless to cut.
    marker = f"berth-timeout-{secrets.token_hex(4)}"
    try:
        with pytest.raises(TimeoutException):
            sandbox.commands.run(f"sleep 120 # {marker}", timeout=1, user=test_user.name)
    finally:
        kill_if_listed(sandbox, marker, "sleep")


# --- background, list, kill, connect ----------------------------------------------------


def test_background_command_is_listed_and_killed(sandbox, scratch: Path):
    marker = f"berth-bg-{secrets.token_hex(4)}"
    command = f"sleep 300 # {marker}"
    handle = sandbox.commands.run(command, background=True, envs={"BERTH_TAGGED": "1"}, cwd=str(scratch))
    try:
        assert handle.pid > 0
        listed = {process.pid: process for process in sandbox.commands.list()}
        assert handle.pid in listed
        info = listed[handle.pid]
        assert info.cmd == "/bin/bash"
        assert info.args == ["-l", "-c", command]
        assert info.envs.get("BERTH_TAGGED") == "1"
        assert info.cwd == str(scratch)
        wait_until_running(handle.pid, "sleep")
        assert sandbox.commands.kill(handle.pid) is True
        with pytest.raises(CommandExitException) as caught:
            handle.wait()
        assert caught.value.exit_code != 0
        poll(lambda: handle.pid not in {p.pid for p in sandbox.commands.list()}, what="killed process to leave the list")
    finally:
        kill_if_listed(sandbox, marker, "sleep")


def test_kill_unknown_pid_returns_false(sandbox):
    assert sandbox.commands.kill(NO_SUCH_PID) is False


def test_handle_kill(sandbox):
    handle = sandbox.commands.run("sleep 300", background=True)
    wait_until_running(handle.pid, "sleep")
    assert handle.kill() is True
    with pytest.raises(CommandExitException):
        handle.wait()


def test_background_command_output_via_wait(sandbox):
    handle = sandbox.commands.run("echo from-background; exit 0", background=True)
    result = handle.wait()
    assert result.stdout == "from-background\n"
    assert result.exit_code == 0


def test_connect_to_running_command(sandbox, scratch: Path):
    flag = scratch / "go"
    script = (
        "echo before; "
        f"for i in $(seq 1 1200); do [ -e {shlex.quote(str(flag))} ] && break; sleep 0.05; done; "
        "echo after"
    )
    first = sandbox.commands.run(script, background=True)
    try:
        pid = first.pid
        first.disconnect()
        second = sandbox.commands.connect(pid)
        assert second.pid == pid
        flag.touch()
        result = second.wait()
        assert result.exit_code == 0
        assert "after\n" in result.stdout
    finally:
        stop(sandbox, first.pid, "sleep")


def test_connect_after_exit_still_gets_the_end(sandbox):
    """envd keeps a finished process ~30 s so a late Connect still sees its end."""
    handle = sandbox.commands.run("exit 4", background=True)
    with pytest.raises(CommandExitException):
        handle.wait()
    late = sandbox.commands.connect(handle.pid)
    with pytest.raises(CommandExitException) as caught:
        late.wait()
    assert caught.value.exit_code == 4


def test_background_survives_client_disconnect(sandbox, scratch: Path):
    """berth's deliberate difference from E2B: dropping the stream does not kill the command."""
    flag = scratch / "go"
    out = scratch / "out"
    script = (
        f"for i in $(seq 1 1200); do [ -e {shlex.quote(str(flag))} ] && break; sleep 0.05; done; "
        f"echo survived > {shlex.quote(str(out))}"
    )
    handle = sandbox.commands.run(script, background=True)
    try:
        handle.disconnect()
        flag.touch()
        poll(lambda: out.exists() and out.read_text() == "survived\n", what="the command to finish after disconnect")
    finally:
        stop(sandbox, handle.pid, "sleep")


def test_connect_unknown_pid_is_not_found(sandbox):
    with pytest.raises(NotFoundException):
        sandbox.commands.connect(NO_SUCH_PID)


# --- stdin ------------------------------------------------------------------------------


def test_send_stdin_and_close_stdin(sandbox):
    handle = sandbox.commands.run("cat", background=True, stdin=True)
    try:
        handle.send_stdin("hello ")
        sandbox.commands.send_stdin(handle.pid, b"world\n")
        sandbox.commands.close_stdin(handle.pid)
        result = handle.wait()
        assert result.stdout == "hello world\n"
    finally:
        stop(sandbox, handle.pid, "cat")


def test_handle_close_stdin_sends_eof(sandbox):
    handle = sandbox.commands.run("wc -c", background=True, stdin=True)
    try:
        handle.send_stdin("12345")
        handle.close_stdin()
        assert handle.wait().stdout.strip() == "5"
    finally:
        stop(sandbox, handle.pid, "wc")


def test_large_stdin_arrives_intact(sandbox):
    payload = os.urandom(1 << 20)
    handle = sandbox.commands.run("sha256sum", background=True, stdin=True)
    try:
        for offset in range(0, len(payload), 64 * 1024):
            handle.send_stdin(payload[offset : offset + 64 * 1024])
        handle.close_stdin()
        assert handle.wait().stdout.split()[0] == hashlib.sha256(payload).hexdigest()
    finally:
        stop(sandbox, handle.pid, "sha256sum")


def test_without_stdin_the_command_reads_eof(sandbox):
    result = sandbox.commands.run("cat; echo eof-seen", timeout=60)
    assert result.stdout == "eof-seen\n"


def test_send_stdin_to_unknown_pid_is_not_found(sandbox):
    with pytest.raises(NotFoundException):
        sandbox.commands.send_stdin(NO_SUCH_PID, "x")


# --- users ------------------------------------------------------------------------------


def test_default_user_and_home(sandbox):
    result = sandbox.commands.run('id -un; echo "$HOME"; pwd')
    name, home, cwd = result.stdout.splitlines()
    assert name == "root"
    assert home == "/root"
    assert cwd == home


def test_run_as_test_user(sandbox, test_user):
    result = sandbox.commands.run(
        'id -un; id -u; id -g; id -G; echo "$HOME"; echo "$USER"; echo "$SHELL"; pwd',
        user=test_user.name,
    )
    name, uid, gid, groups, home, user_var, shell, cwd = result.stdout.splitlines()
    assert name == test_user.name
    assert int(uid) == test_user.uid
    assert int(gid) == test_user.gid
    assert test_user.extra_gid in {int(g) for g in groups.split()}
    assert home == str(test_user.home)
    assert user_var == test_user.name
    assert shell == "/bin/bash"
    assert cwd == str(test_user.home)


def test_files_created_by_a_user_command_belong_to_it(sandbox, test_user, user_scratch: Path):
    target = user_scratch / "made-by-command"
    sandbox.commands.run(f"echo x > {shlex.quote(str(target))}", user=test_user.name)
    stat = target.stat()
    assert (stat.st_uid, stat.st_gid) == (test_user.uid, test_user.gid)


def test_explicit_root_user(sandbox):
    assert sandbox.commands.run("id -u", user="root").stdout == "0\n"


def test_unknown_user_is_rejected(sandbox):
    with pytest.raises(Exception) as caught:
        sandbox.commands.run("true", user="no-such-user-berth")
    assert not isinstance(caught.value, CommandExitException)
    assert "no-such-user-berth" in str(caught.value)


# --- concurrency ------------------------------------------------------------------------


def test_fifty_concurrent_commands(sandbox, scratch: Path):
    """All 50 are alive at once: each waits until all 50 have checked in."""
    count = 50
    barrier = scratch / "barrier"
    barrier.mkdir()
    quoted = shlex.quote(str(barrier))

    def one(index: int) -> str:
        script = (
            f"touch {quoted}/{index}; "
            f"for i in $(seq 1 1200); do [ $(ls {quoted} | wc -l) -ge {count} ] && break; sleep 0.05; done; "
            f"[ $(ls {quoted} | wc -l) -ge {count} ] || exit 9; echo done-{index}"
        )
        return sandbox.commands.run(script, timeout=120).stdout

    with ThreadPoolExecutor(max_workers=count) as pool:
        outputs = list(pool.map(one, range(count)))
    assert outputs == [f"done-{index}\n" for index in range(count)]

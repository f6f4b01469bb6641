"""`sandbox.pty` through the official Python SDK against berth-envd."""

from __future__ import annotations

import pytest
from e2b import NotFoundException, PtySize

from helpers import PtyReader, child_commands, poll

NO_SUCH_PID = 4_000_000_000


@pytest.fixture()
def pty(sandbox):
    handle = sandbox.pty.create(PtySize(rows=24, cols=80), timeout=0)
    reader = PtyReader(handle)
    # The shell answers only after its startup files ran; killing it earlier could
    # interrupt them halfway (see helpers.wait_until_running).
    sandbox.pty.send_stdin(handle.pid, b"echo pty-$((40+2))-ready\n")
    reader.wait_for("pty-42-ready")
    yield reader
    sandbox.pty.kill(handle.pid)
    reader.join()


def test_pty_runs_input_and_echoes_output(sandbox, pty):
    sandbox.pty.send_stdin(pty.handle.pid, b"echo berth-$((6*7))\n")
    pty.wait_for("berth-42")


def test_pty_is_a_terminal_with_the_sdk_environment(sandbox, pty):
    sandbox.pty.send_stdin(pty.handle.pid, b"tty; echo \"term=$TERM lang=$LANG\"\n")
    pty.wait_for("/dev/pts/")
    pty.wait_for("term=xterm-256color lang=C.UTF-8")


def test_pty_size_and_resize(sandbox, pty):
    pid = pty.handle.pid
    sandbox.pty.send_stdin(pid, b"echo size=$(stty size)\n")
    offset = pty.wait_for("size=24 80")
    sandbox.pty.resize(pid, PtySize(rows=40, cols=132))
    sandbox.pty.send_stdin(pid, b"echo size=$(stty size)\n")
    pty.wait_for("size=40 132", start=offset)


def test_pty_exit_ends_the_stream_with_the_exit_code(sandbox):
    handle = sandbox.pty.create(PtySize(rows=24, cols=80), timeout=0)
    reader = PtyReader(handle)
    try:
        sandbox.pty.send_stdin(handle.pid, b"exit 5\n")
        reader.join()
        assert reader.exit_code() == 5
    finally:
        sandbox.pty.kill(handle.pid)


def test_pty_kill(sandbox):
    handle = sandbox.pty.create(PtySize(rows=24, cols=80), timeout=0)
    reader = PtyReader(handle)
    try:
        sandbox.pty.send_stdin(handle.pid, b"echo ready-to-die\n")
        reader.wait_for("ready-to-die")
        assert sandbox.pty.kill(handle.pid) is True
        reader.join()
        assert reader.exit_code() != 0
    finally:
        sandbox.pty.kill(handle.pid)


def test_pty_ctrl_c_interrupts_the_foreground_job(sandbox, pty):
    pid = pty.handle.pid
    sandbox.pty.send_stdin(pid, b"sleep 300\n")
    # Ctrl-C only reaches sleep once it is the terminal's foreground job.
    poll(lambda: "sleep 300" in child_commands(pid), what="sleep to start under the PTY shell")
    sandbox.pty.send_stdin(pid, b"\x03")
    sandbox.pty.send_stdin(pid, b"echo status=$?\n")
    pty.wait_for("status=130")


def test_pty_as_other_user(sandbox, test_user):
    handle = sandbox.pty.create(PtySize(rows=24, cols=80), user=test_user.name, timeout=0)
    reader = PtyReader(handle)
    try:
        sandbox.pty.send_stdin(handle.pid, b"echo who=$(id -un) home=$HOME\n")
        reader.wait_for(f"who={test_user.name} home={test_user.home}")
    finally:
        sandbox.pty.kill(handle.pid)
        reader.join()


def test_pty_connect(sandbox, pty):
    pid = pty.handle.pid
    second = PtyReader(sandbox.pty.connect(pid, timeout=0))
    sandbox.pty.send_stdin(pid, b"echo seen-by-$((2+3))-readers\n")
    second.wait_for("seen-by-5-readers")
    pty.wait_for("seen-by-5-readers")


def test_pty_listed_among_processes(sandbox, pty):
    listed = {process.pid: process for process in sandbox.commands.list()}
    assert pty.handle.pid in listed
    assert listed[pty.handle.pid].args == ["-i", "-l"]


def test_pty_resize_unknown_pid_is_not_found(sandbox):
    with pytest.raises(NotFoundException):
        sandbox.pty.resize(NO_SUCH_PID, PtySize(rows=10, cols=10))


def test_pty_kill_unknown_pid_returns_false(sandbox):
    assert sandbox.pty.kill(NO_SUCH_PID) is False

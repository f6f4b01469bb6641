"""envd (the sandbox's PID 1) outlives what runs inside: a memory hog run as `user` is
killed with an OOM error in its own result, envd keeps answering and the next command
works; even root inside cannot ptrace PID 1 (seccomp refuses it)."""

from __future__ import annotations

import time

import pytest
from e2b import CommandExitException, Sandbox

# PTRACE_ATTACH (16) and PTRACE_SEIZE (0x4206) on PID 1; prints the result and errno.
PTRACE_PID1 = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
for request in (16, 0x4206):
    result = libc.ptrace(request, 1, 0, 0)
    print(result, os.strerror(ctypes.get_errno()))
"""


def next_command_works(sandbox: Sandbox, timeout: float = 120) -> None:
    """Retries `echo alive` until it works (a bomb's last processes may still be going)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            assert sandbox.commands.run("echo alive", timeout=30).stdout == "alive\n"
            return
        except Exception:  # noqa: BLE001 - retried until the deadline
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def envd_pid1_start(sandbox: Sandbox) -> str:
    """PID 1's start time: the same envd, not a restarted one."""
    return sandbox.commands.run("cut -d' ' -f22 /proc/1/stat", user="root").stdout.strip()


def test_root_inside_cannot_ptrace_pid1(sandbox: Sandbox) -> None:
    result = sandbox.commands.run(f"python3 -c '{PTRACE_PID1}'", user="root")
    lines = result.stdout.splitlines()
    assert lines == ["-1 Operation not permitted", "-1 Operation not permitted"], lines
    # A process of the user's own still can be traced (gdb, strace keep working on it).
    own = sandbox.commands.run(
        "sleep 30 & python3 -c \"import ctypes,os,sys;l=ctypes.CDLL(None,use_errno=True);"
        "print(l.ptrace(0x4206,int(sys.argv[1]),0,0))\" $!; kill %1",
        user="user",
    )
    assert own.stdout.strip() == "0", own


def test_a_memory_hog_is_killed_and_envd_keeps_answering(sandbox: Sandbox) -> None:
    before = envd_pid1_start(sandbox)
    with pytest.raises(CommandExitException) as hog:
        sandbox.commands.run(
            "python3 -c 'a = []\nwhile True: a.append(bytearray(16 << 20))'",
            user="user",
            timeout=120,
        )
    assert hog.value.exit_code == 137, "SIGKILLed by the OOM killer"
    assert "out of memory: killed by the OOM killer" in hog.value.stderr, hog.value
    next_command_works(sandbox)
    assert envd_pid1_start(sandbox) == before, "the same envd answers"

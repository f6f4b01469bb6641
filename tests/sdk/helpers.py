"""Small helpers shared by the SDK test modules."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

from e2b import CommandExitException


class PtyReader:
    """Runs `handle.wait(on_pty=...)` in a thread and collects everything the PTY prints.

    Tests wait for expected output with `wait_for`, which polls the buffer with a
    generous bound instead of sleeping.
    """

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self._buffer = bytearray()
        self._lock = threading.Condition()
        self.result: Optional[Any] = None
        self.error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _on_pty(self, chunk: bytes) -> None:
        with self._lock:
            self._buffer.extend(chunk)
            self._lock.notify_all()

    def _run(self) -> None:
        try:
            self.result = self.handle.wait(on_pty=self._on_pty)
        except BaseException as error:  # recorded for the test to inspect
            self.error = error
        with self._lock:
            self._lock.notify_all()

    def text(self) -> str:
        with self._lock:
            return self._buffer.decode(errors="replace")

    def wait_for(self, needle: str, timeout: float = 30.0, start: int = 0) -> int:
        """Wait until `needle` appears in the output after offset `start`; return its end offset."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                text = self._buffer.decode(errors="replace")
                index = text.find(needle, start)
                if index >= 0:
                    return index + len(needle)
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self.result is not None or self.error is not None:
                    raise AssertionError(
                        f"PTY output never showed {needle!r} (waited up to {timeout}s, stream "
                        f"ended: {self.result is not None or self.error is not None}); output:\n{text[-3000:]}"
                    )
                self._lock.wait(min(remaining, 0.5))

    def join(self, timeout: float = 30.0) -> None:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"PTY did not end within {timeout}s; output:\n{self.text()[-3000:]}"

    def exit_code(self) -> int:
        if isinstance(self.error, CommandExitException):
            return self.error.exit_code
        if self.error is not None:
            raise AssertionError(f"PTY stream failed: {self.error!r}")
        assert self.result is not None
        return self.result.exit_code


def poll(predicate: Callable[[], bool], timeout: float = 30.0, interval: float = 0.02, what: str = "condition") -> None:
    """Poll until `predicate()` is true or fail after `timeout` seconds (a bound, not a measurement)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def _cmdline(proc: Path) -> str:
    return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()


def child_commands(parent_pid: int) -> list[str]:
    """Command lines of the live children of `parent_pid` (read from /proc)."""
    commands = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            # Field 4 (ppid) follows the parenthesised command name, which may hold spaces.
            if int(stat.rsplit(")", 1)[1].split()[1]) == parent_pid:
                commands.append(_cmdline(proc))
        except (OSError, IndexError, ValueError):
            continue
    return commands


def wait_until_running(pid: int, prefix: str, timeout: float = 60.0) -> None:
    """Wait until the command's shell is past its startup files and runs `prefix…`.

    The shell (`bash -l`) reads the user's profile first; on a developer machine that
    may do work (e.g. pyenv's rehash, which holds a lock file) that must not be killed
    halfway. Tests kill a command only once it runs the program they started.
    """

    def running() -> bool:
        try:
            if _cmdline(Path(f"/proc/{pid}")).startswith(prefix):
                return True
        except OSError:
            return True  # already gone: nothing left to interrupt
        return any(command.startswith(prefix) for command in child_commands(pid))

    poll(running, timeout=timeout, what=f"pid {pid} to run {prefix!r}")

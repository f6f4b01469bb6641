"""Pause/resume with memory and fork of `code-interpreter-v1` sandboxes: kernels keep
running with their variables (CRIU keeps every process, the interpreter's kernels
included); each fork continues from the parent's state and then diverges."""

from __future__ import annotations

import threading

import pytest
from e2b_code_interpreter import Sandbox

from conftest import SANDBOX_ENV


@pytest.fixture()
def own_sandbox(berth):
    sandbox = Sandbox.create(envs=SANDBOX_ENV, timeout=600)
    yield sandbox
    try:
        sandbox.kill()
    except Exception:  # noqa: BLE001 - already gone is fine at cleanup
        pass


def test_pause_resume_keeps_kernels_and_variables(own_sandbox):
    own_sandbox.run_code("import numpy as np\nkept = np.arange(5) * 3")
    own_sandbox.run_code("var jsKept = 'still here'", language="js")
    own_sandbox.run_code("R_KEPT=r-side", language="bash")
    before = own_sandbox.run_code("1").execution_count

    assert own_sandbox.pause() is True
    resumed = Sandbox.connect(own_sandbox.sandbox_id)

    assert resumed.run_code("kept.tolist()").text == "[0, 3, 6, 9, 12]"
    assert resumed.run_code("jsKept", language="js").text == "still here"
    assert resumed.run_code("echo $R_KEPT", language="bash").logs.stdout == ["r-side\n"]
    # The same kernel, not a new one: its execution counter went on.
    assert resumed.run_code("2").execution_count == before + 2
    assert resumed.run_code("import os; os.getenv('BERTH_SANDBOX_VAR')").text == "from-the-sandbox"


def test_fork_gives_each_fork_the_parents_state(own_sandbox):
    own_sandbox.run_code("state = {'who': 'parent', 'n': 41}")
    own_sandbox.run_code("var shared = 'from the parent'", language="js")

    results = own_sandbox.fork(count=2, timeout=600)
    forks = [Sandbox.connect(r.sandbox_id) for r in results if hasattr(r, "sandbox_id")]
    try:
        assert len(forks) == 2, results
        for index, child in enumerate(forks):
            assert child.sandbox_id != own_sandbox.sandbox_id
            assert child.run_code("state['n'] + 1").text == "42"
            assert child.run_code("shared", language="js").text == "from the parent"
            child.run_code(f"state['who'] = 'fork-{index}'")
        for index, child in enumerate(forks):
            assert child.run_code("state['who']").text == f"fork-{index}", "each fork has its own kernels"
        assert own_sandbox.run_code("state['who']").text == "parent", "the parent keeps its own"
    finally:
        for child in forks:
            try:
                child.kill()
            except Exception:  # noqa: BLE001
                pass


def test_kill_during_an_execution_ends_its_stream_with_an_error(own_sandbox):
    """A sandbox killed while `run_code` streams: the call raises instead of hanging
    until a read timeout, and what ran before the kill was delivered."""
    started = threading.Event()
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["execution"] = own_sandbox.run_code(
                "import time\nprint('running', flush=True)\ntime.sleep(300)",
                on_stdout=lambda _: started.set(),
                timeout=0,
            )
        except Exception as error:  # noqa: BLE001 - the error is what is checked
            outcome["error"] = error

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    assert started.wait(120), "the execution's first output never arrived"
    assert Sandbox.kill(own_sandbox.sandbox_id) is True
    # Liveness, not speed: well under the 300 s the code would sleep.
    runner.join(120)
    assert not runner.is_alive(), "run_code still waits on a killed sandbox"
    assert "execution" not in outcome, outcome
    assert isinstance(outcome.get("error"), Exception), outcome

"""The official Python code-interpreter SDK against berth-interpreter."""

from __future__ import annotations

import time

import httpx
import pytest
from e2b import NotFoundException, SandboxException, TimeoutException



def test_result_text_and_state(sandbox):
    execution = sandbox.run_code("x = 1; x += 1; x")
    assert execution.text == "2"
    assert execution.error is None
    assert sandbox.run_code("x * 10").text == "20"
    assert sandbox.run_code("'a string'").text == "a string"


def test_stdout_stderr_and_callbacks_in_order_and_streamed(sandbox):
    seen: list[tuple[str, str, float]] = []

    def record(kind):
        return lambda item: seen.append((kind, str(getattr(item, "line", None) or getattr(item, "name", None) or getattr(item, "text", "")), time.monotonic()))

    started = time.monotonic()
    execution = sandbox.run_code(
        "import sys, time\n"
        "print('first', flush=True)\n"
        "time.sleep(1.5)\n"
        "print('warn', file=sys.stderr, flush=True)\n"
        "display('shown')\n"
        "raise RuntimeError('late')",
        on_stdout=record("stdout"),
        on_stderr=record("stderr"),
        on_result=record("result"),
        on_error=record("error"),
    )
    finished = time.monotonic()
    assert [kind for kind, _, _ in seen] == ["stdout", "stderr", "result", "error"]
    assert seen[0][1] == "first\n"
    assert seen[3][1] == "RuntimeError"
    # The first line arrived while the code was still sleeping, not with the rest.
    assert seen[0][2] - started < finished - started - 1.0
    assert seen[1][2] - seen[0][2] >= 1.0
    assert execution.logs.stdout == ["first\n"]
    assert execution.logs.stderr == ["warn\n"]


def test_error_with_traceback(sandbox):
    execution = sandbox.run_code("def f():\n    return 1 / 0\nf()")
    assert execution.error is not None
    assert execution.error.name == "ZeroDivisionError"
    assert execution.error.value == "division by zero"
    assert "return 1 / 0" in execution.error.traceback
    assert "\x1b[" not in execution.error.traceback


def test_execution_count_increments(sandbox):
    first = sandbox.run_code("1").execution_count
    second = sandbox.run_code("2").execution_count
    assert isinstance(first, int) and second == first + 1


def test_display_of_several_outputs(sandbox):
    execution = sandbox.run_code(
        "from IPython.display import display, HTML, Markdown\n"
        "display(HTML('<i>a</i>'))\n"
        "display(Markdown('# b'))\n"
        "display({'text/latex': r'\\text{c}'}, raw=True)\n"
        "42"
    )
    results = execution.results
    assert [r.is_main_result for r in results] == [False, False, False, True]
    assert results[0].html == "<i>a</i>"
    assert results[1].markdown == "# b"
    assert results[2].formats() == ["latex"]
    assert execution.text == "42"


def test_dataframe_renders_html_and_data(sandbox):
    execution = sandbox.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2, 3], 'b': ['x', 'y', 'z']})")
    result = execution.results[0]
    assert "<table" in result.html
    assert result.data == {"a": [1, 2, 3], "b": ["x", "y", "z"]}
    assert "a" in result.text


def test_matplotlib_png(sandbox):
    execution = sandbox.run_code(
        "import matplotlib.pyplot as plt, numpy as np\n"
        "x = np.linspace(0, 20, 100)\nplt.plot(x, np.sin(x))\nplt.show()"
    )
    result = execution.results[0]
    assert result.png and result.text.startswith("<Figure")
    assert not result.extra


def test_env_vars_per_call_do_not_leak(sandbox):
    assert sandbox.run_code("import os; os.getenv('FOO')", envs={"FOO": "bar"}).text == "bar"
    assert sandbox.run_code("import os; os.getenv('FOO', 'default')").text == "default"


def test_sandbox_env_vars_reach_every_kernel(sandbox):
    assert sandbox.run_code("import os; os.getenv('BERTH_SANDBOX_VAR')").text == "from-the-sandbox"
    assert sandbox.run_code("process.env.BERTH_SANDBOX_VAR", language="js").text == "from-the-sandbox"
    assert sandbox.run_code("echo $BERTH_SANDBOX_VAR", language="bash").logs.stdout == ["from-the-sandbox\n"]
    overridden = sandbox.run_code("import os; os.getenv('TEST_ENV_VAR')", envs={"TEST_ENV_VAR": "overwrite"})
    assert overridden.text == "overwrite"
    assert sandbox.run_code("import os; os.getenv('TEST_ENV_VAR')").text == "supertest"


@pytest.mark.parametrize(
    "language, setup, read, expected, env_read",
    [
        ("js", "var counter = 41", "counter + 1", "42", "process.env.FOO || 'default'"),
        ("ts", "const typed: number = 41", "typed + 1", "42", "Deno.env.get('FOO') ?? 'default'"),
        ("r", "counter <- 41", "counter + 1", "[1] 42", "Sys.getenv('FOO', unset = 'default')"),
        ("bash", "COUNTER=41", "echo $((COUNTER + 1))", "42\n", "echo ${FOO:-default}"),
    ],
)
def test_languages_keep_their_own_state_and_env(sandbox, cwd, language, setup, read, expected, env_read):
    sandbox.run_code(setup, language=language)
    execution = sandbox.run_code(read, language=language)
    if language == "bash":
        assert execution.logs.stdout == [expected]
    else:
        assert execution.results[0].text.strip() == expected
    with_env = sandbox.run_code(env_read, language=language, envs={"FOO": "bar"})
    without = sandbox.run_code(env_read, language=language)
    text = lambda e: "".join(e.logs.stdout).strip() if language == "bash" else e.results[0].text.strip()
    assert "bar" in text(with_env)
    assert "default" in text(without)
    # Python's state is not visible elsewhere.
    assert sandbox.run_code("counter", language="python").error is not None


def test_java_keeps_its_own_state(sandbox):
    context = sandbox.create_code_context(language="java")
    assert context.language == "java"
    assert sandbox.run_code("int counter = 41;", context=context).error is None
    assert sandbox.run_code("counter + 1", context=context).text == "42"
    with_env = sandbox.run_code('System.getProperty("FOO", "default")', context=context, envs={"FOO": "bar"})
    assert with_env.text == "bar"
    assert sandbox.run_code('System.getProperty("FOO", "default")', context=context).text == "default"
    sandbox.remove_code_context(context)


@pytest.mark.parametrize(
    "language, code",
    [("python", "import os; os.getcwd()"), ("js", "process.cwd()"), ("ts", "Deno.cwd()"), ("r", "getwd()"), ("bash", "pwd")],
)
def test_contexts_have_their_cwd(sandbox, language, code):
    # A directory that exists where the interpreter runs (this host, or a sandbox).
    tmp_path = sandbox.run_code("import tempfile; tempfile.mkdtemp()").text
    context = sandbox.create_code_context(language=language, cwd=str(tmp_path))
    assert context.cwd == str(tmp_path)
    execution = sandbox.run_code(code, context=context)
    output = "".join(execution.logs.stdout) + "".join(r.text or "" for r in execution.results)
    assert str(tmp_path) in output
    sandbox.remove_code_context(context)


def test_default_cwd(sandbox, cwd):
    assert sandbox.run_code("import os; os.getcwd()").text == str(cwd)


def test_context_lifecycle(sandbox):
    context = sandbox.create_code_context()
    assert context.language == "python"
    listed = sandbox.list_code_contexts()
    assert listed[-1].id == context.id
    assert {"python", "javascript"} <= {c.language for c in listed}

    sandbox.run_code("x = 1", context=context)
    assert sandbox.run_code("x", context=context).text == "1"
    other = sandbox.run_code("y_only_here = 1")
    assert sandbox.run_code("y_only_here", context=context).error.name == "NameError"
    assert other.error is None

    sandbox.restart_code_context(context)
    restarted = sandbox.run_code("x", context=context)
    assert restarted.error.name == "NameError"
    assert restarted.error.value == "name 'x' is not defined"

    sandbox.remove_code_context(context.id)
    assert context.id not in [c.id for c in sandbox.list_code_contexts()]
    with pytest.raises(NotFoundException):
        sandbox.run_code("1", context=context)
    with pytest.raises(NotFoundException):
        sandbox.remove_code_context(context.id)


def test_timeout_interrupts_and_the_context_stays_usable(sandbox):
    sandbox.run_code("survivor = 7")
    started = time.monotonic()
    with pytest.raises(TimeoutException):
        sandbox.run_code("while True:\n    pass", timeout=2)
    assert time.monotonic() - started < 10
    execution = sandbox.run_code("survivor * 6", timeout=30)
    assert execution.text == "42"


def test_unknown_language_is_a_clear_error(sandbox):
    with pytest.raises(SandboxException) as error:
        sandbox.run_code("1", language="cobol")
    assert "400" in str(error.value) and "cobol" in str(error.value)


def test_malformed_requests_get_4xx(interpreter_endpoint):
    url, headers = interpreter_endpoint
    headers = {**headers, "Content-Type": "application/json"}
    for body, status in [(b"{oops", 400), (b'{"language": "python"}', 400), (b'{"code": "1", "context_id": "missing"}', 404)]:
        response = httpx.post(f"{url}/execute", content=body, headers=headers)
        assert response.status_code == status, response.text
        assert response.text
    assert httpx.get(f"{url}/health", headers=headers).status_code == 200

"""`berth sandbox|template|volume|secret …` and `berth completions`: the real binary
against the session's `berth up`, `--json` output parsed, `shell` driven through tmux."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from conftest import Berth, Cli, poll


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def listed(cli: Cli, *filters: str) -> dict[str, dict]:
    return {entry["sandboxID"]: entry for entry in cli.json("sandbox", "ls", *filters)}


def test_sandbox_verbs(cli: Cli) -> None:
    tag = unique("run")
    created = cli.json("sandbox", "create", "base", "--timeout", "600", "--metadata", f"suite={tag}", "--env", "GREETING=hi there")
    sandbox_id = created["sandboxID"]
    try:
        assert created["templateID"]
        mine = listed(cli, "--metadata", f"suite={tag}")
        assert list(mine) == [sandbox_id]
        assert mine[sandbox_id]["metadata"] == {"suite": tag}
        assert mine[sandbox_id]["state"] == "running"
        table = cli.ok("sandbox", "ls").stdout
        assert sandbox_id in table and f"suite={tag}" in table
        # A plain create prints the id only, for `$(berth sandbox create)`.
        assert sandbox_id not in listed(cli, "--metadata", "suite=other")

        ran = cli.run("sandbox", "exec", sandbox_id, "--", "echo", "$GREETING;", "echo", "oops", ">&2;", "exit", "3")
        assert (ran.returncode, ran.stdout, ran.stderr) == (3, "hi there\n", "oops\n")
        as_json = cli.json("sandbox", "exec", sandbox_id, "--cwd", "/tmp", "--", "pwd")
        assert as_json == {"stdout": "/tmp\n", "stderr": "", "exitCode": 0, "error": None}
        cli.ok("sandbox", "exec", sandbox_id, "--", "echo kept > /tmp/state; sleep 1000 &")

        logs = cli.ok("sandbox", "logs", sandbox_id).stdout.splitlines()
        assert logs, "a created sandbox has log lines"
        for line in cli.ok("sandbox", "logs", sandbox_id, "--json").stdout.splitlines():
            entry = json.loads(line)
            assert {"timestamp", "message", "level"} <= entry.keys()

        cli.ok("sandbox", "pause", sandbox_id)
        assert listed(cli, "--state", "paused")[sandbox_id]["state"] == "paused"
        assert sandbox_id not in listed(cli, "--state", "running")
        refused = cli.run("sandbox", "exec", sandbox_id, "--", "true")
        assert refused.returncode != 0 and f"berth sandbox resume {sandbox_id}" in refused.stderr
        resumed = cli.json("sandbox", "resume", sandbox_id, "--timeout", "600")
        assert resumed["sandboxID"] == sandbox_id
        # Memory was kept: the background sleep survived the pause.
        after = cli.json("sandbox", "exec", sandbox_id, "--", "cat /tmp/state; pgrep -c -x sleep")
        assert after["stdout"].split() == ["kept", "1"]

        name = unique("snap")
        snapshot = cli.json("sandbox", "snapshot", sandbox_id, "--name", name)
        assert any(name in full for full in snapshot["names"]) or snapshot["snapshotID"] == name
        from_snapshot = cli.ok("sandbox", "create", name, "--timeout", "120").stdout.strip()
        try:
            assert cli.json("sandbox", "exec", from_snapshot, "--", "cat /tmp/state")["stdout"] == "kept\n"
        finally:
            cli.ok("sandbox", "kill", from_snapshot)
        cli.ok("template", "rm", name)

        forks = cli.json("sandbox", "fork", sandbox_id, "--count", "2", "--timeout", "120")
        fork_ids = [fork["sandbox"]["sandboxID"] for fork in forks]
        assert len(set(fork_ids)) == 2 and sandbox_id not in fork_ids
        for fork_id in fork_ids:
            assert cli.json("sandbox", "exec", fork_id, "--", "cat /tmp/state")["stdout"] == "kept\n"
        cli.ok("sandbox", "kill", *fork_ids)
        assert not set(fork_ids) & set(listed(cli))
    finally:
        cli.run("sandbox", "kill", sandbox_id)
    assert sandbox_id not in listed(cli)
    gone = cli.run("sandbox", "kill", sandbox_id)
    assert gone.returncode != 0 and "HTTP 404" in gone.stderr and "berth sandbox ls" in gone.stderr


def test_logs_follow_prints_new_lines(cli: Cli) -> None:
    sandbox_id = cli.ok("sandbox", "create", "--timeout", "300").stdout.strip()
    follower = subprocess.Popen(
        [str(cli.berth.binary), "sandbox", "logs", sandbox_id, "--follow", "--json"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first = json.loads(follower.stdout.readline())
        assert first["message"]
        # Pausing logs a new line, which the follower prints without being restarted.
        cli.ok("sandbox", "pause", sandbox_id, "--no-memory")
        seen = [first]
        deadline = time.monotonic() + 60
        while not any("pause" in entry["message"].lower() for entry in seen):
            assert time.monotonic() < deadline, f"no pause line followed: {seen}"
            seen.append(json.loads(follower.stdout.readline()))
        assert len({json.dumps(entry, sort_keys=True) for entry in seen}) == len(seen), "a line was printed twice"
    finally:
        follower.kill()
        follower.wait()
        cli.run("sandbox", "kill", sandbox_id)


def tmux(socket: str, *args: str) -> str:
    return subprocess.run(["tmux", "-L", socket, *args], check=True, capture_output=True, text=True).stdout


def test_shell_is_a_terminal(cli: Cli, berth: Berth) -> None:
    sandbox_id = cli.ok("sandbox", "create", "--timeout", "300").stdout.strip()
    socket = unique("berth-ops-tmux")
    env = " ".join(f"{name}={shlex.quote(berth.env[name])}" for name in ("E2B_API_URL", "E2B_API_KEY"))
    command = f"env {env} {shlex.quote(str(berth.binary))} sandbox shell {sandbox_id}; echo SHELL-EXIT=$?; sleep 600"
    tmux(socket, "new-session", "-d", "-s", "shell", "-x", "100", "-y", "30", command)
    try:
        def screen() -> str:
            return tmux(socket, "capture-pane", "-p", "-t", "shell", "-S", "-200")

        def typed(text: str) -> None:
            tmux(socket, "send-keys", "-t", "shell", "-l", text)
            tmux(socket, "send-keys", "-t", "shell", "Enter")

        poll(lambda: "$" in screen() or "#" in screen(), timeout=60, what=f"a prompt; screen:\n{screen()}")
        typed("echo answer=$((6*7)); tty; stty size")
        poll(lambda: "answer=42" in screen() and "/dev/pts/" in screen() and "30 100" in screen(), timeout=30, what=f"the shell's answers; screen:\n{screen()}")
        # A window size change reaches the PTY (SIGWINCH -> Update).
        tmux(socket, "resize-window", "-t", "shell", "-x", "120", "-y", "40")
        time.sleep(0.5)
        typed("stty size")
        poll(lambda: "40 120" in screen(), timeout=30, what=f"the new size; screen:\n{screen()}")
        # Ctrl-C reaches the sandbox's foreground job, not the local CLI.
        typed("sleep 100")
        time.sleep(1)
        tmux(socket, "send-keys", "-t", "shell", "C-c")
        typed("echo still=here")
        poll(lambda: "still=here" in screen().split("echo still=here")[-1], timeout=30, what=f"the shell to survive ^C; screen:\n{screen()}")
        typed("exit 7")
        poll(lambda: "SHELL-EXIT=7" in screen(), timeout=30, what=f"the CLI to exit with the shell's code; screen:\n{screen()}")
    finally:
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True)
        # kill-server leaves the socket file behind.
        Path(os.environ.get("TMUX_TMPDIR", "/tmp"), f"tmux-{os.getuid()}", socket).unlink(missing_ok=True)
        cli.run("sandbox", "kill", sandbox_id)


def test_errors_say_what_to_do(cli: Cli, berth: Berth) -> None:
    no_key = cli.run("sandbox", "ls", env={"E2B_API_KEY": ""})
    assert no_key.returncode != 0 and "E2B_API_KEY" in no_key.stderr and "berth keys create" in no_key.stderr
    wrong_key = cli.run("sandbox", "ls", "--api-key", "e2b_" + "0" * 40)
    assert wrong_key.returncode != 0 and "HTTP 401" in wrong_key.stderr and "--api-key" in wrong_key.stderr
    with_port_closed = cli.run("sandbox", "ls", "--api-url", "http://127.0.0.1:9")
    assert with_port_closed.returncode != 0 and "is `berth up` running" in with_port_closed.stderr
    unknown = cli.run("sandbox", "exec", "nosuchsandbox", "--", "true")
    assert unknown.returncode != 0 and "HTTP 404" in unknown.stderr
    bad_template = cli.run("sandbox", "create", "no-such-template")
    assert bad_template.returncode != 0 and "no-such-template" in bad_template.stderr
    assert berth.api_key not in wrong_key.stderr + no_key.stderr + unknown.stderr


def test_default_endpoint_is_the_local_berth_up(cli: Cli, berth: Berth) -> None:
    env = {name: value for name, value in os.environ.items() if name != "E2B_API_URL"}
    result = subprocess.run(
        [str(berth.binary), "sandbox", "ls", "--json", "--state-dir", str(berth.state_dir)],
        env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert isinstance(json.loads(result.stdout), list)
    assert (berth.state_dir / "api-url").read_text().strip() == berth.api_url


def test_client_verbs_work_for_users_who_cannot_change_the_state_dir(berth: Berth) -> None:
    # Client verbs talk REST like any client; only the commands that own the state dir
    # bring its modes in line (a user other than root could not).
    with tempfile.TemporaryDirectory(prefix="berth-ops-nobody-", dir="/tmp") as home:
        binary = Path(home) / "berth"
        binary.write_bytes(berth.binary.read_bytes())
        Path(home).chmod(0o755)
        binary.chmod(0o755)
        result = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
             str(binary), "sandbox", "ls", "--json", "--state-dir", str(berth.state_dir)],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
        )
    assert result.returncode == 0, result.stderr
    assert isinstance(json.loads(result.stdout), list)


def test_other_teams_see_nothing(cli: Cli, other_team_key: str) -> None:
    sandbox_id = cli.ok("sandbox", "create", "--timeout", "120").stdout.strip()
    try:
        theirs = cli.run("sandbox", "ls", "--json", "--api-key", other_team_key)
        assert theirs.returncode == 0 and sandbox_id not in theirs.stdout
        refused = cli.run("sandbox", "kill", sandbox_id, "--api-key", other_team_key)
        assert refused.returncode != 0 and "HTTP 404" in refused.stderr
    finally:
        cli.ok("sandbox", "kill", sandbox_id)


def test_volume_verbs(cli: Cli) -> None:
    name = unique("vol")
    created = cli.json("volume", "create", name)
    volume_id = created["volumeID"]
    assert created["name"] == name and created["token"]
    assert {v["volumeID"]: v["name"] for v in cli.json("volume", "ls")}[volume_id] == name
    assert volume_id in cli.ok("volume", "ls").stdout
    assert cli.json("volume", "info", volume_id)["name"] == name
    duplicate = cli.run("volume", "create", name)
    assert duplicate.returncode != 0 and "HTTP 409" in duplicate.stderr
    cli.ok("volume", "rm", volume_id)
    assert volume_id not in {v["volumeID"] for v in cli.json("volume", "ls")}


def test_secret_verbs_never_show_the_value(cli: Cli) -> None:
    name = unique("key").replace("-", "_")
    value = "sk_live_" + uuid.uuid4().hex
    created = cli.json("secret", "create", name, "--metadata", "owner=ops", input=value + "\n")
    assert created["name"] == name and created["currentVersion"] == 1
    assert value not in json.dumps(created)
    updated = cli.json("secret", "update", name, input=value + "-2")
    assert updated["currentVersion"] == 2
    listing = cli.ok("secret", "ls").stdout
    assert name in listing and "owner=ops" in listing and value not in listing
    mine = {s["name"]: s for s in cli.json("secret", "ls")}
    assert mine[name]["currentVersion"] == 2 and value not in json.dumps(mine)
    empty = cli.run("secret", "create", unique("empty").replace("-", "_"), input="")
    assert empty.returncode != 0 and "stdin" in empty.stderr
    cli.ok("secret", "rm", name)
    assert name not in {s["name"] for s in cli.json("secret", "ls")}


def test_template_ls_and_rm(cli: Cli) -> None:
    templates = cli.json("template", "ls")
    assert any("base" in t["names"] or t["templateID"] == "base" for t in templates), templates
    assert "base" in cli.ok("template", "ls").stdout
    missing = cli.run("template", "rm", unique("missing"))
    assert missing.returncode != 0 and "HTTP 404" in missing.stderr


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completions(cli: Cli, shell: str, tmp_path: Path) -> None:
    script = cli.ok("completions", shell).stdout
    for word in ("sandbox", "snapshot", "volume", "secret", "api-url"):
        assert word in script
    if shell == "bash":
        path = tmp_path / "berth.bash"
        path.write_text(script)
        completed = subprocess.run(
            ["bash", "-c", f"source {path}; COMP_WORDS=(berth sandbox); COMP_CWORD=2; COMP_LINE='berth sandbox '; COMP_POINT=14; _berth berth '' sandbox; printf '%s\\n' \"${{COMPREPLY[@]}}\""],
            capture_output=True, text=True, timeout=30,
        )
        assert completed.returncode == 0, completed.stderr
        assert {"ls", "create", "exec", "shell", "fork"} <= set(completed.stdout.split())

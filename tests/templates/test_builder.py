"""The Python SDK's Template builder (e2b 2.63) against `berth up`: every step kind, start
and ready commands, background builds with status polling, logs, failures and the cache."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from e2b import BuildException, Sandbox, Template, wait_for_port

from conftest import Berth, poll, unique


def build_logs(api: httpx.Client, template_id: str, build_id: str) -> list[dict]:
    """Every log entry of a build, through the status route's logsOffset paging."""
    entries: list[dict] = []
    while True:
        answer = api.get(f"/templates/{template_id}/builds/{build_id}/status", params={"logsOffset": len(entries)})
        assert answer.status_code == 200, answer.text
        page = answer.json()["logEntries"]
        if not page:
            return entries
        entries.extend(page)


def ran(entries: list[dict]) -> set[str]:
    """Steps that ran (the others were CACHED)."""
    cached = {e["step"] for e in entries if e["message"] == "CACHED"}
    steps = {e.get("step") for e in entries if e.get("step") not in (None, "finalize")}
    return steps - cached


def memory_limit(sandbox_id: str) -> int:
    """The memory limit of a sandbox's cgroup, read on the host (v1 or v2)."""
    for path in [
        Path(f"/sys/fs/cgroup/memory/berth/{sandbox_id}/memory.limit_in_bytes"),
        Path(f"/sys/fs/cgroup/berth/{sandbox_id}/memory.max"),
    ]:
        if path.exists():
            return int(path.read_text())
    raise AssertionError(f"no memory cgroup for {sandbox_id}")


def test_every_step_kind_is_seen_by_sandboxes(berth: Berth, api: httpx.Client, tmp_path: Path, cleanup) -> None:
    context = tmp_path / "context"
    (context / "tree/sub").mkdir(parents=True)
    (context / "hello.txt").write_text("hello from the context\n")
    (context / "tree/sub/inner.txt").write_text("inner\n")
    (context / "tree/link.txt").symlink_to("sub/inner.txt")
    (context / "outside.txt").write_text("resolved\n")
    (context / "resolved-link").symlink_to("outside.txt")
    name = cleanup(unique("every-step"))
    template = (
        Template(file_context_path=str(context))
        .from_template("base")
        .run_cmd("echo root > /etc/who-ran-me && id -u >> /etc/who-ran-me", user="root")
        .run_cmd("echo user > ~/who-ran-me && id -u >> ~/who-ran-me")
        .copy("hello.txt", "/home/user/hello.txt")
        .copy("tree", "/opt/tree", user="root")
        .copy("resolved-link", "/home/user/resolved.txt", resolve_symlinks=True)
        .set_envs({"GREETING": "hi there", "WITH_PATH": "$PATH:/opt/bin"})
        .make_symlink("/opt/tree/sub/inner.txt", "/home/user/inner-link")
        .set_user("root")
        .run_cmd("mkdir -p /srv/app && chown user: /srv/app")
        .set_user("user")
        .set_workdir("/srv/app")
        .run_cmd("pwd > where-am-i")
    )
    info = Template.build(template, name, cpu_count=1, memory_mb=768)
    sandbox = Sandbox.create(name, timeout=300)
    try:
        def out(command: str, **kwargs) -> str:
            return sandbox.commands.run(command, **kwargs).stdout.strip()

        assert out("cat /etc/who-ran-me").split() == ["root", "0"]
        assert out("cat /home/user/who-ran-me").split() == ["user", "1000"]
        assert out("cat /home/user/hello.txt") == "hello from the context"
        assert out("stat -c %U /home/user/hello.txt") == "user"
        assert out("cat /opt/tree/sub/inner.txt") == "inner"
        assert out("readlink /opt/tree/link.txt") == "sub/inner.txt", "directory symlinks are kept"
        assert out("cat /opt/tree/link.txt") == "inner"
        assert out("test -L /home/user/resolved.txt || echo regular") == "regular"
        assert out("cat /home/user/resolved.txt") == "resolved"
        assert out("echo $GREETING") == "hi there"
        assert out("echo $WITH_PATH").endswith(":/opt/bin") and "/usr/bin" in out("echo $WITH_PATH")
        assert out("readlink /home/user/inner-link") == "/opt/tree/sub/inner.txt"
        assert out("whoami") == "user"
        assert out("pwd") == "/srv/app"
        assert out("cat /srv/app/where-am-i") == "/srv/app"
        assert out("sudo -n id -u") == "0", "user has passwordless sudo"
        # The build's resources are the sandbox's, reported by the API and enforced.
        detail = api.get(f"/sandboxes/{sandbox.sandbox_id}").json()
        assert (detail["cpuCount"], detail["memoryMB"]) == (1, 768)
        assert detail["templateID"] == info.template_id
        assert detail["alias"] == name
        assert memory_limit(sandbox.sandbox_id) == 768 * 1024 * 1024
    finally:
        sandbox.kill()
    listed = {t["templateID"]: t for t in api.get("/v2/templates").json()}
    assert listed[info.template_id]["cpuCount"] == 1
    assert listed[info.template_id]["memoryMB"] == 768
    assert listed[info.template_id]["spawnCount"] == 1


def test_a_start_command_template_serves_its_first_request_without_a_cold_start(api: httpx.Client, cleanup) -> None:
    name = cleanup(unique("warm-web"))
    template = (
        Template()
        .from_template("base")
        .run_cmd("mkdir -p ~/www && echo served-warm > ~/www/index.html")
        .set_start_cmd(
            "date +%s%N > /tmp/server-started-ns && cd ~/www && exec python3 -m http.server 8080",
            wait_for_port(8080),
        )
    )
    Template.build(template, name)
    before_create_ns = time.time_ns()
    sandbox = Sandbox.create(name, timeout=300)
    try:
        first = sandbox.commands.run("curl -s --max-time 5 http://127.0.0.1:8080/index.html")
        assert first.stdout.strip() == "served-warm"
        # The server was started during the build and came back from its checkpoint:
        # it started before this sandbox existed.
        started_ns = int(sandbox.commands.run("cat /tmp/server-started-ns").stdout.strip())
        assert started_ns < before_create_ns
        assert sandbox.commands.run("pgrep -f 'http.server 8080' | head -1").stdout.strip()
        # Each sandbox gets its own identity although restored from one checkpoint.
        assert sandbox.commands.run("echo $E2B_SANDBOX_ID").stdout.strip() == sandbox.sandbox_id
    finally:
        sandbox.kill()


def test_a_start_command_sandbox_gets_the_network_its_create_asks_for(internet, cleanup) -> None:
    """Both sandboxes come from one checkpoint (taken under the build sandbox's default
    policy); each runs under the policy its own create names."""
    name = cleanup(unique("warm-net"))
    Template.build(
        Template().from_template("base").set_start_cmd("python3 -m http.server 8082", wait_for_port(8082)),
        name,
    )
    web = internet.web_ips[0]
    fetch = f"curl -s -o /dev/null -w '%{{http_code}}' --max-time 5 http://{web}/ || true"
    open_box = Sandbox.create(name, timeout=120)
    closed_box = Sandbox.create(name, timeout=120, network={"deny_out": ["0.0.0.0/0"]})
    try:
        assert open_box.commands.run(fetch).stdout.strip() == "200"
        assert closed_box.commands.run(fetch).stdout.strip() == "000", "denied egress"
        assert closed_box.commands.run("curl -s --max-time 5 http://127.0.0.1:8082/ >/dev/null && echo up").stdout.strip() == "up"
    finally:
        open_box.kill()
        closed_box.kill()


def test_build_in_background_status_polling_and_logs(api: httpx.Client, cleanup) -> None:
    name = cleanup(unique("background"))
    template = Template().from_template("base").run_cmd("echo one-line-of-output && sleep 1").run_cmd("echo second")
    info = Template.build_in_background(template, name, skip_cache=True)
    seen: list = []
    statuses = set()

    def finished() -> bool:
        status = Template.get_build_status(info, logs_offset=len(seen))
        seen.extend(status.log_entries)
        statuses.add(status.status.value)
        return status.status.value in ("ready", "error")

    poll(finished, timeout=600, interval=0.2, what="the background build")
    assert "ready" in statuses and statuses <= {"waiting", "building", "ready"}, statuses
    assert any(entry.message == "one-line-of-output" for entry in seen)
    entries = build_logs(api, info.template_id, info.build_id)
    assert {"base", "1", "2", "finalize"} <= {e.get("step") for e in entries}
    assert all(e["level"] in ("debug", "info", "warn", "error") and e["timestamp"] for e in entries)

    logs_route = f"/templates/{info.template_id}/builds/{info.build_id}/logs"
    forward = api.get(logs_route, params={"limit": 3}).json()["logs"]
    assert [e["message"] for e in forward] == [e["message"] for e in entries[:3]]
    newest = api.get(logs_route, params={"direction": "backward", "limit": 2}).json()["logs"]
    assert newest[0]["message"] == entries[-1]["message"]
    middle_ms = int(time.mktime(time.strptime(entries[len(entries) // 2]["timestamp"][:19], "%Y-%m-%dT%H:%M:%S")) * 1000)
    later = api.get(logs_route, params={"cursor": middle_ms + 1000}).json()["logs"]
    assert len(later) < len(entries)
    assert api.get(logs_route, params={"level": "error"}).json()["logs"] == []
    assert api.get(logs_route, params={"direction": "sideways"}).status_code == 400

    builds = api.get(f"/templates/{info.template_id}").json()["builds"]
    assert [b["buildID"] for b in builds] == [info.build_id]
    assert builds[0]["status"] == "ready" and builds[0]["finishedAt"]


def test_a_failing_step_reports_its_step_and_stderr(api: httpx.Client, cleanup) -> None:
    name = cleanup(unique("failing"))
    template = (
        Template()
        .from_template("base")
        .run_cmd("echo fine")
        .run_cmd("echo 'this step is doomed' >&2; exit 3")
        .run_cmd("echo never-reached")
    )
    with pytest.raises(BuildException) as failure:
        Template.build(template, name)
    assert "this step is doomed" in str(failure.value)
    template_id = api.get(f"/templates/aliases/{name}").json()["templateID"]
    build = api.get(f"/templates/{template_id}").json()["builds"][0]
    status = api.get(f"/templates/{template_id}/builds/{build['buildID']}/status").json()
    assert status["status"] == "error"
    assert status["reason"]["step"] == "2"
    assert "this step is doomed" in status["reason"]["message"]
    assert any(e["level"] == "error" for e in status["reason"]["logEntries"])
    assert not any(e["message"] == "never-reached" for e in build_logs(api, template_id, build["buildID"]))
    # A failed first build leaves nothing to start from.
    answer = api.post("/v2/sandboxes", json={"templateID": name})
    assert answer.status_code == 404 and "no ready build" in answer.json()["message"]


def test_an_unchanged_rebuild_runs_nothing_and_a_change_reruns_it_and_later_steps(api: httpx.Client, cleanup) -> None:
    name = cleanup(unique("cache"))
    marker = unique("m")

    def template(second: str) -> Template:
        return (
            Template()
            .from_template("base")
            .run_cmd(f"echo {marker} first > ~/first")
            .run_cmd(second)
            .run_cmd("cat ~/second > ~/third")
        )

    first = Template.build(template(f"echo {marker} second-a > ~/second"), name)
    entries = build_logs(api, first.template_id, first.build_id)
    assert {"1", "2", "3"} <= ran(entries)

    again = Template.build(template(f"echo {marker} second-a > ~/second"), name)
    assert again.build_id != first.build_id
    assert ran(build_logs(api, again.template_id, again.build_id)) == set(), "every step came from the cache"

    changed = Template.build(template(f"echo {marker} second-b > ~/second"), name)
    assert ran(build_logs(api, changed.template_id, changed.build_id)) == {"2", "3"}
    sandbox = Sandbox.create(name, timeout=120)
    try:
        assert sandbox.commands.run("cat ~/third").stdout.strip() == f"{marker} second-b"
    finally:
        sandbox.kill()

    forced = Template.build(template(f"echo {marker} second-b > ~/second"), name, skip_cache=True)
    assert {"1", "2", "3"} <= ran(build_logs(api, forced.template_id, forced.build_id))


def test_a_running_build_can_be_cancelled(api: httpx.Client, cleanup) -> None:
    name = cleanup(unique("cancel"))
    template = Template().from_template("base").skip_cache().run_cmd("sleep 300")
    info = Template.build_in_background(template, name)
    route = f"/templates/{info.template_id}/builds/{info.build_id}"

    def running_step() -> bool:
        entries = api.get(f"{route}/status").json()["logEntries"]
        return any(e["message"].startswith("RUN sleep 300") for e in entries)

    poll(running_step, timeout=300, what="the sleep step to start")
    assert api.delete(route).status_code == 204
    poll(lambda: api.get(f"{route}/status").json()["status"] == "error", timeout=60, what="the cancel")
    assert api.get(f"{route}/status").json()["reason"]["message"] == "build cancelled"
    assert api.delete(route).status_code == 404, "nothing left to cancel"


def test_requests_are_validated_like_e2b(api: httpx.Client) -> None:
    for body, fragment in [
        ({}, "name is required"),
        ({"name": "Has Space"}, "invalid template name"),
        ({"name": "app:bad tag"}, "invalid tag"),
        ({"name": "app", "tags": ["0b5d0e6a-1c2b-4a8e-9f3d-2a1b3c4d5e6f"]}, "UUID"),
        ({"name": "someone-else/app"}, "must match your team"),
        ({"name": "app", "cpuCount": 1000}, "cpuCount"),
        ({"name": "app", "memoryMB": 1001}, "even"),
    ]:
        answer = api.post("/v3/templates", json=body)
        assert answer.status_code == 400, (body, answer.text)
        assert fragment in answer.json()["message"], (body, answer.text)
    requested = api.post("/v3/templates", json={"name": unique("Valid_Name") + ":V1", "tags": ["extra", "EXTRA"]})
    assert requested.status_code == 202, requested.text
    body = requested.json()
    assert sorted(body["tags"]) == ["extra", "v1"]
    assert body["names"][0].startswith("default/valid_name-")
    template_id, build_id = body["templateID"], body["buildID"]
    status = api.get(f"/templates/{template_id}/builds/{build_id}/status").json()
    assert status["status"] == "waiting" and status["logEntries"] == []
    assert api.get(f"/templates/{template_id}/files/{'ab' * 32}").json()["present"] is False
    assert api.get(f"/templates/{template_id}/files/not-a-hash").status_code == 400
    started = api.post(f"/v2/templates/{template_id}/builds/{build_id}", json={"fromTemplate": "no-such-base", "steps": []})
    assert started.status_code == 404, started.text
    assert api.post(f"/v2/templates/{template_id}/builds/{'0' * 8}-0000-4000-8000-{'0' * 12}", json={}).status_code == 404
    assert api.delete(f"/templates/{template_id}").status_code == 204

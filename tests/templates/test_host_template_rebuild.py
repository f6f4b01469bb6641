"""A host template (`code-interpreter-v1`) whose definition changed is rebuilt when
`berth up` starts, and what was made from the old build keeps it: a sandbox paused
before the rebuild resumes (memory kept) on the old layers, while new sandboxes get the
new build; an unchanged definition is not rebuilt.

The definitions here are tiny stand-ins given with `--code-interpreter-definition`
(one RUN step writing a marker, a Python HTTP server as the start command), so the
builds take seconds and need no package registry. The instance is this test's own, on
a state dir of its own, so the suite's templates are untouched. The old build stays while
a paused sandbox uses it and goes at the first start after nothing does.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import httpx
import pytest
from e2b import Sandbox

from conftest import Berth, kill_all_sandboxes, mounts_under, new_berth, poll

TEMPLATE = "code-interpreter-v1"
MARKER = "/etc/berth-definition"


def write_definition(directory: Path, marker: str) -> Path:
    directory.mkdir(parents=True)
    (directory / "template.json").write_text(json.dumps({
        "name": TEMPLATE,
        "fromTemplate": "base",
        "buildResources": {"cpuCount": 1, "memoryMB": 512, "diskSizeMB": 1024},
        "resources": {"cpuCount": 1, "memoryMB": 512, "diskSizeMB": 1024},
        "steps": [
            {"type": "USER", "args": ["root"]},
            {"type": "RUN", "args": [f"echo {marker} > {MARKER}"]},
            {"type": "USER", "args": ["user"]},
        ],
        "startCmd": "python3 -m http.server 49999 --bind 127.0.0.1 --directory /tmp",
        "readyCmd": "curl -sf http://127.0.0.1:49999/",
    }))
    return directory


@pytest.fixture
def own_berth(internet) -> Iterator[Berth]:
    state_dir = Path(tempfile.mkdtemp(prefix="berth-host-tpl-"))
    instance = new_berth(internet, state_dir, state_dir / "berth-up.log", BERTH_POOL_SIZE="0")
    # Berth.start points the SDK's variables at the instance; the suite's come back after.
    saved = {name: os.environ.get(name) for name in ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY")}
    try:
        yield instance
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if instance.process is not None and instance.process.poll() is None and instance.env:
            kill_all_sandboxes(instance.api_url, instance.api_key)
        instance.stop()
        if mounts_under(state_dir):
            print(f"\nleaving {state_dir}: still mounted inside")
        else:
            shutil.rmtree(state_dir, ignore_errors=True)


def template_build_id(berth: Berth) -> str:
    listed = httpx.get(f"{berth.api_url}/templates", headers={"X-API-Key": berth.api_key}, timeout=30)
    listed.raise_for_status()
    return next(t["buildID"] for t in listed.json() if TEMPLATE in t.get("aliases", []) or t["templateID"] == TEMPLATE)


def log_size(berth: Berth) -> int:
    return berth.log_path.stat().st_size


def log_since(berth: Berth, offset: int) -> str:
    return berth.log_path.read_bytes()[offset:].decode(errors="replace")


def test_a_changed_definition_is_rebuilt_and_what_the_old_build_made_keeps_it(own_berth: Berth, tmp_path: Path) -> None:
    berth = own_berth
    berth.network_env["BERTH_CODE_INTERPRETER_DEFINITION"] = str(write_definition(tmp_path / "v1", "v1"))
    berth.start()
    old = Sandbox.create(TEMPLATE, timeout=900)  # built on first use
    assert old.commands.run(f"cat {MARKER}").stdout == "v1\n"
    old.files.write("/home/user/mine", "kept")
    server_pid = old.commands.run("pgrep -f '^python3 -m http.server'").stdout.split()
    assert server_pid, "the start command runs"
    first_build = template_build_id(berth)
    old.beta_pause()

    berth.stop()
    berth.network_env["BERTH_CODE_INTERPRETER_DEFINITION"] = str(write_definition(tmp_path / "v2", "v2"))
    offset = log_size(berth)
    berth.start()
    poll(lambda: template_build_id(berth) != first_build, timeout=900, interval=1,
         what="the changed definition to be rebuilt in the background")
    assert "rebuilding host template: its definition changed" in log_since(berth, offset)
    second_build = template_build_id(berth)

    superseded = berth.state_dir / "templates" / "superseded"
    assert [p.stem for p in superseded.glob("*.json")] == [f"{TEMPLATE}@{first_build}"], "kept for the paused sandbox"
    old_build = json.loads((superseded / f"{TEMPLATE}@{first_build}.json").read_text())

    new = Sandbox.create(TEMPLATE, timeout=300)
    assert new.commands.run(f"cat {MARKER}").stdout == "v2\n"
    new.kill()

    resumed = Sandbox.connect(old.sandbox_id, timeout=300)
    assert resumed.commands.run(f"cat {MARKER}").stdout == "v1\n", "the paused sandbox keeps its build's layers"
    assert resumed.files.read("/home/user/mine") == "kept"
    assert resumed.commands.run("pgrep -f '^python3 -m http.server'").stdout.split() == server_pid, "memory kept"
    assert resumed.commands.run("curl -sf -o /dev/null -w '%{http_code}' http://127.0.0.1:49999/").stdout == "200"
    resumed.kill()

    # The same definition again: nothing to rebuild; the old build, used by nothing any
    # more, goes at this start with its own layer and checkpoint.
    berth.stop()
    offset = log_size(berth)
    berth.start()
    again = Sandbox.create(TEMPLATE, timeout=300)
    assert again.commands.run(f"cat {MARKER}").stdout == "v2\n"
    again.kill()
    assert template_build_id(berth) == second_build
    log = log_since(berth, offset)
    assert "rebuilding host template" not in log
    assert "removed a superseded build nothing uses" in log
    assert not list(superseded.glob("*.json"))
    layers = {p.name for p in (berth.state_dir / "templates" / "layers").iterdir()}
    current = json.loads((berth.state_dir / "templates" / "manifests" / f"{TEMPLATE}.json").read_text())["layers"]
    own = [layer for layer in old_build["layers"] if layer not in current]
    assert own, "the v1 RUN step made a layer of its own"
    assert not set(own) & layers, "the old build's own layers are gone"
    assert set(current) <= layers, "shared layers (base's among them) stay"
    assert not (berth.state_dir / "checkpoints" / old_build["checkpoint"]).exists()

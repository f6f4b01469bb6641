"""`berth template build|list|delete` and the official E2B CLI (`@e2b/cli@2.19.0`,
tests/templates/e2b-cli) `template create|list|delete` against `berth up`."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox

from conftest import HERE, Berth, Images, unique

E2B_CLI = HERE / "e2b-cli" / "node_modules" / ".bin" / "e2b"


def dockerfile_context(tmp_path: Path, base: str) -> Path:
    (tmp_path / "greeting.txt").write_text("hello from the build context\n")
    (tmp_path / "Dockerfile").write_text(
        f"FROM {base}\nRUN echo cli-run > /etc/cli-marker\nCOPY greeting.txt /home/user/greeting.txt\nENV FROM_CLI=yes\n"
    )
    return tmp_path


def check_sandbox(name: str) -> None:
    sandbox = Sandbox.create(name, timeout=60)
    try:
        run = lambda c: sandbox.commands.run(c).stdout.strip()  # noqa: E731
        assert run("cat /etc/cli-marker") == "cli-run"
        assert run("cat /home/user/greeting.txt") == "hello from the build context"
        assert run("echo $FROM_CLI") == "yes"
    finally:
        sandbox.kill()


def test_berth_template_build_list_delete(berth: Berth, images: Images, tmp_path: Path) -> None:
    context = dockerfile_context(tmp_path, images.plain)
    name = unique("berth-cli")
    built = berth.berth_cli("template", "build", "-f", str(context / "Dockerfile"), "--name", f"{name}:v1", "--tag", "default")
    assert built.returncode == 0, built.stderr
    assert "RUN echo cli-run" in built.stderr and "ready" in built.stderr
    check_sandbox(f"{name}:v1")
    listed = berth.berth_cli("template", "list")
    assert listed.returncode == 0 and f"default/{name}" in listed.stdout, listed.stdout
    (tmp_path / "Failing.dockerfile").write_text(f"FROM {images.plain}\nRUN echo about to fail >&2 && exit 7\n")
    failed = berth.berth_cli("template", "build", "-f", str(tmp_path / "Failing.dockerfile"), "--name", unique("cli-fail"))
    deleted = berth.berth_cli("template", "delete", name)
    assert deleted.returncode == 0, deleted.stderr
    assert f"default/{name}" not in berth.berth_cli("template", "list").stdout
    assert berth.berth_cli("template", "delete", name).returncode != 0
    assert failed.returncode != 0
    assert "step 3" in failed.stderr and "about to fail" in failed.stderr, failed.stderr


@pytest.mark.skipif(not E2B_CLI.exists(), reason="the E2B CLI is not installed: run scripts/install-deps.sh")
def test_e2b_cli_template_create_list_delete(berth: Berth, api: httpx.Client, images: Images, tmp_path: Path) -> None:
    context = dockerfile_context(tmp_path, images.plain)
    name = unique("e2b-cli")
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "E2B_API_URL": berth.api_url,
        "E2B_API_KEY": berth.api_key,
        "NO_UPDATE_NOTIFIER": "1",
    }

    def e2b(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(E2B_CLI), *args], cwd=context, env=env, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)

    created = e2b("template", "create", name, "--path", str(context), "--cpu-count", "1", "--memory-mb", "1024")
    assert created.returncode == 0, created.stdout + created.stderr
    check_sandbox(name)
    listed = e2b("template", "list", "--format", "json")
    assert listed.returncode == 0, listed.stderr
    mine = [t for t in json.loads(listed.stdout[listed.stdout.index("["):]) if name in t["aliases"]]
    assert len(mine) == 1 and mine[0]["cpuCount"] == 1 and mine[0]["memoryMB"] == 1024
    pretty = e2b("template", "list")
    assert pretty.returncode == 0 and name in pretty.stdout
    deleted = e2b("template", "delete", mine[0]["templateID"], "--yes")
    assert deleted.returncode == 0, deleted.stdout + deleted.stderr
    assert api.get(f"/templates/aliases/{name}").status_code == 404

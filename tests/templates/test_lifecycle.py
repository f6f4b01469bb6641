"""A template's life: in use it is not deleted; deleting it frees the layers and
checkpoints only it used; COPY uploads are content-addressed and token-protected; a
restart marks interrupted builds failed."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox, Template, wait_for_port

from conftest import Berth, poll, unique


def layers(berth: Berth) -> set[str]:
    return {p.name for p in (berth.state_dir / "templates/layers").iterdir()}


def checkpoints(berth: Berth) -> set[str]:
    directory = berth.state_dir / "checkpoints"
    return {p.name for p in directory.iterdir()} if directory.is_dir() else set()


def manifest_layers(berth: Berth, build_id: str) -> set[str]:
    manifest = berth.state_dir / "templates/manifests" / f"build-{build_id}.json"
    return set(json.loads(manifest.read_text())["layers"])


def test_in_use_templates_are_kept_and_deleting_frees_only_their_files(berth: Berth, api: httpx.Client) -> None:
    shared_step = unique("shared")
    keep = unique("keep")
    doomed = unique("doomed")
    common = Template().from_template("base").run_cmd(f"echo {shared_step} > ~/shared")
    kept = Template.build(common, keep)
    gone = Template.build(
        Template()
        .from_template("base")
        .run_cmd(f"echo {shared_step} > ~/shared")
        .run_cmd(f"echo {doomed} > ~/own")
        .set_start_cmd("python3 -m http.server 8081", wait_for_port(8081)),
        doomed,
    )
    own_layers = manifest_layers(berth, gone.build_id) - manifest_layers(berth, kept.build_id)
    assert len(own_layers) == 1, "the shared step's layer is one layer of both"
    template_checkpoints = {c for c in checkpoints(berth) if c.startswith("tpl-")}
    assert template_checkpoints, "the start command's checkpoint"

    running = Sandbox.create(doomed, timeout=120)
    refused = api.delete(f"/templates/{doomed}")
    assert refused.status_code == 400 and "running or paused" in refused.json()["message"]
    running.beta_pause()
    assert api.delete(f"/templates/{doomed}").status_code == 400, "a paused sandbox still uses it"
    running.kill()

    before = checkpoints(berth)
    assert api.delete(f"/templates/{doomed}").status_code == 204
    poll(lambda: not (own_layers & layers(berth)), timeout=60, what="the deleted template's own layer to go")
    assert manifest_layers(berth, kept.build_id) <= layers(berth), "shared layers stay"
    assert len(before - checkpoints(berth)) == 1, "its checkpoint is deleted"
    assert not (berth.state_dir / "templates/manifests" / f"build-{gone.build_id}.json").exists()
    assert api.get(f"/templates/{doomed}").status_code == 404
    assert api.get(f"/templates/aliases/{doomed}").status_code == 404
    assert api.delete(f"/templates/{doomed}").status_code == 404
    # The kept template still starts.
    sandbox = Sandbox.create(keep, timeout=60)
    try:
        assert sandbox.commands.run("cat ~/shared").stdout.strip() == shared_step
    finally:
        sandbox.kill()
    assert api.delete(f"/templates/{keep}").status_code == 204


def test_upload_urls_are_signed_content_addressed_and_retry_safe(api: httpx.Client, tmp_path: Path, other_team: httpx.Client, cleanup) -> None:
    name = cleanup(unique("uploads"))
    requested = api.post("/v3/templates", json={"name": name}).json()
    template_id = requested["templateID"]
    digest = "cd" * 32
    link = api.get(f"/templates/{template_id}/files/{digest}")
    assert link.status_code == 201
    url = link.json()["url"]
    assert link.json()["present"] is False and "signature=" in url
    assert httpx.put(url, content=b"not a tar").status_code == 400
    assert httpx.put(url.replace("signature=", "signature=00"), content=b"x").status_code == 403
    assert httpx.put(url.replace(template_id, "someoneelse"), content=b"x").status_code in (403, 404)
    import io
    import tarfile

    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        info = tarfile.TarInfo("file.txt")
        info.size = 5
        tar.addfile(info, io.BytesIO(b"hello"))
    body = archive.getvalue()
    assert httpx.put(url, content=body).status_code == 200
    assert httpx.put(url, content=body).status_code == 200, "a retried upload is harmless"
    assert api.get(f"/templates/{template_id}/files/{digest}").json()["present"] is True
    # Uploads are per team: the other team has none under that hash.
    theirs = other_team.post("/v3/templates", json={"name": unique("their-uploads")}).json()
    assert other_team.get(f"/templates/{theirs['templateID']}/files/{digest}").json()["present"] is False
    assert other_team.delete(f"/templates/{theirs['templateID']}").status_code == 204


@pytest.mark.restarts_berth
def test_a_restart_marks_interrupted_builds_failed(berth: Berth, api: httpx.Client, cleanup) -> None:
    name = cleanup(unique("interrupted"))
    info = Template.build_in_background(Template().from_template("base").skip_cache().run_cmd("sleep 600"), name)
    route = f"/templates/{info.template_id}/builds/{info.build_id}/status"
    poll(
        lambda: any(e["message"].startswith("RUN sleep 600") for e in api.get(route).json()["logEntries"]),
        timeout=300,
        what="the build to run its step",
    )
    berth.restart()
    with httpx.Client(base_url=berth.api_url, headers={"X-API-Key": berth.api_key}, timeout=60) as fresh:
        status = fresh.get(route).json()
        assert status["status"] == "error", status
        assert "interrupted" in status["reason"]["message"]
        assert not [s for s in (berth.state_dir / "sandboxes").iterdir() if s.name.startswith("bld-")], "no build sandbox is left"
        # The template's name is free to build again.
        Template.build(Template().from_template("base").run_cmd("true"), name)

"""Tags, names and aliases, and templates belonging to teams: private templates are
invisible and unusable to other teams, public ones usable but not changeable."""

from __future__ import annotations

import httpx
import pytest
from e2b import Sandbox, Template, TemplateException

from conftest import Berth, unique


def test_tags_assign_list_remove_and_resolve(api: httpx.Client, cleanup) -> None:
    name = cleanup(unique("tagged"))
    v1 = Template.build(Template().from_template("base").run_cmd("echo one > ~/version"), f"{name}:v1")
    assert v1.tags == ["v1"]
    v2 = Template.build(Template().from_template("base").run_cmd("echo two > ~/version"), name, tags=["v2", "latest"])
    assert sorted(v2.tags) == ["latest", "v2"]
    assert v1.template_id == v2.template_id, "one template, two builds"
    assigned = Template.assign_tags(f"{name}:v1", ["prod", "stable"])
    assert assigned.build_id == v1.build_id and sorted(assigned.tags) == ["prod", "stable"]
    tags = {t.tag: t.build_id for t in Template.get_tags(name)}
    assert tags == {"v1": v1.build_id, "prod": v1.build_id, "stable": v1.build_id, "v2": v2.build_id, "latest": v2.build_id}

    def version(reference: str) -> str:
        sandbox = Sandbox.create(reference, timeout=60)
        try:
            return sandbox.commands.run("cat ~/version").stdout.strip()
        finally:
            sandbox.kill()

    assert version(f"{name}:prod") == "one"
    assert version(f"{name}:latest") == "two"
    assert Template.exists(name) and Template.exists(f"{name}:prod")
    assert not Template.exists(unique("never-built"))
    Template.remove_tags(name, ["prod"])
    assert "prod" not in {t.tag for t in Template.get_tags(name)}
    answer = api.post("/v2/sandboxes", json={"templateID": f"{name}:prod"})
    assert answer.status_code == 404 and "prod" in answer.json()["message"]
    assert api.get(f"/templates/aliases/{name}:prod").status_code == 404
    # No build was tagged `default`: the bare name points at nothing yet.
    assert api.post("/v2/sandboxes", json={"templateID": name}).status_code == 404
    with pytest.raises(TemplateException):
        Template.remove_tags(name, ["default"])
    assert api.request("DELETE", "/templates/tags", json={"name": f"{name}:v1", "tags": ["v1"]}).status_code == 400
    assert api.post("/templates/tags", json={"target": f"{name}:nope", "tags": ["x"]}).status_code == 404
    assert api.post("/templates/tags", json={"target": name, "tags": []}).status_code == 400
    # The team's namespace names the same template.
    namespaced = api.get(f"/templates/aliases/default%2F{name}:v1")
    assert namespaced.status_code == 200 and namespaced.json()["templateID"] == v1.template_id


def test_private_templates_are_invisible_and_unusable_to_other_teams(api: httpx.Client, other_team: httpx.Client, cleanup) -> None:
    name = cleanup(unique("private"))
    info = Template.build(Template().from_template("base").run_cmd("echo secret-sauce > ~/recipe"), name)
    listed = [t["templateID"] for t in other_team.get("/v2/templates").json()]
    assert info.template_id not in listed and "base" in listed
    assert info.template_id not in [t["templateID"] for t in other_team.get("/templates").json()]
    for path in [
        f"/templates/{info.template_id}",
        f"/templates/{name}",
        f"/templates/aliases/{name}",
        f"/templates/{info.template_id}/tags",
        f"/templates/{info.template_id}/builds/{info.build_id}/status",
        f"/templates/{info.template_id}/builds/{info.build_id}/logs",
        f"/templates/{info.template_id}/files/{'ab' * 32}",
    ]:
        answer = other_team.get(path)
        assert answer.status_code == 404, (path, answer.status_code, answer.text)
    for reference in [name, info.template_id, f"default/{name}"]:
        answer = other_team.post("/v2/sandboxes", json={"templateID": reference})
        assert answer.status_code == 404, (reference, answer.text)
    # Nor as the base of its own build.
    theirs = other_team.post("/v3/templates", json={"name": unique("theirs")}).json()
    started = other_team.post(
        f"/v2/templates/{theirs['templateID']}/builds/{theirs['buildID']}",
        json={"fromTemplate": name, "steps": []},
    )
    assert started.status_code == 404, started.text
    assert other_team.delete(f"/templates/{theirs['templateID']}").status_code == 204
    for method, path, body in [
        ("DELETE", f"/templates/{info.template_id}", None),
        ("PATCH", f"/templates/{info.template_id}", {"public": True}),
        ("POST", "/templates/tags", {"target": f"default/{name}", "tags": ["mine"]}),
        ("POST", f"/v2/templates/{info.template_id}/builds/{info.build_id}", {"steps": []}),
    ]:
        answer = other_team.request(method, path, json=body)
        assert answer.status_code in (400, 404), (method, path, answer.status_code, answer.text)
        assert answer.status_code != 200
    # The same name is free in the other team's namespace.
    assert other_team.get(f"/templates/aliases/{name}").status_code == 404


def test_a_public_template_is_usable_but_not_changeable_by_other_teams(api: httpx.Client, other_team: httpx.Client, cleanup) -> None:
    name = cleanup(unique("shared"))
    info = Template.build(Template().from_template("base").run_cmd("echo shared-content > ~/shared"), name)
    updated = api.patch(f"/v2/templates/{info.template_id}", json={"public": True})
    assert updated.status_code == 200 and updated.json()["names"] == [f"default/{name}"]
    assert api.get(f"/templates/{info.template_id}").json()["public"] is True
    created = other_team.post("/v2/sandboxes", json={"templateID": f"default/{name}", "timeout": 60})
    assert created.status_code == 201, created.text
    other_team.delete(f"/sandboxes/{created.json()['sandboxID']}")
    # Known to exist, but not theirs (as E2B answers).
    assert other_team.get(f"/templates/aliases/default%2F{name}").status_code == 400, "not their namespace"
    assert other_team.delete(f"/templates/{info.template_id}").status_code == 404
    assert other_team.patch(f"/templates/{info.template_id}", json={"public": False}).status_code == 404
    assert api.patch(f"/templates/{info.template_id}", json={"public": False}).status_code == 200
    assert other_team.post("/v2/sandboxes", json={"templateID": f"default/{name}"}).status_code == 404

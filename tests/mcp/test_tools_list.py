"""tools/list over stdio matches the seed documents, table-driven from the seed files.

Checks for every tool set: the tool names; for each tool its description (connector: the
long description; session: the document's sentence), title, parameter names, JSON types,
required flags, parameter descriptions, enums and defaults; connector annotations from the
labels. In `all`, the two shared names carry the superset of both documents' parameters.
"""

from __future__ import annotations

import anyio
import pytest

import seeds
from conftest import stdio_session

SHARED = {"e2b_create_sandbox", "e2b_list_sandboxes"}


def list_tools(state_dir, toolset):
    async def run():
        async with stdio_session(state_dir, "--toolset", toolset) as session:
            result = await session.list_tools()
            return {tool.name: tool for tool in result.tools}

    return anyio.run(run)


def check_params(tool, seed_tool, *, exact_required=True, other_descriptions=None):
    """`other_descriptions` (superset tools): a parameter both documents define may carry
    either document's description."""
    schema = tool.input_schema
    properties = schema.get("properties", {})
    required = set(schema.get("required", []))
    for param in seed_tool.params:
        assert param.name in properties, f"{tool.name}: missing {param.name}"
        prop = properties[param.name]
        assert prop["type"] == param.type, (tool.name, param.name)
        allowed = {param.description} | (other_descriptions or {}).get(param.name, set())
        assert prop["description"] in allowed, (tool.name, param.name)
        if param.enum:
            assert prop["enum"] == param.enum, (tool.name, param.name)
        if param.default is not None:
            assert prop["default"] == param.default, (tool.name, param.name)
        else:
            assert "default" not in prop, (tool.name, param.name)
        if exact_required:
            assert (param.name in required) == param.required, (tool.name, param.name)
        if param.type == "array":
            assert "items" in prop, (tool.name, param.name)


def check_annotations(tool, seed_tool):
    annotations = tool.annotations
    assert annotations is not None, tool.name
    if seed_tool.label == "Read-only":
        assert annotations.read_only_hint is True
    elif seed_tool.label == "Write":
        assert annotations.read_only_hint is False
        assert annotations.destructive_hint is False
    else:
        assert annotations.destructive_hint is True
    if seed_tool.idempotent:
        assert annotations.idempotent_hint is True
    else:
        assert annotations.idempotent_hint is not True


def verify_session_toolset(tools):
    seed = seeds.session_tools()
    assert sorted(tools) == sorted(t.name for t in seed)
    for seed_tool in seed:
        tool = tools[seed_tool.name]
        assert tool.description == seed_tool.description
        check_params(tool, seed_tool)
        assert set(tool.input_schema["properties"]) == {p.name for p in seed_tool.params}


def verify_connector_tool(tool, seed_tool):
    assert tool.description == seed_tool.description
    assert tool.title == seed_tool.title
    check_params(tool, seed_tool)
    assert set(tool.input_schema["properties"]) == {p.name for p in seed_tool.params}
    check_annotations(tool, seed_tool)


def verify_connector_toolset(tools):
    seed = seeds.connector_tools()
    assert len(seed) == 38
    assert sorted(tools) == sorted(t.name for t in seed)
    for seed_tool in seed:
        verify_connector_tool(tools[seed_tool.name], seed_tool)


def verify_all_toolset(tools):
    session = {t.name: t for t in seeds.session_tools()}
    connector = {t.name: t for t in seeds.connector_tools()}
    assert sorted(tools) == sorted(set(session) | set(connector))
    for name, tool in tools.items():
        if name in SHARED:
            descriptions = {}
            for param in session[name].params + connector[name].params:
                descriptions.setdefault(param.name, set()).add(param.description)
            for seed_tool in (session[name], connector[name]):
                check_params(
                    tool, seed_tool, exact_required=False, other_descriptions=descriptions
                )
            assert set(tool.input_schema["properties"]) == set(descriptions) | (
                {"scope"} if name == "e2b_list_sandboxes" else set()
            )
            assert not tool.input_schema.get("required")
            assert tool.description.startswith(connector[name].description)
            check_annotations(tool, connector[name])
        elif name in connector:
            check_params(tool, connector[name])
            check_annotations(tool, connector[name])
            assert tool.description == connector[name].description
        else:
            check_params(tool, session[name])
            assert tool.description == session[name].description


# What each tool set's tools/list must match; shared with the `berth up` /mcp tests.
VERIFY = {
    "session": verify_session_toolset,
    "connector": verify_connector_toolset,
    "all": verify_all_toolset,
}


def test_session_toolset(state_dir):
    verify_session_toolset(list_tools(state_dir, "session"))


@pytest.mark.parametrize("seed_tool", seeds.connector_tools(), ids=lambda t: t.name)
def test_connector_tool(seed_tool, connector_tools):
    verify_connector_tool(connector_tools[seed_tool.name], seed_tool)


@pytest.fixture(scope="module")
def connector_tools(tmp_path_factory):
    return list_tools(tmp_path_factory.mktemp("connector"), "connector")


def test_connector_toolset_names(connector_tools):
    seed = seeds.connector_tools()
    assert len(seed) == 38
    assert sorted(connector_tools) == sorted(t.name for t in seed)


def test_all_toolset(state_dir):
    verify_all_toolset(list_tools(state_dir, "all"))

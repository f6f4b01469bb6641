"""Parsers for the two tool-design documents in shared/seeds/.

The tests compare the server's `tools/list` against what these parsers read from the
documents themselves, so a drift between the committed tool table and the seeds fails.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import os

# shared/ sits beside the repository; BERTH_SEEDS_DIR points elsewhere (a worktree).
SEEDS_DIR = Path(os.environ.get("BERTH_SEEDS_DIR", Path(__file__).resolve().parents[3] / "shared" / "seeds"))

_TYPES = ("string", "integer", "boolean", "array", "object")
_HEADER = re.compile(r"^(e2b_[a-z_]+?)([A-Z].*?)(Read-only|Write|Destructive)$")
_PARAM = re.compile(r"^([a-z_]+?)(" + "|".join(_TYPES) + r")(required)?$")


@dataclass
class Param:
    name: str
    type: str
    required: bool
    description: str
    enum: list[str] | None = None
    default: Any = None


@dataclass
class Tool:
    name: str
    title: str | None
    description: str
    label: str | None
    idempotent: bool = False
    params: list[Param] = field(default_factory=list)


def _split_enum(joined: str, description: str) -> list[str]:
    """Splits run-together enum values (`forwardbackward`) using words of the description."""
    words = set(re.findall(r"[a-z0-9_]+", description))
    best: dict[int, list[str]] = {0: []}
    for start in range(len(joined)):
        if start not in best:
            continue
        for word in words:
            if joined.startswith(word, start) and start + len(word) not in best:
                best[start + len(word)] = best[start] + [word]
    if len(joined) not in best:
        raise ValueError(f"cannot split enum {joined!r}")
    return best[len(joined)]


def _parse_default(raw: str, type_name: str) -> Any:
    if type_name == "integer":
        return int(raw)
    if type_name == "boolean":
        return raw == "true"
    return raw


def _parse_param_description(line: str, type_name: str) -> tuple[str, list[str] | None, Any]:
    default = None
    enum = None
    match = re.search(r"(?<=\S)default (\S+)$", line)
    if match:
        default = _parse_default(match.group(1), type_name)
        line = line[: match.start()]
    match = re.search(r"(?<=\S)one of (\S+)$", line)
    if match:
        line = line[: match.start()]
        enum = _split_enum(match.group(1), line)
    return line, enum, default


def connector_tools(path: Path | None = None) -> list[Tool]:
    """All tools of scalekit-e2b-connector.txt, in document order."""
    lines = (path or SEEDS_DIR / "scalekit-e2b-connector.txt").read_text().splitlines()
    tools: list[Tool] = []
    index = 0
    while index < len(lines):
        header = _HEADER.match(lines[index])
        if not header:
            index += 1
            continue
        tool = Tool(
            name=header.group(1),
            title=lines[index + 1],
            description=lines[index + 2],
            label=header.group(3),
        )
        index += 3
        if lines[index] == "- Idempotent":
            tool.idempotent = True
            index += 1
        assert lines[index] == "Inputs", (tool.name, lines[index])
        index += 1
        if lines[index] == "This tool takes no inputs.":
            index += 1
        else:
            while index < len(lines):
                param = _PARAM.match(lines[index])
                if not param or _HEADER.match(lines[index]):
                    break
                description, enum, default = _parse_param_description(
                    lines[index + 1], param.group(2)
                )
                tool.params.append(
                    Param(
                        name=param.group(1),
                        type=param.group(2),
                        required=bool(param.group(3)),
                        description=description,
                        enum=enum,
                        default=default,
                    )
                )
                index += 2
        tools.append(tool)
    return tools


_DEFAULT_IN_DESCRIPTION = re.compile(r"\(default `([^`]+)`\)")


def session_tools(path: Path | None = None) -> list[Tool]:
    """The six tools of everruns-e2b-capability.md, in document order."""
    text = (path or SEEDS_DIR / "everruns-e2b-capability.md").read_text()
    tools: list[Tool] = []
    sections = re.split(r"^### `(e2b_[a-z_]+)`\n", text, flags=re.M)
    for name, body in zip(sections[1::2], sections[2::2]):
        body = body.split("\n## ")[0]
        paragraphs = [p.strip() for p in body.strip().split("\n\n")]
        description = paragraphs[0]
        tool = Tool(name=name, title=None, description=description, label=None)
        for row in body.splitlines():
            cells = [c.strip() for c in row.strip().strip("|").split("|")]
            if len(cells) != 4 or not cells[0].startswith("`"):
                continue
            param_type = cells[1]
            param_description = cells[3]
            default = None
            match = _DEFAULT_IN_DESCRIPTION.search(param_description)
            if match:
                default = _parse_default(match.group(1), param_type)
            tool.params.append(
                Param(
                    name=cells[0].strip("`"),
                    type=param_type,
                    required=cells[2] == "yes",
                    description=param_description,
                    default=default,
                )
            )
        tools.append(tool)
    return tools

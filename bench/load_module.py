"""Loads another benchmark's or test harness's Python file as a module by its path (they
live in folders that are not packages), for the benchmarks that build on them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def load(name: str, path: Path):
    """The module in file `path`, registered as `name`."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module

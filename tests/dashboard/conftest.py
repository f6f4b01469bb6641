"""Fixtures for the dashboard's browser suite.

`berth up` is started exactly as the control-plane suite does (its own sandbox pool, an
egress ceiling admitting only the fake internet): that suite's conftest is loaded here
and its `internet`, `berth` and `other_team_key` fixtures reused. The browser is
Debian's chromium (`BERTH_CHROMIUM`, default /usr/bin/chromium) driven by Playwright;
screenshots go to `BERTH_SCREENSHOT_DIR` (default `<target>/dashboard-screenshots`),
which CI keeps as an artifact.

Run as root from this directory:

    cd tests/dashboard && ../../.venv/bin/pytest
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Iterator

import pytest

_CONTROL_PLANE = Path(__file__).resolve().parents[1] / "sdk" / "control_plane"
sys.path.insert(0, str(_CONTROL_PLANE))
_spec = importlib.util.spec_from_file_location("control_plane_conftest", _CONTROL_PLANE / "conftest.py")
control_plane = importlib.util.module_from_spec(_spec)
assert _spec.loader is not None
sys.modules["control_plane_conftest"] = control_plane
_spec.loader.exec_module(control_plane)

# Re-exported fixtures (pytest finds fixtures by name in this module).
internet = control_plane.internet
berth = control_plane.berth
other_team_key = control_plane.other_team_key
Berth = control_plane.Berth
poll = control_plane.poll

from playwright.sync_api import Browser, BrowserContext, Page, sync_playwright  # noqa: E402

CHROMIUM = os.environ.get("BERTH_CHROMIUM", "/usr/bin/chromium")


def screenshot_dir() -> Path:
    configured = os.environ.get("BERTH_SCREENSHOT_DIR")
    directory = Path(configured) if configured else control_plane.target_dir() / "dashboard-screenshots"
    directory.mkdir(parents=True, exist_ok=True)
    return directory


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.exit(f"no chromium at {CHROMIUM}: apt-get install chromium (or set BERTH_CHROMIUM)", returncode=2)
    with sync_playwright() as playwright:
        # As root chromium refuses its own sandbox; the pages are our own.
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def context(browser: Browser, berth: Berth) -> Iterator[BrowserContext]:
    created = browser.new_context(base_url=berth.api_url, accept_downloads=True, viewport={"width": 1280, "height": 900})
    try:
        yield created
    finally:
        created.close()


class Shots:
    """Saves numbered full-page screenshots named after the test."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.count = 0
        self.directory = screenshot_dir()

    def __call__(self, page: Page, label: str) -> None:
        self.count += 1
        page.screenshot(path=str(self.directory / f"{self.name}-{self.count:02d}-{label}.png"), full_page=True)


@pytest.fixture
def shots(request: pytest.FixtureRequest) -> Shots:
    return Shots(request.node.name)


def sign_in(page: Page, key: str) -> None:
    page.goto("/dashboard/login")
    page.get_by_label("API key").fill(key)
    page.get_by_role("button", name="Sign in").click()


@pytest.fixture
def page(context: BrowserContext, berth: Berth) -> Iterator[Page]:
    """A page signed in with the default team's key; fails on any page script error."""
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    sign_in(opened, berth.api_key)
    opened.wait_for_url("**/dashboard/")
    yield opened
    assert not errors, f"script errors on the page: {errors}"

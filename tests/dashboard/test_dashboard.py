"""The dashboard in a real browser (Debian's chromium through Playwright) against a real
`berth up`: sign-in and its refusals, a sandbox made by the Python SDK seen and driven
from the browser (charts, logs, terminal, files, pause/resume, kill), team isolation,
every page rendered and screenshot, and accessibility basics."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox
from playwright.sync_api import BrowserContext, Page, expect

from conftest import Berth, Shots, poll, sign_in

PAGES = ["/dashboard/", "/dashboard/templates", "/dashboard/snapshots", "/dashboard/volumes",
         "/dashboard/secrets", "/dashboard/keys", "/dashboard/webhooks", "/dashboard/usage"]


def test_wrong_key_is_refused(context: BrowserContext, berth: Berth, shots: Shots) -> None:
    page = context.new_page()
    # berth's root sends a browser to the dashboard, which asks it to sign in.
    page.goto("/")
    page.wait_for_url("**/dashboard/login")
    sign_in(page, "e2b_" + "0" * 40)
    expect(page.get_by_role("alert")).to_contain_text("refused")
    shots(page, "refused")
    assert not [cookie for cookie in context.cookies() if cookie["name"] == "berth_session"]
    # Still signed out: the list redirects to the login form, the relay answers 401.
    page.goto("/dashboard/")
    assert page.url.endswith("/dashboard/login")
    assert page.request.get("/dashboard/api/v2/sandboxes").status == 401


def test_session_keeps_the_key_on_the_server(page: Page, context: BrowserContext, berth: Berth) -> None:
    session = [cookie for cookie in context.cookies() if cookie["name"] == "berth_session"]
    assert len(session) == 1
    assert session[0]["httpOnly"] and session[0]["sameSite"] == "Strict"
    assert berth.api_key not in session[0]["value"]
    # The key is nowhere the page's script or the address bar could see it.
    seen = page.evaluate(
        "() => [document.cookie, document.documentElement.outerHTML, location.href,"
        " JSON.stringify(Object.assign({}, localStorage)), JSON.stringify(Object.assign({}, sessionStorage))]"
    )
    assert all(berth.api_key not in text for text in seen)
    # A state-changing call without the session's CSRF token is refused.
    refused = page.evaluate(
        "async () => (await fetch('/dashboard/api/sandboxes', {method: 'POST',"
        " headers: {'Content-Type': 'application/json'}, body: JSON.stringify({templateID: 'base'})})).status"
    )
    assert refused == 403
    wrong = page.evaluate(
        "async () => (await fetch('/dashboard/api/sandboxes', {method: 'POST', headers:"
        " {'Content-Type': 'application/json', 'X-CSRF-Token': 'f'.repeat(64)}, body: '{}'})).status"
    )
    assert wrong == 403
    # A logout form posted without its token does not end the session.
    assert page.request.post("/dashboard/logout", form={"csrf": "nope"}).status == 403
    page.goto("/dashboard/")
    assert page.url.endswith("/dashboard/")
    # Signing out ends it on the server.
    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url("**/dashboard/login")
    assert page.request.get("/dashboard/api/v2/sandboxes").status == 401


def test_sandbox_from_the_sdk_driven_in_the_browser(page: Page, berth: Berth, shots: Shots, tmp_path: Path) -> None:
    marker = uuid.uuid4().hex[:8]
    sandbox = Sandbox.create(timeout=600, metadata={"suite": "dashboard", "run": marker})
    made: list[tuple[str, str]] = []
    try:
        # It appears in the live list (no reload), and the metadata filter keeps it.
        row = page.locator(f'#sandboxes tr[data-sandbox-id="{sandbox.sandbox_id}"]')
        expect(row).to_be_visible(timeout=15_000)
        page.get_by_label("Metadata (key=value, comma-separated)").fill(f"run={marker}")
        page.get_by_role("button", name="Filter").click()
        expect(page.locator("#sandboxes tbody tr")).to_have_count(1)
        expect(row).to_be_visible()
        page.get_by_label("Metadata (key=value, comma-separated)").fill("run=no-such-run")
        page.get_by_role("button", name="Filter").click()
        expect(row).to_have_count(0)
        page.get_by_label("Metadata (key=value, comma-separated)").fill("")
        page.get_by_role("button", name="Filter").click()
        shots(page, "list")

        page.get_by_role("link", name=sandbox.sandbox_id).click()
        page.wait_for_url(f"**/dashboard/sandboxes/{sandbox.sandbox_id}")
        expect(page.locator("#info")).to_contain_text(sandbox.sandbox_id)
        expect(page.locator("main")).to_have_attribute("data-state", "running")

        # The CPU chart moves while a command burns CPU: its peak rises well above the
        # idle samples before the burn (the machine is shared, so no absolute figure).
        chart = page.locator("#chart-cpu")
        poll(lambda: int(chart.get_attribute("data-samples") or 0) >= 2, timeout=30, interval=0.5,
             what="idle CPU samples")
        idle = float(chart.get_attribute("data-max") or 0)
        # One busy loop per CPU of the sandbox (2).
        sandbox.commands.run("for i in 1 2; do timeout 60 sh -c 'while :; do :; done' & done; wait", background=True)

        def burning() -> bool:
            # Idle is well under 1 %; on a loaded shared host the burn still gets several.
            peak = float(chart.get_attribute("data-max") or 0)
            return peak >= 3 and peak > 5 * idle

        try:
            poll(burning, timeout=60, interval=1, what="the CPU chart to show the burn")
        finally:
            print(f"cpu chart: idle peak {idle}, now {chart.get_attribute('data-max')}, "
                  f"samples {chart.get_attribute('data-samples')}, status {page.locator('#status').inner_text()!r}")
        expect(page.locator("#chart-mem")).not_to_have_attribute("data-samples", "0")
        shots(page, "cpu")

        # Logs: berth's lifecycle lines for this sandbox; the level filter narrows them.
        expect(page.locator("#logs li").first).to_be_visible(timeout=15_000)
        page.get_by_label("Minimum level").select_option("error")
        poll(lambda: page.locator("#logs li:not([data-level=error])").count() == 0, timeout=15,
             what="the level filter to apply")
        page.get_by_label("Minimum level").select_option("")
        expect(page.locator("#logs li").first).to_be_visible(timeout=15_000)

        # The terminal: a shell on a PTY through envd.
        page.get_by_role("button", name="Connect terminal").click()
        expect(page.locator("#terminal")).to_have_attribute("data-connected", "true", timeout=15_000)
        page.locator("#terminal").click()
        page.keyboard.type("echo hi\n")
        rows = page.locator("#terminal .xterm-rows")
        poll(lambda: re.search(r"^hi\s*$", rows.inner_text(), re.MULTILINE) is not None, timeout=20,
             what="`hi` on its own line in the terminal")
        shots(page, "terminal")

        # Upload from the browser, read back with the SDK.
        upload = tmp_path / f"dash-up-{marker}.txt"
        upload.write_text(f"uploaded {marker}\n")
        page.get_by_label("Directory", exact=True).fill("/home/user")
        page.get_by_label("Upload into this directory").set_input_files(str(upload))
        page.get_by_role("button", name="Upload", exact=True).click()
        expect(page.locator(f'#files tr[data-file="{upload.name}"]')).to_be_visible(timeout=15_000)
        assert sandbox.files.read(f"/home/user/{upload.name}") == f"uploaded {marker}\n"

        # Download in the browser what the SDK wrote.
        sandbox.files.write(f"/home/user/dash-down-{marker}.txt", f"downloaded {marker}\n")
        page.get_by_role("button", name="Open", exact=True).click()
        with page.expect_download() as download:
            page.get_by_role("link", name=f"Download dash-down-{marker}.txt").click()
        assert Path(download.value.path()).read_text() == f"downloaded {marker}\n"
        shots(page, "files")

        # Pause and resume from the buttons; the SDK sees both.
        page.get_by_role("button", name="Pause").click()
        expect(page.locator("main")).to_have_attribute("data-state", "paused", timeout=60_000)
        assert Sandbox.get_info(sandbox.sandbox_id).state.value == "paused"
        shots(page, "paused")
        page.get_by_role("button", name="Resume").click()
        expect(page.locator("main")).to_have_attribute("data-state", "running", timeout=60_000)
        assert sandbox.commands.run("echo back").stdout == "back\n"
        expect(page.locator('#events tr[data-event="sandbox.lifecycle.paused"]').first).to_be_attached(timeout=15_000)

        # Snapshot and fork from the buttons; the API sees what they made.
        headers = {"X-API-Key": berth.api_key}
        page.get_by_role("button", name="Snapshot").click()
        expect(page.locator("#status")).to_contain_text("taken", timeout=60_000)
        snapshot_id = page.locator("#status").inner_text().split()[1]
        made.append(("snapshot", snapshot_id))
        listed = httpx.get(f"{berth.api_url}/snapshots", headers=headers, timeout=30).json()
        assert snapshot_id in [snapshot["snapshotID"] for snapshot in listed]
        page.get_by_role("button", name="Fork").click()
        forked = page.locator("#status a[data-forked]")
        expect(forked).to_be_visible(timeout=60_000)
        fork_id = forked.get_attribute("data-forked")
        made.append(("sandbox", fork_id))
        assert httpx.get(f"{berth.api_url}/sandboxes/{fork_id}", headers=headers, timeout=30).status_code == 200
        shots(page, "forked")
        page.goto("/dashboard/snapshots")
        expect(page.locator("#snapshots")).to_contain_text(snapshot_id)
        page.goto(f"/dashboard/sandboxes/{sandbox.sandbox_id}")
        expect(page.locator("main")).to_have_attribute("data-state", "running", timeout=15_000)

        # Kill, after confirming.
        page.once("dialog", lambda dialog: dialog.accept())
        page.get_by_role("button", name="Kill").click()
        expect(page.locator("main")).to_have_attribute("data-state", "gone", timeout=60_000)
        shots(page, "killed")
        gone = httpx.get(f"{berth.api_url}/sandboxes/{sandbox.sandbox_id}", headers={"X-API-Key": berth.api_key})
        assert gone.status_code == 404
    finally:
        try:
            sandbox.kill()
        except Exception:  # already killed by the test
            pass
        for kind, made_id in made:
            path = f"/sandboxes/{made_id}" if kind == "sandbox" else f"/templates/{made_id}"
            httpx.delete(f"{berth.api_url}{path}", headers={"X-API-Key": berth.api_key}, timeout=60)


def test_another_teams_sandbox_is_404(page: Page, berth: Berth, other_team_key: str, shots: Shots) -> None:
    created = httpx.post(f"{berth.api_url}/sandboxes", headers={"X-API-Key": other_team_key},
                         json={"templateID": "base", "timeout": 300}, timeout=120)
    assert created.status_code == 201, created.text
    foreign = created.json()["sandboxID"]
    try:
        response = page.goto(f"/dashboard/sandboxes/{foreign}")
        assert response is not None and response.status == 404
        expect(page.get_by_role("heading", name="Not found")).to_be_visible()
        shots(page, "foreign-404")
        assert page.request.get(f"/dashboard/api/sandboxes/{foreign}").status == 404
        assert page.request.get(f"/dashboard/sandboxes/{foreign}/files?path=/etc/hostname").status == 404
        # Nor can the relay be talked into the proxy.
        assert page.request.get(f"/dashboard/api/proxy/{foreign}/49983/health").status == 400
    finally:
        httpx.delete(f"{berth.api_url}/sandboxes/{foreign}", headers={"X-API-Key": other_team_key}, timeout=60)


def test_every_page_renders_labelled_and_keyboard_reachable(page: Page, shots: Shots) -> None:
    for path in PAGES:
        response = page.goto(path)
        assert response is not None and response.status == 200, path
        assert "script-src 'self'" in response.headers["content-security-policy"]
        page.wait_for_load_state("networkidle")
        expect(page.locator("#status")).not_to_have_class(re.compile("error"))
        shots(page, path.strip("/").replace("/", "-") or "dashboard")
        # Every form control has a label.
        unlabelled = page.evaluate(
            "() => [...document.querySelectorAll('input:not([type=hidden]), select, textarea')]"
            ".filter(e => !(e.labels && e.labels.length) && !e.getAttribute('aria-label')).map(e => e.id || e.name)"
        )
        assert unlabelled == [], f"{path}: controls without labels: {unlabelled}"
        assert page.locator('nav[aria-label="Main"] a[aria-current="page"]').count() == 1, path
    # The keyboard reaches the skip link first, then the navigation, and the skip link works.
    page.goto("/dashboard/")
    page.keyboard.press("Tab")
    assert page.evaluate("() => document.activeElement.textContent") == "Skip to content"
    page.keyboard.press("Enter")
    assert page.evaluate("() => document.activeElement.id") == "main"
    page.goto("/dashboard/")
    page.keyboard.press("Tab")
    page.keyboard.press("Tab")
    page.keyboard.press("Tab")
    assert page.evaluate("() => document.activeElement.textContent") == "Templates"
    page.keyboard.press("Enter")
    page.wait_for_url("**/dashboard/templates")


def test_assets_are_embedded_not_fetched(page: Page, berth: Berth) -> None:
    """Every script and stylesheet the sandbox page loads comes from berth itself."""
    sandbox = Sandbox.create(timeout=300)
    try:
        requested: list[str] = []
        page.on("request", lambda request: requested.append(request.url))
        page.goto(f"/dashboard/sandboxes/{sandbox.sandbox_id}")
        page.wait_for_load_state("networkidle")
        assert page.evaluate("() => typeof Terminal === 'function' && typeof uPlot === 'function'")
        assert requested and all(url.startswith(berth.api_url) for url in requested), requested
    finally:
        sandbox.kill()


def test_template_build_and_its_logs(page: Page, berth: Berth, shots: Shots) -> None:
    """A template built through the SDK's Template builder is listed with its build, whose
    logs the page shows."""
    from e2b import Template

    name = f"dash-{uuid.uuid4().hex[:8]}"
    template = Template().from_template("base").run_cmd("echo dashboard-build-marker > ~/marker")
    info = Template.build(template, name, cpu_count=1, memory_mb=512)
    try:
        page.goto("/dashboard/templates")
        row = page.locator(f'#templates tr[data-template="{info.template_id}"]')
        expect(row).to_contain_text(name, timeout=20_000)
        row.locator(f'button[data-build="{info.build_id}"]').click()
        expect(page.locator("#build-logs")).to_contain_text("dashboard-build-marker", timeout=15_000)
        shots(page, "build-logs")
    finally:
        httpx.delete(f"{berth.api_url}/templates/{info.template_id}", headers={"X-API-Key": berth.api_key}, timeout=60)


def test_usage_charts_count_running_sandboxes(page: Page, shots: Shots) -> None:
    sandbox = Sandbox.create(timeout=300)
    try:
        page.goto("/dashboard/usage")
        chart = page.locator("#chart-concurrency")
        poll(lambda: float(chart.get_attribute("data-max") or 0) >= 1, timeout=30, interval=0.5,
             what="the concurrency chart to count the running sandbox")
        page.get_by_label("Window").select_option("86400")
        expect(chart).not_to_have_attribute("data-samples", "0")
        shots(page, "usage")
    finally:
        sandbox.kill()


def test_get_host_urls_open_in_a_browser(context: BrowserContext, berth: Berth, shots: Shots) -> None:
    """`sandbox.get_host(port)` with berth's default domain (`localhost:<port>`) opens in
    a browser as it is: chromium resolves `*.localhost` to loopback itself, and berth's
    proxy routes `<port>-<id>.localhost` to the sandbox's port."""
    sandbox = Sandbox.create(timeout=300)
    try:
        sandbox.files.write("/home/user/site/index.html", "<title>get_host</title><h1 id=reached>reached in a browser</h1>")
        sandbox.commands.run("cd /home/user/site && python3 -m http.server 8000", background=True)
        url = f"http://{sandbox.get_host(8000)}/index.html"
        assert url.startswith(f"http://8000-{sandbox.sandbox_id}.localhost:"), url

        def serving() -> bool:
            try:
                return httpx.get(f"{berth.api_url}/index.html", headers={"Host": sandbox.get_host(8000)}, timeout=5).status_code == 200
            except httpx.TransportError:
                return False

        poll(serving, timeout=30, what="the sandbox's web server")
        page = context.new_page()
        response = page.goto(url)
        assert response is not None and response.status == 200
        expect(page.locator("#reached")).to_have_text("reached in a browser")
        shots(page, "get-host")
        page.close()
    finally:
        sandbox.kill()


class FlakyReceiver:
    """A webhook receiver on 127.0.0.1 that answers its first delivery 503, then 204."""

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        import threading

        received: list[bytes] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                received.append(self.rfile.read(int(self.headers.get("content-length", "0"))))
                self.send_response(503 if len(received) == 1 else 204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.received = received
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_webhook_deliveries_page(page: Page, berth: Berth, other_team_key: str, shots: Shots) -> None:
    receiver = FlakyReceiver()
    headers = {"X-API-Key": berth.api_key}
    created = httpx.post(f"{berth.api_url}/events/webhooks", headers=headers, timeout=30, json={
        "name": "ci-receiver", "url": receiver.url, "enabled": True,
        "events": ["sandbox.lifecycle.created"], "signatureSecret": "dashboard-secret",
    })
    assert created.status_code == 201, created.text
    webhook_id = created.json()["id"]
    sandbox = Sandbox.create(timeout=300)
    try:
        def delivered() -> bool:
            listed = httpx.get(f"{berth.api_url}/events/webhooks/{webhook_id}/deliveries", headers=headers, timeout=30)
            return listed.status_code == 200 and any(d["status"] == "delivered" for d in listed.json())

        poll(delivered, timeout=60, what="the webhook delivery to succeed on its retry")
        page.goto("/dashboard/webhooks")
        page.get_by_role("link", name="ci-receiver").click()
        page.wait_for_url(f"**/dashboard/webhooks/{webhook_id}")
        expect(page.get_by_role("heading", name="Webhook ci-receiver")).to_be_visible()
        row = page.locator("#deliveries tbody tr[data-status=delivered]").first
        expect(row).to_contain_text("sandbox.lifecycle.created")
        cells = row.locator("td")
        expect(cells.nth(1)).to_have_text("delivered")
        expect(cells.nth(2)).to_have_text("2")
        expect(cells.nth(3)).to_have_text("204")
        expect(page.locator("#webhook-target")).to_contain_text(receiver.url)
        expect(page.locator("#status")).not_to_have_class(re.compile("error"))
        assert page.locator('nav[aria-label="Main"] a[aria-current="page"]').inner_text() == "Webhooks"
        shots(page, "webhook-deliveries")
        # The delivery history is the team's: another team's key sees neither the
        # webhook nor its deliveries, and its id in the dashboard URL is a 404 page.
        foreign = httpx.get(f"{berth.api_url}/events/webhooks/{webhook_id}/deliveries",
                            headers={"X-API-Key": other_team_key}, timeout=30)
        assert foreign.status_code == 404
        assert page.goto("/dashboard/webhooks/not-a-webhook-of-yours").status == 404
    finally:
        sandbox.kill()
        httpx.delete(f"{berth.api_url}/events/webhooks/{webhook_id}", headers=headers, timeout=30)
        receiver.close()

"""The reaper, lifecycle events and signed webhook deliveries."""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import threading
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import httpx
import pytest
from e2b import Sandbox
from e2b.exceptions import NotFoundException

from conftest import Berth, poll

CREATED = "sandbox.lifecycle.created"
UPDATED = "sandbox.lifecycle.updated"
KILLED = "sandbox.lifecycle.killed"


def gone(sandbox_id: str) -> bool:
    try:
        Sandbox.get_info(sandbox_id)
        return False
    except NotFoundException:
        return True


def sandbox_events(api: httpx.Client, sandbox_id: str) -> list[dict]:
    answer = api.get(f"/events/sandboxes/{sandbox_id}", params={"orderAsc": "true", "limit": 100})
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_reaper_kills_at_the_end_time(berth: Berth, api: httpx.Client) -> None:
    sandbox = Sandbox.create(timeout=3)
    try:
        end_at = sandbox.get_info().end_at
        poll(lambda: gone(sandbox.sandbox_id), timeout=120, interval=0.5, what="the reaper to kill the sandbox")
        assert not sandbox.is_running()
        events = sandbox_events(api, sandbox.sandbox_id)
        assert [event["type"] for event in events][-1] == KILLED
        killed_at = events[-1]["timestamp"]
        # Killed at (not before) its end time; both are server timestamps.
        assert datetime.fromisoformat(killed_at.replace("Z", "+00:00")) >= end_at
    finally:
        Sandbox.kill(sandbox.sandbox_id)


def test_events_are_recorded_in_order(berth: Berth, api: httpx.Client) -> None:
    sandbox = Sandbox.create(timeout=300, metadata={"events": "probe"})
    sandbox.set_timeout(600)
    sandbox.kill()

    events = sandbox_events(api, sandbox.sandbox_id)
    assert [event["type"] for event in events] == [CREATED, UPDATED, KILLED]
    for event in events:
        assert event["version"] == "v1"
        assert event["sandboxId"] == sandbox.sandbox_id
        assert {"id", "timestamp", "sandboxTeamId", "sandboxTemplateId", "eventData"} <= event.keys()
    assert "set_timeout" in (events[1]["eventData"] or {})
    # RFC 3339 drops trailing zeros in the fraction (as E2B's Go API does), so
    # compare instants, not strings.
    timestamps = [datetime.fromisoformat(event["timestamp"]) for event in events]
    assert timestamps == sorted(timestamps)
    assert len({event["id"] for event in events}) == 3

    newest_first = api.get(f"/events/sandboxes/{sandbox.sandbox_id}", params={"limit": 100}).json()
    assert [event["id"] for event in newest_first] == [event["id"] for event in reversed(events)]

    page = api.get(
        f"/events/sandboxes/{sandbox.sandbox_id}", params={"orderAsc": "true", "offset": 1, "limit": 1}
    ).json()
    assert [event["id"] for event in page] == [events[1]["id"]]

    only_killed = api.get(
        "/events/sandboxes", params={"types": KILLED, "limit": 100, "orderAsc": "false"}
    ).json()
    assert all(event["type"] == KILLED for event in only_killed)
    assert sandbox.sandbox_id in {event["sandboxId"] for event in only_killed}


class Receiver:
    """A webhook receiver on 127.0.0.1 that records every delivery's headers and raw body."""

    def __init__(self) -> None:
        self.deliveries: list[tuple[dict[str, str], bytes]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver.lock:
                    receiver.deliveries.append(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def for_sandbox(self, sandbox_id: str) -> list[tuple[dict[str, str], bytes]]:
        with self.lock:
            return [(headers, body) for headers, body in self.deliveries if sandbox_id.encode() in body]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    instance = Receiver()
    try:
        yield instance
    finally:
        instance.close()


def expected_signature(secret: str, body: bytes) -> str:
    digest = hashlib.sha256(secret.encode() + body).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def test_webhook_deliveries_are_signed(berth: Berth, api: httpx.Client, receiver: Receiver) -> None:
    secret = f"whsec-{secrets.token_hex(16)}"
    created = api.post(
        "/events/webhooks",
        json={
            "name": "suite-receiver",
            "url": receiver.url,
            "enabled": True,
            "events": [CREATED, KILLED],
            "signatureSecret": secret,
        },
    )
    assert created.status_code == 201, created.text
    webhook_id = created.json()["id"]
    try:
        listed = api.get("/events/webhooks")
        assert webhook_id in {hook["id"] for hook in listed.json()}

        sandbox = Sandbox.create(timeout=300)
        sandbox.set_timeout(400)  # an `updated` event, which this webhook did not ask for
        sandbox.kill()

        poll(
            lambda: len(receiver.for_sandbox(sandbox.sandbox_id)) >= 2,
            timeout=120,
            interval=0.2,
            what="two webhook deliveries",
        )
        deliveries = receiver.for_sandbox(sandbox.sandbox_id)
        # Delivery is at least once: a retried event arrives again under the same id.
        types_by_id = {}
        for headers, body in deliveries:
            assert headers.get("e2b-signature") == expected_signature(secret, body), "signature does not verify"
            event = json.loads(body)
            assert event["sandboxId"] == sandbox.sandbox_id
            types_by_id[event["id"]] = event["type"]
        assert sorted(types_by_id.values()) == sorted([CREATED, KILLED])

        disabled = api.patch(f"/events/webhooks/{webhook_id}", json={"enabled": False})
        assert disabled.status_code in {200, 204}, disabled.text
        assert api.get(f"/events/webhooks/{webhook_id}").json()["enabled"] is False
    finally:
        assert api.delete(f"/events/webhooks/{webhook_id}").status_code in {200, 204}
    assert api.get(f"/events/webhooks/{webhook_id}").status_code == 404

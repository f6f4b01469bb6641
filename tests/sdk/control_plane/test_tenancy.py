"""Two teams: nothing of one team is visible to or changeable by the other; bad keys get 401."""

from __future__ import annotations

import time
from typing import Iterator

import httpx
import pytest
from e2b import Sandbox
from e2b.exceptions import AuthenticationException

from conftest import Berth

REFUSED = {403, 404}


@pytest.fixture
def owned_sandbox(berth: Berth) -> Iterator[Sandbox]:
    sandbox = Sandbox.create(timeout=600, metadata={"owner": "default-team"})
    try:
        yield sandbox
    finally:
        sandbox.kill()


def client_for(berth: Berth, key: str) -> httpx.Client:
    return httpx.Client(base_url=berth.api_url, headers={"X-API-Key": key}, timeout=60)


def team_id_of(client: httpx.Client) -> str:
    teams = client.get("/teams")
    assert teams.status_code == 200, teams.text
    assert len(teams.json()) >= 1
    return teams.json()[0]["teamID"]


def test_teams_are_distinct(berth: Berth, api: httpx.Client, other_team_key: str) -> None:
    with client_for(berth, other_team_key) as other:
        assert team_id_of(api) != team_id_of(other)


def test_sandbox_endpoints_refuse_the_other_team(
    berth: Berth, api: httpx.Client, other_team_key: str, owned_sandbox: Sandbox
) -> None:
    sandbox_id = owned_sandbox.sandbox_id
    now = int(time.time())
    attempts = [
        ("GET", f"/sandboxes/{sandbox_id}", None),
        ("POST", f"/sandboxes/{sandbox_id}/timeout", {"timeout": 5}),
        ("POST", f"/sandboxes/{sandbox_id}/refreshes", {"duration": 5}),
        ("POST", f"/sandboxes/{sandbox_id}/connect", {"timeout": 5}),
        ("POST", f"/v2/sandboxes/{sandbox_id}/connect", {"timeout": 5}),
        ("GET", f"/sandboxes/{sandbox_id}/logs", None),
        ("GET", f"/v2/sandboxes/{sandbox_id}/logs", None),
        ("GET", f"/sandboxes/{sandbox_id}/metrics?start={now - 600}&end={now}", None),
        ("GET", f"/events/sandboxes/{sandbox_id}", None),
        ("DELETE", f"/sandboxes/{sandbox_id}", None),
    ]
    # Endpoints a later issue fills may answer 501 to everyone, which also changes nothing.
    not_yet = [
        ("POST", f"/sandboxes/{sandbox_id}/pause", {}),
        ("POST", f"/sandboxes/{sandbox_id}/resume", {"timeout": 5}),
        ("POST", f"/sandboxes/{sandbox_id}/snapshots", {}),
        ("PUT", f"/sandboxes/{sandbox_id}/network", {}),
    ]
    with client_for(berth, other_team_key) as other:
        for method, path, body in attempts:
            answer = other.request(method, path, json=body)
            assert answer.status_code in REFUSED, (method, path, answer.status_code, answer.text)
        for method, path, body in not_yet:
            answer = other.request(method, path, json=body)
            assert answer.status_code in REFUSED | {501}, (method, path, answer.status_code, answer.text)

        many = other.get("/sandboxes/metrics", params={"sandbox_ids": sandbox_id})
        assert many.status_code in REFUSED | {200, 400}, many.text
        if many.status_code == 200:
            assert sandbox_id not in many.text

        for path in ["/sandboxes", "/v2/sandboxes"]:
            listed = other.get(path, params={"limit": 100} if path.startswith("/v2") else None)
            assert listed.status_code == 200
            assert sandbox_id not in {item["sandboxID"] for item in listed.json()}

        events = other.get("/events/sandboxes", params={"limit": 100})
        assert events.status_code == 200
        assert sandbox_id not in {event["sandboxId"] for event in events.json()}

    # Nothing the other team did touched the sandbox.
    info = api.get(f"/sandboxes/{sandbox_id}")
    assert info.status_code == 200
    assert owned_sandbox.commands.run("echo alive").stdout == "alive\n"
    lifetime = time.time() + 60
    end_at = owned_sandbox.get_info().end_at.timestamp()
    assert end_at > lifetime, "the other team's timeout call shortened the sandbox"


def test_team_metrics_refuse_the_other_team(berth: Berth, api: httpx.Client, other_team_key: str) -> None:
    team_id = team_id_of(api)
    now = int(time.time())
    own = api.get(f"/teams/{team_id}/metrics", params={"start": now - 600, "end": now})
    assert own.status_code == 200, own.text
    with client_for(berth, other_team_key) as other:
        for path, params in [
            (f"/teams/{team_id}/metrics", {"start": now - 600, "end": now}),
            (f"/teams/{team_id}/metrics/max", {"start": now - 600, "end": now, "metric": "concurrent_sandboxes"}),
        ]:
            answer = other.get(path, params=params)
            assert answer.status_code in REFUSED, (path, answer.status_code, answer.text)


def test_api_keys_are_per_team(berth: Berth, api: httpx.Client, other_team_key: str) -> None:
    created = api.post("/api-keys", json={"name": "tenancy-probe"})
    assert created.status_code == 201, created.text
    key = created.json()
    assert key["key"].startswith("e2b_")
    try:
        with client_for(berth, other_team_key) as other:
            listed = other.get("/api-keys")
            assert listed.status_code == 200
            assert key["id"] not in {item["id"] for item in listed.json()}
            for method, body in [("PATCH", {"name": "stolen"}), ("DELETE", None)]:
                answer = other.request(method, f"/api-keys/{key['id']}", json=body)
                assert answer.status_code in REFUSED, (method, answer.status_code, answer.text)
        # Still usable, still named as before.
        with client_for(berth, key["key"]) as probe:
            assert probe.get("/v2/sandboxes").status_code == 200
        names = {item["id"]: item["name"] for item in api.get("/api-keys").json()}
        assert names[key["id"]] == "tenancy-probe"
        # The key value itself is never listed.
        assert key["key"] not in api.get("/api-keys").text
    finally:
        deleted = api.delete(f"/api-keys/{key['id']}")
        assert deleted.status_code in {200, 204}, deleted.text
    with client_for(berth, key["key"]) as revoked:
        assert revoked.get("/v2/sandboxes").status_code == 401


def test_webhooks_are_per_team(berth: Berth, api: httpx.Client, other_team_key: str) -> None:
    created = api.post(
        "/events/webhooks",
        json={
            "name": "tenancy-probe",
            "url": "http://127.0.0.1:9/unused",
            "enabled": False,
            "events": ["sandbox.lifecycle.created"],
            "signatureSecret": "tenancy-probe-secret-0123456789",
        },
    )
    assert created.status_code == 201, created.text
    webhook_id = created.json()["id"]
    try:
        with client_for(berth, other_team_key) as other:
            listed = other.get("/events/webhooks")
            assert listed.status_code == 200
            assert webhook_id not in listed.text
            for method, body in [("GET", None), ("PATCH", {"enabled": True}), ("DELETE", None)]:
                answer = other.request(method, f"/events/webhooks/{webhook_id}", json=body)
                assert answer.status_code in REFUSED, (method, answer.status_code, answer.text)
        mine = api.get(f"/events/webhooks/{webhook_id}")
        assert mine.status_code == 200
        assert mine.json()["enabled"] is False
        assert "tenancy-probe-secret" not in mine.text, "the signature secret is returned"
    finally:
        api.delete(f"/events/webhooks/{webhook_id}")


def test_bad_keys_get_401(berth: Berth) -> None:
    paths = ["/sandboxes", "/v2/sandboxes", "/teams", "/api-keys", "/events/sandboxes", "/v2/templates"]
    for headers in [{}, {"X-API-Key": "e2b_" + "0" * 40}, {"X-API-Key": "not-a-key"}, {"X-API-Key": ""}]:
        for path in paths:
            answer = httpx.get(f"{berth.api_url}{path}", headers=headers, timeout=30)
            assert answer.status_code == 401, (headers, path, answer.status_code)
            assert answer.json()["code"] == 401
    create = httpx.post(
        f"{berth.api_url}/v2/sandboxes",
        headers={"X-API-Key": "e2b_" + "f" * 40},
        json={"templateID": "base"},
        timeout=30,
    )
    assert create.status_code == 401
    # /health is the one open route.
    assert httpx.get(f"{berth.api_url}/health", timeout=30).status_code in {200, 204}

    with pytest.raises(AuthenticationException):
        Sandbox.create(api_key="e2b_" + "1" * 40)

"""Secrets through `berth up` with the official SDK (e2b==2.63.0): the secrets API
(write-only values, versions, names and metadata checked), and injection at egress:
`network.rules` headers with `${e2b.secrets.NAME}` resolved by berth's egress proxy per
request, over HTTPS terminated with the installation's CA (trusted inside sandboxes by
default) and re-encrypted to the real server, whose certificate is verified.

Every destination is a host of the session's fake internet (internet.py). The secret's
value must show up only where it is meant to: in the request the test host receives.
"""

from __future__ import annotations

import json
import secrets as random
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox, Secret
from e2b.exceptions import SecretException, SecretNotFoundException

from conftest import Berth
from internet import FakeInternet, ZONE
from test_network import run


def fresh_value() -> str:
    return f"sv-{random.token_hex(16)}"


def test_secret_crud_and_validation(api: httpx.Client) -> None:
    value = fresh_value()
    name = f"Crud_Key-{random.token_hex(3)}"
    responses = []
    created = Secret.create(name, value, metadata={"env": "test"})
    try:
        assert created.name == name.lower() and created.version == 1
        assert created.secret_id.startswith("sec_") and created.metadata == {"env": "test"}
        assert Secret.get_info(created.secret_id).name == name.lower()
        assert Secret.get_info(name).secret_id == created.secret_id, "names match case-insensitively"
        with pytest.raises(SecretException):
            Secret.create(name.lower(), "other")
        updated = Secret.update(created.secret_id, fresh_value(), metadata={"env": "prod"})
        assert updated.version == 2 and updated.metadata == {"env": "prod"}
        assert updated.created_at == created.created_at and updated.updated_at >= created.updated_at
        responses += [api.get("/secrets"), api.get(f"/secrets/{created.secret_id}"), api.get(f"/secrets/{name}")]
        listed = api.get("/secrets", params={"limit": 1})
        assert listed.status_code == 200 and len(listed.json()) == 1
        for bad in [
            {"name": "has space", "value": "v"},
            {"name": "sec_reserved", "value": "v"},
            {"name": "x" * 129, "value": "v"},
            {"name": "ok-name", "value": ""},
            {"name": "ok-name", "value": "v", "metadata": {f"k{i}": "v" for i in range(33)}},
            {"name": "ok-name", "value": "v", "metadata": {"k": "v" * 1025}},
        ]:
            response = api.post("/secrets", json=bad)
            assert response.status_code == 400, (bad.get("name"), response.text)
        leaky = api.post("/secrets", json={"name": "ok-name", "value": "line\nbreak-" + value})
        assert leaky.status_code == 400 and value not in leaky.text
    finally:
        assert Secret.destroy(created.secret_id) is True
    assert Secret.destroy(created.secret_id) is False
    with pytest.raises(SecretNotFoundException):
        Secret.get_info(created.secret_id)
    for response in responses:
        assert response.status_code == 200
        assert value not in response.text and "value" not in response.json() if isinstance(response.json(), dict) else True


def test_secrets_are_per_team(other_team_key: str) -> None:
    created = Secret.create(f"team-{random.token_hex(3)}", fresh_value())
    try:
        other = {"api_key": other_team_key}
        with pytest.raises(SecretNotFoundException):
            Secret.get_info(created.secret_id, **other)
        assert Secret.destroy(created.secret_id, **other) is False
    finally:
        Secret.destroy(created.secret_id)


def rule(host: str, name: str) -> dict:
    return {host: [{"transform": {"headers": {"X-Api-Key": Secret.fill(name), "X-Plain": "visible"}}}]}


def curl_json(sandbox: Sandbox, url: str, direct: bool = False) -> tuple[int, dict | None, str]:
    """curl from inside: exit code, the echo server's JSON, curl's output. A rule
    domain's server is reached through berth's proxy, whose CA the sandbox trusts by
    itself; any other (`direct`) is the real server, signed by the fake internet's CA
    (written to /tmp/test-ca.pem)."""
    cacert = "--cacert /tmp/test-ca.pem" if direct else ""
    code, out = run(sandbox, f"curl -fsS -m 10 {cacert} {url}")
    try:
        return code, json.loads(out) if code == 0 else None, out
    except ValueError:
        return code, None, out


@pytest.fixture
def secret() -> tuple[str, str]:
    name = f"inject-{random.token_hex(4)}"
    value = fresh_value()
    Secret.create(name, value)
    yield name, value
    Secret.destroy(name)


def test_headers_carry_the_secret_outside_and_never_inside(
    berth: Berth, api: httpx.Client, internet: FakeInternet, secret: tuple[str, str]
) -> None:
    name, value = secret
    web1, web2 = f"web1.{ZONE}", f"web2.{ZONE}"
    sandbox = Sandbox.create(timeout=300, network={"rules": rule(web1, name)})
    try:
        sandbox.files.write("/tmp/test-ca.pem", internet.ca_pem)
        code, answer, out = curl_json(sandbox, f"https://{web1}/inject")
        assert code == 0 and answer is not None, out
        assert answer["headers"]["x-api-key"] == value, "the test host got the secret"
        assert answer["headers"]["x-plain"] == "visible"
        # Plain HTTP to the rule domain is injected too.
        code, answer, _ = curl_json(sandbox, f"http://{web1}/plain")
        assert code == 0 and answer["headers"]["x-api-key"] == value
        # What the sandbox itself sent carries no secret; nothing inside holds it.
        trace = sandbox.commands.run(f"curl -sS -m 10 -v -o /dev/null https://{web1}/trace 2>&1", user="root").stdout
        assert value not in trace and "x-api-key" not in trace.lower()
        for probe in [
            "env",
            "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'",
            f"grep -rlsF '{value}' /etc /home /root /tmp /run /usr/local /var 2>/dev/null || true",
        ]:
            assert value not in sandbox.commands.run(probe, user="root").stdout, probe
        # Another domain gets nothing.
        code, answer, _ = curl_json(sandbox, f"https://{web2}/other", direct=True)
        assert code == 0 and "x-api-key" not in answer["headers"]
        # An update applies to the next request.
        new_value = fresh_value()
        Secret.update(name, new_value)
        code, answer, _ = curl_json(sandbox, f"https://{web1}/after-update")
        assert code == 0 and answer["headers"]["x-api-key"] == new_value
        # Rules set by PUT /sandboxes/{id}/network replace the old ones.
        put = api.put(f"/sandboxes/{sandbox.sandbox_id}/network", json={"rules": rule(web2, name)})
        assert put.status_code in (200, 204), put.text
        code, answer, _ = curl_json(sandbox, f"https://{web2}/moved")
        assert code == 0 and answer["headers"]["x-api-key"] == new_value
        code, answer, _ = curl_json(sandbox, f"https://{web1}/no-longer", direct=True)
        assert code == 0 and "x-api-key" not in answer["headers"]
        # The value never appears in the API's answers, the events or the log.
        detail = api.get(f"/sandboxes/{sandbox.sandbox_id}")
        events = api.get(f"/events/sandboxes/{sandbox.sandbox_id}", params={"limit": 100})
        for text in [detail.text, events.text, api.get("/secrets").text, berth.log_tail(10_000_000)]:
            assert value not in text and new_value not in text
        assert "${e2b.secrets." in detail.text or put.status_code == 204
        database = (berth.state_dir / "berth.db").read_bytes()
        assert value.encode() not in database and new_value.encode() not in database
    finally:
        sandbox.kill()


def test_an_untrusted_upstream_certificate_is_an_error(internet: FakeInternet, secret: tuple[str, str]) -> None:
    name, _ = secret
    host = f"untrusted.{ZONE}"
    sandbox = Sandbox.create(timeout=300, network={"rules": rule(host, name)})
    try:
        code, answer, out = curl_json(sandbox, f"https://{host}/")
        assert code != 0 and answer is None, out
    finally:
        sandbox.kill()

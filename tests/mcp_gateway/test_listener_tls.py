"""TLS on `berth up`'s one listener, beside plain HTTP: certificates from the
installation's serving CA for exactly the name asked (the domain's hosts, `localhost`
names, the address when no name is sent), none for other names; the API and the proxy
answer the same over both."""

from __future__ import annotations

import socket
import ssl

import httpx
import pytest

from conftest import Berth


def peer_names(berth: Berth, server_hostname: str | None) -> list[str]:
    """The subject alternative names of the certificate berth presents for an SNI name."""
    context = berth.ssl_context()
    context.check_hostname = server_hostname is not None
    with socket.create_connection(("127.0.0.1", berth.port), timeout=30) as raw:
        with context.wrap_socket(raw, server_hostname=server_hostname) as tls:
            return [value for _, value in tls.getpeercert()["subjectAltName"]]


def test_each_name_gets_its_own_certificate_from_the_serving_ca(berth: Berth) -> None:
    assert peer_names(berth, "localhost") == ["localhost"]
    host = f"49983-isandbox.{berth.domain.split(':')[0]}"
    assert peer_names(berth, host) == [host]
    assert peer_names(berth, None) == ["127.0.0.1"], "no SNI: the address connected to"
    with pytest.raises(ssl.SSLError):
        peer_names(berth, "bank.example.com")


def test_the_api_answers_the_same_over_tls_and_plain_http(berth: Berth) -> None:
    plain = berth.env["E2B_API_URL"]
    secure = plain.replace("http://", "https://")
    headers = {"X-API-Key": berth.env["E2B_API_KEY"]}
    with httpx.Client(verify=berth.ssl_context(), timeout=60) as client:
        assert client.get(f"{secure}/health").status_code == 204
        over_tls = client.get(f"{secure}/v2/sandboxes", headers=headers)
        assert over_tls.status_code == 200
        assert client.get(f"{secure}/v2/sandboxes").status_code == 401
    assert httpx.get(f"{plain}/v2/sandboxes", headers=headers, timeout=60).json() == over_tls.json()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{secure}/health", timeout=30)  # the default trust store does not know berth's CA

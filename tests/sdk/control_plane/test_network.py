"""Sandbox networking through the official SDK against `berth up`: default egress,
E2B's policy (allow_internet_access, allowOut/denyOut with IPs and domains, live
updates), public-traffic tokens, the host mask, the policy across pause/resume and fork,
and escape attempts from inside.

Every destination is a host of the session's fake internet (internet.py), in its own
network namespace on 198.18.0.0/15; `berth up` runs with an egress ceiling admitting
only them. Blocks of anything else (metadata, public ranges) are proved on the rule set
by berth-net's unit tests, never by sending packets.
"""

from __future__ import annotations

import json
import socket
import threading

import httpx
import pytest
from e2b import Sandbox
from e2b.sandbox.commands.command_handle import CommandExitException

from conftest import Berth, poll
from internet import FakeInternet, ZONE


def run(sandbox: Sandbox, command: str, user: str = "root", timeout: int = 30) -> tuple[int, str]:
    """(exit code, stdout) of `command` in `sandbox`, whatever the exit code."""
    try:
        result = sandbox.commands.run(command, user=user, timeout=timeout)
        return result.exit_code, result.stdout
    except CommandExitException as failed:
        return failed.exit_code, failed.stdout


def curl(sandbox: Sandbox, url: str, *extra: str) -> tuple[int, dict | None]:
    """curl `url` from inside: (curl's exit code, the echo server's JSON or None)."""
    args = " ".join(extra)
    # -f: berth's egress proxy refuses with an HTTP error status, which is a failure.
    code, out = run(sandbox, f"curl -fsS -m 5 --cacert /tmp/test-ca.pem {args} {url}")
    try:
        return code, json.loads(out) if code == 0 else None
    except ValueError:
        return code, None


def resolves(sandbox: Sandbox, name: str) -> bool:
    code, _ = run(sandbox, f"getent hosts {name}")
    return code == 0


def with_ca(sandbox: Sandbox, internet: FakeInternet) -> Sandbox:
    sandbox.files.write("/tmp/test-ca.pem", internet.ca_pem)
    return sandbox


@pytest.fixture
def make(berth: Berth, internet: FakeInternet):
    """Creates sandboxes (killed after the test) with the fake internet's CA inside."""
    made: list[Sandbox] = []

    def create(**kwargs) -> Sandbox:
        sandbox = Sandbox.create(timeout=300, **kwargs)
        made.append(sandbox)
        return with_ca(sandbox, internet)

    yield create
    for sandbox in made:
        try:
            sandbox.kill()
        except Exception:
            pass


def test_default_egress_reaches_http_https_and_dns(make, internet: FakeInternet) -> None:
    sandbox = make()
    code, answer = curl(sandbox, f"http://{internet.web_ips[0]}/plain")
    assert code == 0 and answer["served_by"] == internet.web_ips[0]
    assert resolves(sandbox, f"web2.{ZONE}")
    code, answer = curl(sandbox, f"https://web2.{ZONE}/secure")
    assert code == 0, code
    assert answer["served_by"] == internet.web_ips[1] and answer["host"] == f"web2.{ZONE}"
    # As the unprivileged default user too.
    code, out = run(sandbox, f"curl -sS -m 5 http://{internet.web_ips[0]}/", user="user")
    assert code == 0 and internet.web_ips[0] in out


def test_no_internet_blocks_everything_including_dns(make, internet: FakeInternet) -> None:
    sandbox = make(allow_internet_access=False)
    assert curl(sandbox, f"http://{internet.web_ips[0]}/")[0] != 0
    assert curl(sandbox, f"https://{internet.web_ips[0]}/")[0] != 0
    assert not resolves(sandbox, f"web1.{ZONE}")
    info = Sandbox.get_info(sandbox.sandbox_id)
    assert info.allow_internet_access is False


def test_deny_all_allow_one_address(make, internet: FakeInternet) -> None:
    allowed, other = internet.web_ips
    sandbox = make(network={"deny_out": ["0.0.0.0/0"], "allow_out": [allowed]})
    assert curl(sandbox, f"http://{allowed}/")[0] == 0
    assert curl(sandbox, f"https://{allowed}/")[0] == 0
    assert curl(sandbox, f"http://{other}/")[0] != 0


def test_deny_one_address(make, internet: FakeInternet) -> None:
    denied, other = internet.web_ips
    sandbox = make(network={"deny_out": [f"{denied}/32"]})
    assert curl(sandbox, f"http://{denied}/")[0] != 0
    assert curl(sandbox, f"http://{other}/")[0] == 0


def test_allow_wins_over_deny(make, internet: FakeInternet) -> None:
    sandbox = make(network={"deny_out": [f"198.18.{internet.block}.0/24"], "allow_out": [internet.web_ips[0]]})
    assert curl(sandbox, f"http://{internet.web_ips[0]}/")[0] == 0
    assert curl(sandbox, f"http://{internet.web_ips[1]}/")[0] != 0


def test_allowed_domains_by_host_and_sni(make, internet: FakeInternet) -> None:
    web1, web2 = internet.web_ips
    sandbox = make(network={"deny_out": ["0.0.0.0/0"], "allow_out": [f"web1.{ZONE}"]})
    # By name, over HTTP (Host) and HTTPS (SNI): the name resolves and connects.
    assert resolves(sandbox, f"web1.{ZONE}")
    code, answer = curl(sandbox, f"http://web1.{ZONE}/by-host")
    assert code == 0 and answer["served_by"] == web1
    code, answer = curl(sandbox, f"https://web1.{ZONE}/by-sni")
    assert code == 0 and answer["served_by"] == web1
    # Other names do not even resolve; the addresses themselves stay denied.
    assert not resolves(sandbox, f"web2.{ZONE}")
    assert curl(sandbox, f"http://{web2}/")[0] != 0
    # A forged Host aimed at a denied address: berth dials the name, so the request
    # lands on the allowed host, never on the address the sandbox chose.
    code, answer = curl(sandbox, f"http://{web2}/forged", "-H", f"'Host: web1.{ZONE}'")
    assert code != 0 or answer["served_by"] == web1
    # SNI of an allowed name to a denied address: the same.
    code, answer = curl(sandbox, f"https://web1.{ZONE}/", "--resolve", f"web1.{ZONE}:443:{web2}")
    assert code != 0 or answer["served_by"] == web1


def test_wildcard_domains_match_subdomains_only(make, internet: FakeInternet) -> None:
    sandbox = make(network={"deny_out": ["0.0.0.0/0"], "allow_out": [f"*.{ZONE}"]})
    for name in ("web1", "web2"):
        code, answer = curl(sandbox, f"https://{name}.{ZONE}/")
        assert code == 0, name
    # Names of the zone outside the ceiling resolve to an address the ceiling denies.
    assert curl(sandbox, f"http://outside.{ZONE}/")[0] != 0


def test_update_network_tightens_and_clears_live(make, internet: FakeInternet) -> None:
    web1, web2 = internet.web_ips
    sandbox = make()
    assert curl(sandbox, f"http://{web2}/")[0] == 0
    sandbox.update_network({"deny_out": ["0.0.0.0/0"], "allow_out": [web1]})
    assert curl(sandbox, f"http://{web2}/")[0] != 0
    assert curl(sandbox, f"http://{web1}/")[0] == 0
    info = Sandbox.get_info(sandbox.sandbox_id)
    assert info.network is not None
    # An update without rules clears them: everything is reachable again.
    sandbox.update_network({})
    assert curl(sandbox, f"http://{web2}/")[0] == 0


def test_update_network_cuts_open_connections(make, internet: FakeInternet) -> None:
    """A connection opened while allowed is cut once its destination is denied."""
    web1 = internet.web_ips[0]
    sandbox = make()
    sandbox.files.write(
        "/tmp/hold.py",
        "import socket, sys, time\n"
        f"s = socket.create_connection(('{web1}', 80), timeout=5)\n"
        "open('/tmp/hold.state', 'w').write('open')\n"
        "for i in range(40):\n"
        "    try:\n"
        f"        s.sendall(b'GET / HTTP/1.1\\r\\nHost: {web1}\\r\\n\\r\\n')\n"
        "        s.settimeout(2)\n"
        "        if not s.recv(65536):\n"
        "            print('closed by the server', flush=True); sys.exit(1)\n"
        "    except OSError as e:\n"
        "        print('cut', e, flush=True); sys.exit(0)\n"
        "    time.sleep(0.25)\n"
        "print('still open', flush=True)\n",
    )
    handle = sandbox.commands.run("python3 /tmp/hold.py", background=True)
    poll(lambda: run(sandbox, "cat /tmp/hold.state")[1] == "open", timeout=20, what="the connection to open")
    sandbox.update_network({"deny_out": [f"{web1}/32"]})
    result = handle.wait()
    assert "cut" in result.stdout, result.stdout


def test_private_sandbox_ports_need_the_traffic_token_and_host_mask(make, berth: Berth) -> None:
    sandbox = make(network={"allow_public_traffic": False, "mask_request_host": "${PORT}-masked.internal"})
    token = sandbox.traffic_access_token
    assert token
    sandbox.files.write(
        "/tmp/host.py",
        "import http.server\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        body = (self.headers.get('host') or '').encode()\n"
        "        self.send_response(200); self.send_header('content-length', str(len(body))); self.end_headers()\n"
        "        self.wfile.write(body)\n"
        "http.server.HTTPServer(('0.0.0.0', 8000), H).serve_forever()\n",
    )
    sandbox.commands.run("python3 /tmp/host.py", background=True)
    routing = {"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "8000"}

    def answer(headers: dict) -> httpx.Response:
        return httpx.get(f"{berth.sandbox_url}/", headers={**routing, **headers}, timeout=30)

    poll(lambda: answer({"e2b-traffic-access-token": token}).status_code == 200, timeout=60, what="the server")
    assert answer({"e2b-traffic-access-token": token}).text == "8000-masked.internal"
    assert answer({}).status_code == 403
    assert answer({"e2b-traffic-access-token": "wrong"}).status_code == 403


def test_policy_survives_pause_resume_and_fork(make, internet: FakeInternet) -> None:
    web1, web2 = internet.web_ips
    sandbox = make(network={"deny_out": ["0.0.0.0/0"], "allow_out": [web1]})
    sandbox.pause()
    resumed = with_ca(Sandbox.connect(sandbox.sandbox_id), internet)
    assert curl(resumed, f"http://{web1}/")[0] == 0
    assert curl(resumed, f"http://{web2}/")[0] != 0
    forks = resumed.fork(count=2)
    try:
        addresses = set()
        for fork in forks:
            assert curl(fork, f"http://{web1}/")[0] == 0
            assert curl(fork, f"http://{web2}/")[0] != 0
            code, out = run(fork, "hostname -I")
            addresses.add(out.strip())
        code, out = run(resumed, "hostname -I")
        addresses.add(out.strip())
        assert len(addresses) == 3, f"forks share an address: {addresses}"
    finally:
        for fork in forks:
            fork.kill()


def test_escape_attempts_from_root_fail(make, berth: Berth, internet: FakeInternet) -> None:
    victim = make()
    sandbox = make()
    code, victim_ip = run(victim, "hostname -I")
    victim_ip = victim_ip.strip()
    code, gateway = run(sandbox, "awk '{print $2}' /etc/resolv.conf")
    gateway = gateway.strip()
    api_port = int(berth.api_url.rsplit(":", 1)[1])
    # A listener on the host side of the fake internet's link: a host address.
    listener = socket.socket()
    listener.bind((internet.host_side, 0))
    listener.listen()
    host_port = listener.getsockname()[1]
    accepted: list[object] = []

    def accept() -> None:
        listener.settimeout(30)
        try:
            accepted.append(listener.accept())
        except OSError:
            pass

    threading.Thread(target=accept, daemon=True).start()
    try:
        probe = (
            "import socket, sys\n"
            "host, port = sys.argv[1], int(sys.argv[2])\n"
            "try:\n"
            "    socket.create_connection((host, port), timeout=3); print('reached')\n"
            "except OSError as e:\n"
            "    print('refused', e)\n"
        )
        sandbox.files.write("/tmp/probe.py", probe)
        for host, port in [
            (internet.host_side, host_port),  # the host's own address
            (gateway, api_port),  # berth's API port on the gateway
            (gateway, 22),
            (victim_ip, 49983),  # another sandbox's envd
            (internet.outside_ip, 80),  # a test host outside the ceiling
        ]:
            _, out = run(sandbox, f"python3 /tmp/probe.py {host} {port}")
            assert out.startswith("refused"), (host, port, out)
        assert not accepted, "the host listener was reached"
        # Root inside cannot reconfigure its network, open raw sockets or spoof.
        checks = {
            "raw": "import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)",
            "address": (
                "import fcntl, socket, struct; s = socket.socket();"
                "req = struct.pack('16sH2s4s8s', b'eth0', socket.AF_INET, b'', socket.inet_aton('10.1.2.3'), b'');"
                "fcntl.ioctl(s, 0x8916, req)"
            ),
            "forward": "open('/proc/sys/net/ipv4/ip_forward', 'w').write('1')",
        }
        for name, code_text in checks.items():
            code, _ = run(sandbox, f"python3 -c \"{code_text}\"")
            assert code != 0, f"root inside could {name}"
        spoof = (
            "import socket; s = socket.socket(); s.setsockopt(socket.SOL_IP, 15, 1);"  # IP_FREEBIND
            f"s.bind(('{victim_ip}', 0)); s.settimeout(3);"
            f"s.connect(('{internet.web_ips[0]}', 80)); print('spoofed')"
        )
        _, out = run(sandbox, f"python3 -c \"{spoof}\"")
        assert "spoofed" not in out
        assert curl(sandbox, f"http://{internet.web_ips[0]}/")[0] == 0, "the sandbox still has egress"
    finally:
        listener.close()

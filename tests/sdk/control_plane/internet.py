"""A fake internet for the network tests, made of this machine's own parts.

One network namespace (`bcp-inet-<pid>`) behind a veth to the suite's own namespace
holds every "internet" host, on addresses of the benchmarking range 198.18.0.0/15 (the
only range ENVIRONMENT.md lets tests send to):

- `web_ips[i]` (198.18.B.1..): an HTTP server on port 80 and an HTTPS server on 443 that
  answer every request with a JSON echo of what they received (method, path, Host,
  headers, which address served it), so a test sees what left the sandbox.
- `outside_ip` (198.19.B.1): the same servers on a host berth's egress ceiling does not
  admit.
- `untrusted_ip` (198.18.B.100, `untrusted.test-internet.example`): the same servers with
  a certificate from another CA that nobody trusts (the egress proxy must refuse it).
- `dns_ip` (198.18.B.53): dnsmasq answering `*.test-internet.example` (each name listed
  in `names`) and nothing else, the upstream `berth up` forwards sandbox queries to.
- with `git=True`, `git_ip` (198.18.B.30, `git.test-internet.example`): a plain file
  server on port 80 over `git_dir`, where `add_git_repository` puts bare repositories
  readable with git's "dumb" HTTP protocol (`http://git.test-internet.example/<owner>/<repo>`).

The HTTPS servers use a certificate for `*.test-internet.example` and the web addresses,
signed by a CA made for this run (`ca_pem`); tests hand that CA to curl inside the
sandbox. `stop()` removes the namespace, its link and every process in it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

ZONE = "test-internet.example"

ECHO_SERVER = r'''
import http.server, json, socketserver, ssl, sys, threading
host, cert, key = sys.argv[1], sys.argv[2], sys.argv[3]
class Echo(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: tests hold connections open
    def _answer(self):
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length).decode(errors="replace") if length else ""
        reply = json.dumps({"method": self.command, "path": self.path,
            "host": self.headers.get("host"), "served_by": host,
            "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)
    do_GET = do_POST = do_PUT = _answer
    def log_message(self, *args):
        pass
class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
plain = Server((host, 80), Echo)
secure = Server((host, 443), Echo)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(cert, key)
secure.socket = context.wrap_socket(secure.socket, server_side=True)
threading.Thread(target=secure.serve_forever, daemon=True).start()
plain.serve_forever()
'''


def _run(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), check=True, capture_output=True, text=True, **kwargs)


class FakeInternet:
    def __init__(self, block: int, web_hosts: int = 2, git: bool = False):
        self.block = block
        self.netns = f"bcp-inet-{os.getpid()}"
        self.link = f"bcpi{os.getpid() % 100000}"
        self.dir = Path(tempfile.mkdtemp(prefix="berth-fake-internet-"))
        self.web_ips = [f"198.18.{block}.{i}" for i in range(1, web_hosts + 1)]
        self.outside_ip = f"198.19.{block}.1"
        self.dns_ip = f"198.18.{block}.53"
        self.host_side = f"198.19.{block}.254"
        # name -> address: web hosts by number, and one name outside the ceiling.
        self.names = {f"web{i}.{ZONE}": ip for i, ip in enumerate(self.web_ips, start=1)}
        self.names[f"outside.{ZONE}"] = self.outside_ip
        self.untrusted_ip = f"198.18.{block}.100"
        self.names[f"untrusted.{ZONE}"] = self.untrusted_ip
        self.git_ip = f"198.18.{block}.30" if git else None
        if self.git_ip:
            self.names[f"git.{ZONE}"] = self.git_ip
        self._processes: list[subprocess.Popen] = []
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    @property
    def ceiling(self) -> str:
        """The `--egress-allow` that admits exactly this internet's hosts (not outside)."""
        return f"198.18.{self.block}.0/24"

    def _start(self) -> None:
        self._make_certificates()
        _run("ip", "netns", "add", self.netns)
        _run("ip", "link", "add", self.link, "type", "veth", "peer", "name", "eth0", "netns", self.netns)
        _run("ip", "link", "set", self.link, "up")
        _run("ip", "addr", "add", f"{self.host_side}/32", "dev", self.link)
        for net in (f"198.18.{self.block}.0/24", f"198.19.{self.block}.0/24"):
            _run("ip", "route", "add", net, "dev", self.link)
        inside = ("ip", "-n", self.netns)
        _run(*inside, "link", "set", "lo", "up")
        _run(*inside, "link", "set", "eth0", "up")
        git_hosts = [self.git_ip] if self.git_ip else []
        for addr in [*self.web_ips, self.outside_ip, self.dns_ip, self.untrusted_ip, *git_hosts]:
            _run(*inside, "addr", "add", f"{addr}/32", "dev", "eth0")
        _run(*inside, "route", "add", "default", "dev", "eth0")
        script = self.dir / "echo.py"
        script.write_text(ECHO_SERVER)
        for addr in [*self.web_ips, self.outside_ip]:
            self._spawn("python3", str(script), addr, str(self.dir / "server.crt"), str(self.dir / "server.key"))
        self._spawn("python3", str(script), self.untrusted_ip, str(self.dir / "untrusted.crt"), str(self.dir / "untrusted.key"))
        if self.git_ip:
            self.git_dir.mkdir()
            (self.git_dir / "ready").write_text("ok\n")
            self._spawn("python3", "-m", "http.server", "80", "--bind", self.git_ip, "--directory", str(self.git_dir))
        dnsmasq = ["dnsmasq", "--keep-in-foreground", "--no-resolv", "--no-hosts", "--bind-interfaces",
                   f"--listen-address={self.dns_ip}", "--port=53", "--user=root", "--pid-file="]
        dnsmasq += [f"--address=/{name}/{ip}" for name, ip in self.names.items()]
        # Names of the zone that are not listed do not exist; nothing else is answered.
        dnsmasq += [f"--local=/{ZONE}/"]
        self._spawn(*dnsmasq)
        self._wait_listening([f"{self.dns_ip}:53"])
        for addr in [*self.web_ips, self.outside_ip, self.untrusted_ip, *git_hosts]:
            self._wait_serving(addr)

    @property
    def git_dir(self) -> Path:
        return self.dir / "git"

    @property
    def git_url(self) -> str:
        """The base URL of the git host (`--mcp-git-url`)."""
        return f"http://git.{ZONE}"

    def add_git_repository(self, owner: str, repo: str, files: dict[str, str]) -> None:
        """A bare repository `<owner>/<repo>` on the git host holding `files` (path ->
        text) in one commit, made servable over dumb HTTP (`git update-server-info`)."""
        assert self.git_ip, "FakeInternet(git=True) serves repositories"
        identity = {"GIT_AUTHOR_NAME": "test", "GIT_AUTHOR_EMAIL": "test@example.com",
                    "GIT_COMMITTER_NAME": "test", "GIT_COMMITTER_EMAIL": "test@example.com"}
        env = {**os.environ, **identity}
        with tempfile.TemporaryDirectory(prefix="berth-git-work-") as work:
            for path, text in files.items():
                target = Path(work) / path
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text)
            _run("git", "-C", work, "init", "--quiet", "--initial-branch=main", env=env)
            _run("git", "-C", work, "add", "--all", env=env)
            _run("git", "-C", work, "commit", "--quiet", "-m", f"{owner}/{repo}", env=env)
            bare = self.git_dir / owner / repo
            shutil.rmtree(bare, ignore_errors=True)
            bare.parent.mkdir(parents=True, exist_ok=True)
            _run("git", "clone", "--quiet", "--bare", work, str(bare), env=env)
            _run("git", "-C", str(bare), "update-server-info", env=env)

    def _wait_serving(self, addr: str) -> None:
        """Until `addr` answers HTTP from here: a bound socket is not yet a server that
        accepts (the interpreter may still be starting on a loaded machine)."""
        import urllib.request

        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://{addr}/ready", timeout=2).read()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise AssertionError(f"fake internet host {addr} does not answer")
                time.sleep(0.1)

    def _spawn(self, *argv: str) -> None:
        self._processes.append(
            subprocess.Popen(["ip", "netns", "exec", self.netns, *argv],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        )

    def _wait_listening(self, endpoints: list[str]) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            listening = _run("ip", "netns", "exec", self.netns, "ss", "-Hlntu").stdout
            if all(endpoint in listening for endpoint in endpoints):
                return
            time.sleep(0.1)
        raise AssertionError(f"fake internet servers did not start: {endpoints}")

    def _make_certificates(self) -> None:
        d = self.dir
        _run("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", str(d / "ca.key"), "-out", str(d / "ca.crt"), "-days", "2", "-subj", "/CN=berth test CA")
        _run("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", str(d / "server.key"), "-out", str(d / "server.csr"), "-subj", f"/CN=*.{ZONE}")
        alt = ",".join([f"DNS:*.{ZONE}"] + [f"IP:{ip}" for ip in [*self.web_ips, self.outside_ip]])
        (d / "ext.cnf").write_text(f"subjectAltName={alt}\n")
        _run("openssl", "x509", "-req", "-in", str(d / "server.csr"), "-CA", str(d / "ca.crt"),
             "-CAkey", str(d / "ca.key"), "-CAcreateserial", "-out", str(d / "server.crt"), "-days", "2",
             "-extfile", str(d / "ext.cnf"))

        # A self-signed certificate for the untrusted host: valid name, unknown issuer.
        _run("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", str(d / "untrusted.key"), "-out", str(d / "untrusted.crt"), "-days", "2",
             "-subj", f"/CN=untrusted.{ZONE}", "-addext", f"subjectAltName=DNS:untrusted.{ZONE}")

    @property
    def ca_file(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def ca_pem(self) -> str:
        return (self.dir / "ca.crt").read_text()

    def stop(self) -> None:
        for process in self._processes:
            process.kill()
        for process in self._processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        # Anything else left in the namespace (children of the servers).
        pids = subprocess.run(["ip", "netns", "pids", self.netns], capture_output=True, text=True).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), 9)
            except (ProcessLookupError, ValueError):
                pass
        subprocess.run(["ip", "link", "del", self.link], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)


def echo(stdout: str) -> dict:
    """The echo server's answer printed by curl inside a sandbox."""
    return json.loads(stdout)

"""Fixtures for the template build suite: the real `berth up`, the official SDKs' Template
builders and the E2B CLI against it, and images from a registry on loopback.

`berth up` runs on a free loopback port with a fresh state directory whose template
store holds only `base`, imported from the shared store (`BERTH_TEMPLATES_DIR`, default
`/var/lib/berth/templates`) as a symlink to its layer, so the suite's builds, layers and
deletions never touch the shared store. Without a shared `base`, `berth up` builds it.

Images: `docker-registry` on 127.0.0.1 (one without auth, one with htpasswd Basic auth),
images made here with umoci from a tiny rootfs of host binaries and pushed with skopeo.
Nothing talks to a public registry.

Binary: `BERTH_BIN` if set, else `cargo build -p berth -p berth-envd -p berth-runtime
--bins` into `$CARGO_TARGET_DIR` (`berth up` runs `berth-envd` and `berth-launch` from
beside its own binary). Run as root from this directory:

    cd tests/templates && ../../.venv/bin/pytest
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings

with warnings.catch_warnings():
    # Python 3.11's crypt (deprecated, still there) makes the registry's bcrypt htpasswd.
    warnings.simplefilter("ignore", DeprecationWarning)
    import crypt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Optional

import httpx
import pytest

# The control-plane suite's fake internet (hosts on 198.18.0.0/15 in a namespace of
# their own): the only egress sandboxes of this suite's `berth up` may have.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sdk" / "control_plane"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from internet import FakeInternet  # noqa: E402
from sandbox_pool import free_sandbox_pool  # noqa: E402

for _var in ("E2B_DEBUG", "E2B_DOMAIN", "E2B_ACCESS_TOKEN", "E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY"):
    os.environ.pop(_var, None)

REPO_ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
STARTUP_TIMEOUT_S = float(os.environ.get("BERTH_STARTUP_TIMEOUT", "900"))
E2B_LINE = re.compile(r"^\s*(?:export\s+)?(E2B_API_URL|E2B_SANDBOX_URL|E2B_API_KEY)=(\S+)\s*$")
KEY_SHAPE = re.compile(r"e2b_[0-9a-f]+")
REGISTRY_USER = "puller"
REGISTRY_PASSWORD = "s3cret-pw"


def target_dir() -> Path:
    configured = os.environ.get("CARGO_TARGET_DIR")
    if configured:
        path = Path(configured)
        return path if path.is_absolute() else REPO_ROOT / path
    return REPO_ROOT / "target"


def berth_binary() -> Path:
    configured = os.environ.get("BERTH_BIN")
    if configured:
        if not os.access(configured, os.X_OK):
            pytest.exit(f"BERTH_BIN={configured} is not an executable file", returncode=2)
        return Path(configured)
    build = subprocess.run(
        ["cargo", "build", "-p", "berth", "-p", "berth-envd", "-p", "berth-runtime", "--bins"],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    if build.returncode != 0:
        pytest.exit(f"cargo build failed:\n{build.stdout[-6000:]}", returncode=2)
    return target_dir() / "debug" / "berth"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def poll(predicate: Callable[[], bool], timeout: float = 60.0, interval: float = 0.1, what: str = "condition") -> None:
    """Poll until `predicate()` holds; fail after `timeout` s (a bound, never a measurement)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def run(args: list[str], **kwargs) -> str:
    result = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
    assert result.returncode == 0, f"{args} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    return result.stdout


def import_base(state_dir: Path) -> None:
    """`base` of the shared store into `state_dir`'s: its manifest copied, its layers
    symlinked (read-only lower dirs; this suite never deletes them)."""
    shared = Path(os.environ.get("BERTH_TEMPLATES_DIR", "/var/lib/berth/templates"))
    manifest = shared / "manifests" / "base.json"
    if not manifest.is_file():
        return
    layers = json.loads(manifest.read_text())["layers"]
    if not all((shared / "layers" / layer).is_dir() for layer in layers):
        return
    store = state_dir / "templates"
    (store / "layers").mkdir(parents=True)
    (store / "manifests").mkdir()
    for layer in layers:
        (store / "layers" / layer).symlink_to(shared / "layers" / layer)
    shutil.copy(manifest, store / "manifests" / "base.json")


@dataclass
class Berth:
    """A running `berth up` and what it printed."""

    binary: Path
    state_dir: Path
    listen: str
    log_path: Path
    network_env: dict[str, str] = field(default_factory=dict)
    process: Optional[subprocess.Popen] = None
    env: dict[str, str] = field(default_factory=dict)
    _reader: Optional[threading.Thread] = None

    @property
    def api_url(self) -> str:
        return self.env["E2B_API_URL"]

    @property
    def api_key(self) -> str:
        return self.env["E2B_API_KEY"]

    def log_tail(self, size: int = 8000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-size:]
        except OSError:
            return "<no log>"

    def start(self) -> None:
        found: dict[str, str] = {}
        # stdout is a pipe, so `berth up` prints no key: one is made below.
        required = {"E2B_API_URL", "E2B_SANDBOX_URL"}
        ready = threading.Event()
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [str(self.binary), "up", "--listen", self.listen, "--state-dir", str(self.state_dir)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            start_new_session=True,
            env={
                **os.environ,
                "RUST_LOG": os.environ.get("RUST_LOG", "info"),
                "BERTH_CRIU_STATE_DIR": os.environ.get("BERTH_CRIU_STATE_DIR", "/var/lib/berth"),
                **self.network_env,
            },
        )
        process = self.process

        def read_stdout() -> None:
            assert process.stdout is not None
            for raw in process.stdout:
                log.write(raw)
                log.flush()
                match = E2B_LINE.match(raw.decode(errors="replace"))
                if match:
                    found[match.group(1)] = match.group(2)
                    if required <= found.keys():
                        ready.set()
            log.close()
            ready.set()

        self._reader = threading.Thread(target=read_stdout, daemon=True)
        self._reader.start()
        if not ready.wait(STARTUP_TIMEOUT_S) or not required <= found.keys():
            self.stop()
            pytest.exit(f"berth up did not start (exit {process.poll()}):\n{self.log_tail()}", returncode=2)
        assert "E2B_API_KEY" not in found, "berth up printed an API key into a pipe"
        self.env = {**self.env, **found}
        if "E2B_API_KEY" not in self.env:
            self.env["E2B_API_KEY"] = self.create_key("default")

        def healthy() -> bool:
            try:
                return httpx.get(f"{self.api_url}/health", timeout=2.0).status_code < 500
            except httpx.TransportError:
                return False

        poll(healthy, timeout=60, what="berth up to answer /health")
        os.environ.update(self.env)

    def stop(self) -> Optional[int]:
        process = self.process
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._reader is not None:
            self._reader.join(10)
        self.process = None
        return process.returncode

    def restart(self) -> None:
        self.stop()
        self.start()

    def create_key(self, team: str) -> str:
        result = subprocess.run(
            [str(self.binary), "keys", "create", "--team", team, "--state-dir", str(self.state_dir)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        key = result.stdout.strip().splitlines()[-1].split("=")[-1]
        assert KEY_SHAPE.fullmatch(key), key
        return key

    def berth_cli(self, *args: str, key: Optional[str] = None, timeout: float = 900, cwd: Optional[Path] = None) -> subprocess.CompletedProcess:
        """`berth <args>` against this instance's API."""
        return subprocess.run(
            [str(self.binary), *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd,
            env={**os.environ, "E2B_API_URL": self.api_url, "E2B_API_KEY": key or self.api_key},
        )


def mounts_under(directory: Path) -> list[str]:
    prefix = str(directory.resolve())
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mount_point = line.split()[4].replace("\\040", " ")
        if mount_point == prefix or mount_point.startswith(prefix + "/"):
            found.append(mount_point)
    return found


def kill_all_sandboxes(api_url: str, api_key: str) -> None:
    headers = {"X-API-Key": api_key}
    try:
        listed = httpx.get(f"{api_url}/v2/sandboxes", headers=headers, params={"limit": 100, "state": "running,paused"}, timeout=30)
        for sandbox in listed.json() if listed.status_code == 200 else []:
            httpx.delete(f"{api_url}/sandboxes/{sandbox['sandboxID']}", headers=headers, timeout=30)
    except httpx.TransportError:
        pass


_issued_keys: list[str] = []


@pytest.fixture(scope="session")
def internet() -> Iterator[FakeInternet]:
    if os.geteuid() != 0:
        pytest.exit("berth up runs sandboxes: run the suite as root", returncode=2)
    hosts = FakeInternet(block=201)
    try:
        yield hosts
    finally:
        hosts.stop()


def new_berth(internet: FakeInternet, state_dir: Path, log_path: Path, **env: str) -> Berth:
    """A `berth up` (not started yet) on `state_dir` with `base` imported, a sandbox pool
    of its own and an egress ceiling admitting only the fake internet; `env` adds to its
    environment."""
    import_base(state_dir)
    return Berth(
        binary=berth_binary(),
        state_dir=state_dir,
        listen=f"127.0.0.1:{free_port()}",
        log_path=log_path,
        network_env={
            "BERTH_SANDBOX_CIDR": free_sandbox_pool(),
            "BERTH_EGRESS_ALLOW": internet.ceiling,
            "BERTH_DNS_UPSTREAM": f"{internet.dns_ip}:53",
            **env,
        },
    )


def log_root() -> Optional[str]:
    """Where `berth up` logs are made: `BERTH_TEST_LOG_DIR` when set (scripts/test.sh
    points it at a directory per suite, and keeps what a failed suite left there as a CI
    artifact), else the system's temp dir. A log is removed when its tests pass."""
    root = os.environ.get("BERTH_TEST_LOG_DIR")
    if root:
        os.makedirs(root, exist_ok=True)
    return root or None


@pytest.fixture(scope="session")
def berth(request: pytest.FixtureRequest, internet: FakeInternet) -> Iterator[Berth]:
    state_dir = Path(tempfile.mkdtemp(prefix="berth-tpl-state-"))
    log_dir = Path(tempfile.mkdtemp(prefix="berth-tpl-log-", dir=log_root()))
    instance = new_berth(internet, state_dir, log_dir / "berth-up.log")
    try:
        instance.start()
        yield instance
    finally:
        if instance.process is not None and instance.process.poll() is None and instance.env:
            for key in [instance.api_key, *_issued_keys]:
                kill_all_sandboxes(instance.api_url, key)
        code = instance.stop()
        if mounts_under(state_dir):
            print(f"\nleaving {state_dir}: still mounted inside")
        else:
            shutil.rmtree(state_dir, ignore_errors=True)
        if request.session.testsfailed or not instance.env:
            print(f"\nberth up exited with {code}; its log is kept at {instance.log_path}")
        else:
            shutil.rmtree(log_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def api(berth: Berth) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=berth.api_url, headers={"X-API-Key": berth.api_key}, timeout=120) as client:
        yield client


@pytest.fixture(scope="session")
def other_team(berth: Berth) -> Iterator[httpx.Client]:
    """A raw API client with the key of a second team, `other`."""
    key = berth.create_key("other")
    _issued_keys.append(key)
    with httpx.Client(base_url=berth.api_url, headers={"X-API-Key": key}, timeout=120) as client:
        yield client


def unique(prefix: str) -> str:
    return f"{prefix}-{os.urandom(3).hex()}"


@pytest.fixture
def cleanup(api: httpx.Client) -> Iterator[Callable[[str], str]]:
    """Registers template names to delete (with their sandboxes killed first) after the test."""
    names: list[str] = []
    yield lambda name: names.append(name) or name
    for name in names:
        api.delete(f"/templates/{name}")


# --- images ------------------------------------------------------------------------------

TOOLS = [
    "/bin/sh", "/bin/bash", "/bin/ls", "/bin/cat", "/bin/mkdir", "/bin/chown", "/bin/chmod",
    "/bin/mv", "/bin/rm", "/bin/ln", "/bin/cp", "/bin/tar", "/bin/gzip", "/bin/grep",
    "/usr/bin/env", "/usr/bin/id", "/usr/bin/whoami", "/usr/bin/touch", "/usr/bin/dirname",
    "/usr/bin/basename", "/usr/bin/head", "/usr/bin/setsid", "/bin/sleep", "/usr/bin/stat",
]


def copy_with_libs(binary: str, rootfs: Path) -> None:
    """`binary` and the libraries `ldd` names, into `rootfs` at the same paths."""
    files = [Path(binary)]
    for word in run(["ldd", binary]).split():
        if word.startswith("/"):
            files.append(Path(word))
    for file in files:
        dest = rootfs / file.relative_to("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        if not dest.exists():
            shutil.copy2(file.resolve(), dest)


@dataclass
class Registry:
    process: subprocess.Popen
    port: int
    directory: Path
    auth: bool

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def push(self, layout: Path, tag: str, name: str) -> str:
        args = ["skopeo", "copy", "--quiet", "--dest-tls-verify=false"]
        if self.auth:
            args += ["--dest-creds", f"{REGISTRY_USER}:{REGISTRY_PASSWORD}"]
        run([*args, f"oci:{layout}:{tag}", f"docker://{self.host}/{name}"])
        return f"{self.host}/{name}"


def start_registry(directory: Path, auth: bool) -> Registry:
    port = free_port()
    config = (
        "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n"
        f"    rootdirectory: {directory / 'data'}\nhttp:\n  addr: 127.0.0.1:{port}\n"
    )
    if auth:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            hashed = crypt.crypt(REGISTRY_PASSWORD, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16))
        (directory / "htpasswd").write_text(f"{REGISTRY_USER}:{hashed}\n")
        config += f"auth:\n  htpasswd:\n    realm: berth-test\n    path: {directory / 'htpasswd'}\n"
    (directory / "config.yml").write_text(config)
    log = open(directory / "registry.log", "wb")
    process = subprocess.Popen(["docker-registry", "serve", str(directory / "config.yml")], stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    registry = Registry(process=process, port=port, directory=directory, auth=auth)

    def answers() -> bool:
        try:
            return httpx.get(f"http://{registry.host}/v2/", timeout=2).status_code in (200, 401)
        except httpx.TransportError:
            return False

    poll(answers, timeout=30, what="the local registry")
    return registry


@dataclass
class Images:
    """References pushed for the suite: `plain` (no auth) and `private` (Basic auth)."""

    plain: str
    private: str
    registry_host: str
    private_host: str


@pytest.fixture(scope="session")
def images() -> Iterator[Images]:
    """A tiny image (host sh/bash/coreutils and their libraries, a root user, ENV
    GREETING=from-image, a file /etc/image-marker) in two loopback registries."""
    work = Path(tempfile.mkdtemp(prefix="berth-tpl-images-"))
    registries = []
    try:
        layout = work / "layout"
        bundle = work / "bundle"
        run(["umoci", "init", "--layout", str(layout)])
        run(["umoci", "new", "--image", f"{layout}:v1"])
        run(["umoci", "unpack", "--image", f"{layout}:v1", str(bundle)])
        rootfs = bundle / "rootfs"
        for tool in TOOLS:
            if Path(tool).exists():
                copy_with_libs(tool, rootfs)
        (rootfs / "etc").mkdir(exist_ok=True)
        (rootfs / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
        (rootfs / "etc/group").write_text("root:x:0:\n")
        (rootfs / "etc/image-marker").write_text("made by the template suite\n")
        for directory in ["root", "tmp", "home"]:
            (rootfs / directory).mkdir(exist_ok=True)
        run(["umoci", "repack", "--image", f"{layout}:v1", str(bundle)])
        run(["umoci", "config", "--image", f"{layout}:v1", "--config.env=GREETING=from-image", "--config.env=PATH=/usr/local/bin:/usr/bin:/bin"])
        plain_dir = work / "plain"
        private_dir = work / "private"
        plain_dir.mkdir()
        private_dir.mkdir()
        plain = start_registry(plain_dir, auth=False)
        registries.append(plain)
        private = start_registry(private_dir, auth=True)
        registries.append(private)
        yield Images(
            plain=plain.push(layout, "v1", "suite/tiny:v1"),
            private=private.push(layout, "v1", "suite/private:v1"),
            registry_host=plain.host,
            private_host=private.host,
        )
    finally:
        for registry in registries:
            registry.process.terminate()
            try:
                registry.process.wait(10)
            except subprocess.TimeoutExpired:
                registry.process.kill()
        shutil.rmtree(work, ignore_errors=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that restart `berth up` run last so no other test sees the restart."""
    items.sort(key=lambda item: item.get_closest_marker("restarts_berth") is not None)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "restarts_berth: the test restarts the session's berth up")

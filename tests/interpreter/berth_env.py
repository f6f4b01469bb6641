"""A real `berth up` serving `code-interpreter-v1` sandboxes, for the interpreter suites.

The state dir (`BERTH_INTERPRETER_STATE_DIR`, default `$CARGO_TARGET_DIR/interpreter-state`)
is kept between runs and suites: `code-interpreter-v1` is built in it once (by `berth
provision --template code-interpreter-v1`, the step cache making an unchanged rebuild
free) and every later `berth up` on it starts sandboxes from that build. Its `base` is
the shared store's (`BERTH_TEMPLATES_DIR`, default `/var/lib/berth/templates`), linked in.

Network: sandboxes (and the build's sandboxes) get their own address pool and an egress
ceiling admitting only the package registries, by name (REGISTRIES); names resolve
through the host's resolver, which answers only those. No other address is reachable.

Binaries: `BERTH_BIN` (berth, with berth-envd and berth-launch beside it) and
`BERTH_INTERPRETER_BIN` (the static berth-interpreter of
`crates/interpreter/build-static.sh`); else `<target>/dist/` as scripts/test.sh lays it out.

    python3 tests/interpreter/berth_env.py provision      # build the template (progress)
    python3 tests/interpreter/berth_env.py run -- CMD...  # CMD with E2B_API_URL/… set
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Optional

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "tests"))
from sandbox_pool import free_sandbox_pool  # noqa: E402
TEMPLATE = "code-interpreter-v1"
# What the template's build installs from: Debian (apt, security updates included),
# PyPI (pip index and files) and npm (Deno's package).
REGISTRIES = ["deb.debian.org", "pypi.org", "files.pythonhosted.org", "registry.npmjs.org"]
E2B_LINE = re.compile(r"^\s*(E2B_API_URL|E2B_SANDBOX_URL)=(\S+)\s*$")


def target_dir() -> Path:
    configured = os.environ.get("CARGO_TARGET_DIR")
    if configured:
        path = Path(configured)
        return path if path.is_absolute() else REPO_ROOT / path
    return REPO_ROOT / "target"


def berth_binary() -> Path:
    return Path(os.environ.get("BERTH_BIN", target_dir() / "dist" / "berth"))


def interpreter_binary() -> Path:
    return Path(os.environ.get("BERTH_INTERPRETER_BIN", berth_binary().parent / "berth-interpreter"))


def state_dir() -> Path:
    return Path(os.environ.get("BERTH_INTERPRETER_STATE_DIR", target_dir() / "interpreter-state"))


def import_base(state: Path) -> None:
    """`base` of the shared store linked into `state`'s store (manifest copied, layers
    symlinked), unless it has that one already: a state dir kept from before a change
    of base's recipe gets the current base (and so rebuilds the template on it)."""
    store = state / "templates"
    shared = Path(os.environ.get("BERTH_TEMPLATES_DIR", "/var/lib/berth/templates"))
    manifest = shared / "manifests" / "base.json"
    if not manifest.is_file():
        return  # berth builds its own base
    own = store / "manifests" / "base.json"
    if own.is_file() and own.read_bytes() == manifest.read_bytes():
        return
    layers = json.loads(manifest.read_text())["layers"]
    (store / "layers").mkdir(parents=True, exist_ok=True)
    (store / "manifests").mkdir(exist_ok=True)
    for layer in layers:
        link = store / "layers" / layer
        if not link.exists():
            link.symlink_to(shared / "layers" / layer)
    own.write_bytes(manifest.read_bytes())


def build_ca_file() -> dict[str, str]:
    """The host's local CAs (Debian's /usr/local/share/ca-certificates), for a machine
    whose route to the registries is a TLS-intercepting proxy: the template's build must
    trust what the host trusts to download over https. Nothing when there are none."""
    local = sorted(Path("/usr/local/share/ca-certificates").glob("*.crt"))
    if not local or os.environ.get("BERTH_BUILD_CA_FILE") == "":
        return {}
    bundle = state_dir() / "build-ca.pem"
    bundle.parent.mkdir(parents=True, exist_ok=True)
    bundle.write_text("".join(path.read_text().strip() + "\n" for path in local))
    return {"BERTH_BUILD_CA_FILE": str(bundle)}


def berth_env() -> dict[str, str]:
    return {
        **build_ca_file(),
        **os.environ,
        "RUST_LOG": os.environ.get("RUST_LOG", "info"),
        "BERTH_STATE_DIR": str(state_dir()),
        "BERTH_CRIU_STATE_DIR": os.environ.get("BERTH_CRIU_STATE_DIR", "/var/lib/berth"),
        "BERTH_INTERPRETER_BIN": str(interpreter_binary()),
        "BERTH_SANDBOX_CIDR": free_sandbox_pool(),
        "BERTH_EGRESS_ALLOW": ",".join(REGISTRIES),
        "BERTH_POOL_SIZE": os.environ.get("BERTH_POOL_SIZE", "1"),
    }


def check_binaries() -> None:
    for binary in (berth_binary(), interpreter_binary()):
        if not os.access(binary, os.X_OK):
            raise SystemExit(f"{binary} is missing: run scripts/test.sh's build steps or set BERTH_BIN / BERTH_INTERPRETER_BIN")


def template_built() -> bool:
    return (state_dir() / "templates" / "manifests" / f"{TEMPLATE}.json").is_file()


def provision() -> float:
    """Builds the template in the state dir (a no-op when it is there); its seconds."""
    check_binaries()
    state = state_dir()
    state.mkdir(parents=True, exist_ok=True)
    import_base(state)
    started = time.monotonic()
    subprocess.run([str(berth_binary()), "provision", "--template", TEMPLATE], env=berth_env(), stdin=subprocess.DEVNULL, check=True)
    return time.monotonic() - started


class Berth:
    """`berth up` on the shared state dir, on a free loopback port."""

    def __init__(self) -> None:
        self.process: Optional[subprocess.Popen] = None
        self.env: dict[str, str] = {}
        self.log_path = state_dir() / "berth-up.log"
        self._reader: Optional[threading.Thread] = None

    def start(self, timeout: float = 600.0) -> dict[str, str]:
        if not template_built():
            provision()
        check_binaries()
        listen = f"127.0.0.1:{free_port()}"
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [str(berth_binary()), "up", "--listen", listen],
            env=berth_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, start_new_session=True,
        )
        found: dict[str, str] = {}
        ready = threading.Event()
        process = self.process

        def read() -> None:
            assert process.stdout is not None
            for raw in process.stdout:
                log.write(raw)
                log.flush()
                match = E2B_LINE.match(raw.decode(errors="replace"))
                if match:
                    found[match.group(1)] = match.group(2)
                    if len(found) == 2:
                        ready.set()
            log.close()
            ready.set()

        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()
        if not ready.wait(timeout) or len(found) < 2:
            self.stop()
            raise RuntimeError(f"berth up did not start; see {self.log_path}")
        key = subprocess.run(
            [str(berth_binary()), "keys", "create", "--name", "interpreter-suite"],
            env=berth_env(), stdin=subprocess.DEVNULL, capture_output=True, text=True, check=True,
        ).stdout.strip().splitlines()[-1]
        self.env = {**found, "E2B_API_KEY": key}
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{found['E2B_API_URL']}/health", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        return self.env

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None and self.env:
            kill_sandboxes(self.env)
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._reader is not None:
            self._reader.join(10)


def kill_sandboxes(env: dict[str, str]) -> None:
    """Kills every sandbox of the suite's key (what a failed test may have left)."""
    headers = {"X-API-Key": env["E2B_API_KEY"]}
    try:
        request = urllib.request.Request(f"{env['E2B_API_URL']}/v2/sandboxes?state=running,paused&limit=100", headers=headers)
        with urllib.request.urlopen(request, timeout=30) as answer:
            sandboxes = json.load(answer)
        for sandbox in sandboxes:
            delete = urllib.request.Request(f"{env['E2B_API_URL']}/sandboxes/{sandbox['sandboxID']}", headers=headers, method="DELETE")
            urllib.request.urlopen(delete, timeout=30).close()
    except OSError:
        pass


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main(argv: list[str]) -> int:
    if argv[:1] == ["provision"]:
        seconds = provision()
        print(f"{TEMPLATE} ready in {state_dir()} ({seconds:.0f}s)")
        return 0
    if argv[:1] == ["run"] and "--" in argv:
        command = argv[argv.index("--") + 1 :]
        berth = Berth()
        env = berth.start()
        try:
            return subprocess.run(command, env={**os.environ, **env}).returncode
        finally:
            berth.stop()
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

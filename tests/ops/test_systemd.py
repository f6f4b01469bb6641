"""`berth install` under a real systemd, then `systemctl stop` and `start` of the unit:
paused sandboxes (with their processes) and snapshots are kept; `systemctl reload`
puts a changed limits file in force without a restart.

PID 1 of this machine is not systemd, so the test boots the host's own systemd (252) as
PID 1 of private pid, mount, uts and ipc namespaces (the suite's network namespace is
shared, so the test reaches the listener): /run, /etc/systemd/system and /etc/default
are private tmpfs mounts there (nothing of the host's /etc changes), its unit search
path is only those plus one test target (`SYSTEMD_UNIT_PATH`: none of the host's units
can start), and its console is a log file. It starts in a group of the test's own
(`berth-systemd-test-<pid>`), its root: itself and the unit go below it in the host's
hierarchies (`init.scope`, `system.slice/berth.service`), which the test removes at the
end with everything else it made. Booted from the root groups, it moved every process
of the host into its `init.scope` and removed every empty group of the `cpu`
hierarchy, the other CI lanes' sandboxes' included (a systemd that is the host's PID 1
does the latter on each reload; the runtime makes such groups again: `Cgroups::attach`)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import warnings
from pathlib import Path
from typing import Iterator
from urllib.parse import quote

import httpx
import pytest

from conftest import Berth, control_plane, poll

SYSTEMD = Path("/lib/systemd/systemd")
# Where systemd reads which group a process is in: its own v1 hierarchy and, on a hybrid
# host, the v2 one.
TRACKING_HIERARCHIES = (Path("/sys/fs/cgroup/systemd"), Path("/sys/fs/cgroup/unified"))
UNIT = "berth.service"


class Systemd:
    """The host's systemd as PID 1 of private namespaces."""

    def __init__(self, work: Path) -> None:
        self.work = work
        units = work / "units"
        units.mkdir()
        # Empty stand-ins for the targets a service's default dependencies and berth's
        # unit name: with them the unit starts and nothing else does.
        for target in ("berth-test", "sysinit", "basic", "shutdown", "multi-user", "network-online"):
            (units / f"{target}.target").write_text(f"[Unit]\nDescription={target} (berth systemd test)\n")
        self.console = work / "console.log"
        self.console.touch()
        boot = work / "boot.sh"
        # systemd takes the group it starts in as its root: one of the test's own in the
        # hierarchies systemd tracks processes in keeps everything it does below it.
        # From the root groups it would move every other process of the host into its
        # `init.scope` and, on cgroup v1, remove every empty group of the `cpu`
        # hierarchy, other daemons' sandboxes' included.
        self.root = f"berth-systemd-test-{os.getpid()}"
        join = "".join(
            f"mkdir -p {hierarchy}/{self.root} && echo $$ > {hierarchy}/{self.root}/cgroup.procs\n"
            for hierarchy in TRACKING_HIERARCHIES
            if hierarchy.is_dir()
        )
        boot.write_text(f"""#!/bin/bash
set -e
{join}mount --make-rprivate /
mount -t tmpfs tmpfs /run
mkdir -p /run/lock
mount -t tmpfs tmpfs /etc/systemd/system
mount -t tmpfs tmpfs /etc/default
mount --bind {self.console} /dev/console
exec env -i container=berth-test SYSTEMD_UNIT_PATH=/etc/systemd/system:{units} \\
    PATH=/usr/sbin:/usr/bin:/sbin:/bin {SYSTEMD} --system --unit=berth-test.target --log-target=console
""")
        boot.chmod(0o755)
        self.unshare = subprocess.Popen(
            ["unshare", "--pid", "--mount", "--uts", "--ipc", "--fork", "--mount-proc", str(boot)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        self.pid = 0

        def booted() -> bool:
            children = Path(f"/proc/{self.unshare.pid}/task/{self.unshare.pid}/children")
            pids = children.read_text().split() if children.exists() else []
            if pids and Path(f"/proc/{pids[0]}/comm").read_text().strip() == "systemd":
                self.pid = int(pids[0])
                return self.run("systemctl", "is-system-running").stdout.strip() in ("running", "degraded")
            return False

        poll(booted, timeout=60, what="systemd to boot as PID 1 of the test's namespaces")

    def run(self, *command: str, input: str | None = None, check: bool = False) -> subprocess.CompletedProcess:
        """Runs `command` in systemd's pid and mount namespaces."""
        result = subprocess.run(
            ["nsenter", "-t", str(self.pid), "-m", "-p", "--", *command],
            input=input, capture_output=True, text=True, timeout=120,
            stdin=None if input is not None else subprocess.DEVNULL,
        )
        if check:
            assert result.returncode == 0, f"{' '.join(command)}: {result.stderr}\n{self.console.read_text()[-4000:]}"
        return result

    def stop(self) -> None:
        """Ends systemd, and with it its pid namespace (stop the units first)."""
        if self.pid:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.unshare.wait(30)
        except subprocess.TimeoutExpired:
            self.unshare.kill()
            self.unshare.wait()
        # Its groups in every hierarchy, deepest first, once empty. The unit's processes
        # (berth up's LXCFS, sandboxes in the hierarchies berth does not manage) may take
        # a while to go on a loaded machine. A group still busy after a minute is named
        # with what is in it.
        groups = sorted(
            (group for top in Path("/sys/fs/cgroup").glob(f"*/{self.root}") for group in [top, *top.rglob("*")]
             if group.is_dir()),
            key=lambda group: len(group.parts),
            reverse=True,
        )
        for group in groups:
            deadline = time.monotonic() + 60
            while True:
                try:
                    group.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as busy:
                    if time.monotonic() > deadline:
                        procs = (group / "cgroup.procs").read_text().split()
                        warnings.warn(f"left {group} ({busy}; processes {procs})")
                        break
                    time.sleep(0.1)


@pytest.fixture
def systemd() -> Iterator[Systemd]:
    if not SYSTEMD.exists() or shutil.which("nsenter") is None:
        pytest.fail(f"{SYSTEMD} and nsenter are needed: apt-get install systemd util-linux")
    work = Path(tempfile.mkdtemp(prefix="berth-systemd-"))
    instance = Systemd(work)
    try:
        yield instance
    finally:
        instance.stop()
        shutil.rmtree(work, ignore_errors=True)


def test_stop_and_start_of_the_installed_unit_keep_paused_sandboxes_and_snapshots(
    systemd: Systemd, berth: Berth, internet
) -> None:
    from e2b import Sandbox

    state_dir = Path(tempfile.mkdtemp(prefix="berth-systemd-state-"))
    templates = berth.state_dir / "templates"
    if templates.is_symlink():
        (state_dir / "templates").symlink_to(templates.resolve())
    listen = f"127.0.0.1:{control_plane.free_loopback_port()}"
    url = f"http://{listen}"
    settings = {
        "BERTH_STATE_DIR": str(state_dir),
        "BERTH_LISTEN": listen,
        "BERTH_POOL_SIZE": "0",
        "BERTH_CRIU_STATE_DIR": os.environ.get("BERTH_CRIU_STATE_DIR", "/var/lib/berth"),
        "BERTH_EGRESS_ALLOW": internet.ceiling,
        "BERTH_DNS_UPSTREAM": f"{internet.dns_ip}:53",
        "BERTH_SANDBOX_CIDR": control_plane.sandbox_network_env()["BERTH_SANDBOX_CIDR"],
        "RUST_LOG": "info",
        "BERTH_CONFIG": str(state_dir / "limits.toml"),
    }
    (state_dir / "limits.toml").write_text("[team_quotas]\nmax_sandboxes = 10\n")
    # berth up's output into a file: this systemd runs no journal.
    service_log = systemd.work / "berth-up.log"
    systemd.run("sh", "-c", f"mkdir -p /etc/systemd/system/{UNIT}.d && cat > /etc/systemd/system/{UNIT}.d/log.conf",
                input=f"[Service]\nStandardOutput=append:{service_log}\nStandardError=append:{service_log}\n",
                check=True)
    # The operator's settings first: `berth install` keeps an env file that exists.
    systemd.run("sh", "-c", "cat > /etc/default/berth",
                input="".join(f"{key}={value}\n" for key, value in settings.items()), check=True)
    key = ""
    try:
        installed = systemd.run(str(berth.binary), "install", "--now", check=True)
        assert "kept /etc/default/berth" in installed.stderr, installed.stderr
        unit = systemd.run("systemctl", "cat", UNIT, check=True).stdout
        assert f"ExecStart={berth.binary} up" in unit and "KillMode=process" in unit
        assert systemd.run("systemctl", "is-enabled", UNIT).stdout.strip() == "enabled"

        def wait_for(condition, what: str) -> None:
            try:
                poll(condition, timeout=300, what=what)
            except AssertionError as timed_out:
                status = systemd.run("systemctl", "status", "--no-pager", "-l", UNIT).stdout
                log = service_log.read_text(errors="replace")[-6000:] if service_log.exists() else "<none>"
                raise AssertionError(f"{timed_out}\n{status}\nberth up's output:\n{log}") from None

        def answering() -> bool:
            try:
                return httpx.get(f"{url}/health", timeout=2).status_code < 500
            except httpx.TransportError:
                return False

        wait_for(answering, "berth up under systemd to answer")
        key = subprocess.run(
            [str(berth.binary), "keys", "create", "--state-dir", str(state_dir)],
            capture_output=True, text=True, check=True, stdin=subprocess.DEVNULL,
        ).stdout.split()[-1]
        sdk = {"api_key": key, "api_url": url, "sandbox_url": url}
        paused = Sandbox.create(timeout=600, **sdk)
        paused.commands.run("echo kept > /home/user/state.txt")
        paused.commands.run("sleep 100000 >/dev/null 2>&1 &")
        paused.pause()
        source = Sandbox.create(timeout=600, **sdk)
        source.commands.run("echo snapped > /home/user/snap.txt")
        snapshot = source.create_snapshot(name="across-restart")
        source.kill()
        main_pid = systemd.run("systemctl", "show", "-p", "MainPID", "--value", UNIT, check=True).stdout.strip()
        # It is systemd's service: berth up runs in the unit's group.
        assert f"name=systemd:/{systemd.root}/system.slice/berth.service" in systemd.run(
            "cat", f"/proc/{main_pid}/cgroup").stdout

        systemd.run("systemctl", "stop", UNIT, check=True)
        assert systemd.run("systemctl", "is-active", UNIT).stdout.strip() == "inactive"
        assert not answering()
        systemd.run("systemctl", "start", UNIT, check=True)
        wait_for(answering, "berth up to answer after systemctl start")
        assert systemd.run("systemctl", "show", "-p", "MainPID", "--value", UNIT).stdout.strip() != main_pid

        resumed = Sandbox.connect(paused.sandbox_id, **sdk)
        assert resumed.commands.run("cat /home/user/state.txt").stdout == "kept\n"
        assert "sleep 100000" in resumed.commands.run("ps -eo args").stdout, "its processes came back from memory"
        restored = Sandbox.create(snapshot.snapshot_id, timeout=300, **sdk)
        assert restored.commands.run("cat /home/user/snap.txt").stdout == "snapped\n"
        restored.kill()
        resumed.kill()

        # `systemctl reload` puts a changed config file in force in the same process.
        started = systemd.run("systemctl", "show", "-p", "MainPID", "--value", UNIT, check=True).stdout.strip()
        (state_dir / "limits.toml").write_text("[team_quotas]\nmax_cpu = 1\n")
        systemd.run("systemctl", "reload", UNIT, check=True)

        def refused() -> bool:
            answer = httpx.post(f"{url}/sandboxes", headers={"X-API-Key": key},
                                json={"templateID": "base", "timeout": 60}, timeout=120)
            if answer.status_code == 201:
                httpx.delete(f"{url}/sandboxes/{answer.json()['sandboxID']}", headers={"X-API-Key": key}, timeout=60)
            return answer.status_code == 429

        poll(refused, timeout=60, what="the reloaded CPU quota to refuse a create")
        assert systemd.run("systemctl", "show", "-p", "MainPID", "--value", UNIT).stdout.strip() == started
    finally:
        if key:
            control_plane.kill_all_sandboxes(url, key)
            for info in httpx.get(f"{url}/snapshots", headers={"X-API-Key": key}, timeout=30).json():
                httpx.delete(f"{url}/templates/{quote(info['snapshotID'], safe='')}",
                             headers={"X-API-Key": key}, timeout=30)
        systemd.run("systemctl", "stop", UNIT)
        control_plane.remove_state_dir(state_dir)

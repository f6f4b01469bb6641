#!/usr/bin/env python3
"""Template build benchmark (not a test): the official Python SDK's `Template` builder
through `berth up`, each row beside what it is compared with, in the same run.

  cold build, 3 RUN steps from `base`   (new step contents each round: nothing cached)
  cached rebuild of the same template   (every step from the step cache)
  create → first command                a built template beside `base` (no warm pool)
  create → first request served         a start-command template (restored from its
                                        checkpoint) beside the same command's cold start
  pull of a 100 MiB image               from a loopback registry, as berth's build logs
                                        time it, beside `skopeo copy` of the same image

Images are made here (umoci, a 100 MiB random layer) and served by Debian's
`docker-registry` on loopback; nothing is pulled from a public registry.

Usage (repo root, as root, after scripts/install-deps.sh and a `berth` build):
  .venv/bin/python bench/templates/bench.py --berth target/dist/berth [--samples 20]
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench" / "speed"))
sys.path.insert(0, str(REPO / "tests" / "templates"))

from bench import Daemon, percentile  # noqa: E402
from conftest import TOOLS, copy_with_libs, start_registry  # noqa: E402


def ms_row(what: str, samples: list[float], versus: str, floor: list[float]) -> str:
    p50, p99 = statistics.median(samples), percentile(samples, 99)
    f50, f99 = statistics.median(floor), percentile(floor, 99)
    return f"| {what} | {p50:.1f} / {p99:.1f} | {versus} | {f50:.1f} / {f99:.1f} | {p50 / f50:.2f}× |"


def big_image(work: Path) -> Path:
    """An OCI layout `big:v1`: the template suite's tiny image plus one 100 MiB random file."""
    layout, bundle = work / "layout", work / "bundle"
    subprocess.run(["umoci", "init", "--layout", str(layout)], check=True)
    subprocess.run(["umoci", "new", "--image", f"{layout}:v1"], check=True)
    subprocess.run(["umoci", "unpack", "--image", f"{layout}:v1", str(bundle)], check=True)
    rootfs = bundle / "rootfs"
    for tool in TOOLS:
        if Path(tool).exists():
            copy_with_libs(tool, rootfs)
    for directory in ["root", "tmp", "home"]:
        (rootfs / directory).mkdir(exist_ok=True)
    (rootfs / "etc").mkdir(exist_ok=True)
    (rootfs / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (rootfs / "etc/group").write_text("root:x:0:\n")
    (rootfs / "blob").write_bytes(os.urandom(100 * 1024 * 1024))
    subprocess.run(["umoci", "repack", "--image", f"{layout}:v1", str(bundle)], check=True)
    return layout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--berth", default=os.environ.get("BERTH_BIN", "target/dist/berth"))
    parser.add_argument("--templates", default="/var/lib/berth/templates")
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    from e2b import Sandbox, Template, wait_for_port

    work = Path(tempfile.mkdtemp(prefix="berth-bench-tpl-"))
    (work / "registry").mkdir()
    registry = start_registry(work / "registry", auth=False)
    daemon = Daemon(args.berth, Path(args.templates), pool_size=0)
    lines = []
    try:
        daemon.use()

        def three_steps(tag: str) -> Template:
            t = Template().from_template("base")
            for step in range(3):
                t = t.run_cmd(f"echo {tag}-{step} > /tmp/step-{step}")
            return t

        cold, cached = [], []
        for round_ in range(args.rounds):
            tag = os.urandom(4).hex()
            started = time.perf_counter()
            Template.build(three_steps(tag), f"bench-3-{tag}")
            cold.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            Template.build(three_steps(tag), f"bench-3-{tag}")
            cached.append((time.perf_counter() - started) * 1000)
        lines.append(ms_row("cold build, 3 RUN steps from `base`", cold, "—", cold))
        lines.append(ms_row("cached rebuild of it", cached, "cold build", cold))
        built = f"bench-3-{tag}"

        def create_run(template: str) -> float:
            started = time.perf_counter()
            sandbox = Sandbox.create(template, timeout=120)
            sandbox.commands.run("true")
            elapsed = (time.perf_counter() - started) * 1000
            sandbox.kill()
            return elapsed

        for template in (built, "base"):
            create_run(template)
        from_built = [create_run(built) for _ in range(args.samples)]
        from_base = [create_run("base") for _ in range(args.samples)]
        lines.append(ms_row("create → first command, built template", from_built, "same from `base`", from_base))

        server = "python3 -m http.server 8000 --directory /tmp"
        Template.build(Template().from_template("base").set_start_cmd(server, wait_for_port(8000)), "bench-web")
        fetch = "curl -s -o /dev/null --retry-connrefused --retry 100 --retry-delay 0 http://127.0.0.1:8000/"

        def first_request(template: str, start: bool) -> float:
            started = time.perf_counter()
            sandbox = Sandbox.create(template, timeout=120)
            if start:
                sandbox.commands.run(f"{server} >/dev/null 2>&1 &")
            sandbox.commands.run(fetch)
            elapsed = (time.perf_counter() - started) * 1000
            sandbox.kill()
            return elapsed

        warm = [first_request("bench-web", False) for _ in range(args.samples)]
        cold_start = [first_request("base", True) for _ in range(args.samples)]
        lines.append(ms_row("create → first request, start-command template", warm, "`base` + the same command started", cold_start))

        layout = big_image(work)
        ref = registry.push(layout, "v1", "bench/big:v1")
        copies = []
        for _ in range(args.rounds):
            target = work / f"copy-{os.urandom(3).hex()}"
            started = time.perf_counter()
            subprocess.run(["skopeo", "copy", "--quiet", "--src-tls-verify=false", f"docker://{ref}", f"oci:{target}:v1"], check=True)
            copies.append((time.perf_counter() - started) * 1000)
            shutil.rmtree(target)
        logs: list[str] = []
        started = time.perf_counter()
        Template.build(Template().from_image(ref), "bench-big", on_build_logs=lambda entry: logs.append(str(entry.message)))
        build_ms = (time.perf_counter() - started) * 1000
        pulled = [float(m.group(1)) * 1000 for line in logs if (m := re.search(r"ready in ([0-9.]+) s", line)) and "layer sha256" in line]
        lines.append(
            f"| pull of a 100 MiB layer (berth's build log) | {sum(pulled):.0f} | `skopeo copy` of the image | "
            f"{statistics.median(copies):.0f} | {sum(pulled) / statistics.median(copies):.2f}× |"
        )
        lines.append(f"| whole build from that image | {build_ms:.0f} | | | |")
    finally:
        daemon.stop()
        registry.process.terminate()
        registry.process.wait(10)
        shutil.rmtree(work, ignore_errors=True)

    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"Command: `.venv/bin/python bench/templates/bench.py --berth {args.berth} --samples {args.samples} --rounds {args.rounds}`")
    print(f"Date (UTC): {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M}; {os.cpu_count()} CPUs; load average {load}\n")
    print("| through the SDK | p50 / p99 ms | compared with (same run) | p50 / p99 ms | ratio |")
    print("|---|---|---|---|---|")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

"""Benchmark (not a test): berth-interpreter round trips, beside a raw-kernel floor.

    bash bench/interpreter/run.sh [N]

Measures, on loopback in a private network namespace:
  - run_code("1+1") through the official SDK (debug mode -> berth-interpreter :49999)
  - POST /execute "1+1" with plain httpx (the server without the SDK's overhead)
  - a matplotlib line plot (PNG + chart data) through the SDK
  - the floor: "1+1" on a bare ipykernel via jupyter_client (kernel_floor.py)
Prints p50/p90/p99 in ms. Reports numbers, asserts nothing.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

os.environ["E2B_DEBUG"] = "true"
os.environ.setdefault("E2B_API_KEY", "e2b_" + "0" * 40)
from e2b_code_interpreter import Sandbox  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
N = int(sys.argv[1]) if len(sys.argv) > 1 else 200
PLOT = "import matplotlib.pyplot as plt\nplt.figure()\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()"


def percentiles(samples):
    ordered = sorted(samples)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]
    return {"n": len(ordered), "p50": round(pick(0.5), 2), "p90": round(pick(0.9), 2), "p99": round(pick(0.99), 2), "mean": round(statistics.mean(ordered), 2)}


def timed(fn, n, warmup=10):
    samples = []
    for i in range(n + warmup):
        started = time.perf_counter()
        fn()
        if i >= warmup:
            samples.append((time.perf_counter() - started) * 1000)
    return samples


def main():
    binary = os.environ.get("BERTH_INTERPRETER_BIN", str(REPO / "target/release/berth-interpreter"))
    prefix = Path(os.environ.get("BERTH_INTERPRETER_PREFIX", REPO / ".interpreter-env"))
    home = Path(os.environ.get("TMPDIR", "/tmp")) / f"berth-interp-bench-{os.getpid()}"
    home.mkdir(parents=True, exist_ok=True)
    server = subprocess.Popen(
        [binary, "--listen", "127.0.0.1:49999", "--jupyter-path", str(prefix / "share/jupyter"),
         "--default-cwd", str(home), "--warm", "python", "--envd-url", ""],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get("http://127.0.0.1:49999/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "server not ready"
            time.sleep(0.05)
        sandbox = Sandbox.create()
        results = {}
        results["sdk_run_code_1plus1_ms"] = percentiles(timed(lambda: sandbox.run_code("1+1"), N))
        with httpx.Client() as client:
            def raw():
                with client.stream("POST", "http://127.0.0.1:49999/execute", json={"code": "1+1"}) as response:
                    for _ in response.iter_lines():
                        pass
            results["http_execute_1plus1_ms"] = percentiles(timed(raw, N))
        results["sdk_matplotlib_plot_ms"] = percentiles(timed(lambda: sandbox.run_code(PLOT), max(20, N // 5), warmup=3))
    finally:
        server.terminate()
        server.wait(timeout=30)
    floor = subprocess.run(
        [str(prefix / "venv/bin/python"), str(Path(__file__).with_name("kernel_floor.py")), str(N)],
        check=True, capture_output=True, text=True,
        env=dict(os.environ, JUPYTER_PATH=str(prefix / "share/jupyter")),
    )
    results["raw_kernel_1plus1_ms"] = percentiles(json.loads(floor.stdout.strip().splitlines()[-1])["raw_kernel_1plus1_ms"])
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

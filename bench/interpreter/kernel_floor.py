"""Floor for the interpreter benchmark: `1+1` straight to an ipykernel over ZeroMQ with
jupyter_client (no HTTP, no berth), same kernelspec as berth-interpreter uses.

Run with the kernels' venv:  .interpreter-env/venv/bin/python bench/interpreter/kernel_floor.py N
Prints one JSON line: {"raw_kernel_1plus1_ms": [...]}.
"""

import json
import os
import sys
import time

from jupyter_client import KernelManager

n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
manager = KernelManager(kernel_name="python3")
manager.start_kernel()
client = manager.client()
client.start_channels()
client.wait_for_ready(timeout=60)
samples = []
try:
    for i in range(n + 10):
        started = time.perf_counter()
        reply = client.execute_interactive("1+1", output_hook=lambda msg: None, timeout=30)
        elapsed = (time.perf_counter() - started) * 1000
        assert reply["content"]["status"] == "ok"
        if i >= 10:
            samples.append(elapsed)
finally:
    client.stop_channels()
    manager.shutdown_kernel(now=True)
print(json.dumps({"raw_kernel_1plus1_ms": samples}))

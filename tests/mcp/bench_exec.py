"""Benchmark (not a test): `e2b_exec` of `true` through MCP (stdio, official Python MCP
client) versus `commands.run("true")` through the E2B Python SDK directly, same sandbox
kind, same `berth up`. Prints p50/p90 of N round trips for each.

    BERTH_BIN=/path/to/berth python tests/mcp/bench_exec.py [N]

Needs the `e2b` package (repo venv) besides `mcp`.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from conftest import stdio_session  # noqa: E402
from test_live import BerthUp, connect_cli, kill_all  # noqa: E402


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    berth = BerthUp(os.environ["BERTH_BIN"])
    state_dir = Path(tempfile.mkdtemp(prefix="berth-mcp-bench-"))
    try:
        connect_cli(state_dir, "bench", berth, berth.api_key)

        async def through_mcp() -> list[float]:
            async with stdio_session(state_dir, "--toolset", "session", user="bench") as session:
                created = await session.call_tool("e2b_create_sandbox", {})
                sandbox_id = created.structured_content["sandbox_id"]
                samples = []
                for index in range(rounds + 10):
                    start = time.perf_counter()
                    result = await session.call_tool("e2b_exec", {"sandbox_id": sandbox_id, "command": "true"})
                    samples.append(time.perf_counter() - start)
                    assert result.structured_content.get("exit_code") == 0, (index, result.structured_content)
                await session.call_tool("e2b_manage_sandbox", {"sandbox_id": sandbox_id, "action": "delete"})
                return samples[10:]

        mcp_samples = anyio.run(through_mcp)

        os.environ.update(berth.env)
        from e2b import Sandbox

        sandbox = Sandbox.create(timeout=600)
        try:
            sdk_samples = []
            for _ in range(rounds + 10):
                start = time.perf_counter()
                sandbox.commands.run("true")
                sdk_samples.append(time.perf_counter() - start)
            sdk_samples = sdk_samples[10:]
        finally:
            sandbox.kill()

        for name, samples in (("MCP e2b_exec", mcp_samples), ("SDK commands.run", sdk_samples)):
            print(
                f"{name:18s} n={len(samples)} p50={percentile(samples, 0.5) * 1000:.2f} ms "
                f"p90={percentile(samples, 0.9) * 1000:.2f} ms mean={statistics.mean(samples) * 1000:.2f} ms"
            )
        print(f"ratio p50 MCP/SDK = {percentile(mcp_samples, 0.5) / percentile(sdk_samples, 0.5):.2f}")
    finally:
        kill_all(berth.api_url, berth.api_key)
        berth.stop()


if __name__ == "__main__":
    main()

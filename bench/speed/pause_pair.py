#!/usr/bin/env python3
"""Pauses without keeping, two builds paired (benchmark, not a test): the pause a build
answers and the CRIU dump inside it, then a resume from the images after a gap.

Two `berth up` daemons run at once, one per build, both with `BERTH_KEEP_PAUSED_SECS=0`
(every resume restores its images), each with one sandbox holding `--mib` MiB resident.
Rounds alternate which build goes first, so a slow spell of the host falls on both. Each
pause is followed by `--gap` seconds, then `Sandbox.connect` → `commands.run("true")`.
Prints the medians per build: pause, its dump, the resume and its restore, and what the
pause spent outside its dump.

Usage (repo root, as root):
  .venv/bin/python bench/speed/pause_pair.py --berth <berth A> --other <berth B> [--mib 512] [--rounds 16]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    bench.add_daemon_args(parser)
    parser.add_argument("--other", required=True, help="the second build's berth binary")
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--gap", type=float, default=2.0, help="seconds between a pause and its resume")
    args = parser.parse_args()

    builds = {"A": args.berth, "B": args.other}
    daemons: dict[str, bench.Daemon] = {}
    try:
        for name, berth in builds.items():
            daemons[name] = bench.Daemon(
                berth, Path(args.templates), pool_size=0, extra_env={"BERTH_KEEP_PAUSED_SECS": "0"}
            )
        boxes = {name: bench.holding_on(daemon, args.mib) for name, daemon in daemons.items()}
        times: dict[str, dict[str, list[float]]] = {
            name: {"pause": [], "dump": [], "resume": [], "restore": []} for name in builds
        }
        for round_no in range(args.rounds):
            for name in ("A", "B") if round_no % 2 == 0 else ("B", "A"):
                daemons[name].use()
                rounds = bench.pause_rounds(daemons[name], boxes[name], 1, kept=False, gap_s=args.gap)
                for what, values in zip(("pause", "resume", "dump", "restore"), rounds):
                    times[name][what].extend(values)
        print(f"{args.mib} MiB resident, {args.rounds} rounds, resume {args.gap} s after each pause; p50 in ms")
        for name, berth in builds.items():
            medians = {what: statistics.median(values) for what, values in times[name].items()}
            outside = statistics.median(p - d for p, d in zip(times[name]["pause"], times[name]["dump"]))
            print(
                f"{name} {berth}: pause {medians['pause']:.1f} (its dump {medians['dump']:.1f}, "
                f"outside it {outside:.1f}); resume → command {medians['resume']:.1f} "
                f"(its restore {medians['restore']:.1f})"
            )
        for name, sandbox in boxes.items():
            daemons[name].use()
            sandbox.kill()
    finally:
        for daemon in daemons.values():
            daemon.stop()


if __name__ == "__main__":
    main()

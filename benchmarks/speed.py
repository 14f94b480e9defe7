"""Simulator speed: wall time, SimPy events and events/s, and how cost grows with requests.

    python benchmarks/speed.py            # healthy.yaml, 2x, 5x and 10x its prompts
    python benchmarks/speed.py --repeat 5

Runs in-process, one scenario at a time, on one core. Wall time excludes interpreter start-up
and imports but includes building the fleet and the DataFrames.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from pathlib import Path

import pdsim

ROOT = Path(__file__).resolve().parents[1]


def measure(path: Path, sets: list[str], repeat: int) -> dict:
    walls = []
    res = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        res = pdsim.run(path, sets=sets)
        walls.append(time.perf_counter() - t0)
    wall = statistics.median(walls)
    s = res.summary
    return {"requests": len(res.requests), "sim_s": s["simulated_s"], "events": s["events"],
            "wall_s": wall, "events_per_s": s["events"] / wall,
            "us_per_request": 1e6 * wall / len(res.requests)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--scales", type=int, nargs="*", default=[1, 2, 5, 10])
    args = ap.parse_args()
    print(f"python {platform.python_version()} on {platform.machine()}, "
          f"median of {args.repeat} runs")
    print(f"{'workload':<34}{'requests':>9}{'sim s':>9}{'events':>10}{'wall s':>9}"
          f"{'events/s':>11}{'us/req':>8}")
    rows = [("drop_timeout.yaml", ROOT / "scenarios/drop_timeout.yaml", [])]
    for k in args.scales:
        sets = [f"clients.0.num_prompts={1000 * k}"]
        rows.append((f"healthy.yaml x{k} prompts", ROOT / "scenarios/healthy.yaml", sets))
    for label, path, sets in rows:
        m = measure(path, sets, args.repeat)
        print(f"{label:<34}{m['requests']:>9}{m['sim_s']:>9.1f}{m['events']:>10}"
              f"{m['wall_s']:>9.3f}{m['events_per_s']:>11.0f}{m['us_per_request']:>8.0f}")


if __name__ == "__main__":
    main()

"""Spread of the incident figures over seeds (drop_timeout.yaml and forward_timeout.yaml).

    python benchmarks/incident_seeds.py --seeds 20
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

import pdsim

ROOT = Path(__file__).resolve().parents[1]


def figures(name: str, seed: int) -> dict:
    s = pdsim.run(ROOT / f"scenarios/{name}.yaml", sets=[f"seed={seed}"]).summary
    b = s["clients"]["ci_bench"]
    return {"scenario": name, "seed": seed,
            "flush_ret_failures": s["transfer_failures_by_reason"]["flush_freed_pages"],
            "blacklisted_pairs": s["blacklisted_pairs_max"], "failed": s["failed"],
            "empty_share": b["empty_share"], "true_tok_s": b["true_output_throughput_tok_s"],
            "reported_tok_s": b["output_throughput_tok_s"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=20)
    args = ap.parse_args()
    rows = [figures(n, s) for n in ("drop_timeout", "forward_timeout")
            for s in range(1, args.seeds + 1)]
    df = pd.DataFrame(rows)
    pd.set_option("display.width", 140)
    for name, g in df.groupby("scenario", sort=False):
        print(f"\n{name}: {len(g)} seeds")
        print(g.drop(columns=["scenario", "seed"]).describe(percentiles=[0.25, 0.5, 0.75])
              .loc[["min", "25%", "50%", "75%", "max"]].round(3).to_string())


if __name__ == "__main__":
    main()

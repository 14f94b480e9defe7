"""Which load makes a post-warmup flush hit about a dozen pairs? (the drop_timeout story)

    python benchmarks/incident_stories.py

bench_serving flushes after its warmup, so the flush hurts only if other traffic is in flight.
Two candidate stories on the incident fleet, flush landing at several offsets, two seeds each:

- eval: the gsm8k eval (1,400 questions, 128 threads, ~1.2k-token prompts) is running when the
  bench starts;
- bench: a first bench run (rate inf, 256 concurrent) is ramping when the second one starts
  (what scenarios/drop_timeout.yaml uses, at 10 s).
"""

from __future__ import annotations

from pathlib import Path

import yaml

import pdsim

ROOT = Path(__file__).resolve().parents[1]


def scenario(story: str, offset: float, seed: int) -> dict:
    d = pdsim.scenario.read_yaml(ROOT / "scenarios/healthy.yaml")
    d = yaml.safe_load(yaml.safe_dump(d))
    d["seed"] = seed
    d.pop("reference", None)
    bench = d["clients"][0]
    bench.update(start_s=offset, flush={"mode": "timeout", "timeout_s": 60}, name="ci_bench")
    if story == "eval":
        other = {"kind": "eval", "name": "gsm8k", "questions": 1400, "threads": 128,
                 "max_tokens": 512,
                 "dataset": {"kind": "random", "input_len": 1200, "output_len": 300,
                             "range_ratio": 0.5}}
    else:
        other = dict(bench, name="first", start_s=0.0)
    d["clients"] = [other, bench]
    return d


def main() -> None:
    print(f"{'story':<7}{'offset s':>9}{'seed':>5}{'in flight':>10}{'pairs':>6}{'failed':>8}"
          f"{'empty':>7}")
    for story in ("eval", "bench"):
        for offset in (5.0, 10.0, 20.0, 30.0):
            for seed in (1, 2):
                s = pdsim.run(scenario(story, offset, seed)).summary
                b = s["clients"]["ci_bench"]
                print(f"{story:<7}{offset:>9g}{seed:>5}{s['flush_doomed_transfers']:>10}"
                      f"{s['blacklisted_pairs_max']:>6}{s['failed']:>8}{b['empty_share']:>7.2f}")


if __name__ == "__main__":
    main()

"""Fuzz driver: many random valid scenarios of the whole surface, each validated, run and
checked (issue #28's "Done when"). Not collected by pytest (no ``test_`` prefix): it runs for
hours at the issue's sizes.

    python tests/fuzz.py --n 2000 --seed 1 --out /tmp/fuzz-1      # one chunk
    nice python tests/fuzz.py --n 2000 --seed 2 --out /tmp/fuzz-2 &  # in the background

It samples the property tests' strategies (``tests/test_properties.scenarios`` and
``colocated_scenarios``: PD and colocated fleets, both clients, traces, profile files, the seven
blacklist policies, the fault kinds and library, declared unknowns, seeds, SLO thresholds, and
one scenario in three with fields at their schema bounds), with
Hypothesis generating only (no shrinking; ``--seed`` fixes the examples). For each scenario:

- validate (``pdsim.load``): accepted, or refused with a one-line ScenarioError;
- run: refused alike when validate refused, never refused when it accepted (a validate/run
  disagreement otherwise), no other exception, and within ``--timeout`` wall seconds;
- the invariants of ``test_properties.check_invariants`` (one terminal bucket and one end per
  request, tokens, KV, monotone time, every prompt accounted for, the time series' totals);
- every ``--rerun``-th accepted scenario runs again: byte-identical tables;
- every ``--explore``-th accepted scenario that declares unknowns is explored (2 samples,
  1 seed, in process): no exception but a one-line refusal of a sampled combination.

Findings go to ``OUT/<kind>-<n>.json`` (the scenario and what went wrong); counts to
``OUT/counts.json`` and stdout. Run from anywhere: it works from the repository's root, where
the strategy's relative paths (traces, profile files) resolve.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


class _Timeout(Exception):
    pass


def _alarm(_signum: int, _frame: object) -> None:
    raise _Timeout


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=200, help="scenarios to draw")
    ap.add_argument("--seed", type=int, default=0, help="Hypothesis seed of the draws")
    ap.add_argument("--out", default="fuzz-out", help="directory for findings and counts")
    ap.add_argument("--timeout", type=float, default=300.0, help="wall seconds per run")
    ap.add_argument("--rerun", type=int, default=8, help="rerun every Nth accepted scenario "
                    "for byte-identical outputs (0: never)")
    ap.add_argument("--explore", type=int, default=10, help="explore every Nth accepted "
                    "scenario that declares unknowns (0: never)")
    args = ap.parse_args(argv)
    os.chdir(ROOT)
    import test_properties as props
    from conftest import watch_ends
    from hypothesis import HealthCheck, Phase, given, seed, settings
    from hypothesis import strategies as st

    import pdsim

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    counts: Counter = Counter()
    t0 = time.monotonic()
    signal.signal(signal.SIGALRM, _alarm)

    def finding(kind: str, d: dict, what: str) -> None:
        counts[kind] += 1
        path = out / f"{kind}-{counts[kind]}.json"
        path.write_text(json.dumps({"what": what, "scenario": d}, indent=1, default=repr))
        print(f"[{counts['drawn']}] {kind}: {what.splitlines()[-1][:300]} ({path})",
              flush=True)

    def one(d: dict) -> None:
        counts["drawn"] += 1
        try:
            signal.setitimer(signal.ITIMER_REAL, args.timeout)
            try:
                pdsim.load(d)
            except pdsim.ScenarioError as err:
                counts["refused"] += 1
                msg = str(err)
                if "\n" in msg:
                    finding("multiline", d, msg)
                try:
                    pdsim.run(d)
                except pdsim.ScenarioError as again:
                    if str(again) != msg:
                        finding("disagree", d, f"validate: {msg}\nrun: {again}")
                else:
                    finding("disagree", d, f"validate refused ({msg}) and run ran")
                return
            try:
                with watch_ends() as watch:
                    res = pdsim.run(d)
            except pdsim.ScenarioError as err:
                finding("disagree", d, f"validate accepted, run refused: {err}")
                return
            counts["ran"] += 1
            twice = watch.ended_twice()
            if twice:
                rid, writes = next(iter(twice.items()))
                finding("ended_twice", d, f"{len(twice)} requests, e.g. rid {rid}: {writes}")
            try:
                props.check_invariants(res)
            except AssertionError:
                finding("invariant", d, traceback.format_exc())
            if args.rerun and counts["ran"] % args.rerun == 0:
                counts["reruns"] += 1
                if props._tables(pdsim.run(d)) != props._tables(res):
                    finding("nondeterministic", d, "a rerun gave other tables")
            if res.scenario.unknowns and args.explore:
                counts["declared"] += 1
                if counts["declared"] % args.explore == 0:
                    counts["explored"] += 1
                    try:
                        ex = pdsim.explore(d, samples=2, seeds=1, workers=1, progress=False)
                    except pdsim.ScenarioError as err:  # (a combination of ends: documented)
                        counts["explore_refused"] += 1
                        if "\n" in str(err):
                            finding("multiline", d, str(err))
                    else:
                        if len(ex.runs) != 2:
                            finding("explore", d, f"{len(ex.runs)} runs, not 2")
        except _Timeout:
            finding("timeout", d, f"over {args.timeout:g} s")
        except Exception:  # a crash: anything run or validate should not raise
            finding("crash", d, traceback.format_exc())
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            if counts["drawn"] % 100 == 0:
                print(f"{counts['drawn']} drawn in {time.monotonic() - t0:.0f} s: "
                      f"{dict(counts)}", flush=True)

    run_all = settings(max_examples=args.n, deadline=None, database=None, derandomize=False,
                       phases=[Phase.generate], suppress_health_check=list(HealthCheck))(
        seed(args.seed)(given(st.one_of(props.scenarios(), props.colocated_scenarios()))(one)))
    run_all()
    counts["wall_s"] = round(time.monotonic() - t0)
    (out / "counts.json").write_text(json.dumps(dict(counts), indent=1) + "\n")
    print(json.dumps(dict(counts)))
    bad = sum(counts[k] for k in ("crash", "disagree", "invariant", "ended_twice", "multiline",
                                  "nondeterministic", "timeout"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""The what-if as a decision: capacity, loads chosen from it, and which policy to run.

    s = pdsim.analysis.study.study("scenarios/whatif_base.yaml")     # the CLI's default
    s.capacity.describe()       # how the capacity was measured
    s.conditions["0.9x"]        # a WhatIf per load (fractions of capacity, and "closed")
    s.recommendation            # condition x metric x fault mix -> best or tied-best policies
    print(s.render())           # what `pdsim whatif` prints
    s.write("out/"); Study.read("out/")

A *condition* is a load: an open-loop (Poisson) rate at a fraction of the measured capacity,
or the incident's closed loop (256 requests in flight, the load bounded by time: enough prompts
that the clients are still busy at the end of the last window). Under each, every policy meets
every fault with the same seeds (:mod:`pdsim.analysis.whatif`); the verdict for a condition,
a decision metric and a fault mix follows the tie rule of :mod:`pdsim.analysis.verdict`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from pdsim.analysis import capacity as cap_mod
from pdsim.analysis import verdict as vd
from pdsim.analysis import windows as win
from pdsim.analysis.whatif import (
    expand_faults,
    expand_policies,
    pd_only,
    prepare,
    run_conditions,
    with_policy,
)
from pdsim.analysis.whatif_table import WhatIf
from pdsim.config import loader
from pdsim.util.backends import MAX_RUNS

DEFAULT_POLICIES: list = ["permanent", "v0_5_23", "never",
                          {"policy": "ttl", "ttl_s": [3, 10, 30, 120]}, "circuit_breaker"]
"""The what-if's default policies: SGLang's one-strike list (0.5.14-0.5.22), what 0.5.23 ships
(probe with backoff, idle drop), no list, TTLs from 3 s to 4x the 30 s transfer timeout (PR
#35823 proposes a TTL, no value), and a circuit breaker at its defaults."""
DEFAULT_FAULTS = ["flush_race", "decode_crash", "decode_hang", "decode_nic_down", "nic_flaps",
                  "nic_degraded", "partition", "transient_errors"]
DEFAULT_LOADS: list = [0.3, 0.6, 0.9, "closed"]
DEFAULT_SEEDS = 4
CAPACITY_SEEDS = (1, 2)
CLOSED_CONCURRENCY = 256  # the incident's CI bench: --max-concurrency 256, rate inf
CLOSED_PROMPTS_PER_S = 2.0  # closed loop: prompts = this x capacity x horizon (never runs out)
KEEPS_OUT = ("permanent", "probe", "v0_5_23", "ttl")  # keep a pair out after one failure


def parse_loads(raw: Sequence[Any]) -> list:
    """Loads as given (``0.3``, ``"closed"``): fractions in (0, 2], each once."""
    out: list = []
    for x in raw:
        if isinstance(x, str) and x.strip() == "closed":
            v: Any = "closed"
        else:
            try:
                v = float(x)
            except (TypeError, ValueError):
                raise ValueError(f"load {x!r}: give fractions of capacity (0.3) or 'closed'"
                                 ) from None
            if not (0 < v <= 2):
                raise ValueError(f"load {x!r}: give a fraction of capacity in (0, 2]")
        if v in out:
            raise ValueError(f"load {x!r} given twice")
        out.append(v)
    if not out:
        raise ValueError("give at least one load")
    return out


def label(load: Any) -> str:
    return "closed" if load == "closed" else f"{load:g}x"


@dataclass
class Study:
    """Capacity, a :class:`WhatIf` per load, and the recommendation they give."""

    capacity: cap_mod.Capacity
    conditions: dict[str, WhatIf]
    loads: dict[str, str]  # condition -> what it is ("open loop 13.5 req/s (0.3 x capacity)")
    command: str = ""
    recommendation: pd.DataFrame = field(init=False)

    def __post_init__(self) -> None:
        self.recommendation = self.recommend()

    def recommend(self, policies: Sequence[str] | None = None) -> pd.DataFrame:
        """Condition x metric x fault mix -> best or tied-best, among ``policies`` (default:
        every policy run; regret is then against the best of those)."""
        rows = []
        for cond, w in self.conditions.items():
            for metric in vd.METRICS:
                for mix in vd.MIXES:
                    v = w.verdict(metric, mix, policies)
                    if not v.known:
                        continue
                    t = v.table.set_index("policy")
                    rows.append({"condition": cond, "metric": metric, "mix": mix,
                                 "best": v.best, "seeds": v.n_seeds,
                                 "detail": [(p, t.regret[p], t.lo[p], t.hi[p])
                                            for p in v.best]})
        return pd.DataFrame(rows)

    def per_fault(self, metric: str = "goodput", variants: bool = False) -> pd.DataFrame:
        """Condition x fault -> best or tied-best (the nominal faults, or the variants of
        their declared unknowns beside the fault they vary)."""
        rows = []
        for cond, w in self.conditions.items():
            faults = list(w.variants) if variants else w.nominal_faults
            for f in faults:
                v = w.verdict(metric, f)
                if v.known:
                    rows.append({"condition": cond, "fault": f, "varies": w.variants.get(f, ""),
                                 "best": v.best})
        return pd.DataFrame(rows)

    def dominant(self, metrics: Sequence[str] = tuple(vd.METRICS)) -> tuple[list[str], dict]:
        """Policies best or tied-best in every row of the recommendation (for ``metrics``),
        and for each other policy a row where it is not."""
        r = self.recommendation[self.recommendation.metric.isin(metrics)]
        labels = next(iter(self.conditions.values())).labels if self.conditions else []
        always = [p for p in labels if all(p in b for b in r.best)]
        missing = {}
        for p in labels:
            if p in always:
                continue
            miss = r[[p not in b for b in r.best]]
            if len(miss):
                x = miss.iloc[0]
                missing[p] = f"{x.condition}, {x.metric}, {x['mix']}"
        return always, missing

    def keeps_out(self) -> list[str]:
        """The policies run that keep a pair out after one failure (the blacklist stays):
        SGLang's one strike, its probes, 0.5.23's and the TTLs (:data:`KEEPS_OUT`)."""
        labels = next(iter(self.conditions.values())).labels if self.conditions else []
        return [p for p in labels if p.split("(")[0] in KEEPS_OUT]

    def if_stays(self) -> tuple[list[str], pd.DataFrame, list[str], dict[str, int]]:
        """'If the blacklist stays': the policies that keep a pair out, the recommendation
        among them alone (regret against the best of them), those best or tied-best in every
        row, and the rows in which each is."""
        keep = self.keeps_out()
        if not keep:
            return [], pd.DataFrame(), [], {}
        r = self.recommend(keep)
        counts = {p: int(sum(p in b for b in r.best)) for p in keep}
        return keep, r, [p for p in keep if counts[p] == len(r) and len(r)], counts

    # --- text ----------------------------------------------------------------------------

    def answer(self) -> str:
        """The recommendation: condition x metric x fault mix -> best or tied-best, and
        whether a single policy is best or tied-best everywhere."""
        lines = ["Recommendation: best or tied-best policy per condition, metric and fault mix "
                 "(regret, mean over seeds [95% bootstrap interval])"]
        r = self.recommendation
        if r.empty:
            return "\n".join([*lines, "  nothing to decide (no runs)"])
        lines.append(f"  {'load':<7} {'metric':<10} {'fault mix':<9}  best or tied-best")
        for x in r.itertuples():
            best = "; ".join(f"{p} {vd.fmt_iv(a, lo, hi)}" for p, a, lo, hi in x.detail)
            lines.append(f"  {x.condition:<7} {x.metric:<10} {x.mix:<9}  {best}")
        lines.append("loads: " + "; ".join(f"{k} = {v}" for k, v in self.loads.items()))
        lines.append("metrics: " + "; ".join(f"{k}: {v[2]}" for k, v in vd.METRICS.items()))
        lines.append("fault mix: worst = the fault with the largest mean regret; mean = equal "
                     "weights over the faults")
        lines.append(f"ties: {vd.RULE}")
        always, missing = self.dominant()
        if always:
            lines.append(f"=> {', '.join(always)}: best or tied-best under every condition, "
                         f"metric and fault mix above.")
        else:
            labels = next(iter(self.conditions.values())).labels
            n = {p: int(sum(p in b for b in r.best)) for p in labels}
            most = max(n.values())
            lines.append("=> no single policy is best or tied-best under every condition: " +
                         "; ".join(f"{p} is not at {where}" for p, where in missing.items()) +
                         f". In most rows ({most} of {len(r)}): " +
                         ", ".join(p for p in labels if n[p] == most))
        keep, r2, best2, counts = self.if_stays()
        if len(keep) > 1 and len(r2):
            lines.append(f"=> if the blacklist stays (among {', '.join(keep)}; regret against "
                         f"the best of them): " + (
                             f"{', '.join(best2)} best or tied-best in every row"
                             if best2 else "none of them is best or tied-best in every row")
                         + "; rows in which each is: " + ", ".join(
                             f"{p} {k} of {len(r2)}"
                             for p, k in sorted(counts.items(), key=lambda kv: -kv[1])))
        return "\n".join(lines)

    def render(self, tables: bool = True) -> str:
        lines = [self.capacity.describe(), ""]
        if tables:
            for cond, w in self.conditions.items():
                lines.append(f"=== {cond}: {self.loads[cond]} ===")
                lines.append(w.render())
                lines.append("")
        v = self.per_fault(variants=True)
        if len(v):
            lines.append("Across the faults' declared unknowns (goodput, best or tied-best "
                         "per variant; the nominal fault's beside it):")
            nominal = self.per_fault()
            nb = {(x.condition, x.fault): x.best for x in nominal.itertuples()}
            for x in v.itertuples():
                lines.append(f"  {x.condition:>7} {x.fault}: {', '.join(x.best)}  (nominal "
                             f"{x.varies}: {', '.join(nb.get((x.condition, x.varies), []))})")
            lines.append("")
        lines.append(self.answer())
        return "\n".join(lines)

    # --- export --------------------------------------------------------------------------

    def write(self, out: str | Path, formats: Sequence[str] = ("csv",)) -> list[Path]:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        written = []
        for cond, w in self.conditions.items():
            written += w.write(out / cond, formats)
        rec = self.recommendation.assign(
            best=["; ".join(b) for b in self.recommendation.best],
            detail=[json.dumps([[p, a, lo, hi] for p, a, lo, hi in d])
                    for d in self.recommendation.detail])
        rec.to_csv(out / "recommendation.csv", index=False)
        meta = {"capacity": self.capacity.as_dict(), "loads": self.loads,
                "command": self.command, "conditions": list(self.conditions)}
        (out / "study.json").write_text(json.dumps(meta, indent=1) + "\n")
        return [*written, out / "recommendation.csv", out / "study.json"]

    @classmethod
    def read(cls, out: str | Path, conditions: Sequence[str] | None = None) -> Study:
        out = Path(out)
        meta = json.loads((out / "study.json").read_text())
        names = [c for c in meta["conditions"] if conditions is None or c in conditions]
        conds = {c: WhatIf.read(out / c) for c in names}
        return cls(cap_mod.Capacity.from_dict(meta["capacity"]), conds,
                   {c: meta["loads"][c] for c in names}, meta.get("command", ""))


# --- running ----------------------------------------------------------------------------------


def plan_of(base: str | Path | dict, fset: dict[str, list], pols: list, sets: Sequence[str],
            timeline: win.Timeline, allow_outside_paths: bool = False,
            t_end: float | None = None) -> win.Plan:
    """The windows the faults give (the same for every load)."""
    data = loader.as_data(base, allow_outside_paths)
    if sets:
        data = loader.apply_overrides(data, list(sets))
    pd_only(data)
    spans = {}
    for fault, items in fset.items():
        d = with_policy(data, {"faults": items, "blacklist": pols[0][1]})
        spans[fault] = win.fault_span(loader.load(d).faults)
    return win.plan(spans, timeline, t_end)


def condition_sets(load: Any, rate: float, horizon: float) -> tuple[list[str], str]:
    """The --set overrides of one load, and what it is in words."""
    if load == "closed":
        n = math.ceil(CLOSED_PROMPTS_PER_S * rate * horizon) + CLOSED_CONCURRENCY
        return (["clients.0.request_rate=inf",
                 f"clients.0.max_concurrency={CLOSED_CONCURRENCY}",
                 f"clients.0.num_prompts={n}"],
                f"closed loop, {CLOSED_CONCURRENCY} in flight (rate inf), {n:,} prompts: the "
                f"clients are busy to the end")
    r = float(f"{load * rate:.3g}")
    return ([f"clients.0.request_rate={r!r}", "clients.0.max_concurrency=null"],
            f"open loop (Poisson) {r:g} req/s = {load:g} x capacity")


def study(base: str | Path | dict, policies: Sequence = DEFAULT_POLICIES,
          faults: Sequence[str] | dict | None = DEFAULT_FAULTS, seeds: Sequence[int] = (),
          loads: Sequence[Any] = DEFAULT_LOADS, *, capacity: float | cap_mod.Capacity | None
          = None, capacity_seeds: Sequence[int] = CAPACITY_SEEDS,
          timeline: win.Timeline | None = None, across_unknowns: bool = False,
          sets: Sequence[str] = (), workers: int | None = None, progress: bool = True,
          plugins: Sequence[str] = (), command: str = "", backend: str = "process",
          address: str | None = None, use_cache: bool = True,
          allow_outside_paths: bool = False, t_end: float | None = None) -> Study:
    """Measure capacity (or take ``capacity``), then run every policy x fault x seed at each
    load. ``seeds`` default: 1..DEFAULT_SEEDS; ``t_end``: end the span no earlier than this
    (to run fault sets beside another matrix's, on its windows)."""
    tl = timeline or win.Timeline()
    seeds = list(seeds) or list(range(1, DEFAULT_SEEDS + 1))
    pols = expand_policies(policies)
    fset = expand_faults(faults)
    loads = parse_loads(loads)
    if (n := len(loads) * len(seeds) * (1 + len(pols) * (1 + len(fset)))) > MAX_RUNS:
        raise ValueError(f"loads x policies x faults x seeds: {n:,} runs; at most {MAX_RUNS:,}")
    plan = plan_of(base, fset, pols, sets, tl, allow_outside_paths, t_end)
    if isinstance(capacity, cap_mod.Capacity):
        cap = capacity
    elif capacity is not None:
        cap = cap_mod.Capacity(float(capacity), math.nan, math.nan, [], math.nan,
                               (tl.steady_s, plan.t_end), plan.horizon, {}, [], "given")
    else:
        cap = cap_mod.measure(base, (tl.steady_s, plan.t_end), plan.horizon, capacity_seeds,
                              sets, workers=workers, progress=progress, use_cache=use_cache,
                              allow_outside_paths=allow_outside_paths)
    conds, words = [], {}
    for load in loads:
        over, words[label(load)] = condition_sets(load, cap.rate, plan.horizon)
        conds.append(prepare(base, pols, fset, seeds, [*sets, *over], plugins, timeline=tl,
                             label=label(load), across_unknowns=across_unknowns,
                             allow_outside_paths=allow_outside_paths, t_end=plan.t_end))
    ws = run_conditions(conds, pols, workers, progress, plugins, command, backend=backend,
                        address=address, base=str(base) if not isinstance(base, dict) else "")
    return Study(cap, {c.label: w for c, w in zip(conds, ws, strict=True)}, words, command)

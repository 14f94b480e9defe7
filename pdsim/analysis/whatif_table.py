"""The what-if's decisions: :class:`WhatIf`, made of the runs of one condition (a base and its
load; :func:`pdsim.analysis.whatif.whatif` runs it), scores each policy against each fault over
fixed windows (means over seeds with 95% bootstrap intervals; regret against the best policy
at the same fault and seed), ranks them under a stated tie rule (:mod:`pdsim.analysis.verdict`),
prints the table, saves and reads it, and draws its plots (:mod:`pdsim.analysis.whatif_plots`).
Every column is defined in :data:`COLUMNS` (``legend()``: the CLI's help)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pdsim.analysis import verdict as vd
from pdsim.analysis import windows as win
from pdsim.analysis.whatif_plots import PlotsMixin

FRAMES = ("table", "ranking", "runs", "healthy", "timelines")  # WhatIf.write's tables

COLUMNS: dict[str, str] = {
    "policy": "blacklist policy and its parameters (label: every parameter given, and the "
              "policy's own at their defaults, e.g. ttl(ttl_s=30))",
    "fault": "fault library entry (or your fault set; name[key=value]: the set at another "
             "value of one of its declared unknowns) the run suffered",
    "seeds": "seeds run for this row",
    "goodput_tok_s": "SLO goodput over the span: output tokens/s of the requests that "
                     "completed in it within the scenario's SLO (slo: ttft_ms, tpot_ms; none "
                     "set: every completed request), over a fixed window, never the run's "
                     "length",
    "goodput_lost_pct": "goodput lost against the same seed without faults (and the same "
                        "policy, when the base fails transfers without faults), in % of "
                        "healthy, over the same span",
    "span_attainment": "SLO attainment: share of the requests arriving in the span that met "
                       "the SLO",
    "span_completed_tok_s": "output tokens/s of every request that completed in the span, "
                            "SLO or not (work done)",
    "during_goodput_tok_s": "SLO goodput in the fault's own window (n/a: an instant fault)",
    "lasting_goodput_tok_s": "SLO goodput in the lasting-harm window: the timeline's "
                             "lasting_s after its recovery_s past the fault's end (n/a: the "
                             "fault does not end in the run)",
    "lasting_lost_pct": "lasting-harm goodput lost against healthy, in % of healthy",
    "failed": "requests arriving in the span that failed or timed out",
    "wasted_prefill_tokens": "prefill tokens computed for requests that then failed (whole "
                             "run)",
    "fast_fails": "requests the blacklist failed without a write ('Decode instance could be "
                  "dead'; whole run)",
    "dead_peer_writes": "KV writes sent to a peer that was gone or silent (whole run; a "
                        "request's first failed write ends its transfer); each holds a "
                        "transfer queue for the engine's failure time",
    "dead_peer_write_s": "transfer-queue seconds those writes held",
    "ret_failures": "failed transfer writes the blacklist counted (ret != 0) and pairs it "
                    "blacklisted (any in a healthy run gives every policy healthy runs of its "
                    "own)",
    "ttft_p99_s": "99th percentile of time to first token of the requests arriving in the "
                  "span that completed, s",
    "recover_s": "seconds from the fault's end until goodput (10 s windows) is back within "
                 "10% of healthy; inf (printed: never): not within the run; nan (n/a): the "
                 "fault lasts the run",
    "max_healthy_blacklisted_s": "longest stretch a healthy (prefill rank, decode session) "
                                 "pair stayed blacklisted",
    "healthy_blacklisted_pair_s": "pair-seconds healthy pairs spent blacklisted, summed",
    "regret_pct": "goodput regret: the best policy's goodput at the same fault and seed minus "
                  "this one's, in % of that seed's healthy goodput (this policy's own healthy "
                  "run when it has them); mean over seeds (paired: every policy meets the same "
                  "seed's arrivals and faults)",
    "attainment_regret_pp": "the same for SLO attainment, in points",
    "throughput_regret_pct": "the same for completed tokens/s over the span, in % of healthy",
    "lasting_regret_pct": "the same for lasting-harm goodput, in % of healthy",
    "rank": "rank of the policy for this fault by goodput regret under the tie rule (1: best "
            "or tied-best; see the rule printed with the table)",
}
STATS_NOTE = ("each metric: mean over seeds, _lo/_hi its 95% percentile bootstrap interval "
              "(seeds resampled with replacement, the same resample for every policy); "
              "recover_s: median, _lo/_hi the fewest and most seconds over seeds")
METRICS = ["goodput_tok_s", "goodput_lost_pct", "span_attainment", "span_completed_tok_s",
           "during_goodput_tok_s",
           "lasting_goodput_tok_s", "lasting_lost_pct", "failed", "wasted_prefill_tokens",
           "fast_fails", "dead_peer_writes", "dead_peer_write_s", "ttft_p99_s", "recover_s",
           "max_healthy_blacklisted_s", "healthy_blacklisted_pair_s"]
REGRET = {"goodput": ("regret_pct", "rank"), "attainment": ("attainment_regret_pp",
                                                            "attainment_rank"),
          "throughput": ("throughput_regret_pct", "throughput_rank"),
          "lasting": ("lasting_regret_pct", "lasting_rank")}


@dataclass
class WhatIf(PlotsMixin):
    """Runs, the decision table, the ranking, and the plots of one what-if condition."""

    runs: pd.DataFrame  # one row per (policy, fault, seed), with the goodput series
    healthy: pd.DataFrame  # one row per (seed[, policy], fault): a healthy run's windows
    policies: list[tuple[str, dict]]
    faults: dict[str, list]
    base: str = ""
    command: str = ""
    plan: win.Plan | None = None
    condition: str = ""
    variants: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    table: pd.DataFrame = field(init=False)
    ranking: pd.DataFrame = field(init=False)
    _cubes: dict = field(init=False, default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if len(self.healthy) and "fault" not in self.healthy:  # one healthy run per seed,
            self.healthy = pd.concat([self.healthy.assign(fault=f) for f in self.faults],
                                     ignore_index=True)  # seen through every fault's windows
        self.table = self._table()
        self.ranking = self._ranking()

    # --- the figures ---------------------------------------------------------------------

    @property
    def labels(self) -> list[str]:
        return [lbl for lbl, _ in self.policies]

    @property
    def seeds(self) -> list[int]:
        return sorted(set(self.runs.seed)) if len(self.runs) else []

    @property
    def nominal_faults(self) -> list[str]:
        """The fault sets a fault mix is over (not the variants of declared unknowns)."""
        return [f for f in self.faults if f not in self.variants]

    def cube(self, metric: str, faults: Sequence[str] | None = None,
             policies: Sequence[str] | None = None) -> np.ndarray:
        """Regret R[policy, fault, seed] of a decision metric (:data:`verdict.METRICS`),
        against the best of ``policies`` (default: all)."""
        col, unit, _ = vd.METRICS[metric]
        if col not in self._cubes:  # the values once per column; regret per subset
            self._cubes[col] = vd.value_cubes(self.runs, self.healthy, col, self.labels,
                                              list(self.faults), self.seeds)
        v, h = self._cubes[col]
        pi = [self.labels.index(p) for p in (policies or self.labels)]
        fi = [list(self.faults).index(f) for f in (faults or self.faults)]
        return vd.regret(v[pi][:, fi], h[pi][:, fi], unit)

    def verdict(self, metric: str = "goodput", mix: str = "worst",
                policies: Sequence[str] | None = None) -> vd.Verdict:
        """The policies (or ``policies`` only) under a fault mix ("worst", "mean" over the
        nominal faults, or one fault's name) by the tie rule."""
        labels = list(policies or self.labels)
        if mix in ("worst", "mean"):
            return vd.decide(self.cube(metric, self.nominal_faults, policies), labels, mix)
        faults = list(self.faults)
        if mix not in faults:
            raise ValueError(f"no fault {mix!r} in this matrix: {', '.join(faults)}")
        return vd.decide(self.cube(metric, [mix], policies), labels, 0)

    def _table(self) -> pd.DataFrame:
        if self.runs.empty:
            return pd.DataFrame()
        seeds = self.seeds
        idx = vd.boot_index(len(seeds))
        rows = []
        by = self.runs.groupby(["fault", "policy"], sort=False)
        for (fault, policy), g in by:
            g = g.set_index("seed").reindex(seeds)
            row: dict[str, Any] = {"policy": policy, "fault": fault,
                                   "seeds": int(g.goodput_tok_s.notna().sum())}
            for m in METRICS:
                if m not in g:
                    continue
                v = g[m].to_numpy(float)
                if m == "recover_s":  # nan: no end in the run; inf: never recovered
                    known = v[~np.isnan(v)]
                    row[m], row[f"{m}_lo"], row[f"{m}_hi"] = (
                        (float(np.median(known)), float(known.min()), float(known.max()))
                        if len(known) else (math.nan,) * 3)
                    continue
                row[m], row[f"{m}_lo"], row[f"{m}_hi"] = vd.mean_ci(v, idx)
            rows.append(row)
        t = pd.DataFrame(rows)
        for metric, (col, rank) in REGRET.items():
            for fault in self.faults:
                v = self.verdict(metric, fault).table.set_index("policy")
                sel = t.fault == fault
                t.loc[sel, col] = t.loc[sel, "policy"].map(v.regret)
                t.loc[sel, f"{col}_lo"] = t.loc[sel, "policy"].map(v.lo)
                t.loc[sel, f"{col}_hi"] = t.loc[sel, "policy"].map(v.hi)
                t.loc[sel, rank] = t.loc[sel, "policy"].map(v["rank"])
        order = {lbl: i for i, lbl in enumerate(self.labels)}
        t["_p"] = t.policy.map(order)
        t["_f"] = t.fault.map({f: i for i, f in enumerate(self.faults)})
        return t.sort_values(["_f", "_p"]).drop(columns=["_p", "_f"]).reset_index(drop=True)

    def _ranking(self) -> pd.DataFrame:
        """Per policy: worst-case and mean goodput regret over the nominal faults, each with
        its interval and rank by the tie rule; the faults it is best or tied-best at."""
        t = self.table
        if t.empty:
            return pd.DataFrame()
        worst, mean = self.verdict("goodput", "worst").table, self.verdict("goodput",
                                                                          "mean").table
        cube = self.cube("goodput", self.nominal_faults)
        with vd._quiet():
            per_fault = np.nanmean(cube, axis=-1)
        nominal = self.nominal_faults
        won = t[t.fault.isin(nominal)].groupby("policy")["rank"].apply(lambda x: int((x == 1)
                                                                                    .sum()))
        rows = []
        for i, p in enumerate(self.labels):
            w, m = worst.iloc[i], mean.iloc[i]
            pf = per_fault[i]
            at = ("n/a" if not np.isfinite(pf).any()
                  else "none" if np.nanmax(pf) <= 0 else nominal[int(np.nanargmax(pf))])
            rows.append({"policy": p, "rank": w["rank"], "worst_regret_pct": w.regret,
                         "worst_regret_pct_lo": w.lo, "worst_regret_pct_hi": w.hi,
                         "worst_fault": at, "mean_rank": m["rank"],
                         "mean_regret_pct": m.regret, "mean_regret_pct_lo": m.lo,
                         "mean_regret_pct_hi": m.hi, "faults_best_or_tied": int(won.get(p, 0))})
        r = pd.DataFrame(rows)
        r["_k"] = r["rank"].fillna(math.inf)
        r = r.sort_values(["_k", "worst_regret_pct", "mean_regret_pct"], kind="stable",
                          na_position="last")
        return r.drop(columns="_k").reset_index(drop=True)

    # --- text ----------------------------------------------------------------------------

    def header(self) -> list[str]:
        """The condition, its windows and what the what-if set in the base."""
        lines = []
        name = f"condition {self.condition}: " if self.condition else ""
        if self.plan is not None:
            lines.append(f"{name}windows ({self.plan.timeline.describe()}; span "
                         f"{self.plan.timeline.steady_s:g}-{self.plan.t_end:g} s):")
            with pd.option_context("display.width", 200, "display.max_colwidth", 60):
                lines.append(pd.DataFrame(self.plan.table()).to_string(index=False))
        if self.notes:
            lines.append("set in the base for these runs: " + "; ".join(self.notes))
        return lines

    def render(self) -> str:
        """The decision table and the ranking, as the CLI prints them."""
        t = self.table
        if t.empty:
            return "no runs"
        lines = self.header()
        h = self.healthy
        hg = h.drop_duplicates([c for c in ("policy", "seed") if c in h]).goodput_tok_s
        lines.append(f"healthy (no faults{', each policy its own' if 'policy' in h else ''}): "
                     f"SLO goodput over the span {np.mean(hg):,.0f} tok/s (mean of "
                     f"{h.seed.nunique()} seed(s))")
        lines += self._not_started()
        recs = t.to_dict("records")
        show = pd.DataFrame({
            "fault": t.fault, "policy": t.policy,
            "goodput tok/s": [_iv(r, "goodput_tok_s", 0) for r in recs],
            "lost %": [_iv(r, "goodput_lost_pct", 1) for r in recs],
            "attain": [_iv(r, "span_attainment", 3) for r in recs],
            "lasting lost %": [_iv(r, "lasting_lost_pct", 1) for r in recs],
            "failed": [_iv(r, "failed", 0) for r in recs],
            "p99 TTFT s": [_iv(r, "ttft_p99_s", 1) for r in recs],
            "regret %": [_iv(r, "regret_pct", 1) for r in recs],
            "rank": [_rank(x) for x in t["rank"]]})
        with pd.option_context("display.width", 250, "display.max_columns", 30,
                               "display.max_rows", 1000, "display.max_colwidth", 60):
            lines.append(show.to_string(index=False))
            lines.append("")
            lines.append("ranking by worst-case goodput regret across the faults "
                         f"({', '.join(self.nominal_faults)}):")
            r = self.ranking
            lines.append(pd.DataFrame({
                "rank": [_rank(x) for x in r["rank"]], "policy": r.policy,
                "worst regret %": [vd.fmt_iv(a, b, c) for a, b, c in
                                   zip(r.worst_regret_pct, r.worst_regret_pct_lo,
                                       r.worst_regret_pct_hi, strict=True)],
                "at fault": r.worst_fault,
                "mean regret %": [vd.fmt_iv(a, b, c) for a, b, c in
                                  zip(r.mean_regret_pct, r.mean_regret_pct_lo,
                                      r.mean_regret_pct_hi, strict=True)],
                "mean rank": [_rank(x) for x in r.mean_rank],
                "faults best/tied": r.faults_best_or_tied}).to_string(index=False))
        lines.append("")
        lines.append(f"ties: {vd.RULE}.")
        lines.append(f"{STATS_NOTE}; shown as mean [lo, hi].")
        return "\n".join(lines)

    def _not_started(self) -> list[str]:
        """A fault set that starts after its runs ended never happened, and a load that ended
        before the span did makes the span's figures about an idle fleet."""
        r = self.runs
        if r.empty or "fault_start_s" not in r:
            return []
        out = []
        for fault, g in r[r.fault_start_s > r.simulated_s].groupby("fault", sort=False):
            out.append(f"WARNING: fault {fault} never started in {len(g)} of "
                       f"{int((r.fault == fault).sum())} runs: they ended by "
                       f"{g.simulated_s.max():g} s, before its start at "
                       f"{g.fault_start_s.min():g} s, so its rows show no harm.")
        if self.plan is not None and "load_until_s" in r:
            early = r[r.load_until_s < self.plan.t_end - 1.0]
            if len(early):
                out.append(f"WARNING: the load of {len(early)} of {len(r)} runs ended by "
                           f"{early.load_until_s.max():g} s, before the span's end at "
                           f"{self.plan.t_end:g} s: give the base's clients more prompts "
                           f"(--set clients.0.num_prompts=...)")
        return out

    # --- export --------------------------------------------------------------------------

    @staticmethod
    def written(formats: Sequence[str]) -> list[str]:
        """What :meth:`write` and ``pdsim whatif --plots`` put in a directory (patterns)."""
        return [f"{name}.{fmt}" for fmt in formats for name in FRAMES] + ["columns.json",
                                                                           "*.png"]

    def write(self, out: str | Path, formats: Sequence[str] = ("csv",)) -> list[Path]:
        """table, ranking, runs (without series), healthy, timelines (long) and columns.json."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        frames = {"table": self.table, "ranking": self.ranking,
                  "runs": self.runs.drop(columns=["series"]),
                  "healthy": self.healthy.drop(columns=["series"]),
                  "timelines": self.timeline_frame()}
        written = []
        for fmt in formats:
            for name, df in frames.items():
                path = out / f"{name}.{fmt}"
                if fmt == "csv":
                    df.to_csv(path, index=False, float_format="%.9g")
                elif fmt == "parquet":
                    df.to_parquet(path, index=False)
                elif fmt == "json":
                    path.write_text(df.to_json(orient="records", indent=1, double_precision=6))
                else:
                    raise ValueError(f"unknown format {fmt!r}: csv, parquet or json")
                written.append(path)
        meta = out / "columns.json"
        plan = None if self.plan is None else {
            "timeline": self.plan.timeline.__dict__, "t_end": self.plan.t_end,
            "horizon": self.plan.horizon, "windows": self.plan.windows}
        meta.write_text(json.dumps({"columns": COLUMNS, "statistics": STATS_NOTE,
                                    "ties": vd.RULE, "base": self.base,
                                    "command": self.command, "condition": self.condition,
                                    "policies": dict(self.policies), "faults": self.faults,
                                    "variants": self.variants, "notes": self.notes,
                                    "plan": plan}, indent=1, default=str) + "\n")
        written.append(meta)
        return written

    @classmethod
    def read(cls, out: str | Path) -> WhatIf:
        """A condition back from what :meth:`write` put in ``out`` (CSV or Parquet; timelines
        may be gzipped): table, ranking and plots without re-running anything."""
        out = Path(out)
        meta = json.loads((out / "columns.json").read_text())

        def frame(name: str) -> pd.DataFrame | None:
            for suffix in (".parquet", ".csv", ".csv.gz"):
                path = out / f"{name}{suffix}"
                if path.is_file():
                    return (pd.read_parquet(path) if suffix == ".parquet"
                            else pd.read_csv(path, keep_default_na=False,
                                             na_values=["", "nan", "NaN"]))
            return None

        runs, healthy, tl = frame("runs"), frame("healthy"), frame("timelines")
        if runs is None or healthy is None:
            raise FileNotFoundError(f"{out}: no runs/healthy table (written by WhatIf.write)")
        series: dict[tuple, list] = {}
        if tl is not None:
            for key, g in tl.groupby(["policy", "fault", "seed"], sort=False):
                series[key] = g.sort_values("t").goodput_tok_s.tolist()
        runs["policy"] = runs.policy.astype(str)
        runs["fault"] = runs.fault.astype(str)
        runs["series"] = [series.get((r.policy, r.fault, r.seed), [])
                          for r in runs.itertuples()]
        if "policy" in healthy:
            healthy["policy"] = healthy.policy.astype(str)
        healthy["fault"] = healthy.fault.astype(str)
        healthy["series"] = [series.get((getattr(r, "policy", "any"), "healthy", r.seed), [])
                             for r in healthy.itertuples()]
        plan = None
        if meta.get("plan"):
            p = meta["plan"]
            plan = win.Plan(win.Timeline(**p["timeline"]), p["t_end"], p["horizon"],
                            {f: {w: (tuple(v) if v is not None else None)
                                 for w, v in ws.items()} for f, ws in p["windows"].items()})
        return cls(runs, healthy, list(meta["policies"].items()), meta["faults"],
                   meta.get("base", ""), meta.get("command", ""), plan,
                   meta.get("condition", ""), meta.get("variants", {}), meta.get("notes", []))

    def timeline_frame(self) -> pd.DataFrame:
        """Goodput per second of every run (long form: policy, fault, seed, t, goodput); each
        healthy run once (fault ``healthy``)."""
        parts = []
        h = self.healthy.drop_duplicates([c for c in ("policy", "seed") if c in self.healthy])
        for df, fault in ((self.runs, None), (h, "healthy")):
            for r in df.itertuples():
                n = len(r.series)
                parts.append(pd.DataFrame({
                    "policy": getattr(r, "policy", "any"), "fault": fault or r.fault,
                    "seed": r.seed, "t": np.arange(n, dtype=float),
                    "goodput_tok_s": np.asarray(r.series, float)}))
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def _rank(x: float) -> str:
    return "-" if not (isinstance(x, float | int) and math.isfinite(x)) else f"{int(x)}"


def _iv(row: dict, m: str, digits: int) -> str:
    v = row.get(m, math.nan)
    if m == "recover_s" and isinstance(v, float) and math.isinf(v):
        return "never"
    return vd.fmt_iv(v, row.get(f"{m}_lo", math.nan), row.get(f"{m}_hi", math.nan), digits)


def _short(v: Any) -> str:
    if isinstance(v, float) and not isinstance(v, bool):
        return f"{v:g}"
    return str(v)


def legend() -> str:
    """What each column means (printed under the table and in ``--help``)."""
    w = max(len(k) for k in COLUMNS)
    return "columns:\n" + "\n".join(f"  {k:<{w}}  {v}" for k, v in COLUMNS.items())

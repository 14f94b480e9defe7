"""The what-if's decisions: :class:`WhatIf`, made of the runs of one matrix
(:func:`pdsim.analysis.whatif.whatif` runs it), scores each policy against each fault (medians
and 10-90% intervals over seeds, regret against the best policy at the same fault and seed),
ranks the policies by worst-case regret, prints the table, saves and reads it, and draws its
plots. Every column is defined in :data:`COLUMNS` (``legend()``: the CLI's help)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

FRAMES = ("table", "ranking", "runs", "healthy", "timelines")  # WhatIf.write's tables

COLUMNS: dict[str, str] = {
    "policy": "blacklist policy and the parameters varied (label)",
    "fault": "fault library entry (or your fault set) the run suffered",
    "seeds": "seeds run for this row",
    "goodput_tok_s": "output tokens/s of requests that completed (measured requests, from the "
                     "client's start to its last answer)",
    "goodput_lost_pct": "goodput lost against the same seed without faults (and the same "
                        "policy, when the base fails transfers without faults), in % of "
                        "healthy",
    "failed": "requests that failed or timed out",
    "wasted_prefill_tokens": "prefill tokens computed for requests that then failed",
    "fast_fails": "requests the blacklist failed without a write ('Decode instance could be "
                  "dead')",
    "dead_peer_writes": "KV writes sent to a peer that was gone or silent: the requests sent "
                        "to dead peers (a request's first failed write ends its transfer; a "
                        "write an outage let through counts too); each holds a transfer "
                        "queue for the engine's failure time",
    "dead_peer_write_s": "transfer-queue seconds those writes held",
    "ret_failures": "failed transfer writes the blacklist counted (ret != 0) and pairs it "
                    "blacklisted (runs and healthy tables; any in a healthy run gives every "
                    "policy healthy runs of its own)",
    "ttft_p99_s": "99th percentile of time to first token of the requests that completed, s "
                  "(what waiting on a dead peer costs the requests that still succeed)",
    "recover_s": "seconds from the fault's end until goodput (10 s windows) is back within "
                 "10% of healthy; inf (printed: never): not within the run; nan (printed: "
                 "n/a): the fault lasts the run",
    "max_healthy_blacklisted_s": "longest stretch a healthy (prefill rank, decode session) "
                                 "pair stayed blacklisted",
    "healthy_blacklisted_pair_s": "pair-seconds healthy pairs spent blacklisted, summed",
    "regret_pct": "goodput of the best policy at the same fault and seed minus this one's, "
                  "in % of that seed's healthy goodput (this policy's own healthy run when it "
                  "has them); the median over seeds (paired: every policy meets the same "
                  "seed's arrivals and faults), leaving out a seed whose healthy run completed "
                  "nothing",
    "rank": "rank of the policy for this fault by regret (1: least; ties share a rank)",
}
STATS_NOTE = ("each metric: median over seeds, and _lo/_hi the 10th/90th percentiles over seeds "
              "(linear interpolation)")
METRICS = ["goodput_tok_s", "goodput_lost_pct", "failed", "wasted_prefill_tokens",
           "fast_fails", "dead_peer_writes", "dead_peer_write_s", "ttft_p99_s", "recover_s",
           "max_healthy_blacklisted_s", "healthy_blacklisted_pair_s"]


# --- the result ------------------------------------------------------------------------------


@dataclass
class WhatIf:
    """Runs, the decision table, the ranking, and the plots of one what-if matrix."""

    runs: pd.DataFrame  # one row per (policy, fault, seed), with the goodput series
    healthy: pd.DataFrame  # one row per seed, no faults
    policies: list[tuple[str, dict]]
    faults: dict[str, list]
    base: str = ""
    command: str = ""
    table: pd.DataFrame = field(init=False)
    ranking: pd.DataFrame = field(init=False)

    def __post_init__(self) -> None:
        self.table = self._table()
        self.ranking = self._ranking()

    def _regrets(self) -> np.ndarray:
        """Each run's regret: the fault's best goodput at its seed minus its own, in % of its
        seed's healthy goodput (its policy's own when the healthy runs are per policy). Paired
        by seed, a policy that matches the best at most seeds has a median regret of 0 where
        a difference of medians over seeds could name it the worst."""
        runs, h = self.runs, self.healthy
        best = runs.groupby(["fault", "seed"], sort=False).goodput_tok_s.transform("max")
        if "policy" in h:
            own = h.set_index(["policy", "seed"]).goodput_tok_s
            healthy = np.array([own.get((p, s), math.nan)
                                for p, s in zip(runs.policy, runs.seed, strict=True)])
        else:
            healthy = runs.seed.map(h.set_index("seed").goodput_tok_s).to_numpy(float)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(healthy > 0,
                            100.0 * (best.to_numpy(float) - runs.goodput_tok_s.to_numpy(float))
                            / healthy, math.nan)

    def _table(self) -> pd.DataFrame:
        runs = self.runs.assign(_regret=self._regrets()) if len(self.runs) else self.runs
        rows = []
        order = {lbl: i for i, (lbl, _) in enumerate(self.policies)}
        for (fault, policy), g in runs.groupby(["fault", "policy"], sort=False):
            row: dict[str, Any] = {"policy": policy, "fault": fault, "seeds": len(g)}
            for m in METRICS:
                v = g[m].to_numpy(float)
                if m == "recover_s":  # nan: no end in the run; inf: never recovered
                    if np.isnan(v).all():
                        row[m] = row[f"{m}_lo"] = row[f"{m}_hi"] = math.nan
                        continue
                    v = np.where(np.isnan(v), math.inf, v)
                finite = v[np.isfinite(v)]
                med = float(np.median(v))
                row[m] = med
                if len(finite) == len(v):
                    row[f"{m}_lo"] = float(np.percentile(v, 10))
                    row[f"{m}_hi"] = float(np.percentile(v, 90))
                else:  # some seeds never recovered: the interval is open above
                    srt = np.sort(v)
                    row[f"{m}_lo"] = float(srt[int(0.1 * (len(v) - 1))])
                    row[f"{m}_hi"] = math.inf
            known = g._regret.to_numpy(float)
            known = known[~np.isnan(known)]  # (a seed whose healthy run completed nothing)
            row["regret_pct"] = float(np.median(known)) if len(known) else math.nan
            rows.append(row)
        t = pd.DataFrame(rows)
        if t.empty:
            return t
        t["regret_pct"] = t.pop("regret_pct")  # (the last columns, as before)
        t["rank"] = t.groupby("fault", sort=False).regret_pct.rank(
            method="min", na_option="bottom").astype(int)
        t["_p"] = t.policy.map(order)
        t["_f"] = t.fault.map({f: i for i, f in enumerate(self.faults)})
        t = t.sort_values(["_f", "_p"]).drop(columns=["_p", "_f"]).reset_index(drop=True)
        return t

    def _ranking(self) -> pd.DataFrame:
        t = self.table
        if t.empty:
            return pd.DataFrame()
        g = t.groupby("policy", sort=False)
        r = pd.DataFrame({
            "worst_regret_pct": g.regret_pct.max(),
            "worst_fault": g.apply(lambda x: x.loc[x.regret_pct.idxmax(), "fault"]
                                   if x.regret_pct.notna().any() else "n/a",
                                   include_groups=False),
            "mean_regret_pct": g.regret_pct.mean(),
            "mean_goodput_lost_pct": g.goodput_lost_pct.mean(),
            "faults_won": g["rank"].apply(lambda x: int((x == 1).sum())),
        })
        # a policy with no regret at any fault has no worst fault (idxmax named the first)
        r.loc[r.worst_regret_pct <= 0, "worst_fault"] = "none"
        r = r.sort_values(["worst_regret_pct", "mean_regret_pct"], kind="stable")
        key = [tuple(math.inf if math.isnan(v) else v for v in k)  # (unknown: last, tied)
               for k in zip(r.worst_regret_pct, r.mean_regret_pct, strict=True)]
        r.insert(0, "overall_rank", [key.index(k) + 1 for k in key])  # ties share a rank
        return r.reset_index()

    # --- text ----------------------------------------------------------------------------

    def render(self) -> str:
        """The decision table and the ranking, as the CLI prints them."""
        t = self.table
        if t.empty:
            return "no runs"
        pd_opts = ("display.width", 200, "display.max_columns", 30, "display.max_rows", 500)
        show = t[["fault", "policy", "goodput_tok_s", "goodput_lost_pct", "failed",
                  "wasted_prefill_tokens", "dead_peer_writes", "ttft_p99_s", "recover_s",
                  "max_healthy_blacklisted_s", "regret_pct", "rank"]].copy()
        show["goodput_tok_s"] = [_fmt_iv(r, "goodput_tok_s", 0) for r in t.to_dict("records")]
        show["failed"] = [_fmt_iv(r, "failed", 0) for r in t.to_dict("records")]
        show["recover_s"] = [_fmt_iv(r, "recover_s", 0) for r in t.to_dict("records")]
        show = show.rename(columns={"goodput_lost_pct": "lost %", "wasted_prefill_tokens":
                                    "wasted prefill", "dead_peer_writes": "dead writes",
                                    "max_healthy_blacklisted_s": "healthy bl max s",
                                    "ttft_p99_s": "p99 TTFT s",
                                    "regret_pct": "regret %"})
        lines = []
        h = self.healthy
        if len(h) and "policy" in h:
            g = h.groupby("policy", sort=False).goodput_tok_s.median()
            lines.append(f"healthy (no faults, each policy's own: the base fails transfers "
                         f"without faults): goodput {g.min():,.0f}-{g.max():,.0f} tok/s "
                         f"(medians of {h.seed.nunique()} seed(s))")
        elif len(h):
            lines.append(f"healthy (no faults): goodput {np.median(h.goodput_tok_s):,.0f} tok/s "
                         f"(median of {len(h)} seed(s))")
        lines += self._not_started()
        show = show.round(1)
        for c in ("lost %", "dead writes", "p99 TTFT s", "healthy bl max s", "regret %"):
            show[c] = show[c] + 0.0  # (-0.0 prints as 0.0)
        show["wasted prefill"] = [f"{v:,.0f}" for v in t.wasted_prefill_tokens]
        with pd.option_context(*pd_opts):
            lines.append(show.to_string(index=False))
            lines.append("")
            lines.append("ranking by worst-case regret across the faults:")
            lines.append(self.ranking.round(1).to_string(index=False))
        lines.append("")
        lines.append(f"{STATS_NOTE}; goodput/failed/recover shown as median [lo-hi].")
        lines.append(legend().replace("columns:", "columns (of the tables --out writes; the "
                                      "table above shows the main ones, renamed):", 1))
        return "\n".join(lines)

    def _not_started(self) -> list[str]:
        """A fault set that starts after its runs ended never happened: its rows measure a
        healthy run, which reads as a policy that copes."""
        r = self.runs
        if r.empty or "fault_start_s" not in r:
            return []
        late = r[r.fault_start_s > r.simulated_s]
        out = []
        for fault, g in late.groupby("fault", sort=False):
            out.append(f"WARNING: fault {fault} never started in {len(g)} of "
                       f"{int((r.fault == fault).sum())} runs: they ended by "
                       f"{g.simulated_s.max():g} s, before its "
                       f"start at {g.fault_start_s.min():g} s, so its rows show no harm. Keep "
                       f"the base's load going past it (--set clients.0.num_prompts=...) or "
                       f"start it earlier (--faults-file).")
        return out

    # --- export --------------------------------------------------------------------------

    @staticmethod
    def written(formats: Sequence[str]) -> list[str]:
        """What :meth:`write` and ``pdsim whatif --plots`` put in a directory (patterns)."""
        return [f"{name}.{fmt}" for fmt in formats for name in FRAMES] + ["columns.json",
                                                                           "*.png"]

    def write(self, out: str | Path, formats: Sequence[str] = ("csv",)) -> list[Path]:
        """table, ranking, runs (without series), timelines (long) and columns.json."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        frames = {"table": self.table, "ranking": self.ranking,
                  "runs": self.runs.drop(columns=["series"]), "healthy":
                  self.healthy.drop(columns=["series"]), "timelines": self.timeline_frame()}
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
        meta.write_text(json.dumps({"columns": COLUMNS, "statistics": STATS_NOTE,
                                    "base": self.base, "command": self.command,
                                    "policies": dict(self.policies), "faults": self.faults},
                                   indent=1, default=str) + "\n")
        written.append(meta)
        return written

    @classmethod
    def read(cls, out: str | Path) -> WhatIf:
        """A matrix back from what :meth:`write` put in ``out`` (CSV or Parquet; timelines may
        be gzipped): table, ranking and plots without re-running anything."""
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
        runs["series"] = [series.get((r.policy, r.fault, r.seed), [])
                          for r in runs.itertuples()]
        healthy["series"] = [series.get((getattr(r, "policy", "any"), "healthy", r.seed), [])
                             for r in healthy.itertuples()]
        if "policy" in healthy:
            healthy["policy"] = healthy.policy.astype(str)
        runs["policy"] = runs.policy.astype(str)
        return cls(runs, healthy, list(meta["policies"].items()), meta["faults"],
                   meta.get("base", ""), meta.get("command", ""))

    def timeline_frame(self) -> pd.DataFrame:
        """Goodput per second of every run (long form: policy, fault, seed, t, goodput)."""
        parts = []
        for df, fault in ((self.runs, None), (self.healthy, "healthy")):
            for r in df.itertuples():
                n = len(r.series)
                parts.append(pd.DataFrame({
                    "policy": getattr(r, "policy", "any"), "fault": fault or r.fault,
                    "seed": r.seed, "t": np.arange(n, dtype=float),
                    "goodput_tok_s": np.asarray(r.series, float)}))
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()

    # --- plots ----------------------------------------------------------------------------

    def telling_fault(self) -> str:
        """The fault under which the policies differ most (the largest regret; the first on
        ties): the timeline worth drawing when none is named. Under the first fault of a
        matrix every policy's curve may be the same (a crash that no policy changes)."""
        t = self.table
        if t.empty or not (t.regret_pct > 0).any():
            return next(iter(self.faults))
        return str(t.loc[t.regret_pct.idxmax(), "fault"])

    def heatmap(self, ax: Any = None, metric: str = "goodput_lost_pct") -> Any:
        """Policy x fault heatmap of goodput lost (median over seeds, % of healthy)."""
        import matplotlib.pyplot as plt

        piv = self.table.pivot(index="policy", columns="fault", values=metric)
        piv = piv.loc[[lbl for lbl, _ in self.policies if lbl in piv.index],
                      [f for f in self.faults if f in piv.columns]]
        if ax is None:
            _fig, ax = plt.subplots(figsize=(1.3 * len(piv.columns) + 3,
                                             0.45 * len(piv.index) + 1.8),
                                    constrained_layout=True)
        vals = piv.to_numpy(float)
        im = ax.imshow(vals, cmap="Reds", vmin=0, vmax=max(1.0, np.nanmax(vals)), aspect="auto")
        ax.set_xticks(range(len(piv.columns)), piv.columns, rotation=30, ha="right")
        ax.set_yticks(range(len(piv.index)), piv.index)
        for i in range(vals.shape[0]):
            for j in range(vals.shape[1]):
                v = vals[i, j]
                ax.text(j, i, "–" if np.isnan(v) else f"{v:.0f}", ha="center", va="center",
                        fontsize=8, color="white" if v > 0.6 * np.nanmax(vals) else "black")
        ax.figure.colorbar(im, ax=ax, label="goodput lost, % of healthy (median)")
        ax.set_title("goodput lost by policy and fault")
        return ax

    def timelines(self, fault: str, ax: Any = None, smooth_s: int = 5,
                  policies: Sequence[str] | None = None) -> Any:
        """Goodput over time for each policy under one fault (median over seeds), healthy
        dashed, the fault's window shaded."""
        import matplotlib.pyplot as plt

        if fault not in self.faults:
            raise ValueError(f"no fault {fault!r} in this matrix: {', '.join(self.faults)}")
        ax = ax or plt.subplots(figsize=(10, 4.5), constrained_layout=True)[1]
        runs = self.runs[self.runs.fault == fault]
        curves = [(lbl, _median_series(g.series, smooth_s))
                  for lbl in policies or [lbl for lbl, _ in self.policies]
                  if len(g := runs[runs.policy == lbl])]
        groups = _identical(curves)  # one line per distinct curve, named by all it stands for
        lines = []
        for labels, curve in groups:
            line = ax.plot(curve, lw=1.4, label=" = ".join(labels))[0]
            lines.append((labels, line))
        h = self.healthy
        if len(h) and "policy" in h:  # each policy's own healthy runs, in its colour
            for labels, line in lines:
                mine = [(lbl, _median_series(g.series, smooth_s)) for lbl in labels
                        if len(g := h[h.policy == lbl])]
                for same, curve in _identical(mine):
                    ax.plot(curve, color=line.get_color(), lw=0.8, ls="--",
                            label=f"{' = '.join(same)}, healthy")
        elif len(h):
            ax.plot(_median_series(h.series, smooth_s), color="black", lw=1, ls="--",
                    label="healthy")
        start, end = float(runs.fault_start_s.iloc[0]), float(runs.fault_end_s.iloc[0])
        if math.isfinite(start):
            ax.axvspan(start, max(end, start + 0.5), color="#b2182b", alpha=0.12, lw=0,
                       label="fault")
        ax.set_xlabel("time (s)")
        ax.set_ylabel(f"goodput, tok/s ({smooth_s} s mean)")
        ax.set_ylim(bottom=0)
        n = len(curves)
        same = (f": {len(groups)} distinct curves among {n} policies (a = b: identical, one "
                f"line)" if len(groups) < n else "")
        ax.set_title(f"recovery under {fault}{same}", fontsize=10)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        return ax

    def vs_param(self, param: str, policy: str | None = None, ax: Any = None,
                 metric: str = "goodput_tok_s") -> Any:
        """``metric`` against one policy parameter (e.g. ``ttl_s``), one line per fault:
        median over seeds with the 10-90% band."""
        import matplotlib.pyplot as plt

        rows = [(lbl, sec) for lbl, sec in self.policies if param in sec
                and (policy is None or sec["policy"] == policy)]
        if not rows:
            raise ValueError(f"no policy in this matrix varies {param!r}")
        ax = ax or plt.subplots(figsize=(7, 4), constrained_layout=True)[1]
        xs = {lbl: float(sec[param]) for lbl, sec in rows}
        t = self.table[self.table.policy.isin(xs)]
        for fault, g in t.groupby("fault", sort=False):
            g = g.assign(x=g.policy.map(xs)).sort_values("x")
            line = ax.plot(g.x, g[metric], marker="o", lw=1.4, label=fault)[0]
            if f"{metric}_lo" in g:
                ax.fill_between(g.x, g[f"{metric}_lo"], g[f"{metric}_hi"], alpha=0.12,
                                color=line.get_color(), lw=0)
        h = self.healthy
        if metric == "goodput_tok_s" and len(h) and "policy" in h:  # each value's own
            own = h[h.policy.isin(xs)].groupby("policy").goodput_tok_s.median()
            own = own.rename(index=xs).sort_index()
            ax.plot(own.index, own.to_numpy(), color="black", lw=1, ls="--", label="healthy")
        elif metric == "goodput_tok_s" and len(h):
            ax.axhline(np.median(h.goodput_tok_s), color="black", lw=1, ls="--",
                       label="healthy")
        from matplotlib.ticker import NullFormatter

        ax.set_xscale("log")  # ticked at the values run: a log axis within a decade labels
        ax.set_xticks(sorted(xs.values()), [f"{v:g}" for v in sorted(xs.values())])
        ax.xaxis.set_minor_formatter(NullFormatter())  # its minor ticks "6x10^0", "2x10^1"
        ax.set_xlabel(f"{param} (log scale)")
        ax.set_ylabel(metric)
        ax.set_title(f"{metric} vs {param} ({rows[0][1]['policy']})")
        ax.legend(fontsize=7)
        return ax


def _identical(curves: list[tuple[str, np.ndarray]]) -> list[tuple[list[str], np.ndarray]]:
    """Curves grouped where they are the same (to 1e-9): drawn once, each would hide the
    others (a policy that never acts under a fault runs exactly as another)."""
    groups: list[tuple[list[str], np.ndarray]] = []
    for lbl, c in curves:
        for labels, g in groups:
            if len(g) == len(c) and np.allclose(g, c, rtol=1e-9, atol=1e-9):
                labels.append(lbl)
                break
        else:
            groups.append(([lbl], c))
    return groups


def _median_series(series: Iterable[Sequence[float]], smooth_s: int) -> np.ndarray:
    arrs = [np.asarray(s, float) for s in series]
    n = min(len(a) for a in arrs)
    med = np.median(np.stack([a[:n] for a in arrs]), axis=0)
    return pd.Series(med).rolling(smooth_s, min_periods=1).mean().to_numpy()


def _fmt_iv(row: dict, m: str, digits: int) -> str:
    def f(v: float) -> str:
        if isinstance(v, float) and math.isnan(v):
            return "n/a"
        if isinstance(v, float) and math.isinf(v):
            return "never"
        return f"{v:,.{digits}f}"

    if isinstance(row[m], float) and math.isnan(row[m]):
        return "n/a"
    return f"{f(row[m])} [{f(row[m + '_lo'])}-{f(row[m + '_hi'])}]"


def _short(v: Any) -> str:
    if isinstance(v, float) and not isinstance(v, bool):
        return f"{v:g}"
    return str(v)


def legend() -> str:
    """What each column means (printed under the table and in ``--help``)."""
    w = max(len(k) for k in COLUMNS)
    return "columns:\n" + "\n".join(f"  {k:<{w}}  {v}" for k, v in COLUMNS.items())

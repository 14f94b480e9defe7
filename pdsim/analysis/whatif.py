"""What-if of blacklist policy: policies (with parameter grids) x faults x seeds -> decisions.

    w = pdsim.whatif("scenarios/whatif_base.yaml",
                     policies=["permanent", "never", {"policy": "ttl", "ttl_s": [10, 60]}],
                     faults=["flush_race", "decode_crash"], seeds=range(1, 4))
    w.table        # one row per (policy, fault): medians and 10-90% intervals over seeds
    w.ranking      # policies by worst-case regret across the faults
    w.heatmap(); w.timelines("decode_crash"); w.vs_param("ttl_s")
    w.write("out/"); WhatIf.read("out/")   # the same table and plots, without re-running

Every (policy, fault, seed) is a run of the base scenario with ``blacklist`` and ``faults``
replaced; every seed also runs without faults (``healthy``), which goodput lost and recovery
are measured against. A blacklist policy cannot change a fault-free run in which no transfer
fails, so then one healthy run per seed serves all policies; when the base fails transfers
without faults (its clients or operators flush KV under load: ``drop_timeout.yaml``), each
policy gets healthy runs of its own (``healthy.policy``), and each is measured against its own.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pydantic import ValidationError

from pdsim.config import scenario as scenario_mod
from pdsim.config.registry import BLACKLIST_POLICIES, FAULTS
from pdsim.util.backends import MAX_RUNS, progress_bar
from pdsim.util.backends import run_all as run_tasks
from pdsim.util.safeio import echo

RECOVERY_WINDOW_S = 10.0
RECOVERED_AT = 0.9  # "back within 10% of healthy"

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


# --- specification ---------------------------------------------------------------------------


def expand_policies(policies: Iterable[str | dict]) -> list[tuple[str, dict]]:
    """Policy specs -> (label, blacklist section); list values in a dict are a grid."""
    out: list[tuple[str, dict]] = []
    for spec in policies:
        spec = {"policy": spec} if isinstance(spec, str) else dict(spec)
        name = spec.get("policy", BLACKLIST_POLICIES.default)
        grid = {k: v for k, v in spec.items() if isinstance(v, list | tuple)}
        if math.prod(len(v) for v in grid.values()) > MAX_RUNS:
            raise ValueError(f"policy {name}: a grid of "
                             f"{math.prod(len(v) for v in grid.values()):,} points; at most "
                             f"{MAX_RUNS:,} runs")
        fixed = {k: v for k, v in spec.items() if k not in grid}
        for values in itertools.product(*grid.values()):
            section = {**fixed, **dict(zip(grid, values, strict=True)), "policy": name}
            shown = [f"{k}={_short(v)}" for k, v in section.items() if k != "policy"]
            label = name + (f"({', '.join(shown)})" if shown else "")
            try:
                BLACKLIST_POLICIES.validate(section)  # fail before any run starts
            except ValidationError as err:
                raise ValueError(f"policy {label}: "
                                 f"{scenario_mod.section_error(err, 'blacklist')}") from None
            out.append((label, section))
    labels = [lbl for lbl, _ in out]
    if len(set(labels)) != len(labels):
        dup = sorted({x for x in labels if labels.count(x) > 1})
        raise ValueError(f"policies repeat: {', '.join(dup)}")
    return out


def _fault_set_name(key: object) -> str:
    """A fault-set name of your own: it labels rows beside the runs without faults
    (``healthy``) and names a --plots file (timeline_<name>.png), so neither may it be."""
    name = str(key)
    if name == "healthy":
        raise ValueError("fault-set name 'healthy' is taken by the runs without faults; "
                         "give another name")
    if (not name.strip() or not name.isprintable() or "/" in name or "\\" in name
            or len(name) > scenario_mod.MAX_NAME_CHARS):
        raise ValueError(f"fault-set name {echo(key)}: give printable text of at most "
                         f"{scenario_mod.MAX_NAME_CHARS} characters, without / or \\")
    return name


def expand_faults(faults: Iterable[str] | dict[str, list] | None) -> dict[str, list[dict]]:
    """Fault specs -> name: list of fault items. Names are library presets; a dict maps your
    names to fault lists. None: the whole library."""
    if faults is None:
        return {name: [{"preset": name}] for name in FAULTS.presets}
    if isinstance(faults, dict):
        out = {_fault_set_name(k): list(v) if isinstance(v, list) else [v]
               for k, v in faults.items()}
        if len(out) < len(faults):  # (1 and '1' from a YAML file)
            raise ValueError("fault-set names repeat once read as text; give distinct names")
        return out
    out = {}
    for name in faults:
        if name not in FAULTS.presets:
            raise ValueError(f"unknown fault {name!r}; the library has: "
                             f"{', '.join(FAULTS.presets)} (or pass a faults file)")
        out[name] = [{"preset": name}]
    return out


# --- one run and its measurements ------------------------------------------------------------


def goodput_series(requests: pd.DataFrame, t_end: float, dt: float = 1.0) -> np.ndarray:
    """Output tokens/s of requests that completed, per ``dt`` bin from 0 to ``t_end``.

    A completed request's tokens are spread evenly over [first token, done].
    """
    done = requests[(requests.status == "completed") & (requests.kind != "warmup")]
    edges = np.arange(0.0, t_end + dt, dt)
    if not len(done):
        return np.zeros(len(edges) - 1)
    a = done.t_first_token.to_numpy(float)
    b = done.t_done.to_numpy(float)
    g = done.generated.to_numpy(float)
    span = np.maximum(b - a, 1e-9)
    cum = np.zeros(len(edges))
    for lo in range(0, len(a), 2048):  # bounded memory: chunks of requests
        sl = slice(lo, lo + 2048)
        frac = np.clip((edges[None, :] - a[sl, None]) / span[sl, None], 0.0, 1.0)
        cum += (g[sl, None] * frac).sum(axis=0)
    return np.diff(cum) / dt


def _unhealthy_intervals(events: pd.DataFrame, t_end: float) -> tuple[dict, dict]:
    """Path-down intervals from the ``path`` events: per prefill server and per session."""
    by_p: dict[int, list] = {}
    by_s: dict[str, list] = {}
    open_p: dict[int, float] = {}
    open_s: dict[str, float] = {}
    for e in events[events.event == "path"].itertuples():
        if e.component:
            key = int(str(e.component).rsplit("-", 1)[1])
            opened, target = open_p, by_p
        else:
            key = e.peer
            opened, target = open_s, by_s
        if e.value != 0 and key not in opened:
            opened[key] = e.time
        elif e.value == 0 and key in opened:
            target.setdefault(key, []).append((opened.pop(key), e.time))
    for opened, target in ((open_p, by_p), (open_s, by_s)):
        for key, t0 in opened.items():
            target.setdefault(key, []).append((t0, t_end))
    return by_p, by_s


def _healthy_stretches(a: float, b: float, down: list[tuple[float, float]]) -> list[float]:
    """Lengths of the parts of [a, b] outside the ``down`` intervals."""
    cuts = sorted((max(a, x), min(b, y)) for x, y in down if y > a and x < b)
    out, t = [], a
    for x, y in cuts:
        if x > t:
            out.append(x - t)
        t = max(t, y)
    if b > t:
        out.append(b - t)
    return out


def blacklist_harm(events: pd.DataFrame, t_end: float) -> tuple[float, float]:
    """(longest stretch a healthy pair stayed blacklisted, healthy pair-seconds blacklisted)."""
    by_p, by_s = _unhealthy_intervals(events, t_end)
    bl = events[events.event.isin(["blacklist_add", "blacklist_remove"])]
    longest, total = 0.0, 0.0
    opened: dict[tuple[str, str], float] = {}
    spans = []
    for e in bl.itertuples():
        key = (e.component, e.peer)
        if e.event == "blacklist_add":
            opened.setdefault(key, e.time)
        elif key in opened:
            spans.append((key, opened.pop(key), e.time))
    spans += [(key, t0, t_end) for key, t0 in opened.items()]
    for (owner, session), a, b in spans:
        p = int(str(owner).split(".")[0].rsplit("-", 1)[1])
        parts = _healthy_stretches(a, b, by_p.get(p, []) + by_s.get(session, []))
        if parts:
            longest = max(longest, max(parts))
            total += sum(parts)
    return longest, total


def _window(items: list, horizon: float) -> tuple[float, float]:
    """(start, end) of a fault set, from the faults' own windows."""
    if not items:
        return math.nan, math.nan
    ws = [f.window(horizon) for f in items]
    return min(w[0] for w in ws), max(w[1] for w in ws)


def measure(res: Any) -> dict:
    """The scalar metrics of one run, and its goodput per second."""
    s = res.summary
    req = res.requests
    measured = req[req.kind != "warmup"]
    t_end = float(s["simulated_s"])
    start, end = _window(res.scenario.faults, t_end)
    series = goodput_series(req, math.ceil(t_end))
    first = float(measured.t_arrival.min()) if len(measured) else 0.0
    last = float(measured.t_done.max()) if measured.t_done.notna().any() else first
    done = measured[measured.status == "completed"]
    good = float(done.generated.sum())
    ttft = (done.t_first_token - done.t_arrival).to_numpy(float)
    longest, pair_s = blacklist_harm(res.events, t_end)
    ev = res.events
    counted = int(((ev.event == "transfer_failed") & (ev.detail != "blacklisted_session")).sum()
                  + (ev.event == "blacklist_add").sum()) if len(ev) else 0
    by_reason = s.get("failed_by_reason", {})
    return {
        "goodput_tok_s": good / (last - first) if last > first else 0.0,
        "failed": int(measured.status.isin(["failed", "timed_out"]).sum()),
        "wasted_prefill_tokens": int(s["wasted_prefill_tokens"]),
        "fast_fails": int(by_reason.get("blacklisted_session", 0)),
        "dead_peer_writes": int(s.get("dead_peer_writes", 0)),
        "dead_peer_write_s": float(s.get("dead_peer_write_s", 0.0)),
        "ttft_p99_s": round(float(np.percentile(ttft, 99)), 6) if len(ttft) else math.nan,
        "max_healthy_blacklisted_s": round(longest, 6),
        "healthy_blacklisted_pair_s": round(pair_s, 6),
        "ret_failures": counted,
        "fault_start_s": start,
        "fault_end_s": end,
        "simulated_s": t_end,
        "series": series.round(6).tolist(),
    }


def _one(task: tuple[dict, list[str], dict, Sequence[str]]) -> dict:
    from pdsim.config.registry import load_plugin
    from pdsim.engine.sim import run

    data, sets, labels, plugins = task
    for p in plugins:  # workers started by spawn need the user's registrations too
        load_plugin(p)
    res = run(data, sets=sets)
    return {**labels, **measure(res)}


def recover_s(faulty: Sequence[float], healthy: Sequence[float], end: float,
              window: float = RECOVERY_WINDOW_S, at: float = RECOVERED_AT) -> float:
    """Seconds from ``end`` until a ``window``-s mean of goodput is back to ``at`` x healthy's
    mean over the same window; inf if it never is; nan if the fault has no end in the run."""
    f = np.asarray(faulty, float)
    h = np.asarray(healthy, float)
    n = min(len(f), len(h))
    w = int(round(window))
    if not math.isfinite(end) or end >= n - w:
        return math.nan
    cf = np.concatenate([[0.0], np.cumsum(f[:n])])
    ch = np.concatenate([[0.0], np.cumsum(h[:n])])
    for t in range(int(math.ceil(end)), n - w + 1):
        hw = ch[t + w] - ch[t]
        if hw <= 0:
            return math.inf  # the load ended before the fault's effects did
        if cf[t + w] - cf[t] >= at * hw:
            return float(t - end)
    return math.inf


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
        ax = ax or plt.subplots(figsize=(9, 4), constrained_layout=True)[1]
        runs = self.runs[self.runs.fault == fault]
        for lbl in policies or [lbl for lbl, _ in self.policies]:
            g = runs[runs.policy == lbl]
            if len(g):
                ax.plot(_median_series(g.series, smooth_s), lw=1.4, label=lbl)
        h = self.healthy
        if len(h) and "policy" in h:  # each policy's own healthy runs, in its colour
            for line in list(ax.get_lines()):
                g = h[h.policy == line.get_label()]
                if len(g):
                    ax.plot(_median_series(g.series, smooth_s), color=line.get_color(), lw=0.8,
                            ls="--", label=f"{line.get_label()}, healthy")
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
        ax.set_title(f"recovery under {fault}")
        ax.legend(fontsize=7, ncol=2)
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


# --- execution -------------------------------------------------------------------------------


def whatif(base: str | Path | dict, policies: Iterable[str | dict] = ("permanent", "never"),
           faults: Iterable[str] | dict[str, list] | None = None, seeds: Iterable[int] = (1,),
           workers: int | None = None, progress: bool = True, sets: Sequence[str] = (),
           plugins: Sequence[str] = (), command: str = "", *, backend: str = "process",
           address: str | None = None, allow_outside_paths: bool = False) -> WhatIf:
    """Run every policy under every fault for every seed (plus a healthy run per seed).

    ``backend``/``address``: where the runs go (pdsim/util/backends.py: "process" or "ray");
    ``plugins``: modules or files registering policies or faults, imported in every worker.
    """
    data = scenario_mod.as_data(base, allow_outside_paths)  # keeps where its paths resolve
    if sets:
        data = scenario_mod.apply_overrides(data, list(sets))
    if len(seeds := seeds if isinstance(seeds, range) else list(seeds)) > MAX_RUNS:
        raise ValueError(f"{len(seeds):,} seeds; at most {MAX_RUNS:,} runs")
    pols = expand_policies(policies)
    fset = expand_faults(faults)
    if not pols or not fset or not seeds:
        raise ValueError("give at least one policy, one fault and one seed")
    if (runs := len(seeds) * (1 + len(pols) * (1 + len(fset)))) > MAX_RUNS:  # (at most)
        raise ValueError(f"policies x faults x seeds: {runs:,} runs; at most {MAX_RUNS:,}")
    shared = [({"faults": [], "seed": seed}, {"fault": "healthy", "seed": seed})
              for seed in seeds]
    own = [({"blacklist": section, "faults": [], "seed": seed},
            {"policy": label, "fault": "healthy", "seed": seed})
           for label, section in pols for seed in seeds]
    faulty = [({"blacklist": section, "faults": items, "seed": seed},
               {"policy": label, "fault": fault, "seed": seed})
              for fault, items in fset.items() for label, section in pols for seed in seeds]

    def tasks(jobs: list[tuple[dict, dict]]) -> list[tuple]:
        out = []
        for over, labels in jobs:
            d = scenario_mod.ScenarioData({**data, **over})
            d.context = getattr(data, "context", None)
            scenario_mod.load(d)  # validate every run before any process starts
            out.append((d, [], labels, list(plugins)))
        return out

    shared_t, faulty_t = tasks(shared), tasks(faulty)  # (``own`` only if needed, below: each
    # is a faulty run's scenario without its faults, so it loads if that one did)
    # the healthy runs first: if any fails a transfer, a policy could change it (one bar,
    # its total grown by the policies' own healthy runs when they are needed)
    bar = progress_bar(len(shared_t) + len(faulty_t), enabled=progress)
    try:
        rows = run_tasks(_one, shared_t, workers, backend=backend, address=address, bar=bar)
        per_policy = any(r["ret_failures"] for r in rows)
        own_t = tasks(own) if per_policy else []
        if per_policy:
            rows = []
            bar.total += len(own_t)
            bar.refresh()
        rows += run_tasks(_one, own_t + faulty_t, workers,
                          backend=backend, address=address, bar=bar)
    finally:
        bar.close()
    healthy = pd.DataFrame([r for r in rows if r["fault"] == "healthy"])
    runs = pd.DataFrame([r for r in rows if r["fault"] != "healthy"])
    h_by = {(r.policy if per_policy else "", r.seed): r for r in healthy.itertuples()}
    lost, rec = [], []
    for r in runs.itertuples():
        h = h_by[(r.policy if per_policy else "", r.seed)]
        lost.append(100.0 * (h.goodput_tok_s - r.goodput_tok_s) / h.goodput_tok_s
                    if h.goodput_tok_s else math.nan)
        rec.append(recover_s(r.series, h.series, r.fault_end_s))
    runs.insert(runs.columns.get_loc("goodput_tok_s") + 1, "goodput_lost_pct", lost)
    runs.insert(runs.columns.get_loc("dead_peer_write_s") + 1, "recover_s", rec)
    return WhatIf(runs, healthy, pols, fset, str(base) if not isinstance(base, dict) else "",
                  command)

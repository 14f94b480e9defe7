"""Explore declared unknowns: which of their values reproduce the reported figures, and what
moves each figure.

    ex = pdsim.explore("scenarios/drop_timeout.yaml", samples=64, seeds=2)
    ex.acceptance    # per reported figure: share of runs within its band; and all jointly
    ex.region        # per unknown: the values of the runs that reproduce every figure (ABC)
    ex.bins          # per unknown and bin of its range: share of runs within each band
    ex.sensitivity   # per figure and unknown: RBD-FAST S1 (SALib) and Spearman rho (scipy)
    ex.runs          # one row per run: inputs, seed, flattened summary

The unknowns' ranges are sampled with a scrambled Sobol sequence (or a Latin hypercube), seeded
for determinism, and every sample runs with every seed. Each finished run is written at once
as its own small Parquet file under ``<out>/runs.parquet/`` (a directory pandas reads as one
table), keyed by scenario hash + design + sample index + seed: an interrupted exploration
resumes with the runs it lacks, and none is lost or repeated. The hash covers the scenario as
simulated (not its name, description, reference figures or ``why`` notes), the content of
every file it reads (profiles and traces, by content, not by path; ``extends:`` parents are
merged into it) and pdsim's own code, so results of another model version, or of an edited
profile, are never mixed in.

A stored row is used only if it verifies: its ``row_digest`` (SHA-256 of its key, inputs and
outputs) matches, and its inputs are the values the design gives its sample. Anything else in
the folder under this exploration's key (a file pdsim did not write, a row edited since) is
ignored with one warning line and its runs are made again. The digest is a check of
integrity, not of authenticity: someone who recomputes it with pdsim's code can still plant
outputs.
"""

from __future__ import annotations

import math
import sys
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from pdsim.analysis.explore_store import (  # noqa: F401 (KEY, WALL, read_runs, row_digest: API)
    DIGEST,
    KEY,
    WALL,
    compact,
    part_name,
    read_runs,
    row_digest,
    scenario_hash,
    stored,
    verified,
    write_atomic,
)
from pdsim.config import loader, unknowns
from pdsim.config.scenario import ReferenceFigure, Scenario
from pdsim.config.units import ScenarioError
from pdsim.config.unknowns import Unknown
from pdsim.util import backends

MIN_RUNS_S1 = 32  # RBD-FAST's bootstrap needs ~8M runs: below, a numeric S1 is not estimated
DESIGNS = ("sobol", "lhs")


@dataclass
class Exploration:
    """What an exploration found; every table is a DataFrame."""

    scenario: Scenario
    unknowns: list[Unknown]
    figures: list[ReferenceFigure]
    runs: pd.DataFrame
    acceptance: pd.DataFrame
    region: pd.DataFrame
    bins: pd.DataFrame
    sensitivity: pd.DataFrame
    out: Path | None = None
    resumed: int = 0
    ran: int = 0
    design: str = ""
    seeds: list = field(default_factory=list)


# --- keys and design -------------------------------------------------------------------------


def design_points(d: int, samples: int, kind: str = "sobol", seed: int = 0) -> np.ndarray:
    """``samples`` points of the unit cube [0, 1)^d, space-filling and seeded.

    Scrambled Sobol points are a prefix of one sequence, so raising ``samples`` keeps the runs
    already made (sample i is the same point); Latin-hypercube points depend on ``samples``.
    """
    from scipy.stats import qmc

    if kind == "sobol":
        eng = qmc.Sobol(d, scramble=True, seed=seed)
        with warnings.catch_warnings():  # balance wants 2^m points; a prefix is still fine
            warnings.simplefilter("ignore", UserWarning)
            return eng.random(samples)
    if kind == "lhs":
        return qmc.LatinHypercube(d, seed=seed).random(samples)
    raise ValueError(f"unknown design {kind!r}; allowed: {', '.join(DESIGNS)}")


def _design_id(kind: str, seed: int, samples: int) -> str:
    return f"sobol-{seed}" if kind == "sobol" else f"lhs-{seed}-n{samples}"


# --- one run ---------------------------------------------------------------------------------


def flatten(summary: dict, prefix: str = "") -> dict:
    """Every scalar of the summary under its dotted path (lists and per-rank flushes left out).

    Reference figures name these paths (``clients.ci_bench.empty_share``); a missing value
    (None) becomes NaN so that columns stay numeric.
    """
    row: dict = {}
    for k, v in summary.items():
        path = f"{prefix}{k}"
        if k == "flushes" and not prefix:
            continue
        if isinstance(v, dict):
            row.update(flatten(v, path + "."))
        elif isinstance(v, list):
            continue
        else:
            row[path] = float("nan") if v is None else v
    return row


def _run_one(task: tuple) -> dict:
    from pdsim.output.result import run

    data, key, inputs = task
    res = run(data)
    row = {**key, **inputs}
    for k, v in flatten(res.summary).items():
        row[k if k not in row else f"summary.{k}"] = v
    row["sim_wall_s"] = round(res.sim_wall_s, 3)
    row[DIGEST] = row_digest(row)
    return row


# --- exploring -------------------------------------------------------------------------------


def _seed_list(seeds: int | Iterable[int]) -> list[int]:
    if isinstance(seeds, int):
        if seeds < 1:
            raise ValueError("--seeds must be at least 1")
        return list(range(1, seeds + 1))
    return [int(s) for s in seeds]


def _prepare(scenario: str | Path | dict, sets: list[str] | None,
             allow_outside_paths: bool) -> tuple[dict, Scenario]:
    data = loader.as_data(scenario, allow_outside_paths)  # keeps where paths resolve
    if sets:
        data = loader.apply_overrides(data, sets)
    sc = loader.load(data)
    sc._unknowns = sorted(sc.unknowns, key=lambda u: u.path)
    if not sc.unknowns:
        raise ScenarioError("the scenario declares no unknowns to explore; declare one, e.g. "
                            "start_s: {uniform: [5, 20], nominal: 10}, or --set "
                            "'KEY={uniform: [a, b], nominal: x}'")
    return data, sc


def explore(scenario: str | Path | dict, samples: int = 64, seeds: int | Iterable[int] = 2,
            sets: list[str] | None = None, design: str = "sobol", design_seed: int = 0,
            out: str | Path | None = None, backend: str = "process", workers: int | None = None,
            address: str | None = None, progress: bool = True,
            allow_outside_paths: bool = False) -> Exploration:
    """Sample the scenario's declared unknowns x ``seeds``, run them, compare with the report.

    ``seeds``: N (seeds 1..N) or a list. ``out``: directory for ``runs.parquet/`` (resumed if
    present); None keeps the runs in memory only. ``backend``: "process" or "ray".
    """
    if samples < 1:
        raise ValueError("--samples must be at least 1")
    data, sc = _prepare(scenario, sets, allow_outside_paths)
    ctx = getattr(data, "context", None)  # where relative paths (traces) resolve
    seed_list = _seed_list(seeds)
    unk = sc.unknowns  # sorted by path: design dimensions do not depend on key order
    resolved, _ = unknowns.resolve(data)
    shash = scenario_hash(data)
    did = _design_id(design, design_seed, samples)
    points = design_points(len(unk), samples, design, design_seed)

    inputs = {i: {x.path: x.value(ui) for x, ui in zip(unk, u, strict=True)}
              for i, u in enumerate(points)}
    store = None
    kept = pd.DataFrame(columns=KEY)
    done: set = set()
    if out is not None:
        store = Path(out) / "runs.parquet"
        store.mkdir(parents=True, exist_ok=True)
        old = stored(store)
        if len(old):
            mine = (old.scenario_hash == shash) & (old.design == did)
            ok = verified(old[mine], inputs, seed_list)
            bad = int((~ok).sum())
            if bad:
                print(f"warning: {bad} stored row(s) in {store} under this exploration's key "
                      f"do not verify (not written by pdsim for these inputs, or changed since): "
                      f"ignored, and their runs made again", file=sys.stderr)
            kept = old[mine][ok].drop_duplicates(subset=KEY, keep="first")
            done = set(zip(kept["sample"].astype(int), kept["seed"].astype(int), strict=True))
            other = int((~mine).sum())
            if other:
                print(f"note: {store} also holds {other} run(s) of another scenario version, "
                      "design or pdsim version; they are kept and left out", file=sys.stderr)

    tasks = []
    for i in range(len(points)):
        values = inputs[i]
        for s in seed_list:
            if (i, s) in done:
                continue
            run_data = loader._with_context(unknowns.substitute(resolved, values), ctx)
            run_data["seed"] = s
            key = {"scenario_hash": shash, "design": did, "sample": i, "seed": s}
            tasks.append((run_data, key, values))

    total = samples * len(seed_list)
    rows: list = []
    if tasks:
        bar = backends.progress_bar(total, total - len(tasks), enabled=progress)
        try:
            with backends.get(backend, workers, address) as be:
                for _i, row in be.imap(_run_one, tasks):
                    if store is not None:
                        write_atomic(pd.DataFrame([row]), store / part_name(row))
                    rows.append(row)
                    bar.update()
        finally:
            bar.close()
    if store is not None:
        runs = pd.concat([f for f in (kept, pd.DataFrame(rows)) if len(f)] or [kept],
                         ignore_index=True)
        compact(store, shash, did, runs)
        runs = runs[runs["sample"].lt(samples) & runs["seed"].isin(seed_list)]
    else:
        runs = pd.DataFrame(rows)
    runs = runs.sort_values(["sample", "seed"], kind="stable").reset_index(drop=True)
    return analyse(sc, runs, out=Path(out) if out is not None else None,
                   resumed=total - len(tasks), ran=len(tasks), design=did, seeds=seed_list)


# --- analysis --------------------------------------------------------------------------------


def judged(figures: list[ReferenceFigure]) -> list[ReferenceFigure]:
    """Reference figures that can be judged: a summary metric and a band."""
    return [r for r in figures if r.metric and r.limit is not None]


def _within(runs: pd.DataFrame, r: ReferenceFigure) -> pd.Series:
    if r.metric not in runs:
        return pd.Series(False, index=runs.index)
    v = pd.to_numeric(runs[r.metric], errors="coerce")
    return (v - r.reported).abs() <= r.limit


def _as_number(runs: pd.DataFrame, u: Unknown) -> pd.Series:
    """The unknown's values as numbers (a choice by its position in the list)."""
    if u.numeric:
        return runs[u.path].astype(float)
    order = {repr(c): i for i, c in enumerate(u.choices)}
    return runs[u.path].map(lambda v: order.get(repr(v), np.nan)).astype(float)


def _edge(x: float) -> str:
    """A float bin edge in plain digits, 4 significant figures at most (18.75, not 18.8;
    1062.5, not 1.06e+03)."""
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    text = f"{x:.{max(0, 3 - math.floor(math.log10(abs(x))))}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _bins(u: Unknown, n: int = 8) -> list[tuple[str, object]]:
    """(label, membership test) per bin of the unknown's range: an integer unknown's bins
    name the integers they hold (1,000–1,062), a float's its interval ([6.25, 12.5))."""
    if not u.numeric:
        return [(str(c), (lambda v, c=c: v == c)) for c in u.choices]
    lo, hi = u.low, u.high
    if u.integer and hi - lo + 1 <= n:
        return [(f"{k:,}", (lambda v, k=k: v == k)) for k in range(math.ceil(lo), int(hi) + 1)]
    if u.dist == "loguniform":
        edges = np.geomspace(lo, hi, n + 1)
    else:
        edges = np.linspace(lo, hi, n + 1)
    out = []
    for i in range(n):
        a, b = edges[i], edges[i + 1]
        last = i == n - 1
        if u.integer:  # the whole values v with a <= v < b (<= b in the last bin)
            first, end = math.ceil(a), math.floor(b) if last else math.ceil(b) - 1
            label = f"{first:,}" if first == end else f"{first:,}–{end:,}"
        else:
            label = f"[{_edge(a)}, {_edge(b)}{']' if last else ')'}"
        out.append((label, (lambda v, a=a, b=b, last=last: (v >= a) & ((v <= b) if last
                                                                     else (v < b)))))
    return out


def analyse(sc: Scenario, runs: pd.DataFrame, out: Path | None = None, resumed: int = 0,
            ran: int = 0, design: str = "", seeds: list | None = None) -> Exploration:
    """Acceptance, accepted region, per-bin acceptance and sensitivity from the runs."""
    unk = sc.unknowns
    figs = judged(sc.reference)
    ids = [f"F{i + 1}" for i in range(len(figs))]
    within = pd.DataFrame({fid: _within(runs, r) for fid, r in zip(ids, figs, strict=True)},
                          index=runs.index)
    joint = within.all(axis=1) if figs else pd.Series(False, index=runs.index)

    acc_rows = []
    for fid, r in zip(ids, figs, strict=True):
        v = pd.to_numeric(runs.get(r.metric, pd.Series(dtype=float)), errors="coerce")
        acc_rows.append({"figure": fid, "label": r.label, "metric": r.metric,
                         "reported": r.reported, "band": r.limit,
                         "share_within": float(within[fid].mean()) if len(runs) else 0.0,
                         "sim_p10": v.quantile(0.1), "sim_median": v.median(),
                         "sim_p90": v.quantile(0.9)})
    if figs:
        acc_rows.append({"figure": "all", "label": "all figures jointly", "metric": "",
                         "reported": np.nan, "band": np.nan,
                         "share_within": float(joint.mean()) if len(runs) else 0.0,
                         "sim_p10": np.nan, "sim_median": np.nan, "sim_p90": np.nan})
    acceptance = pd.DataFrame(acc_rows)

    reg_rows, bin_rows = [], []
    accepted = runs[joint]
    for u in unk:
        row: dict = {"unknown": u.path, "prior": u.describe(), "nominal": u.nominal,
                     "accepted_runs": int(len(accepted))}
        if u.numeric and len(accepted):
            a = accepted[u.path].astype(float)
            row.update({"min": a.min(), "p10": a.quantile(0.1), "median": a.median(),
                        "p90": a.quantile(0.9), "max": a.max()})
        elif len(accepted):
            row["values"] = ", ".join(str(c) for c in u.choices
                                      if (accepted[u.path] == c).any())
        reg_rows.append(row)
        for label, test in _bins(u):
            mask = test(runs[u.path]) if len(runs) else pd.Series(dtype=bool)
            sel = within[mask]
            b = {"unknown": u.path, "bin": label, "runs": int(mask.sum())}
            for fid in ids:
                b[fid] = float(sel[fid].mean()) if len(sel) else np.nan
            b["all"] = float(joint[mask].mean()) if len(sel) and figs else np.nan
            bin_rows.append(b)
    region = pd.DataFrame(reg_rows)
    bins = pd.DataFrame(bin_rows)
    sensitivity = _sensitivity(runs, unk, figs, ids)
    return Exploration(sc, unk, figs, runs, acceptance, region, bins, sensitivity, out,
                       resumed, ran, design, list(seeds or []))


def _untie(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``x`` with ties (seeds of one sample, integer values) broken at random, order kept.

    RBD-FAST reads the figure in the order of the input; tied inputs would otherwise be read
    in the design's order, which is not random.
    """
    vals = np.unique(x[np.isfinite(x)])
    gap = np.min(np.diff(vals)) if len(vals) > 1 else 1.0
    return x + rng.uniform(-0.25, 0.25, len(x)) * gap


def _eta2(x: np.ndarray, y: np.ndarray) -> float:
    """First-order index of a categorical input: between-group share of the variance,
    bias-corrected (epsilon squared)."""
    groups = [y[x == v] for v in np.unique(x)]
    n, k = len(y), len(groups)
    total = float(((y - y.mean()) ** 2).sum())
    if total == 0 or k < 2 or n <= k:
        return np.nan
    between = sum(len(g) * (g.mean() - y.mean()) ** 2 for g in groups)
    within = total - between
    return max(0.0, float((between - (k - 1) * within / (n - k)) / total))


def _sensitivity(runs: pd.DataFrame, unk: list[Unknown], figs: list[ReferenceFigure],
                 ids: list[str]) -> pd.DataFrame:
    """Per figure and unknown: first-order index S1 and Spearman rho; seed noise.

    S1 is the share of the figure's variance explained by that unknown alone: RBD-FAST
    (SALib; it works on any space-filling sample) for numeric unknowns, the between-choice
    variance share for a choice; both bias-corrected (a small negative estimate means "none"
    and is shown as 0). ``seed_noise`` is the share of the variance left between seeds at one
    sample point: what no unknown explains.
    """
    from SALib.analyze import rbd_fast
    from scipy.stats import spearmanr

    rows = []
    if len(runs) < 4:
        return pd.DataFrame(rows)
    X = np.column_stack([_as_number(runs, u).to_numpy() for u in unk])
    rng = np.random.default_rng(0)
    Xu = np.column_stack([_untie(X[:, j], rng) for j in range(len(unk))])
    numeric = [j for j, u in enumerate(unk) if u.numeric]
    for fid, r in zip(ids, figs, strict=True):
        y = pd.to_numeric(runs.get(r.metric, pd.Series(np.nan, index=runs.index)),
                          errors="coerce").to_numpy(dtype=float)
        ok = np.isfinite(y)
        total = np.var(y[ok]) if ok.sum() > 1 else 0.0
        noise = np.nan
        if total > 0 and runs["sample"].duplicated().any():
            within_var = pd.Series(y[ok]).groupby(runs["sample"].to_numpy()[ok]).var(ddof=0)
            noise = float(within_var.mean() / total)
        s1 = [np.nan] * len(unk)
        if total > 0 and numeric and ok.sum() >= MIN_RUNS_S1:
            problem = {"num_vars": len(numeric), "names": [unk[j].path for j in numeric],
                       "bounds": [[0.0, 1.0]] * len(numeric)}
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                res = rbd_fast.analyze(problem, Xu[ok][:, numeric], y[ok], M=4, seed=1,
                                       print_to_console=False)
            for j, v in zip(numeric, res["S1"], strict=True):
                s1[j] = max(0.0, float(v)) if np.isfinite(v) else np.nan
        for j, u in enumerate(unk):
            if not u.numeric and total > 0:
                s1[j] = _eta2(X[ok, j], y[ok])
            rho = np.nan
            if total > 0 and np.nanstd(X[ok, j]) > 0:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    rho = float(spearmanr(X[ok, j], y[ok]).statistic)
            rows.append({"figure": fid, "metric": r.metric, "unknown": u.path, "S1": s1[j],
                         "spearman_rho": rho, "seed_noise": noise})
    return pd.DataFrame(rows)


# --- text ------------------------------------------------------------------------------------


def _share(x: float) -> str:
    """A share to 2 decimals, but one above zero that rounds to 0.00 says so (1 run in 256 is
    not none)."""
    return "<0.01" if 0 < x < 0.005 else f"{x:.2f}"


def _g(x: object, digits: int = 3) -> str:
    if isinstance(x, float | np.floating):
        if not np.isfinite(x):
            return "-"
        return f"{x:.{digits}g}" if abs(x) < 100 else f"{x:,.0f}"
    return str(x)


def render(ex: Exploration) -> str:
    """The acceptance, region, per-bin and sensitivity tables as text."""
    n = len(ex.runs)
    samples = ex.runs["sample"].nunique() if n else 0
    lines = [f"{ex.scenario.name}: {n} runs = {samples} samples ({ex.design}) x "
             f"{len(ex.seeds)} seed(s) {ex.seeds}; {ex.resumed} already stored, {ex.ran} run now"]
    lines.append("Declared unknowns (explore samples each range; '= x' is the nominal "
                 "pdsim run uses, not a value explored):")
    lines += [f"  {line}" for line in unknowns.block(ex.unknowns)]
    if ex.out is not None:
        lines.append(f"Runs: {ex.out / 'runs.parquet'}")
    lines.append("")
    if not ex.figures:
        lines.append("The scenario has no reference figure with a metric and a band "
                     "(tolerance or rel_tolerance): nothing to accept or reject.")
    else:
        lines.append("Reproduces the reported figure: share of runs within its band "
                     "(each run is an equal-weight draw from the unknowns' ranges x seeds)")
        t = ex.acceptance.copy()
        table = pd.DataFrame({
            "": t.figure, "figure": t.label.str.slice(0, 52),
            "reported": [_g(x) for x in t.reported], "±": [_g(x) for x in t.band],
            "within": [_share(x) for x in t.share_within],
            "sim p10": [_g(x) for x in t.sim_p10], "median": [_g(x) for x in t.sim_median],
            "p90": [_g(x) for x in t.sim_p90]})
        lines.append(table.to_string(index=False))
        lines.append("")
        acc = int(ex.region.accepted_runs.iloc[0]) if len(ex.region) else 0
        lines.append(f"Accepted region (approximate Bayesian computation, rejection): the "
                     f"{acc} of {n} runs within every band")
        if acc == 0:
            lines.append("  none: no sampled value reproduces all the figures jointly; see the "
                         "per-figure shares per bin below")
        else:
            cols = [c for c in ("unknown", "prior", "nominal", "min", "p10", "median", "p90",
                                "max", "values") if c in ex.region]
            reg = ex.region[cols].copy()
            for c in ("min", "p10", "median", "p90", "max"):
                if c in reg:
                    reg[c] = [_g(x) for x in reg[c]]
            lines.append(reg.fillna("").to_string(index=False))
        lines.append("")
        lines.append("Share of runs within each band, per bin of each unknown (F* as above)")
        for path, b in ex.bins.groupby("unknown", sort=False):
            b = b.drop(columns="unknown").rename(columns={"bin": path})
            for c in b.columns[2:]:
                b[c] = [("-" if not np.isfinite(x) else _share(x)) for x in b[c]]
            lines.append(b.to_string(index=False))
    lines.append("")
    if len(ex.sensitivity):
        lines.append("Sensitivity: S1 = share of the figure's variance explained by the unknown "
                     "alone (RBD-FAST, SALib; between-choice share for a choice); rho = "
                     "Spearman rank correlation; seed noise = share left between seeds at one "
                     "sample point")
        s = ex.sensitivity
        wide = s.pivot_table(index="figure", columns="unknown", values=["S1", "spearman_rho"],
                             sort=False, dropna=False)
        out = pd.DataFrame(index=wide.index)
        for u in ex.unknowns:
            out[f"{u.path} S1"] = [_g(x, 2) for x in wide[("S1", u.path)]]
            out[f"{u.path} rho"] = [_g(x, 2) for x in wide[("spearman_rho", u.path)]]
        noise = s.groupby("figure", sort=False).seed_noise.first()
        out["seed noise"] = [_g(x, 2) for x in noise.reindex(out.index)]
        lines.append(out.to_string())
        lines += _sensitivity_notes(ex)
    return "\n".join(lines)


def _sensitivity_notes(ex: Exploration) -> list[str]:
    """Why a cell prints '-', and how far a Spearman rho of few runs can be read."""
    n, notes = len(ex.runs), []
    if n < MIN_RUNS_S1 and any(u.numeric for u in ex.unknowns):
        notes.append(f"S1 '-': RBD-FAST needs at least {MIN_RUNS_S1} runs (here {n}); "
                     f"--samples x --seeds of {MIN_RUNS_S1} or more")
    if not ex.runs["sample"].duplicated().any():
        notes.append("seed noise '-': needs --seeds 2 or more")
    if n < MIN_RUNS_S1:
        limit = 2 / np.sqrt(max(n - 1, 1))
        notes.append(f"rho over {n} runs: " + (
            "too few runs to tell any rho from noise" if limit >= 1 else
            f"|rho| below about 2/sqrt(runs - 1) = {limit:.2f} is within noise"))
    return notes


TABLES = ("acceptance", "region", "bins", "sensitivity")  # write_tables' CSVs
# what an exploration writes in its directory (pdsim.cli refuses one that would replace an input)
WRITTEN = ("runs.parquet/*", *(f"{name}.csv" for name in TABLES), "*.png")


def write_tables(ex: Exploration, out: Path) -> list[Path]:
    """The tables as CSV next to the runs."""
    written = []
    for name in TABLES:
        p = out / f"{name}.csv"
        getattr(ex, name).to_csv(p, index=False)
        written.append(p)
    return written

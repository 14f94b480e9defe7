"""The statistics of an exploration, each with its uncertainty: first-order sensitivity (S1 with
SALib's interval), the noise between seeds (unbiased), and which story the reported figures
favour (ABC model choice with matched priors, with a bootstrap interval).

Why intervals: RBD-FAST's S1 from 64-256 runs has 95% half-widths of 0.1-0.3, so "S1 < 0.07"
cannot be told from 0 or from 0.15 without its interval; two seeds per point estimate a
variance with one degree of freedom each (ddof=1, not the biased ddof=0 that halves it); and
stories sampled with different numbers of draws cannot be ranked by their share of accepted
runs without saying how much a share of 9 in 256 (5 distinct points) can move.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

MIN_RUNS_S1 = 32  # RBD-FAST's bootstrap needs ~8M runs: below, a numeric S1 is not estimated
N_BOOT = 2000
LEVEL = 0.95


def as_number(runs: pd.DataFrame, u: Any) -> pd.Series:
    """The unknown's values as numbers (a choice by its position in the list)."""
    if u.numeric:
        return runs[u.path].astype(float)
    order = {repr(c): i for i, c in enumerate(u.choices)}
    return runs[u.path].map(lambda v: order.get(repr(v), np.nan)).astype(float)


def untie(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``x`` with ties (seeds of one sample, integer values) broken at random, order kept.

    RBD-FAST reads the figure in the order of the input; tied inputs would otherwise be read
    in the design's order, which is not random.
    """
    vals = np.unique(x[np.isfinite(x)])
    gap = np.min(np.diff(vals)) if len(vals) > 1 else 1.0
    return x + rng.uniform(-0.25, 0.25, len(x)) * gap


def eta2(x: np.ndarray, y: np.ndarray) -> float:
    """First-order index of a categorical input: between-group share of the variance,
    bias-corrected (epsilon squared), clipped at 0."""
    groups = [y[x == v] for v in np.unique(x)]
    n, k = len(y), len(groups)
    total = float(((y - y.mean()) ** 2).sum())
    if total == 0 or k < 2 or n <= k:
        return np.nan
    between = sum(len(g) * (g.mean() - y.mean()) ** 2 for g in groups)
    within = total - between
    return max(0.0, float((between - (k - 1) * within / (n - k)) / total))


def eta2_conf(x: np.ndarray, y: np.ndarray, cluster: np.ndarray, seed: int = 0) -> float:
    """Half-width of a 95% bootstrap interval of :func:`eta2`, resampling sample points (a
    point's seeds together), as SALib's S1_conf is a half-width."""
    rng = np.random.default_rng(seed)
    ids = np.unique(cluster)
    rows = [np.flatnonzero(cluster == i) for i in ids]
    got = []
    for _ in range(200):
        pick = np.concatenate([rows[i] for i in rng.integers(0, len(ids), len(ids))])
        v = eta2(x[pick], y[pick])
        if np.isfinite(v):
            got.append(v)
    if len(got) < 10:
        return np.nan
    lo, hi = np.percentile(got, [100 * (1 - LEVEL) / 2, 100 * (1 + LEVEL) / 2])
    return float((hi - lo) / 2)


def seed_noise(y: np.ndarray, sample: np.ndarray) -> float:
    """Share of the figure's variance left between seeds at one sample point: the mean over
    points of the unbiased within-point variance (ddof=1) over the unbiased total variance."""
    ok = np.isfinite(y)
    y, sample = y[ok], sample[ok]
    if len(y) < 2:
        return np.nan
    total = float(np.var(y, ddof=1))
    within = pd.Series(y).groupby(sample).var(ddof=1).dropna()
    if total <= 0 or within.empty:
        return np.nan
    return float(within.mean() / total)


def sensitivity(runs: pd.DataFrame, unk: Sequence[Any], figs: Sequence[Any],
                ids: Sequence[str]) -> pd.DataFrame:
    """Per figure and unknown: first-order index S1 with its 95% half-width, Spearman rho;
    seed noise.

    S1 is the share of the figure's variance explained by that unknown alone: RBD-FAST
    (SALib; it works on any space-filling sample; ``S1_conf`` its bootstrap half-width) for
    numeric unknowns, the between-choice variance share for a choice (epsilon squared, with a
    bootstrap over sample points); both bias-corrected (a small negative estimate means "none"
    and is shown as 0; the half-width says how far from 0 it could be). ``seed_noise``: see
    :func:`seed_noise`.
    """
    from SALib.analyze import rbd_fast
    from scipy.stats import spearmanr

    rows = []
    if len(runs) < 4:
        return pd.DataFrame(rows)
    X = np.column_stack([as_number(runs, u).to_numpy() for u in unk])
    rng = np.random.default_rng(0)
    Xu = np.column_stack([untie(X[:, j], rng) for j in range(len(unk))])
    numeric = [j for j, u in enumerate(unk) if u.numeric]
    sample = runs["sample"].to_numpy()
    for fid, r in zip(ids, figs, strict=True):
        y = pd.to_numeric(runs.get(r.metric, pd.Series(np.nan, index=runs.index)),
                          errors="coerce").to_numpy(dtype=float)
        ok = np.isfinite(y)
        total = np.var(y[ok], ddof=1) if ok.sum() > 1 else 0.0
        noise = seed_noise(y, sample) if total > 0 else np.nan
        s1 = [np.nan] * len(unk)
        conf = [np.nan] * len(unk)
        if total > 0 and numeric and ok.sum() >= MIN_RUNS_S1:
            problem = {"num_vars": len(numeric), "names": [unk[j].path for j in numeric],
                       "bounds": [[0.0, 1.0]] * len(numeric)}
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                res = rbd_fast.analyze(problem, Xu[ok][:, numeric], y[ok], M=4, seed=1,
                                       print_to_console=False)
            for j, v, c in zip(numeric, res["S1"], res["S1_conf"], strict=True):
                s1[j] = max(0.0, float(v)) if np.isfinite(v) else np.nan
                conf[j] = float(c) if np.isfinite(c) else np.nan
        for j, u in enumerate(unk):
            if not u.numeric and total > 0:
                s1[j] = eta2(X[ok, j], y[ok])
                conf[j] = eta2_conf(X[ok, j], y[ok], sample[ok])
            rho = np.nan
            if total > 0 and np.nanstd(X[ok, j]) > 0:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    rho = float(spearmanr(X[ok, j], y[ok]).statistic)
            rows.append({"figure": fid, "metric": r.metric, "unknown": u.path, "S1": s1[j],
                         "S1_conf": conf[j], "spearman_rho": rho, "seed_noise": noise})
    return pd.DataFrame(rows)


def fmt_s1(s1: float, conf: float) -> str:
    """``0.07 ±0.12`` (``-`` when not estimated)."""
    if not np.isfinite(s1):
        return "-"
    return f"{s1:.2f} ±{conf:.2f}" if np.isfinite(conf) else f"{s1:.2f}"


# --- which story: ABC model choice --------------------------------------------------------------


def model_choice(accepted: Mapping[str, pd.DataFrame], draws: int | None = None,
                 n_boot: int = N_BOOT, seed: int = 0) -> pd.DataFrame:
    """Posterior probability of each story given the reported figures (ABC model choice by
    rejection, equal prior probability per story), with a bootstrap interval.

    ``accepted``: story -> its runs with columns ``sample`` and ``accepted`` (bool: within
    every band the choice is about). Matched priors: every story gets the same number of
    draws, its first ``draws`` sample points (the Sobol design is a sequence, so a prefix is a
    space-filling sample of the story's own prior; default: the fewest any story has) with
    every seed run at them. Each story's acceptance rate then estimates the likelihood of the
    figures under its prior (its whole declared range: a story with a wide prior pays for the
    volume that does not fit), and with equal prior weights the posterior probability of a
    story is its acceptance rate over the sum of all. The interval resamples each story's
    sample points with replacement (a point's seeds together), ``n_boot`` times.
    """
    names = list(accepted)
    counts = {n: int(df["sample"].nunique()) for n, df in accepted.items()}
    k = draws or min(counts.values())
    rng = np.random.default_rng(seed)
    per_point, rate = {}, {}
    for n in names:
        df = accepted[n]
        df = df[df["sample"] < k]
        g = df.groupby("sample")["accepted"].agg(["sum", "count"])
        per_point[n] = g
        rate[n] = float(g["sum"].sum() / g["count"].sum()) if len(g) else np.nan
    total = sum(v for v in rate.values() if np.isfinite(v))
    boot = np.zeros((n_boot, len(names)))
    for i, n in enumerate(names):
        g = per_point[n]
        if not len(g):
            boot[:, i] = np.nan
            continue
        pick = rng.integers(0, len(g), (n_boot, len(g)))
        boot[:, i] = g["sum"].to_numpy()[pick].sum(1) / g["count"].to_numpy()[pick].sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        post_b = boot / boot.sum(axis=1, keepdims=True)
    a = (1 - LEVEL) / 2
    rows = []
    for i, n in enumerate(names):
        g = per_point[n]
        col = post_b[:, i]
        col = col[np.isfinite(col)]
        rows.append({
            "story": n, "draws": int(len(g)), "runs": int(g["count"].sum()) if len(g) else 0,
            "accepted_runs": int(g["sum"].sum()) if len(g) else 0,
            "accepted_points": int((g["sum"] > 0).sum()) if len(g) else 0,
            "acceptance": rate[n],
            "posterior": rate[n] / total if total > 0 else np.nan,
            "posterior_lo": float(np.percentile(col, 100 * a)) if len(col) else np.nan,
            "posterior_hi": float(np.percentile(col, 100 * (1 - a))) if len(col) else np.nan,
            "undefined_share": float(1 - len(col) / n_boot)})
    return pd.DataFrame(rows)

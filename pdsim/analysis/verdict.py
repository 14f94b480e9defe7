"""Which policy is best, with how much certainty: regret over seeds, its bootstrap interval,
and a tie rule one can state.

Regret of a policy at (fault, seed): the best of the policies' values of a metric there minus
its own (every policy meets the same seed's arrivals and faults: paired by seed), in % of the
seed's healthy value of the same metric over the same window (``pct``) or in points of the
share (``pp``, for SLO attainment). A policy's figure under a fault is its mean regret over
the seeds; over a *fault mix* it is the worst fault's (``worst``) or the mean over the faults
(``mean``, equal weights).

Uncertainty: a percentile bootstrap over seeds (:data:`N_BOOT` resamples of the seed list with
replacement, the same resample for every policy and fault, so the pairing is kept; seeded, so
the same runs print the same intervals). It says how much the verdict moves with the draw of
seeds; it cannot say more than the seeds run (3 seeds have 10 distinct resamples).

Tie rule: policy B is *better* than policy A when the 95% bootstrap interval of A's figure
minus B's lies entirely above 0. A policy's rank is 1 + the number of policies better than it;
rank 1 is *best or tied-best*. Equal figures (two policies that never act differently) always
tie. Nothing here ranks by a point estimate alone.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

N_BOOT = 2000
LEVEL = 0.95
BOOT_SEED = 0

METRICS: dict[str, tuple[str, str, str]] = {
    "goodput": ("goodput_tok_s", "pct", "SLO goodput over the span (steady start to the end of "
                "the last lasting-harm window), regret in % of healthy"),
    "attainment": ("span_attainment", "pp", "SLO attainment of the requests arriving in the "
                   "span, regret in points"),
    "throughput": ("span_completed_tok_s", "pct", "output tokens/s of every request that "
                   "completed in the span, SLO or not (work done: past capacity, where few "
                   "requests meet the SLO, a fault that holds clients' slots lowers queueing "
                   "and can raise SLO goodput), regret in % of healthy"),
    "lasting": ("lasting_goodput_tok_s", "pct", "SLO goodput in the lasting-harm window after "
                "the fault's end, regret in % of healthy (faults with an end only)"),
}
"""Decision metrics: name -> (column, unit of regret, meaning)."""
MIXES = ("worst", "mean")


def boot_index(n: int, b: int = N_BOOT, seed: int = BOOT_SEED) -> np.ndarray:
    """(b, n) resamples of range(n) with replacement; the first row is the sample itself."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(b, n))
    idx[0] = np.arange(n)
    return idx


def value_cubes(runs: pd.DataFrame, healthy: pd.DataFrame, column: str,
                policies: Sequence[str], faults: Sequence[str], seeds: Sequence[int]
                ) -> tuple[np.ndarray, np.ndarray]:
    """(V, H)[policy, fault, seed]: the runs' and their healthy runs' values of ``column``
    (NaN where missing)."""
    P, F, S = len(policies), len(faults), len(seeds)
    v = np.full((P, F, S), np.nan)
    h = np.full((P, F, S), np.nan)
    if column not in runs or column not in healthy:
        return v, h
    pi = {p: i for i, p in enumerate(policies)}
    fi = {f: i for i, f in enumerate(faults)}
    si = {s: i for i, s in enumerate(seeds)}
    for p, f, s, x in zip(runs.policy, runs.fault, runs.seed, runs[column], strict=True):
        if p in pi and f in fi and s in si:
            v[pi[p], fi[f], si[s]] = x
    own = "policy" in healthy
    hp = healthy.policy if own else [None] * len(healthy)
    for p, f, s, x in zip(hp, healthy.fault, healthy.seed, healthy[column], strict=True):
        if f not in fi or s not in si:
            continue
        if own:
            if p in pi:
                h[pi[p], fi[f], si[s]] = x
        else:
            h[:, fi[f], si[s]] = x
    return v, h


def regret(v: np.ndarray, h: np.ndarray, unit: str) -> np.ndarray:
    """Regret from value cubes (:func:`value_cubes`): the best policy's value at the fault and
    seed minus each one's, in % of healthy (``pct``) or in points of a share (``pp``)."""
    with np.errstate(invalid="ignore", divide="ignore"), _quiet():
        diff = np.nanmax(v, axis=0, keepdims=True) - v
        if unit == "pp":
            return 100.0 * diff
        return np.where(h > 0, 100.0 * diff / h, np.nan)


def regret_cube(runs: pd.DataFrame, healthy: pd.DataFrame, column: str, unit: str,
                policies: Sequence[str], faults: Sequence[str], seeds: Sequence[int]
                ) -> np.ndarray:
    """R[policy, fault, seed]: regret (see the module docstring); NaN where a run is missing
    or its healthy value is not positive (a window in which nothing was due)."""
    return regret(*value_cubes(runs, healthy, column, policies, faults, seeds), unit)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """No 'All-NaN slice' / 'Mean of empty slice' warnings: NaN is the answer there."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def figure(R: np.ndarray, mix: str | int, idx: np.ndarray) -> np.ndarray:
    """(b, policies): each resample's figure of each policy under ``mix`` ("worst", "mean" or a
    fault's index)."""
    with _quiet():
        per_fault = np.nanmean(R[:, :, idx], axis=-1)  # (P, F, b)
        if isinstance(mix, int | np.integer):
            out = per_fault[:, mix, :]
        elif mix == "worst":
            out = np.nanmax(per_fault, axis=1)
        elif mix == "mean":
            out = np.nanmean(per_fault, axis=1)
        else:
            raise ValueError(f"unknown fault mix {mix!r}: worst, mean or a fault")
    return out.T


@dataclass
class Verdict:
    """One condition x metric x mix: each policy's figure, interval, difference from the best,
    and rank under the tie rule."""

    table: pd.DataFrame  # policy, regret, lo, hi, vs_best, vs_best_lo, vs_best_hi, rank
    n_seeds: int

    @property
    def best(self) -> list[str]:
        """Best or tied-best (rank 1), best point estimate first."""
        t = self.table
        return list(t[t["rank"] == 1].sort_values("regret", kind="stable").policy)

    @property
    def known(self) -> bool:
        return bool(self.table.regret.notna().any())


def decide(R: np.ndarray, policies: Sequence[str], mix: str | int,
           idx: np.ndarray | None = None) -> Verdict:
    """The tie rule over the figures of ``R`` (see the module docstring)."""
    P, _F, S = R.shape
    idx = boot_index(S) if idx is None else idx
    b = figure(R, mix, idx)  # (B, P); row 0: the sample
    point = b[0]
    a = (1 - LEVEL) / 2
    with _quiet():
        lo, hi = np.nanpercentile(b, 100 * a, axis=0), np.nanpercentile(b, 100 * (1 - a), axis=0)
    finite = np.isfinite(point)
    rank = np.full(P, np.nan)
    vs, vs_lo, vs_hi = (np.full(P, np.nan) for _ in range(3))
    if finite.any():
        best = int(np.nanargmin(np.where(finite, point, np.inf)))
        d = b[:, :, None] - b[:, None, :]  # d[:, p, q] > 0: q has less regret than p
        with _quiet():
            d_lo = np.nanpercentile(d, 100 * a, axis=0)  # (P, P)
            d_hi = np.nanpercentile(d, 100 * (1 - a), axis=0)
        ok = finite[:, None] & finite[None, :] & ~np.eye(P, dtype=bool)
        better = (ok & (d_lo > 0)).sum(axis=1)
        rank = np.where(finite, 1.0 + better, np.nan)
        vs = np.where(finite, point - point[best], np.nan)
        vs_lo = np.where(finite, d_lo[:, best], np.nan)
        vs_hi = np.where(finite, d_hi[:, best], np.nan)
        vs_lo[best] = vs_hi[best] = 0.0
        rank[best] = 1.0
    t = pd.DataFrame({"policy": list(policies), "regret": point, "lo": lo, "hi": hi,
                      "vs_best": vs, "vs_best_lo": vs_lo, "vs_best_hi": vs_hi, "rank": rank})
    for c in ("regret", "lo", "hi", "vs_best", "vs_best_lo", "vs_best_hi"):
        t[c] = t[c].round(6) + 0.0  # (no -0.0)
    return Verdict(t, S)


def mean_ci(x: np.ndarray, idx: np.ndarray | None = None) -> tuple[float, float, float]:
    """Mean over seeds of ``x`` (NaN left out) and its percentile bootstrap interval."""
    x = np.asarray(x, float)
    if not np.isfinite(x).any():
        return math.nan, math.nan, math.nan
    idx = boot_index(len(x)) if idx is None else idx
    with _quiet():
        m = np.nanmean(x[idx], axis=1)
        a = (1 - LEVEL) / 2
        return (float(m[0]), float(np.nanpercentile(m, 100 * a)),
                float(np.nanpercentile(m, 100 * (1 - a))))


def fmt_iv(v: float, lo: float, hi: float, digits: int = 1) -> str:
    """``v [lo, hi]`` (``v`` alone when the interval is a point)."""
    if not math.isfinite(v):
        return "n/a"

    def f(x: float) -> str:
        s = f"{x:,.{digits}f}"
        return s[1:] if s.startswith("-") and float(s.replace(",", "")) == 0 else s

    if not (math.isfinite(lo) and math.isfinite(hi)) or (f(lo) == f(v) == f(hi)):
        return f(v)
    return f"{f(v)} [{f(lo)}, {f(hi)}]"


RULE = ("best or tied-best: no other policy is better, i.e. has a 95% paired bootstrap "
        "interval (over seeds) of the difference in regret entirely in its favour; rank = 1 + "
        "the number of policies better than it")

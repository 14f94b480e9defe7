"""Figures of an exploration (matplotlib): each reported figure against each unknown, with
its band shaded, and a pair plot of the accepted samples.

    fig = explore_plots.figures_vs_unknowns(ex)
    fig = explore_plots.accepted_pairs(ex)
    explore_plots.save(ex, "explore-drop_timeout")    # both, as PNG next to runs.parquet
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from pdsim.analysis.explore import Exploration, _as_number, _within

IN = "#1b7837"
ONE = "#67a9cf"
OUT = "#bababa"
BAND = "#a6dba0"


def _axis(ax: plt.Axes, ex: Exploration, j: int, which: str = "x") -> None:
    """Unknown ``j`` on the ``which`` axis: its range (log for a loguniform one, ticked at
    1-2-5 in plain numbers: the minor labels of a log axis overlap) or its choices by name."""
    from matplotlib.ticker import LogLocator, MaxNLocator, NullFormatter, ScalarFormatter

    u = ex.unknowns[j]
    x = which == "x"
    axis, set_lim = (ax.xaxis, ax.set_xlim) if x else (ax.yaxis, ax.set_ylim)
    if not u.numeric:
        names = [str(c) for c in u.choices]
        slant = {"rotation": 20, "ha": "right"} if x else {}
        (ax.set_xticks if x else ax.set_yticks)(range(len(names)), names, fontsize=7, **slant)
        set_lim(-0.5, len(names) - 0.5)
    elif u.dist == "loguniform":
        (ax.set_xscale if x else ax.set_yscale)("log")
        axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(ScalarFormatter())
        axis.set_minor_formatter(NullFormatter())
        set_lim(u.low, u.high)
    elif getattr(u, "integer", False):  # whole values, their spread (_jitter) in view
        axis.set_major_locator(MaxNLocator(integer=True))
        set_lim(u.low - 0.5, u.high + 0.5)
    else:
        set_lim(u.low, u.high)


def _jitter(x: np.ndarray, u: object, salt: int = 0) -> np.ndarray:
    """Spread stacked points of a choice or an integer (the data are not moved); ``salt``
    draws the spread of each axis apart (one spread on both axes lines the points up on a
    diagonal)."""
    if getattr(u, "numeric", True) and not getattr(u, "integer", False):
        return x
    rng = np.random.default_rng(salt)
    return x + rng.uniform(-0.15, 0.15, len(x))


def figures_vs_unknowns(ex: Exploration) -> plt.Figure:
    """One panel per (reported figure, unknown): runs as dots (green inside every band),
    the reported value as a line and its band shaded, the nominal value dashed."""
    figs = ex.figures
    unk = ex.unknowns
    nr, nc = max(1, len(figs)), len(unk)
    fig, axes = plt.subplots(nr, nc, figsize=(max(5.5, 3.6 * nc + 0.6), 2.6 * nr + 1.0),
                             squeeze=False, layout="constrained")
    runs = ex.runs
    joint = np.ones(len(runs), dtype=bool)
    for r in figs:
        joint &= _within(runs, r).to_numpy()
    for i, r in enumerate(figs):
        y = runs[r.metric].astype(float).to_numpy() if r.metric in runs else np.full(len(runs),
                                                                                     np.nan)
        for j, u in enumerate(unk):
            ax = axes[i][j]
            x = _jitter(_as_number(runs, u).to_numpy(), u)
            ax.axhspan(r.reported - r.limit, r.reported + r.limit, color=BAND, alpha=0.5, lw=0,
                       label="reported ± band")
            ax.axhline(r.reported, color=IN, lw=1)
            this = _within(runs, r).to_numpy()
            ax.scatter(x[~this], y[~this], s=9, color=OUT, label="run")
            ax.scatter(x[this & ~joint], y[this & ~joint], s=10, color=ONE,
                       label="within this band")
            ax.scatter(x[joint], y[joint], s=12, color=IN, label="within every band")
            nominal = u.nominal if u.numeric else list(u.choices).index(u.nominal)
            ax.axvline(nominal, color="k", lw=0.8, ls="--", label="nominal")
            _axis(ax, ex, j)
            if i == nr - 1:
                ax.set_xlabel(u.path)
            if j == 0:
                ax.set_ylabel(textwrap.fill(r.label, 26), fontsize=8)
    fig.suptitle(f"{ex.scenario.name}: reported figures against each declared unknown\n"
                 f"({len(runs)} runs; band shaded, nominal dashed)", fontsize=10)
    if figs:  # one legend under the panels, off every one (in the first it covered the band)
        fig.legend(*axes[0][0].get_legend_handles_labels(), loc="outside lower center",
                   ncol=5, fontsize=7, frameon=False)
    return fig


def accepted_pairs(ex: Exploration) -> plt.Figure:
    """Pair plot of the unknowns: every run in grey, the runs within every band in green;
    histograms of each unknown (all vs accepted) on the diagonal. When no run is within every
    band (the figure was all grey), the runs are coloured by how many of the reported figures
    they reproduce and the best ones stand out, so the figure still shows where the closest
    runs are, and its title says that none reproduces them all."""
    unk = ex.unknowns
    d = len(unk)
    runs = ex.runs
    k = len(ex.figures)
    fits = np.zeros(len(runs), dtype=int)
    for r in ex.figures:
        fits += _within(runs, r).to_numpy().astype(int)
    joint = fits == k if k else np.zeros(len(runs), dtype=bool)
    n = int(joint.sum())
    best = int(fits.max()) if len(fits) else 0
    closest = (not n) and k and best > 0  # none accepted: show the runs that come closest
    shown = joint if n else fits == best if closest else joint
    label = "accepted" if n else f"closest: {best} of {k} figures" if closest else "accepted"
    fig, axes = plt.subplots(d, d, figsize=(max(5.5, 2.6 * d + 0.8), 2.6 * d + 1.0),
                             squeeze=False, layout="constrained")
    xs = [_as_number(runs, u).to_numpy() for u in unk]
    from matplotlib.colors import BoundaryNorm, ListedColormap

    # one shade per count of figures reproduced, 0 (palest) to k
    cmap = ListedColormap(plt.get_cmap("Greens")(np.linspace(0.15, 0.85, k + 1)))
    norm = BoundaryNorm(np.arange(-0.5, k + 1), k + 1)
    for i in range(d):
        for j in range(d):
            ax = axes[i][j]
            if i == j:
                u = unk[i]
                bins = (np.arange(len(u.choices) + 1) - 0.5) if not u.numeric else (
                    np.geomspace(u.low, u.high, 11) if u.dist == "loguniform"
                    else np.linspace(u.low, u.high, 11))
                ax.hist(xs[i], bins=bins, color=OUT, label="all runs")
                ax.hist(xs[i][shown], bins=bins, color=IN if n else ONE, label=label)
                _axis(ax, ex, i)
            else:
                x, y = _jitter(xs[j], unk[j], 1), _jitter(xs[i], unk[i], 2)
                if closest:  # each run by how many figures it reproduces
                    ax.scatter(x, y, s=8, c=fits, cmap=cmap, norm=norm,
                               edgecolors=OUT, linewidths=0.3)
                    ax.scatter(x[shown], y[shown], s=14, color=ONE, edgecolors="black",
                               linewidths=0.4)
                else:
                    ax.scatter(x, y, s=8, color=OUT)
                    ax.scatter(x[joint], y[joint], s=12, color=IN)
                _axis(ax, ex, j)
                _axis(ax, ex, i, "y")
            if i == d - 1:
                ax.set_xlabel(unk[j].path, fontsize=8)
            if j == (1 if i == 0 else 0) and i != j:  # row 0's first scatter is column 1
                ax.set_ylabel(unk[i].path, fontsize=8)
    if n:
        title = f"{ex.scenario.name}: {n} of {len(runs)} runs\nreproduce every reported figure"
    elif not k:
        title = f"{ex.scenario.name}:\nno reported figures to accept runs by"
    else:
        title = (f"{ex.scenario.name}: no run reproduces every reported figure\n"
                 f"(best: {best} of {k}; blue: those runs, the rest shaded by how many "
                 f"they reproduce)")
    fig.suptitle(title, fontsize=10)
    if closest:
        sm = plt.cm.ScalarMappable(cmap=cmap, norm=norm)
        fig.colorbar(sm, ax=axes, shrink=0.6, ticks=range(k + 1),
                     label=f"reported figures within their band (of {k})")
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc="outside lower center", ncol=2,
               fontsize=7, frameon=False)  # (on the first histogram it covered its bars)
    return fig


def save(ex: Exploration, out: str | Path) -> list[Path]:
    """Write both figures as PNG into ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, make in (("figures_vs_unknowns", figures_vs_unknowns),
                       ("accepted_pairs", accepted_pairs)):
        fig = make(ex)
        p = out / f"{name}.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        written.append(p)
    return written

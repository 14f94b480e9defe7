"""The what-if's figures, as methods of :class:`pdsim.analysis.whatif_table.WhatIf`: goodput lost
by policy and fault (heatmap), goodput over time under one fault with its windows shaded, and
a figure against one policy parameter (``ttl_s``) with its intervals."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd


class PlotsMixin:
    """Figures of a :class:`~pdsim.analysis.whatif_table.WhatIf` (needs its table, runs,
    healthy runs, policies, faults and plan)."""

    def telling_fault(self) -> str:
        """The fault under which the policies differ most (the largest regret; the first on
        ties): the timeline worth drawing when none is named. Under the first fault of a
        matrix every policy's curve may be the same (a crash that no policy changes)."""
        t = self.table
        if t.empty or not (t.regret_pct > 0).any():
            return next(iter(self.faults))
        return str(t.loc[t.regret_pct.idxmax(), "fault"])

    def heatmap(self, ax: Any = None, metric: str = "goodput_lost_pct") -> Any:
        """Policy x fault heatmap of goodput lost (mean over seeds, % of healthy)."""
        import matplotlib.pyplot as plt

        piv = self.table.pivot(index="policy", columns="fault", values=metric)
        piv = piv.loc[[lbl for lbl, _ in self.policies if lbl in piv.index],
                      [f for f in self.faults if f in piv.columns]]
        if ax is None:
            _fig, ax = plt.subplots(figsize=(1.3 * len(piv.columns) + 3,
                                             0.45 * len(piv.index) + 1.8),
                                    constrained_layout=True)
        vals = piv.to_numpy(float)
        top = max(1.0, float(np.nanmax(vals))) if np.isfinite(vals).any() else 1.0
        im = ax.imshow(vals, cmap="Reds", vmin=0, vmax=top, aspect="auto")
        ax.set_xticks(range(len(piv.columns)), piv.columns, rotation=30, ha="right")
        ax.set_yticks(range(len(piv.index)), piv.index)
        for i in range(vals.shape[0]):
            for j in range(vals.shape[1]):
                v = vals[i, j]
                ax.text(j, i, "–" if np.isnan(v) else f"{v:.0f}", ha="center", va="center",
                        fontsize=8, color="white" if v > 0.6 * top else "black")
        ax.figure.colorbar(im, ax=ax, label="SLO goodput lost over the span, % of healthy "
                           "(mean)")
        title = "goodput lost by policy and fault"
        ax.set_title(f"{title} ({self.condition})" if self.condition else title)
        return ax

    def timelines(self, fault: str, ax: Any = None, smooth_s: int = 5,
                  policies: Sequence[str] | None = None) -> Any:
        """Output tokens/s of completed requests over time for each policy under one fault
        (median over seeds; the SLO is not applied: this is work done), healthy
        dashed, the fault's window shaded and its lasting-harm window hatched."""
        import matplotlib.pyplot as plt

        if fault not in self.faults:
            raise ValueError(f"no fault {fault!r} in this matrix: {', '.join(self.faults)}")
        ax = ax or plt.subplots(figsize=(10, 4.5), constrained_layout=True)[1]
        runs = self.runs[self.runs.fault == fault]
        curves = [(lbl, _median_series(g.series, smooth_s))
                  for lbl in policies or [lbl for lbl, _ in self.policies]
                  if len(g := runs[runs.policy == lbl]) and all(len(s) for s in g.series)]
        groups = _identical(curves)  # one line per distinct curve, named by all it stands for
        lines = []
        for labels, curve in groups:
            line = ax.plot(curve, lw=1.4, label=" = ".join(labels))[0]
            lines.append((labels, line))
        h = self.healthy[self.healthy.fault == fault]
        if len(h) and "policy" in h:  # each policy's own healthy runs, in its colour
            for labels, line in lines:
                mine = [(lbl, _median_series(g.series, smooth_s)) for lbl in labels
                        if len(g := h[h.policy == lbl])]
                for same, curve in _identical(mine):
                    ax.plot(curve, color=line.get_color(), lw=0.8, ls="--",
                            label=f"{' = '.join(same)}, healthy")
        elif len(h) and all(len(s) for s in h.series):
            ax.plot(_median_series(h.series, smooth_s), color="black", lw=1, ls="--",
                    label="healthy")
        start, end = float(runs.fault_start_s.iloc[0]), float(runs.fault_end_s.iloc[0])
        if math.isfinite(start):
            ax.axvspan(start, max(min(end, ax.get_xlim()[1]), start + 0.5), color="#b2182b",
                       alpha=0.12, lw=0, label="fault")
        ws = (self.plan.windows.get(fault) or {}) if self.plan is not None else {}
        if ws.get("lasting"):
            a, b = ws["lasting"]
            ax.axvspan(a, b, facecolor="none", edgecolor="#555555", hatch="//", lw=0,
                       label="lasting-harm window")
        ax.set_xlabel("time (s)")
        ax.set_ylabel(f"completed tok/s ({smooth_s} s mean)")
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
        mean over seeds with its 95% interval."""
        import matplotlib.pyplot as plt
        from matplotlib.ticker import NullFormatter

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
        if metric == "goodput_tok_s" and len(h):
            if "policy" in h:  # each value's own
                own = h[h.policy.isin(xs)].groupby("policy").goodput_tok_s.mean()
                own = own.rename(index=xs).sort_index()
                ax.plot(own.index, own.to_numpy(), color="black", lw=1, ls="--",
                        label="healthy")
            else:
                ax.axhline(float(np.mean(h.goodput_tok_s)), color="black", lw=1, ls="--",
                           label="healthy")
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

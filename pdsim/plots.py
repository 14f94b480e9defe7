"""Figures for a postmortem, from a :class:`~pdsim.sim.Result` (matplotlib).

    fig = plots.postmortem(res)                   # four panels: the incident at a glance
    fig = plots.compare({"healthy": h, "drop": d, "forward": f})   # throughput side by side
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes

from pdsim.sim import Result

FLUSH = "#b2182b"
OK = "#2166ac"
FAIL = "#ef8a62"


def _flush_times(res: Result) -> list[float]:
    ev = res.events
    return sorted(ev[ev.event == "router_flush"].time.unique())


def _mark_flushes(ax: Axes, res: Result, label: bool = True) -> None:
    for i, t in enumerate(_flush_times(res)):
        ax.axvline(t, color=FLUSH, lw=1, ls="--", label="flush_cache" if label and i == 0 else None)


def throughput(res: Result, ax: Axes | None = None, smooth_s: int = 5,
               label: str | None = None) -> Axes:
    """Generated tokens/s over time (rolling mean), flushes marked."""
    ax = ax or plt.gca()
    ts = res.timeseries
    ax.plot(ts.time, ts.tokens_per_s.rolling(smooth_s, min_periods=1).mean(),
            color=OK, lw=1.6, label=label or "generated tok/s")
    _mark_flushes(ax, res)
    ax.set_ylabel("tokens / s")
    ax.set_ylim(bottom=0)
    return ax


def failures(res: Result, ax: Axes | None = None) -> Axes:
    """Failed requests per second, with blacklisted pairs on a second axis."""
    ax = ax or plt.gca()
    ts = res.timeseries
    ax.bar(ts.time, ts.failed_per_s, width=float(res.scenario.timeseries_interval_s),
           color=FAIL, label="failed requests / s")
    ax.set_ylabel("failed / s")
    ax2 = ax.twinx()
    ax2.step(ts.time, ts.blacklisted_pairs, where="post", color=FLUSH, lw=1.6,
             label="blacklisted pairs")
    sc = res.scenario.fleet
    pairs = sc.prefill.servers * sc.prefill.dp * sc.decode.servers * sc.decode.dp
    ax2.set_ylim(0, pairs + 0.5)
    ax2.set_ylabel(f"blacklisted pairs (of {pairs})")
    _mark_flushes(ax, res, label=False)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, loc="upper left", frameon=True, framealpha=0.9)
    return ax


def pair_matrix(res: Result, ax: Axes | None = None) -> Axes:
    """Requests failed per (prefill rank, decode session) pair; blacklisted pairs outlined."""
    ax = ax or plt.gca()
    req = res.measured
    req = req[req.p_rank >= 0]
    prefill = (req.p_server.astype(str) + ".r" + req.p_rank.astype(str)).rename("prefill")
    failed = req.status.eq("failed").groupby([prefill, req.session]).sum().unstack(fill_value=0)
    total = req.groupby([prefill, req.session]).size().unstack(fill_value=0)
    share = (failed / total.replace(0, np.nan)).fillna(0)
    im = ax.imshow(share.to_numpy(), cmap="Reds", vmin=0, vmax=1, aspect="auto")
    ax.set_xticks(range(share.shape[1]), [s.split(":")[0] for s in share.columns],
                  rotation=30, ha="right")
    ax.set_yticks(range(share.shape[0]), [f"prefill-{p}" for p in share.index])
    for i in range(share.shape[0]):
        for j in range(share.shape[1]):
            ax.text(j, i, f"{int(failed.iat[i, j])}/{int(total.iat[i, j])}", ha="center",
                    va="center", fontsize=8,
                    color="white" if share.iat[i, j] > 0.6 else "black")
    ax.set_title("failed / routed requests per pair", fontsize=10)
    plt.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="failed share")
    return ax


def outcomes(res: Result, ax: Axes | None = None, bin_s: float = 2.0) -> Axes:
    """Requests finishing per time bin, completed vs failed, per client."""
    ax = ax or plt.gca()
    req = res.measured[res.measured.status.isin(["completed", "failed"])]
    if req.empty:
        return ax
    bins = np.arange(0, req.t_done.max() + bin_s, bin_s)
    ax.hist([req[req.status == "completed"].t_done, req[req.status == "failed"].t_done],
            bins=bins, color=[OK, FAIL], stacked=True, label=["completed", "failed"])
    _mark_flushes(ax, res, label=False)
    ax.set_ylabel(f"requests / {bin_s:g} s")
    ax.legend(loc="upper right", frameon=False)
    return ax


def postmortem(res: Result, title: str | None = None) -> plt.Figure:
    """Four panels: throughput, failures and blacklist, outcomes, the pair matrix."""
    fig = plt.figure(figsize=(13, 8), constrained_layout=True)
    gs = fig.add_gridspec(3, 2, width_ratios=[2.2, 1])
    ax1 = fig.add_subplot(gs[0, 0])
    ax2 = fig.add_subplot(gs[1, 0], sharex=ax1)
    ax3 = fig.add_subplot(gs[2, 0], sharex=ax1)
    ax4 = fig.add_subplot(gs[:, 1])
    throughput(res, ax1)
    ax1.legend(loc="upper right", frameon=False)
    failures(res, ax2)
    outcomes(res, ax3)
    ax3.set_xlabel("simulated time (s)")
    pair_matrix(res, ax4)
    s = res.summary
    real = s["transfer_failures_by_reason"].get("flush_freed_pages", 0)
    fig.suptitle(title or f"{res.scenario.name}: {real} flush-caused transfer failures -> "
                 f"{s['failed']} failed requests, {s['blacklisted_pairs_max']} pairs "
                 f"blacklisted", fontsize=12)
    return fig


def compare(results: dict[str, Result], smooth_s: int = 5) -> plt.Figure:
    """Generated tokens/s of several runs on one axis."""
    fig, ax = plt.subplots(figsize=(10, 4), constrained_layout=True)
    for i, (name, res) in enumerate(results.items()):
        ts = res.timeseries
        ax.plot(ts.time, ts.tokens_per_s.rolling(smooth_s, min_periods=1).mean(), lw=1.6,
                label=name, color=plt.cm.tab10(i))
        for t in _flush_times(res):
            ax.axvline(t, color=plt.cm.tab10(i), lw=0.8, ls=":")
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("generated tokens / s")
    ax.set_ylim(bottom=0)
    ax.legend(frameon=False)
    return fig


def sweep_bars(df: pd.DataFrame, x: str, y: str = "empty_share", ax: Axes | None = None) -> Axes:
    """Median and range of a sweep metric per value of a varied key."""
    ax = ax or plt.gca()
    g = df.groupby(x)[y]
    med, lo, hi = g.median(), g.min(), g.max()
    ax.bar(range(len(med)), med, yerr=[med - lo, hi - med], color=OK, alpha=0.8, capsize=4)
    ax.set_xticks(range(len(med)), [str(v) for v in med.index])
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    return ax

"""What every pdsim figure shares (:mod:`pdsim.output.plots` re-exports it): the colour
scheme, legends and titles that never sit on the data, and the flushes, marked on any time
axis with a note of what each did (notes that would overprint moved a row down)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.lines import Line2D

from pdsim.output.result import Result

OK = "#2166ac"
FAIL = "#ef8a62"
FLUSH = "#b2182b"  # a harmful flush, and blacklisted pairs
HARMLESS = "#969696"
PREFILL = "#01665e"
DECODE = "#8c510a"
CLIENTS = ["#6a51a3", "#c51b8a", "#3f007d", "#f768a1", "#9e9ac8"]
TIME = "simulated time (s)"


def client_color(res: Result, name: str) -> str:
    names = [c.name for c in res.scenario.clients]
    return CLIENTS[names.index(name) % len(CLIENTS)] if name in names else "black"


def _legend(ax: Axes, handles: list | None = None, ncol: int = 4, **kw) -> None:
    """Legend above the axes, right-aligned: never on the data (the title goes above it)."""
    h, lab = (handles, [x.get_label() for x in handles]) if handles else \
        ax.get_legend_handles_labels()
    if h:
        ax.legend(h, lab, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=ncol,
                  frameon=False, fontsize=8, borderaxespad=0.2, **kw)
        ax._pdsim_legend_rows = -(-len(h) // ncol)  # noqa: SLF001 (read by _title)
        _fit_title(ax)


def _title(ax: Axes, text: str) -> None:
    ax.set_title(text, loc="left", fontsize=10, fontweight="bold")
    _fit_title(ax)


def _fit_title(ax: Axes) -> None:
    """Lift the title above a legend row placed over the axes, so neither hides the other."""
    rows = getattr(ax, "_pdsim_legend_rows", 0)
    if ax.get_title(loc="left") and rows:
        ax.set_title(ax.get_title(loc="left"), loc="left", fontsize=10, fontweight="bold",
                     pad=6 + 13 * rows)


# --- flushes ------------------------------------------------------------------------------


def flush_table(res: Result) -> pd.DataFrame:
    """One row per POST /flush_cache: who called it, when the ranks flushed, and how many
    pending transfers the pages they freed doomed (``doomed``, by ``flush.dooms``: in flight,
    or not yet started under ``source_and_unstarted``; ``harmful`` if any)."""
    ev = res.events
    calls = ev[ev.event == "router_flush"]
    answers = ev[ev.event == "router_flush_answer"]
    execs = ev[ev.event == "flush_executed"]
    rows = []
    used: set = set()
    for c in calls.itertuples(index=False):
        mine = answers[(answers.peer == c.peer) & (answers.time >= c.time)
                       & ~answers.index.isin(used)]
        t_ans = mine.time.iloc[0] if len(mine) else float(res.summary["simulated_s"])
        if len(mine):
            used.add(mine.index[0])
        ex = execs[(execs.time >= c.time) & (execs.time <= t_ans)]
        rows.append({"t_call": c.time, "t_answer": t_ans, "caller": c.peer,
                     "t_flush": ex.time.min() if len(ex) else np.nan,
                     "ranks_flushed": len(ex), "doomed": int(ex.value.sum()),
                     "timeout_dropped": "dropped" in c.detail})
    df = pd.DataFrame(rows, columns=["t_call", "t_answer", "caller", "t_flush",
                                     "ranks_flushed", "doomed", "timeout_dropped"])
    df["harmful"] = df.doomed > 0
    return df


def mark_flushes(res: Result, ax: Axes, annotate: bool = False) -> list[Line2D]:
    """Vertical lines at the instants ranks flushed: harmful solid dark red, harmless dashed
    grey; ``annotate`` writes what each flush did beside it. Returns legend handles."""
    handles = {}
    notes = []
    for f in flush_table(res).itertuples(index=False):
        if np.isnan(f.t_flush):
            continue
        color, ls = (FLUSH, "-") if f.harmful else (HARMLESS, "--")
        ax.axvline(f.t_flush, color=color, lw=1.4 if f.harmful else 1.0, ls=ls, zorder=1)
        key = "harmful" if f.harmful else "harmless"
        handles[key] = Line2D([], [], color=color, ls=ls, label=(
            "flush freeing pages of pending transfers" if f.harmful
            else "flush with no transfer pending"))
        if annotate:  # in the headroom above the data; harmless ones a line lower
            why = ", ?timeout dropped" if f.timeout_dropped else ""
            text = (f"flush_cache ({f.caller}{why}):\n{f.doomed} transfers on freed pages"
                    if f.harmful else f"flush ({f.caller}): no transfer pending")
            notes.append(ax.annotate(
                text, xy=(f.t_flush, 0.98 if f.harmful else 0.84),
                xycoords=("data", "axes fraction"), xytext=(5, 0), textcoords="offset points",
                va="top", fontsize=8, color=color, fontweight="bold" if f.harmful else "normal",
                bbox={"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.8}))
    if notes:
        ax._pdsim_flush_notes = notes  # noqa: SLF001 (read by spread_notes)
        spread_notes(ax)
    return list(handles.values())


def spread_notes(ax: Axes, step: float = 0.11) -> float:
    """Move flush notes that would overprint one another down a row each, in the order they
    were drawn, until none overlaps one placed before it (two flushes seconds apart printed
    their notes on top of each other); returns the lowest note's bottom (axes fraction). Call
    again after the figure's layout changed the axes' size (:func:`postmortem` does)."""
    notes = getattr(ax, "_pdsim_flush_notes", [])
    if not notes:
        return 1.0
    renderer = ax.figure.canvas.get_renderer()
    placed = []
    for t in notes:
        t.xy = (t.xy[0], 0.98 if t.get_fontweight() == "bold" else 0.84)
        for _ in range(8):
            box = t.get_window_extent(renderer)
            if not any(box.overlaps(p) for p in placed):
                break
            t.xy = (t.xy[0], t.xy[1] - step)
        placed.append(t.get_window_extent(renderer))
    to_axes = ax.transAxes.inverted()
    return min(to_axes.transform((0, p.y0))[1] for p in placed)

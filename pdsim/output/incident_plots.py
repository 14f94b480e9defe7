"""Figures for SGLang's PD timeout and abort paths (issue 26): decode slots held by dead rooms,
the trigger's window and the recovery, and the incident's measures as text. Used by
:func:`pdsim.output.plots.postmortem` for a run with an incident block (faults, or dead rooms),
and on their own:

    fig, ax = plt.subplots(); incident_plots.dead_slots(res, ax)   # trigger marked too
    incident_plots.dead_room_intervals(res)     # one row per dead room: when, why, how freed
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.patches import Patch

from pdsim.output.result import Result

DEAD = "#762a83"  # slots held by dead rooms
LIVE = "#8c510a"  # decode slots in use (the decode colour of pdsim.output.plots)
TRIGGER = "#fdb863"
RECOVERED = "#1a9850"


def dead_room_intervals(res: Result) -> pd.DataFrame:
    """One row per dead room (a decode slot held by a room that cannot complete): the decode
    rank, request, start, end (the run's end if still held), why it was dead and what freed
    it, and how long it held the slot."""
    ev = res.events
    end = float(res.summary["simulated_s"])
    dead = ev[ev.event == "dead_room"]
    freed = ev[ev.event == "dead_room_freed"]
    off = {(r.component, r.rank, r.rid): (r.time, r.detail)
           for r in freed.itertuples(index=False)}
    rows = []
    for r in dead.itertuples(index=False):
        t1, how = off.get((r.component, r.rank, r.rid), (end, ""))
        rows.append({"decode": f"{r.component}.r{r.rank}", "rid": r.rid, "room": r.room,
                     "start": r.time, "end": t1, "cause": r.detail, "freed_by": how,
                     "held_s": t1 - r.time})
    return pd.DataFrame(rows, columns=["decode", "rid", "room", "start", "end", "cause",
                                       "freed_by", "held_s"])


def _slots(res: Result) -> int:
    """The decode fleet's request slots: running ones and the pre-allocation extras."""
    from pdsim.model.memory import running_limits

    d = res.scenario.fleet.decode
    n = running_limits(res.scenario)["decode"]
    return d.servers * d.dp * (n + d.extra_slots(n))


def dead_slots(res: Result, ax: Axes | None = None) -> Axes:
    """Decode slots held by dead rooms over time, stacked by cause, under the slots in use
    (awaiting KV or running) and the fleet's slot count."""
    ax = ax or plt.gca()
    iv = dead_room_intervals(res)
    ts = res.timeseries
    ax.plot(ts.time, ts.decode_transfer + ts.decode_running, color=LIVE, lw=1.2,
            label="decode slots in use (awaiting KV + running)")
    ax.axhline(_slots(res), color=LIVE, lw=0.8, ls=":",
               label="decode slots (running + pre-allocation)")
    end = float(res.summary["simulated_s"])
    grid = np.asarray(ts.time, float) if len(ts) else np.array([0.0, end])
    causes = sorted(set(iv.cause)) if len(iv) else []
    below = np.zeros(len(grid))
    colors = plt.cm.Purples(np.linspace(0.85, 0.45, max(1, len(causes))))
    for c, color in zip(causes, colors, strict=False):
        one = iv[iv.cause == c]
        held = ((one.start.to_numpy()[:, None] <= grid) & (one.end.to_numpy()[:, None] > grid))
        n = held.sum(axis=0)
        ax.fill_between(grid, below, below + n, step="post", color=color, alpha=0.9,
                        label=f"held by dead rooms: {c}", lw=0)
        below = below + n
    if not causes:
        ax.text(0.5, 0.5, "no decode slot held by a dead room", transform=ax.transAxes,
                ha="center", va="center", color="#969696")
    mark_trigger(res, ax)
    ax.set_ylabel("decode slots")
    ax.set_ylim(bottom=0)
    h, _ = ax.get_legend_handles_labels()
    ax.legend(h, [x.get_label() for x in h], loc="lower right", bbox_to_anchor=(1.0, 1.0),
              ncol=2, frameon=False, fontsize=8, borderaxespad=0.2)
    ax._pdsim_legend_rows = -(-len(h) // 2)  # noqa: SLF001 (read by plots._title)
    return ax


def mark_trigger(res: Result, ax: Axes) -> list:
    """Shade the trigger's window (the faults') and mark the recovery (the summary's incident
    block: goodput back within 10% of before and no request stuck), or, with requests still
    stuck, only when goodput was back (dotted); returns the legend handles it drew."""
    inc = res.summary.get("incident") or {}
    a, b = inc.get("trigger_from_s"), inc.get("trigger_to_s")
    handles = []
    if a is not None:
        ax.axvspan(a, max(b, a + 1e-9), color=TRIGGER, alpha=0.3, lw=0)
        handles.append(Patch(color=TRIGGER, alpha=0.3, label="trigger (faults)"))
    rec, back = inc.get("recovery_s"), inc.get("goodput_recovery_s")
    if rec is not None and b is not None:
        ax.axvline(b + rec, color=RECOVERED, lw=1.2, ls="--")
        handles.append(plt.Line2D([], [], color=RECOVERED, ls="--",
                                  label=f"recovered (+{rec:g} s)"))
    elif back is not None and b is not None:  # (goodput back, requests still stuck)
        ax.axvline(b + back, color=RECOVERED, lw=1.2, ls=":")
        handles.append(plt.Line2D([], [], color=RECOVERED, ls=":",
                                  label=f"goodput back (+{back:g} s), requests stuck"))
    return handles


def incident_text(res: Result, ax: Axes | None = None) -> Axes:
    """The incident's measures as text (what the report prints under the fleet)."""
    from pdsim.output import incident_report

    ax = ax or plt.gca()
    ax.set_axis_off()
    lines: list[str] = []

    def line(label: str, value: object) -> str:
        return f"{label} {value}"

    lines.append(incident_report.release_line(res.scenario))
    lines += incident_report.block(res.summary, line)
    text = "\n".join(_wrap(x, 70) for x in lines)
    ax.text(0.0, 1.0, text, transform=ax.transAxes, va="top", ha="left", fontsize=8,
            family="monospace")
    return ax


def _wrap(s: str, width: int) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(s, width, subsequent_indent="  "))

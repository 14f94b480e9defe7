"""Named windows of simulated time, from each fault's own timing, and the SLO metrics over them.

Why: a figure divided by the length of its run measures how long the run lasted as much as what
the fleet did (a closed loop of fixed prompts ends later under a fault, so a policy that
finishes fewer prompts can score better). Every what-if figure is over a window of simulated
time that is the same for every policy and seed it is compared with:

- ``before``: from the load's steady start (``steady_s``) to the fault's start;
- ``during``: the fault's own window (none for an instant fault such as the flush race);
- ``recovery``: ``recovery_s`` after the fault's end;
- ``lasting``: the ``lasting_s`` after that: capacity still lost once the fault is over (a
  permanent blacklist of a decode that came back, a pair left out after a link's return);
- ``span``: from the steady start to the end of the last lasting window of the matrix
  (:func:`plan`): the whole measured stretch, the same for every fault set.

A fault with no end in the run (errors for the whole run, a crash that never restarts) has no
recovery or lasting window: its ``during`` runs to the span's end. The metrics of a window are
:func:`pdsim.engine.slo.window`'s (attainment of the requests that arrived in it, goodput of
those that completed in it within the SLO, errors that ended in it): one definition, read here.

Runs last ``drain_s`` past the span, so that a request arriving just before its end can still
meet the SLO; :func:`plan` gives the horizon and the load the what-if must keep up to it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

WINDOWS = ("before", "during", "recovery", "lasting", "span")
METRICS = ("goodput_tok_s", "attainment", "errors", "completed_tok_s")
"""Per window: SLO goodput (tok/s), SLO attainment (share of arrivals), errors (requests that
ended failed or timed out) and completed tokens/s (SLO or not)."""


@dataclass(frozen=True)
class Timeline:
    """The chosen lengths that turn fault timings into windows (seconds of simulated time).

    Chosen, not measured: ``steady_s`` 10 (the library's load is steady from ~5 s: its note on
    ``flush_race``), ``recovery_s`` 30 (the writes that met a dead path at the fault's end wait
    out the 30 s transfer timeout), ``lasting_s`` 60 (two transfer timeouts, a TTL of up to
    ~60 s has expired in it and a permanent entry has not), ``drain_s`` 60 (a request meeting
    the library's SLO ends within ~6 s of its arrival; a minute leaves the queues behind a
    fault time to empty)."""

    steady_s: float = 10.0
    recovery_s: float = 30.0
    lasting_s: float = 60.0
    drain_s: float = 60.0

    def __post_init__(self) -> None:
        for k, v in asdict(self).items():
            if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
                raise ValueError(f"timeline {k}: give a finite number of seconds >= 0")
        if self.lasting_s <= 0:
            raise ValueError("timeline lasting_s: give a window of more than 0 s")

    def describe(self) -> str:
        return (f"steady from {self.steady_s:g} s; recovery {self.recovery_s:g} s and lasting "
                f"harm {self.lasting_s:g} s after each fault's end; runs go on {self.drain_s:g} "
                f"s past the span so late arrivals can finish")


def fault_span(items: Iterable[Any]) -> tuple[float, float]:
    """(start, end) of a set of loaded faults (``FaultParams``), from their own windows; end
    inf when one has no end in any run (``window(inf)``); (nan, nan) for no fault."""
    ws = [f.window(math.inf) for f in items]
    if not ws:
        return math.nan, math.nan
    return min(w[0] for w in ws), max(w[1] for w in ws)


@dataclass(frozen=True)
class Plan:
    """The matrix's measured span, the runs' horizon, and each fault set's windows."""

    timeline: Timeline
    t_end: float  # end of the span (the last lasting window of any fault set)
    horizon: float  # t_end + drain_s: how long every run lasts
    windows: dict[str, dict[str, tuple[float, float] | None]]

    def table(self) -> list[dict]:
        """One row per fault set: its windows as 'a-b s' (or 'none')."""
        rows = []
        for name, ws in self.windows.items():
            rows.append({"fault": name, **{w: _fmt(ws.get(w)) for w in WINDOWS}})
        return rows


def _fmt(w: tuple[float, float] | None) -> str:
    return "none" if w is None else f"{w[0]:g}-{w[1]:g} s"


def plan(spans: Mapping[str, tuple[float, float]], tl: Timeline = Timeline(),
         t_end: float | None = None) -> Plan:
    """Windows for fault sets given as name -> (start, end) (:func:`fault_span`); the span
    ends after the last fault's lasting window, or at ``t_end`` if given and later (a matrix
    run beside another keeps the other's span)."""
    marks = [tl.steady_s]
    for start, end in spans.values():
        if math.isfinite(end):
            marks.append(end)
        elif math.isfinite(start):
            marks.append(start)
    t_end = max(max(marks) + tl.recovery_s + tl.lasting_s, t_end or 0.0)
    windows = {name: windows_of(start, end, tl, t_end) for name, (start, end) in spans.items()}
    return Plan(tl, t_end, t_end + tl.drain_s, windows)


def windows_of(start: float, end: float, tl: Timeline, t_end: float
               ) -> dict[str, tuple[float, float] | None]:
    """The named windows of one fault set (see the module docstring), clipped to the span."""
    a0 = tl.steady_s

    def clip(a: float, b: float) -> tuple[float, float] | None:
        a, b = max(a, a0), min(b, t_end)
        return (a, b) if b > a else None

    out: dict[str, tuple[float, float] | None] = dict.fromkeys(WINDOWS)
    out["span"] = (a0, t_end)
    if not math.isfinite(start):  # no fault: only the span
        return out
    out["before"] = clip(a0, start)
    out["during"] = clip(start, end)
    if math.isfinite(end):
        out["recovery"] = clip(end, end + tl.recovery_s)
        out["lasting"] = clip(end + tl.recovery_s, end + tl.recovery_s + tl.lasting_s)
    return out


def measure(col: dict, slo: Any, windows: Mapping[str, tuple[float, float] | None]) -> dict:
    """``<window>_<metric>`` for every window (NaN where a fault set has none), from the
    request columns ``col`` (:func:`pdsim.engine.summary.columns`, measured requests)."""
    from pdsim.engine import slo as slo_mod

    ok = slo_mod.met(col, slo)
    out: dict[str, float] = {}
    for w in WINDOWS:
        span = windows.get(w)
        got = slo_mod.window(col, slo, span[0], span[1], ok) if span is not None else {}
        for m in METRICS:
            v = got.get(m)
            out[f"{w}_{m}"] = math.nan if v is None else float(v)
    return out

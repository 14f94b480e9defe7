"""An incident's measures, from a run's records: the trigger, goodput before, during and after
it, recovery, the failure rate at its peak, and the decode slots held by dead rooms.

- **Trigger**: the window of the scenario's faults (each fault's ``window``: from its first
  start to its last end; a fault with no end lasts to the run's end).
- **Goodput**: output tokens per second of requests that completed (a completed request's
  tokens spread evenly over [first token, done]), per second of simulated time; warmups left
  out. The **base** is its mean over the :data:`BASE_S` seconds before the trigger (at least
  :data:`MIN_BASE_S` of them after the clients started, else there is no base).
- **Goodput recovery** (``goodput_recovery_s``): seconds from the trigger's end until a
  :data:`WINDOW_S`-second mean of goodput is back within 10% of the base (``RECOVERED_AT``):
  the issue's definition. None when it is not within the run, or there is no base or no end.
- **Recovery** (``recovery_s``, ``recovered``): goodput back *and* no request stuck: from the
  goodput recovery or the moment the last dead room was freed, whichever is later. None (not
  recovered) while a dead room is still held at the run's end or requests can never finish
  (the run stalled with them: ``stuck_requests``), whatever goodput did: stuck_transferring's
  goodput was back 8 s after its trigger while 46 requests sat in dead rooms for ever.
- **Goodput at the load's end** (``final_goodput_tok_s``, ``final_ratio``): the mean over the
  last :data:`BASE_S` seconds of the load (at least :data:`WINDOW_S` of them after the
  trigger's end), and its ratio to the base: a fleet stuck for ever ends at 0, one that
  recovered near 1, where the trough of a prefill down for 10 s or more is 0 for both.
- **Trough**: the lowest :data:`WINDOW_S`-second mean from the trigger's start on, and its
  ratio to the base. Both read only windows that end by the clients' last new request (a
  retry is not new): once the load stops, goodput falls whatever the fleet's state.
- **Peak failure share**: the largest share of failed or timed-out requests among those ending
  in a :data:`WINDOW_S`-second window (windows with at least :data:`MIN_ENDED` endings).
- **Longest failed**: the longest a failed or timed-out request waited for its answer (a
  wedged request's hang).
- **At the load's end**: decode running requests per rank and decode KV use at the last time
  series sample before the clients' last new request (a stuck decode's state under load).
- **Dead rooms** (``dead_room`` / ``dead_room_freed`` events, pdsim.engine.decode): a decode
  slot held by a room that cannot complete (its prefill ended without telling it, its done
  signal was lost, its metadata went to a stale connection, or it waits for ABORT_ACK): how
  many, the slot-seconds they held, the most at once, the longest hold, how many are still
  held at the run's end.
- **Stuck requests** (``stuck_requests``): requests that can never finish: those unanswered
  when the run stalled (nothing left to simulate could end them); 0 for a run that ended
  otherwise. (A run cut by its horizon leaves requests in flight: the summary's
  ``unfinished``.)

Everything here reads the records (numpy, no pandas), so the summary needs nothing more.
"""

from __future__ import annotations

import math

import numpy as np

from pdsim.engine.summary import COMPLETED, FAILED, TIMED_OUT

BASE_S = 60.0
MIN_BASE_S = 10.0
WINDOW_S = 10
RECOVERED_AT = 0.9
MIN_ENDED = 10


def asks(sc: object) -> bool:
    """Whether the scenario's reported figures read the incident block."""
    return any(r.metric and r.metric.startswith("incident.") for r in sc.reference)


def has_block(sc: object, dead_rooms: int) -> bool:
    """Whether a run's summary has the incident block: the scenario has faults or reported
    figures read from it, or the run had dead rooms."""
    return bool(sc.faults or dead_rooms or asks(sc))


def is_incident(sc: object, summary: dict | None = None) -> bool:
    """The one rule for "this is an incident" (the postmortem figure rather than the capacity
    one, the sweep's incident columns): faults, operator flushes or a client's flush, reported
    figures read from the incident block, and, for a run (``summary``), an incident block
    (:func:`has_block`: dead rooms, whatever the scenario declared). small_decode_window has
    none of the first three: its dead rooms come of a small decode window and a bootstrap
    timeout, and its figure was the capacity one while its report told the incident."""
    return bool(sc.faults or sc.operator_flushes or asks(sc)
                or any(getattr(c, "flush", None) is not None and c.flush.mode != "none"
                       for c in sc.clients)
                or (summary is not None and summary.get("incident") is not None))


def goodput_series(col: dict[str, np.ndarray], t_end: float, dt: float = 1.0) -> np.ndarray:
    """Goodput (tok/s of completed requests) per ``dt`` bin from 0 to ``t_end``."""
    n_bins = max(1, math.ceil(t_end / dt))
    edges = np.arange(n_bins + 1) * dt
    done = col["status"] == COMPLETED
    a = col["t_first_token"][done].astype(float)
    b = col["t_done"][done].astype(float)
    g = col["generated"][done].astype(float)
    cum = np.zeros(len(edges))
    span = np.maximum(b - a, 1e-9)
    for lo in range(0, len(a), 2048):  # bounded memory
        sl = slice(lo, lo + 2048)
        frac = np.clip((edges[None, :] - a[sl, None]) / span[sl, None], 0.0, 1.0)
        cum += (g[sl, None] * frac).sum(axis=0)
    return np.diff(cum) / dt


def _means(series: np.ndarray, w: int) -> np.ndarray:
    """Means of ``w`` consecutive bins, starting at each bin (as many as fit)."""
    if len(series) < w:
        return np.empty(0)
    c = np.concatenate([[0.0], np.cumsum(series)])
    return (c[w:] - c[:-w]) / w


def dead_rooms(rows: list[tuple], t_end: float) -> dict:
    """The dead-room counts from the event log's rows (``pdsim.engine.log.COLUMNS``)."""
    opened: dict[tuple, float] = {}
    held: list[float] = []
    deltas: list[tuple[float, int]] = []
    for r in rows:
        ev = r[1]
        if ev == "dead_room":
            opened[(r[2], r[3], r[4])] = r[0]
            deltas.append((r[0], 1))
        elif ev == "dead_room_freed":
            t0 = opened.pop((r[2], r[3], r[4]), None)
            if t0 is not None:
                held.append(r[0] - t0)
                deltas.append((r[0], -1))
    held += [t_end - t0 for t0 in opened.values()]
    most = now = 0
    cleared = None  # when the count last fell to 0
    for t, d in sorted(deltas, key=lambda x: (x[0], x[1])):  # (a free before an add)
        now += d
        most = max(most, now)
        if now == 0:
            cleared = t
    return {"dead_rooms": len(held), "dead_room_slot_s": round(float(sum(held)), 3),
            "dead_rooms_max": most, "dead_rooms_at_end": len(opened),
            "dead_room_held_max_s": round(float(max(held, default=0.0)), 3),
            "_cleared_s": None if opened else cleared}


def measures(col: dict[str, np.ndarray], rows: list[tuple], window: tuple[float, float],
             t0: float, t_end: float, load_end: float, stuck: int = 0) -> dict:
    """The incident block of the summary (module docstring). ``col``: the measured requests'
    columns (:func:`pdsim.engine.summary.columns`); ``window``: the trigger (NaN, NaN: none);
    ``t0``: when the clients started; ``load_end``: their last first attempt's arrival;
    ``stuck``: requests that can never finish (unanswered when the run stalled)."""
    start, end = window
    out: dict = {"trigger_from_s": None if math.isnan(start) else round(start, 3),
                 "trigger_to_s": None if math.isnan(end) else round(end, 3)}
    series = goodput_series(col, t_end) if len(col["status"]) else np.zeros(1)
    base = None
    if not math.isnan(start) and start - max(t0, start - BASE_S) >= MIN_BASE_S:
        lo = int(math.ceil(max(t0, start - BASE_S)))
        seg = series[lo:int(math.floor(start))]
        base = float(seg.mean()) if len(seg) else None
    out["base_goodput_tok_s"] = None if base is None else round(base, 2)
    means = _means(series, WINDOW_S)
    # (windows the clients still offered load through: after their last arrival goodput falls
    # whatever the fleet's state, so neither a trough nor a recovery is read there)
    means = means[: max(0, int(math.floor(load_end)) - WINDOW_S + 1)]
    first = 0 if math.isnan(start) else int(math.floor(start))
    after = means[first:]
    trough = float(after.min()) if len(after) else None
    out["trough_goodput_tok_s"] = None if trough is None else round(trough, 2)
    out["trough_ratio"] = (round(trough / base, 4) if trough is not None and base else None)
    # goodput at the load's end: the last BASE_S s of the load, those after the trigger's end
    final = None
    if base and not math.isnan(end):
        lo = max(math.ceil(end), int(math.floor(load_end - BASE_S)))
        hi = int(math.floor(load_end))
        if hi - lo >= WINDOW_S:
            final = float(series[lo:hi].mean())
    out["final_goodput_tok_s"] = None if final is None else round(final, 2)
    out["final_ratio"] = None if final is None else round(final / base, 4)
    recovery = None
    if base and not math.isnan(end):
        for t in range(int(math.ceil(end)), len(means)):
            if means[t] >= RECOVERED_AT * base:
                recovery = float(t - end)
                break
    out["goodput_recovery_s"] = None if recovery is None else round(recovery, 3)
    dead = dead_rooms(rows, t_end)
    cleared = dead.pop("_cleared_s")
    if recovery is not None and (dead["dead_rooms_at_end"] or stuck):
        recovery = None  # (goodput is back, but requests are stuck: not recovered)
    elif recovery is not None and cleared is not None:
        recovery = max(recovery, cleared - end)  # (and every dead room freed)
    out["recovery_s"] = None if recovery is None else round(recovery, 3)
    out["recovered"] = recovery is not None
    out["stuck_requests"] = int(stuck)
    out["peak_failure_share"] = _peak_failures(col)
    t = col["t_done"].astype(float) - col["t_arrival"].astype(float)
    bad = ((col["status"] == FAILED) | (col["status"] == TIMED_OUT)) & ~np.isnan(t)
    out["longest_failed_s"] = round(float(t[bad].max()), 3) if bad.any() else None
    out.update(dead)
    return out


def _peak_failures(col: dict[str, np.ndarray]) -> float | None:
    """The largest share of failed or timed-out requests among those ending in a window."""
    t = col["t_done"].astype(float)
    ok = ~np.isnan(t)
    if ok.sum() < MIN_ENDED:
        return None
    t, st = t[ok], col["status"][ok]
    bad = (st == FAILED) | (st == TIMED_OUT)
    n = int(math.ceil(t.max())) + 1
    ended = np.bincount(t.astype(int), minlength=n).astype(float)
    failed = np.bincount(t.astype(int), weights=bad.astype(float), minlength=n)
    e, f = _means(ended, WINDOW_S), _means(failed, WINDOW_S)
    keep = e * WINDOW_S >= MIN_ENDED
    if not keep.any():
        return None
    return round(float((f[keep] / e[keep]).max()), 4)


# (the time series' sample columns, pdsim.engine.outcome.SAMPLE_COLUMNS: time, tokens, failed,
# transfer failures, then pdsim.engine.fleet.GAUGES)
_DECODE_KV, _DECODE_RUNNING = 5, 11


def at_load_end(samples: list[tuple], load_end: float, decode_ranks: int) -> dict:
    """What the decode looked like when the clients sent their last new request: running
    requests per decode rank and decode KV use (PR #31800's "#running-req ~1, KV cache usage
    ~0.04", a state under load, not after it)."""
    before = [r for r in samples if r[0] <= load_end]
    if not before:
        return {"decode_running_per_rank_at_load_end": None,
                "decode_kv_used_at_load_end": None}
    last = before[-1]
    return {"decode_running_per_rank_at_load_end": round(last[_DECODE_RUNNING] / decode_ranks,
                                                         3),
            "decode_kv_used_at_load_end": round(float(last[_DECODE_KV]), 4)}

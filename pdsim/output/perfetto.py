"""A run as a Chrome trace-event JSON file, to scrub in ui.perfetto.dev (or chrome://tracing).

    res = pdsim.run("scenarios/drop_timeout.yaml", record_steps=True)
    pdsim.output.perfetto.write(res, "drop.json")        # or: pdsim run X --perfetto drop.json

Tracks: one process per server with a thread per DP rank (a slice per batch step: prefill
forward, decode step, or the idle batch a lockstep rank runs), one process per NIC with a thread
per (prefill rank, transfer queue) (a slice per KV write, coloured by outcome), and a "router"
and a "fleet" process. Instant events mark flushes, transfer failures and blacklist changes on
the track where they happened; counters show each rank's KV use and the fleet's queues and
blacklisted pairs.

Step and write slices need ``record_steps=True``: the ranks and transfer engines then call a
:class:`Recorder` after each step and write. Off (the default), nothing is recorded and the hot
path pays one ``is not None`` test per step; no SimPy event is ever added. Instants and counters
come from the event log and time series every run has, so a run without recording still
exports them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pdsim.engine.recorder import KV_STEP, Recorder

if TYPE_CHECKING:
    from pdsim.output.result import Result

__all__ = ["KV_STEP", "Recorder", "trace_events", "write"]

US = 1e6  # trace-event timestamps are microseconds


class _Tracks:
    """Process and thread ids for named tracks, with their metadata events."""

    def __init__(self) -> None:
        self.pids: dict[str, int] = {}
        self.tids: dict[tuple[str, str], int] = {}
        self.meta: list[dict] = []

    def pid(self, process: str, sort: int | None = None) -> int:
        if process not in self.pids:
            pid = self.pids[process] = len(self.pids) + 1
            self.meta.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                              "args": {"name": process}})
            self.meta.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                              "args": {"sort_index": pid if sort is None else sort}})
        return self.pids[process]

    def tid(self, process: str, thread: str) -> tuple[int, int]:
        pid = self.pid(process)
        key = (process, thread)
        if key not in self.tids:
            tid = self.tids[key] = sum(1 for p, _t in self.tids if p == process) + 1
            self.meta.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                              "args": {"name": thread}})
            self.meta.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                              "args": {"sort_index": tid}})
        return pid, self.tids[key]


def _rank_track(tracks: _Tracks, track: str) -> tuple[int, int]:
    server, rank = track.rsplit(".", 1)  # "prefill-0.r3"
    return tracks.tid(server, rank)


def _us(t: float) -> float:
    return round(t * US, 3)


def _dur(t0: float, t1: float) -> float:
    """Duration such that ts + dur is the end's own timestamp (no rounding overlap)."""
    return round(_us(t1) - _us(t0), 3)


def step_slices(rec: Recorder, tracks: _Tracks) -> list[dict]:
    out = []
    ids: dict[str, tuple[int, int]] = {}
    for track, t0, t1, kind, batch, tokens, steps in rec.steps:
        pid, tid = ids.get(track) or ids.setdefault(track, _rank_track(tracks, track))
        args: dict[str, Any] = {"tokens": tokens}
        if kind == "decode":
            args["batch"] = batch
        if steps != 1:
            args["steps"] = steps
        name = kind if steps == 1 else f"{kind} x{steps}"
        out.append({"ph": "X", "name": name, "cat": "step", "pid": pid, "tid": tid,
                    "ts": _us(t0), "dur": _dur(t0, t1), "args": args})
    return out


def write_slices(rec: Recorder, tracks: _Tracks) -> list[dict]:
    out = []
    for nic, track, t0, t1, rid, room, nbytes, last, outcome in rec.writes:
        pid, tid = tracks.tid(nic, track)
        out.append({"ph": "X", "name": "KV write" if outcome == "ok" else f"KV write: {outcome}",
                    "cat": "transfer", "pid": pid, "tid": tid, "ts": _us(t0),
                    "dur": _dur(t0, t1), "cname": None if outcome == "ok" else "terrible",
                    "args": {"rid": rid, "room": str(room), "MB": round(nbytes / 1e6, 3),
                             "last_chunk": last, "outcome": outcome}})
    for e in out:
        if e["cname"] is None:
            del e["cname"]
    return out


INSTANTS = {"flush_executed", "flush_rejected", "flush_timed_out", "transfer_failed",
            "blacklist_add", "blacklist_remove", "router_flush", "router_flush_answer",
            "fault_start", "fault_end", "heartbeat_lost", "client_aborted", "probe"}


def _instant_name(e: Any) -> str:
    if e.event == "flush_executed":
        return f"flush ({int(e.value)} transfers doomed)" if e.value else "flush"
    if e.event == "transfer_failed":
        return f"failed: {e.detail} -> {e.peer}"
    if e.event == "blacklist_add":
        return f"blacklist + {e.peer} ({int(e.value)} on this rank)"
    if e.event == "blacklist_remove":
        return f"blacklist - {e.peer} ({e.detail})"
    if e.event == "router_flush":
        return f"POST /flush_cache from {e.peer}"
    if e.event == "router_flush_answer":
        return f"flush answered {int(e.value)} to {e.peer}"
    if e.event == "probe":
        return f"probe {e.peer}: {e.detail}"
    return f"{e.event}: {e.detail}"


def instants(res: Result, tracks: _Tracks) -> list[dict]:
    """Flushes, failures, blacklist changes... from the event log, on the track they concern."""
    out = []
    ev = res.events
    ev = ev[ev.event.isin(INSTANTS)]
    outside = {"router", *(c.name for c in res.scenario.clients)}
    for e in ev.itertuples(index=False):
        if e.component in outside:
            pid, tid = tracks.tid("router", "flush_cache" if "flush" in e.event else "clients")
        elif e.rank >= 0:
            pid, tid = tracks.tid(e.component, f"r{e.rank}")
        elif "." in e.component:  # a blacklist's owner: "prefill-0.r1"
            pid, tid = _rank_track(tracks, e.component)
        else:
            pid, tid = tracks.tid(e.component, "server")
        args = {"event": e.event, "detail": e.detail}
        if e.rid >= 0:
            args["rid"] = int(e.rid)
        if e.room >= 0:
            args["room"] = str(e.room)
        if e.peer:
            args["peer"] = e.peer
        out.append({"ph": "i", "s": "t", "name": _instant_name(e), "cat": e.event, "pid": pid,
                    "tid": tid, "ts": _us(e.time), "args": args})
    return out


FLEET_COUNTERS = {"KV use (share of pool)": ("prefill_kv_used", "decode_kv_used"),
                  "queues (requests)": ("prefill_queue", "transfer_queue", "decode_prealloc",
                                        "decode_transfer", "decode_running"),
                  "blacklisted pairs": ("blacklisted_pairs",),
                  "tokens/s": ("tokens_per_s",)}


def counters(res: Result, rec: Recorder | None, tracks: _Tracks) -> list[dict]:
    """Per-rank KV use (when recorded) and the fleet's gauges from the time series."""
    out = []
    for track, t, share in rec.kv if rec is not None else []:
        pid, _tid = _rank_track(tracks, track)
        out.append({"ph": "C", "name": f"KV use {track.rsplit('.', 1)[1]}", "pid": pid,
                    "ts": _us(t), "args": {"share": round(share, 4)}})
    ts = res.timeseries
    pid = tracks.pid("fleet", sort=10_000)
    for name, cols in FLEET_COUNTERS.items():
        cols = [c for c in cols if c in ts.columns]
        for row in ts[["time", *cols]].itertuples(index=False):
            out.append({"ph": "C", "name": name, "pid": pid, "ts": _us(row[0]),
                        "args": {c: round(float(v), 4) for c, v in zip(cols, row[1:],
                                                                        strict=True)}})
    return out


def trace_events(res: Result) -> dict:
    """The Chrome trace-event document (``{"traceEvents": [...]}``) of a run."""
    import gc

    # building many small dicts next to a big run's live objects triggers collections that
    # cost 3-4x the work itself; none of these objects form cycles
    was_on = gc.isenabled()
    gc.disable()
    try:
        return _trace_events(res)
    finally:
        if was_on:
            gc.enable()


def _trace_events(res: Result) -> dict:
    tracks = _Tracks()
    sc = res.scenario
    for role, cfg in sc.fleet.roles():
        for s in range(cfg.servers):  # every rank gets its track, busy or not
            for r in range(cfg.dp):
                tracks.tid(f"{role}-{s}", f"r{r}")
    rec = res.recorder
    events = []
    if rec is not None:
        events += step_slices(rec, tracks) + write_slices(rec, tracks)
    events += instants(res, tracks) + counters(res, rec, tracks)
    meta = {"scenario": sc.name, "seed": sc.seed, "simulated_s": res.summary["simulated_s"],
            "steps_recorded": rec is not None}
    return {"traceEvents": tracks.meta + events, "displayTimeUnit": "ms", "metadata": meta}


def write(res: Result, path: str | Path) -> Path:
    """Write the run's trace-event JSON to ``path`` (open it in ui.perfetto.dev)."""
    path = Path(path)
    # json.dumps uses the C encoder; json.dump to a file would not (5x slower)
    path.write_text(json.dumps(trace_events(res), separators=(",", ":")) + "\n")
    return path

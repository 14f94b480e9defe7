"""Run a scenario: build the fleet, run it, and make its :class:`~pdsim.engine.outcome.Outcome`
(the public ``pdsim.run``, :func:`pdsim.output.result.run`, makes it a Result)."""

from __future__ import annotations

import gc
import math
import threading
import time
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy

from pdsim.config import loader, units
from pdsim.config.scenario import Scenario
from pdsim.engine import clock, incident, steady
from pdsim.engine import slo as slo_mod
from pdsim.engine import summary as summary_mod
from pdsim.engine.fleet import Fleet
from pdsim.engine.log import COLUMNS as EVENT_COLUMNS
from pdsim.engine.log import frame_of, plain_columns, records_columns, records_frame
from pdsim.engine.outcome import REQUEST_COLUMNS, SAMPLE_COLUMNS, Outcome
from pdsim.engine.recorder import Recorder
from pdsim.engine.summary import FLUSH_REASONS, clean

if TYPE_CHECKING:
    import pandas as pd



def _records(fleet: Fleet) -> dict | None:
    """The request table's columns (``pdsim.engine.log.plain_columns``; None for no requests), which
    the summary reads and the table is made of when asked for."""
    for d in fleet.decode_ranks:  # tokens of requests still running at the horizon
        d.sync_running()
    rows = []
    for r in fleet.requests:
        room = r.room
        rows.append((r.rid, r.client, r.kind, r.question, r.attempt, r.input_len, r.output_len,
                     r.stream, r.t_arrival, r.t_first_token, r.t_prefill_start, r.t_prefill_end,
                     r.t_transfer_done,
                     r.t_done, r.generated, r.status, r.reason, r.http_status,
                     room.id if room else -1, r.p_server, r.p_rank, r.d_server, r.d_rank,
                     room.session if room else "", r.prefill_tokens, r.cached_tokens,
                     bool(room and room.doomed), r.stale_pages))
    return plain_columns(rows, REQUEST_COLUMNS) if rows else None


def _no_requests() -> dict:
    """The request columns of a run without requests, as the summary reads them: those of the
    empty table (``frame_of(None, ...)``: empty object columns), without pandas."""
    return {name: np.empty(0, object) for name in REQUEST_COLUMNS}


def _sampler(fleet: Fleet, interval: float, rows: list, horizon: simpy.Event,
             stalled: simpy.Event) -> Generator:
    """Sample the gauges every ``interval`` until the run ends, or until nothing can happen
    before the horizon (then it ends the run there: an idle horizon does not grow the time
    series, and a request that can never finish does not keep the clock ticking)."""
    env = fleet.env
    while True:
        rows.append(_sample(fleet))
        if _nothing_scheduled(env, horizon):
            stuck = sum(r.status == "unfinished" for r in fleet.requests)
            fleet.log("run_stalled", "sim", value=stuck, detail=_stall_detail(fleet, stuck))
            stalled.succeed()
            return
        yield env.timeout(interval)


def _sample(fleet: Fleet) -> tuple:
    """The clock, the run's counters and the gauges now (``SAMPLE_COLUMNS``)."""
    stats = fleet.stats
    g = fleet.gauges()  # first: it catches the ranks up (tokens made by steps ended by now)
    return (fleet.env.now, stats.tokens_out, sum(stats.request_failures.values()),
            sum(stats.transfer_failures.values()), *g)


def _close(fleet: Fleet, rows: list) -> None:
    """The closing sample, at the run's end (a run ends when its clients are done, mostly
    between two samples): its counters are the run's totals, so the time series adds up to
    the request table. A sample already taken at that instant is taken again (what followed
    it in the instant is counted too)."""
    if rows and rows[-1][0] == fleet.env.now:
        rows.pop()
    rows.append(_sample(fleet))


STALL_RANKS = 5  # ranks a stalled run's event names (those that explain it first)


def _stall_detail(fleet: Fleet, stuck: int) -> str:
    """What a stalled run's event says: the unfinished requests, where they wait, and, for
    retracted requests too large for their rank's whole KV pool, what to change. At most
    :data:`STALL_RANKS` ranks, those with such requests first, then those holding the most
    (a stalled fleet of thousands of ranks made a line of hundreds of kB)."""
    where = []
    for rank in fleet.ranks:
        if rank.is_fully_idle():
            continue
        queues = [t for t in rank.busy_summary().split() if not t.endswith("=0")]
        line = f"{rank.name}.r{rank.index} {' '.join(queues)}"
        n, need = rank.unfit() if rank.role == "decode" else (0, 0)
        if n:
            pool = rank.alloc.capacity * rank.alloc.page_size
            line += (f", of which {n} its whole KV pool of {pool:,} tokens can never take "
                     f"(one needs {need:,}): raise fleet.decode.kv_pool_tokens or "
                     f"mem_fraction_static, or shorten the requests")
        held = sum(int(t.partition("=")[2]) for t in queues)
        where.append((-n, -held, len(where), line))
    where.sort()
    shown = [w[3] for w in where[:STALL_RANKS]]
    if len(where) > STALL_RANKS:
        shown.append(f"and {len(where) - STALL_RANKS:,} more ranks")
    at = f": {'; '.join(shown)}" if shown else ""
    return (f"nothing left to simulate before the horizon; {stuck} "
            f"request{'' if stuck == 1 else 's'} unfinished{at}")


def _nothing_scheduled(env: simpy.Environment, horizon: simpy.Event) -> bool:
    """True when the next event is the horizon and nothing is in motion: no process wakes
    before the run would stop, and no batch step, hop, call, write or client arrival is
    pending past it (a busy run whose next step ends just after the horizon, or whose next
    arrival comes after it, stops at the horizon, not as stalled; a deadline pending past it
    is no motion: a stuck request keeps one)."""
    if isinstance(env, clock.Environment):  # batch steps, hops, writes: the step heap and
        # this instant's links
        return env.next_is(horizon) and not env._steps and not env._links
    queue = getattr(env, "_queue", None)  # SimPy's event heap: (time, priority, id, event)
    return bool(queue) and queue[0][3] is horizon


def _timeseries(rows: list) -> pd.DataFrame:
    """The samples (:data:`SAMPLE_COLUMNS` tuples), with rates per second since the previous
    sample (the first: since 0), each rate the column after time (the frame is built once:
    inserting columns into a built frame costs more than building it). A column's dtype is
    what pandas infers from its values (``records_columns``: ints int64, floats or ints and
    floats float64), as a frame of the samples' lists would have it."""
    import pandas as pd

    if not rows:
        return pd.DataFrame(rows)
    cols = records_columns(rows, SAMPLE_COLUMNS)
    t = cols["time"].astype(float)  # (what the frame's column gives as floats)
    dt = np.empty(len(t))  # Series.diff(), its first value t[0] (1 if 0), 0 -> NaN
    dt[0] = t[0] or 1.0
    dt[1:] = t[1:] - t[:-1]
    dt[dt == 0] = np.nan
    rates = {}
    for name, col in (("tokens_per_s", "tokens_out"), ("failed_per_s", "failed")):
        x = cols[col].astype(float)
        rate = np.empty(len(x))
        rate[0] = x[0]
        rate[1:] = x[1:] - x[:-1]
        rate /= dt
        rate[np.isnan(rate)] = 0.0  # fillna(0)
        rates[name] = rate
    return pd.DataFrame({"time": cols.pop("time"), **rates, **cols})


def _flush_counts(fleet: Fleet) -> dict:
    out = {}
    for r in fleet.ranks:
        f = r.flush
        out[f"{r.name}.r{r.index}"] = {"executed": f.executed, "rejected": f.rejected,
                                       "timed_out": f.timed_out}
    return out


def _sim_events(env: simpy.Environment) -> tuple[int, int]:
    """(SimPy events, plain heap entries) the run scheduled (read once, at the end)."""
    if getattr(env, "_eid", None) is None:
        return -1, 0
    return clock.counts(env)


def _summary(fleet: Fleet, cols: dict, n_events: int, sim_events: int, stopped: bool,
             samples: list | None = None, stalled: bool = False) -> dict:
    """The run's summary; ``samples``: the time series' rows (the incident block reads them);
    ``stalled``: the run stopped with nothing left to simulate (its unanswered requests can
    never finish)."""
    stats = fleet.stats
    gpus = fleet.scenario.fleet.gpus()  # (what a side-by-side comparison of fleets divides by)
    col = summary_mod.columns(None, cols)  # (the request columns, pdsim.engine.log.plain_columns)

    def values(name: str) -> object:
        return summary_mod.column(None, name, cols)

    keep = summary_mod.codes(values("kind"), ("warmup",)) != 0
    names = list(dict.fromkeys(c.name for c in fleet.clients))
    measured = {k: v[keep] for k, v in col.items()}
    m_client = summary_mod.codes(values("client"), names)[keep]
    starts = [c.t0 for c in fleet.clients if np.isfinite(c.t0)]
    t0 = min(starts) if starts else 0.0
    t_end = summary_mod.nanmax(measured["t_done"]) if len(m_client) else t0
    top = summary_mod.metrics(measured, (t_end - t0) if np.isfinite(t_end) else 0.0)
    slo_cfg = fleet.scenario.slo
    now = float(fleet.env.now)
    clients = {}
    for c in fleet.clients:
        here = m_client == names.index(c.name)
        mine = {k: v[here] for k, v in measured.items()}
        end = summary_mod.nanmax(mine["t_done"]) if here.any() else c.t0
        m = summary_mod.metrics(mine, (end - c.t0) if np.isfinite(end) and np.isfinite(c.t0)
                                else 0)
        m["kind"] = c.cfg.kind
        if c.aborted:
            m["aborted"] = c.aborted
        m["unsent"] = c.unsent()
        m["finished"] = bool(c.done.triggered)
        if getattr(c, "trace_rows", None) is not None:
            m["trace_rows_replayed"], m["trace_rows"] = c.trace_rows
        if c.cfg.kind == "bench" and c.cfg.sdk_retries:  # (a prompt: several requests)
            m["prompts_in_flight"] = c.in_flight()
        if c.cfg.kind == "eval":
            answered = sum(a["answered"] for a in c.answers)
            m["questions"] = len(c.answers)  # answered, empty or not
            m["questions_in_flight"] = c.in_flight()
            m["empty_answers"] = len(c.answers) - answered
            m["steady"] = steady.closed_loop()
        else:
            m["steady"] = steady.window(c.offered(), mine, now)
        if slo_cfg.active:
            m["slo"] = slo_mod.summary(mine, slo_cfg, c.t0, end)
        clients[c.name] = m
    by_reason = {k: 0 for k in FLUSH_REASONS}
    by_reason.update(stats.transfer_failures)
    failed = col["status"] == summary_mod.FAILED
    reasons = summary_mod.counts(values("reason"), keep & failed)  # of measured failed requests
    top.update({
        "transfer_failures": int(sum(stats.transfer_failures.values())),
        "transfer_failures_by_reason": dict(sorted(by_reason.items())),
        "flush_doomed_transfers": int(np.asarray(values("flush_doomed"), dtype=bool).sum()),
        "blacklisted_pairs_max": stats.blacklisted_pairs_max,
        "blacklisted_pairs_final": stats.blacklisted_pairs,
        "dead_peer_writes": stats.dead_peer_writes,
        "dead_peer_write_s": round(stats.dead_peer_write_s, 3),
        "blacklist_probes": stats.probes,
        "failed_by_reason": {k: int(v) for k, v in sorted(reasons.items())},
        "flushes": _flush_counts(fleet),
        "wasted_prefill_tokens": int(col["prefill_tokens"][failed].sum()),
        "stale_page_requests": int(np.asarray(values("stale_pages")).sum()),
        "retractions": stats.retractions,
        "kv_transferred_gb": round(stats.bytes_transferred / 1e9, 3),
        "prefill_tokens_computed": stats.prefill_tokens,
        "chunked_prefill_size_per_rank": fleet.chunked_prefill_per_rank,
        "fleet_mode": fleet.scenario.fleet.mode,
        "gpus": sum(gpus.values()),
        "gpus_by_role": gpus,
        "tokens_generated_fleet": stats.tokens_out,
        "events": sim_events,
        "logged_events": n_events,
        "decode_steps": stats.decode_steps,
        "prefill_steps": stats.prefill_steps,
        "simulated_s": round(float(fleet.env.now), 3),
        "stopped_at_horizon": stopped,
        "clients": clients,
    })
    if slo_cfg.active:  # (only then: without thresholds goodput is the completed requests)
        top["slo"] = slo_mod.summary(measured, slo_cfg, t0, t_end)
    benches = [names.index(c.name) for c in fleet.clients if c.cfg.kind == "bench"]
    top["steady"] = (steady.window(
        np.concatenate([c.offered() for c in fleet.clients if c.cfg.kind == "bench"]),
        {k: v[np.isin(m_client, benches)] for k, v in measured.items()}, now)
        if benches else steady.closed_loop())
    faults = fleet.scenario.faults
    if incident.has_block(fleet.scenario, stats.dead_rooms):  # (a run without: no incident)
        ws = [f.window(now) for f in faults]
        window = ((min(w[0] for w in ws), max(w[1] for w in ws)) if ws
                  else (math.nan, math.nan))
        first = keep & (np.asarray(values("attempt")) == 0)
        arrived = col["t_arrival"][first]
        load_end = float(arrived.max()) if len(arrived) else t0
        stuck = int((measured["status"] == summary_mod.UNFINISHED).sum()) if stalled else 0
        top["incident"] = inc = incident.measures(measured, fleet.log.rows, window, t0, now,
                                                  load_end, stuck)
        inc.update(incident.at_load_end(samples or [], load_end, len(fleet.decode_ranks)))
    return clean(top)


def simulate(sc: Scenario, recorder: Recorder | None = None, progress: bool | float = False,
             make: type[Outcome] = Outcome) -> Outcome:
    """Simulate a loaded scenario; ``make``: the Outcome class to return (``pdsim.run``'s
    Result). ``recorder``: keep every batch step and KV write (:mod:`pdsim.output.perfetto`);
    ``progress``: as ``pdsim.run``'s. The cyclic garbage collector pauses meanwhile."""
    with _cyclic_gc_paused():
        return _simulate(sc, recorder, progress, make)


def _simulate(sc: Scenario, recorder: Recorder | None, progress: bool | float,
              make: type[Outcome] = Outcome) -> Outcome:
    """Build the fleet, run it and make its Result (which keeps no reference to the fleet)."""
    wall0 = time.perf_counter()
    fleet = Fleet(sc, recorder)
    env = fleet.env
    rows: list = []
    all_done = env.all_of([c.done for c in fleet.clients])
    horizon = env.timeout(sc.horizon_s)
    stalled = env.event()
    env.process(_sampler(fleet, sc.timeseries_interval_s, rows, horizon, stalled))
    stop = env.any_of([all_done, horizon, stalled])
    delay = _bar_delay(progress)
    if delay is None:
        env.run(until=stop)
    else:
        with _Progress(env, sc.horizon_s, delay, fleet.clients):
            env.run(until=stop)
    _close(fleet, rows)
    for stepper in fleet.steppers:
        stepper.close()
    plain = _records(fleet)
    cols = plain if plain is not None else _no_requests()
    log_rows = fleet.log.rows
    wall = time.perf_counter() - wall0
    sim_events, sim_entries = _sim_events(env)
    summary = _summary(fleet, cols, len(log_rows), sim_events,
                       not all_done.triggered and not stalled.triggered, rows,
                       stalled.triggered and not all_done.triggered)
    if stalled.triggered and not all_done.triggered:
        summary["stalled_at_s"] = round(float(env.now), 3)
    if sc.unknowns:
        summary["unknowns_at_nominal"] = [u.as_dict() for u in sc.unknowns]
    answers = [dict(a, client=c.name) for c in fleet.clients for a in getattr(c, "answers", [])]
    pools = {f"{r.name}.r{r.index}": {"capacity": r.alloc.capacity, "peak": r.alloc.peak,
                                      "used": r.alloc.used} for r in fleet.ranks}
    end = float(env.now)
    fleet.check_held()
    fleet.release()
    builders = {"requests": partial(frame_of, plain, REQUEST_COLUMNS),
                "events": partial(records_frame, log_rows, EVENT_COLUMNS),
                "timeseries": partial(_timeseries, rows),
                "answers": partial(_answers, answers)}
    return make(sc, summary, fleet.router.flush_calls, wall, pools, what_if(sc), recorder,
                  sim_entries, end, builders, _request_columns=cols, _event_records=log_rows)


def _answers(answers: list[dict]) -> pd.DataFrame:
    """The eval clients' answers, one row each (an empty frame without an eval client)."""
    import pandas as pd

    return pd.DataFrame(answers)


@contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """Pause CPython's cyclic garbage collector while the fleet is built and simulated.

    A run allocates millions of short-lived objects, and its cycles (each request and its KV
    room point at each other: ~34k objects in cycles after a drop_timeout run, measured
    2026-11-30) live as long as the fleet does, so collections during the run find nothing,
    while they rescan a heap that grows with every request record and log row (13% of a
    100k-request run when measured). Reference counting still frees every acyclic object at
    once: peak RSS is unchanged (391 MB with and without, 100k-request stream). Before the
    collector comes back, ``Fleet.release`` has let reference counting free the requests, and
    the fleet is dropped (``_simulate`` returns a Result without it), so the young collection
    that follows frees what is left of the run (its components) within the run's own time. The
    previous state is restored afterwards, also on error.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def what_if(sc: Scenario) -> str:
    """Why the scenario's ``reference:`` figures are not this run's own, or "" when they are:
    overrides other than the seed changed it, or its file inherits them through ``extends:``."""
    if not sc.reference:
        return ""
    changed = [s for s in sc._overrides if not s.startswith("seed=")]
    if changed:
        return f"changed by --set {' '.join(changed)}"
    if sc._inherits:
        return f"a dict extending {sc._inherits} inherits its reported figures"
    if sc._source and Path(sc._source).is_file():
        from pdsim.util.safeio import UserFileError, clip, decode_utf8, read_user_file

        try:  # the same safe reading as the load a moment ago (the file may have changed)
            raw = read_user_file(sc._source, "scenario file", units.MAX_FILE_BYTES)
            own = loader.parse_yaml(decode_utf8(raw, "scenario file"), "scenario file")
        except (UserFileError, units.ScenarioError):
            return ""
        if isinstance(own, dict) and "extends" in own and "reference" not in own:
            return (f"{Path(sc._source).name} extends {clip(str(own['extends']), 80)} and "
                    f"inherits its reported figures")
    return ""


def _bar_delay(progress: object) -> float | None:
    """``run``'s ``progress`` as the wall seconds before a bar shows (None: no bar): a bool
    (numpy's too) or None says whether, at once; a number of seconds, when."""
    if progress is None or isinstance(progress, (bool, np.bool_)):
        return 0.0 if progress else None
    try:
        delay = float(progress)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        delay = math.nan
    if not 0 <= delay < math.inf:
        raise ValueError(f"progress={progress!r}: give True, False or a number of seconds "
                         f">= 0 after which a run still going shows its bar")
    return delay


class _Progress:
    """A bar of the prompts answered and questions finished, of all the clients will send,
    with the simulated time beside it, drawn by a thread that reads the clients' counters and
    the clock four times a second (after ``delay`` wall seconds: a run that ends sooner shows
    none). A run ends when its clients are done, so the bar reaches its end with the run (a bar
    of simulated seconds out of ``horizon_s`` stopped where the clients finished: 49% of a
    horizon twice their length). Without clients it counts simulated seconds of the horizon.
    The run's own loop is the plain one: nothing is scheduled or stepped for the bar, so a run
    with it is the run without it, and as fast."""

    def __init__(self, env: simpy.Environment, horizon: float, delay: float,
                 clients: list = ()) -> None:
        self._env, self._horizon, self._delay = env, round(horizon), delay
        self._clients = list(clients)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="pdsim-progress", daemon=True)
        self._bar: Any = None

    def __enter__(self) -> _Progress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        if self._bar is not None:
            if exc[0] is None:
                self._show()  # (where the run ended)
            self._bar.close()

    def _count(self) -> tuple[int, int, str]:
        """(done, total, unit): requests when the clients plan any, else simulated seconds."""
        done = total = 0
        for c in self._clients:
            d, t = c.progress()
            done, total = done + d, total + t
        if total:
            return min(done, total), total, "req"
        return min(int(self._env.now), self._horizon), self._horizon, "sim s"

    def _watch(self) -> None:
        from pdsim.util.backends import progress_bar

        if self._delay and self._done.wait(self._delay):
            return
        done, total, unit = self._count()
        self._bar = progress_bar(total, done, unit=unit)
        while not self._done.wait(0.25):
            self._show()

    def _show(self) -> None:
        bar = self._bar
        done, total, _unit = self._count()
        if total != bar.total:  # (a trace client counts its rows once it has read them)
            bar.total = total
        if done > bar.n:
            bar.update(done - bar.n)
        bar.set_postfix_str(f"simulated {self._env.now:.0f} s", refresh=False)

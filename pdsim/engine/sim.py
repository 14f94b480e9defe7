"""Run a scenario: ``run(scenario) -> Result``."""

from __future__ import annotations

import gc
import math
import threading
import time
from collections import namedtuple
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy

from pdsim.config import loader, units
from pdsim.config import scenario as scenario_mod
from pdsim.engine import clock
from pdsim.engine import summary as summary_mod
from pdsim.engine.fleet import GAUGES, Fleet
from pdsim.engine.log import COLUMNS as EVENT_COLUMNS
from pdsim.engine.log import frame_of, plain_columns, plain_rows, records_columns, records_frame
from pdsim.engine.recorder import Recorder
from pdsim.engine.summary import FLUSH_REASONS, clean
from pdsim.util.rng import seeds_of

if TYPE_CHECKING:
    import pandas as pd

_EventRow = namedtuple("Event", EVENT_COLUMNS)  # (what events.itertuples gives, by name)

REQUEST_COLUMNS = [
    "rid", "client", "kind", "question", "attempt", "input_len", "output_len", "stream",
    "t_arrival", "t_first_token", "t_prefill_start", "t_prefill_end", "t_transfer_done",
    "t_done", "generated",
    "status", "reason", "http_status", "room", "p_server", "p_rank", "d_server", "d_rank",
    "session", "prefill_tokens", "cached_tokens", "flush_doomed", "stale_pages",
]

# a time-series sample (_sampler's rows): the clock and the run's counters, then the gauges
SAMPLE_COLUMNS = ("time", "tokens_out", "failed", "transfer_failures", *GAUGES)


class _Table:
    """A DataFrame of a :class:`Result`, built from the run's records when first read, then
    kept. A run's summary and ``pdsim run``'s report read the records themselves, so a run
    whose tables nobody reads never imports pandas (~0.6 s of a ~1.7 s ``pdsim run``) or
    builds a frame (a sweep's runs read only their summaries). Assigning a table replaces it
    and deleting one brings back the run's own; either makes new dicts rather than change the
    shared ones, so a copy of a Result (``copy.copy``, ``dataclasses.replace``) keeps its
    tables as a copy of the dataclass with frames in its fields did."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, res: Result | None, owner: type | None = None) -> Any:
        if res is None:
            return self
        built = res._built
        if self.name not in built:  # (a copy may share the dict: it shares the frame, as
            built[self.name] = res._builders[self.name]()  # a shallow copy shares a field)
        return built[self.name]

    def __set__(self, res: Result, frame: pd.DataFrame) -> None:
        res._built = {**res._built, self.name: frame}

    def __delete__(self, res: Result) -> None:
        res._built = {k: v for k, v in res._built.items() if k != self.name}


@dataclass
class Result:
    """What a run produced: the summary, and DataFrames for notebooks and tests."""

    scenario: scenario_mod.Scenario
    summary: dict
    flush_calls: list = field(default_factory=list)
    sim_wall_s: float = 0.0
    kv_pools: dict = field(default_factory=dict)  # rank -> {capacity, peak, used} in pages
    what_if: str = ""  # why the scenario's reference figures do not apply to this run, if so
    recorder: Recorder | None = None  # batch steps and KV writes, when run with record_steps
    # what the run scheduled as plain heap entries instead of SimPy events (summary "events"):
    # batch-step ends, links of zero-delay callback chains, timers (pdsim.engine.clock); a
    # performance figure like sim_wall_s
    sim_entries: int = 0
    end_s: float = math.nan  # the clock when the run ended (the summary's simulated_s, rounded)
    # (the tables' makers, each a partial of a module function over the run's records, and
    # the tables made: see _Table)
    _builders: dict = field(default_factory=dict, repr=False, compare=False)
    _built: dict = field(default_factory=dict, repr=False, compare=False)
    # (the request table's columns as the summary read them, pdsim.engine.log.plain_columns) and the
    # event log's records
    _request_columns: dict = field(default_factory=dict, repr=False, compare=False)
    _event_records: list = field(default_factory=list, repr=False, compare=False)

    requests = _Table()  # one row per HTTP request (REQUEST_COLUMNS)
    events = _Table()  # one row per logged event (pdsim.engine.log.COLUMNS)
    timeseries = _Table()  # the gauges every timeseries_interval_s (SAMPLE_COLUMNS, rates)
    answers = _Table()  # one row per eval question answered (empty without an eval client)

    @property
    def scheduled(self) -> int:
        """Everything the run put on a heap: SimPy events plus pdsim's plain entries."""
        return self.summary.get("events", 0) + self.sim_entries

    @property
    def unknowns(self) -> list:
        """The scenario's declared unknowns, which this run took at their nominal values."""
        return self.scenario.unknowns

    @property
    def measured(self) -> pd.DataFrame:
        """Requests the clients measure (warmup excluded)."""
        return self.requests[self.requests.kind != "warmup"]

    def request_values(self, name: str) -> object:
        """One column of :attr:`requests` without building the frame: a numpy array, or the
        tuple of a column of strings (a column pandas had to type itself: its array); the
        frame's own when one was read or assigned."""
        if "requests" in self._built:
            return self.requests[name].to_numpy()
        return self._request_columns[name]

    def event_rows(self) -> Iterator[tuple]:
        """The rows of :attr:`events` in order, each as ``events.itertuples(index=False)``
        gives it (fields named after the columns, values as Python objects), without building
        the frame when the records allow it (``pdsim.engine.log.plain_rows``); the frame's own when
        one was read or assigned."""
        if "events" not in self._built:
            if not self._event_records:
                return iter(())
            rows = plain_rows(plain_columns(self._event_records, EVENT_COLUMNS))
            if rows is not None:
                return map(_EventRow._make, rows)
        return self.events.itertuples(index=False)

    def write(self, out: str | Path, fmt: str = "csv") -> list[Path]:
        """Write a self-describing run directory: records, events, time series,
        ``summary.json``, the resolved ``scenario.yaml`` (after ``extends:`` and ``--set``;
        ``pdsim run DIR/scenario.yaml`` re-runs it), ``run.json`` (pdsim version, seeds, how it
        was made) and ``report.txt`` (the human report). Nothing in it depends on the machine
        or the clock, so the same scenario and seed write the same bytes."""
        import json

        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        written = []
        tables = {"requests": self.requests, "events": self.events,
                  "timeseries": self.timeseries}
        if len(self.answers):
            tables["answers"] = self.answers
        for name, df in tables.items():
            path = out / f"{name}.{fmt}"
            if fmt == "parquet":
                df.to_parquet(path, index=False)
            else:
                df.to_csv(path, index=False, float_format="%.9g")
            written.append(path)
        path = out / "summary.json"
        path.write_text(json.dumps(self.summary, indent=2, sort_keys=True) + "\n")
        written.append(path)
        for name, text in self.describe().items():
            path = out / name
            path.write_text(text)
            written.append(path)
        return written

    def describe(self) -> dict[str, str]:
        """``scenario.yaml``, ``run.json`` and ``report.txt`` of a run directory, as text
        (independent of where the directory is, so that two runs' directories compare equal)."""
        import json

        import yaml

        from pdsim import __version__
        from pdsim.config import unknowns
        from pdsim.output import report

        sc = self.scenario
        # declared unknowns stay declared (at the nominal the run used), so a re-run matches
        data = unknowns.redeclare(sc.model_dump(mode="python"), sc.unknowns)
        # (robust) trace files as resolved at load time: the run directory holds no traces
        rerun = "pdsim run RUN_DIR/scenario.yaml"
        for c, cd in zip(sc.clients, data["clients"], strict=True):
            if c.dataset.kind == "trace":
                cd["dataset"]["path"] = str(c.dataset.resolved_path)
                rerun = "pdsim run RUN_DIR/scenario.yaml --allow-outside-paths"
        if sc.profiles and sc._context is not None:  # (steptime) profile files likewise
            data["profiles"] = [str(sc._context.resolve(rel, f"'profiles.{i}'"))
                                for i, rel in enumerate(sc.profiles)]
            rerun = "pdsim run RUN_DIR/scenario.yaml --allow-outside-paths"
        resolved = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
        head = (f"# Resolved scenario of this run (pdsim {__version__}): {sc._source or 'a dict'}"
                f" after extends: and overrides {list(sc._overrides) or 'none'}.\n"
                f"# Re-run: {rerun}\n")
        meta = {"pdsim_version": __version__, "scenario": sc.name, "source": sc._source,
                "overrides": list(sc._overrides), "seed": sc.seed,
                "seeds": seeds_of(sc.seed, sc.seeds.model_dump()),
                "streams": "numpy SeedSequence([seeds[subsystem], crc32(subsystem)]), one "
                           "per subsystem (pdsim/util/rng.py); a seed under seeds: in the "
                           "scenario replaces the root seed for its subsystem",
                "what_if": self.what_if or None,
                "rerun": rerun,
                "files": {"requests": "one row per HTTP request", "events": "one row per event",
                          "timeseries": f"gauges every {sc.timeseries_interval_s:g} simulated s",
                          "summary.json": "the metrics (pdsim run --json)",
                          "report.txt": "the human report (pdsim run)",
                          "scenario.yaml": "the scenario exactly as run"}}
        return {"scenario.yaml": head + resolved,
                "run.json": json.dumps(meta, indent=2) + "\n",
                "report.txt": report.render(self) + "\n"}


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
    env, stats, gauges = fleet.env, fleet.stats, fleet.gauges
    while True:
        g = gauges()  # first: it catches the ranks up (tokens made by steps ended by now)
        rows.append((env.now, stats.tokens_out, sum(stats.request_failures.values()),
                     sum(stats.transfer_failures.values()), *g))  # SAMPLE_COLUMNS
        if _nothing_scheduled(env, horizon):
            stuck = sum(r.status == "unfinished" for r in fleet.requests)
            fleet.log("run_stalled", "sim", value=stuck, detail=_stall_detail(fleet, stuck))
            stalled.succeed()
            return
        yield env.timeout(interval)


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
            line += (f", of which {n} its whole KV pool of {pool:,} tokens cannot take back "
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


def _summary(fleet: Fleet, cols: dict, n_events: int, sim_events: int, stopped: bool) -> dict:
    stats = fleet.stats
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
        if c.cfg.kind == "eval":
            answered = sum(a["answered"] for a in c.answers)
            m["questions"] = len(c.answers)
            m["empty_answers"] = len(c.answers) - answered
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
        "tokens_generated_fleet": stats.tokens_out,
        "events": sim_events,
        "logged_events": n_events,
        "decode_steps": stats.decode_steps,
        "prefill_steps": stats.prefill_steps,
        "simulated_s": round(float(fleet.env.now), 3),
        "stopped_at_horizon": stopped,
        "clients": clients,
    })
    return clean(top)


def run(scenario: str | Path | dict | scenario_mod.Scenario, sets: list[str] | None = None,
        progress: bool | float = False, record_steps: bool = False, *,
        allow_outside_paths: bool = False) -> Result:
    """Simulate ``scenario`` (a path, dict or :class:`Scenario`) and return its Result.

    ``progress``: a bar of simulated seconds on stderr, ``True`` at once, or a number of
    wall seconds after which a run still going shows one (``pdsim run`` on a terminal: 2).

    ``record_steps``: keep every batch step and KV write for a Perfetto trace
    (:mod:`pdsim.output.perfetto`); it changes nothing that is simulated. ``allow_outside_paths``:
    let the scenario name files (``extends:``, traces) outside its directory tree (for a
    dict: outside the current directory).
    """
    sc = loader.load(scenario, sets, allow_outside_paths=allow_outside_paths)
    with _cyclic_gc_paused():
        return _simulate(sc, Recorder() if record_steps else None, progress)


def _simulate(sc: scenario_mod.Scenario, recorder: Recorder | None,
              progress: bool | float) -> Result:
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
        with _Progress(env, sc.horizon_s, delay):
            env.run(until=stop)
    for stepper in fleet.steppers:
        stepper.close()
    plain = _records(fleet)
    cols = plain if plain is not None else _no_requests()
    log_rows = fleet.log.rows
    wall = time.perf_counter() - wall0
    sim_events, sim_entries = _sim_events(env)
    summary = _summary(fleet, cols, len(log_rows), sim_events,
                       not all_done.triggered and not stalled.triggered)
    if stalled.triggered and not all_done.triggered:
        summary["stalled_at_s"] = round(float(env.now), 3)
    if sc.unknowns:
        summary["unknowns_at_nominal"] = [u.as_dict() for u in sc.unknowns]
    answers = [dict(a, client=c.name) for c in fleet.clients for a in getattr(c, "answers", [])]
    pools = {f"{r.name}.r{r.index}": {"capacity": r.alloc.capacity, "peak": r.alloc.peak,
                                      "used": r.alloc.used} for r in fleet.ranks}
    end = float(env.now)
    fleet.release()
    builders = {"requests": partial(frame_of, plain, REQUEST_COLUMNS),
                "events": partial(records_frame, log_rows, EVENT_COLUMNS),
                "timeseries": partial(_timeseries, rows),
                "answers": partial(_answers, answers)}
    return Result(sc, summary, fleet.router.flush_calls, wall, pools, what_if(sc), recorder,
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


def what_if(sc: scenario_mod.Scenario) -> str:
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
    """A bar of simulated seconds, drawn by a thread that reads the clock four times a
    second (after ``delay`` wall seconds: a run that ends sooner shows none). The run's own
    loop is the plain one: nothing is scheduled or stepped for the bar, so a run with it is
    the run without it, and as fast."""

    def __init__(self, env: simpy.Environment, horizon: float, delay: float) -> None:
        self._env, self._total, self._delay = env, round(horizon), delay
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

    def _watch(self) -> None:
        from pdsim.util.backends import progress_bar

        if self._delay and self._done.wait(self._delay):
            return
        self._bar = progress_bar(self._total, min(int(self._env.now), self._total),
                                 unit="sim s")
        while not self._done.wait(0.25):
            self._show()

    def _show(self) -> None:
        bar = self._bar
        n = min(int(self._env.now), self._total)
        if n > bar.n:
            bar.update(n - bar.n)

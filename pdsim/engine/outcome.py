"""What a simulated run produced: :class:`Outcome`, its summary and its tables (DataFrames
built from the run's records when first read), and the columns of those tables.

:class:`pdsim.output.result.Result`, what ``pdsim.run`` returns, is an Outcome that can also
write itself as a run directory (its ``report.txt`` is the output layer's report, which the
engine must not import).
"""

from __future__ import annotations

import math
from collections import namedtuple
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pdsim.config.scenario import Scenario
from pdsim.engine.fleet import GAUGES
from pdsim.engine.log import COLUMNS as EVENT_COLUMNS
from pdsim.engine.log import plain_columns, plain_rows
from pdsim.engine.recorder import Recorder

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
    """A DataFrame of a :class:`Outcome`, built from the run's records when first read, then
    kept. A run's summary and ``pdsim run``'s report read the records themselves, so a run
    whose tables nobody reads never imports pandas (~0.6 s of a ~1.7 s ``pdsim run``) or
    builds a frame (a sweep's runs read only their summaries). Assigning a table replaces it
    and deleting one brings back the run's own; either makes new dicts rather than change the
    shared ones, so a copy of a Result (``copy.copy``, ``dataclasses.replace``) keeps its
    tables as a copy of the dataclass with frames in its fields did."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, res: Outcome | None, owner: type | None = None) -> Any:
        if res is None:
            return self
        built = res._built
        if self.name not in built:  # (a copy may share the dict: it shares the frame, as
            built[self.name] = res._builders[self.name]()  # a shallow copy shares a field)
        return built[self.name]

    def __set__(self, res: Outcome, frame: pd.DataFrame) -> None:
        res._built = {**res._built, self.name: frame}

    def __delete__(self, res: Outcome) -> None:
        res._built = {k: v for k, v in res._built.items() if k != self.name}


@dataclass
class Outcome:
    """What a run produced: the summary, and DataFrames for notebooks and tests."""

    scenario: Scenario
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
    # the gauges every timeseries_interval_s and at the run's end (SAMPLE_COLUMNS, rates)
    timeseries = _Table()
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

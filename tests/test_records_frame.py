"""pdsim.engine.log.records_frame builds the run's tables a column at a time; it must give exactly
what ``pd.DataFrame.from_records`` gives (dtypes and values), whatever the rows hold."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pdsim
from pdsim.engine.log import records_frame


def _same_as_from_records(rows: list[tuple], columns: list[str]) -> None:
    got = records_frame(rows, columns)
    want = pd.DataFrame.from_records(rows, columns=columns)
    assert list(got.dtypes) == list(want.dtypes)
    pd.testing.assert_frame_equal(got, want, check_exact=True)
    assert got.to_csv(index=False) == want.to_csv(index=False)


@pytest.mark.parametrize("rows", [
    [],  # an empty table: object columns
    [(1, 2.0, True, "a"), (2, math.nan, False, "b")],  # one type per column (the fast path)
    [(1, None, "x", 3), (True, 2.0, None, 4.5)],  # bool among ints, None, str/None, int/float
    [(2**70, np.float64(1.0), np.int64(3), 1), (1, 2.0, 4, 2)],  # beyond int64, numpy scalars
    [(2**63, -2**63, np.uint64(2**64 - 1), np.float32(0.1)), (1, 2**63 - 1, np.uint64(1),
                                                               np.float32(0.2))],
    [(None, math.nan, math.inf, -0.0)],
    [(1, "a", 1.5, True), ("b", 2, 3, 0)],  # mixed objects
    [(0, 2**53 + 1, 2**63, -2**63), (0.5, 1.0, 2.5, math.nan)],  # ints and floats: float64
    [(2**64, -2**63 - 1, 2**63 - 1, True), (0.5, 1.0, 2.5, 0.5)],  # ... unless they do not fit
])
def test_records_frame_matches_from_records(rows):
    _same_as_from_records(rows, ["a", "b", "c", "d"])


_values = st.one_of(st.integers(-2**65, 2**65), st.floats(allow_nan=True), st.booleans(),
                    st.text(max_size=3), st.none())


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 3).flatmap(lambda w: st.lists(
    st.one_of(st.tuples(*[_values] * w),  # anything goes
              st.tuples(*[st.sampled_from([0, 1, -5, 2.5, math.nan, True, "", "x"])] * w)),
    min_size=1, max_size=6)))
def test_records_frame_matches_from_records_on_any_rows(rows):
    _same_as_from_records(rows, [f"c{i}" for i in range(len(rows[0]))])


def test_a_run_s_tables_are_built_column_wise_as_from_records_would(monkeypatch):
    """The request and event tables of drop_timeout (NaN times, failed rooms, empty reasons,
    int and float log values in one column) are what from_records makes of the same rows, and
    the columns the summary reads without pandas (pdsim.engine.log.plain_columns: strings as tuples)
    are the frame's."""
    from pdsim.engine import log, sim

    captured = {}

    def capture(rows, columns):
        captured[tuple(columns)] = rows
        return log.plain_columns(rows, columns)

    monkeypatch.setattr(sim, "plain_columns", capture)
    res = pdsim.run("scenarios/drop_timeout.yaml")
    assert set(captured) == {tuple(sim.REQUEST_COLUMNS)}
    captured[log.COLUMNS] = res._event_records
    assert (res.requests.status == "failed").any() and res.requests.t_first_token.isna().any()
    for columns, rows in captured.items():
        assert rows
        _same_as_from_records(rows, list(columns))
    frame = pd.DataFrame.from_records(captured[tuple(sim.REQUEST_COLUMNS)],
                                      columns=sim.REQUEST_COLUMNS)
    pd.testing.assert_frame_equal(res.requests, frame, check_exact=True)
    pd.testing.assert_frame_equal(res.events, pd.DataFrame.from_records(
        res._event_records, columns=log.COLUMNS), check_exact=True)
    for name in sim.REQUEST_COLUMNS:
        plain = res._request_columns[name]
        if frame[name].dtype == "str":
            assert isinstance(plain, tuple) and list(plain) == frame[name].tolist(), name
        else:
            assert plain.dtype == frame[name].dtype, name
            assert np.array_equal(plain, frame[name].to_numpy(), equal_nan=True), name


def test_event_rows_are_the_event_frame_s_rows_value_for_value_and_type_for_type():
    """The report reads the events as Result.event_rows gives them (no frame built): each row
    is what events.itertuples gives, with the same Python types (a log value that is an int
    among floats is a float there too), also after the frame was built, and for rows that
    only pandas can type (None in a column: the frame's own rows)."""
    from pdsim.engine import log

    res = pdsim.run("scenarios/drop_timeout.yaml")
    assert "events" not in res._built
    plain = list(res.event_rows())
    assert "events" not in res._built  # (reading the rows built no frame)
    framed = list(res.events.itertuples(index=False))
    assert plain == framed and [e._fields for e in plain[:1]] == [framed[0]._fields]
    assert [tuple(map(type, e)) for e in plain] == [tuple(map(type, e)) for e in framed]
    assert {type(e.value) for e in plain} == {float}  # (the log mixes ints and floats)
    assert list(res.event_rows()) == framed  # now from the frame
    rows = [(0, "x", None), (1.5, "y", 2)]
    assert log.plain_rows(log.plain_columns(rows, ("time", "event", "v"))) is None
    res2 = pdsim.run("scenarios/healthy.yaml")
    res2._event_records.append((1.0, "probe", "", -1, -1, -1, None, 0.0, "ok"))
    assert list(res2.event_rows())[-1].peer is None  # (went through pandas: from the frame)


def test_a_result_s_tables_are_built_when_first_read_and_then_kept():
    """A run builds no DataFrame until one is read (a sweep reads only summaries); each is
    built once, and assigning one replaces it."""
    res = pdsim.run("scenarios/healthy.yaml")
    assert res._built == {} and set(res._builders) == {"requests", "events", "timeseries",
                                                      "answers"}
    first = res.requests
    assert res.requests is first and "requests" in res._built and len(first) == 1001
    assert len(res.events) == res.summary["logged_events"]
    assert res.answers.empty and len(res.timeseries) > 10
    res.requests = first.head(3)
    assert len(res.requests) == 3 and len(res.measured) <= 3


def test_the_time_series_has_the_dtypes_of_a_frame_of_its_samples():
    """The time series is made from samples as tuples (records_columns): each column has what
    pandas gives a frame of the samples' lists (a first sample at the int time 0 among float
    times: float64; counts: int64), and the rates are the same floats."""
    from pdsim.engine import sim

    rows = [(0, 0, 0, 0, 0.0, 0.0, 0, 0, 0, 0, 0, 0, 0),
            (1.0, 120, 1, 0, 0.25, 0.5, 3, 1, 2, 0, 1, 4, 0),
            (1.0, 150, 1, 1, 0.5, 0.75, 2, 2, 0, 1, 0, 5, 2),
            (2.5, 300, 4, 2, 0.125, 1.0, 0, 0, 1, 0, 2, 3, 2)]
    got = sim._timeseries(rows)
    cols = {k: [r[i] for r in rows] for i, k in enumerate(sim.SAMPLE_COLUMNS)}
    want = pd.DataFrame(cols)
    t = np.array(cols["time"], dtype=float)
    dt = np.diff(t, prepend=0.0)
    dt[0] = t[0] or 1.0
    dt[dt == 0] = np.nan
    for name, col in (("tokens_per_s", "tokens_out"), ("failed_per_s", "failed")):
        x = np.array(cols[col], dtype=float)
        want.insert(list(want.columns).index("time") + 1 + (name == "failed_per_s"), name,
                    np.nan_to_num(np.diff(x, prepend=0.0) / dt, nan=0.0))
    assert list(got.columns) == list(want.columns)
    assert list(got.dtypes) == list(want.dtypes)
    pd.testing.assert_frame_equal(got, want, check_exact=True)


def _golden_run(case: str, extra: tuple = ()) -> pdsim.Result:
    """A run of golden case ``case`` (tests/golden.py; a shipped scenario at the last of its
    recorded seeds), with ``extra`` overrides."""
    import golden

    source, sets = {k.split("@")[0]: v for k, v in golden.cases(full=False).items()}[case]
    return pdsim.run(source, [*sets, *extra])


@pytest.mark.parametrize("case", ["drop_timeout", "small_faults", "small_library",
                                  "small_gateway", "small_pressure"])
def test_the_report_read_from_the_records_is_the_report_read_from_the_frames(case):
    """``pdsim run``'s report reads the events as rows of the records (no pandas): the events
    it tells are those the frame's selection picks (``isin``/``&`` on its columns), and its
    text is the report of the same run read from the frames, plain and --verbose; its horizon
    warning counts the unfinished requests as the request frame does."""
    from pdsim.output import report

    res = _golden_run(case)
    told = report.told(res.event_rows())
    lines = {v: report.render(res, verbose=v) for v in (False, True)}
    assert res._built == {}  # (the report built no frame)
    ev = res.events
    chosen = ev[~ev.event.isin(["retract", "flush_doomed", "probe", "flush_received",
                                "flush_answer"]) | ((ev.event == "probe") & (ev.value == 0))]
    assert told == list(chosen.itertuples(index=False))
    sc = res.scenario
    pairs = (sc.fleet.prefill.servers * sc.fleet.prefill.dp
             * sc.fleet.decode.servers * sc.fleet.decode.dp)
    for verbose, text in lines.items():
        assert "\n".join(report.timeline(chosen, pairs, verbose=verbose)) in text
        assert report.render(res, verbose=verbose) == text  # (now from the frame)
    res2 = _golden_run(case, ("horizon_s=4",))
    want = int((res2.requests.status == "unfinished").sum())
    assert want > 0 and f"{want} requests still in flight" in report.horizon_warning(res2)[0]


def test_the_timeline_tells_the_probes_that_failed_and_only_those():
    """A probe that reached its peer takes the pair off the blacklist and is not news; one
    that failed is a line (until 2026-11-30 every probe was printed as failed: the filter
    compared the detail with "ok", which is "ok after 0.0016 s")."""
    from pdsim.output import report

    res = _golden_run("small_faults")
    probes = res.events[res.events.event == "probe"]
    ok, failed = probes[probes.value == 1.0], probes[probes.value == 0.0]
    assert len(ok) and len(failed) and len(ok) + len(failed) == len(probes)
    assert ok.detail.str.startswith("ok after ").all()
    text = report.render(res, verbose=True)
    assert text.count(": probe of ") == len(failed)
    for e in failed.itertuples():
        assert f"t={e.time:9.3f}s {e.component}: probe of {e.peer} failed" in text


def test_the_report_reads_a_table_the_user_assigned():
    """A table assigned to a Result is what its report reads (not the run's records)."""
    from pdsim.output import report

    res = pdsim.run("scenarios/drop_timeout.yaml", ["horizon_s=20"])
    assert "Incident timeline" in report.render(res)
    assert report.horizon_warning(res)
    res.events = res.events.head(0)
    requests = res.requests.copy()
    requests["status"] = "completed"
    res.requests = requests
    assert "Incident timeline" not in report.render(res)
    assert "0 requests still in flight" in report.horizon_warning(res)[0]


def test_a_copy_of_a_result_keeps_its_own_tables():
    """``copy.copy`` and ``dataclasses.replace`` of a Result: assigning or deleting a table of
    one leaves the other's as it was (as with the frames in dataclass fields); a deleted
    table is the run's own again when next read."""
    import copy
    import dataclasses

    res = pdsim.run("scenarios/healthy.yaml", ["clients.0.num_prompts=20"])
    n = len(res.requests)  # (20 and the warmup request)
    for other in (copy.copy(res), dataclasses.replace(res, what_if="x")):
        other.requests = other.requests.head(1)
        assert len(other.requests) == 1 and len(res.requests) == n
        del other.requests
        assert len(other.requests) == n
    first = res.timeseries
    del res.timeseries
    assert res.timeseries is not first and res.timeseries.equals(first)


def test_the_timeline_has_no_heading_when_nothing_it_keeps_makes_a_line():
    """Path changes, breaker states and a stall are kept events the timeline does not tell;
    on their own they print nothing, not an empty "Incident timeline" block."""
    from pdsim.output import report

    res = _golden_run("small_library")
    quiet = res.events[res.events.event.isin(["path", "breaker", "breaker_trial",
                                              "decode_crash", "decode_restart"])]
    assert len(quiet) and len(report.told(quiet.itertuples(index=False))) == len(quiet)
    assert report.timeline(quiet, 8) == []
    loud = res.events[res.events.event.isin(["path", "fault_start"])]
    assert report.timeline(loud, 8)[0].strip("= ") == "Incident timeline"


def test_the_timeline_tells_every_pair_blacklisted_and_counts_a_burst_at_its_end():
    """A write that fails on a room already resolved (the decode gave the transfer up in a
    partition) blacklists its pair with no transfer failure logged: the timeline gives it a
    line of its own. A burst's line counts the pairs blacklisted as of its last failure, not
    those of a failure logged later (an add is logged just before its failure)."""
    from pdsim.output import report

    part = pdsim.run("scenarios/whatif_base.yaml", ["faults=[{preset: partition}]"])
    ev = part.events
    adds = ev[ev.event == "blacklist_add"]
    assert len(adds) and not (ev.event == "transfer_failed").any()  # adds with no failure
    text = report.render(part)
    lines = [x for x in text.splitlines() if "blacklisted by a failed write on a room" in x]
    assert len(lines) == len(adds)
    for n, (line, e) in enumerate(zip(lines, adds.itertuples(), strict=True), 1):
        assert line.startswith(f"t={e.time:9.3f}s {e.component}: {e.peer} blacklisted")
        assert line.endswith(f"{n}/64 pairs now")

    res = pdsim.run("scenarios/whatif_base.yaml", ["faults=[{preset: nic_degraded}]"])
    verbose = report.timeline(res.events, 64, verbose=True)
    short = report.timeline(res.events, 64)
    bursts = [x for x in short if " failed with ret != 0 " in x]
    assert len(bursts) >= 2
    for line in bursts:  # its count is the verbose count at its last failure
        last = line.split("..")[1].split("s ")[0] if ".." in line else line[2:11].strip()
        at_last = [x for x in verbose if x.startswith(f"t={float(last):9.3f}s")
                   and "pair blacklisted (" in x][-1]
        now = line.split(" now ")[0].rsplit(", ", 1)[1]
        assert at_last.endswith(f"({now})"), (line, at_last)
    # no pair goes on the blacklist untold
    assert not [x for x in short if "by a failed write on a room" in x]

"""Regressions for the defects issue #28 reported (reproductions in tests/fuzz_found/, one folder
each, the observed symptom in its first comment)."""

from __future__ import annotations

from pathlib import Path

from conftest import watch_ends

import pdsim

FOUND = Path(__file__).parent / "fuzz_found"


def _run(name: str, *sets: str) -> pdsim.Result:
    return pdsim.run(FOUND / name / "scenario.yaml", list(sets), allow_outside_paths=True)


# --- 1. one request, one end ----------------------------------------------------------------------


def test_fuzz_found_a_request_ends_once_the_first_end_wins():
    """A bootstrap or waiting timeout (the decode answers ``failed``) and the router's
    request_timeout_s of 300 s fell in one instant: MiniLB._resume overwrote the status with
    ``timed_out`` before the answer was processed. The first end now wins."""
    with watch_ends() as watch:
        res = _run("min_request_ended_twice")
    assert watch.writes and watch.ended_twice() == {}
    req = res.requests.set_index("rid")
    # rid 0: the decode's waiting timeout and the router's timeout, both at 300.0005 s
    assert req.t_done[0] == req.t_arrival[0] + 300.0005
    assert (req.status[0], req.reason[0], req.http_status[0]) == ("failed", "waiting_timeout",
                                                                   200)
    assert {"failed", "timed_out"} <= set(req.status) <= {"failed", "timed_out", "completed"}


# --- 3. the time series counts what the request table counts, to the run's end -----------------


def _ended_badly(res: pdsim.Result) -> int:
    return int(res.requests.status.isin(["failed", "timed_out"]).sum())


def test_fuzz_found_the_time_series_counts_router_timeouts():
    """975 router 504s (request_timeout_s 0.5 s, one request at a time) left
    timeseries.failed at 0: it counted only the decode's failures."""
    res = _run("min_timeseries_failed_router_timeout")
    assert (res.requests.status == "timed_out").sum() == 975 == _ended_badly(res)
    ts = res.timeseries
    assert ts.failed.iloc[-1] == 975 and ts.failed[ts.time <= 2.0].iloc[-1] == 3
    assert (ts.failed_per_s[ts.time > 1] == 2.0).mean() > 0.9  # one 504 every 0.5 s


def test_fuzz_found_the_time_series_closes_at_the_runs_end():
    """777 of 778 failures (a partition's heartbeat loss) came at 365.0 s after the last 1 s
    sample and the run ended at 365.0005 s with no sample: the time series said 1 failed."""
    res = _run("min_timeseries_final_interval_unsampled")
    ts, s = res.timeseries, res.summary
    bad = _ended_badly(res)
    assert s["failed"] + 1 == bad > 700  # (the summary leaves the warmup out)
    assert ts.time.iloc[-1] == res.end_s == 365.0005
    assert ts.failed.iloc[-1] == bad and ts.failed.iloc[-2] == 1
    assert ts.tokens_out.iloc[-1] == s["tokens_generated_fleet"]


def test_fuzz_found_the_time_series_counts_prefill_side_failures():
    """The shrunk case the heartbeat finding came from: its failures are the prefill's
    (heartbeat lost; the warmup's waiting timeout, in the instant of its router timeout), all
    in the time series by the run's end."""
    res = _run("min_timeseries_failed_heartbeat")
    reasons = res.requests.reason.value_counts().to_dict()
    assert set(reasons) == {"prefill_heartbeat_lost", "", "waiting_timeout"}
    assert res.timeseries.failed.iloc[-1] == _ended_badly(res) == (
        reasons["prefill_heartbeat_lost"] + reasons["waiting_timeout"]) > 700

"""Regressions for the defects issue #28 reported (reproductions in tests/fuzz_found/, one folder
each, the observed symptom in its first comment)."""

from __future__ import annotations

from pathlib import Path

from conftest import check_accounting, small_fleet, watch_ends

import pdsim
from pdsim.output.report import horizon_warning, render

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


# --- 2. every prompt is sent and ended, in flight, or not sent -----------------------------------


def test_fuzz_found_a_bench_whose_warmup_never_returns_has_every_prompt_unsent():
    """A prefill pool smaller than a prompt: the warmup never returns and the run stalls.
    The client said ``requests: 0, unsent: 0`` (``planned`` was set after the warmup)."""
    res = _run("min_bench_unsent_undercount")
    m = res.summary["clients"]["bench0"]
    assert (m["requests"], m["unfinished"], m["unsent"]) == (0, 0, 1000)
    warning = horizon_warning(res)[0]
    assert ("1000 prompts/questions not sent (bench0: 1 warmup request in flight, 1000 not "
            "sent)") in warning, warning
    check_accounting(res)


def test_a_bench_starting_after_the_horizon_or_aborting_has_every_prompt_unsent():
    late = small_fleet(horizon_s=100)
    late["clients"][0].update(num_prompts=5, start_s=200.0)
    res = pdsim.run(late)
    assert res.summary["clients"]["bench"]["unsent"] == 5
    check_accounting(res)
    # (the gateway answers 206 to a flush a busy rank refuses: raise_for_status aborts)
    aborts = small_fleet(router={"flush_handler": "rust_router"},
                         flush={"semantics": "reject_if_busy"},
                         operator_flushes=[], faults=[])
    aborts["clients"] = [
        {"kind": "bench", "name": "load", "num_prompts": 50, "request_rate": 10.0},
        {"kind": "bench", "name": "ci", "num_prompts": 7, "start_s": 1.0,
         "flush": {"mode": "raise_for_status"}}]
    res = pdsim.run(aborts)
    ci = res.summary["clients"]["ci"]
    assert ci["aborted"] and (ci["requests"], ci["unsent"]) == (0, 7)
    assert "raise_for_status aborted (7 prompts not sent)" in render(res)
    check_accounting(res)


def test_fuzz_found_eval_questions_in_flight_are_not_also_unsent():
    """3 questions on 3 threads, all in flight at the horizon: "3 in flight, 3 not sent"."""
    res = _run("min_eval_unsent_counts_in_flight")
    m = res.summary["clients"]["eval0"]
    assert (m["questions"], m["questions_in_flight"], m["unsent"]) == (0, 3, 0)
    warning = horizon_warning(res)[0]
    assert "0 prompts/questions not sent (eval0: 3 questions in flight)" in warning, warning
    check_accounting(res)


def test_eval_questions_never_asked_are_unsent():
    d = small_fleet(horizon_s=4.0)
    d["clients"] = [{"kind": "eval", "questions": 50, "threads": 4,
                     "dataset": {"kind": "random", "input_len": 256, "output_len": 64}}]
    res = pdsim.run(d)
    m = res.summary["clients"]["eval"]
    assert m["questions"] > 0 and m["questions_in_flight"] == 4 and m["unsent"] > 0
    assert m["questions"] + m["questions_in_flight"] + m["unsent"] == 50
    check_accounting(res)


def test_a_trace_cut_by_the_horizon_accounts_for_its_rows():
    from conftest import SCENARIOS

    res = pdsim.run(SCENARIOS / "trace_replay.yaml", ["clients.0.num_prompts=300",
                                                      "horizon_s=5"])
    m = next(iter(res.summary["clients"].values()))
    assert m["requests"] > 0 and m["unsent"] > 0 and m["requests"] + m["unsent"] == 300
    check_accounting(res)


# --- 4. a room failing in the instant its last chunk commits is freed once -----------------------


def test_fuzz_found_a_room_failing_as_its_last_chunk_commits_is_freed_once():
    """A waiting timeout in the instant a request's last prefill chunk committed: commit_step
    freed its pages, then the room's pending done step freed them again (KVError: double
    free). The prefill now stops listening to a room once it has released its request."""
    res = _run("min_kv_double_free")
    req = res.requests
    timed = req[req.reason == "waiting_timeout"]
    assert (timed.t_prefill_end == timed.t_done).sum() > 0  # the tie, many times
    assert (req.status == "failed").all()
    assert all(pool["used"] == 0 for pool in res.kv_pools.values()), res.kv_pools

"""Invariants every shipped scenario keeps (docs/invariants.md lists them with the tests that
enforce each)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import SCENARIOS, check_accounting, run_cached

# (capacity/...: the colocated/PD pair; incidents/...: the incident library)
NAMES = sorted(p.relative_to(SCENARIOS).with_suffix("").as_posix()
               for p in SCENARIOS.rglob("*.yaml"))
BUCKETS = {"completed", "failed", "timed_out", "unfinished"}


# the whole conversation trace takes ~20 s: its first rows keep the invariants just as well
SHORTEN = {"trace_replay": ("clients.0.num_prompts=600",)}


@pytest.fixture(params=NAMES)
def res(request):
    return run_cached(request.param, *SHORTEN.get(request.param, ()))


def test_scenarios_exist():
    assert {"healthy", "drop_timeout", "forward_timeout"} <= set(NAMES)


def test_every_request_in_exactly_one_terminal_bucket(res):
    req = res.requests
    assert set(req.status) <= BUCKETS
    done = req[req.status == "completed"]
    assert (done.generated == done.output_len).all()
    assert (done.http_status == 200).all()
    failed = req[req.status == "failed"]
    assert (failed.reason != "").all()
    # streamed failures answer 200 with an abort chunk, non-streamed ones 500; a router that
    # answers a failed leg itself (router.dispatch, a leg failing at transport level, a
    # crashed decode refusing) answers 502 either way
    by_router = failed.http_status == 502
    assert (failed[failed.stream & ~by_router].http_status == 200).all()
    assert (failed[~failed.stream & ~by_router].http_status == 500).all()
    assert (failed.generated == 0).all()
    assert req.rid.is_unique
    # arrived = sum of buckets, counted from the clients' side: a bench sends its prompts, an
    # eval one request per attempt; nothing is left unfinished before the horizon
    s = res.summary
    m = res.measured
    for c in res.scenario.clients:
        mine = m[m.client == c.name]
        ended = s["stopped_at_horizon"] or s.get("stalled_at_s") is not None
        if c.kind == "eval":
            answers = res.answers[res.answers.client == c.name]
            # (a run stopped early has questions in flight: their requests are not answers)
            assert len(answers) == c.questions or ended and len(answers) < c.questions
            assert answers.attempts.sum() == len(mine) or ended and (
                answers.attempts.sum() <= len(mine))
        elif "aborted" not in s["clients"][c.name]:  # a trace may hold fewer prompts
            sent = int((mine.attempt == 0).sum())  # (an SDK retry is a request, not a prompt)
            assert sent == c.num_prompts if c.dataset.kind == "random" else sent >= 1, c.name
            assert (mine.attempt <= c.sdk_retries).all()
    assert ((m.status != "unfinished").all() or s["stopped_at_horizon"]
            or s.get("stalled_at_s") is not None)


def test_kv_pages_within_capacity(res):
    for name, pool in res.kv_pools.items():
        assert 0 <= pool["used"] <= pool["capacity"], name
        assert pool["peak"] <= pool["capacity"], name
    ts = res.timeseries
    for col in ("prefill_kv_used", "decode_kv_used"):
        assert ((ts[col] >= 0) & (ts[col] <= 1)).all()


def test_time_is_monotone(res):
    assert np.all(np.diff(res.events.time.to_numpy()) >= 0)
    assert np.all(np.diff(res.timeseries.time.to_numpy()) > 0)
    req = res.requests
    fin = req[req.status.isin(["completed", "failed"])]
    assert (fin.t_done >= fin.t_arrival).all()
    first = fin[fin.generated > 0]
    assert (first.t_first_token >= first.t_arrival).all()
    assert (first.t_done >= first.t_first_token).all()


def test_tokens_counted_once(res):
    s = res.summary
    assert s["total_generated_tokens_true"] == int(res.measured.generated.sum())
    # every token a decode step produced belongs to exactly one request (warmup included)
    assert s["tokens_generated_fleet"] == int(res.requests.generated.sum())


def test_every_prompt_and_failure_accounted_for(res):
    """Each prompt sent and ended, in flight or not sent; the time series' last sample at the
    run's end, its failed and tokens_out the run's totals (conftest.check_accounting)."""
    check_accounting(res)

"""The capacity figures of a run: latency percentiles (pdsim.engine.summary) and the keeps-up
verdict over the steady window (pdsim.engine.steady), in the summary and the report."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import small_fleet
from hypothesis import given, settings
from hypothesis import strategies as st

import pdsim
from pdsim.engine import steady
from pdsim.engine.summary import COMPLETED, UNFINISHED, _q_weighted
from pdsim.output import report


def _load(rate: float, n: int, seed: int = 1, **client) -> dict:
    """The small fleet under a Poisson load of ``n`` prompts (2048 in, up to 256 out); it keeps
    up with ~50 req/s (measured: 2000 prompts, seeds 1-4)."""
    return small_fleet(seed=seed, clients=[{
        "kind": "bench", "num_prompts": n, "request_rate": rate,
        "dataset": {"kind": "random", "input_len": 2048, "output_len": 256}, **client}])


# --- percentiles -----------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1e3, allow_nan=False), st.integers(0, 40)),
                min_size=1, max_size=30),
       st.sampled_from([0.0, 0.5, 0.9, 0.95, 0.99, 1.0]))
def test_weighted_quantile_is_numpys_over_the_repeated_values(pairs, q):
    v = np.array([p[0] for p in pairs])
    w = np.array([p[1] for p in pairs])
    got = _q_weighted(v, w, q)[0]
    if w.sum() == 0:
        assert np.isnan(got)
    else:
        assert got == pytest.approx(float(np.quantile(np.repeat(v, w), q)), rel=1e-12, abs=1e-9)


def test_summary_percentiles_are_those_of_the_request_table():
    res = pdsim.run(_load(20, 300))
    req = res.measured
    ok = req[req.http_status == 200]
    ttft = (ok.t_first_token - ok.t_arrival).to_numpy()
    e2e = (ok.t_done - ok.t_arrival).to_numpy()
    tpot = ((ok.t_done - ok.t_first_token) / (ok.generated - 1))[ok.generated > 1].to_numpy()
    s = res.summary
    for name, x in (("ttft", ttft), ("e2e", e2e), ("tpot", tpot)):
        for p in (50, 90, 95, 99):
            key = f"{'median' if p == 50 else f'p{p}'}_{name}_ms"
            assert s[key] == pytest.approx(1e3 * np.percentile(x, p), abs=2e-3), key
        assert s[f"median_{name}_ms"] <= s[f"p90_{name}_ms"] <= s[f"p95_{name}_ms"] \
            <= s[f"p99_{name}_ms"]
    # ITL: each request's mean gap, once per gap
    gaps = (ok.generated - 1).clip(lower=0).to_numpy()
    per = ((ok.t_done - ok.t_first_token) / (ok.generated - 1).clip(lower=1)).to_numpy()
    assert s["p99_itl_ms"] == pytest.approx(1e3 * np.quantile(np.repeat(per, gaps), 0.99),
                                            abs=2e-3)


def test_the_report_prints_every_percentile_in_bench_serving_wording():
    text = report.render(pdsim.run(_load(20, 100)))
    for name in ("E2E Latency", "TTFT", "TPOT", "ITL"):
        for p in ("Mean", "Median", "P90", "P95", "P99"):
            assert f"{p} {name} (ms):" in text, (p, name)


# --- the keeps-up verdict: its arithmetic --------------------------------------------------


def _cols(arrival: np.ndarray, done: np.ndarray) -> dict:
    status = np.where(np.isfinite(done), COMPLETED, UNFINISHED)
    return {"status": status, "t_arrival": arrival, "t_done": done}


def test_a_server_faster_than_its_load_keeps_up():
    rng = np.random.default_rng(0)
    t = np.cumsum(rng.exponential(1 / 20, 2000))  # ~100 s at 20 req/s
    s = steady.window(t, _cols(t, t + 2.0), np.inf)
    assert s["keeps_up"] is True
    assert s["completed_req_s"] == pytest.approx(s["offered_req_s"], rel=0.05)
    assert abs(s["queue_growth_req_s"]) < 0.5
    assert s["in_system_mean"] == pytest.approx(40, rel=0.15)  # Little: 20 req/s x 2 s


def test_a_server_at_half_the_load_falls_behind_by_the_difference():
    t = np.arange(2000) / 20.0  # 20 req/s offered, one FIFO server answering 10 req/s
    done = 0.1 * (np.arange(2000) + 1)
    s = steady.window(t, _cols(t, done), np.inf)
    assert s["keeps_up"] is False
    assert s["queue_growth_req_s"] == pytest.approx(10, rel=0.02)
    assert steady.verdict_line(s, rates=False) == (
        f"falling behind: queue grows {s['queue_growth_req_s']:.2f} req/s")


def test_a_fleet_still_filling_is_not_called_behind():
    """Every request takes 15 s and the arrivals span 20 s: over the window (10-20 s) the
    count still climbs, as a fleet that keeps up fills; no verdict rather than "behind"."""
    rng = np.random.default_rng(1)
    t = np.cumsum(rng.exponential(1 / 20, 400))
    s = steady.window(t, _cols(t, t + 15.0), np.inf)
    assert s["keeps_up"] is None and "filling" in s["note"]
    longer = np.cumsum(rng.exponential(1 / 20, 4000))  # 200 s of the same: it keeps up
    assert steady.window(longer, _cols(longer, longer + 15.0), np.inf)["keeps_up"] is True


def test_prompts_never_sent_count_as_offered():
    """The schedule is the load: prompts the run never got to send stay in the system."""
    t = np.arange(1000) / 20.0
    sent = t[:500]  # the rest never sent (a client held back, or the run ended)
    s = steady.window(t, _cols(sent, sent + 1.0), np.inf)
    assert s["keeps_up"] is False


def test_everything_at_once_and_closed_loops_have_no_verdict():
    t = np.zeros(100)
    s = steady.window(t, _cols(t, t + 1.0), np.inf)
    assert s["keeps_up"] is None and "at once" in s["note"]
    assert steady.closed_loop()["keeps_up"] is None
    assert steady.window(np.arange(10.0), _cols(np.arange(10.0), np.arange(10.0) + 1),
                         np.inf)["keeps_up"] is None  # 5 in the window: too few


# --- the keeps-up verdict: on runs -----------------------------------------------------------


def test_a_fleet_that_keeps_up_is_not_read_as_behind_by_its_drain_tail():
    """The issue's case: request throughput over the run reads short of the offered rate (the
    drain tail after the last arrival), the steady window does not."""
    s = pdsim.run(_load(30, 600)).summary
    st_ = s["clients"]["bench"]["steady"]
    assert s["request_throughput_req_s"] < 0.9 * 30  # the tail's effect
    assert st_["keeps_up"] is True
    # (completions lag arrivals by a latency: over a window of seconds they differ by a few %)
    assert st_["completed_req_s"] == pytest.approx(st_["offered_req_s"], rel=0.1)
    assert s["steady"] == st_  # one bench client: the fleet's verdict is its own


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_verdicts_below_and_above_capacity(seed):
    """Kept up at 40 req/s (~75% of capacity), behind at 60 (~110%): the chosen thresholds
    separate them on every seed."""
    below = pdsim.run(_load(40, 2000, seed)).summary["steady"]
    above = pdsim.run(_load(60, 2000, seed)).summary["steady"]
    assert below["keeps_up"] is True
    assert above["keeps_up"] is False
    # the shortfall is the queue's growth (Little): offered - completed
    assert above["queue_growth_req_s"] == pytest.approx(
        above["offered_req_s"] - above["completed_req_s"], abs=2.0)


def test_a_short_window_wander_is_not_a_growing_queue():
    """300 prompts at 40 req/s (~75% of capacity): over its 4 s window the count rose ~3x its
    square root, and 6% of the offered rate; a kept-up fleet's wander (BEHIND_Z)."""
    s = pdsim.run(_load(40, 300, seed=4)).summary["steady"]
    assert s["queue_growth_req_s"] >= steady.BEHIND_SHARE * s["offered_req_s"]
    assert s["keeps_up"] is True


def test_a_concurrency_limit_that_holds_prompts_back_falls_behind():
    """max_concurrency 4 serves ~4 / latency req/s whatever is offered: the backlog in the
    client grows, which only the client's schedule (not its send times) shows."""
    summary = pdsim.run(_load(20, 600, max_concurrency=4)).summary
    for s in (summary["steady"], summary["clients"]["bench"]["steady"]):
        assert s["keeps_up"] is False
        assert s["completed_req_s"] < 0.5 * s["offered_req_s"]


def test_the_report_says_the_verdict_in_one_line():
    text = report.render(pdsim.run(_load(60, 2000)))
    assert "Keeps up?" in text
    line = next(x for x in text.splitlines() if x.startswith("Verdict:"))
    assert "falling behind: queue grows" in line and "req/s" in line
    text = report.render(pdsim.run(_load(40, 2000)))
    assert next(x for x in text.splitlines() if x.startswith("Verdict:")).endswith("keeps up")


def test_the_summary_and_report_give_goodput_per_client_when_an_slo_is_set():
    d = {**_load(20, 300), "slo": {"ttft_ms": 1e6}}
    res = pdsim.run(d)
    c = res.summary["clients"]["bench"]
    assert c["slo"]["met_slo"] == c["completed_requests"]
    text = report.render(res)
    assert f"{'Request goodput (req/s):':<50}{c['slo']['goodput_req_s']:.2f}" in text
    assert "SLO attainment" in text
    assert "slo" not in pdsim.run(_load(20, 300)).summary["clients"]["bench"]


def test_a_non_streaming_client_has_no_tpot_rather_than_zero():
    """bench_serving's TPOT of a one-chunk response is 0 (latency - TTFT); printed as 0.00 it
    reads as a perfect decode. It is n/a (None in the JSON), and a mix of clients' TPOT is over
    the streamed responses only."""
    d = small_fleet(clients=[
        {"kind": "bench", "name": "streamed", "num_prompts": 60, "request_rate": 10,
         "dataset": {"kind": "random", "input_len": 512, "output_len": 64}},
        {"kind": "bench", "name": "whole", "num_prompts": 60, "request_rate": 10,
         "stream": False, "dataset": {"kind": "random", "input_len": 512, "output_len": 64}}])
    res = pdsim.run(d)
    s = res.summary
    whole = s["clients"]["whole"]
    for k in ("mean", "median", "p90", "p95", "p99"):
        assert whole[f"{k}_tpot_ms"] is None and whole[f"{k}_itl_ms"] is None
    assert whole["completed_mean_tpot_ms"] > 0  # the server-side figure stays
    assert s["mean_tpot_ms"] == s["clients"]["streamed"]["mean_tpot_ms"]
    text = report.render(res)
    block = text.split("Serving Benchmark Result: whole")[1]
    assert f"{'Mean TPOT (ms):':<50}n/a" in block
    assert "Not streamed (stream: false)" in block


class _Bar:
    """A stand-in for the progress bar: what the run's bar was told."""

    def __init__(self, total, initial=0, **kw):
        self.total, self.n, self.unit = total, initial, kw.get("unit")

    def update(self, k):
        self.n += k

    def set_postfix_str(self, *a, **kw):
        pass

    def close(self):
        self.closed = True


def test_the_progress_bar_reaches_its_end_when_the_run_ends(monkeypatch):
    """It counted simulated seconds of horizon_s and so ended at 49% of a run whose clients
    finished halfway to the horizon; it counts the clients' requests now."""
    from pdsim.util import backends

    bars = []
    monkeypatch.setattr(backends, "progress_bar", lambda *a, **kw: bars.append(_Bar(*a, **kw))
                        or bars[-1])
    d = small_fleet(clients=[
        {"kind": "bench", "num_prompts": 40, "request_rate": 20,
         "dataset": {"kind": "random", "input_len": 512, "output_len": 32}},
        {"kind": "eval", "questions": 30, "threads": 4,
         "dataset": {"kind": "random", "input_len": 256, "output_len": 32}}])
    res = pdsim.run(d, progress=True)
    assert res.summary["simulated_s"] < 0.5 * d["horizon_s"]
    (bar,) = bars
    assert bar.unit == "req" and bar.total == 70
    assert bar.n == bar.total and bar.closed

"""A colocated SGLang server's front end (the TokenizerManager, pdsim.engine.frontend).

One serial process per server handles every (output message x request) and tokenizes every
new request; its queues have no high-water mark, so a slow front end caps the *delivered*
token rate and delays new requests behind its backlog, not the GPU's step. The costs here
(50-200 us per request-chunk, 200 ns per token so far) are chosen to make the front end bind
clearly on a small fleet (the values to turn it on with: 42 us and 8.3 ns; engines.yaml ships
it off); each test fails with its part of the mechanism removed (the stage off, the copy term
dropped, the tokenization's wait dropped).
"""

from __future__ import annotations

import numpy as np
import pytest

import pdsim
from pdsim.config.scenario import from_dict
from pdsim.config.units import ScenarioError
from pdsim.engine.frontend import FrontEnd


def _scenario(chunk_us: float, copy_ns: float = 0.0, *, tp: int = 8, output_len: int = 400,
              range_ratio: float = 0.8, stream_interval: int = 1) -> dict:
    """An 8B model on 8 H200s (TP 8): a fast GPU; 256 streams of 200 in / up to 400 out."""
    return {"seed": 1,
            "engine": {"version": "0.5.6.post2", "frontend_chunk_us": chunk_us,
                       "frontend_copy_ns_per_token": copy_ns},
            "fleet": {"gpu": "H200", "model": "llama-3.1-8b", "mode": "colocated",
                      "colocated": {"tp": tp, "stream_interval": stream_interval}},
            "clients": [{"kind": "bench", "num_prompts": 768, "max_concurrency": 256,
                         "request_rate": "inf",
                         "dataset": {"kind": "random", "input_len": 200,
                                     "output_len": output_len, "range_ratio": range_ratio}}]}


def _run(sc: dict) -> pdsim.Result:
    return pdsim.run(pdsim.load(sc))


@pytest.fixture(scope="module")
def off() -> pdsim.Result:
    return _run(_scenario(0.0))


@pytest.fixture(scope="module")
def slow() -> pdsim.Result:
    return _run(_scenario(100.0))


def test_the_fluid_backlog_sums_while_behind_and_restarts_when_idle():
    fe = FrontEnd(100.0, 10.0, 1)
    assert fe.take(1.0, 0.5) == 1.5  # idle: starts at once
    assert fe.take(1.2, 0.5) == 2.0  # behind: queued after the first
    assert fe.take(5.0, 0.0) == 5.0  # idle again
    # 3 steps of 4 requests having 10 tokens in all: 12 chunks, tokens so far 14 + 18 + 22
    assert fe.steps(5.0, 3, 4, 10) == pytest.approx(5.0 + 12 * 100e-6 + 54 * 10e-9)
    every2 = FrontEnd(100.0, 10.0, 2)  # --stream-interval 2: half the chunks a step
    assert every2.steps(5.0, 3, 4, 10) == pytest.approx(5.0 + (12 * 100e-6 + 54 * 10e-9) / 2)


def test_throughput_is_capped_at_the_front_ends_rate_when_the_gpu_is_faster(off, slow):
    """100 us per request-chunk: at most 10,000 delivered tokens/s, whatever the GPU does."""
    assert off.summary["output_throughput_tok_s"] > 25_000  # the GPU alone
    capped = slow.summary["output_throughput_tok_s"]
    assert 8_000 < capped <= 10_000 * 1.01
    assert slow.summary["mean_tpot_ms"] > 3 * off.summary["mean_tpot_ms"]


def test_the_copy_of_the_output_so_far_binds_on_its_own():
    """No fixed cost, 200 ns per token so far: fixed 1,000-token outputs have 500 tokens so far
    on average, 100 us a chunk, so again about 10,000 tokens/s."""
    res = _run(_scenario(0.0, 200.0, output_len=1000, range_ratio=1.0))
    assert 8_500 < res.summary["output_throughput_tok_s"] <= 10_000 * 1.05


def test_stream_interval_divides_the_front_ends_work():
    res = _run(_scenario(100.0, stream_interval=2))
    assert 16_000 < res.summary["output_throughput_tok_s"] <= 20_000 * 1.01


def test_ttft_rises_with_the_backlog(off):
    """A new request is tokenized behind the backlog, and its first token is delivered behind
    it too: the mean TTFT rises with the front end's cost."""
    ttfts = [off.summary["mean_ttft_ms"]] + [_run(_scenario(us)).summary["mean_ttft_ms"]
                                             for us in (50.0, 100.0)]
    assert ttfts[0] < ttfts[1] < ttfts[2]
    assert ttfts[2] > 4 * ttfts[0]


def test_a_new_request_reaches_the_scheduler_only_when_the_front_end_reaches_it(off, slow):
    """Arrival to the first prefill forward: the tokenization waits its turn in the FIFO
    (a backlog of messages of ~256 requests at 100 us: tens of ms and more), not only the
    scheduler's queue."""
    def wait_ms(res: pdsim.Result) -> float:
        r = res.requests[res.requests.status == "completed"]
        return float((r.t_prefill_start - r.t_arrival).mean() * 1e3)
    assert wait_ms(slow) > wait_ms(off) + 50.0


def test_first_and_last_tokens_are_delivered_after_the_scheduler_made_them(off, slow):
    r = slow.requests[slow.requests.status == "completed"]
    late = (r.t_first_token - r.t_prefill_end).to_numpy()
    assert (late >= 0).all() and late.mean() > 1e-3  # behind its message at least
    o = off.requests[off.requests.status == "completed"]
    assert (o.t_first_token == o.t_prefill_end).all()  # (off: the forward's end)


def test_zero_costs_switch_the_stage_off_exactly(monkeypatch):
    """Both costs 0 build no front end: the very run of a fleet without one (a zero-cost front
    end would still move arithmetic: the tokenization's delay through ``take``)."""
    zero = _run(_scenario(0.0))
    monkeypatch.setattr("pdsim.engine.fleet.FrontEnd", lambda *a: None)
    none = _run(_scenario(0.0))
    assert zero.requests.equals(none.requests)
    assert zero.summary == none.summary
    # (and the check can tell: a front end built at zero cost differs in the last bits)
    monkeypatch.undo()
    import pdsim.engine.fleet as fleet_mod
    built = []

    class Spy(FrontEnd):
        def __init__(self, *a):
            built.append(1)
            super().__init__(*a)
    monkeypatch.setattr(fleet_mod, "FrontEnd", Spy)
    _run(_scenario(0.0))
    assert not built
    _run(_scenario(1e-9))
    assert built


def test_the_same_scenario_gives_the_same_run(slow):
    again = _run(_scenario(100.0))
    assert again.requests.equals(slow.requests)
    assert again.summary == slow.summary
    assert not np.isnan(slow.requests.t_done.to_numpy(dtype=float)).any()


@pytest.mark.parametrize("section,key,value", [
    ("engine", "frontend_chunk_us", -1.0),
    ("engine", "frontend_copy_ns_per_token", "fast"),
    ("colocated", "stream_interval", 0),
])
def test_bad_values_are_one_line_errors(section, key, value):
    sc = _scenario(10.0)
    (sc["engine"] if section == "engine" else sc["fleet"]["colocated"])[key] = value
    with pytest.raises(ScenarioError) as err:
        from_dict(sc)
    msg = str(err.value)
    assert key in msg and "\n" not in msg, msg


def test_the_shipped_engine_profile_has_the_front_end_off():
    """engines.yaml ships the stage off (both costs 0: no front end is built, the run is the one
    without it): on colocated servers only, on by default it would tilt a colocated-vs-PD
    comparison; its source text gives the values to turn it on with."""
    from pdsim.model import profiles

    eng = profiles.engine("sglang")
    assert eng.frontend_chunk_us == 0 and eng.frontend_copy_ns_per_token == 0
    src = profiles.raw_engines()["sglang"]["frontend_chunk_us"]["source"]
    assert "--set engine.frontend_chunk_us=42" in src and "[pr22548]" in src


def test_an_answer_the_front_end_delivers_after_the_router_timeout_is_a_timeout():
    """The scheduler is done with a request when its last token is sampled, but the client has
    it only when the front end reaches it: a router timeout before that ends the request
    (504), not a completion delivered later (before: 'completed' with E2E up to 11 s against
    a 4 s timeout). A first token not delivered by the end is no first token."""
    sc = _scenario(100.0)
    sc["router"] = {"request_timeout_s": 4.0}
    r = _run(sc).requests
    done = r[r.status == "completed"]
    assert (r.status == "timed_out").sum() > 100
    assert ((done.t_done - done.t_arrival) <= 4.0 + 1e-9).all()
    ended = r[r.status != "completed"]
    assert not (ended.t_first_token > ended.t_done).any()


def test_a_crash_takes_the_front_ends_backlog_with_it():
    """The server's process dies with its front end: the answers it had not delivered fail
    (502) at the crash, and after the restart a new request is not tokenized behind the dead
    process's backlog (before: delivered 'completed' after the crash, and the first requests
    after the restart waited ~1 s for it)."""
    sc = _scenario(100.0)
    sc["clients"][0].update(request_rate=100.0, num_prompts=800)
    sc["faults"] = [{"preset": "decode_crash", "at_s": 3.0, "restart_after_s": 1.0}]
    r = _run(sc).requests
    done = r[r.status == "completed"]
    assert not ((done.t_arrival < 3.0) & (done.t_done > 3.0)).any()
    assert (r.reason == "decode_crashed").sum() > 50
    after = r[r.t_arrival >= 4.0].sort_values("t_arrival").head(5)
    assert len(after) == 5
    assert ((after.t_prefill_start - after.t_arrival) < 0.05).all()


def test_work_reaches_the_front_end_in_time_order(monkeypatch):
    """The front end is a FIFO: what it is handed (a step's output, a prompt to tokenize) comes
    in the order it happened. A prompt arriving inside a span of decode steps committed at once
    waits behind the output of the span's steps already past (submit catches the batch up
    first); handing the prompt over before them put it ahead of output made earlier."""
    seen: dict[int, list[float]] = {}
    take, steps = FrontEnd.take, FrontEnd.steps

    def rec_take(self, t, work):
        seen.setdefault(id(self), []).append(t)
        return take(self, t, work)

    def rec_steps(self, t, n, batch, generated):
        seen.setdefault(id(self), []).append(t)
        return steps(self, t, n, batch, generated)

    monkeypatch.setattr(FrontEnd, "take", rec_take)
    monkeypatch.setattr(FrontEnd, "steps", rec_steps)
    sc = _scenario(100.0, 200.0, output_len=1000, range_ratio=1.0)
    sc["clients"][0].update(request_rate=20.0, num_prompts=300)  # (arrivals inside spans)
    _run(sc)
    assert seen and all(len(v) > 100 for v in seen.values())
    for ts in seen.values():
        back = [(a, b) for a, b in zip(ts, ts[1:], strict=False) if b < a - 1e-12]
        assert not back, back[:3]


def test_a_prompt_waits_behind_the_output_of_steps_already_past(monkeypatch):
    """A prompt arriving inside a span of decode steps committed at once is tokenized after the
    front end has been handed the output of the span's steps already past: when its
    tokenization is queued there is nothing left to hand over (catching the rank up then hands
    over nothing more). Without the catch-up in submit it would be queued ahead of that output."""
    from pdsim.engine.colocated import ColocatedRank

    handed = [0]
    inside: list = []  # (rank, its prompt's tokenization work) while in submit
    violations = []
    steps, take, submit = FrontEnd.steps, FrontEnd.take, ColocatedRank.submit

    def rec_steps(self, t, n, batch, generated):
        handed[0] += n * batch
        return steps(self, t, n, batch, generated)

    def rec_take(self, t, work):
        if inside and inside[-1] is not None and work == inside[-1][1]:
            rank, before = inside[-1][0], handed[0]  # (the prompt's tokenization, from submit)
            inside.append(None)  # (what the check's own catch-up hands over is not checked)
            try:
                rank._catch_up()
            finally:
                inside.pop()
            if handed[0] != before:
                violations.append((t, handed[0] - before))
        return take(self, t, work)

    def rec_submit(self, req):
        inside.append((self, self.tokenize_s_per_token * req.input_len))
        try:
            return submit(self, req)
        finally:
            inside.pop()

    monkeypatch.setattr(FrontEnd, "steps", rec_steps)
    monkeypatch.setattr(FrontEnd, "take", rec_take)
    monkeypatch.setattr(ColocatedRank, "submit", rec_submit)
    sc = _scenario(100.0, 200.0, output_len=1000, range_ratio=1.0)
    sc["clients"][0].update(request_rate=20.0, num_prompts=300)  # (arrivals inside spans)
    _run(sc)
    assert handed[0] > 10_000 and not violations, violations[:3]

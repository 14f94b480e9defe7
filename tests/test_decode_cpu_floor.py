"""The scheduler's per-request CPU work on a decode step (``engine.decode_request_us``).

SGLang's overlap scheduler (``Scheduler.event_loop_overlap``, python/sglang/srt/managers/
scheduler.py, 0.5.x) launches step N+1, then processes step N's results
(``process_batch_result_decode``: each request's output ids, stop check, ``stream_output``)
while the GPU runs N+1: a step takes the longer of the GPU's forward and that CPU work. These
tests fail without the floor (decode() would be the GPU's time alone)."""

from __future__ import annotations

import itertools

import pytest

import pdsim
from pdsim.model import profiles
from pdsim.model.predictor import Layout, OperatorPredictor

US = 40.0  # a value inside the declared physical range (5-60 us), not a fitted one


def _pred(us: float, tp: int = 8) -> OperatorPredictor:
    eng = profiles.engine().model_copy(update={"decode_request_us": us})
    return OperatorPredictor(profiles.gpu("H200"), profiles.model("llama-3.1-8b"), eng,
                             Layout(tp=tp))


def test_a_large_batch_step_is_the_cpu_work_on_its_requests():
    pred, off = _pred(US), _pred(0.0)
    gpu = off.decode(512, 512 * 1200)
    assert gpu < 512 * US * 1e-6  # (an 8B model at tp 8: the GPU step is short)
    assert pred.decode(512, 512 * 1200) == pytest.approx(512 * US * 1e-6)
    assert pred.decode_gpu(512, 512 * 1200) == gpu
    # a small batch: the GPU's step hides the CPU work, nothing changes
    assert pred.decode(8, 8 * 1200) == off.decode(8, 8 * 1200)


def test_the_floor_counts_a_dp_ranks_own_requests():
    """Under DP attention each rank's scheduler processes its own requests (attn_batch)."""
    pred = _pred(US)
    assert pred.decode(64, 64 * 1000, attn_batch=400) == pytest.approx(400 * US * 1e-6)


def test_a_decode_span_takes_the_same_floor_step_by_step():
    pred = _pred(US, tp=1)
    for batch in (16, 300, 512):
        series = list(itertools.islice(pred.decode_series(batch, batch, batch * 900, batch), 50))
        assert series == [pred.decode(batch, batch * 900 + batch * j, batch)
                          for j in range(50)]
    tp8 = _pred(US)  # (at tp 8 the GPU's step alone is below the floor)
    assert tp8.decode_gpu(512, 512 * 900) < 512 * US * 1e-6
    assert min(itertools.islice(tp8.decode_series(512, 512, 512 * 900, 512), 50)) == \
        pytest.approx(512 * US * 1e-6)


def _colocated(us: float) -> dict:
    return {"seed": 1, "engine": {"version": "0.5.6.post2", "decode_request_us": us},
            "fleet": {"gpu": "H200", "model": "llama-3.1-8b", "mode": "colocated",
                      "colocated": {"tp": 8}},
            "clients": [{"kind": "bench", "num_prompts": 768, "max_concurrency": 384,
                         "request_rate": "inf",
                         "dataset": {"kind": "random", "input_len": 200, "output_len": 200,
                                     "range_ratio": 1.0}}]}


def test_a_colocated_server_at_high_concurrency_decodes_at_the_cpus_pace():
    """384 running requests of an 8B model on 8 H200s: the GPU's step is a few ms, the
    scheduler's work on 384 requests at 40 us is 15.4 ms, and the run's TPOT follows it."""
    fast = pdsim.run(pdsim.load(_colocated(0.0))).summary["mean_tpot_ms"]
    slow = pdsim.run(pdsim.load(_colocated(US))).summary["mean_tpot_ms"]
    assert fast < 10.0
    assert slow >= 0.9 * 384 * US / 1e3 > 1.5 * fast


def test_a_mixed_forward_takes_the_cpu_work_on_its_decode_requests():
    """``enable_mixed_chunk``: a prefill forward that also decodes the running batch is floored
    by the scheduler's work on those requests (ColocatedRank.step_time). A 16-token chunk with
    384 decode requests mixed in: the GPU's forward is a few ms, the CPU work 15.4 ms."""
    from types import SimpleNamespace

    from pdsim.engine.colocated import ColocatedRank

    pred, off = _pred(US), _pred(0.0)
    b, ctx, n = 384, 384 * 100, 16
    plan = (b, ctx, 0, n + b, n * n, n * (n + 1) / 2, 1 + b, 0, n + b)
    gpu = ColocatedRank.step_time(SimpleNamespace(predictor=off), plan)
    assert gpu < b * US * 1e-6
    assert ColocatedRank.step_time(SimpleNamespace(predictor=pred), plan) == \
        pytest.approx(b * US * 1e-6)


def test_a_colocated_server_mixing_chunks_decodes_at_the_cpus_pace():
    """The same server with ``enable_mixed_chunk`` and staggered short requests (16 in, ~64
    out, range_ratio 0.2): finishing requests let new ones in, so most forwards are mixed
    ones, and the run's TPOT follows the CPU work on ~384 requests (13.5 ms; 9.2 ms with the
    mixed forward's floor removed)."""
    def scenario(us: float) -> dict:
        sc = _colocated(us)
        sc["fleet"]["colocated"]["enable_mixed_chunk"] = True
        sc["clients"][0]["dataset"].update(input_len=16, output_len=64, range_ratio=0.2)
        return sc

    fast = pdsim.run(pdsim.load(scenario(0.0))).summary["mean_tpot_ms"]
    slow = pdsim.run(pdsim.load(scenario(US))).summary["mean_tpot_ms"]
    assert fast < 7.0
    assert slow >= 0.8 * 384 * US / 1e3 > 1.5 * fast

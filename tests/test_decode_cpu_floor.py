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

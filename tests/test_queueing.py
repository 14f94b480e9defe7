"""Queueing sanity: one decode rank serving one request at a time is an M/G/1 queue.

Poisson arrivals, geometric output lengths and a fixed decode step make the service time
``(L - 1) * step`` with ``L ~ Geometric(1/m)``: nearly exponential, so the queue behaves like
M/M/1; the Pollaczek-Khinchine formula gives its exact mean sojourn time.
"""

from __future__ import annotations

import pdsim

STEP_MS = 10.0
MEAN_OUT = 21  # mean output length (tokens); service mean (m - 1) * step = 200 ms
RATE = 3.0  # req/s -> utilisation 0.6


def _scenario(n: int) -> dict:
    return {
        "name": "mg1", "seed": 3, "horizon_s": 100000,
        "fleet": {"gpu": "H20", "model": "dsv3-ci-test",
                  "prefill": {"dp": 1, "tp": 1, "max_running_requests": 1},
                  "decode": {"dp": 1, "tp": 1, "max_running_requests": 1}},
        "router": {"http_latency_ms": 0},
        "engine": {"bootstrap_ms": 0, "tokenize_us_per_token": 0},  # no fixed TTFT-path cost
        "transfer": {"call_latency_ms": 0},
        "predictor": {"kind": "fitted", "coefficients": {
            "prefill_a_ms": 0.0, "prefill_b_ms_per_ktok": 0.0, "prefill_c_ms_per_mtok2": 0.0,
            "decode_a_ms": STEP_MS, "decode_b_ms_per_ktok": 0.0, "decode_c_ms_per_seq": 0.0}},
        "clients": [{"kind": "bench", "num_prompts": n, "request_rate": RATE,
                     "warmup_requests": 0,
                     "dataset": {"kind": "random", "input_len": 16, "output_len": MEAN_OUT,
                                 "range_ratio": 1.0, "output_distribution": "geometric"}}],
    }


def test_single_rank_matches_pollaczek_khinchine():
    res = pdsim.run(_scenario(6000))
    m = res.measured
    assert (m.status == "completed").all()
    step = STEP_MS / 1e3
    p = 1.0 / MEAN_OUT
    # S = (L-1)*step, L ~ Geometric(p) on {1,2,...}: K = L-1 is geometric on {0,1,...}
    ek = (1 - p) / p
    ek2 = (1 - p) * (2 - p) / p**2
    es, es2 = ek * step, ek2 * step**2
    rho = RATE * es
    assert 0.55 < rho < 0.65
    w_theory = es + RATE * es2 / (2 * (1 - rho))
    w_mm1 = es / (1 - rho)
    w_sim = float((m.t_done - m.t_arrival).mean())
    assert abs(w_sim - w_theory) / w_theory < 0.08, (w_sim, w_theory)
    assert abs(w_theory - w_mm1) / w_mm1 < 0.05  # and that is M/M/1 within 5%
    # utilisation: the share of time the rank was busy decoding
    busy = float(((m.t_done - m.t_first_token)).sum()) / float(m.t_done.max())
    assert abs(busy - rho) < 0.05

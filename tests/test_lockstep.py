"""DP-attention lockstep: ranks of a server step together; MoE terms at mean, attention at max."""

from __future__ import annotations

import pytest
from conftest import small_fleet

import pdsim
from pdsim.decode import DecodeRank
from pdsim.lockstep import step_time
from pdsim.predictor import FittedPredictor
from pdsim.prefill import PrefillRank

P = FittedPredictor(10, 2, 1, 5, 0.5, 0.1)


class _Prefill(PrefillRank):
    def __init__(self):  # only what step_time reads
        self.predictor = P


class _Decode(DecodeRank):
    def __init__(self):
        self.predictor = P


def test_prefill_step_gathers_tokens_and_waits_for_slowest_attention():
    ranks = [_Prefill() for _ in range(4)]
    # plans: (tokens, sum len*(len+prefix), causal pairs, requests, prefix tokens)
    plans = [(4000, 8e6, 4e6, 2, 0), (2000, 2e6, 1e6, 1, 0), None, None]
    # mean tokens over all 4 ranks (idle ones count), max attention term
    assert step_time(ranks, plans) == pytest.approx(P.prefill(1500, 8e6))


def test_decode_step_gathers_batch_and_waits_for_longest_context():
    ranks = [_Decode() for _ in range(2)]
    plans = [(64, 300_000, 0), (16, 50_000, 0)]
    assert step_time(ranks, plans) == pytest.approx(P.decode(40, 300_000))
    plans = [(64, 300_000, 0), (16, 50_000, 2048)]  # a re-admitted request's recompute
    assert step_time(ranks, plans) == pytest.approx(P.decode(40, 300_000) + P.prefill(2048, 0))


def _one_at_a_time(lockstep: bool):
    d = small_fleet()
    d["fleet"]["decode"]["lockstep"] = lockstep
    d["clients"][0].update(num_prompts=20, max_concurrency=1)
    d["predictor"] = {"kind": "fitted", "coefficients": {"decode_c_ms_per_seq": 5.0}}
    return pdsim.run(d).measured


def test_an_idle_partner_adds_no_moe_work():
    """One request at a time on 2 DP ranks: in lockstep the other rank runs an idle batch, so
    the gathered MoE term sees half a sequence per rank on average."""
    alone = _one_at_a_time(False)
    together = _one_at_a_time(True)
    tpot = lambda m: ((m.t_done - m.t_first_token) / (m.generated - 1)).mean()  # noqa: E731
    assert tpot(alone) - tpot(together) == pytest.approx(2.5e-3, rel=0.02)


def test_lockstep_default_follows_dp_attention():
    sc = pdsim.load(small_fleet())
    assert sc.fleet.prefill.lockstep is None and sc.fleet.prefill.dp_attention


@pytest.mark.parametrize("lockstep,page_size,reserve", [(False, 16, 32), (True, 1, 0),
                                                        (True, 16, 0)])
def test_growth_bound_never_cuts_a_span_the_walk_would_not(monkeypatch, lockstep, page_size,
                                                            reserve):
    """span_steps skips walking the growth heap when the free pages cover every running
    request growing once per P - 1 - lag steps (DecodeRank._lag): under memory pressure
    (spans cut by growths, retractions) its answer is always the walk's, and it does skip."""
    seen = {"calls": 0, "bound": 0, "cut": 0}
    span_steps, walk = DecodeRank.span_steps, DecodeRank._growth_steps

    def counted_walk(self, end):
        seen["walked"] = True
        return walk(self, end)

    def both(self, limit):
        seen["walked"] = False
        fast = span_steps(self, limit)
        skipped = not seen["walked"]
        late, self._late = self._late, True  # (the walk whenever the bound is not enough)
        slow = span_steps(self, limit)
        self._late = late
        assert fast == slow
        seen["calls"] += 1
        seen["bound"] += skipped and seen["walked"]  # the bound spared a walk
        seen["cut"] += slow < limit
        return fast

    monkeypatch.setattr(DecodeRank, "_growth_steps", counted_walk)
    monkeypatch.setattr(DecodeRank, "span_steps", both)
    d = small_fleet()  # few long outputs on tight pools: spans of hundreds of steps
    d["fleet"]["decode"].update(lockstep=lockstep, page_size=page_size, kv_pool_tokens=4000,
                                retract_reserve_tokens=reserve)
    d["clients"][0].update(num_prompts=40, max_concurrency=16,
                           dataset={"kind": "random", "input_len": 1024, "output_len": 1024})
    res = pdsim.run(d)
    assert res.summary["retractions"] > 0
    assert seen["bound"] > 0 and seen["cut"] > 0

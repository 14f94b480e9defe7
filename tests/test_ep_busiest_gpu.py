"""Expert parallelism at small batch: the MoE layer waits for the GPU whose experts the batch
touches most (the all-reduce, or DeepEP's combine, joins the GPUs), not for the mean GPU.
With balanced routing each of a GPU's E/ep experts is touched with probability q, so a GPU's
count is binomial; pdsim takes the busiest of ep as mean + z_ep sd (pdsim.model.predictor
OperatorPredictor.moe)."""

from __future__ import annotations

import math
import random

import pytest

from pdsim.model import profiles
from pdsim.model.predictor import Layout, OperatorPredictor

ENGINE = profiles.engine()
MODEL = profiles.model("qwen3.5-397b-a17b-fp8")  # 512 experts, top-10


def _op(**layout) -> OperatorPredictor:
    return OperatorPredictor(profiles.gpu("H200"), MODEL, ENGINE, Layout(**layout))


def _gemm_rate_op(**layout) -> OperatorPredictor:
    """H200 with its routed FP8 experts at ``gemm_eff`` (``moe_fp8_block_eff`` unset, as on a
    GPU without a Triton fused-MoE measurement): the experts' compute well under their weights'
    read at 200-300 tokens, so the test below sees the memory-bound cap, not the kernel's rate
    (test_triton_moe.py covers that)."""
    gpu = profiles.gpu("H200").model_copy(update={"moe_fp8_block_eff": None})
    return OperatorPredictor(gpu, MODEL, ENGINE, Layout(**layout))


def _busiest_by_sampling(tokens: int, ep: int, trials: int = 4000) -> float:
    """The mean over random balanced routings of the largest per-GPU count of distinct
    experts touched (experts split in contiguous blocks of E/ep, as SGLang places them)."""
    rng = random.Random(7)
    e, k, local = MODEL.experts, MODEL.experts_per_token, MODEL.experts // ep
    total = 0
    for _ in range(trials):
        hit = set()
        for _ in range(tokens):
            hit.update(rng.sample(range(e), k))
        per_gpu = [0] * ep
        for x in hit:
            per_gpu[x // local] += 1
        total += max(per_gpu)
    return total / trials


@pytest.mark.parametrize("tokens", [4, 16, 64])
def test_the_busiest_gpus_experts_match_random_routing(tokens):
    op = _op(tp=8, ep=8)
    memory_per_expert = op.expert_w * op.ewb / op.bw
    busiest = op.moe(tokens) / memory_per_expert  # memory-bound at these batches
    assert busiest == pytest.approx(_busiest_by_sampling(tokens, 8), rel=0.08)
    mean = op.local_experts * op.experts_touched(tokens) / MODEL.experts
    assert busiest > mean * (1.5 if tokens == 4 else 1.05)


def test_tp_moe_has_no_busiest_gpu_and_a_saturated_ep_reads_every_expert():
    tp = _op(tp=8)
    assert tp.moe(4) * 8 == pytest.approx(  # TP: 1/8 of every touched expert, every GPU
        tp.experts_touched(4) * tp.expert_w * tp.ewb / tp.bw * 8, rel=1e-9)
    ep = _op(tp=8, ep=8)
    assert ep.moe(100_000) >= 64 * ep.expert_w * ep.ewb / ep.bw * (1 - 1e-9)
    assert not math.isnan(ep.moe(1))


@pytest.mark.parametrize("tokens", [200, 300])
def test_a_memory_bound_saturated_ep_reads_exactly_its_gpus_experts(tokens):
    """200-300 tokens at EP 8 touch ~98-99.7% of the experts: mean + z_ep sd of a GPU's count
    passes its L = 64 experts, but a GPU cannot read more experts than it holds, and the layer,
    still memory-bound, reads exactly L experts' weights (the ``min(L, ...)`` of moe)."""
    op = _gemm_rate_op(tp=8, ep=8)
    local = op.local_experts
    assert local == MODEL.experts // 8 == 64
    q = op.experts_touched(tokens) / MODEL.experts
    busiest_uncapped = local * q + op._ep_z * math.sqrt(local * q * (1 - q))
    assert busiest_uncapped > local + 0.3  # the cap binds here
    memory = local * op.expert_w * op.ewb / op.bw
    compute = op._two_expert_w * (tokens * MODEL.experts_per_token / 8 * op.layout.imbalance
                                 + op.half * local) \
        / op.pk_e
    assert compute < 0.5 * memory  # memory-bound: moe() is the weights read
    assert op.moe(tokens) == pytest.approx(memory, rel=1e-12)

"""Chains of small kernels (engine.small_kernel_us x pdsim.model.architectures.CHAIN_KERNELS):
a MoE layer's routing (router GEMM, top-k, FP8 activation quant, align/sort), a DSA layer's
indexer (norm, RoPE, Hadamard, quant, key store, logits, top-k) and a Gated DeltaNet layer's
recurrence (split, conv update, gating, recurrent update, gated norm) run, at small batch, as
kernels of a few microseconds each that no byte or FLOP of the step accounts for
(vllm-project/vllm issue #28084: 12 routing kernels, 33.4 us, H200 at concurrency 4)."""

from __future__ import annotations

import pytest

from pdsim.model import profiles
from pdsim.model.architectures import CHAIN_KERNELS
from pdsim.model.predictor import Layout, OperatorPredictor

ENGINE = profiles.engine()
OFF = ENGINE.model_copy(update={"small_kernel_us": 0.0})


def _op(model: str, engine=ENGINE, **layout) -> OperatorPredictor:
    return OperatorPredictor(profiles.gpu("H200"), profiles.model(model), engine,
                             Layout(**(layout or {"tp": 8})))


def test_the_shipped_engine_and_the_counts():
    assert ENGINE.small_kernel_us == 2.78  # 33.4 us / 12 kernels
    assert CHAIN_KERNELS == {"moe": 12, "moe_deepep": 5, "dsa": 14, "gdn": 5}


# (model, its kernels per forward): DeepSeek-R1 58 MoE layers; GLM-5 75 MoE + 78 DSA layers;
# Qwen3.5 60 MoE + 45 Gated DeltaNet layers
CASES = [("deepseek-r1", 58 * 12), ("glm-5-fp8", 75 * 12 + 78 * 14),
         ("qwen3.5-397b-a17b-fp8", 60 * 12 + 45 * 5)]


@pytest.mark.parametrize("model, kernels", CASES)
def test_each_chain_adds_its_kernels_to_every_forward(model, kernels):
    op, off = _op(model), _op(model, OFF)
    chain = kernels * 2.78e-6
    for batch in (1, 4, 64):
        assert op.decode(batch, batch * 2000) - off.decode(batch, batch * 2000) == \
            pytest.approx(chain, rel=1e-9)
    n = 1024
    assert op.prefill(n, n * n, n * (n + 1) / 2, 1, 0, n) - \
        off.prefill(n, n * n, n * (n + 1) / 2, 1, 0, n) == pytest.approx(chain, rel=1e-9)
    # above the CUDA-graph cap (eager decode) the chains run too
    eager, eager_off = _op(model, tp=8, graph_bs=2), _op(model, OFF, tp=8, graph_bs=2)
    assert eager.decode(4, 8000) - eager_off.decode(4, 8000) == pytest.approx(chain, rel=1e-9)


def test_a_dense_full_attention_model_has_no_chain():
    op, off = _op("qwen3-32b"), _op("qwen3-32b", OFF)
    assert op.decode(4, 4000) == off.decode(4, 4000)
    assert op.prefill(512, 512 * 512) == off.prefill(512, 512 * 512)


def test_under_deepep_the_dispatch_replaces_the_align_and_sort():
    """DeepEP's dispatch (priced by gpu.a2a_us) and DeepGEMM's masked layout take the quant,
    align/sort and glue; the router GEMM, its reduce, the scores and top-k remain."""
    lay = dict(tp=8, dp=8, dp_attention=True, ep=8, a2a="deepep")
    op, off = _op("deepseek-r1", **lay), _op("deepseek-r1", OFF, **lay)
    assert op.decode(4, 8000, 1) - off.decode(4, 8000, 1) == pytest.approx(
        58 * 5 * 2.78e-6, rel=1e-9)

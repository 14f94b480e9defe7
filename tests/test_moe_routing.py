"""A MoE layer's routing chain (engine.moe_layer_us): the router GEMM, top-k, FP8 activation
quant and the experts' align/sort run between a MoE layer's all-reduce and its first expert
GEMM; at small batch each is a few-microsecond kernel that no byte or FLOP of the step
accounts for (vllm-project/vllm issue #28084: 33.4 us of kernels at concurrency 4 on H200)."""

from __future__ import annotations

import pytest

from pdsim.model import profiles
from pdsim.model.predictor import Layout, OperatorPredictor

ENGINE = profiles.engine()


def _op(model: str, engine=ENGINE, **layout) -> OperatorPredictor:
    return OperatorPredictor(profiles.gpu("H200"), profiles.model(model), engine,
                             Layout(**(layout or {"tp": 8})))


def test_the_shipped_engine_prices_the_routing_chain():
    assert ENGINE.moe_layer_us == 33


@pytest.mark.parametrize("model, moe_layers", [("deepseek-r1", 58), ("glm-5-fp8", 75),
                                               ("qwen3.5-397b-a17b-fp8", 60)])
def test_each_moe_layer_adds_its_routing_chain_to_every_forward(model, moe_layers):
    op = _op(model)
    off = _op(model, ENGINE.model_copy(update={"moe_layer_us": 0.0}))
    chain = moe_layers * 33e-6
    for batch in (1, 4, 64):
        assert op.decode(batch, batch * 2000) - off.decode(batch, batch * 2000) == \
            pytest.approx(chain, rel=1e-9)
    n = 1024
    assert op.prefill(n, n * n, n * (n + 1) / 2, 1, 0, n) - \
        off.prefill(n, n * n, n * (n + 1) / 2, 1, 0, n) == pytest.approx(chain, rel=1e-9)
    # above the CUDA-graph cap (eager decode) the chain runs too
    eager, eager_off = _op(model, tp=8, graph_bs=2), _op(
        model, ENGINE.model_copy(update={"moe_layer_us": 0.0}), tp=8, graph_bs=2)
    assert eager.decode(4, 8000) - eager_off.decode(4, 8000) == pytest.approx(chain, rel=1e-9)


def test_a_dense_model_has_no_routing_chain():
    op = _op("qwen3-32b")
    off = _op("qwen3-32b", ENGINE.model_copy(update={"moe_layer_us": 0.0}))
    assert op.decode(4, 4000) == off.decode(4, 4000)
    assert op.prefill(512, 512 * 512) == off.prefill(512, 512 * 512)


def test_each_dsa_layer_adds_its_indexer_chain():
    """GLM-5: 78 DSA layers, each running the indexer's ~16-kernel chain (nsa_indexer.py
    forward_cuda) every forward; DeepSeek-R1 (no DSA) has none."""
    assert ENGINE.dsa_indexer_us == 45
    no = ENGINE.model_copy(update={"dsa_indexer_us": 0.0})
    op, off = _op("glm-5-fp8"), _op("glm-5-fp8", no)
    assert op.decode(4, 8000) - off.decode(4, 8000) == pytest.approx(78 * 45e-6, rel=1e-9)
    assert op.prefill(1024, 1024**2) - off.prefill(1024, 1024**2) == pytest.approx(
        78 * 45e-6, rel=1e-9)
    assert _op("deepseek-r1").decode(4, 8000) == _op("deepseek-r1", no).decode(4, 8000)

"""Each FP8 (W8A8) dense linear quantizes its activations in a kernel of its own before the GEMM
(SGLang v0.5.9 layers/quantization/fp8_utils.py: deepgemm_w8a8_block_fp8_linear_with_fallback
runs sglang_per_token_group_quant_fp8, its Triton fallback per_token_group_quant_fp8,
apply_fp8_linear sglang_per_token_quant_fp8): one more small kernel per linear per forward
(pdsim.model.architectures.FP8_LINEARS), at engine.small_kernel_us, in decode steps and
prefill forwards alike. BF16 weights have none.
"""

from __future__ import annotations

import pytest

from pdsim.model import architectures, profiles
from pdsim.model.predictor import Layout, OperatorPredictor

ENGINE = profiles.engine()


def test_the_linears_counted_per_architecture():
    q35 = profiles.model("qwen3.5-397b-a17b-fp8")
    # 15 gated-attention layers (qkv, o), 45 GDN layers (in_proj_qkv, _z, out_proj: _b, _a
    # stay BF16), 60 shared experts (gate_up, down)
    assert architectures.fp8_linears(q35) == 15 * 2 + 45 * 3 + 60 * 2
    q3 = profiles.model("qwen3-235b-a22b-fp8")  # GQA, no shared experts
    assert architectures.fp8_linears(q3) == 94 * 2
    r1 = profiles.model("deepseek-r1")  # MLA (4 in prefill); 3 dense MLP layers, 58 shared
    assert architectures.fp8_linears(r1) == 61 * 4 + 61 * 2
    assert architectures.fp8_linears(profiles.model("qwen3.5-397b-a17b")) == 0  # BF16
    assert architectures.fp8_linears(
        profiles.model("qwen3.5-397b-a17b").model_copy(update={"weight_dtype": "fp8"})) == 285


def test_a_decode_step_pays_one_quant_kernel_per_fp8_linear(monkeypatch):
    h200 = profiles.gpu("H200")
    q35 = profiles.model("qwen3.5-397b-a17b-fp8")
    with_quant = OperatorPredictor(h200, q35, ENGINE, Layout(tp=8, ep=8, graph_bs=64))
    monkeypatch.setattr(architectures, "fp8_linears", lambda model: 0)
    without = OperatorPredictor(h200, q35, ENGINE, Layout(tp=8, ep=8, graph_bs=64))
    extra = 285 * ENGINE.small_kernel_us * 1e-6
    assert with_quant.decode(4, 4 * 2000) - without.decode(4, 4 * 2000) == \
        pytest.approx(extra, rel=1e-9)
    assert with_quant.prefill(1024, 1024 * 1024) - without.prefill(1024, 1024 * 1024) == \
        pytest.approx(extra, rel=1e-9)
    # ~0.8 ms of a ~8 ms step at concurrency 4: more than a twentieth of it
    assert extra > 0.05 * without.decode(4, 4 * 2000)

"""SGLang fuses DeepSeek-V3/R1's and GLM-5's shared expert into the routed fused-MoE kernel as
a 257th expert (top-k 8 + 1) at EP 1 without DeepEP (``determine_num_fused_shared_experts``,
models/deepseek_v2.py@0.5.9 l.2853, @0.5.6.post2 l.3272; GLM-5 through PR #18804): where
block-FP8 experts run at the Triton kernel's rate (Hopper), so does the shared expert
(pdsim.model.formats.fused_shared_experts, OperatorPredictor.moe).

At decode (a few tokens per expert) the MoE layer reads weights: the fused shared expert's
bytes are the same as the separate GEMM's, so a small-batch decode step does not change; at
batches where the layer computes, the shared expert's rows add FLOPs at the slower rate.
"""

from __future__ import annotations

import pytest

from pdsim.model import formats, profiles
from pdsim.model.predictor import Layout, OperatorPredictor

ENGINE = profiles.engine()
R1 = profiles.model("deepseek-r1")  # DeepseekV3ForCausalLM, 256 routed + 1 shared, block FP8
GLM5 = profiles.model("glm-5-fp8")  # GlmMoeDsaForCausalLM, 256 routed + 1 shared
# the corpus's rows: dense weights "fp8" (per-tensor in pdsim), experts fp8_block
R1_CORPUS = R1.model_copy(update={"weight_dtype": "fp8", "expert_dtype": "fp8_block"})
# the same shapes under a class that does not fuse (DeepSeek-V3.2's passes no name of its own)
R1_UNFUSED = R1.model_copy(update={"architecture": "DeepseekV32ForCausalLM"})


def _op(model, gpu: str = "H200", **layout) -> OperatorPredictor:
    return OperatorPredictor(profiles.gpu(gpu), model, ENGINE, Layout(**{"tp": 8, **layout}))


@pytest.mark.parametrize("model", [R1, GLM5, R1_CORPUS])
@pytest.mark.parametrize("gpu", ["H100", "H200"])
def test_sglangs_fusing_models_at_ep1_fuse_on_hopper(model, gpu):
    assert formats.fused_shared_experts(profiles.gpu(gpu), model, 1, False) == 1
    assert _op(model, gpu)._fused == 1


@pytest.mark.parametrize("model, gpu, layout", [
    (R1, "H200", {"ep": 8}),  # moe_ep_size > 1 on NVIDIA
    (R1, "H200", {"ep": 8, "a2a": "deepep"}),  # DeepEP
    (R1_UNFUSED, "H200", {}),  # another class (V3.2, V2 keep the default name)
    (profiles.model("qwen3.5-397b-a17b-fp8"), "H200", {}),  # a separate Qwen2MoeMLP
    (profiles.model("qwen3-235b-a22b-fp8"), "H200", {}),  # no shared expert
    (profiles.model("deepseek-v2-lite"), "H200", {"tp": 1}),  # 64 experts, 2 shared, BF16
    (R1, "H20", {}),  # no Triton rate measured: experts at gemm_eff, shared kept a GEMM
    (R1, "B200", {}),  # Blackwell: flashinfer_trtllm by default, which disables fusion
    (profiles.model("glm-5"), "H200", {}),  # BF16: experts at gemm_eff
])
def test_other_models_and_layouts_keep_a_separate_shared_expert(model, gpu, layout):
    op = _op(model, gpu, **layout)
    assert op._fused == 0
    parts = op._layer_parts(4096, 4096, False)
    tokens = 4096 / op._scatter if op.deepep else 4096  # (DeepEP: on a GPU's own tokens)
    assert parts[3] == op._gemm(tokens, op._w_shared)  # the shared expert as its own GEMM
    assert parts[3] > 0 or model.shared_experts == 0


@pytest.mark.parametrize("model", [R1, R1_CORPUS, GLM5])
def test_prefill_prices_the_shared_expert_at_the_experts_rate(model):
    """At 4,096 tokens the MoE layer computes: the fused layer is the unfused routed experts
    plus the shared expert's FLOPs (every token, plus the efficiency curve's half-tokens) at
    the Triton rate, and no separate shared GEMM."""
    op = _op(model)
    ref = _op(model.model_copy(update={"architecture": "DeepseekV32ForCausalLM"}))
    t = 4096.0
    shared_at_triton = 2 * op.expert_w * (t + op.half) / op.pk_e
    assert op.moe(t) == pytest.approx(ref.moe(t) + shared_at_triton, rel=1e-12)
    assert op._layer_parts(t, t, False)[3] == 0.0
    separate = ref._gemm(t, ref._w_shared)
    # the shared expert's GEMMs: gemm_eff / moe_fp8_block_eff slower than as a dense GEMM
    g = profiles.gpu("H200")
    assert shared_at_triton / separate == pytest.approx(g.gemm_eff / g.moe_fp8_block_eff,
                                                        rel=1e-9)
    # and a whole 4k-token prefill forward is slower by (almost) that difference per layer
    grow = op.prefill(t, t * 1024) - ref.prefill(t, t * 1024)
    assert grow == pytest.approx(model.moe_layers * (shared_at_triton - separate), rel=0.02)


def test_decode_is_unchanged_while_the_moe_layer_reads_weights():
    """Small decode batches read the touched experts' and the shared expert's weights: the
    same bytes fused or not (block-FP8 scales aside), so the step moves by < 0.1%; at a batch
    where the layer computes, the shared rows at the Triton rate make it slower."""
    for model in (R1, R1_CORPUS):
        op = _op(model)
        ref = _op(model.model_copy(update={"architecture": "DeepseekV2ForCausalLM"}))
        for batch in (1, 8, 64):
            ctx = batch * 2000
            assert op.decode(batch, ctx) == pytest.approx(ref.decode(batch, ctx), rel=1e-3)
        assert op.decode(512, 512 * 2000) > ref.decode(512, 512 * 2000) * 1.001

"""A Gated DeltaNet layer's prefill recurrence runs at the rate SGLang's kernels reach: v0.5.9
prefills it through fla's Triton chunk_gated_delta_rule (hybrid_linear_attn_backend.py,
GDNAttnBackend.forward_extend), measured at ~3% of the BF16 peak on Hopper for a TP-8 shard of
Qwen3.5-397B (GPU.gdn_prefill_eff, gpus.yaml [gdn]: flashinfer-ai/flashinfer PR #3866), not
at FlashAttention's attn_eff. Without it the 45 GDN layers of an 8k-token prefill cost ~17x
less than the published kernel time.
"""

from __future__ import annotations

import pytest

from pdsim.model import architectures, profiles
from pdsim.model.predictor import Layout, OperatorPredictor

ENGINE = profiles.engine()
QWEN35 = profiles.model("qwen3.5-397b-a17b-fp8")


def _gdn(gpu) -> architectures.Kind:
    op = OperatorPredictor(gpu, QWEN35, ENGINE, Layout(tp=8, ep=8))
    (kind,) = [k for k in op.hybrid.kinds if k.token_s]
    return kind


def test_hopper_gdn_prefill_runs_at_the_measured_fla_rate():
    h200 = profiles.gpu("H200")
    assert h200.gdn_prefill_eff is not None and h200.gdn_prefill_eff < 0.1 * h200.attn_eff
    kind = _gdn(h200)
    # one layer's recurrence over one 8,192-token prompt at TP 8 (8 value heads of 128):
    # flashinfer PR #3866 measured fla's kernel at 0.259 ms on an H100 (same SMs and clocks)
    assert 8192 * kind.token_s == pytest.approx(0.259e-3, rel=0.1)
    without = _gdn(h200.model_copy(update={"gdn_prefill_eff": None}))
    assert kind.token_s == pytest.approx(
        without.token_s * h200.attn_eff / h200.gdn_prefill_eff, rel=1e-9)


def test_an_8k_prefill_pays_the_gdn_kernels_time():
    h200 = profiles.gpu("H200")
    op = OperatorPredictor(h200, QWEN35, ENGINE, Layout(tp=8, ep=8))
    without = OperatorPredictor(h200.model_copy(update={"gdn_prefill_eff": None}), QWEN35,
                                ENGINE, Layout(tp=8, ep=8))
    t, pairs = 8192, 8192 * 8192 / 2
    extra = op.prefill(t, t * t, pairs) - without.prefill(t, t * t, pairs)
    # 45 GDN layers x (0.259 ms - the ~0.015 ms attn_eff gave): ~11 ms more
    assert extra == pytest.approx(45 * (0.259e-3 - 8192 * _gdn(
        h200.model_copy(update={"gdn_prefill_eff": None})).token_s), rel=0.12)


@pytest.mark.parametrize("gpu", ["H20", "B200"])
def test_other_dies_keep_attn_eff(gpu):
    g = profiles.gpu(gpu)
    assert g.gdn_prefill_eff is None
    heads = QWEN35.linear_value_heads / 8
    dk, dv = QWEN35.linear_key_head_dim, QWEN35.linear_value_head_dim
    flops = heads * (6 * dk * dv + 2 * architectures.GDN_CHUNK * (dk + dv))
    assert _gdn(g).token_s == pytest.approx(flops / (g.bf16_tflops * 1e12 * g.attn_eff))


def test_a_prefill_forward_pays_each_gdn_layers_eager_launches_and_decode_does_not():
    """SGLang v0.5.9 runs prefill eagerly (--enable-piecewise-cuda-graph is off by default,
    server_args.py); a GDN layer's linear-attention block launches its causal conv1d, gating
    and fla's chunked kernels from Python: sgl-project/sglang PR #13081 measured a ~67 ms
    token-independent TTFT floor on Qwen3-Next with everything but those blocks graphed
    (engines.yaml [gdnpcg], 0.75-1.0 ms per layer)."""
    assert 750 <= ENGINE.gdn_prefill_layer_us <= 1000
    h200 = profiles.gpu("H200")
    op = OperatorPredictor(h200, QWEN35, ENGINE, Layout(tp=8, ep=8, graph_bs=64))
    bare = OperatorPredictor(h200, QWEN35, ENGINE.model_copy(update={"gdn_prefill_layer_us": 0}),
                             Layout(tp=8, ep=8, graph_bs=64))
    for tokens in (1024, 8192):
        extra = op.prefill(tokens, tokens * tokens) - bare.prefill(tokens, tokens * tokens)
        assert extra == pytest.approx(45 * ENGINE.gdn_prefill_layer_us * 1e-6, rel=1e-9)
        assert extra > 0.03  # 45 layers: ~39 ms, about the 1k-token forward's GPU work
    assert op.decode(16, 16 * 2000) == bare.decode(16, 16 * 2000)  # decode: a CUDA graph
    # a model without GDN layers pays none of it
    dense = profiles.model("qwen3-235b-a22b-fp8")
    a = OperatorPredictor(h200, dense, ENGINE, Layout(tp=8))
    b = OperatorPredictor(h200, dense, ENGINE.model_copy(update={"gdn_prefill_layer_us": 0}),
                          Layout(tp=8))
    assert a.prefill(1024, 1024 * 1024) == b.prefill(1024, 1024 * 1024)


def test_the_eager_gdn_cost_reproduces_the_qwen3_next_floor_it_was_derived_from():
    """sgl-project/sglang PR #13081: Qwen3-Next-80B-A3B at TP 2 on H200, 1,024-token prompt,
    piecewise CUDA graphs over everything but the 36 GDN blocks: mean TTFT 67.8 ms, request
    path included. pdsim's prefill with only the GDN blocks eager must land a few ms under it
    (the value was derived from this figure: a consistency check of the derivation, which a
    review found had left the GPU work in at 1,400 us)."""
    q35 = profiles.model("qwen3.5-397b-a17b")
    qnext = q35.model_copy(update=dict(
        layers=48, hidden_size=2048, heads=16, kv_heads=2, head_dim=256, experts=512,
        experts_per_token=10, moe_intermediate_size=512, shared_expert_intermediate_size=512,
        linear_attention_layers=36, linear_key_heads=16, linear_value_heads=32,
        vocab_size=151936, params_total_b=80, vision_layers=0))
    graphed = ENGINE.model_copy(update={"prefill_layer_us": 0, "small_kernel_us": 0})
    op = OperatorPredictor(profiles.gpu("H200"), qnext, graphed, Layout(tp=2))
    ms = op.prefill(1024, 1024 * 1024) * 1e3
    assert 67.8 - 12 < ms < 67.8

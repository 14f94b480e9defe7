"""Issue 29, models of today's layers (pdsim.model.architectures): linear attention (a fixed
state per request), sliding windows and sparse attention (KV and reads bounded), each with its
per-token cost; the shipped profiles' sizes against their configs' published figures."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdsim.model import profiles
from pdsim.model.predictor import Layout, OperatorPredictor

ENGINE = profiles.engine()


def _op(model: str, gpu: str = "H200", **layout) -> OperatorPredictor:
    return OperatorPredictor(profiles.gpu(gpu), profiles.model(model), ENGINE,
                             Layout(**(layout or {"tp": 8})))


def test_the_shipped_models_sizes_match_their_published_figures():
    """Fact sheet B8 (from each config): KV bytes per token, recurrent state, parameters."""
    m = profiles.model
    want = {"llama-3.1-8b": 131_072, "qwen3-32b": 262_144, "qwen3-235b-a22b": 192_512,
            "qwen3.5-397b-a17b": 30_720, "glm-5": 100_152, "gpt-oss-120b": 36_864,
            "deepseek-r1": 70_272, "deepseek-v3": 70_272}
    for name, kv in want.items():
        assert m(name).kv_bytes_per_token == kv, name
    q35 = m("qwen3.5-397b-a17b")
    assert q35.state_bytes_per_request() == 192_061_440  # fp32 SSM state (SGLang default)
    assert q35.model_copy(update={"mamba_ssm_dtype": "bf16"}).state_bytes_per_request() \
        == 97_689_600
    assert q35.state_bytes_per_request(8) == pytest.approx(192_061_440 / 8, rel=1e-9)
    assert q35.params_total / 1e9 == pytest.approx(396.3, abs=0.1)  # "397B"
    assert q35.params_active / 1e9 == pytest.approx(17.2, abs=0.2)  # "A17B"
    assert m("glm-5").params_total / 1e9 == pytest.approx(744, abs=1)
    assert m("gpt-oss-120b").params_total / 1e9 == pytest.approx(117, abs=0.5)
    assert m("gpt-oss-120b").window_kv_bytes == 18 * 128 * 2048
    assert m("deepseek-r1").params_total / 1e9 == pytest.approx(671, abs=0.5)
    assert m("qwen3-235b-a22b-fp8").params_total / 1e9 == pytest.approx(235, abs=0.5)
    assert m("qwen3-32b").params_total / 1e9 == pytest.approx(32.8, abs=0.1)


def test_linear_attention_layers_hold_no_kv_and_cost_a_state_per_sequence():
    """Qwen3.5: decode's context term comes from its 15 full-attention layers only; the 45
    Gated DeltaNet layers read and write a fixed state per sequence, whatever its length."""
    op = _op("qwen3.5-397b-a17b-fp8")
    full = op.per_ctx  # one full-attention layer's seconds per context token
    d1, d2 = op.decode(32, 32 * 1000), op.decode(32, 32 * 65_000)
    assert d2 - d1 == pytest.approx(15 * full * 32 * 64_000, rel=1e-9)
    state = profiles.model("qwen3.5-397b-a17b-fp8").state_bytes_per_request(8) / 45
    per_seq = 45 * 2 * state / op.bw  # read and written once per step
    assert op.decode(64, 0) - op.decode(32, 0) > 32 * per_seq * 0.999
    # a dense-attention twin (every layer full attention) grows four times faster
    twin = OperatorPredictor(op.gpu, op.model.model_copy(update={
        "linear_attention_layers": 0}), ENGINE, Layout(tp=8))
    assert twin.decode(32, 32 * 65_000) - twin.decode(32, 32 * 1000) == pytest.approx(
        60 / 15 * (d2 - d1), rel=1e-9)


def test_a_sliding_window_bounds_what_its_layers_read():
    """gpt-oss: 18 of its 36 layers read at most the last 128 tokens of each sequence."""
    op = _op("gpt-oss-120b", "B200", tp=1)
    per = op.per_ctx
    long_ = op.decode(8, 8 * 64_000) - op.decode(8, 8 * 32_000)
    assert long_ == pytest.approx(18 * per * 8 * 32_000, rel=1e-9)  # full layers only
    short = op.decode(8, 8 * 100) - op.decode(8, 8 * 50)
    assert short == pytest.approx(36 * per * 8 * 50, rel=1e-9)  # inside the window: all
    n = 16_384  # prefill: a sliding layer's pairs are at most tokens x window
    pairs = n * (n + 1) / 2
    t = op.hybrid.prefill_core(n, pairs, 1)
    assert t == pytest.approx((18 * pairs + 18 * n * 128) * op.pf_pair_flops / op.pk_attn
                              / 36, rel=1e-9)


def test_sparse_attention_reads_top_k_latents_and_scores_every_token():
    """GLM-5 (DSA): past 2,048 tokens a query's MLA attention reads 2,048 latents; the
    indexer still scores every earlier token (FP8, 32 heads of 128)."""
    op = _op("glm-5-fp8", tp=8)
    (dsa,) = op.hybrid.kinds
    assert dsa.ctx_cap == dsa.pair_cap == 2048
    grow = op.decode(16, 16 * 100_000) - op.decode(16, 16 * 50_000)
    assert grow == pytest.approx(78 * dsa.index_ctx_s * 16 * 50_000, rel=1e-9)
    dense = OperatorPredictor(op.gpu, op.model.model_copy(update={"index_topk": 0}), ENGINE,
                              Layout(tp=8))
    assert dense.decode(16, 16 * 100_000) > 2 * op.decode(16, 16 * 100_000)
    assert op.decode(16, 16 * 1000) > dense.decode(16, 16 * 1000)  # the indexer's cost


def test_a_long_dsa_prefill_runs_sparse_absorbed_mla_over_padded_heads():
    """SGLang (deepseek_v2.py handle_attention_nsa; nsa_backend.py _forward_flashmla_sparse):
    on Hopper with a BF16 KV cache a DSA prefill whose KV is at most index_topk runs dense MHA
    over the decompressed latent; a longer one runs absorbed MLA through FlashMLA's sparse
    kernel, 2 x (512 + 576) FLOPs per head per pair over the GPU's heads padded to 64 (GLM-5 at
    TP 8: 8 heads run as 64), at most index_topk keys per query. On Blackwell: 128 heads, and
    no MHA path."""
    op = _op("glm-5-fp8", tp=8)
    (dsa,) = op.hybrid.kinds
    mha = op.pf_pair_flops / op.pk_attn  # 2 x 8 x (192 + 64 + 256) FLOPs per pair

    def core(n: int, o: OperatorPredictor = op) -> float:
        pairs = n * (n + 1) / 2
        return o.hybrid.prefill_core(n, pairs, 1, n)

    n = 2048  # dense MHA over every pair; the indexer stores its keys, scores none
    pairs = n * (n + 1) / 2  # (nsa_indexer.py forward_cuda: skip_logits_computation)
    assert core(n) == pytest.approx(pairs * mha, rel=1e-9)
    n = 8192  # sparse absorbed MLA: 64 padded heads over at most 2,048 keys per query
    pairs = n * (n + 1) / 2
    sparse = 2 * 64 * (2 * 512 + 64) / op.pk_attn
    assert core(n) == pytest.approx(n * 2048 * sparse + pairs * dsa.index_pair_s, rel=1e-9)
    assert sparse > 8 * mha  # what the padding and the absorbed latent cost over MHA
    # the whole forward follows (its KV length is sq_tokens / attention tokens): 78 such layers
    assert op.prefill(n, n * n, pairs, 1, 0, n) > 78 * core(n)
    b200 = _op("glm-5-fp8", "B200", tp=8)
    (bdsa,) = b200.hybrid.kinds
    assert bdsa.dense_kv_max == 0  # no MHA path on Blackwell: sparse MLA, still no logits
    pairs = 1024 * 1025 / 2
    assert core(1024, b200) == pytest.approx(pairs * bdsa.sparse_pair_s, rel=1e-9)
    assert bdsa.sparse_pair_s * b200.pk_attn == pytest.approx(2 * 128 * (2 * 512 + 64))


def test_an_fp8_kv_pool_takes_the_sparse_dsa_prefill_where_bf16_runs_dense_mha():
    """SGLang's MHA path for a short DSA prefill is for a BF16 KV pool only (deepseek_v2.py
    handle_attention_nsa; pdsim.model.architectures.dense_prefill_kv_max): with
    ``--kv-cache-dtype fp8_e4m3`` a 1,024-token GLM-5 prefill on H200 runs FlashMLA's sparse
    kernel over its 64 padded heads (still no indexer logits: KV <= index_topk), where the
    BF16 pool runs dense MHA."""
    bf16 = _op("glm-5-fp8", tp=8)
    model = bf16.model.model_copy(update={"kv_dtype": "fp8"})
    fp8 = OperatorPredictor(bf16.gpu, model, ENGINE, Layout(tp=8))
    ((dense,), (sparse,)) = bf16.hybrid.kinds, fp8.hybrid.kinds
    assert (dense.dense_kv_max, sparse.dense_kv_max) == (2048, 0)
    n = 1024
    pairs = n * (n + 1) / 2
    mha = bf16.pf_pair_flops / bf16.pk_attn
    flash = 2 * 64 * (2 * 512 + 64) / fp8.pk_attn
    assert flash > 8 * mha
    for op, per_pair in ((bf16, mha), (fp8, flash)):  # the forward: 78 such layers
        attention = op.prefill(n, n * n, pairs, 1, 0, n) - op.prefill(n, n * n, 0, 1, 0, n)
        assert attention == pytest.approx(78 * pairs * per_pair, rel=1e-9)


def test_a_chunk_after_a_long_prefix_takes_its_kv_length_from_sq_tokens():
    """A 64-token chunk of a request with 1,500 tokens already prefilled: its KV is 1,564
    tokens (sq_tokens / attention tokens = n (n + prefix) / n), at most index_topk, so the
    indexer skips its logits and the chunk runs dense MHA over its 98,080 pairs. Its causal
    pairs alone would say 2 pairs / n = 3,065 > 2,048 (sparse MLA and the indexer's logits):
    only sq_tokens tells a long prefix from a long chunk (commit 9de3e15)."""
    op = _op("glm-5-fp8", tp=8)
    n, prefix = 64, 1500
    sq, pairs = n * (n + prefix), n * prefix + n * (n + 1) / 2
    assert sq / n <= 2048 < 2 * pairs / n
    mha = op.pf_pair_flops / op.pk_attn
    attention = op.prefill(n, sq, pairs, 1, prefix, n) - op.prefill(n, sq, 0, 1, prefix, n)
    assert attention == pytest.approx(78 * pairs * mha, rel=1e-9)


MODELS = ["qwen3.5-397b-a17b-fp8", "gpt-oss-120b", "glm-5-fp8"]


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(MODELS), st.sampled_from([dict(tp=8), dict(tp=8, tbo=True),
                                                 dict(tp=8, ep=8, graph_bs=16)]),
       st.integers(1, 300), st.integers(0, 200_000), st.integers(1, 64))
def test_a_hybrid_decode_series_is_decode_step_by_step_to_the_bit(model, layout, batch, ctx,
                                                                  grow):
    op = _op(model, **layout)
    series = op.decode_series(batch, batch, ctx, grow)
    for j in range(4):
        assert next(series) == op.decode(batch, ctx + grow * j, batch)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(MODELS), st.integers(1, 16_384), st.integers(1, 8_192),
       st.integers(0, 8192))
def test_hybrid_steps_never_get_faster_with_more_work(model, n, dn, prefix):
    op = _op(model)

    def pf(tokens: int) -> float:
        pairs = tokens * prefix + tokens * (tokens + 1) / 2
        return op.prefill(tokens, tokens * (tokens + prefix), pairs, 1, prefix, tokens)

    assert pf(n + dn) >= pf(n)
    assert op.decode(8, 8 * (n + dn)) >= op.decode(8, 8 * n)

"""The operator predictor: hand-computed costs, sharding, MoE, and monotonicity properties."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdsim.engine import lockstep
from pdsim.engine.prefill import PrefillRank
from pdsim.model import profiles
from pdsim.model.predictor import FittedPredictor, Layout, OperatorPredictor, RooflinePredictor

H100 = profiles.gpu("H100")
ENGINE = profiles.engine()


def _op(model: str, gpu=H100, **layout) -> OperatorPredictor:
    return OperatorPredictor(gpu, profiles.model(model), ENGINE, Layout(**layout))


def test_gemm_flops_and_bytes_of_a_llama_8b_layer():
    m = profiles.model("llama-3.1-8b")
    # q, o: 2 * 4096 * 32 * 128 = 33,554,432; k, v: 2 * 4096 * 8 * 128 = 8,388,608
    assert m.attn_params == (0, 41_943_040)
    assert m.dense_mlp_params == 3 * 4096 * 14336 == 176_160_768
    op = _op("llama-3.1-8b", tp=1)
    # one token reads the MLP's BF16 weights: 176,160,768 * 2 B / (3.35e12 * 0.8 B/s)
    assert op.gemm(1, m.dense_mlp_params) == pytest.approx(131.46e-6, rel=1e-4)
    # 8,192 tokens compute: 2 * 176,160,768 * (8192 + 32) FLOPs / (989e12 * 0.7 FLOP/s)
    assert op.gemm(8192, m.dense_mlp_params) == pytest.approx(4.1856e-3, rel=1e-4)
    # under TP8 each GPU holds an eighth of q/o and one of the 8 KV heads
    assert _op("llama-3.1-8b", tp=8).attn_w == pytest.approx(33_554_432 / 8 + 1_048_576)



def test_a_gemm_of_remembered_weight_terms_is_the_gemm():
    """OperatorPredictor._gemm of _weight's terms (made once per GEMM a forward runs) gives
    max(2 * params * (tokens + half) / peak, params * bytes / bandwidth) to the bit, and 0 for
    no tokens or no weights."""
    op = _op("deepseek-v3", tp=8)
    for params, wbytes, peak in ((op.attn_w, op.wb, op.pk_w), (op.lm_w, 2, op.pk_lm),
                                 (176_160_768, 1.0, 1e15)):
        w = op._weight(params, wbytes, peak)
        for tokens in (1, 3, 17.25, 2048, 65_536.5):
            compute = 2 * params * (tokens + op.half) / peak
            memory = params * wbytes / op.bw
            assert op._gemm(tokens, w) == max(compute, memory)
            assert op.gemm(tokens, params, wbytes, peak) == max(compute, memory)
        assert op._gemm(0, w) == op._gemm(-1.5, w) == 0.0
    assert op._weight(0, 2, 1e15) is None and op._gemm(8, None) == 0.0
    assert op._w_attn == op._weight(op.attn_w, op.wb, op.pk_w)

def test_gqa_kv_bytes_per_gpu_split_then_replicated():
    # Qwen3-235B: 4 KV heads of 128, BF16: 2 * 128 * 2 = 512 B per head per token per layer
    assert _op("qwen3-235b-a22b", tp=1).kv_layer_bytes == 4 * 512
    assert _op("qwen3-235b-a22b", tp=2).kv_layer_bytes == 2 * 512
    assert _op("qwen3-235b-a22b", tp=4).kv_layer_bytes == 512
    assert _op("qwen3-235b-a22b", tp=8).kv_layer_bytes == 512  # replicated, not 256
    m = profiles.model("qwen3-235b-a22b")
    assert m.kv_bytes_per_token_sent(8, False) == 2 * m.kv_bytes_per_token == 385_024
    assert m.kv_bytes_per_token_sent(4, False) == m.kv_bytes_per_token


def test_mla_under_tp_versus_dp_attention():
    tp = _op("deepseek-v3", tp=8)
    dpa = _op("deepseek-v3", tp=8, dp=8, dp_attention=True, gather=8)
    # the latent (512 + 64, BF16) is whole on every GPU either way
    assert tp.kv_layer_bytes == dpa.kv_layer_bytes == 1152
    # absorbed decode attention: 2 * heads * (2 * 512 + 64) FLOPs per context token per layer
    assert tp.dc_ctx_flops == 2 * 16 * 1088 == 34_816
    assert dpa.dc_ctx_flops == 2 * 128 * 1088 == 278_528
    # TP8 reads the KV at 1152 B / (3.35e12 * 0.8): memory-bound; DP attention computes all
    # 128 heads: 278,528 / (989e12 * 0.59) FLOP/s, compute-bound on H100
    assert tp.per_ctx == pytest.approx(1152 / 2.68e12)
    assert dpa.per_ctx == pytest.approx(278_528 / (989e12 * 0.59))
    # a server of 8 ranks, 64 requests of 1,000 tokens each: under TP every GPU reads all 512
    # requests' KV; under DP attention each reads its own 64 (the slowest rank's)
    t_tp = tp.per_ctx * 512_000
    t_dpa = dpa.per_ctx * 64_000
    assert t_dpa == pytest.approx(t_tp * 64 / 512 * dpa.per_ctx / tp.per_ctx)
    assert t_dpa < t_tp


def test_distinct_experts_touched():
    op = _op("deepseek-v3", tp=8)
    assert op.experts_touched(0) == 0
    assert op.experts_touched(1) == pytest.approx(8)
    assert op.experts_touched(2) == pytest.approx(256 * (1 - (248 / 256) ** 2))  # 15.75
    assert op.experts_touched(10_000) == pytest.approx(256)
    # a small decode batch reads few experts: 4 tokens read under a tenth of the weights
    # a large one does
    assert op.moe(4) < 0.2 * op.moe(4096)


def test_ep_splits_experts_and_sends_tokens():
    op = _op("deepseek-v3", tp=32, dp=32, dp_attention=True, ep=32, gather=32, a2a="deepep")
    assert op.local_experts == 8
    # decode (low-latency): 128 tokens x top-8 x 7168 x (1 + 2) B; the pairs to the 24 GPUs
    # of the three other nodes cross the NIC (400 Gb/s / 8 * 0.9), those to the 7 other GPUs
    # of the node ride NVLink at the same time; the NIC is the busier; plus two fixed
    # latencies -- DeepEP reports ~163 + ~318 us for all 31/32 over RDMA
    wire = 128 * 8 * 7168 * 3 * 24 / 32 / (50e9 * 0.9)
    assert op.all_to_all(128, True) == pytest.approx(2 * 10e-6 + wire)
    assert 350e-6 < op.all_to_all(128, True) < 550e-6
    imbalanced = _op("deepseek-v3", tp=32, dp=32, dp_attention=True, ep=32, gather=32,
                     imbalance=1.2, a2a="deepep")
    assert imbalanced.moe(131_072) == pytest.approx(1.2 * op.moe(131_072), rel=0.05)


def test_lockstep_operator_attention_at_slowest_rank_moe_at_mean():
    op = _op("dsv3-ci-test", gpu=profiles.gpu("H20"), tp=4, dp=4, dp_attention=True, gather=4)

    class _Rank(PrefillRank):
        def __init__(self):
            self.predictor = op

    ranks = [_Rank() for _ in range(4)]
    plans = [(4096, 4096**2, 4096 * 4097 / 2, 1, 0), (1024, 1024**2, 1024 * 1025 / 2, 1, 0),
             None, None]
    want = op.prefill(5120 / 4, 4096**2, 4096 * 4097 / 2, 1, 0, attn_tokens=4096)
    assert lockstep.step_time(ranks, plans) == pytest.approx(want)
    # the busy rank alone, with idle partners, costs less than four busy ranks
    assert want < op.prefill(4096, 4096**2, 4096 * 4097 / 2, 1, 0)


MODELS = ["llama-3.1-8b", "qwen3-235b-a22b", "deepseek-v3", "dsv3-ci-test",
          "qwen2.5-7b-gptq-int4"]
LAYOUTS = [dict(tp=1), dict(tp=8), dict(tp=4, dp=4, dp_attention=True, gather=4),
           dict(tp=16, dp=16, dp_attention=True, ep=16, gather=16, tbo=True, a2a="deepep",
                dense_tp1=True, dp_lm_head=True),
           dict(tp=8, dp=8, dp_attention=True, ep=8, gather=8, imbalance=1.3, a2a="deepep"),
           dict(tp=8, ep=8), dict(tp=8, ep=2, graph_bs=64)]


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(MODELS), st.sampled_from(LAYOUTS),
       st.sampled_from(["H100", "H20", "A100", "B200"]), st.integers(1, 16),
       st.integers(1, 8192), st.integers(1, 4096), st.integers(0, 8192))
def test_prefill_never_faster_with_more_tokens_or_context(model, layout, gpu, reqs, n, dn,
                                                          prefix):
    op = OperatorPredictor(profiles.gpu(gpu), profiles.model(model), ENGINE, Layout(**layout))

    def step(length: int, pre: int) -> float:
        tokens = reqs * length
        pairs = reqs * (length * pre + length * (length + 1) / 2)
        return op.prefill(tokens, reqs * length * (length + pre), pairs, reqs, reqs * pre)

    assert step(n + dn, prefix) >= step(n, prefix)
    assert step(n, prefix + dn) >= step(n, prefix)


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(MODELS), st.sampled_from(LAYOUTS),
       st.sampled_from(["H100", "H20", "A100", "B200"]), st.integers(1, 512),
       st.integers(1, 256), st.integers(1, 8192), st.integers(1, 8192))
def test_decode_never_faster_with_more_sequences_or_context(model, layout, gpu, batch, db,
                                                            ctx, dctx):
    op = OperatorPredictor(profiles.gpu(gpu), profiles.model(model), ENGINE, Layout(**layout))
    assert op.decode(batch + db, (batch + db) * ctx) >= op.decode(batch, batch * ctx)
    assert op.decode(batch, batch * (ctx + dctx)) >= op.decode(batch, batch * ctx)


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(MODELS), st.sampled_from(LAYOUTS), st.sampled_from(["H100", "H20"]),
       st.floats(1.0, 4.0), st.integers(1, 256), st.integers(1, 8192))
def test_more_hbm_bandwidth_is_never_slower(model, layout, gpu, factor, batch, length):
    g = profiles.gpu(gpu)
    fast = g.model_copy(update={"hbm_tbps": g.hbm_tbps * factor})
    slow_op = OperatorPredictor(g, profiles.model(model), ENGINE, Layout(**layout))
    fast_op = OperatorPredictor(fast, profiles.model(model), ENGINE, Layout(**layout))
    assert fast_op.decode(batch, batch * length) <= slow_op.decode(batch, batch * length)
    pairs = batch * length * (length + 1) / 2
    assert (fast_op.prefill(batch * length, batch * length**2, pairs, batch)
            <= slow_op.prefill(batch * length, batch * length**2, pairs, batch))


def test_decode_is_linear_in_context_and_cached_per_batch():
    op = _op("deepseek-v3", tp=8)
    a, b, c = (op.decode(32, ctx) for ctx in (0, 10_000, 20_000))
    assert c - b == pytest.approx(b - a)
    assert (32, 32) in op._decode_cache


def test_weight_dtype_changes_bytes_and_peak():
    bf16, fp8, int4 = (_op(m, tp=1) for m in ("llama-3.1-8b", "llama-3.1-8b-fp8",
                                                "qwen2.5-7b-gptq-int4"))
    assert (bf16.wb, fp8.wb, int4.wb) == (2.0, 1.0, 0.5)
    assert fp8.pk_w == pytest.approx(2 * bf16.pk_w, rel=1e-3)  # FP8 tensor cores
    assert int4.pk_w == bf16.pk_w  # W4A16 computes at the BF16 rate
    # memory-bound decode of one token: FP8 reads half the bytes
    assert fp8.gemm(1, 1e9) == pytest.approx(bf16.gemm(1, 1e9) / 2)


@pytest.mark.parametrize("model,layout", [("deepseek-v3", {"tp": 8}),
                                          ("deepseek-v3", {"tp": 8, "ep": 8, "tbo": True}),
                                          ("llama-3.1-8b", {"tp": 2})])
def test_remembered_layer_terms_give_the_same_floats(model, layout):
    """A layer's terms but the attention core are remembered per token counts: forwards of
    the same tokens with other contexts (another core) give exactly what a predictor that
    never saw those tokens gives."""
    warm = _op(model, **layout)
    warm.prefill(8192, 8192**2, 8192 * 8193 / 2, 1, 0)
    assert len(warm._layer_cache) == 1  # (two micro-batches: their half)
    for prefix in (0, 4096, 60_000):
        pairs = 8192 * prefix + 8192 * 8193 / 2
        cold = _op(model, **layout)
        assert (warm.prefill(8192, 8192 * (8192 + prefix), pairs, 2, prefix)
                == cold.prefill(8192, 8192 * (8192 + prefix), pairs, 2, prefix))


@pytest.mark.parametrize("pred", [
    FittedPredictor(19.934702624895458, 92.6, 6.47, 19.934702624895458, 0.6269356524350583,
                    0.03850697740828398),
    RooflinePredictor(H100, profiles.model("llama-3.1-8b"), tp=2),
    _op("deepseek-v3", tp=8, dp=8, dp_attention=True, gather=8),
    _op("deepseek-v3", tp=8, ep=8, tbo=True),
], ids=["fitted", "roofline", "operator", "operator-tbo"])
def test_a_decode_series_is_decode_step_by_step_to_the_bit(pred):
    """``decode_series(batch, attn, ctx, grow)`` (a decode span's steps, with its context
    counted as a float) yields exactly ``decode(batch, ctx + grow*j, attn)``, the int context
    a step plans, for every j, contexts near 2**40 included."""
    from itertools import islice

    for batch, attn, ctx, grow in ((37, 37, 40_111, 37), (12.625, 31, 123_457, 29),
                                   (1, 1, 2**40 + 3, 1)):
        got = list(islice(pred.decode_series(batch, attn, ctx, grow), 300))
        assert got == [pred.decode(batch, ctx + grow * j, attn) for j in range(300)]
        assert all(type(x) is float for x in got)


def test_tp_is_the_servers_gpus_with_dp_attention_and_each_ranks_without():
    """What the schema and the docs (writing-scenarios) say tp means: with dp_attention the
    server has tp GPUs and each of its dp ranks runs attention over tp/dp of them; without it
    each DP rank has tp GPUs of its own (SGLang's --dp N --tp M: N*M GPUs), so adding ranks
    changes no rank's layout."""
    from pdsim.config.fleet import DecodeConfig
    from pdsim.model.memory import pool_pages

    assert Layout(tp=8, dp=8, dp_attention=True).attn_tp == 1
    assert Layout(tp=8, dp=2, dp_attention=True).attn_tp == 4
    assert Layout(tp=8, dp=2).attn_tp == Layout(tp=8).attn_tp == 8
    model = profiles.model("llama-3.1-8b")
    one = pool_pages(DecodeConfig(tp=2), H100, model, ENGINE)
    assert pool_pages(DecodeConfig(tp=2, dp=4), H100, model, ENGINE) == one
    # DP attention at tp 2, dp 2: a rank's attention runs on one GPU, which holds all its KV
    # heads (not half, as over a rank's own two GPUs), so it fits fewer tokens
    assert pool_pages(DecodeConfig(tp=2, dp=2, dp_attention=True), H100, model, ENGINE) < one

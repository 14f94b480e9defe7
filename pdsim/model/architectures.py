"""Layer kinds of hybrid models: what one layer of each attention kind costs on one attention GPU,
for :class:`pdsim.model.predictor.OperatorPredictor`.

A model whose layers are all full attention (dense GQA/MHA or MLA) takes the predictor's own
attention terms. A hybrid model mixes kinds; each kind's per-layer cost is made here, and the
predictor uses their mean over the layers (exact for the sum of a forward's layers; with
two-batch overlap the overlap is taken on the mean layer):

- **full attention** (GQA or MLA): prefill FLOPs over the causal (query, key) pairs; decode
  reads every context token's KV (or, MLA on FLOP-poor parts, computes over it).
- **sliding window** (gpt-oss: every other layer, 128 tokens; attention sinks add a logit per
  head, no KV): a query attends to at most ``sliding_window`` keys, so a forward's pairs are
  at most ``tokens x window`` and a decode step reads at most ``window`` tokens per sequence.
- **sparse attention** (DSA: DeepSeek-V3.2, GLM-5): a lightning indexer scores every earlier
  token (``index_n_heads`` heads of ``index_head_dim``, FP8: DeepGEMM's fp8 MQA logits; taken
  as replicated on every attention GPU, its weights are ReplicatedLinear in SGLang's NSA
  indexer), then MLA attends to the ``index_topk`` best tokens only: pairs at most ``tokens x
  topk``, decode reads at most ``topk`` latents per sequence (plus every token's indexer key).
  A prefill runs one of two kernels (SGLang models/deepseek_v2.py ``handle_attention_nsa``,
  0.5.9 era): while its longest KV is at most ``index_topk`` on a Hopper die with a BF16 KV
  cache, MHA over the decompressed latent (``MHA_ONE_SHOT``, dense: top-k selects every
  token), the predictor's MHA pair cost; longer, absorbed MLA through FlashMLA's sparse kernel
  (nsa_backend.py ``_forward_flashmla_sparse``): each query head scores the 576-wide latent
  (``kv_lora_rank + qk_rope_head_dim``) and sums the 512-wide one, ``2 x (2 x kv_lora_rank +
  qk_rope_head_dim)`` FLOPs per head per pair, over the GPU's query heads **padded to a
  multiple of 64 on Hopper, 128 on Blackwell** ("FlashMLA sparse kernel requires num_heads to
  be a multiple of 64 (Hopper) or 128 (Blackwell)": GLM-5 at TP 8 runs 8 heads as 64). The
  forward's KV length is taken as ``sq_tokens`` over its attention tokens (the token-weighted
  mean of its chunks' KV lengths: exact for a one-request forward; SGLang decides on the
  longest). While that KV is at most
  ``index_topk`` the indexer only computes and stores its keys, no logits (nsa_indexer.py
  ``forward_cuda``: ``skip_logits_computation = max_kv_len <= index_topk``, then
  ``_forward_cuda_k_only``): top-k would select every token.
- **linear attention** (Gated DeltaNet, Qwen3-Next/3.5): no KV; a state of ``V x Dv x Dk`` per
  head group. Decode reads and writes the state once per sequence per step (memory-bound) and
  does ``6 x Dk x Dv`` FLOPs per value head per token (decay, delta update, output); prefill runs
  the chunked form (chunks of 64 tokens, fla's chunk_gated_delta_rule; SGLang FLA_CHUNK_SIZE 64):
  the same per-token FLOPs plus ``2 x 64 x (Dk + Dv)`` per head for the intra-chunk attention,
  and reads and writes each request's state once per forward. Those FLOPs run at the rate
  SGLang's kernels reach (``pk_gdn``: :attr:`GPU.gdn_prefill_eff` of the BF16 peak where
  measured, else ``attn_eff``): v0.5.9 prefills every GDN layer through fla's Triton
  ``chunk_gated_delta_rule`` (hybrid_linear_attn_backend.py ``GDNAttnBackend.forward_extend``),
  a chain of small kernels over 64-token chunks that a TP-8 shard (8 value heads) keeps at
  ~3% of the BF16 peak on Hopper (gpus.yaml [gdn]), not a FlashAttention-class 60%.

Decode is given the rank's total context and sequence count, not each sequence's length, so a
window or top-k cap is applied to the total: ``min(context, sequences x cap)``, exact once every
sequence is longer than the cap (a 128-token window: almost always) and an upper bound before.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdsim.config.profile_schema import Model

GDN_CHUNK = 64  # tokens per chunk of the chunked gated-delta-rule kernel (FLA_CHUNK_SIZE)

# Small kernels per layer that no byte or FLOP of pdsim's step prices, each at least
# engine.small_kernel_us at small batch (a latency-bound chain; SGLang's source, 0.5.9 era):
CHAIN_KERNELS = {
    # a MoE layer's routing, between its all-reduce and its first expert GEMM: router GEMM
    # (split-K and its reduce), top-k, group top-k, FP8 activation quant, moe_align_block_size,
    # count-and-sort, and the elementwise glue: the 12 kernels vllm-project/vllm #28084
    # measured on H200 (SGLang: MoEGate / dsv3_router_gemm, TopK biased_grouped_topk,
    # per_token_group_quant_fp8, moe_align_block_size; models/deepseek_v2.py, layers/moe)
    "moe": 12,
    # the same under DeepEP (--moe-a2a-backend deepep; deepseek_v2.py forward_deepep): the
    # norm, router GEMM and its split-K reduce, score/bias and grouped top-k remain; the
    # quant, align/sort and glue are DeepEP's dispatch and DeepGEMM's masked layout, which
    # the all-to-all's own fixed cost (gpu.a2a_us) prices
    "moe_deepep": 5,
    # a DSA layer's indexer beyond its GEMMs (layers/attention/nsa/nsa_indexer.py
    # forward_cuda, _get_q_k_bf16, _get_topk_paged), 14: k_norm, RoPE, two slice copies, two
    # Hadamard rotations, two act_quant, the index-key store, the head gate's scaling by the
    # q scale (_get_logits_head_gate, one compiled kernel), fp8_paged_mqa_logits,
    # topk_transform, and the two GEMMs' activation quant
    "dsa": 14,
    # a Gated DeltaNet layer beyond its GEMMs (models/qwen3_5.py Qwen3_5GatedDeltaNet.forward,
    # hybrid_linear_attn_backend): fused_qkvzba_split_reshape_cat, causal_conv1d_update,
    # fused_gdn_gating, fused_sigmoid_gating_delta_rule_update, RMSNormGated
    "gdn": 5,
}


def chain_kernels(model: Model, deepep: bool = False) -> int:
    """The :data:`CHAIN_KERNELS` of one forward of ``model`` (all its layers); ``deepep``:
    its MoE layers dispatch through DeepEP.

    Not counted: the activation-quant kernel SGLang v0.5.9 runs before each FP8 dense linear
    (layers/quantization/fp8_utils.py; 2 per GQA layer, 4 per MLA layer in prefill): priced
    in d2cf218 and removed in ce0aff1, it moved the bounded corpus fits to other corners (none
    then shipped), and its prefill cost scales with tokens, which a fixed per-kernel cost
    misprices."""
    n = model.moe_layers * CHAIN_KERNELS["moe_deepep" if deepep else "moe"] \
        if model.is_moe else 0
    if model.index_topk:
        n += model.full_attention_layers * CHAIN_KERNELS["dsa"]
    return n + model.linear_attention_layers * CHAIN_KERNELS["gdn"]


@dataclass(frozen=True)
class Kind:
    """One layer kind on one attention GPU (seconds are of one layer)."""

    name: str
    layers: int
    proj_params: float  # projection weights per GPU (GEMMs over the attention tokens)
    pair_s: float = 0.0  # prefill: seconds per causal (query, key) pair
    pair_cap: int = 0  # keys a query attends to at most (0: all)
    ctx_s: float = 0.0  # decode: seconds per context token attended to
    ctx_cap: int = 0  # context tokens per sequence attended to at most (0: all)
    index_pair_s: float = 0.0  # DSA indexer: seconds per pair (prefill, every pair)
    sparse_pair_s: float = 0.0  # DSA: seconds per pair of the absorbed sparse MLA prefill
    dense_kv_max: int = 0  # DSA: longest KV prefilled by dense MHA (0: never)
    index_ctx_s: float = 0.0  # DSA indexer: seconds per context token (decode, every token)
    token_s: float = 0.0  # linear attention: prefill seconds per token
    req_s: float = 0.0  # linear attention: prefill seconds per request (state in and out)
    seq_s: float = 0.0  # linear attention: decode seconds per sequence


def sparse_mla_heads(die: str, heads: float) -> int:
    """Query heads FlashMLA's sparse kernel runs for ``heads`` heads on one GPU: padded to a
    multiple of 64 on Hopper, 128 on Blackwell (SGLang nsa_backend.py
    ``_forward_flashmla_sparse``: ``required_padding = 128 if device_sm_major >= 10 else
    64``)."""
    pad = 128 if die.startswith("Blackwell") else 64
    return max(pad, -(-int(heads) // pad) * pad)


def dense_prefill_kv_max(die: str, model: Model) -> int:
    """The longest KV a DSA prefill runs as dense MHA (``MHA_ONE_SHOT``): ``index_topk`` on a
    Hopper die (SM90, FA3) with a BF16 KV cache, else 0 (SGLang deepseek_v2.py
    ``handle_attention_nsa``: the MHA path is for SM90 only, and for a BF16 pool only)."""
    return model.index_topk if die == "GH100" and model.kv_dtype != "fp8" else 0


def kinds(model: Model, attn_tp: int, *, full_proj: float, pair_flops: float, per_ctx: float,
          pk_attn: float, pk_dattn: float, pk_index: float, pk_index_decode: float,
          bw: float, die: str = "GH100", pk_gdn: float | None = None) -> list[Kind]:
    """The layer kinds of ``model`` with their counts (zero-count kinds left out).

    ``full_proj``, ``pair_flops`` and ``per_ctx`` are the predictor's terms of one full
    attention layer (GQA or MLA); the peaks are FLOP/s (``pk_index*``: the FP8 rate times the
    attention efficiencies; ``pk_gdn``: the Gated DeltaNet prefill's, default ``pk_attn``),
    ``bw`` the achieved HBM bytes/s and ``die`` the GPU's die (which DSA prefill kernel runs,
    and its head padding).
    """
    out = []
    full = model.full_attention_layers
    if model.index_topk:
        idx_pair = 2 * model.index_n_heads * model.index_head_dim
        idx_bytes = model.index_head_dim + model.index_head_dim // 128 * 4
        heads = sparse_mla_heads(die, model.heads / attn_tp)
        sparse = 2 * heads * (2 * model.kv_lora_rank + model.qk_rope_head_dim)
        out.append(Kind("sparse attention (DSA)", full, full_proj, pair_flops / pk_attn,
                        model.index_topk, per_ctx, model.index_topk,
                        index_pair_s=idx_pair / pk_index,
                        index_ctx_s=max(idx_pair / pk_index_decode, idx_bytes / bw),
                        sparse_pair_s=sparse / pk_attn,
                        dense_kv_max=dense_prefill_kv_max(die, model)))
    elif full:
        out.append(Kind("full attention", full, full_proj, pair_flops / pk_attn, 0, per_ctx))
    if model.sliding_window_layers:
        out.append(Kind("sliding window", model.sliding_window_layers, full_proj,
                        pair_flops / pk_attn, model.sliding_window, per_ctx,
                        model.sliding_window))
    if model.linear_attention_layers:
        heads = model.linear_value_heads / attn_tp
        dk, dv = model.linear_key_head_dim, model.linear_value_head_dim
        recurrent = heads * 6 * dk * dv
        chunked = recurrent + heads * 2 * GDN_CHUNK * (dk + dv)
        state = model.state_bytes_per_request(attn_tp) / model.linear_attention_layers
        out.append(Kind("linear attention (Gated DeltaNet)", model.linear_attention_layers,
                        model.linear_attn_params / attn_tp,
                        token_s=chunked / (pk_gdn or pk_attn),
                        req_s=2 * state / bw,
                        seq_s=max(recurrent / pk_dattn, 2 * state / bw)))
    return out


class Hybrid:
    """The mean per-layer attention terms of a hybrid model's kinds (module docstring)."""

    def __init__(self, kinds_: list[Kind], layers: int) -> None:
        self.kinds = kinds_
        self.layers = float(layers)

    def prefill_core(self, tokens: float, pairs: float, reqs: float,
                     kv_len: float = 0.0) -> float:
        """Attention (and recurrence) seconds of a mean layer of a prefill forward, but the
        projection GEMMs. ``kv_len``: the forward's KV length per request (DSA: which kernel
        runs, module docstring)."""
        total = 0.0
        for k in self.kinds:
            if k.token_s or k.req_s:
                total += k.layers * (tokens * k.token_s + reqs * k.req_s)
                continue
            if k.sparse_pair_s:  # DSA (module docstring)
                if kv_len <= k.pair_cap:  # every token selected: no indexer logits
                    s = k.pair_s if kv_len <= k.dense_kv_max else k.sparse_pair_s
                    total += k.layers * pairs * s
                else:  # sparse absorbed MLA over the top-k, the indexer over every pair
                    p = min(pairs, tokens * k.pair_cap)
                    total += k.layers * (p * k.sparse_pair_s + pairs * k.index_pair_s)
                continue
            p = pairs if not k.pair_cap else min(pairs, tokens * k.pair_cap)
            total += k.layers * (p * k.pair_s + pairs * k.index_pair_s)
        return total / self.layers

    def decode_ctx(self, context: float, seqs: float) -> float:
        """Context-dependent attention seconds of a mean layer of a decode step."""
        total = 0.0
        for k in self.kinds:
            if k.ctx_s:
                c = context if not k.ctx_cap else min(context, seqs * k.ctx_cap)
                total += k.layers * (c * k.ctx_s + context * k.index_ctx_s)
        return total / self.layers

    def decode_seq(self, seqs: float) -> float:
        """Per-sequence (state) seconds of a mean layer of a decode step."""
        return sum(k.layers * seqs * k.seq_s for k in self.kinds if k.seq_s) / self.layers

"""Step-latency predictors: swappable objects mapping one forward to seconds.

Every predictor implements

- ``prefill(tokens, sq_tokens, pairs=None, reqs=1, prefix=0, attn_tokens=None)``: one prefill
  forward of a rank: ``tokens`` new tokens (under DP-attention lockstep: the mean over the
  server's ranks, so that ``tokens * dp`` are gathered into the MoE), ``sq_tokens`` =
  ``sum(len * (len + prefix))``, ``pairs`` = causal (query, key) pairs
  ``sum(len * prefix + len * (len + 1) / 2)``, ``reqs`` requests (chunks), ``prefix`` cached or
  earlier-chunk tokens whose KV the chunks attend to, ``attn_tokens`` the tokens of the slowest
  rank's attention (default ``tokens``);
- ``decode(batch, context, attn_batch=None)``: one decode step: ``batch`` sequences (mean over
  lockstep ranks), ``context`` KV tokens read (the slowest rank's), ``attn_batch`` the slowest
  rank's sequences (default ``batch``).

``operator`` (the default) is an operator-level analytical model of one GPU of the rank;
``fitted`` (``a + b*... + c*...``) and ``roofline`` are kept selectable.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Protocol

from pdsim.config.fleet import FITTED_KEYS, PredictorConfig
from pdsim.config.profile_schema import GPU, Engine, Model
from pdsim.model import architectures, formats
from pdsim.model.layout import Layout, layout_for, role_layout
from pdsim.model.rates import check_rates
from pdsim.model.simple import FittedPredictor, RooflinePredictor

__all__ = ["FittedPredictor", "Layout", "OperatorPredictor", "Predictor", "RooflinePredictor",
           "build", "layout_for", "role_layout"]

ACT_BYTES = 2  # activations and the LM head are BF16
ELEMENTWISE_PASSES = 6  # per token per layer: 2 norms, 2 residual adds, rope, activation quant


class Predictor(Protocol):
    def prefill(self, tokens: float, sq_tokens: float, pairs: float | None = None,
                reqs: float = 1, prefix: float = 0, attn_tokens: float | None = None
                ) -> float: ...

    def decode(self, batch: float, context: float, attn_batch: float | None = None
               ) -> float: ...

    def decode_gpu(self, batch: float, context: float, attn_batch: float | None = None
                   ) -> float: ...  # decode() without its CPU floor

    decode_request_s: float  # the CPU floor's seconds per request (0: none)


# --- the operator-level model --------------------------------------------------------------


class _Terms:
    """What :class:`OperatorPredictor` derives from its GPU, model, engine and layout (in its
    ``__post_init__``), as slots: CPython 3.11 reads an instance's attributes inline only while
    its class's instances have fewer than 30 names (53 here: these 49 and the dataclass's 4
    fields); past that, each of the hot path's reads (a forward's, a decode span's) is a dict
    look-up."""

    __slots__ = ("bw", "pk_w", "pk_e", "pk_lm", "pk_attn", "pk_dattn", "half", "wb", "ewb",
                 "attn_w", "kv_b_w", "pf_pair_flops", "dc_ctx_flops", "kv_layer_bytes", "ep_mode",
                 "deepep", "dense_w", "shared_w", "expert_w", "local_experts", "lm_w", "nic_bw",
                 "nvl_bw", "ar_factor", "ar_bw", "a2a_remote", "a2a_nvl", "a2a_nic", "per_ctx",
                 "hybrid", "_decode_cache", "_layer_cache", "_pf_fixed", "_pf_fixed_layers",
                 "_lm_cache", "_nd", "_nm", "_hidden", "_moe", "_experts", "_k", "_keep", "_ar_s",
                 "_domain", "_a2a_s", "_gather", "_tbo", "_w_attn", "_w_dense", "_w_shared",
                 "_w_lm", "_w_kv_b", "_two_expert_w", "_dc_fixed", "_dc_eager", "_scatter",
                 "_w_kinds", "_ep_z", "decode_request_s", "_fused")


@dataclass(slots=True)
class OperatorPredictor(_Terms):
    """Per forward, per layer, on one GPU of the rank: GEMMs, attention, MoE, communication.

    - GEMMs (attention projections, MLP, shared and routed experts, LM head):
      ``max(FLOPs / (peak * eff(m)), weight bytes / (HBM * hbm_eff))`` with
      ``eff(m) = gemm_eff * m / (m + gemm_half_tokens)``, ``m`` the tokens of one GEMM (of one
      expert in MoE): small batches read weights, large ones compute.
    - Attention: prefill FLOPs over the causal (query, key) pairs, with prefix reuse; decode as
      the KV bytes (or, for MLA on FLOP-poor parts, FLOPs) each GPU reads. GQA splits KV heads
      over attention-TP GPUs (replicated when TP > KV heads); MLA's latent is whole on every
      attention-TP GPU; under DP attention a rank attends over its own requests only.
    - MoE: weights of the distinct experts a batch touches (``E * (1 - (1 - k/E)^T)``), expert
      GEMMs at their real per-expert token counts, EP dispatch/combine bytes over NVLink or RDMA,
      ``imbalance`` on the busiest GPU.
    - Communication: two all-reduces per layer over the TP group (TP, or the DP-attention
      gather and scatter); all-to-all under EP. Two-batch overlap hides it under computation.
    - Elementwise traffic, per-step and per-layer engine overheads, and each MoE layer's
      routing chain, each DSA layer's indexer chain, each Gated DeltaNet layer's recurrence
      chain: small kernels at ``engine.small_kernel_us`` each, graphed or eager.
    """

    gpu: GPU
    model: Model
    engine: Engine
    layout: Layout = field(default_factory=Layout)

    def __post_init__(self) -> None:
        g, m, lay = self.gpu, self.model, self.layout
        self.bw = g.hbm_tbps * 1e12 * g.hbm_eff
        self.pk_w = formats.peak_tflops(g, m.weight_dtype) * 1e12 * g.gemm_eff
        self.pk_lm = g.bf16_tflops * 1e12 * g.gemm_eff
        self.pk_attn = g.bf16_tflops * 1e12 * g.attn_eff
        self.pk_dattn = g.bf16_tflops * 1e12 * g.decode_attn_eff
        self.half = g.gemm_half_tokens
        self.wb = m.weight_bytes
        self.ewb = m.expert_weight_bytes
        at = lay.attn_tp
        h = m.hidden_size
        if m.attention == "mla":
            rep, shard = m.attn_params
            self.attn_w = rep + shard / at
            self.kv_b_w = m.kv_lora_rank * m.heads * (m.qk_nope_head_dim + m.v_head_dim) / at
            heads = m.heads / at
            self.pf_pair_flops = 2 * heads * (m.qk_nope_head_dim + m.qk_rope_head_dim
                                              + m.v_head_dim)
            self.dc_ctx_flops = 2 * heads * (2 * m.kv_lora_rank + m.qk_rope_head_dim)
            self.kv_layer_bytes = m.kv_per_layer * m.kv_dtype_bytes
            if m.index_topk:  # DSA: the main attention reads the latent only (the indexer:
                self.kv_layer_bytes = m.kv_layer_token_bytes - m.index_head_dim - \
                    m.index_head_dim // 128 * 4  # pdsim.model.architectures)
        else:
            kvh = max(1.0, m.kv_heads / at)
            heads = m.heads / at
            qo = 3 if m.attn_output_gate else 2  # q (and its gate) and o
            self.attn_w = qo * h * m.heads * m.head_dim / at + 2 * h * m.head_dim * kvh
            self.kv_b_w = 0.0
            self.pf_pair_flops = 4 * heads * m.head_dim
            self.dc_ctx_flops = 4 * heads * m.head_dim
            self.kv_layer_bytes = 2 * kvh * m.head_dim * m.kv_dtype_bytes
        # sharding (Layout): routed experts over ep GPUs, each one's width over tp // ep;
        # deepep scatters tokens (whole shared experts on own tokens); dense MLP and LM head
        # TP-sharded unless moe_dense_tp_size 1 / enable_dp_lm_head
        self.ep_mode = lay.ep > 1 and m.is_moe
        self.deepep = lay.a2a == "deepep" and m.is_moe
        peak, eff = formats.expert_rate(g, m.expert_format, self.deepep)  # (Triton's MoE)
        self.pk_e = peak * 1e12 * eff
        # SGLang runs DeepSeek-V3/R1's and GLM-5's shared expert as one more expert of that
        # kernel at EP 1 (formats.fused_shared_experts): priced in :meth:`moe`, not as a GEMM
        self._fused = formats.fused_shared_experts(g, m, lay.ep, self.deepep)
        self.dense_w = m.dense_mlp_params / (1 if lay.dense_tp1 else lay.tp)
        self.shared_w = m.shared_params / (1 if self.deepep else lay.tp)
        self.expert_w = m.expert_params / (lay.tp // lay.ep if m.is_moe else lay.tp)
        self.local_experts = m.experts / lay.ep if self.ep_mode else m.experts
        self.lm_w = m.vocab_size * h / (at if lay.dp_lm_head else lay.tp)
        self._scatter = 1 if at == 1 else at  # a GPU's share of its rank's tokens, scattered
        # links: one all-reduce moves 2(n-1)/n of the buffer through each GPU's link, over
        # NVLink inside one NVLink domain, else the slower of NVLink and the NIC
        nic = g.nic_gbps / 8 * 1e9 / g.gpus_per_nic * g.nic_eff
        nvl = g.nvlink_gbps * 1e9 * g.nvlink_eff
        self.nic_bw, self.nvl_bw = nic, nvl
        check_rates("gpu", self.rates())  # (before any of them divides)
        n = lay.tp
        self.ar_factor = 2 * (n - 1) / n if n > 1 else 0.0
        self.ar_bw = nvl if n <= g.domain else min(nvl, nic)
        # all-to-all: of the (token, expert) pairs, those to other GPUs of the domain ride
        # NVLink, those to other domains the NIC
        ep, dom = lay.ep, (min(lay.ep, g.domain) if lay.ll_nvlink else 1)
        self.a2a_remote = (ep - 1) / ep if self.deepep else 0.0
        self.a2a_nvl = (dom - 1) / ep if self.deepep else 0.0
        self.a2a_nic = (ep - dom) / ep if self.deepep else 0.0
        # decode attention per context token per layer: KV bytes read, or MLA's FLOPs
        self.per_ctx = max(self.dc_ctx_flops / self.pk_dattn, self.kv_layer_bytes / self.bw)
        self.hybrid = None
        self._w_kinds = ()
        if m.is_hybrid:
            fp8 = g.fp8_tflops * 1e12
            kinds = architectures.kinds(
                m, at, full_proj=self.attn_w, pair_flops=self.pf_pair_flops,
                per_ctx=self.per_ctx, pk_attn=self.pk_attn, pk_dattn=self.pk_dattn,
                pk_index=fp8 * g.attn_eff, pk_index_decode=fp8 * g.decode_attn_eff,
                bw=self.bw, die=g.arch,
                pk_gdn=g.bf16_tflops * 1e12 * (g.gdn_prefill_eff or g.attn_eff))
            self.hybrid = architectures.Hybrid(kinds, m.layers)
            self._w_kinds = tuple((k.layers, self._weight(k.proj_params, self.wb, self.pk_w))
                                  for k in kinds)
        self._decode_cache: dict[tuple[float, float], tuple] = {}
        self._layer_cache: dict[tuple[float, float, bool], tuple] = {}
        # a prefill forward's terms that do not depend on its tokens: the engine's fixed and
        # per-layer costs (the same subexpressions, so the same floats: ``fixed + layers +
        # body + lm`` adds from the left), the LM head per request count
        self._pf_fixed = self.engine.prefill_step_ms / 1e3
        self._pf_fixed_layers = self._pf_fixed + m.layers * self.engine.prefill_layer_us * 1e-6
        # (a Gated DeltaNet layer's linear-attention block launched eagerly: prefill only, the
        # decode step is a CUDA graph; pdsim.model.architectures)
        self._pf_fixed_layers += \
            m.linear_attention_layers * self.engine.gdn_prefill_layer_us * 1e-6
        # (and each forward's chains of small kernels: architectures.chain_kernels)
        chains = architectures.chain_kernels(m, self.deepep) * self.engine.small_kernel_us * 1e-6
        self._pf_fixed_layers += chains
        self._lm_cache: dict[float, float] = {}
        # (properties: read once; as floats, the same products, see ``decode_series``)
        self._nd, self._nm = float(m.dense_mlp_layers), float(m.moe_layers)
        # what the building blocks (experts_touched, moe, allreduce, all_to_all, _layer_parts)
        # read of the model and GPU, read once: a field of a pydantic model costs ~5x a plain
        # attribute, and a prefill or decode batch the memos have not seen reads a dozen of
        # them (the same values, so the same floats)
        self._hidden, self._moe = h, m.is_moe
        self._experts, self._k = m.experts, m.experts_per_token
        self._keep = 1.0 - m.experts_per_token / m.experts if m.is_moe else 0.0
        ep = lay.ep  # (the expected largest of ep standard normals, Blom: :meth:`moe`)
        self._ep_z = NormalDist().inv_cdf((ep - 0.375) / (ep + 0.25)) if ep > 1 else 0.0
        self._ar_s = g.allreduce_us * 1e-6
        self._domain, self._a2a_s = g.domain, 2 * g.a2a_us * 1e-6
        # a step the memos have not seen (most decode steps of a run: the batch and its
        # slowest rank's share change all the time; ~500 such steps on drop_timeout) is
        # computed from these, made once: each GEMM's weight terms (:meth:`_weight`), the
        # layout's gather, two-batch overlap and the engine's per-step decode cost (the same
        # subexpressions, so the same floats)
        self._gather, self._tbo = lay.gather, lay.tbo
        self._w_attn = self._weight(self.attn_w, self.wb, self.pk_w)
        self._w_dense = self._weight(self.dense_w, self.wb, self.pk_w)
        self._w_shared = self._weight(self.shared_w, self.wb, self.pk_w)
        self._w_lm = self._weight(self.lm_w, ACT_BYTES, self.pk_lm)
        self._w_kv_b = self._weight(self.kv_b_w, self.wb, self.pk_w)
        self._two_expert_w = 2 * self.expert_w
        eng = self.engine
        self._dc_fixed = eng.decode_step_ms / 1e3 + m.layers * eng.decode_layer_us * 1e-6
        eager = eng.prefill_layer_us if eng.eager_layer_us is None else eng.eager_layer_us
        self._dc_eager = eng.decode_step_ms / 1e3 + m.layers * eager * 1e-6
        self._dc_fixed += chains
        self._dc_eager += chains
        self.decode_request_s = eng.decode_request_us * 1e-6  # (CPU per request per step)

    def rates(self) -> list[tuple[str, float]]:
        """The rates its step times divide by, each with the GPU fields it is the product of."""
        m = self.model
        return [(f"GEMM FLOP/s (the GPU's peak for {m.weight_dtype}) x gpu.gemm_eff", self.pk_w),
                ("expert GEMM FLOP/s gpu.fp8_tflops x gpu.moe_fp8_block_eff (SGLang's Triton "
                 "fused MoE)" if formats.triton_block_fp8_moe(self.gpu, m.expert_format,
                                                               self.deepep) else
                 f"expert GEMM FLOP/s (the GPU's peak for {m.expert_format}) x gpu.gemm_eff",
                 self.pk_e),
                ("LM-head FLOP/s gpu.bf16_tflops x gpu.gemm_eff", self.pk_lm),
                ("prefill attention FLOP/s gpu.bf16_tflops x gpu.attn_eff", self.pk_attn),
                ("decode attention FLOP/s gpu.bf16_tflops x gpu.decode_attn_eff", self.pk_dattn),
                ("HBM bytes/s gpu.hbm_tbps x gpu.hbm_eff", self.bw),
                ("NVLink bytes/s gpu.nvlink_gbps x gpu.nvlink_eff", self.nvl_bw),
                ("RDMA bytes/s gpu.nic_gbps / gpu.gpus_per_nic x gpu.nic_eff", self.nic_bw)]

    def forget(self) -> None:
        """Drop the memos (pdsim.engine.fleet.Fleet.release, once a run's outputs are made): freed
        by reference counting at once, rather than by the young collection after the run,
        which traces each of their tuples first (the conversation trace leaves ~24k of them:
        ~20 ms of collection)."""
        self._decode_cache.clear()
        self._layer_cache.clear()
        self._lm_cache.clear()

    # --- building blocks ----------------------------------------------------------------

    def gemm(self, tokens: float, params: float, wbytes: float | None = None,
             peak: float | None = None) -> float:
        """One GEMM of ``params`` weights over ``tokens`` rows on one GPU (seconds)."""
        return self._gemm(tokens, self._weight(params, self.wb if wbytes is None else wbytes,
                                               self.pk_w if peak is None else peak))

    def _weight(self, params: float, wbytes: float, peak: float) -> tuple | None:
        """A GEMM's terms that do not depend on its tokens: ``(2 * params, memory seconds,
        peak)``, None for no weights (:meth:`_gemm`)."""
        if params <= 0:
            return None
        return 2 * params, params * wbytes / self.bw, peak

    def _gemm(self, tokens: float, weight: tuple | None) -> float:
        """:meth:`gemm` of a :meth:`_weight`: ``max(FLOPs / peak, weight bytes / HBM)``, the
        FLOPs ``2 * params * (tokens + gemm_half_tokens)`` (the efficiency curve)."""
        if weight is None or tokens <= 0:
            return 0.0
        two_params, memory, peak = weight
        compute = two_params * (tokens + self.half) / peak
        return memory if memory > compute else compute  # max(compute, memory)

    def experts_touched(self, tokens: float) -> float:
        """Distinct experts (of all E) a batch of ``tokens`` routes to, balanced routing."""
        if tokens <= 0 or not self._moe:
            return 0.0
        return self._experts * (1.0 - self._keep ** tokens)  # _keep = 1 - k/E

    def moe(self, routed: float) -> float:
        """Routed experts on one GPU when ``routed`` tokens (all ranks') pick their experts.

        TP-MoE: every GPU holds 1/tp of each expert and sees every token; EP: a GPU holds
        E/ep whole experts and gets its share of the assignments (times ``imbalance``), and the
        layer waits for the GPU whose experts the batch touches most: a GPU's count of its
        ``L = E/ep`` experts is binomial (each touched with probability ``q``), the busiest of
        ``ep`` taken as ``Lq + z_ep sqrt(Lq(1-q))`` (``z_ep``: the expected largest of ``ep``
        standard normals), at most ``L`` (Qwen3.5 at EP 8, 4 tokens: ~1.6x the mean GPU's).

        A fused shared expert (``_fused``, :func:`formats.fused_shared_experts`: EP 1 only) is
        one more expert every token is assigned to and every batch touches: its FLOPs at the
        experts' rate, its weights read with theirs, in one max of compute and memory (at a
        prefill's token counts gemm_eff / moe_fp8_block_eff slower than as a dense GEMM, 4.5x
        with the profiles' 0.7 and 0.154; at decode its weight bytes are the same, and its
        rows add FLOPs at the slower rate where the layer's compute binds).
        """
        if routed <= 0:
            return 0.0
        share = self.experts_touched(routed) / self._experts  # q
        touched = self.local_experts * share
        assigned = routed * self._k
        if self.ep_mode:
            assigned = assigned / self.layout.ep * self.layout.imbalance
            spread = math.sqrt(touched * (1.0 - share))
            touched = min(self.local_experts, touched + self._ep_z * spread)
        if self._fused:
            assigned += routed * self._fused
            touched += self._fused
        compute = self._two_expert_w * (assigned + self.half * touched) / self.pk_e
        memory = touched * self.expert_w * self.ewb / self.bw
        return memory if memory > compute else compute  # max(compute, memory)

    def allreduce(self, tokens: float) -> float:
        if self.ar_factor == 0 or tokens <= 0:
            return 0.0
        nbytes = tokens * self._hidden * ACT_BYTES
        return self._ar_s + self.ar_factor * nbytes / self.ar_bw

    def all_to_all(self, tokens: float, low_latency: bool) -> float:
        """DeepEP dispatch (FP8) + combine (BF16) of one GPU's ``tokens`` (seconds).

        Low-latency kernels (decode) send every (token, expert) pair directly: pairs to GPUs of
        the same NVLink domain over NVLink, to other domains over RDMA (the NIC), both at
        once; the busier link decides. Normal kernels (prefill) send a token once to each
        remote domain it routes to (RDMA), then forward it over NVLink; the busier link
        decides. The busiest receiver carries ``imbalance`` times the mean.
        """
        if tokens <= 0:
            return 0.0
        lay = self.layout
        per_token = self._hidden * (1 + ACT_BYTES) * lay.imbalance
        k = self._k
        if low_latency:
            pairs = tokens * k * per_token
            rdma, nvl = pairs * self.a2a_nic / self.nic_bw, pairs * self.a2a_nvl / self.nvl_bw
            wire = rdma if rdma > nvl else nvl
        else:
            nodes = max(1.0, lay.ep / self._domain)
            remote_nodes = (nodes - 1) * (1 - (1 - 1 / nodes) ** k) if nodes > 1 else 0.0
            rdma = tokens * remote_nodes * per_token
            nvl = tokens * k * per_token * self.a2a_remote
            wire = max(rdma / self.nic_bw, nvl / self.nvl_bw)
        return self._a2a_s + wire  # _a2a_s = 2 * a2a_us * 1e-6

    @staticmethod
    def _combine(parts: tuple, core: float) -> tuple[float, float, float, float]:
        """(dense-layer compute, MoE-layer compute, dense comm, MoE comm) per layer, seconds,
        of a forward's :meth:`_layer_parts` and its slowest rank's attention-core seconds."""
        g_attn, elem, g_dense, g_shared, experts, c_dense, c_moe = parts
        a = g_attn + core
        dense = a + elem + g_dense
        moe = a + elem + g_shared + experts if g_shared is not None else 0.0
        return dense, moe, c_dense, c_moe

    def _layer_parts(self, mean: float, attn: float, low_latency: bool) -> tuple:
        """The per-layer terms :meth:`_combine` adds but the attention core: attention projections,
        elementwise traffic, dense MLP, shared experts and routed experts (None, None for a
        dense model), dense and MoE communication."""
        routed = mean * self._gather
        lay = self.layout
        own = attn / self._scatter  # one GPU's share of its rank's tokens (scattered modes)
        mlp = own if self.deepep else routed  # deepep: shared experts on own tokens
        dense_tokens = own if lay.dense_tp1 else routed
        elem = (attn + mlp) * self._hidden * ACT_BYTES * ELEMENTWISE_PASSES / self.bw
        if self._moe:
            shared = 0.0 if self._fused else self._gemm(mlp, self._w_shared)
            experts = self.moe(routed)  # (with the fused shared expert)
        else:
            shared = experts = None
        ar = 2 * self.allreduce(routed)
        if self.deepep:
            c_dense, c_moe = (0.0 if lay.dense_tp1 else ar), self.all_to_all(own, low_latency)
        else:
            c_dense, c_moe = (0.0 if lay.dense_tp1 else ar), ar
        if self.hybrid is None:
            g_attn = self._gemm(attn, self._w_attn)
        else:  # the mean layer's projections (and, decoding, its recurrent states)
            g_attn = sum(n * self._gemm(attn, w) for n, w in self._w_kinds) / self.hybrid.layers
            if low_latency:
                g_attn += self.hybrid.decode_seq(attn)
        return (g_attn, elem, self._gemm(dense_tokens, self._w_dense), shared, experts,
                c_dense, c_moe)

    def _overlap(self, compute: float, comm: float) -> float:
        """Two-batch overlap hides ``tbo_overlap`` of the shorter of computation and
        communication under the longer."""
        lo, hi = (compute, comm) if compute < comm else (comm, compute)
        return hi + (1 - self.engine.tbo_overlap) * lo

    def _lm_tokens(self, reqs: float) -> float:
        return reqs if self.layout.dp_lm_head else reqs * self._gather

    # --- the predictor interface --------------------------------------------------------

    def prefill(self, tokens: float, sq_tokens: float, pairs: float | None = None,
                reqs: float = 1, prefix: float = 0, attn_tokens: float | None = None) -> float:
        """One prefill forward: all layers (:meth:`_combine`), the engine's costs, the LM head.

        A layer's terms but the attention core are remembered per (tokens, attention tokens):
        most forwards of a long run are full chunks (the conversation trace: 81% of its
        ~16.5k distinct prefill forwards). The forward itself is not remembered: it repeats
        for 17% of them there, ~0% on drop_timeout, and looking it up cost more than that
        saved (its key is six numbers)."""
        if tokens <= 0:
            return self._pf_fixed
        if pairs is None:
            pairs = sq_tokens / 2
        at = tokens if attn_tokens is None else attn_tokens
        if self.hybrid is None:
            core = pairs * self.pf_pair_flops / self.pk_attn
        else:  # the mean layer's attention, window/top-k capped, or its recurrence
            kv = (sq_tokens if sq_tokens else 2 * pairs) / at if at > 0 else 0.0  # KV/request
            core = self.hybrid.prefill_core(at, pairs, reqs, kv)
        if prefix and self.kv_b_w:  # MLA: expand the cached latent of the prefix (MHA path)
            core += self._gemm(prefix, self._w_kv_b)
        nd, nm = self._nd, self._nm
        tbo = self._tbo and tokens >= 2
        if tbo:  # two micro-batches: communication of one runs under computation of the other
            tokens, at, core = tokens / 2, at / 2, core / 2
        key = (tokens, at, False)
        parts = self._layer_cache.get(key) or self._remember(key)
        if tbo:
            d, e, cd, ce = (2 * x for x in self._combine(parts, core))
            body = nd * self._overlap(d, cd) + nm * self._overlap(e, ce)
        else:
            d, e, cd, ce = self._combine(parts, core)
            body = nd * (d + cd) + nm * (e + ce)
        lm = self._lm_cache.get(reqs)
        if lm is None:
            lm = self._lm_cache[reqs] = self._gemm(self._lm_tokens(reqs), self._w_lm)
        return self._pf_fixed_layers + body + lm

    def _remember(self, key: tuple) -> tuple:
        """:meth:`_layer_parts` of a prefill ``key`` (mean, attn, False), remembered."""
        parts = self._layer_parts(*key)
        if len(self._layer_cache) > 200_000:
            self._layer_cache.clear()
        self._layer_cache[key] = parts
        return parts

    def _decode_parts(self, batch: float, attn_batch: float) -> tuple:
        """Everything but the context term, cached per (batch, attn_batch). (Its layer terms
        are not remembered apart, as a prefill's are: they would be keyed the same.)"""
        key = (batch, attn_batch)
        hit = self._decode_cache.get(key)
        if hit is not None:
            return hit
        graph = self.layout.graph_bs  # above the CUDA-graph cap the step runs eagerly
        base = self._dc_eager if graph is not None and attn_batch > graph else self._dc_fixed
        fixed = base + self._gemm(self._lm_tokens(batch), self._w_lm)
        tbo = self._tbo and batch >= 2
        if tbo:
            parts = tuple(2 * x for x in self._combine(
                self._layer_parts(batch / 2, attn_batch / 2, True), 0.0))
        else:
            parts = self._combine(self._layer_parts(batch, attn_batch, True), 0.0)
        out = (fixed, tbo, *parts)
        if len(self._decode_cache) > 200_000:
            self._decode_cache.clear()
        self._decode_cache[key] = out
        return out

    def decode(self, batch: float, context: float, attn_batch: float | None = None) -> float:
        """One decode step: ``max(decode_gpu, requests x engine.decode_request_us)``. SGLang's
        overlap scheduler (``event_loop_overlap``, scheduler.py@0.5.6.post2) launches step N+1,
        then processes step N's results (``process_batch_result_decode``, ``stream_output``:
        per request) while the GPU runs it. The requests: a DP rank's own (``attn_batch``)."""
        t = self.decode_gpu(batch, context, attn_batch)
        cpu = (batch if attn_batch is None else attn_batch) * self.decode_request_s
        return t if t >= cpu else cpu

    def decode_gpu(self, batch: float, context: float, attn_batch: float | None = None
                   ) -> float:
        """One decode forward; linear in ``context`` for a given batch (the rest cached)."""
        if batch <= 0:
            return self.engine.decode_step_ms / 1e3
        ab = batch if attn_batch is None else attn_batch
        fixed, tbo, dense, moe, c_dense, c_moe = self._decode_parts(batch, ab)
        attn = (self.per_ctx * context if self.hybrid is None
                else self.hybrid.decode_ctx(context, ab))
        nd, nm = self._nd, self._nm
        if tbo:
            ov = self._overlap
            return fixed + nd * ov(dense + attn, c_dense) + nm * ov(moe + attn, c_moe)
        return fixed + nd * (dense + attn + c_dense) + nm * (moe + attn + c_moe)

    def decode_series(self, batch: float, attn_batch: float, context: int, grow: int
                      ) -> Iterator[float]:
        """``decode(batch, context + grow*j, attn_batch)`` for j = 0, 1, ...: the same floats
        (:meth:`decode`'s CPU floor on :meth:`_gpu_series`)."""
        series, cpu = self._gpu_series(batch, attn_batch, context, grow), \
            attn_batch * self.decode_request_s
        return (t if t >= cpu else cpu for t in series) if cpu > 0.0 else series

    def _gpu_series(self, batch: float, attn_batch: float, context: int, grow: int
                    ) -> Iterator[float]:
        """``decode_gpu(batch, context + grow*j, attn_batch)`` for j = 0, 1, ...: the same floats,
        the batch's parts looked up once (a decode span's steps). The context counts as a
        float: an int below 2**53 is a double exactly, and int-with-float arithmetic is done
        on that double, so each step's float is the same, by CPython's float-only fast path."""
        if batch <= 0:
            fixed = self.engine.decode_step_ms / 1e3
            while True:
                yield fixed
        fixed, tbo, dense, moe, c_dense, c_moe = self._decode_parts(batch, attn_batch)
        per_ctx, nd, nm = self.per_ctx, self._nd, self._nm
        context, grow = float(context), float(grow)
        if self.hybrid is not None:  # (the context term of decode(), step by step)
            ctx, ov = self.hybrid.decode_ctx, self._overlap
            while True:
                attn = ctx(context, attn_batch)
                if tbo:
                    yield fixed + nd * ov(dense + attn, c_dense) + nm * ov(moe + attn, c_moe)
                else:
                    yield fixed + nd * (dense + attn + c_dense) + nm * (moe + attn + c_moe)
                context += grow
        if tbo:
            ov = self._overlap
            while True:
                attn = per_ctx * context
                yield fixed + nd * ov(dense + attn, c_dense) + nm * ov(moe + attn, c_moe)
                context += grow
        while True:
            attn = per_ctx * context
            yield fixed + nd * (dense + attn + c_dense) + nm * (moe + attn + c_moe)
            context += grow

    def weights_per_gpu(self) -> float:
        """Weight bytes one GPU of the rank holds (what the KV pool cannot use).

        The embedding is vocab-parallel over the attention-TP group (SGLang
        VocabParallelEmbedding: the TP group, or the attention-TP group under DP attention); a
        tied LM head is the embedding, stored once. A VLM's vision tower is not counted."""
        m, at = self.model, self.layout.attn_tp
        layers = m.attention_layers * self.attn_w * self.wb
        if m.linear_attention_layers:
            layers += m.linear_attention_layers * m.linear_attn_params / at * self.wb
        layers += m.dense_mlp_layers * self.dense_w * self.wb
        if m.is_moe:
            if self.ewb == self.wb:
                layers += m.moe_layers * (self.shared_w + self.local_experts * self.expert_w) \
                    * self.wb
            else:
                layers += m.moe_layers * (self.shared_w * self.wb
                                          + self.local_experts * self.expert_w * self.ewb)
        emb = m.vocab_size * m.hidden_size * ACT_BYTES / at
        return layers + emb + (0.0 if m.tie_word_embeddings else self.lm_w * ACT_BYTES)


def build(cfg: PredictorConfig, gpu: GPU, model: Model, tp: int, dp_gather: int = 1,
          engine: Engine | None = None, layout: Layout | None = None) -> Predictor:
    """Make the predictor a scenario asks for (``dp_gather``: dp under DP attention, else 1)."""
    if cfg.kind == "operator":
        if engine is None:
            from pdsim.model import profiles

            engine = profiles.engine()
        return OperatorPredictor(gpu, model, engine, layout or Layout(tp=tp, gather=dp_gather))
    if cfg.kind == "roofline":
        return RooflinePredictor(gpu, model, tp, dp_gather, cfg.prefill_mfu, cfg.hbm_derate,
                                 cfg.step_overhead_ms / 1e3)
    fitted = (model.fitted or {}).get(gpu.name)
    coeffs = dict(fitted or {})
    coeffs.update(cfg.coefficients)
    missing = [k for k in FITTED_KEYS if k not in coeffs]
    if missing:
        raise ValueError(
            f"model '{model.name}' has no fitted coefficients for GPU '{gpu.name}' "
            f"(missing {', '.join(missing)}); set predictor.kind: operator (or roofline) or "
            f"give predictor.coefficients")
    return FittedPredictor(**{k: float(coeffs[k]) for k in FITTED_KEYS})

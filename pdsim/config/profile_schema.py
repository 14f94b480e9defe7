"""The schema of GPU, model and engine profiles: their fields, units, bounds and
descriptions, and the all-optional override types a scenario's inline ``gpu:``, ``model:`` and
``engine:`` sections use.

Config, not model: the scenario schema (:mod:`pdsim.config.fleet`) embeds the override types,
and the config layer must not import the model layer. Reading and merging profile files, and
resolving a scenario's profiles, is the model layer's :mod:`pdsim.model.profiles`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, create_model

MAX_PROFILE_BYTES = 1 << 20  # a profile file is a few kB; refuse anything past 1 MB

MAX_VALUE = 1e9  # any profile number (TFLOP/s, GB, us, tokens, sizes): far above real parts
MAX_DIM = 10_000_000  # layers, heads, widths, experts, vocabulary


def _number(v: Any) -> Any:
    if isinstance(v, bool):
        raise ValueError(f"expected a number, not {str(v).lower()}")
    return v


_NUM = BeforeValidator(_number)
Pos = Annotated[float, Field(gt=0, le=MAX_VALUE, allow_inf_nan=False), _NUM]
NonNeg = Annotated[float, Field(ge=0, le=MAX_VALUE, allow_inf_nan=False), _NUM]
Frac = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False), _NUM]
PosInt = Annotated[int, Field(gt=0, le=MAX_DIM), _NUM]
NonNegInt = Annotated[int, Field(ge=0, le=MAX_DIM), _NUM]
Dtype = Literal["bf16", "fp8", "fp8_block", "int4", "nvfp4", "mxfp4"]

# Bytes per weight, scales included where they are material (pdsim/model/formats.py says how
# each format computes): int4 (W4A16 GPTQ/AWQ) is kept at 0.5 B, its group scales (~3%) left
# out as they always were; fp8_block carries one FP32 scale per 128x128 block (DeepSeek-V3
# README_WEIGHTS.md, weight_block_size [128, 128]); NVFP4 one FP8 E4M3 scale per 16 values
# (NVIDIA ModelOpt NVFP4: E2M1 values, 16-element blocks); MXFP4 one E8M0 scale per 32 (OCP
# MX spec; gpt-oss quantization_config quant_method mxfp4).
DTYPE_BYTES = {"bf16": 2.0, "fp8": 1.0, "fp8_block": 1.0 + 4 / (128 * 128), "int4": 0.5,
               "nvfp4": 0.5 + 1 / 16, "mxfp4": 0.5 + 1 / 32}
KV_DTYPE_BYTES = {"bf16": 2.0, "fp8": 1.0}

# the fitted predictor's coefficients (pdsim.model.predictor.FittedPredictor), in a model
# profile's ``fitted.<GPU>`` and in a scenario's ``predictor.coefficients``: ms terms, finite, at
# least 0 (a negative one made step times negative: a run ended at -0.049 s) and at most any
# simulated time (pdsim.config.units.MAX_TIME_S, 1e7 s, in ms: NaN, inf and 1e300 left every
# step past the horizon)
FITTED_KEYS = ("prefill_a_ms", "prefill_b_ms_per_ktok", "prefill_c_ms_per_mtok2",
               "decode_a_ms", "decode_b_ms_per_ktok", "decode_c_ms_per_seq")
MAX_COEFFICIENT_MS = 1e10  # a fitted-predictor coefficient (ms): any simulated time, in ms
Coefficient = Annotated[float, Field(ge=0, le=MAX_COEFFICIENT_MS, allow_inf_nan=False), _NUM]
FittedKey = Literal[FITTED_KEYS]


class ProfileError(ValueError):
    """A profile that cannot be used; ``str()`` is the one-line message."""


class _Profile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)
    name: str = ""


# Fields a profile may no longer use, with what replaced them (a one-line refusal names it).
RENAMED = {
    "hbm_gb": "hbm_gb is now hbm_mib: the device memory as nvidia-smi --query-gpu=memory.total "
              "reports it, in MiB (H100 80GB: 81559, H200: 143771), the unit SGLang reads",
}


class GPU(_Profile):
    """One GPU and its node: peak rates, memory, links, and achieved-fraction parameters."""

    die: str = Field("", max_length=64, description="The GPU architecture (die) its kernels and "
                     "calibrations belong to, e.g. GH100 for H100/H200/H800/H20/H20-3e; a "
                     "calibration fitted on one variant applies to the others of its die "
                     "(through their own peaks) unless a more specific one exists; default: "
                     "the GPU's own name")
    bf16_tflops: Pos = Field(description="Dense BF16 tensor-core TFLOP/s")
    fp8_tflops: Pos = Field(description="Dense FP8 TFLOP/s (parts without FP8: the BF16 rate)")
    fp4_tflops: Pos | None = Field(None, description="Dense FP4 tensor-core TFLOP/s (NVFP4/"
                                   "MXFP4 operands); null: no FP4 tensor cores (pre-Blackwell), "
                                   "FP4 weights then compute at a wider format's rate")
    hbm_mib: PosInt = Field(description="Device memory as nvidia-smi --query-gpu=memory.total "
                            "reports it, MiB (SGLang's heuristics read this; pools are sized "
                            "in bytes = MiB x 2^20)")
    hbm_tbps: Pos = Field(description="Device memory bandwidth, TB/s")
    nvlink_gbps: Pos = Field(description="GPU-to-GPU bandwidth per direction, GB/s (PCIe-only "
                             "parts: the PCIe rate)")
    nic_gbps: Pos = Field(description="RDMA NIC line rate, Gb/s")
    gpus_per_nic: PosInt = Field(description="GPUs sharing one NIC")
    gpus_per_node: PosInt = Field(8, description="GPUs per node (host): per-node figures and "
                                  "NIC sharing")
    nvlink_domain: PosInt | None = Field(None, description="GPUs one NVLink/NVSwitch domain "
                                         "connects (8 on HGX/DGX boards, 72 in an NVL72 rack): "
                                         "TP collectives and expert all-to-all stay on NVLink "
                                         "inside it and cross the NIC between domains; default "
                                         "gpus_per_node")
    gemm_eff: Frac = Field(description="Fraction of peak FLOP/s large GEMMs reach")
    moe_fp8_block_eff: Frac | None = Field(None, description="Fraction of the FP8 peak the "
                                           "routed experts reach when SGLang runs them in its "
                                           "Triton fused-MoE kernel on block-scaled FP8 weights "
                                           "(no DeepEP: TP or EP MoE); null: gemm_eff, as every "
                                           "GEMM")
    gdn_prefill_eff: Frac | None = Field(None, description="Fraction of the BF16 peak a Gated "
                                         "DeltaNet layer's prefill recurrence reaches in SGLang's "
                                         "chunked gated-delta-rule kernels (fla's Triton "
                                         "chunk_gated_delta_rule), on pdsim's FLOP count of it; "
                                         "null: attn_eff")
    gemm_half_tokens: Pos = Field(description="Tokens per GEMM (per expert in MoE) at which "
                                  "GEMM efficiency is half of gemm_eff")
    attn_eff: Frac = Field(description="Fraction of BF16 peak prefill attention reaches")
    decode_attn_eff: Frac = Field(description="Fraction of BF16 peak decode attention reaches "
                                  "when compute-bound (MLA on low-FLOP parts)")
    hbm_eff: Frac = Field(description="Fraction of HBM bandwidth memory-bound kernels reach")
    nvlink_eff: Frac = Field(description="Fraction of NVLink bandwidth collectives reach")
    nic_eff: Frac = Field(description="Fraction of NIC line rate all-to-all reaches")
    allreduce_us: NonNeg = Field(description="Fixed latency of one all-reduce, us")
    a2a_us: NonNeg = Field(description="Fixed latency of one all-to-all (dispatch or combine), "
                           "us")

    @property
    def arch(self) -> str:
        """The die calibrations attach to (``die``, or the GPU's own name)."""
        return self.die or self.name

    @property
    def domain(self) -> int:
        """GPUs of one NVLink domain."""
        return self.nvlink_domain or self.gpus_per_node

    @property
    def hbm_bytes(self) -> int:
        return self.hbm_mib << 20

    @property
    def hbm_gib(self) -> float:
        return self.hbm_mib / 1024


class Engine(_Profile):
    """The serving engine's CPU-side costs (per forward, per layer, per request). (Which SGLang
    release's rules apply is the scenario's ``engine.version``: pdsim.config.engine_version.)"""

    prefill_step_ms: NonNeg = Field(description="Per prefill forward: scheduling, batch "
                                    "preparation, sampling")
    decode_step_ms: NonNeg = Field(description="Per decode step (CUDA graph replay, sampling, "
                                   "output processing)")
    prefill_layer_us: NonNeg = Field(description="Per layer per prefill forward: kernel launch "
                                     "gaps (eager mode)")
    gdn_prefill_layer_us: NonNeg = Field(0.0, description="Per Gated DeltaNet layer per "
                                         "prefill forward, beyond prefill_layer_us: the eager "
                                         "launch cost of its linear-attention block (causal "
                                         "conv1d, gating and fla's chain of chunked "
                                         "gated-delta-rule Triton kernels, each launched from "
                                         "Python)")
    decode_layer_us: NonNeg = Field(description="Per layer per decode step: gaps between "
                                    "kernels inside the CUDA graph")
    small_kernel_us: NonNeg = Field(0.0, description="Per small kernel of a layer's "
                                    "latency-bound chains that no byte or FLOP of the step "
                                    "accounts for (a MoE layer's routing, a DSA layer's "
                                    "indexer, a Gated DeltaNet layer's recurrence: "
                                    "pdsim.model.architectures.CHAIN_KERNELS), us")
    eager_layer_us: NonNeg | None = Field(None, description="Per layer per decode step run "
                                          "eagerly (a batch above the CUDA-graph cap, "
                                          "--cuda-graph-max-bs): kernel launch gaps; default "
                                          "prefill_layer_us (prefill always runs eagerly)")
    decode_request_us: NonNeg = Field(0.0, description="Per running request per decode step: "
                                      "the scheduler's CPU work on each request of the batch "
                                      "(output processing and stream output); the overlap "
                                      "scheduler runs it while the GPU runs the next step, so "
                                      "a step takes the longer of the two; 0: always hidden")
    bootstrap_ms: NonNeg = Field(description="Per request on the TTFT path: the PD bootstrap "
                                 "handshake before the prefill may run")
    tokenize_us_per_token: NonNeg = Field(description="Per prompt token on the TTFT path: "
                                          "tokenization in the server's tokenizer manager")
    request_ms: NonNeg = Field(0.0, description="Per request on a colocated server's TTFT "
                               "path, off the GPU (no forward waits for it): the HTTP front end, "
                               "the tokenizer manager's IPC and the first chunk's way back (a PD "
                               "request's is part of bootstrap_ms)")
    frontend_chunk_us: NonNeg = Field(0.0, description="A colocated server's front end "
                                      "(the TokenizerManager, one serial process per server): "
                                      "per request per output message of the scheduler "
                                      "(output bookkeeping, the SSE chunk's JSON); its backlog "
                                      "delays tokens and new requests (pdsim.engine.frontend); "
                                      "0 with frontend_copy_ns_per_token 0: no front end")
    frontend_copy_ns_per_token: NonNeg = Field(0.0, description="More of it per token the "
                                               "request has generated so far (the default "
                                               "streaming mode copies the whole output at "
                                               "every chunk), ns per token")
    init_mib: NonNeg = Field(0.0, description="Device memory a server's GPU no longer has "
                             "free when SGLang reads it at start-up (the CUDA context, the "
                             "allocator and the distributed init at tp 1): the KV pool is "
                             "(device - init) x mem_fraction_static - weights, MiB")
    init_mib_per_peer: NonNeg = Field(0.0, description="More of it per other GPU of the "
                                      "server's tensor-parallel group (NCCL and custom "
                                      "all-reduce buffers), MiB per peer")
    tbo_overlap: Frac = Field(description="Two-batch overlap: share of the shorter of "
                              "computation and communication hidden under the longer")


class Model(_Profile):
    """A transformer's architecture (Hugging Face ``config.json`` names in the descriptions).

    Layers: ``layers`` in all; ``linear_attention_layers`` of them are linear attention (Gated
    DeltaNet: a fixed recurrent state per request, no KV), ``sliding_window_layers`` attend to
    the last ``sliding_window`` tokens only, the rest attend to all (full attention, sparse when
    ``index_topk`` is set: DeepSeek/GLM DSA). The MLP of the first ``dense_layers`` is dense in a
    MoE model, MoE elsewhere. ``pdsim profiles import config.json`` fills these from a config.
    """

    architecture: str = Field("", max_length=128, description="architectures[0] of config.json "
                              "(what the profile was made from; informational)")
    family: str = Field("", max_length=64, description="The model family its calibrations "
                        "belong to (e.g. qwen3-dense, deepseek-mla-moe): a calibration written "
                        "for a family (calibrations.yaml ``family:``) applies to its models on "
                        "that GPU or die unless one for the model itself exists; default: none")
    attention: Literal["gqa", "mla"] = Field(description="gqa (incl. MHA) or mla")
    layers: PosInt = Field(description="num_hidden_layers")
    hidden_size: PosInt = Field(description="hidden_size (model width)")
    heads: PosInt = Field(description="num_attention_heads")
    kv_heads: NonNegInt = Field(0, description="num_key_value_heads (GQA)")
    head_dim: NonNegInt = Field(0, description="GQA head dimension")
    attn_output_gate: bool = Field(False, description="attn_output_gate (Qwen3-Next/3.5 gated "
                                   "attention: q_proj also emits a per-head gate, twice its "
                                   "width); default false")
    q_lora_rank: NonNegInt = Field(0, description="MLA query compression (0: none)")
    kv_lora_rank: NonNegInt = Field(0, description="MLA latent KV width")
    qk_nope_head_dim: NonNegInt = Field(0, description="MLA per-head query/key width without "
                                        "RoPE (qk_nope_head_dim)")
    qk_rope_head_dim: NonNegInt = Field(0, description="MLA per-head query/key RoPE width "
                                        "(qk_rope_head_dim)")
    v_head_dim: NonNegInt = Field(0, description="MLA per-head value width (v_head_dim)")
    index_topk: NonNegInt = Field(0, description="Sparse attention (DSA: DeepSeek-V3.2, GLM-5): "
                                  "tokens each query attends to, chosen by the indexer "
                                  "(index_topk); 0: dense attention")
    index_head_dim: NonNegInt = Field(
        0, description="DSA indexer key width (index_head_dim); default 0")
    index_n_heads: NonNegInt = Field(
        0, description="DSA indexer query heads (index_n_heads); default 0")
    sliding_window_layers: NonNegInt = Field(0, description="Layers attending to the last "
                                             "sliding_window tokens only (layer_types "
                                             "sliding_attention); default 0")
    sliding_window: NonNegInt = Field(
        0, description="Window of the sliding-window layers, tokens (sliding_window); default 0")
    linear_attention_layers: NonNegInt = Field(0, description="Gated DeltaNet layers (layer_types "
                                               "linear_attention; Qwen3-Next/3.5); default 0")
    linear_key_heads: NonNegInt = Field(
        0, description="Gated DeltaNet key heads (linear_num_key_heads); default 0")
    linear_key_head_dim: NonNegInt = Field(
        0, description="Gated DeltaNet key head width (linear_key_head_dim); default 0")
    linear_value_heads: NonNegInt = Field(
        0, description="Gated DeltaNet value heads (linear_num_value_heads); default 0")
    linear_value_head_dim: NonNegInt = Field(
        0, description="Gated DeltaNet value head width (linear_value_head_dim); default 0")
    linear_conv_kernel: NonNegInt = Field(
        0, description="Gated DeltaNet short-convolution width (linear_conv_kernel_dim); default 0")
    mamba_ssm_dtype: Literal["fp32", "bf16"] = Field(
        "fp32", description="Recurrent (SSM) state dtype of linear-attention layers (SGLang "
        "--mamba-ssm-dtype; default float32); the conv state is BF16")
    intermediate_size: NonNegInt = Field(0, description="Dense MLP width")
    dense_layers: NonNegInt = Field(0, description="MoE models: leading dense layers "
                                    "(first_k_dense_replace); dense models: ignored")
    experts: NonNegInt = Field(0, description="n_routed_experts (0: dense model)")
    experts_per_token: NonNegInt = Field(0, description="num_experts_per_tok")
    moe_intermediate_size: NonNegInt = Field(0, description="MoE: one expert's MLP width "
                                             "(moe_intermediate_size)")
    shared_experts: NonNegInt = Field(0, description="n_shared_experts")
    shared_expert_intermediate_size: NonNegInt = Field(
        0, description="Width of all shared experts together (Qwen: shared_expert_intermediate_"
        "size); 0: shared_experts x moe_intermediate_size (DeepSeek)")
    vocab_size: PosInt = Field(description="vocab_size (the LM head's width)")
    context_len: PosInt | None = Field(
        None, description="SGLang's context length (model_config.context_len, "
        "get_context_length: the first of max_sequence_length, seq_length, max_seq_len, "
        "model_max_length, max_position_embeddings, times a rope_scaling factor unless the "
        "scaling names original_max_position_embeddings or is llama3). It sizes the request "
        "slots SGLang gives a rank when max_running_requests is unset; default null: not "
        "known, the slots' floor (2,048) is taken")
    tie_word_embeddings: bool = Field(False, description="tie_word_embeddings: the LM head is "
                                      "the embedding table (its weights stored once)")
    vision_layers: NonNegInt = Field(0, description="Vision tower depth (vision_config."
                                     "num_hidden_layers) of a VLM; 0: text only. SGLang lowers "
                                     "its default mem_fraction_static by it")
    vision_hidden_size: NonNegInt = Field(
        0, description="Vision tower width (vision_config.hidden_size); default 0")
    weight_dtype: Dtype = Field("bf16", description="Linear-layer weights: bf16; fp8 (W8A8); "
                                "fp8_block (128x128-block scales, W8A8); int4 (W4A16); nvfp4 "
                                "(W4A4 on FP4 tensor cores); mxfp4")
    expert_dtype: Dtype | None = Field(None, description="Routed experts' weights when they "
                                       "differ (gpt-oss: mxfp4 experts, BF16 elsewhere); "
                                       "default weight_dtype")
    kv_dtype: Literal["bf16", "fp8"] = Field("bf16", description="KV cache dtype (--kv-cache-"
                                             "dtype; fp8: fp8_e4m3); default bf16 (auto: the "
                                             "model dtype)")
    params_total_b: Pos | None = Field(None, description="Published total parameters "
                                       "(billions), a cross-check of the architecture")
    fitted: dict[str, dict[FittedKey, Coefficient]] | None = Field(
        None, description=f"Fitted-predictor coefficients per GPU name (ms terms, finite, "
        f"0..{MAX_COEFFICIENT_MS:g})")

    def inconsistency(self) -> tuple[tuple[str, ...], str] | None:
        """Fields that contradict each other (the first of them to blame, unless another was
        overridden) and why; None when the architecture holds together. Each field is valid
        alone, but a GQA model without KV heads, or top-8 routing over 2 experts, has no KV or
        a negative share of idle experts, which no step time can be made of."""
        if self.attention == "gqa":
            for f in ("kv_heads", "head_dim"):
                if getattr(self, f) < 1:
                    hint = "; an MLA profile?" if self.kv_lora_rank else ""
                    return (f, "attention"), (f"attention gqa needs {f} >= 1 ({f} is "
                                              f"{getattr(self, f)}{hint})")
            if self.heads % self.kv_heads:  # (each KV head serves a whole group of heads)
                return ("kv_heads", "heads"), (
                    f"attention gqa needs heads ({self.heads}) to be a multiple of kv_heads "
                    f"({self.kv_heads}): num_attention_heads / num_key_value_heads query heads "
                    f"share each KV head")
        else:
            for f in ("kv_lora_rank", "v_head_dim"):
                if getattr(self, f) < 1:
                    return (f, "attention"), (f"attention mla needs {f} >= 1 ({f} is "
                                              f"{getattr(self, f)})")
            if self.qk_nope_head_dim + self.qk_rope_head_dim < 1:
                return ("qk_rope_head_dim", "attention"), (
                    "attention mla needs qk_nope_head_dim + qk_rope_head_dim >= 1")
        if self.is_moe:
            if not 1 <= self.experts_per_token <= self.experts:
                return ("experts_per_token", "experts"), (
                    f"a MoE model routes each token to 1..experts ({self.experts}) experts; "
                    f"experts_per_token is {self.experts_per_token}")
            if self.moe_intermediate_size < 1:
                return ("moe_intermediate_size", "experts"), (
                    "a MoE model (experts > 0) needs moe_intermediate_size >= 1")
        elif self.intermediate_size < 1:
            return ("intermediate_size", "experts"), (
                "a dense model (experts 0) needs intermediate_size >= 1")
        return self._hybrid_inconsistency()

    def _hybrid_inconsistency(self) -> tuple[tuple[str, ...], str] | None:
        if self.linear_attention_layers + self.sliding_window_layers > self.layers:
            return ("linear_attention_layers", "layers"), (
                f"linear_attention_layers + sliding_window_layers "
                f"({self.linear_attention_layers} + {self.sliding_window_layers}) exceed "
                f"layers ({self.layers})")
        if self.sliding_window_layers and self.sliding_window < 1:
            return ("sliding_window", "sliding_window_layers"), (
                "sliding_window_layers > 0 needs sliding_window >= 1")
        if self.linear_attention_layers:
            for f in ("linear_key_heads", "linear_key_head_dim", "linear_value_heads",
                      "linear_value_head_dim", "linear_conv_kernel"):
                if getattr(self, f) < 1:
                    return (f, "linear_attention_layers"), (
                        f"linear_attention_layers > 0 needs {f} >= 1")
            if self.linear_value_heads % self.linear_key_heads:
                return ("linear_value_heads", "linear_key_heads"), (
                    "linear_value_heads must be a multiple of linear_key_heads")
        if self.index_topk:
            if self.attention != "mla":
                return ("index_topk", "attention"), (
                    "sparse attention (index_topk) is modelled on MLA only (DeepSeek-V3.2, "
                    "GLM-5)")
            for f in ("index_head_dim", "index_n_heads"):
                if getattr(self, f) < 1:
                    return (f, "index_topk"), f"index_topk > 0 needs {f} >= 1"
        return None

    # --- derived sizes ------------------------------------------------------------------

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def moe_layers(self) -> int:
        return max(0, self.layers - self.dense_layers) if self.is_moe else 0

    @property
    def dense_mlp_layers(self) -> int:
        return self.layers - self.moe_layers

    @property
    def attention_layers(self) -> int:
        """Layers with softmax attention (full, sparse or sliding-window)."""
        return self.layers - self.linear_attention_layers

    @property
    def full_attention_layers(self) -> int:
        """Layers whose KV grows with the sequence (full or sparse attention)."""
        return self.attention_layers - self.sliding_window_layers

    @property
    def is_hybrid(self) -> bool:
        """Layers of more than one attention kind, or sparse attention."""
        return bool(self.linear_attention_layers or self.sliding_window_layers
                    or self.index_topk)

    @property
    def weight_bytes(self) -> float:
        """Bytes per linear-layer weight."""
        return DTYPE_BYTES[self.weight_dtype]

    @property
    def expert_format(self) -> str:
        return self.expert_dtype or self.weight_dtype

    @property
    def expert_weight_bytes(self) -> float:
        """Bytes per routed-expert weight."""
        return DTYPE_BYTES[self.expert_format]

    @property
    def kv_dtype_bytes(self) -> float:
        return KV_DTYPE_BYTES[self.kv_dtype]

    @property
    def kv_per_layer(self) -> int:
        """KV elements one token stores per layer (all KV heads; MLA: the latent)."""
        if self.attention == "mla":
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.kv_heads * self.head_dim

    @property
    def kv_layer_token_bytes(self) -> float:
        """KV bytes one token stores in one attention layer (all KV heads). DSA keeps FP8 MLA
        latents with an FP32 scale per 128 values and the RoPE part in BF16 (SGLang
        calculate_mla_kv_cache_dim), plus the indexer's FP8 key and its scale per layer
        (NSATokenToKVPool: index_head_dim + index_head_dim // 128 * 4 bytes)."""
        if self.index_topk:
            if self.kv_dtype == "fp8":
                main = self.kv_lora_rank + self.kv_lora_rank // 128 * 4 + \
                    self.qk_rope_head_dim * 2
            else:
                main = self.kv_per_layer * self.kv_dtype_bytes
            return main + self.index_head_dim + self.index_head_dim // 128 * 4
        return self.kv_per_layer * self.kv_dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes one token occupies on one GPU holding all KV heads (no TP split), over the
        layers whose KV grows with the sequence (sliding-window layers keep only the window's;
        linear-attention layers a fixed state: :attr:`state_bytes_per_request`)."""
        return int(self.full_attention_layers * self.kv_layer_token_bytes)

    @property
    def window_kv_bytes(self) -> int:
        """KV bytes a request holds at most in its sliding-window layers (all KV heads)."""
        return int(self.sliding_window_layers * self.sliding_window * self.kv_layer_token_bytes)

    def state_bytes_per_request(self, attn_tp: int = 1) -> int:
        """Recurrent state of one request on one of ``attn_tp`` GPUs (SGLang
        Mamba2StateShape: conv (V*Dv + 2*K*Dk) x (kernel - 1) in BF16, SSM V*Dv*Dk in
        mamba_ssm_dtype, heads and conv channels split over attention TP), all linear layers."""
        if not self.linear_attention_layers:
            return 0
        conv = (self.linear_value_heads * self.linear_value_head_dim
                + 2 * self.linear_key_heads * self.linear_key_head_dim) // attn_tp
        conv *= self.linear_conv_kernel - 1
        ssm = (self.linear_value_heads // attn_tp) * self.linear_value_head_dim * \
            self.linear_key_head_dim
        ssm_bytes = 4 if self.mamba_ssm_dtype == "fp32" else 2
        return (conv * 2 + ssm * ssm_bytes) * self.linear_attention_layers

    def kv_bytes_per_token_sent(self, tp: int, dp_attention: bool) -> int:
        """Bytes a prefill rank sends per token.

        MLA has one latent head, and DP attention keeps a request on one GPU: no replication.
        GQA under TP splits KV heads over ranks; when tp > kv_heads the heads are replicated and
        every replica is sent (docs/model/transfer.md): factor ``max(1, tp / kv_heads)``.
        """
        base = self.kv_bytes_per_token
        if self.attention == "mla" or dp_attention:
            return base
        return int(base * max(1.0, tp / self.kv_heads))

    @property
    def attn_params(self) -> tuple[int, int]:
        """Attention weights per layer: (replicated under attention TP, split by heads)."""
        h = self.hidden_size
        if self.attention == "mla":
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            if self.q_lora_rank:
                rep_q, q = h * self.q_lora_rank, self.q_lora_rank * self.heads * qk
            else:
                rep_q, q = 0, h * self.heads * qk
            kv_a = h * (self.kv_lora_rank + self.qk_rope_head_dim)
            kv_b = self.kv_lora_rank * self.heads * (self.qk_nope_head_dim + self.v_head_dim)
            o = self.heads * self.v_head_dim * h
            return rep_q + kv_a + self.indexer_params, q + kv_b + o
        q = (2 if self.attn_output_gate else 1) * h * self.heads * self.head_dim
        return 0, q + h * self.heads * self.head_dim + 2 * h * self.kv_heads * self.head_dim

    @property
    def indexer_params(self) -> int:
        """DSA indexer weights per layer (query from the q latent, one key, per-head weights)."""
        if not self.index_topk:
            return 0
        q_in = self.q_lora_rank or self.hidden_size
        return (q_in * self.index_n_heads * self.index_head_dim
                + self.hidden_size * self.index_head_dim + self.hidden_size * self.index_n_heads)

    @property
    def linear_attn_params(self) -> int:
        """Gated DeltaNet weights per layer: in_proj_qkvz, in_proj_ba, the conv and out_proj."""
        if not self.linear_attention_layers:
            return 0
        h = self.hidden_size
        k = self.linear_key_heads * self.linear_key_head_dim
        v = self.linear_value_heads * self.linear_value_head_dim
        conv = (2 * k + v) * self.linear_conv_kernel
        return h * (2 * k + 2 * v) + h * 2 * self.linear_value_heads + conv + v * h

    @property
    def expert_params(self) -> int:
        return 3 * self.hidden_size * self.moe_intermediate_size

    @property
    def shared_params(self) -> int:
        """All shared experts of one MoE layer."""
        width = self.shared_expert_intermediate_size or \
            self.shared_experts * self.moe_intermediate_size
        return 3 * self.hidden_size * width if self.shared_experts else 0

    @property
    def dense_mlp_params(self) -> int:
        return 3 * self.hidden_size * self.intermediate_size

    @property
    def embedding_params(self) -> int:
        """The embedding table and the LM head (once if tied)."""
        return (1 if self.tie_word_embeddings else 2) * self.vocab_size * self.hidden_size

    def _layers_params(self, experts: int) -> float:
        rep, shard = self.attn_params
        moe = experts * self.expert_params + self.shared_params + \
            self.hidden_size * self.experts
        return (self.attention_layers * (rep + shard)
                + self.linear_attention_layers * self.linear_attn_params
                + self.dense_mlp_layers * self.dense_mlp_params + self.moe_layers * moe)

    @property
    def params_total(self) -> float:
        """Parameters from the architecture (embeddings and LM head included)."""
        return self._layers_params(self.experts) + self.embedding_params

    @property
    def params_active(self) -> float:
        return self._layers_params(self.experts_per_token) + 2 * self.vocab_size * \
            self.hidden_size - self.hidden_size * self.experts * self.moe_layers

    @property
    def params_active_b(self) -> float:
        return self.params_active / 1e9

    @property
    def weight_bytes_total(self) -> float:
        """Checkpoint bytes: routed experts at ``expert_dtype``, other linear layers at
        ``weight_dtype``, embeddings and head in BF16."""
        emb = self.embedding_params
        if self.expert_format == self.weight_dtype:
            return (self.params_total - emb) * self.weight_bytes + emb * 2.0
        routed = self.moe_layers * self.experts * self.expert_params
        rest = self.params_total - emb - routed
        return rest * self.weight_bytes + routed * self.expert_weight_bytes + emb * 2.0


KINDS = {"gpus": GPU, "models": Model, "engines": Engine}
SECTION = {"gpu": "gpus", "model": "models", "engine": "engines"}


def _override_model(cls: type[_Profile], name: str) -> type[BaseModel]:
    """The same fields and constraints, all optional: what a scenario's inline override may
    set."""
    fields: dict[str, Any] = {}
    for fname, f in cls.model_fields.items():
        if fname in ("name", "fitted"):
            continue
        typ = Annotated.__class_getitem__((f.annotation, *f.metadata)) if f.metadata else \
            f.annotation
        fields[fname] = (typ | None, Field(None, description=f.description))
    return create_model(name, __config__=ConfigDict(extra="forbid"), **fields)


GPUOverrides = _override_model(GPU, "GPUOverrides")
ModelOverrides = _override_model(Model, "ModelOverrides")
EngineOverrides = _override_model(Engine, "EngineOverrides")

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
Dtype = Literal["bf16", "fp8", "int4"]

DTYPE_BYTES = {"bf16": 2.0, "fp8": 1.0, "int4": 0.5}


class ProfileError(ValueError):
    """A profile that cannot be used; ``str()`` is the one-line message."""


class _Profile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)
    name: str = ""


class GPU(_Profile):
    """One GPU and its node: peak rates, memory, links, and achieved-fraction parameters."""

    bf16_tflops: Pos = Field(description="Dense BF16 tensor-core TFLOP/s")
    fp8_tflops: Pos = Field(description="Dense FP8 TFLOP/s (parts without FP8: the BF16 rate)")
    hbm_gb: Pos = Field(description="Device memory, GB")
    hbm_tbps: Pos = Field(description="Device memory bandwidth, TB/s")
    nvlink_gbps: Pos = Field(description="GPU-to-GPU bandwidth per direction, GB/s (PCIe-only "
                             "parts: the PCIe rate)")
    nic_gbps: Pos = Field(description="RDMA NIC line rate, Gb/s")
    gpus_per_nic: PosInt = Field(description="GPUs sharing one NIC")
    gpus_per_node: PosInt = Field(8, description="GPUs per node (NVLink domain)")
    gemm_eff: Frac = Field(description="Fraction of peak FLOP/s large GEMMs reach")
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


class Engine(_Profile):
    """The serving engine's CPU-side costs (per forward, per layer, per request)."""

    prefill_step_ms: NonNeg = Field(description="Per prefill forward: scheduling, batch "
                                    "preparation, sampling")
    decode_step_ms: NonNeg = Field(description="Per decode step (CUDA graph replay, sampling, "
                                   "output processing)")
    prefill_layer_us: NonNeg = Field(description="Per layer per prefill forward: kernel launch "
                                     "gaps (eager mode)")
    decode_layer_us: NonNeg = Field(description="Per layer per decode step: gaps between "
                                    "kernels inside the CUDA graph")
    bootstrap_ms: NonNeg = Field(description="Per request on the TTFT path: the PD bootstrap "
                                 "handshake before the prefill may run")
    tokenize_us_per_token: NonNeg = Field(description="Per prompt token on the TTFT path: "
                                          "tokenization in the server's tokenizer manager")
    tbo_overlap: Frac = Field(description="Two-batch overlap: share of the shorter of "
                              "computation and communication hidden under the longer")


class Model(_Profile):
    """A transformer's architecture (Hugging Face ``config.json`` names in the descriptions)."""

    attention: Literal["gqa", "mla"] = Field(description="gqa (incl. MHA) or mla")
    layers: PosInt = Field(description="num_hidden_layers")
    hidden_size: PosInt = Field(description="hidden_size (model width)")
    heads: PosInt = Field(description="num_attention_heads")
    kv_heads: NonNegInt = Field(0, description="num_key_value_heads (GQA)")
    head_dim: NonNegInt = Field(0, description="GQA head dimension")
    q_lora_rank: NonNegInt = Field(0, description="MLA query compression (0: none)")
    kv_lora_rank: NonNegInt = Field(0, description="MLA latent KV width")
    qk_nope_head_dim: NonNegInt = Field(0, description="MLA per-head query/key width without "
                                        "RoPE (qk_nope_head_dim)")
    qk_rope_head_dim: NonNegInt = Field(0, description="MLA per-head query/key RoPE width "
                                        "(qk_rope_head_dim)")
    v_head_dim: NonNegInt = Field(0, description="MLA per-head value width (v_head_dim)")
    intermediate_size: NonNegInt = Field(0, description="Dense MLP width")
    dense_layers: NonNegInt = Field(0, description="MoE models: leading dense layers "
                                    "(first_k_dense_replace); dense models: ignored")
    experts: NonNegInt = Field(0, description="n_routed_experts (0: dense model)")
    experts_per_token: NonNegInt = Field(0, description="num_experts_per_tok")
    moe_intermediate_size: NonNegInt = Field(0, description="MoE: one expert's MLP width "
                                             "(moe_intermediate_size)")
    shared_experts: NonNegInt = Field(0, description="n_shared_experts")
    vocab_size: PosInt = Field(description="vocab_size (the LM head's width)")
    weight_dtype: Dtype = Field("bf16", description="Linear-layer weights: bf16, fp8 or int4 "
                                "(W4A16: computes at the BF16 rate)")
    kv_dtype: Literal["bf16", "fp8"] = Field("bf16", description="KV cache dtype")
    params_total_b: Pos | None = Field(None, description="Published total parameters "
                                       "(billions), a cross-check of the architecture")
    fitted: dict[str, dict[str, float]] | None = Field(
        None, description="Fitted-predictor coefficients per GPU name")

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
    def weight_bytes(self) -> float:
        """Bytes per linear-layer weight."""
        return DTYPE_BYTES[self.weight_dtype]

    @property
    def kv_dtype_bytes(self) -> float:
        return DTYPE_BYTES[self.kv_dtype]

    @property
    def kv_per_layer(self) -> int:
        """KV elements one token stores per layer (all KV heads; MLA: the latent)."""
        if self.attention == "mla":
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.kv_heads * self.head_dim

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes one token occupies on one GPU holding all KV heads (no TP split)."""
        return int(self.layers * self.kv_per_layer * self.kv_dtype_bytes)

    def kv_bytes_per_token_sent(self, tp: int, dp_attention: bool) -> int:
        """Bytes a prefill rank sends per token.

        MLA has one latent head, and DP attention keeps a request on one GPU: no replication.
        GQA under TP splits KV heads over ranks; when tp > kv_heads the heads are replicated and
        every replica is sent (reference section 6): factor ``max(1, tp / kv_heads)``.
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
            return rep_q + kv_a, q + kv_b + o
        return 0, 2 * h * self.heads * self.head_dim + 2 * h * self.kv_heads * self.head_dim

    @property
    def expert_params(self) -> int:
        return 3 * self.hidden_size * self.moe_intermediate_size

    @property
    def dense_mlp_params(self) -> int:
        return 3 * self.hidden_size * self.intermediate_size

    @property
    def params_total(self) -> float:
        """Parameters from the architecture (embeddings and LM head counted separately)."""
        rep, shard = self.attn_params
        per_attn = rep + shard
        moe = (self.experts + self.shared_experts) * self.expert_params + \
            self.hidden_size * self.experts
        total = self.layers * per_attn + self.dense_mlp_layers * self.dense_mlp_params + \
            self.moe_layers * moe
        return total + 2 * self.vocab_size * self.hidden_size

    @property
    def params_active(self) -> float:
        rep, shard = self.attn_params
        moe = (self.experts_per_token + self.shared_experts) * self.expert_params
        return (self.layers * (rep + shard) + self.dense_mlp_layers * self.dense_mlp_params
                + self.moe_layers * moe + 2 * self.vocab_size * self.hidden_size)

    @property
    def params_active_b(self) -> float:
        return self.params_active / 1e9

    @property
    def weight_bytes_total(self) -> float:
        """Checkpoint bytes: linear layers at ``weight_dtype``, embeddings and head in BF16."""
        emb = 2 * self.vocab_size * self.hidden_size
        return (self.params_total - emb) * self.weight_bytes + emb * 2.0


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

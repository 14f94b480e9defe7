"""A model profile from a Hugging Face ``config.json`` (``pdsim profiles import``).

:func:`profile_from_config` reads the keys pdsim models (names as in ``config.json``) for the
architectures it knows and returns a profile entry ``{field: {value, source}}``, each value's
source naming the key it came from; :func:`profile_yaml` wraps it as a user profile file
(``models: {NAME: ...}``) a scenario loads with ``profiles:``. An architecture, a layer type or
a quantization pdsim does not model is refused in one line naming it (never guessed).

Known architectures, by what their layers are:

- dense GQA/MHA: ``LlamaForCausalLM``, ``MistralForCausalLM`` (no sliding window),
  ``Qwen2ForCausalLM``, ``Qwen3ForCausalLM``;
- MoE GQA: ``Qwen2MoeForCausalLM``, ``Qwen3MoeForCausalLM`` (shared expert of
  ``shared_expert_intermediate_size``);
- MLA MoE: ``DeepseekV2ForCausalLM``, ``DeepseekV3ForCausalLM`` (shared experts, the first
  ``first_k_dense_replace`` layers dense); with DeepSeek sparse attention (``index_topk``):
  ``DeepseekV32ForCausalLM``, ``GlmMoeDsaForCausalLM`` (GLM-5);
- MoE with sliding-window layers: ``GptOssForCausalLM`` (``layer_types``, ``sliding_window``;
  MXFP4 experts);
- hybrid Gated DeltaNet + gated attention, MoE: ``Qwen3NextForCausalLM``,
  ``Qwen3_5MoeForConditionalGeneration`` (its ``text_config``; ``vision_config`` sizes the
  vision tower SGLang budgets memory for).

Weights: ``quantization_config`` ``fp8`` (``weight_block_size``: fp8_block), ``mxfp4`` (the
modules outside ``modules_to_not_convert``: gpt-oss's experts), ``modelopt`` NVFP4 or FP8,
``gptq``/``awq`` 4-bit (int4); else the checkpoint's dtype (BF16/FP16: bf16).
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

import yaml

from pdsim.config.profile_schema import Model, ProfileError
from pdsim.util.safeio import UserFileError, decode_utf8, echo, read_user_file, show_path
from pdsim.util.safeyaml import YamlError, parse_json

MAX_CONFIG_BYTES = 1 << 20  # a config.json is a few kB

FAMILIES = {
    "LlamaForCausalLM": "dense", "MistralForCausalLM": "dense", "Qwen2ForCausalLM": "dense",
    "Qwen3ForCausalLM": "dense",
    "Qwen2MoeForCausalLM": "qwen_moe", "Qwen3MoeForCausalLM": "qwen_moe",
    "DeepseekV2ForCausalLM": "deepseek", "DeepseekV3ForCausalLM": "deepseek",
    "DeepseekV32ForCausalLM": "deepseek", "GlmMoeDsaForCausalLM": "deepseek",
    "GptOssForCausalLM": "gpt_oss",
    "Qwen3NextForCausalLM": "qwen_next", "Qwen3_5MoeForConditionalGeneration": "qwen_next",
    "Qwen3_5MoeForCausalLM": "qwen_next",
}
# layer_types values -> the kind pdsim models them as
LAYER_TYPES = {"full_attention": "full", "sliding_attention": "sliding",
               "linear_attention": "linear", "deepseek_sparse_attention": "full"}


class ConfigImportError(ValueError):
    """A config pdsim cannot make a profile of; ``str()`` is one line."""


def read_config(path: str | os.PathLike) -> dict:
    """A ``config.json`` read as user input (a regular file, at most 1 MB, strict UTF-8, JSON
    nested at most 50 levels with integers of at most 100 digits)."""
    where = show_path(path)
    try:
        text = decode_utf8(read_user_file(path, "config.json", MAX_CONFIG_BYTES), where)
    except UserFileError as err:
        raise ConfigImportError(str(err)) from None
    try:  # (bounded: nesting and integer digits, as a YAML file's)
        data = parse_json(text, where)
    except YamlError as err:
        raise ConfigImportError(str(err)) from None
    if not isinstance(data, dict):
        raise ConfigImportError(f"{where}: a config.json is a JSON object")
    return data


MOE = "a MoE layer routes to at least one expert"


class _Reader:
    """Reads keys of one config (its ``text_config`` first, for a VLM) and notes each value's
    source."""

    def __init__(self, cfg: dict, source: str) -> None:
        self.top = cfg
        text = cfg.get("text_config")
        self.cfg = text if isinstance(text, dict) else cfg
        self.source = source
        self.out: dict[str, dict[str, Any]] = {}

    def get(self, key: str, default: Any = None) -> Any:
        if key in self.cfg:
            return self.cfg[key]
        return self.top.get(key, default)

    def where(self, key: str) -> str:
        nested = "text_config." if key in self.cfg and self.cfg is not self.top else ""
        return f"{self.source}: {nested}{key}"

    def need(self, key: str, kind: type = int) -> Any:
        value = self.get(key)
        if value is None:
            raise ConfigImportError(f"{self.source}: no {key!r}; pdsim needs it for "
                                    f"{self.get('architectures', ['this model'])[0]}")
        if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigImportError(f"{self.source}: {key!r} must be an integer, got "
                                    f"{echo(value)}")
        return value

    def positive(self, key: str, hint: str) -> int:
        """``key``'s integer value, at least 1: a count or size of 0 is no model (0 KV heads
        read as MHA, a head_dim of 0 fell back to hidden_size / heads, 0 routed experts made a
        MoE config dense), so it is refused rather than read as "absent"."""
        value = self.need(key)
        if value < 1:
            raise ConfigImportError(f"{self.where(key)} is {value}: it must be at least 1 "
                                    f"({hint})")
        return value

    def put(self, field: str, value: Any, note: str) -> None:
        self.out[field] = {"value": value, "source": note}

    def take(self, field: str, key: str, default: Any = None, required: bool = True) -> None:
        """``field`` from config key ``key`` (or ``default``, noted so, when absent)."""
        if self.get(key) is None and not required:
            if default is not None:
                self.put(field, default, f"{self.source}: no {key}; default {default}")
            return
        self.put(field, self.need(key), self.where(key))


def _architecture(r: _Reader) -> tuple[str, str]:
    archs = r.top.get("architectures")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise ConfigImportError(f"{r.source}: no 'architectures' list; pdsim knows: "
                                f"{', '.join(sorted(FAMILIES))}")
    arch = archs[0]
    if arch not in FAMILIES:
        raise ConfigImportError(f"{r.source}: architecture {arch!r} is not one pdsim models "
                                f"(known: {', '.join(sorted(FAMILIES))})")
    return arch, FAMILIES[arch]


def _layer_kinds(r: _Reader, family: str, layers: int) -> dict[str, int]:
    """Layers of each kind, from ``layer_types`` (or Qwen-Next's ``full_attention_interval``)."""
    types = r.get("layer_types")
    if types is None and family == "qwen_next":
        every = r.need("full_attention_interval")
        types = ["full_attention" if (i + 1) % every == 0 else "linear_attention"
                 for i in range(layers)]
    if types is None:
        if r.get("use_sliding_window") or (family == "dense" and r.get("sliding_window")
                                          and r.get("model_type") == "mistral"):
            raise ConfigImportError(f"{r.source}: a sliding window without layer_types (which "
                                    f"layers slide) is not modelled")
        return {"full": layers}
    if not isinstance(types, list) or len(types) != layers:
        raise ConfigImportError(f"{r.source}: layer_types must list num_hidden_layers "
                                f"({layers}) entries")
    counts: dict[str, int] = {}
    for t in types:
        kind = LAYER_TYPES.get(t)
        if kind is None:
            raise ConfigImportError(f"{r.source}: layer type {t!r} is not one pdsim models "
                                    f"(known: {', '.join(LAYER_TYPES)})")
        counts[kind] = counts.get(kind, 0) + 1
    return counts


def _weights(r: _Reader, family: str) -> None:
    """weight_dtype / expert_dtype from quantization_config (else the checkpoint dtype)."""
    q = r.get("quantization_config")
    if q is None:
        dtype = r.get("torch_dtype") or r.get("dtype") or "bfloat16"
        if dtype not in ("bfloat16", "float16", "float32"):
            raise ConfigImportError(f"{r.source}: checkpoint dtype {dtype!r} without a "
                                    f"quantization_config is not modelled")
        key = "torch_dtype" if r.get("torch_dtype") else "dtype"
        r.put("weight_dtype", "bf16", f"{r.source}: {key} {dtype}, no quantization_config "
              f"(SGLang serves it in BF16)")
        return
    if not isinstance(q, dict):
        raise ConfigImportError(f"{r.source}: quantization_config must be an object")
    method = str(q.get("quant_method", "")).lower()
    note = f"{r.source}: quantization_config"
    if method == "fp8":
        block = q.get("weight_block_size")
        r.put("weight_dtype", "fp8_block" if block else "fp8",
              f"{note} quant_method fp8" + (f", weight_block_size {block}" if block else ""))
    elif method == "mxfp4":
        skip = " ".join(str(m) for m in q.get("modules_to_not_convert") or [])
        if "self_attn" in skip:
            r.put("weight_dtype", "bf16", f"{note} mxfp4, modules_to_not_convert: attention, "
                  f"router, embeddings and LM head stay BF16")
            r.put("expert_dtype", "mxfp4", f"{note} quant_method mxfp4 (the experts)")
        else:
            r.put("weight_dtype", "mxfp4", f"{note} quant_method mxfp4")
    elif method == "modelopt" and str(q.get("quant_algo", "")).upper() in ("NVFP4", "FP8"):
        algo = str(q["quant_algo"]).upper()
        r.put("weight_dtype", "nvfp4" if algo == "NVFP4" else "fp8",
              f"{note} modelopt quant_algo {algo}")
    elif method in ("gptq", "awq") and q.get("bits") == 4:
        r.put("weight_dtype", "int4", f"{note} {method} 4-bit (W4A16)")
    else:
        what = method or "(no quant_method)"
        raise ConfigImportError(f"{r.source}: quantization {what!r} is not one pdsim models "
                                f"(fp8, fp8 block, mxfp4, modelopt NVFP4/FP8, gptq/awq 4-bit)")


CONTEXT_LENGTH_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length",
                       "max_position_embeddings")  # SGLang's order (hf_transformers_utils.py)


def _context_len(r: _Reader) -> None:
    """``context_len`` as SGLang's ``get_context_length`` reads it (utils/
    hf_transformers_utils.py@0.5.9): the first context-length key, times the rope_scaling
    factor unless the scaling names original_max_position_embeddings or is llama3."""
    for key in CONTEXT_LENGTH_KEYS:
        if r.get(key) is None:
            continue
        val = r.positive(key, "the context length SGLang reads from the first of "
                         f"{', '.join(CONTEXT_LENGTH_KEYS)} that is set")
        rope = r.get("rope_scaling")
        factor: float = 1
        if isinstance(rope, dict) and "original_max_position_embeddings" not in rope \
                and rope.get("rope_type") != "llama3":
            factor = rope.get("factor", 1)
            if (isinstance(factor, bool) or not isinstance(factor, int | float)
                    or not math.isfinite(factor) or not 0 < factor <= 1024):
                raise ConfigImportError(f"{r.where('rope_scaling')}.factor is "
                                        f"{echo(factor)}: give a number in (0, 1024] (it "
                                        f"scales {key} {val})")
        scaled = f" x rope_scaling.factor {factor}" if factor != 1 else ""
        r.put("context_len", int(factor * val), f"{r.where(key)}{scaled} (SGLang's "
              f"get_context_length)")
        return


def profile_from_config(cfg: dict, source: str = "config.json") -> dict[str, dict[str, Any]]:
    """The model profile entry a ``config.json`` describes: ``{field: {value, source}}``."""
    r = _Reader(cfg, source)
    arch, family = _architecture(r)
    r.put("architecture", arch, f"{source}: architectures[0]")
    layers = r.need("num_hidden_layers")
    r.put("layers", layers, r.where("num_hidden_layers"))
    for field, key in (("hidden_size", "hidden_size"), ("heads", "num_attention_heads"),
                       ("vocab_size", "vocab_size")):
        r.take(field, key)
    tie = bool(r.get("tie_word_embeddings", False))
    r.put("tie_word_embeddings", tie, r.where("tie_word_embeddings")
          if r.get("tie_word_embeddings") is not None else f"{source}: default false")
    kinds = _layer_kinds(r, family, layers)
    if family == "deepseek":
        _deepseek(r)
    else:
        _gqa(r, family)
    if kinds.get("sliding"):
        r.put("sliding_window_layers", kinds["sliding"], f"{source}: layer_types "
              f"sliding_attention ({kinds['sliding']} of {layers})")
        r.take("sliding_window", "sliding_window")
    if kinds.get("linear"):
        r.put("linear_attention_layers", kinds["linear"], f"{source}: layer_types "
              f"linear_attention ({kinds['linear']} of {layers})")
        for field, key in (("linear_key_heads", "linear_num_key_heads"),
                           ("linear_key_head_dim", "linear_key_head_dim"),
                           ("linear_value_heads", "linear_num_value_heads"),
                           ("linear_value_head_dim", "linear_value_head_dim"),
                           ("linear_conv_kernel", "linear_conv_kernel_dim")):
            r.take(field, key)
        ssm = r.get("mamba_ssm_dtype")
        if ssm is not None:
            r.put("mamba_ssm_dtype", "bf16" if "bf" in str(ssm) else "fp32",
                  r.where("mamba_ssm_dtype"))
    _context_len(r)
    vision = r.top.get("vision_config")
    if isinstance(vision, dict):
        depth = vision.get("depth", vision.get("num_hidden_layers"))
        if isinstance(depth, int):
            r.put("vision_layers", depth, f"{source}: vision_config.depth")
            r.put("vision_hidden_size", int(vision.get("hidden_size", 1024)),
                  f"{source}: vision_config.hidden_size")
    _weights(r, family)
    r.put("kv_dtype", "bf16", "SGLang --kv-cache-dtype auto: the model dtype (set fp8 for "
                              "fp8_e4m3)")
    return r.out


def _gqa(r: _Reader, family: str) -> None:
    s = r.source
    r.put("attention", "gqa", f"{s}: {family} attention (GQA/MHA)")
    heads = r.need("num_attention_heads")
    given = r.get("num_key_value_heads") is not None
    kv = r.positive("num_key_value_heads", "leave it out for MHA") if given else heads
    r.put("kv_heads", kv,
          r.where("num_key_value_heads") if given else f"{s}: no num_key_value_heads: MHA")
    hd = (r.positive("head_dim", "leave it out for hidden_size / num_attention_heads")
          if r.get("head_dim") is not None else None)
    r.put("head_dim", hd or r.need("hidden_size") // heads,
          r.where("head_dim") if hd else f"{s}: hidden_size / num_attention_heads")
    if r.get("attn_output_gate"):
        r.put("attn_output_gate", True, r.where("attn_output_gate"))
    elif family == "qwen_next" and r.get("attn_output_gate") is None:
        r.put("attn_output_gate", True, f"{s}: no attn_output_gate; Qwen3-Next's gated "
              f"attention (its config default, true)")
    if family == "dense":
        r.take("intermediate_size", "intermediate_size")
        return
    if family == "gpt_oss":
        r.take("experts", "num_local_experts")
        key = "num_experts_per_tok" if r.get("num_experts_per_tok") else "experts_per_token"
        r.take("experts_per_token", key)
        r.put("moe_intermediate_size", r.need("intermediate_size"),
              f"{s}: intermediate_size (per expert)")
        return
    r.put("experts", r.positive("num_experts", MOE), r.where("num_experts"))
    r.take("experts_per_token", "num_experts_per_tok")
    r.take("moe_intermediate_size", "moe_intermediate_size")
    if r.get("decoder_sparse_step", 1) != 1:
        raise ConfigImportError(f"{s}: decoder_sparse_step {r.get('decoder_sparse_step')} "
                                f"(MoE every few layers) is not modelled")
    dense = list(r.get("mlp_only_layers") or [])
    if dense and dense != list(range(len(dense))):
        raise ConfigImportError(f"{s}: mlp_only_layers {echo(dense)} (dense layers other than "
                                f"the first ones) is not modelled")
    r.put("dense_layers", len(dense), r.where("mlp_only_layers") if dense else
          f"{s}: mlp_only_layers [] (every layer MoE)")
    if dense:
        r.take("intermediate_size", "intermediate_size")
    shared = r.get("shared_expert_intermediate_size") or 0
    if shared:
        r.put("shared_experts", 1, f"{s}: one shared expert (shared_expert_intermediate_size)")
        r.put("shared_expert_intermediate_size", shared,
              r.where("shared_expert_intermediate_size"))


def _deepseek(r: _Reader) -> None:
    s = r.source
    r.put("attention", "mla", f"{s}: MLA (kv_lora_rank)")
    r.put("q_lora_rank", r.get("q_lora_rank") or 0,
          r.where("q_lora_rank") if r.get("q_lora_rank") else f"{s}: q_lora_rank null")
    for field in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                  "intermediate_size", "moe_intermediate_size"):
        r.take(field, field)
    r.put("experts", r.positive("n_routed_experts", MOE), r.where("n_routed_experts"))
    r.put("experts_per_token", r.positive("num_experts_per_tok", "a token goes to at least one "
                                          "expert"), r.where("num_experts_per_tok"))
    r.take("shared_experts", "n_shared_experts", 0, required=False)
    r.take("dense_layers", "first_k_dense_replace", 0, required=False)
    dense, layers = r.get("first_k_dense_replace") or 0, r.need("num_hidden_layers")
    if dense > layers:
        raise ConfigImportError(f"{r.where('first_k_dense_replace')} is {dense}, more than "
                                f"num_hidden_layers ({layers}): at most every layer is dense")
    if r.get("moe_layer_freq", 1) != 1:
        raise ConfigImportError(f"{s}: moe_layer_freq {r.get('moe_layer_freq')} (MoE every few "
                                f"layers) is not modelled")
    if r.get("index_topk") is not None:
        shared = [t for t in r.get("indexer_types") or [] if t != "full"]
        if shared or (r.get("index_topk_freq") or 1) > 1:
            raise ConfigImportError(f"{s}: shared DSA indexers (indexer_types 'shared', "
                                    f"index_topk_freq > 1) are not modelled")
        for field in ("index_topk", "index_head_dim", "index_n_heads"):
            r.take(field, field)


def profile_yaml(name: str, entry: dict[str, dict[str, Any]], source: str) -> str:
    """A user profile file holding ``entry`` as model ``name``."""
    head = (f"# Written by `pdsim profiles import {source} --name {name}`: a model profile made\n"
            f"# from a Hugging Face config.json; each value names the key it came from. Load it\n"
            f"# from a scenario with `profiles: [this file]` and `fleet: {{model: {name}}}`.\n")
    body = {"models": {name: {k: dict(v) for k, v in entry.items()}}}
    return head + yaml.safe_dump(body, sort_keys=False, width=100)


def _in_config_terms(msg: str, name: str, entry: dict[str, dict[str, Any]]) -> str:
    """A profile's error as the config says it: the config key the value came from, not the
    profile's path (``invalid value at 'models.<name>.hidden_size'``), and the file named once
    (the caller names it): "hidden_size: Input should be ..." """
    m = re.match(rf"(?:[^:]*: )?invalid value at 'models\.{re.escape(name)}\.(\w+)': (.*)", msg)
    if not m:
        return msg
    field, why = m.groups()
    source = entry.get(field, {}).get("source", "")
    key = source.split(": ", 1)[1] if ": " in source else ""
    said = (key if re.fullmatch(r"[\w.\[\]]+", key)
            else f"{field} ({key})" if key else field)
    return f"{said}: {why}"


def import_config(path: str | os.PathLike, name: str) -> tuple[Model, str]:
    """The model of ``path``'s config as a validated profile, and its profile file text."""
    from pdsim.model import profiles

    if not name or not isinstance(name, str):
        raise ConfigImportError("give the profile a name (--name)")
    src = show_path(path)
    entry = profile_from_config(read_config(path), f"{os.path.basename(src)}")
    plain = {k: v["value"] for k, v in entry.items()}
    try:
        model = profiles.build("models", name, plain, {k: v["source"] for k, v in entry.items()})
    except ProfileError as err:
        raise ConfigImportError(f"{src}: {_in_config_terms(str(err), name, entry)}") from None
    bad = model.inconsistency()
    if bad is not None:
        raise ConfigImportError(f"{src}: {bad[1]}")
    return model, profile_yaml(name, entry, src)

"""GPU, model and engine profiles: shipped data files, user profile files, overrides.

A scenario names a GPU, a model and an engine (``fleet.gpu``, ``fleet.model``,
``fleet.engine``). Their values are resolved in this order, later wins:

1. the shipped files ``pdsim/model/data/{gpus,models,engines}.yaml``;
2. user profile files (the scenario's ``profiles:`` list), in order: they add entries or change
   fields of existing ones (``gpus:``, ``models:``, ``engines:`` sections; an entry may
   ``extends: <name>`` another);
3. the calibration for (GPU, model, engine): shipped ``calibrations.yaml``, then the files'
   ``calibrations:`` (what ``pdsim calibrate`` writes); at most one per combination;
4. the scenario's inline overrides ``gpu:``, ``model:``, ``engine:`` (``--set gpu.hbm_tbps=3``
   writes there).

Every value keeps where it came from (its file and source note); ``pdsim profiles`` prints it.
Values are validated with pydantic: unknown fields, wrong types and non-finite or out-of-range
numbers are one-line :class:`ProfileError` messages naming the key path.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from functools import cache, lru_cache
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, create_model

from pdsim.util.safeio import UserFileError, decode_utf8, echo, read_user_file, show_path
from pdsim.util.safeyaml import YamlError, parse_yaml

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


# --- files ---------------------------------------------------------------------------------


@dataclass
class Entry:
    """One profile entry while merging: field -> (value, origin)."""

    values: dict[str, tuple[Any, str]]


@dataclass
class Catalog:
    """Every entry known to a scenario, with origins, plus calibrations."""

    entries: dict[str, dict[str, Entry]]  # section -> name -> entry
    calibrations: dict[tuple[str, str, str], dict[str, tuple[Any, str]]]

    def names(self, section: str) -> list[str]:
        return sorted(self.entries[section])


def _strip(item: Any) -> Any:
    """Nested ``{value, source}`` leaves to plain values (the ``fitted`` tables)."""
    if isinstance(item, dict) and "value" in item:
        return item["value"]
    if isinstance(item, dict):
        return {k: _strip(v) for k, v in item.items()}
    return item


def _split(item: Any) -> tuple[Any, str | None]:
    if isinstance(item, dict) and "value" in item:
        extra = set(item) - {"value", "source"}
        if extra:
            raise ProfileError(f"unknown key(s) {sorted(extra)} beside 'value'; allowed: value, "
                               f"source")
        return item["value"], item.get("source")
    return item, None


def _merge_section(cat: Catalog, section: str, data: Any, where: str) -> None:
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: '{section}' must be a mapping of names to entries")
    for name, body in data.items():
        if isinstance(name, str) and name.startswith("_"):
            continue  # YAML anchors of shared values (``_hopper_eff: &hopper_eff``)
        if not isinstance(name, str) or not name:
            raise ProfileError(f"{where}: '{section}' entry names must be non-empty strings")
        if not isinstance(body, dict):
            raise ProfileError(f"{where}: '{section}.{name}' must be a mapping of fields")
        body = dict(body)
        base = body.pop("extends", None)
        if base is not None:
            if not isinstance(base, str):  # (a list or mapping is no key: TypeError below)
                raise ProfileError(f"{where}: '{section}.{name}.extends' must name a "
                                   f"{section[:-1]} profile (a string), got {echo(base)}; "
                                   f"known: {', '.join(cat.names(section))}")
            if base not in cat.entries[section]:
                raise ProfileError(f"{where}: '{section}.{name}.extends': no {section[:-1]} "
                                   f"{echo(base)}; known: {', '.join(cat.names(section))}")
            entry = Entry(dict(cat.entries[section][base].values))
        else:
            entry = cat.entries[section].get(name) or Entry({})
            entry = Entry(dict(entry.values))
        for key, item in body.items():
            try:
                value, src = _split(item)
            except ProfileError as err:
                raise ProfileError(f"{where}: '{section}.{name}.{key}': {err}") from None
            value = _strip(value)
            entry.values[key] = (value, f"{where}" + (f": {src}" if src else ""))
        cat.entries[section][name] = entry


def _merge_calibrations(cat: Catalog, data: Any, where: str) -> None:
    if not isinstance(data, list):
        raise ProfileError(f"{where}: 'calibrations' must be a list of "
                           f"{{gpu, model, engine, set}} entries")
    for i, cal in enumerate(data):
        path = f"calibrations.{i}"
        if not isinstance(cal, dict) or set(cal) - {"gpu", "model", "engine", "set", "note"}:
            raise ProfileError(f"{where}: '{path}' must be a mapping with keys gpu, model, "
                               f"engine, set (and an optional note)")
        key = (cal.get("gpu"), cal.get("model"), cal.get("engine", "sglang"))
        if not all(isinstance(k, str) for k in key):
            raise ProfileError(f"{where}: '{path}' needs gpu and model names")
        sets = cal.get("set") or {}
        if not isinstance(sets, dict):
            raise ProfileError(f"{where}: '{path}.set' must map dotted keys (gpu.gemm_eff, "
                               f"engine.decode_step_ms, ...) to values")
        vals = {}
        for dotted, item in sets.items():
            kind, _, field = str(dotted).partition(".")
            if kind not in ("gpu", "engine") or not field:
                raise ProfileError(f"{where}: '{path}.set.{dotted}': a calibration sets gpu.* "
                                   f"or engine.* values")
            cls = GPU if kind == "gpu" else Engine
            if field not in cls.model_fields or field == "name":
                allowed = ", ".join(f for f in cls.model_fields if f != "name")
                raise ProfileError(f"{where}: unknown key '{path}.set.{dotted}'; allowed "
                                   f"{kind} keys: {allowed}")
            value, src = _split(item)
            vals[dotted] = (value, f"{where} calibration {key[0]}/{key[1]}/{key[2]}"
                            + (f": {src}" if src else ""))
        cat.calibrations[key] = {**cat.calibrations.get(key, {}), **vals}


def _parse(text: str, where: str) -> Any:
    """A shipped profile file, parsed with libyaml (one first-run cost of every pdsim run: 60
    ms with the pure-Python parser); user files go through :func:`read_profile_file`."""
    try:
        return yaml.load(text, Loader=_FAST)  # CSafeLoader or SafeLoader: safe tags only
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ProfileError(f"{where}: not valid YAML{at}: {getattr(err, 'problem', err)}") \
            from None


_FAST = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@cache
def _shipped() -> Catalog:
    cat = Catalog({s: {} for s in KINDS}, {})
    pkg = resources.files("pdsim.model").joinpath("data")
    for section in KINDS:
        name = f"{section}.yaml"
        _merge_section(cat, section, _parse(pkg.joinpath(name).read_text(), name),
                       f"pdsim/model/data/{name}")
    cal = _parse(pkg.joinpath("calibrations.yaml").read_text(), "calibrations.yaml")
    _merge_calibrations(cat, cal.get("calibrations", []) if cal else [],
                        "pdsim/model/data/calibrations.yaml")
    return cat


def read_profile_file(path: str | os.PathLike) -> dict:
    """Parse a user profile file (sections gpus/models/engines/calibrations) safely: a regular
    file under the size limit, strict UTF-8, and the scenario files' bounded YAML parser (no
    duplicate keys, bounded nesting and aliases): a profile file is as much user input."""
    where = show_path(path)
    try:
        text = decode_utf8(read_user_file(path, "profile file", MAX_PROFILE_BYTES), where)
        data = parse_yaml(text, where)
    except (UserFileError, YamlError) as err:
        raise ProfileError(str(err)) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: a profile file is a mapping with sections gpus, models, "
                           f"engines, calibrations")
    unknown = set(data) - {*KINDS, "calibrations"}
    if unknown:
        raise ProfileError(f"{where}: unknown key '{sorted(unknown)[0]}'; allowed keys here: "
                           f"gpus, models, engines, calibrations")
    return data


def _stamp(path: str) -> tuple:
    try:
        st = os.stat(path)
        return (st.st_mtime_ns, st.st_size)
    except OSError:
        return (0, 0)


def catalog(files: tuple[str, ...] = ()) -> Catalog:
    """Shipped profiles plus the user files, in order."""
    return _catalog(tuple((f, _stamp(f)) for f in files))


@lru_cache(maxsize=32)
def _catalog(files: tuple[tuple[str, tuple], ...]) -> Catalog:
    base = _shipped()
    cat = Catalog({s: dict(v) for s, v in base.entries.items()}, dict(base.calibrations))
    for f, _mtime in files:
        data = read_profile_file(f)
        for section in KINDS:
            if section in data:
                _merge_section(cat, section, data[section], f)
        if "calibrations" in data:
            _merge_calibrations(cat, data["calibrations"], f)
    return cat


# --- resolution ----------------------------------------------------------------------------


def _fmt(err: ValidationError, prefix: str) -> str:
    e = err.errors()[0]
    path = ".".join(str(p) for p in (prefix, *e["loc"]) if p != "")
    if e["type"] == "extra_forbidden":
        cls = {"gpus": GPU, "models": Model, "engines": Engine, "gpu": GPU, "model": Model,
               "engine": Engine}.get(prefix.split(".")[0], GPU)
        allowed = ", ".join(f for f in cls.model_fields if f != "name")
        return f"unknown key '{path}'; allowed keys here: {allowed}"
    if e["type"] == "missing":
        return f"missing required key '{path}'"
    got = e.get("input")
    shown = "" if isinstance(got, dict | list) else f" (got {got!r})"
    return f"invalid value at '{path}': {e['msg'].removeprefix('Value error, ')}{shown}"


def build(section: str, name: str, values: dict[str, Any],
          origins: dict[str, str] | None = None) -> _Profile:
    """Validate merged values into a GPU, Model or Engine; errors name the file of the value."""
    cls = KINDS[section]
    try:
        return cls.model_validate({**values, "name": name})
    except ValidationError as err:
        msg = _fmt(err, f"{section}.{name}")
        origins = origins or {}
        field = str(err.errors()[0]["loc"][0]) if err.errors()[0]["loc"] else ""
        origin = origins.get(field) or next(iter(origins.values()), "")
        where = origin.split(": ", 1)[0]
        raise ProfileError(f"{where}: {msg}" if where else msg) from None


@dataclass(frozen=True)
class Resolved:
    """The profiles one scenario runs with, and where each value came from."""

    gpu: GPU
    model: Model
    engine: Engine
    origins: dict[str, tuple[Any, str]]  # "gpu.hbm_tbps" -> (value, origin)
    calibrated: bool = False


def resolve(gpu: str, model: str, engine: str = "sglang", files: tuple[str, ...] = (),
            overrides: dict[str, dict[str, Any]] | None = None) -> Resolved:
    """Resolve (gpu, model, engine) through shipped files, user files, calibration, overrides.

    Raises :class:`ProfileError` (one line) on unknown names or invalid values.

    Remembered per names, user files as the catalog stamps them, and
    overrides whose values are plain numbers or strings (each by type and ``repr``, so that
    1, 1.0, True, 0.0 and -0.0 are told apart): a scenario is validated once plus once per end
    of each declared unknown's range, and most of those resolve the same profiles (the run's
    fleet once more), each resolution validating three profile models (drop_timeout: 8
    resolutions, 4 of them distinct).
    """
    stamped = tuple((f, _stamp(f)) for f in files)
    frozen = _frozen(overrides)
    if frozen is None or not all(type(n) is str for n in (gpu, model, engine)):
        return _resolve(gpu, model, engine, stamped, overrides)
    key = (gpu, model, engine, stamped, frozen)
    res = _RESOLVED.get(key)
    if res is None:
        res = _resolve(gpu, model, engine, stamped, overrides)
        if len(_RESOLVED) >= 64:
            _RESOLVED.clear()
        _RESOLVED[key] = res
    return res


_RESOLVED: dict[tuple, Resolved] = {}  # (resolve's memo; Resolved and profiles are frozen)
_PLAIN = (int, float, str, bool, type(None))


def _frozen(overrides: dict[str, dict[str, Any]] | None) -> tuple | None:
    """``overrides`` as a key (None if a value is not a plain number or string)."""
    out = []
    for kind, over in (overrides or {}).items():
        fields = []
        for field, value in (over or {}).items():
            if type(value) not in _PLAIN:
                return None
            fields.append((field, type(value), repr(value)))
        out.append((kind, tuple(fields)))
    return tuple(out)


def _resolve(gpu: str, model: str, engine: str, stamped: tuple,
             overrides: dict[str, dict[str, Any]] | None) -> Resolved:
    cat = _catalog(stamped)
    names = {"gpu": gpu, "model": model, "engine": engine}
    for kind, n in names.items():
        section = SECTION[kind]
        if n not in cat.entries[section]:
            label = "GPU" if kind == "gpu" else kind
            raise ProfileError(f"invalid value at 'fleet.{kind}': unknown {label} profile "
                               f"{echo(n)}; allowed: {', '.join(cat.names(section))}")
    vals = {kind: dict(cat.entries[SECTION[kind]][n].values) for kind, n in names.items()}
    cal = cat.calibrations.get((gpu, model, engine), {})
    for dotted, vo in cal.items():
        kind, _, field = dotted.partition(".")
        vals[kind][field] = vo
    for kind, over in (overrides or {}).items():
        for field, value in (over or {}).items():
            if value is not None:
                vals[kind][field] = (value, "scenario override")
    built = {}
    for kind, n in names.items():
        plain = {k: v for k, (v, _o) in vals[kind].items()}
        for k, v in plain.items():
            if isinstance(v, float) and not math.isfinite(v):
                where = vals[kind][k][1]
                raise ProfileError(f"invalid value at '{kind}.{k}' ({where}): must be finite "
                                   f"(got {v!r})")
        built[kind] = build(SECTION[kind], n, plain, {k: o for k, (_v, o) in vals[kind].items()})
    bad = built["model"].inconsistency()
    if bad is not None:
        (fields, why), origin = bad, vals["model"]

        def rank(f: str) -> int:  # blame what the user set: an override, then a user file,
            o = origin.get(f, (0, ""))[1]  # then a shipped profile, then a default
            return (0 if o == "scenario override" else 3 if not o
                    else 2 if o.startswith("pdsim/model/data/") else 1)

        blame = min(fields, key=rank)  # (the first of equals: the order inconsistency gives)
        where = origin.get(blame, (0, f"model profile {model}, default"))[1]
        raise ProfileError(f"invalid value at 'model.{blame}' ({where}): {why}")
    origins = {f"{kind}.{k}": vo for kind in names for k, vo in sorted(vals[kind].items())}
    return Resolved(built["gpu"], built["model"], built["engine"], origins, bool(cal))


def for_scenario(sc: Any, ctx: Any = None) -> Resolved:
    """The profiles a validated :class:`~pdsim.config.scenario.Scenario` runs with.

    ``profiles:`` entries resolve against ``ctx`` (a :class:`pdsim.config.scenario.Context`;
    default: where the scenario was loaded from), confined to the scenario's directory tree.
    """
    ctx = ctx or sc._context
    files = []
    for i, rel in enumerate(sc.profiles):
        try:
            path = ctx.resolve(rel, f"'profiles.{i}'") if ctx is not None else Path(rel)
        except UserFileError as err:
            raise ProfileError(str(err)) from None
        files.append(str(path))
    over = {k: getattr(sc, k).model_dump(exclude_none=True) for k in ("gpu", "model", "engine")}
    return resolve(sc.fleet.gpu, sc.fleet.model, sc.fleet.engine, tuple(files), over)


# --- the shipped catalog, by name (what tests and the CLI listing use) ---------------------


def gpu_names() -> list[str]:
    return _shipped().names("gpus")


def model_names() -> list[str]:
    return _shipped().names("models")


def engine_names() -> list[str]:
    return _shipped().names("engines")


def _plain(section: str, name: str) -> dict:
    return {k: v for k, (v, _o) in _shipped().entries[section][name].values.items()}


@cache
def gpu(name: str) -> GPU:
    return build("gpus", name, _plain("gpus", name))  # type: ignore[return-value]


@cache
def model(name: str) -> Model:
    return build("models", name, _plain("models", name))  # type: ignore[return-value]


@cache
def engine(name: str = "sglang") -> Engine:
    return build("engines", name, _plain("engines", name))  # type: ignore[return-value]


def raw_gpus() -> dict[str, dict[str, Any]]:
    """Shipped GPU entries as ``{name: {field: {value, source}}}`` (for listings)."""
    return _raw("gpus")


def raw_models() -> dict[str, dict[str, Any]]:
    return _raw("models")


def raw_engines() -> dict[str, dict[str, Any]]:
    return _raw("engines")


def calibrated() -> list[tuple[str, str, str]]:
    """The shipped (GPU, model, engine) combinations that have a calibration."""
    return sorted(_shipped().calibrations)


def _raw(section: str) -> dict[str, dict[str, Any]]:
    return {n: {k: {"value": v, "source": o} for k, (v, o) in e.values.items()}
            for n, e in _shipped().entries[section].items()}

"""Scenario format: typed, validated, with one-line errors that name the key path.

A scenario is YAML (loaded with ``yaml.safe_load``) or a dict. Unknown keys, wrong types and
impossible values raise :class:`ScenarioError` with the dotted key path and what is allowed.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from pdsim import profiles, unknowns

PosInt = Annotated[int, Field(gt=0)]
PosFloat = Annotated[float, Field(gt=0)]
NonNegFloat = Annotated[float, Field(ge=0)]
Fraction = Annotated[float, Field(gt=0, le=1)]


class ScenarioError(ValueError):
    """A scenario that cannot be run; ``str()`` is the one-line message for the user."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False, validate_default=True)


# --- fleet ---------------------------------------------------------------------------------


class RoleConfig(Strict):
    servers: PosInt = Field(1, description="Servers of this role (each one SGLang process group)")
    dp: PosInt = Field(1, description="DP ranks per server (one scheduler each)")
    tp: PosInt = Field(1, description="Tensor-parallel size of the server")
    dp_attention: bool = Field(False, description="--enable-dp-attention")
    lockstep: bool | None = Field(
        None, description="DP ranks run each forward together (idle ranks run idle batches); "
        "default: on with dp_attention, off without")
    balance: Literal["round_robin", "total_tokens", "follow_bootstrap_room"] = Field(
        "round_robin", description="DP load-balance method of the server"
    )
    max_running_requests: PosInt = Field(256, description="Per DP rank")
    kv_pool_tokens: PosInt | None = Field(
        None, description="KV pool size per rank in tokens; default: derived from GPU memory"
    )
    mem_fraction_static: Fraction = Field(0.8, description="Used when kv_pool_tokens is unset")
    page_size: PosInt = Field(1, description="Tokens per KV page")

    @model_validator(mode="after")
    def _dp_fits_tp(self) -> RoleConfig:
        if self.dp_attention and self.tp % self.dp:
            raise ValueError(f"with dp_attention, tp ({self.tp}) must be a multiple of dp "
                             f"({self.dp})")
        return self


class PrefillConfig(RoleConfig):
    chunked_prefill_size: PosInt = Field(
        8192, description="Token budget of one prefill forward per rank (--chunked-prefill-size, "
        "already divided by dp under DP attention)"
    )
    prefix_cache: bool = Field(True, description="Radix (prefix) cache on the prefill")
    prefix_block_tokens: PosInt = Field(512, description="Tokens per prefix-cache block")


class DecodeConfig(RoleConfig):
    retract_reserve_tokens: int = Field(
        0, ge=0, description="Tokens of growth reserved per request at admission"
    )


class FleetConfig(Strict):
    gpu: str = Field(description="GPU profile name")
    model: str = Field(description="Model profile name")
    prefill: PrefillConfig = PrefillConfig()
    decode: DecodeConfig = DecodeConfig()

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, v: str) -> str:
        if v not in profiles.gpu_names():
            allowed = ", ".join(profiles.gpu_names())
            raise ValueError(f"unknown GPU profile {v!r}; allowed: {allowed}")
        return v

    @field_validator("model")
    @classmethod
    def _known_model(cls, v: str) -> str:
        if v not in profiles.model_names():
            raise ValueError(
                f"unknown model profile {v!r}; allowed: {', '.join(profiles.model_names())}"
            )
        return v


# --- router, transfer, blacklist, flush, predictor -------------------------------------------


class RouterConfig(Strict):
    kind: Literal["mini_lb"] = Field("mini_lb", description="Request routing: random PD pairing")
    flush_handler: Literal["mini_lb_0.3.2", "mini_lb_fixed", "model_gateway", "rust_router"] = (
        Field("mini_lb_0.3.2", description="What the router's POST /flush_cache does")
    )
    request_timeout_s: PosFloat = 1800.0
    fanout_concurrency: PosInt = Field(32, description="Rust routers: concurrent flush fan-out")
    worker_timeout_s: PosFloat = Field(5.0, description="sgl-model-gateway per-worker timeout")
    http_latency_ms: NonNegFloat = Field(0.5, description="One router<->server hop")


class TransferConfig(Strict):
    queues_per_rank: PosInt = Field(4, description="Mooncake transfer queues per prefill rank")
    call_latency_ms: NonNegFloat = Field(1.6, description="Fixed cost per batch write (ref 6)")
    nic_gbps: PosFloat | None = Field(None, description="NIC line rate; default from GPU profile")
    gpus_per_nic: PosInt | None = Field(None, description="Default from GPU profile")
    peak_utilisation: Fraction = Field(0.84, description="168 GB/s over 4x400 GbE (ref 6)")
    min_utilisation: Fraction = Field(0.12, description="Utilisation floor for small writes")
    saturation_mb: PosFloat = Field(100.0, description="Write size reaching peak utilisation")
    transfer_timeout_s: PosFloat = 30.0
    bootstrap_timeout_s: PosFloat = 300.0
    waiting_timeout_s: PosFloat = 300.0
    base_port: PosInt = Field(17000, description="First decode session rpc port")


class BlacklistConfig(Strict):
    strikes: PosInt = Field(1, description="Failures before a session is blacklisted")
    recovery: Literal["none", "probe", "v0_5_23"] = Field(
        "none", description="none: permanent (0.5.14-0.5.22 default); probe: fixed interval; "
        "v0_5_23: probe with backoff and idle drop"
    )
    probe_interval_s: PosFloat = 30.0
    probe_max_interval_s: PosFloat = 300.0
    idle_drop_s: PosFloat = 600.0
    reregister_on_invalidate: bool = Field(
        True, description="Decode re-registers (and is un-blacklisted) after a waiting timeout"
    )


class FlushConfig(Strict):
    semantics: Literal["skip_idle_check", "reject_if_busy"] = Field(
        "skip_idle_check",
        description="Immediate path (timeout<=0): flush regardless (incident report) or 400 when "
        "busy (released 0.5.10-0.5.23)",
    )


class PredictorConfig(Strict):
    kind: Literal["fitted", "roofline"] = "fitted"
    coefficients: dict[str, float] = Field(
        default_factory=dict, description="Override fitted coefficients by name"
    )
    prefill_mfu: Fraction = Field(0.35, description="Roofline: achieved fraction of peak FLOP/s")
    hbm_derate: Fraction = Field(0.8, description="Roofline: achieved fraction of HBM bandwidth")
    step_overhead_ms: NonNegFloat = Field(5.0, description="Roofline: per-step launch overhead")


# --- workload -------------------------------------------------------------------------------


class RandomDataset(Strict):
    kind: Literal["random"] = "random"
    input_len: PosInt = 1024
    output_len: PosInt = 1024
    range_ratio: Annotated[float, Field(ge=0, le=1)] = 0.0
    output_distribution: Literal["uniform", "geometric"] = Field(
        "uniform", description="uniform: bench_serving's [len*ratio, len]; geometric: mean "
        "output_len (memoryless, for queueing checks)")


class TraceDataset(Strict):
    kind: Literal["trace"]
    path: str = Field(description="Mooncake-format JSONL (timestamp ms, input/output_length)")
    limit: PosInt | None = None
    time_scale: PosFloat = Field(1.0, description="Multiply inter-arrival times")
    max_input_len: PosInt | None = None


Dataset = Annotated[RandomDataset | TraceDataset, Field(discriminator="kind")]


class ClientFlush(Strict):
    mode: Literal["none", "bare", "raise_for_status", "timeout"] = Field(
        "none", description="bench_serving flush_server_cache after warmup"
    )
    timeout_s: PosFloat = 60.0


class BenchClientConfig(Strict):
    kind: Literal["bench"]
    name: str = "bench"
    start_s: NonNegFloat = 0.0
    dataset: Dataset = RandomDataset()
    num_prompts: PosInt | None = Field(
        None, description="Prompts to send; default: 1000 for a random dataset (bench_serving's "
        "default), every row of a trace (a smaller value replays the trace's first rows)")
    request_rate: float | Literal["inf", "trace"] = Field("inf", description="req/s, inf or trace")
    max_concurrency: PosInt | None = None
    warmup_requests: int = Field(1, ge=0)
    warmup_output_len: PosInt = 32
    flush: ClientFlush = ClientFlush()
    stream: bool = True

    @field_validator("request_rate")
    @classmethod
    def _rate(cls, v: Any) -> Any:
        if isinstance(v, float) and (v <= 0 or math.isnan(v)):
            raise ValueError("must be > 0, 'inf' or 'trace'")
        return v

    @model_validator(mode="after")
    def _default_prompts(self) -> BenchClientConfig:
        if self.num_prompts is None and self.dataset.kind == "random":
            self.num_prompts = 1000
        return self


class EvalClientConfig(Strict):
    kind: Literal["eval"]
    name: str = "eval"
    start_s: NonNegFloat = 0.0
    questions: PosInt = 1400
    threads: PosInt = 128
    dataset: RandomDataset = RandomDataset(input_len=256, output_len=256, range_ratio=0.5)
    max_tokens: PosInt = 512
    tries: PosInt = Field(6, description="Sampler tries with 2^k s sleeps between them")
    sdk_retries: int = Field(2, ge=0, description="HTTP SDK retries on status >= 500")
    sdk_backoff_s: NonNegFloat = Field(0.5, description="SDK initial backoff, doubled per retry")


ClientConfig = Annotated[BenchClientConfig | EvalClientConfig, Field(discriminator="kind")]


class DecodeDown(Strict):
    """A decode rank's KV endpoint is unreachable: writes and probes to it fail."""

    kind: Literal["decode_unreachable"]
    decode_rank: int = Field(ge=0, description="Global decode rank index (server*dp + rank)")
    at_s: NonNegFloat
    duration_s: PosFloat


class Partition(Strict):
    """Network partition between a prefill server and the decode servers.

    Transfers across it fail; decode heartbeats to the prefill miss, and after
    ``heartbeat_misses`` the decode fails its rooms from that prefill and re-registers when the
    partition heals (which clears its sessions from that prefill's blacklists).
    """

    kind: Literal["partition"]
    prefill_server: int = Field(0, ge=0)
    at_s: NonNegFloat
    duration_s: PosFloat
    heartbeat_interval_s: PosFloat = 5.0
    heartbeat_misses: PosInt = 2


class TransferErrors(Strict):
    """Random ``ret != 0`` on writes in a window, drawn from the ``faults`` random stream."""

    kind: Literal["transfer_errors"]
    probability: Annotated[float, Field(gt=0, le=1)]
    from_s: NonNegFloat = 0.0
    to_s: PosFloat = float("inf")


Fault = Annotated[DecodeDown | Partition | TransferErrors, Field(discriminator="kind")]


class OperatorFlush(Strict):
    at_s: NonNegFloat
    timeout_s: PosFloat | None = Field(None, description="None: bare POST /flush_cache")


class ReferenceFigure(Strict):
    """A figure reported for the real incident, printed beside the simulated one.

    Only the report reads these; nothing in the model does.
    """

    label: str
    reported: float
    metric: str | None = Field(None, description="Dotted path into the summary, e.g. "
                               "clients.bench.empty_share; none: shown for context only")
    tolerance: PosFloat | None = Field(None, description="Allowed absolute difference")
    rel_tolerance: PosFloat | None = Field(None, description="Allowed relative difference")
    source: str = ""

    @property
    def limit(self) -> float | None:
        """Largest allowed |simulated - reported|, or None when the figure has no band."""
        if self.tolerance is not None:
            return self.tolerance
        if self.rel_tolerance is not None:
            return self.rel_tolerance * abs(self.reported)
        return None

    def within(self, simulated: float | None) -> bool | None:
        """Whether ``simulated`` reproduces the figure (None: no band or no value to judge)."""
        lim = self.limit
        if lim is None or simulated is None or self.metric is None:
            return None
        return abs(simulated - self.reported) <= lim


class Seeds(Strict):
    arrivals: int | None = None
    lengths: int | None = None
    routing: int | None = None
    faults: int | None = None


class Scenario(Strict):
    name: str = "scenario"
    description: str = ""
    seed: int = 0
    seeds: Seeds = Seeds()
    horizon_s: PosFloat = Field(3600.0, description="Simulated seconds at most")
    timeseries_interval_s: PosFloat = 1.0
    fleet: FleetConfig
    router: RouterConfig = RouterConfig()
    transfer: TransferConfig = TransferConfig()
    blacklist: BlacklistConfig = BlacklistConfig()
    flush: FlushConfig = FlushConfig()
    predictor: PredictorConfig = PredictorConfig()
    clients: Annotated[list[ClientConfig], Field(min_length=1)]
    operator_flushes: list[OperatorFlush] = Field(default_factory=list)
    faults: list[Fault] = Field(default_factory=list)
    reference: list[ReferenceFigure] = Field(
        default_factory=list, description="Reported figures to compare against (report only)")
    _unknowns: list = PrivateAttr(default_factory=list)

    @property
    def unknowns(self) -> list[unknowns.Unknown]:
        """Declared unknowns (pdsim/unknowns.py); this scenario holds their nominal values."""
        return self._unknowns
    # where it came from (the report tells a what-if from the scenario its figures belong to)
    _source: str | None = PrivateAttr(None)
    _overrides: tuple[str, ...] = PrivateAttr(())

    @field_validator("clients")
    @classmethod
    def _names_unique(cls, clients: list) -> list:
        names = [c.name for c in clients]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"client names must be unique (set 'name'); repeated: "
                             f"{', '.join(sorted(dup))}")
        return clients


# --- loading and errors -----------------------------------------------------------------------


def _allowed_keys(model: type[BaseModel], loc: tuple) -> list[str] | None:
    """Field names allowed at ``loc`` (the parent of an unknown key), walking the schema."""
    cur: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        if isinstance(cur, type) and issubclass(cur, BaseModel):
            if part in cur.model_fields:
                cur = _unwrap(cur.model_fields[part].annotation)
            else:  # a discriminator tag such as 'bench'
                cur = _unwrap_tag(cur, part)
        else:
            cur = _unwrap_tag(cur, part)
        if cur is None:
            return None
    if isinstance(cur, type) and issubclass(cur, BaseModel):
        return list(cur.model_fields)
    return None


def _unwrap(tp: Any) -> Any:
    import types
    import typing

    args = typing.get_args(tp)
    if typing.get_origin(tp) is Annotated:
        return _unwrap(args[0])
    if typing.get_origin(tp) in (list, Union, types.UnionType):
        models = [_unwrap(a) for a in args if a is not type(None)]
        return models[0] if len(models) == 1 else tuple(models)
    return tp


def _unwrap_tag(cur: Any, tag: Any) -> Any:
    if isinstance(cur, tuple):
        for m in cur:
            f = getattr(m, "model_fields", {}).get("kind")
            if f is not None and tag in str(f.annotation):  # Literal["bench"] etc.
                return m
        return None
    return None


_TAGS = {"bench", "eval", "random", "trace", "decode_unreachable", "partition",
         "transfer_errors", "float", "int", "str", "bool", "none"}


def _clean(loc: tuple) -> tuple:
    """Drop union branch names pydantic adds to a path (clients.0.bench.num_prompts)."""
    return tuple(p for p in loc if not (isinstance(p, str) and (p in _TAGS or "[" in p)))


def _format_error(err: ValidationError) -> str:
    errors = err.errors()
    e = errors[0]
    loc = tuple(e["loc"])
    path = ".".join(str(p) for p in _clean(loc))
    same = [x for x in errors if _clean(tuple(x["loc"])) == _clean(loc)]
    rest = len(errors) - len(same)
    more = f" (and {rest} more)" if rest else ""
    if len(same) > 1 and e["type"] != "extra_forbidden":  # a union: list every alternative
        alts = "; or ".join(x["msg"].removeprefix("Value error, ") for x in same)
        got = e.get("input")
        return f"invalid value at '{path}': {alts} (got {got!r}){more}"
    if e["type"] == "extra_forbidden":
        allowed = _allowed_keys(Scenario, loc[:-1])
        hint = f"; allowed keys here: {', '.join(allowed)}" if allowed else ""
        return f"unknown key '{path}'{hint}{more}"
    if e["type"] == "missing":
        return f"missing required key '{path}'{more}"
    msg = e["msg"].removeprefix("Value error, ")
    got = e.get("input")
    shown = "" if isinstance(got, dict | list) else f" (got {got!r})"
    return f"invalid value at '{path or '<top>'}': {msg}{shown}{more}"


def from_dict(data: Any) -> Scenario:
    """Validate a plain dict (as loaded from YAML) into a :class:`Scenario`."""
    if not isinstance(data, dict):
        raise ScenarioError("a scenario must be a mapping of keys to values at the top level")
    try:
        return Scenario.model_validate(data)
    except ValidationError as err:
        raise ScenarioError(_format_error(err)) from None


def _merge(base: dict, over: dict) -> dict:
    """Deep-merge ``over`` into ``base``: mappings merge, everything else (lists too) replaces."""
    out = dict(base)
    for k, v in over.items():
        leaf = unknowns.is_declaration(v) or unknowns.is_declaration(out.get(k))
        out[k] = (_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict)
                  and not leaf else v)
    return out


def _resolve_trace_paths(data: Any, base: Path) -> None:
    """A trace ``dataset.path`` in a file is relative to that file (as ``extends:`` is)."""
    clients = data.get("clients") if isinstance(data, dict) else None
    for c in clients if isinstance(clients, list) else []:
        ds = c.get("dataset") if isinstance(c, dict) else None
        if isinstance(ds, dict) and isinstance(ds.get("path"), str) and ds["path"]:
            ds["path"] = os.path.normpath(base / ds["path"])


def read_yaml(path: str | Path, _seen: tuple = ()) -> dict:
    """Read a scenario file; ``extends: other.yaml`` (relative to this file) is merged under it."""
    p = Path(path)
    if not p.is_file():
        raise ScenarioError(f"scenario file not found: {p}")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ScenarioError(f"{p}: not valid YAML{where}: {getattr(err, 'problem', err)}") from None
    data = data if data is not None else {}
    _resolve_trace_paths(data, p.parent)
    if isinstance(data, dict) and "extends" in data:
        parent = data.pop("extends")
        if not isinstance(parent, str):
            raise ScenarioError(f"{p}: 'extends' must be a file name, got {parent!r}")
        ppath = (p.parent / parent).resolve()
        if ppath in _seen:
            raise ScenarioError(f"{p}: 'extends' loops back to {ppath.name}")
        data = _merge(read_yaml(ppath, (*_seen, p.resolve())), data)
    return data


def apply_overrides(data: dict, sets: list[str]) -> dict:
    """Apply ``dotted.key=value`` overrides; values are parsed as YAML scalars."""
    import copy

    data = copy.deepcopy(data)
    for item in sets:
        if "=" not in item:
            raise ScenarioError(f"--set expects dotted.key=value, got {item!r}")
        key, raw = item.split("=", 1)
        value = yaml.safe_load(raw) if raw.strip() else None
        parts = key.split(".")
        cur: Any = data
        for i, part in enumerate(parts[:-1]):
            nxt = parts[i + 1]
            if isinstance(cur, list):
                if not part.isdigit() or int(part) >= len(cur):
                    raise ScenarioError(f"--set {key}: '{'.'.join(parts[:i + 1])}' is not an "
                                        f"index into a list of {len(cur)}")
                cur = cur[int(part)]
            else:
                cur = cur.setdefault(part, [] if nxt.isdigit() else {})
        last = parts[-1]
        if isinstance(cur, list):
            if not last.isdigit() or int(last) > len(cur):
                raise ScenarioError(f"--set {key}: {last!r} is not an index into a list of "
                                    f"{len(cur)} (use {len(cur)} to append)")
            if int(last) == len(cur):
                cur.append(value)
            else:
                cur[int(last)] = value
        else:
            cur[last] = value
    return data


def load(source: str | Path | dict | Scenario, sets: list[str] | None = None) -> Scenario:
    """Load a scenario from a YAML path, a dict or a Scenario, applying ``--set`` overrides.

    Declared unknowns (``{uniform: [a, b], nominal: x}``, pdsim/unknowns.py) are resolved to
    their nominal values after the overrides and before validation; ``Scenario.unknowns``
    lists them.
    """
    origin, before = None, ()
    if isinstance(source, Scenario):
        if not sets:
            return source
        origin, before = source._source, source._overrides
        source = unknowns.redeclare(source.model_dump(mode="json"), source.unknowns)
    elif not isinstance(source, dict):
        origin = str(source)
    data = dict(source) if isinstance(source, dict) else read_yaml(source)
    if sets:
        data = apply_overrides(data, sets)
    try:
        data, declared = unknowns.resolve(data)
    except unknowns.UnknownError as err:
        raise ScenarioError(str(err)) from None
    sc = from_dict(data)
    if declared:
        try:
            sc._unknowns = unknowns.finish(data, declared, sc, from_dict)
        except unknowns.UnknownError as err:
            raise ScenarioError(str(err)) from None
    sc._source, sc._overrides = origin, (*before, *(sets or ()))
    return sc


def json_schema() -> dict:
    """JSON Schema of a scenario file, for editors (yaml-language-server, VS Code).

    A file may ``extends:`` another, which can supply any top-level key, so the editor schema
    allows ``extends`` and requires nothing at the top; ``pdsim validate`` checks the merged
    scenario in full. Numeric and categorical values also accept a declared unknown.
    """
    schema = unknowns.schema_with_unknowns(
        Scenario.model_json_schema(), skip_defs=("ReferenceFigure", "Seeds"))
    schema["properties"]["extends"] = {
        "type": "string", "title": "Extends",
        "description": "Scenario file (relative to this one) merged under this one"}
    schema.pop("required", None)
    return schema

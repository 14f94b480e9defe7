"""The top-level :class:`Scenario` (faults, operator flushes, reported figures, seeds and the
sections of :mod:`pdsim.config.fleet` and :mod:`pdsim.config.clients`), and its validation:
pydantic's errors as one line naming the key path (steps 3-4 of :mod:`pdsim.config.loader`),
each section's ``check``, then the load-time checks other layers register (step 5,
:func:`load_check`)."""


from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Union

from pydantic import (
    BaseModel,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from pdsim.config import registry, unknowns
from pdsim.config.clients import ClientConfig
from pdsim.config.engine_version import SGLANG_VERSIONS, EngineSection, at_least
from pdsim.config.fleet import (
    BlacklistConfig,
    FleetConfig,
    FlushConfig,
    PredictorConfig,
    RouterConfig,
    TransferConfig,
)
from pdsim.config.profile_schema import GPUOverrides, ModelOverrides
from pdsim.config.registry import BLACKLIST_POLICIES, FAULTS, PD_PATHS
from pdsim.config.units import (
    _NOTHING,
    _NUM,
    MAX_LIST,
    MAX_PROMPT_BLOCKS,
    MAX_SEED,
    MAX_TICKS,
    MAX_TOTAL_REQUESTS,
    Context,
    Fraction,
    Instant,
    Interval,
    Invalid,
    Millis,
    Name,
    ScenarioError,
    Seconds,
    Seed,
    Strict,
    Text,
    _ticks,
)
from pdsim.util.safeio import (
    UserFileError,
    clip,
    echo,
)

DisaggregationConfig = Annotated[registry.Params, PD_PATHS.field()]
"""``disaggregation:``: the switches of :data:`pdsim.config.registry.PD_PATHS`."""

# blacklist.policy when a scenario leaves it out: the release's default recovery
# (pdsim.engine.blacklist: the failed-session probe of PR #25287 is on by default in 0.5.23)
BLACKLIST_BY_VERSION = (("0.5.23", "v0_5_23"),)

Fault = Annotated[registry.Params, FAULTS.field()]
"""A ``faults:`` item: ``kind`` names a registered fault (pdsim.engine.faults) or ``preset`` a
library entry; each kind's model checks its indices against the fleet (``check(ctx)``)."""


class OperatorFlush(Strict):
    at_s: Instant = Field(description="Simulated time an operator POSTs /flush_cache to the "
                          "router")
    timeout_s: Seconds | None = Field(None, description="The flush's ?timeout= in seconds "
                                      "(what the router does with it: router.flush_handler); "
                                      "default null: a bare POST /flush_cache")


Finite = Annotated[float, Field(allow_inf_nan=False), _NUM]


class SLOConfig(Strict):
    """Service-level objectives: what a request must meet to count as *goodput*.

    A request meets the SLO when it completed (generated every token it asked for) and each
    threshold that is set holds for it: TTFT (first token - arrival), TPOT ((last token -
    first token) / (tokens - 1)) and E2E (last token - arrival), at the token times the server
    produced them (what a streaming client sees). Unset thresholds are not checked, so with none
    set goodput is the completed requests. The same thresholds as vLLM's and SGLang's bench
    ``--goodput ttft:MS tpot:MS e2el:MS``; the fleet *meets* the SLO when the share of requests
    meeting it (SLO attainment, as DistServe defines it) is at least ``attainment``.

    Only the metrics read these (:mod:`pdsim.engine.slo`); nothing in the model does.
    """

    ttft_ms: Millis | None = Field(None, description="Largest TTFT (ms) a request may have to "
                                   "count as goodput (bench --goodput ttft:MS); default unset")
    tpot_ms: Millis | None = Field(None, description="Largest TPOT (ms) a request may have to "
                                   "count as goodput (bench --goodput tpot:MS); default unset")
    e2e_ms: Millis | None = Field(None, description="Largest end-to-end latency (ms) a request "
                                  "may have (bench --goodput e2el:MS); default unset")
    attainment: Fraction = Field(0.9, description="Share of requests that must meet the SLO for "
                                 "the fleet to meet it (capacity is the highest load whose "
                                 "attainment is at least this); default 0.9")

    @property
    def active(self) -> bool:
        """Whether any threshold is set (without one, goodput is the completed requests)."""
        return any(v is not None for v in (self.ttft_ms, self.tpot_ms, self.e2e_ms))


class ReferenceFigure(Strict):
    """A figure reported for the real incident, printed beside the simulated one.

    Only the report reads these; nothing in the model does.
    """

    label: Name = Field(description="What the figure is, as the report prints it")
    reported: Finite = Field(description="The value reported for the real incident")
    metric: Name | None = Field(None, description="Dotted path into the summary, e.g. "
                                "clients.bench.empty_share; none: shown for context only")
    tolerance: Annotated[float, Field(gt=0, allow_inf_nan=False), _NUM] | None = Field(
        None, description="Allowed absolute difference")
    rel_tolerance: Annotated[float, Field(gt=0, allow_inf_nan=False), _NUM] | None = Field(
        None, description="Allowed relative difference")
    source: Text = Field("", description="Where the figure was reported; default empty")
    fitted_by: list[Name] = Field(
        default_factory=list, max_length=MAX_LIST,
        description="Declared unknowns (dotted paths) whose nominal values were chosen to give "
                    "this figure: while they stay at nominal its verdict checks the fit, not a "
                    "prediction, and the report says so; default none")

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
    arrivals: Seed | None = Field(None, description="Seed of the bench clients' Poisson "
                                  "arrival gaps; default: seed")
    lengths: Seed | None = Field(None, description="Seed of random prompt and output lengths "
                                 "(bench and eval); default: seed")
    routing: Seed | None = Field(None, description="Seed of the router's random prefill/decode "
                                 "pairing; default: seed")
    faults: Seed | None = Field(None, description="Seed of random fault draws (transfer_errors); "
                                "default: seed")



class Scenario(Strict):
    name: Name = Field("scenario", description="Scenario name, shown in the report and "
                       "outputs; default scenario")
    description: Text = Field("", description="Free text on what the scenario is; default "
                              "empty")
    seed: Seed = Field(0, description=f"Root seed, 0..2^64-1 ({MAX_SEED}); default 0")
    seeds: Seeds = Field(Seeds(), description="Per-subsystem seeds, each replacing seed for one "
                         "random stream (changing one leaves the others); default: all seed")
    horizon_s: Seconds = Field(3600.0, description="Simulated seconds at most; default 3600")
    timeseries_interval_s: Interval = Field(
        1.0, description=f"Time-series period; horizon_s / timeseries_interval_s <= "
        f"{MAX_TICKS:,}; default 1 s")
    fleet: FleetConfig = Field(description="GPU and model profiles and the prefill and decode "
                               "servers")
    router: RouterConfig = Field(RouterConfig(), description="The router in front of the "
                                 "servers (mini_lb-style random PD pairing)")
    transfer: TransferConfig = Field(TransferConfig(), description="The Mooncake KV transfer "
                                     "engine of each prefill rank")
    blacklist: BlacklistConfig = Field(
        default_factory=lambda: BLACKLIST_POLICIES.validate({}),
        description="Peer blacklist policy of the transfer engines (pdsim.engine.blacklist)")
    flush: FlushConfig = Field(FlushConfig(), description="What POST /flush_cache does on a "
                               "server and to the transfers in flight")
    predictor: PredictorConfig = Field(PredictorConfig(), description="How a forward's step "
                                       "time is predicted; default operator")
    profiles: list[str] = Field(
        default_factory=list, max_length=MAX_LIST,
        description="Profile files (relative to this scenario) adding or changing GPU, model and "
        "engine profiles and calibrations")
    gpu: GPUOverrides = Field(  # type: ignore[valid-type]
        default_factory=GPUOverrides, description="Override GPU profile values, e.g. "
        "hbm_tbps: 3.0 (pdsim profiles NAME lists the keys)")
    model: ModelOverrides = Field(  # type: ignore[valid-type]
        default_factory=ModelOverrides, description="Override model profile values, e.g. "
        "layers: 8")
    engine: EngineSection = Field(  # type: ignore[valid-type]
        default_factory=EngineSection, description="The SGLang release the scheduler and the "
        "PD paths follow (version) and overrides of engine profile values, e.g. bootstrap_ms: "
        "5")
    disaggregation: DisaggregationConfig = Field(
        default_factory=lambda: PD_PATHS.validate({}),
        description="SGLang's PD timeout, abort and heartbeat paths (pdsim.config.pd_paths): "
        "each switch unset takes its value in engine.version's release")
    clients: Annotated[list[ClientConfig], Field(min_length=1, max_length=MAX_LIST)] = Field(
        description="Load generators, at least one: bench (sglang.bench_serving) or eval "
        "(gsm8k-style, sglang.test.run_eval)")
    operator_flushes: list[OperatorFlush] = Field(
        default_factory=list, max_length=MAX_LIST,
        description="Flushes an operator sends to the router at set times; default none")
    faults: list[Fault] = Field(default_factory=list, max_length=MAX_LIST,
                                description="Faults (pdsim.engine.faults; `pdsim faults` "
                                "lists kinds and presets)")
    reference: list[ReferenceFigure] = Field(
        default_factory=list, max_length=MAX_LIST,
        description="Reported figures to compare against (report only)")
    slo: SLOConfig = Field(SLOConfig(), description="Service-level objectives for goodput and "
                           "SLO attainment (TTFT, TPOT, E2E thresholds in ms; metrics only); "
                           "default none set")
    _context: Context | None = PrivateAttr(None)
    # None, not default_factory=list: pydantic inspects a factory's signature on every
    # validation (~0.25 ms each, and a load validates the scenario once per unknown's end)
    _unknowns: list | None = PrivateAttr(None)

    # where it came from (the report tells a what-if from the scenario its figures belong to)
    _source: str | None = PrivateAttr(None)
    _overrides: tuple[str, ...] = PrivateAttr(())
    _inherits: str = PrivateAttr("")  # a dict's extends: whose reported figures it took
    # the name of the extends: parent whose reference: figures these are ("": its own)
    _reference_owner: str = PrivateAttr("")

    def input_files(self) -> dict[Path, str]:
        """Every file this scenario was read from, resolved, and what it is: the scenario
        file and its ``extends:`` parents, profile files, traces and ShareGPT-style length
        pairs (an output must not replace one: ``pdsim.cli``)."""
        ctx = self._context
        out = dict(ctx.files) if ctx is not None else {}
        if ctx is not None:
            for i, rel in enumerate(self.profiles):
                try:
                    out.setdefault(ctx.resolve(rel, f"'profiles.{i}'"), "profile file")
                except UserFileError:  # (it loaded: only a file changed since fails here)
                    pass
        for c in self.clients:
            ds = getattr(c, "dataset", None)
            if getattr(ds, "kind", "") in ("trace", "sharegpt"):  # (files of length pairs)
                out.setdefault(ds.resolved_path.resolve(), f"{ds.kind} file")
        return out

    @property
    def unknowns(self) -> list[unknowns.Unknown]:
        """Declared unknowns (pdsim/config/unknowns.py); this scenario holds their nominal
        values."""
        if self._unknowns is None:
            self._unknowns = []
        return self._unknowns

    @model_validator(mode="before")
    @classmethod
    def _release_blacklist(cls, data: Any) -> Any:
        """``blacklist.policy`` left out: the release's default (0.5.23: the probe with
        backoff and idle drop, ``v0_5_23``; earlier: ``permanent``)."""
        if not isinstance(data, dict):
            return data
        eng = data.get("engine")
        version = eng.get("version") if isinstance(eng, dict) else None
        if version not in SGLANG_VERSIONS:
            return data
        policy = next((p for floor, p in BLACKLIST_BY_VERSION if at_least(version, floor)),
                      None)
        bl = data.get("blacklist")
        if policy is None or not (bl is None or isinstance(bl, dict)):
            return data
        bl = dict(bl or {})
        if "policy" in bl or "preset" in bl:
            return data
        return {**data, "blacklist": {**bl, "policy": policy}}

    @property
    def pd(self) -> dict[str, Any]:
        """Every switch of ``disaggregation:`` as this scenario runs it: its own value, else
        the value of the release in ``engine.version``."""
        return PD_PATHS.resolve(self.disaggregation, self.engine.version)

    @field_validator("clients")
    @classmethod
    def _names_unique(cls, clients: list) -> list:
        names = [c.name for c in clients]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"client names must be unique (set 'name'); repeated: "
                             f"{clip(', '.join(sorted(dup)))}")
        return clients

    def check(self, ctx: Context) -> None:
        _ticks(ctx, "timeseries_interval_s", self.timeseries_interval_s, "time-series samples")
        total = sum(c.most_requests() for c in self.clients)
        if total > MAX_TOTAL_REQUESTS:
            raise Invalid("clients", f"the clients can send up to {total:,} requests (bench: "
                          f"num_prompts + warmup_requests; eval: questions x tries x "
                          f"(sdk_retries + 1)); at most {MAX_TOTAL_REQUESTS:,}")
        blocks = sum(c.num_prompts * math.ceil(c.dataset.input_len / 512)
                     for c in self.clients if c.kind == "bench" and c.dataset.kind == "random")
        blocks += sum(c.num_prompts * math.ceil(c.dataset._longest / 512)  # (at most)
                      for c in self.clients if c.kind == "bench" and c.dataset.kind == "sharegpt")
        if blocks > MAX_PROMPT_BLOCKS:
            raise Invalid("clients", f"the random and sharegpt prompts hold up to {blocks:,} "
                          f"prefix blocks (num_prompts x input_len / 512); at most "
                          f"{MAX_PROMPT_BLOCKS:,}")
        if self.fleet.mode == "colocated":  # (no prefill and decode legs, no KV transfers)
            own = self.disaggregation.model_dump(exclude_none=True)
            if own:
                raise Invalid("disaggregation", f"applies to a PD fleet (fleet.mode: pd); a "
                              f"colocated fleet has no KV transfer between servers; remove "
                              f"{', '.join(own)}")
            if self.router.dispatch != "mini_lb_gather" or self.router.ttft_timeout_s:
                raise Invalid("router", "dispatch and ttft_timeout_s apply to a PD fleet's "
                              "router (a prefill and a decode leg per request); a colocated "
                              "fleet's gateway sends each request to one server")
            pd_only = _pd_only_keys(self)
            if pd_only:
                raise Invalid(pd_only[0], f"applies to a PD fleet (fleet.mode: pd); a colocated "
                              f"fleet sends no KV between servers (no transfer engine, no "
                              f"blacklist) and would ignore it: remove {', '.join(pd_only)}")
        wait = getattr(self.disaggregation, "req_waiting_timeout_s", None)
        if wait is not None and not at_least(self.engine.version, "0.5.20"):
            raise Invalid("disaggregation.req_waiting_timeout_s", f"SGLANG_REQ_WAITING_TIMEOUT "
                          f"is not checked by PD schedulers before 0.5.20 (only in "
                          f"get_next_batch_to_run, which PD event loops never call); engine."
                          f"version is {self.engine.version}: set it to 0.5.20 or later, or "
                          f"leave this unset", wait)
        n_decode = _decode_ranks(self)
        if self.transfer.base_port + n_decode - 1 > 65535:
            raise Invalid("transfer.base_port", f"base_port + {n_decode} decode ranks passes "
                          f"port 65535", self.transfer.base_port)


def _pd_only_keys(sc: Scenario) -> list[str]:
    """The keys of a PD fleet's sections (the transfer engine, its blacklist, which transfers a
    flush dooms, which leg a TTFT timeout cancels) this scenario sets to other than their
    defaults: a colocated fleet has none of these and would run as if they were not there.
    By value, not by what the file wrote: a scenario reloaded from its dump sets every key."""
    out = [f"transfer.{k}" for k, v in type(sc.transfer)().model_dump().items()
           if getattr(sc.transfer, k) != v]
    policy = next((p for floor, p in BLACKLIST_BY_VERSION
                   if at_least(sc.engine.version, floor)), None)
    default = BLACKLIST_POLICIES.validate({"policy": policy} if policy else {})
    if sc.blacklist != default:
        mine, theirs = sc.blacklist.model_dump(), default.model_dump()
        out += [f"blacklist.{k}" for k in mine if mine.get(k) != theirs.get(k)] or ["blacklist"]
    if sc.flush.dooms != type(sc.flush)().dooms:
        out.append("flush.dooms")
    if sc.router.ttft_timeout_cancels != type(sc.router)().ttft_timeout_cancels:
        out.append("router.ttft_timeout_cancels")
    return out


def _decode_ranks(sc: Scenario) -> int:
    """Decode ranks with a session port (a colocated fleet has no KV sessions)."""
    if sc.fleet.mode == "colocated":
        return 0
    return sc.fleet.decode.servers * sc.fleet.decode.dp


# --- step 5: load-time checks registered by other modules ------------------------------------

LoadCheck = Callable[["Scenario", Context], None]
_LOAD_CHECKS: list[LoadCheck] = []
# Modules registering the built-in checks, imported on first use (they import this module):
# first, so that theirs run before any a plugin registers.
_BUILTIN_CHECKS = ["pdsim.model.memory"]


def _builtin_checks() -> list[LoadCheck]:
    while _BUILTIN_CHECKS:
        importlib.import_module(_BUILTIN_CHECKS.pop(0))
    return _LOAD_CHECKS


def load_check(fn: LoadCheck) -> LoadCheck:
    """Register ``fn(scenario, ctx)`` to run in every :func:`load` (and so in ``validate``).

    It raises :class:`Invalid` whose ``key`` is a full dotted path. Use it for checks that need
    a module above this one (building a predictor, sizing a KV pool, loading a profile file).
    """
    _builtin_checks().append(fn)
    return fn


# --- validation and errors --------------------------------------------------------------------


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


_TAGS = {"bench", "eval", "random", "trace", "float", "int", "str", "bool", "none"}


def _clean(loc: tuple) -> tuple:
    """Drop union branch names pydantic adds to a path (clients.0.bench.num_prompts)."""
    return tuple(p for p in loc if not (isinstance(p, str) and (p in _TAGS or "[" in p)))


def _path(loc: tuple) -> str:
    return clip(".".join(clip(str(p), 40) for p in _clean(loc)), 120)


def section_error(err: ValidationError, prefix: str) -> str:
    """One line for a section validated on its own (``blacklist``), keyed as in a scenario."""
    return _format_error(err, tuple(prefix.split(".")))


def _format_error(err: ValidationError, prefix: tuple = ()) -> str:
    errors = [dict(x, loc=prefix + tuple(x["loc"])) for x in err.errors()]
    e = errors[0]
    loc = tuple(e["loc"])
    path = _path(loc)
    same = [x for x in errors if _clean(tuple(x["loc"])) == _clean(loc)]
    rest = len(errors) - len(same)
    more = f" (and {rest} more)" if rest else ""
    if len(same) > 1 and e["type"] != "extra_forbidden":  # a union: list every alternative
        alts = "; or ".join(dict.fromkeys(x["msg"].removeprefix("Value error, ") for x in same))
        got = e.get("input")
        return f"invalid value at '{path}': {alts} (got {echo(got)}){more}"
    if e["type"] == "extra_forbidden":
        allowed = (_allowed_keys(Scenario, loc[:-1]) if _clean(loc[:-1]) != ("disaggregation",)
                   else [s.name for s in PD_PATHS.entries()])
        hint = f"; allowed keys here: {', '.join(allowed)}" if allowed else ""
        return f"unknown key '{path}'{hint}{more}"
    if e["type"] == "unknown_key":
        return f"unknown key '{path}': {e['msg']}{more}"
    if e["type"] == "missing":
        return f"missing required key '{path}'{more}"
    msg = e["msg"].removeprefix("Value error, ")
    got = e.get("input")
    shown = "" if isinstance(got, dict | list) else f" (got {echo(got)})"
    return f"invalid value at '{path or '<top>'}': {msg}{shown}{more}"


def _sections(model: BaseModel, path: str, out: list[tuple[Strict, str]]) -> None:
    """Append every section of a validated scenario to ``out``, children before parents,
    with its key path. (A list, not a generator: each section would otherwise pass through
    a generator per level above it; a scenario is validated once plus once per end of each
    declared unknown's range, pdsim.config.unknowns.finish.)"""
    for name in _field_names(type(model)):
        value = getattr(model, name)
        if type(value) in _LEAVES:  # (most fields: cheaper than an isinstance of a model)
            continue
        if isinstance(value, Strict):
            _sections(value, f"{path}.{name}" if path else name, out)
        elif isinstance(value, list):
            sub = f"{path}.{name}" if path else name
            for i, item in enumerate(value):
                if isinstance(item, Strict):
                    _sections(item, f"{sub}.{i}", out)
    if isinstance(model, Strict):
        out.append((model, path))


_FIELDS: dict[type, tuple[str, ...]] = {}
_LEAVES = frozenset((str, int, float, bool, type(None)))  # values that hold no section


def _field_names(cls: type[BaseModel]) -> tuple[str, ...]:
    """``cls.model_fields``' names, read once per class (a pydantic class property)."""
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = tuple(cls.model_fields)
    return names


def _invalid(err: Invalid, prefix: str) -> ScenarioError:
    path = ".".join(p for p in (prefix, err.key) if p) or "<top>"
    got = "" if err.got is _NOTHING else f" (got {echo(err.got)})"
    return ScenarioError(f"invalid value at '{clip(path, 120)}': {err.msg}{got}")


def check(sc: Scenario, ctx: Context) -> Scenario:
    """Steps 4-5: cross-field checks of every section, then the registered load-time checks."""
    base, root, outside = ctx.base_dir, ctx.root, ctx.allow_outside
    sections: list[tuple[Strict, str]] = []
    _sections(sc, "", sections)
    for section, path in sections:
        try:
            section.check(Context(base, root, outside, sc, path))
        except Invalid as err:
            raise _invalid(err, path) from None
    for fn in _builtin_checks():
        try:
            fn(sc, Context(base, root, outside, sc))
        except Invalid as err:
            raise _invalid(err, "") from None
    sc._context = Context(base, root, outside, files=ctx.files)
    return sc


def from_dict(data: Any, context: Context | None = None) -> Scenario:
    """Validate a plain dict (as loaded from YAML) into a :class:`Scenario`, with every check.

    Relative paths resolve against ``context`` (default: where ``data`` was read from, else the
    current directory, confined to it).
    """
    if not isinstance(data, dict):
        raise ScenarioError("a scenario must be a mapping of keys to values at the top level")
    ctx = context or getattr(data, "context", None) or Context.cwd()
    try:
        sc = Scenario.model_validate(dict(data))
    except ValidationError as err:
        raise ScenarioError(_format_error(err)) from None
    except RecursionError:
        raise ScenarioError("the scenario is nested too deeply") from None
    return check(sc, ctx)

"""Scenario format: typed, validated, bounded, with one-line errors that name the key path.

A scenario is YAML or a dict. :func:`load` runs the whole pipeline, and ``pdsim validate`` runs
exactly what ``pdsim run`` runs, so a scenario that validates does not fail at run time:

1. read YAML safely (:func:`read_yaml`): a size limit, strict UTF-8, a bounded loader (no
   duplicate keys, bounded nesting and alias expansion, no over-long integers, safe tags only);
   ``extends:`` merged, every path confined to the scenario's directory tree
(``pdsim.util.safeio``); 2. apply ``--set`` overrides (:func:`apply_overrides`), parsed with the
same loader; 3. pydantic validation: types, and documented bounds on every size and interval (the
   ``MAX_*``/``MIN_*`` constants below, shown in the JSON Schema and the README);
4. cross-field checks: each section may define ``check(self, ctx)``, called after validation
   with the validated scenario in ``ctx.scenario``; it raises :class:`Invalid` with a key
   relative to the section (``raise Invalid("decode_rank", "must be < 4 ...", got=7)``) and the
   message names the full path (``faults.1.decode_rank``). Add a ``check`` to a new fault kind
   or config section to get the same treatment;
5. load-time checks owned by other modules (the predictor builds, the KV pool fits, ...):
   register ``fn(scenario, ctx)`` with :func:`load_check`; it raises :class:`Invalid` with a
   full key path. File checks read through ``pdsim.util.safeio`` (``ctx.resolve(rel, what)``).

Every user error is a :class:`ScenarioError` whose ``str()`` is one line; echoed values are
capped and escaped (:func:`pdsim.util.safeio.echo`). Numeric fields use the aliases below
(``PosInt``, ``PosFloat``, ...), which reject ``true``/``false`` where a number is expected.
"""

from __future__ import annotations

import copy
import importlib
import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from pdsim.config import registry, trace, unknowns
from pdsim.config.registry import BLACKLIST_POLICIES, FAULTS
from pdsim.model import profiles
from pdsim.util import safeyaml
from pdsim.util.safeio import (
    UserFileError,
    clip,
    decode_utf8,
    echo,
    read_user_file,
    resolve_user_path,
    show_path,
)
from pdsim.util.safeyaml import MAX_INT_DIGITS, MAX_YAML_DEPTH, MAX_YAML_VALUES  # noqa: F401 (limits)

# --- limits (documented in the README; each error names the one it hit) ----------------------

MAX_FILE_BYTES = 256 << 10  # a scenario file (each file of an extends chain)
# MAX_YAML_DEPTH, MAX_YAML_VALUES, MAX_INT_DIGITS: pdsim.util.safeyaml's, imported above (limits())
MAX_EXTENDS = 16  # files in an extends chain
MAX_TIME_S = 1e7  # any simulated time, duration or timeout (~116 days)
MIN_INTERVAL_S = 1e-3  # shortest period of a recurring event (samples, heartbeats, probes)
MAX_TICKS = 200_000  # recurring events one period implies over the horizon (horizon / period)
MAX_PROBES = 50_000_000  # blacklist probes if every (prefill rank, decode session) pair probed
MAX_REQUESTS = 1_000_000  # prompts or questions of one client
MAX_TOTAL_REQUESTS = 4_000_000  # requests all clients can send, counting every retry
MAX_TOKENS = 10_000_000  # any length or budget in tokens
MAX_PROMPT_BLOCKS = 20_000_000  # prefix-block ids held by the random prompts of a scenario
MAX_SERVERS = 1024  # servers per role
MAX_DP = 1024  # DP ranks per server
MAX_TP = 1024  # tensor-parallel size
MAX_RANKS = 4096  # DP ranks per role (servers x dp)
MAX_RUNNING = 100_000  # max_running_requests per rank, concurrency limits
MAX_KV_TOKENS = 10**10  # KV pool per rank
MAX_PAGE_TOKENS = 65_536  # tokens per KV page or prefix block
MAX_THREADS = 100_000  # eval threads
MAX_TRIES = 30  # eval tries and SDK retries
MAX_QUEUES = 64  # transfer queues per prefill rank
MAX_COUNT = 1_000_000  # other counts (strikes, fan-out, heartbeat misses)
MAX_LIST = 1000  # entries of faults, operator_flushes, reference, clients
MAX_SEED = 2**64 - 1
MAX_MS = MAX_TIME_S * 1e3  # latencies and predictor terms in ms
MAX_NAME_CHARS = 100
MAX_TEXT_CHARS = 10_000


class ScenarioError(ValueError):
    """A scenario that cannot be run; ``str()`` is the one-line message for the user."""


_NOTHING = object()


class Invalid(Exception):
    """Raised by a cross-field ``check``: ``key`` (relative to the section), what is wrong and
    what is allowed, and the offending value."""

    def __init__(self, key: str, msg: str, got: Any = _NOTHING) -> None:
        super().__init__(msg)
        self.key, self.msg, self.got = key, msg, got


def _number(v: Any) -> Any:
    if isinstance(v, bool):
        raise ValueError(f"expected a number, not {str(v).lower()}")
    return v


_NUM = BeforeValidator(_number)
Int = Annotated[int, _NUM]
PosInt = Annotated[int, Field(gt=0), _NUM]
NonNegInt = Annotated[int, Field(ge=0), _NUM]
PosFloat = Annotated[float, Field(gt=0, allow_inf_nan=False), _NUM]
NonNegFloat = Annotated[float, Field(ge=0, allow_inf_nan=False), _NUM]
Fraction = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False), _NUM]
# a duration or timeout; a point in simulated time; the period of a recurring event
Seconds = Annotated[float, Field(gt=0, le=MAX_TIME_S, allow_inf_nan=False), _NUM]
Instant = Annotated[float, Field(ge=0, le=MAX_TIME_S, allow_inf_nan=False), _NUM]
Interval = Annotated[float, Field(ge=MIN_INTERVAL_S, le=MAX_TIME_S, allow_inf_nan=False),
                     _NUM]
Millis = Annotated[float, Field(ge=0, le=MAX_MS, allow_inf_nan=False), _NUM]
Tokens = Annotated[int, Field(gt=0, le=MAX_TOKENS), _NUM]
Seed = Annotated[int, Field(ge=0, le=MAX_SEED), _NUM]


def _name(v: Any) -> Any:
    if isinstance(v, str) and (not v.isprintable() or not v.strip()):
        raise ValueError("must be printable text: no control characters, escape sequences or "
                         "line breaks, not blank")
    return v


def _text(v: Any) -> Any:
    if isinstance(v, str) and not v.replace("\n", "").replace("\t", "").isprintable():
        raise ValueError("must be printable text (line breaks and tabs allowed; no control "
                         "characters or escape sequences)")
    return v


Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS), BeforeValidator(_name)]
Text = Annotated[str, Field(max_length=MAX_TEXT_CHARS), BeforeValidator(_text)]


@dataclass
class Context:
    """Where a scenario came from: relative paths resolve against ``base_dir`` and must stay
    in ``root`` (the scenario's directory tree) unless ``allow_outside``."""

    base_dir: Path
    root: Path
    allow_outside: bool = False
    scenario: Scenario | None = field(default=None, repr=False)  # set for checks
    path: str = ""  # key path of the section being checked

    @classmethod
    def cwd(cls, allow_outside: bool = False) -> Context:
        here = Path.cwd()
        return cls(here, here, allow_outside)

    def resolve(self, rel: str, what: str) -> Path:
        """A path named in the scenario, resolved and confined (``pdsim.util.safeio``)."""
        return resolve_user_path(self.base_dir, rel, what, self.allow_outside, self.root)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False, validate_default=True, defer_build=True)

    def check(self, ctx: Context) -> None:
        """Cross-field checks of this section (step 4); raise :class:`Invalid`."""


# --- fleet ---------------------------------------------------------------------------------


class RoleConfig(Strict):
    servers: PosInt = Field(1, le=MAX_SERVERS,
                            description="Servers of this role, each one SGLang server (its own "
                            "DP ranks, KV pools and prefix caches); default 1")
    dp: PosInt = Field(1, le=MAX_DP, description="DP ranks per server (--dp-size), each with its "
                       "own scheduler, KV pool and prefix cache; with dp_attention they share "
                       "the server's tp GPUs, without it each rank has tp GPUs of its own; "
                       "default 1")
    tp: PosInt = Field(1, le=MAX_TP, description="Tensor-parallel size (--tp-size). With "
                       "dp_attention: the server's GPUs, attention running over tp/dp of them "
                       "per DP rank and MLP/MoE over all tp. Without: each DP rank's GPUs, so a "
                       "server has dp x tp (SGLang's --dp N --tp M takes N*M GPUs); default 1")
    dp_attention: bool = Field(False, description="DP attention (--enable-dp-attention): the "
                               "server's dp ranks share its tp GPUs, each running attention on "
                               "its own requests over tp/dp of them; tp must be a multiple of "
                               "dp; default false")
    lockstep: bool | None = Field(
        None, description="DP ranks run each forward together (idle ranks run idle batches); "
        "default: on with dp_attention, off without")
    balance: Literal["round_robin", "total_tokens", "follow_bootstrap_room"] = Field(
        "round_robin", description="How a server spreads requests over its DP ranks "
        "(--load-balance-method); default round_robin"
    )
    max_running_requests: PosInt = Field(
        256, le=MAX_RUNNING, description="Requests running at once on each DP rank; default "
        "256. SGLang's --max-running-requests is this without DP attention, and dp times this "
        "with it (its model runner divides the flag by dp)")
    kv_pool_tokens: PosInt | None = Field(
        None, le=MAX_KV_TOKENS,
        description="KV pool of each DP rank in tokens (SGLang logs it as max_total_num_tokens); "
        "default: what mem_fraction_static of GPU memory leaves after the weights"
    )
    mem_fraction_static: Fraction = Field(
        0.8, description="Share of each GPU's memory for weights plus KV pool "
        "(--mem-fraction-static), used when kv_pool_tokens is unset; default 0.8")
    page_size: PosInt = Field(1, le=MAX_PAGE_TOKENS,
                              description="Tokens per KV page (--page-size); default 1")
    ep: PosInt = Field(1, le=MAX_TP, description="Expert-parallel size (--ep-size with DeepEP): "
                       "routed experts split over ep GPUs, tokens sent by all-to-all; default 1: "
                       "MoE weights tensor-parallel")

    @model_validator(mode="after")
    def _dp_fits_tp(self) -> RoleConfig:
        if self.dp_attention and self.tp % self.dp:
            raise ValueError(f"with dp_attention, tp ({self.tp}) must be a multiple of dp "
                             f"({self.dp})")
        if self.servers * self.dp > MAX_RANKS:
            raise ValueError(f"servers x dp = {self.servers * self.dp:,} DP ranks; at most "
                             f"{MAX_RANKS:,} per role")
        if self.ep > 1 and self.ep != self.tp:
            raise ValueError(f"ep ({self.ep}) must be 1 or equal tp ({self.tp}): SGLang splits "
                             f"experts over the server's tp GPUs")
        return self


class PrefillConfig(RoleConfig):
    chunked_prefill_size: Tokens | None = Field(
        None, description="--chunked-prefill-size of the server (SGLang semantics: under DP "
        "attention each rank gets size // dp). Unset: SGLang's default from GPU memory (8192 "
        "for 60-160 GB parts such as H20/H100/H200)"
    )
    prefix_cache: bool = Field(True, description="Radix (prefix) cache on each prefill rank "
                               "(false: SGLang's --disable-radix-cache); default true")
    prefix_block_tokens: PosInt = Field(512, le=MAX_PAGE_TOKENS,
                                        description="Tokens per prefix-cache block, what one "
                                        "trace hash_id stands for (512 in the Mooncake traces); "
                                        "default 512")


class DecodeConfig(RoleConfig):
    retract_reserve_tokens: NonNegInt = Field(
        0, le=MAX_TOKENS, description="Tokens of growth reserved per request at admission; "
        "default 0"
    )


class FleetConfig(Strict):
    gpu: str = Field(description="GPU profile name (pdsim profiles; or one a profile file adds)")
    model: str = Field(description="Model profile name")
    prefill: PrefillConfig = Field(PrefillConfig(), description="The prefill servers "
                                   "(--disaggregation-mode prefill); default: one, dp 1, tp 1")
    decode: DecodeConfig = Field(DecodeConfig(), description="The decode servers "
                                 "(--disaggregation-mode decode); default: one, dp 1, tp 1")
    engine: str = Field("sglang", max_length=MAX_NAME_CHARS,
                        description="Engine profile name (CPU-side and per-request costs); "
                        "default sglang")


# --- router, transfer, blacklist, flush, predictor -------------------------------------------


class RouterConfig(Strict):
    kind: Literal["mini_lb"] = Field("mini_lb", description="Request routing: random PD pairing")
    flush_handler: Literal["mini_lb_0.3.2", "mini_lb_fixed", "model_gateway", "rust_router"] = (
        Field("mini_lb_0.3.2", description="What the router's POST /flush_cache does")
    )
    request_timeout_s: Seconds = Field(
        1800.0, description="How long the router waits for a request's response before "
        "failing it; default 1800 s")
    fanout_concurrency: PosInt = Field(32, le=MAX_COUNT,
                                       description="Rust routers: concurrent flush fan-out")
    worker_timeout_s: Seconds = Field(5.0, description="sgl-model-gateway per-worker timeout")
    http_latency_ms: Millis = Field(0.5, description="One router<->server hop")


class TransferConfig(Strict):
    queues_per_rank: PosInt = Field(4, le=MAX_QUEUES,
                                    description="Mooncake transfer queues per prefill rank")
    call_latency_ms: Millis = Field(1.6, description="Fixed cost per batch write (ref 6)")
    nic_gbps: PosFloat | None = Field(None, ge=1e-3, le=1e6,
                                      description="NIC line rate; default from GPU profile")
    gpus_per_nic: PosInt | None = Field(None, le=MAX_TP, description="Default from GPU profile")
    peak_utilisation: Fraction = Field(0.84, description="168 GB/s over 4x400 GbE (ref 6)")
    min_utilisation: Fraction = Field(0.12, description="Utilisation floor for small writes")
    saturation_mb: PosFloat = Field(100.0, le=1e6,
                                    description="Write size reaching peak utilisation")
    transfer_timeout_s: Seconds = Field(
        30.0, description="MC_TRANSFER_TIMEOUT: a synchronous batch write gives up (ret != 0) "
        "after this plus 1 ns per byte (Mooncake transfer_engine_py.cpp); what a write to a "
        "peer that does not answer costs")
    qp_retry_s: Seconds = Field(
        0.537, description="How long an RDMA write to a peer that does not acknowledge retries "
        "before the QP errors: IB local ACK timeout 4.096 us x 2^14 x (retry_cnt 7 + 1) "
        "(Mooncake rdma_endpoint.cpp TIMEOUT=14, RETRY_CNT=7). A crashed peer's writes fail "
        "after this (its reconnect is refused); shorter outages cost nothing")
    bootstrap_timeout_s: Seconds = Field(
        300.0, description="SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT: a prefill fails a request "
        "whose decode has not bootstrapped its room by then; default 300 s")
    waiting_timeout_s: Seconds = Field(
        300.0, description="SGLANG_DISAGGREGATION_WAITING_TIMEOUT: a decode fails a request "
        "whose KV has not arrived by then; default 300 s")
    base_port: PosInt = Field(17000, le=65535, description="First decode session rpc port")


BLACKLIST_POLICIES.renamed["recovery"] = (
    "blacklist.recovery is now blacklist.policy (none -> permanent; probe; v0_5_23; also ttl, "
    "strikes_window, circuit_breaker, never)")
BlacklistConfig = Annotated[registry.Params, BLACKLIST_POLICIES.field()]
"""``blacklist:``: ``policy`` names a registered policy (pdsim.engine.blacklist); its parameters sit
beside it and are checked by the policy's own model (with a ``check(ctx)`` like any section)."""


class FlushConfig(Strict):
    semantics: Literal["skip_idle_check", "reject_if_busy"] = Field(
        "skip_idle_check",
        description="Immediate path (timeout<=0): flush regardless (incident report) or 400 when "
        "busy (released 0.5.10-0.5.23)",
    )
    dooms: Literal["source", "source_and_destination", "source_and_unstarted"] = Field(
        "source_and_destination",
        description="Which transfers a flush fails (an assumption: the write-up only says the "
        "engine 'reads a freshly freed buffer'). source: those reading prefill pages the flush "
        "freed (forward, chunked, in-flight); source_and_destination: also those writing into "
        "decode pages it freed, once their prefill has started; source_and_unstarted: also "
        "rooms pre-allocated on the decode whose prefill has not started",
    )


Coefficient = Annotated[float, Field(ge=0, le=MAX_MS, allow_inf_nan=False), _NUM]
FITTED_KEYS = ("prefill_a_ms", "prefill_b_ms_per_ktok", "prefill_c_ms_per_mtok2",
               "decode_a_ms", "decode_b_ms_per_ktok", "decode_c_ms_per_seq")


class PredictorConfig(Strict):
    kind: Literal["operator", "fitted", "roofline"] = Field(
        "operator", description="operator: per-layer GEMM/attention/MoE/communication model "
        "from the GPU, model and engine profiles; fitted: a + b*... coefficients from the model "
        "profile; roofline: one MFU and one HBM derate")
    two_batch_overlap: bool = Field(
        False, description="operator: --enable-two-batch-overlap (communication hidden under "
        "the other micro-batch's computation)")
    expert_imbalance: Annotated[float, Field(ge=1, le=100, allow_inf_nan=False), _NUM] = Field(
        1.0, description="operator, EP: busiest expert-GPU load over the mean (1: balanced; "
        "a measured value from SGLang's expert distribution recorder)")
    coefficients: dict[str, Coefficient] = Field(
        default_factory=dict, description="fitted: override coefficients by name (ms terms, "
        f"finite, 0..{MAX_MS:g})"
    )
    prefill_mfu: Fraction = Field(0.35, description="Roofline: achieved fraction of peak FLOP/s")
    hbm_derate: Fraction = Field(0.8, description="Roofline: achieved fraction of HBM bandwidth")
    step_overhead_ms: Millis = Field(5.0, description="Roofline: per-step launch overhead")

    def check(self, ctx: Context) -> None:
        unknown = sorted(set(self.coefficients) - set(FITTED_KEYS))
        if unknown:
            raise Invalid("coefficients", f"unknown {echo(unknown)}; allowed: "
                          f"{', '.join(FITTED_KEYS)}")
        if self.coefficients and self.kind != "fitted":
            raise Invalid("coefficients", f"belong to the fitted predictor; set "
                          f"predictor.kind: fitted (kind is {self.kind!r})")


# --- workload -------------------------------------------------------------------------------


class RandomDataset(Strict):
    kind: Literal["random"] = Field("random", description="random: lengths drawn as "
                                    "bench_serving's --dataset-name random does (the default)")
    input_len: Tokens = Field(1024, description="Longest prompt in tokens (bench_serving "
                              "--random-input-len); default 1024")
    output_len: Tokens = Field(1024, description="Longest output in tokens (bench_serving "
                               "--random-output-len); default 1024")
    range_ratio: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False), _NUM] = Field(
        0.0, description="Shortest length as a share of the longest (bench_serving "
        "--random-range-ratio); default 0")
    output_distribution: Literal["uniform", "geometric"] = Field(
        "uniform", description="uniform: bench_serving's [len*ratio, len]; geometric: mean "
        "output_len (memoryless, for queueing checks)")


class TraceDataset(Strict):
    kind: Literal["trace"] = Field(description="trace: replay a Mooncake trace file "
                                   "(bench_serving --dataset-name mooncake)")
    path: str = Field(description="Mooncake-format JSONL (timestamp ms, input/output_length), "
                      "relative to the scenario file; must stay in its directory tree")
    limit: PosInt | None = Field(None, le=MAX_REQUESTS,
                                 description="Replay only the trace's first rows (with "
                                 "num_prompts, the smaller wins); default: every row")
    time_scale: PosFloat = Field(1.0, le=1e6, description="Multiply inter-arrival times "
                                 "(bench_serving --mooncake-slowdown-factor); default 1")
    max_input_len: Tokens | None = Field(None, description="Cap each row's input_length at "
                                         "this many tokens; default: no cap")
    _resolved: Path | None = PrivateAttr(None)
    _rows: int | None = PrivateAttr(None)

    @property
    def resolved_path(self) -> Path:
        """The trace file, resolved against the scenario's directory at load time."""
        return self._resolved if self._resolved is not None else Path(self.path)


Dataset = Annotated[RandomDataset | TraceDataset, Field(discriminator="kind")]


class ClientFlush(Strict):
    mode: Literal["none", "bare", "raise_for_status", "timeout"] = Field(
        "none", description="POST /flush_cache after the warmup, as bench_serving does with "
        "--flush-cache (or SGLANG_IS_IN_CI): none; bare (no timeout, status ignored); "
        "raise_for_status (an HTTP error aborts the client); timeout (?timeout=timeout_s); "
        "default none"
    )
    timeout_s: Seconds = Field(60.0, description="The flush's ?timeout= in seconds, with mode "
                               "timeout; default 60")


class BenchClientConfig(Strict):
    kind: Literal["bench"] = Field(description="bench: python -m sglang.bench_serving "
                                   "--backend sglang")
    name: Name = Field("bench", description="Client name, unique among the clients, keying "
                       "its results; default bench")
    start_s: Instant = Field(0.0, description="Simulated time the client starts (its warmup) "
                             "at; default 0")
    dataset: Dataset = Field(RandomDataset(), description="Prompt lengths: random "
                             "(bench_serving's random dataset) or trace (a Mooncake trace); "
                             "default random")
    num_prompts: PosInt | None = Field(
        None, le=MAX_REQUESTS,
        description="Prompts to send; default: 1000 for a random dataset (bench_serving's "
        "default), every row of a trace (a smaller value replays the trace's first rows)")
    request_rate: Annotated[float, _NUM] | Literal["inf", "trace"] | None = Field(
        None, description="req/s, inf or trace (a trace's own timestamps); default: trace for "
        "a trace dataset (bench_serving replays a Mooncake trace by its timestamps whatever "
        "--request-rate says), inf otherwise (bench_serving's default)")
    max_concurrency: PosInt | None = Field(
        None, le=MAX_REQUESTS, description="Most requests in flight at once, the rest waiting "
        "FIFO (bench_serving --max-concurrency); default: no limit")
    warmup_requests: NonNegInt = Field(
        1, le=10_000, description="Warmup requests sent at once before the run, each the first "
        "prompt (bench_serving --warmup-requests); default 1")
    warmup_output_len: Tokens = Field(
        32, description="A warmup request's output is min(first prompt's, this) (bench_serving "
        "caps it at 32); default 32")
    flush: ClientFlush = Field(ClientFlush(), description="The cache flush after the warmup; "
                               "default none")
    stream: bool = Field(True, description="Streamed responses (false: bench_serving "
                         "--disable-stream); default true")

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
        if self.request_rate is None:
            self.request_rate = "trace" if self.dataset.kind == "trace" else "inf"
        return self

    def trace_limit(self) -> int | None:
        """Rows of a trace to replay: every row unless num_prompts or dataset.limit cuts it
        (the smaller wins)."""
        cuts = [n for n in (self.num_prompts, getattr(self.dataset, "limit", None))
                if n is not None]
        return min(cuts) if cuts else None

    def most_requests(self) -> int:
        prompts = self.num_prompts or getattr(self.dataset, "_rows", None) or 0
        return prompts + self.warmup_requests

    def check(self, ctx: Context) -> None:
        ds = self.dataset
        if self.request_rate == "trace" and ds.kind != "trace":
            raise Invalid("request_rate", "'trace' needs dataset.kind: trace", "trace")
        if ds.kind == "trace":
            try:
                p = ctx.resolve(ds.path, "trace file")
                rows = trace.check_trace(p, self.trace_limit())  # the client reads them later
            except (UserFileError, trace.TraceError) as err:
                raise Invalid("dataset.path", str(err)) from None
            if not rows:
                raise Invalid("dataset.path", "the trace file holds no requests")
            ds._resolved, ds._rows = p, rows


class EvalClientConfig(Strict):
    kind: Literal["eval"] = Field(description="eval: a gsm8k-style closed-loop eval "
                                  "(python -m sglang.test.run_eval), non-streaming, with retries")
    name: Name = Field("eval", description="Client name, unique among the clients, keying its "
                       "results; default eval")
    start_s: Instant = Field(0.0, description="Simulated time the eval starts at; default 0")
    questions: PosInt = Field(1400, le=MAX_REQUESTS, description="Questions asked (run_eval "
                              "--num-examples); default 1400")
    threads: PosInt = Field(128, le=MAX_THREADS, description="Questions in flight at once, one "
                            "per thread (run_eval --num-threads); default 128")
    dataset: RandomDataset = Field(
        RandomDataset(input_len=256, output_len=256, range_ratio=0.5),
        description="Question and answer lengths, drawn as a random dataset; default 256/256 "
        "tokens, range_ratio 0.5")
    max_tokens: Tokens = Field(512, description="Cap on each answer's tokens (run_eval "
                               "--max-tokens); default 512")
    tries: PosInt = Field(6, le=MAX_TRIES,
                          description="Sampler tries; after failed try k it sleeps 2^k s "
                          "(after the last one too, then answers empty); default 6")
    sdk_retries: NonNegInt = Field(2, le=MAX_TRIES,
                                   description="HTTP SDK retries on status >= 500; default 2")
    sdk_backoff_s: Annotated[float, Field(ge=0, le=MAX_TIME_S, allow_inf_nan=False), _NUM] = Field(
        0.5, description="SDK initial backoff, doubled per retry; default 0.5 s")

    def most_requests(self) -> int:
        return self.questions * self.tries * (self.sdk_retries + 1)


ClientConfig = Annotated[BenchClientConfig | EvalClientConfig, Field(discriminator="kind")]


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


GPUOverrides = profiles.GPUOverrides
ModelOverrides = profiles.ModelOverrides
EngineOverrides = profiles.EngineOverrides


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
    engine: EngineOverrides = Field(  # type: ignore[valid-type]
        default_factory=EngineOverrides, description="Override engine profile values, e.g. "
        "bootstrap_ms: 5")
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
    _context: Context | None = PrivateAttr(None)
    # None, not default_factory=list: pydantic inspects a factory's signature on every
    # validation (~0.25 ms each, and a load validates the scenario once per unknown's end)
    _unknowns: list | None = PrivateAttr(None)

    # where it came from (the report tells a what-if from the scenario its figures belong to)
    _source: str | None = PrivateAttr(None)
    _overrides: tuple[str, ...] = PrivateAttr(())
    _inherits: str = PrivateAttr("")  # a dict's extends: whose reported figures it took

    @property
    def unknowns(self) -> list[unknowns.Unknown]:
        """Declared unknowns (pdsim/config/unknowns.py); this scenario holds their nominal
        values."""
        if self._unknowns is None:
            self._unknowns = []
        return self._unknowns

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
        if blocks > MAX_PROMPT_BLOCKS:
            raise Invalid("clients", f"the random prompts hold {blocks:,} prefix blocks "
                          f"(num_prompts x input_len / 512); at most {MAX_PROMPT_BLOCKS:,}")
        n_decode = _decode_ranks(self)
        if self.transfer.base_port + n_decode - 1 > 65535:
            raise Invalid("transfer.base_port", f"base_port + {n_decode} decode ranks passes "
                          f"port 65535", self.transfer.base_port)


def _decode_ranks(sc: Scenario) -> int:
    return sc.fleet.decode.servers * sc.fleet.decode.dp


def _ticks(ctx: Context, key: str, period: float, what: str) -> None:
    """Bound the recurring events a period implies over the horizon."""
    horizon = ctx.scenario.horizon_s
    n = horizon / period
    if n > MAX_TICKS:
        raise Invalid(key, f"horizon_s / {key.rsplit('.', 1)[-1]} = {n:,.0f} {what}; at most "
                      f"{MAX_TICKS:,}: raise the period to >= {horizon / MAX_TICKS:.4g} s or "
                      f"shorten horizon_s", period)


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


# --- reading YAML safely (pdsim.util.safeyaml) -------------------------------------------------


def parse_yaml(text: str, what: str) -> Any:
    """:func:`pdsim.util.safeyaml.parse_yaml`, its errors as :class:`ScenarioError`."""
    try:
        return safeyaml.parse_yaml(text, what)
    except safeyaml.YamlError as err:
        raise ScenarioError(str(err)) from None


class ScenarioData(dict):
    """A scenario as read from a file: the raw mapping plus where it came from (its
    :class:`Context`), which survives copies and pickling (process pools)."""

    context: Context | None = None


def _with_context(data: dict, ctx: Context | None) -> ScenarioData:
    out = data if isinstance(data, ScenarioData) else ScenarioData(data)
    out.context = ctx
    return out


# Paths (dotted, '*' for any list index) that hold file names; an extends parent's relative
# paths are rewritten to stay relative to the top-level file. Add a key here when the format
# gains a file reference.
PATH_KEYS: list[tuple[str, ...]] = [("clients", "*", "dataset", "path"), ("profiles", "*")]


def _rebase_paths(data: Any, src_dir: Path, top_dir: Path) -> None:
    if src_dir == top_dir:
        return

    def visit(node: Any, keys: tuple[str, ...]) -> None:
        if not keys:
            return
        head, rest = keys[0], keys[1:]
        items = (list(enumerate(node)) if head == "*" and isinstance(node, list) else
                 [(head, node.get(head))] if isinstance(node, dict) and head in node else [])
        for k, v in items:
            if not rest:
                if isinstance(v, str) and v and not Path(v).is_absolute():
                    node[k] = os.path.relpath(src_dir / v, top_dir)
            else:
                visit(v, rest)

    for keys in PATH_KEYS:
        visit(data, keys)


def read_yaml(path: str | Path, _seen: tuple = (), *, allow_outside_paths: bool = False,
              _ctx: Context | None = None, _via: str = "scenario file") -> ScenarioData:
    """Read a scenario file safely; ``extends: other.yaml`` (relative to this file, inside the
    scenario's directory tree) is merged under it."""
    p = Path(path)
    what = show_path(p) if _ctx is None else show_path(p.name)
    try:
        if _ctx is None:
            top = p.parent.resolve()
            _ctx = Context(top, top, allow_outside_paths)
        raw = read_user_file(p, _via, MAX_FILE_BYTES)
        text = decode_utf8(raw, what)
    except UserFileError as err:
        raise ScenarioError(str(err)) from None
    except (OSError, RuntimeError, ValueError):
        raise ScenarioError(f"scenario file: not a usable path: {what}") from None
    data = parse_yaml(text, what)
    data = data if data is not None else {}
    if isinstance(data, dict) and "extends" in data:
        parent = data.pop("extends")
        if len(_seen) >= MAX_EXTENDS:
            raise ScenarioError(f"{what}: 'extends' chain longer than {MAX_EXTENDS} files")
        try:
            ppath = resolve_user_path(p.parent, parent, f"{what}: 'extends'",
                                      _ctx.allow_outside, _ctx.root)
        except UserFileError as err:
            raise ScenarioError(str(err)) from None
        if ppath in (*_seen, p.resolve()):
            raise ScenarioError(f"{what}: 'extends' loops back to {show_path(ppath.name)}")
        base = read_yaml(ppath, (*_seen, p.resolve()), _ctx=_ctx, _via=f"{what}: 'extends'")
        if not isinstance(base, dict):
            raise ScenarioError(f"{what}: 'extends' file {show_path(parent)} is not a scenario "
                                f"(its top level is not a mapping)")
        _rebase_paths(base, ppath.parent, p.parent.resolve())
        data = _merge(base, data)
    if not isinstance(data, dict):
        return data  # from_dict says it must be a mapping
    return _with_context(data, _ctx)


def _merge(base: dict, over: dict, top: bool = True) -> dict:
    """Deep-merge ``over`` into ``base``: mappings merge, everything else (lists too) replaces.
    A ``blacklist`` that names another policy keeps only the base's keys that policy has
    (:func:`switch_entry`)."""
    out = dict(base)
    for k, v in over.items():
        leaf = unknowns.is_declaration(v) or unknowns.is_declaration(out.get(k))
        if isinstance(v, dict) and isinstance(out.get(k), dict) and not leaf:
            old = out[k]
            if top and k in _SWITCHED:
                reg = _SWITCHED[k]
                old = switch_entry(old, reg, v.get(reg.key, _entry_name(old, reg)))
            out[k] = _merge(old, v, False)
        else:
            out[k] = v
    return out


# Sections that name a registered entry (``blacklist: {policy: ...}``), by their top-level key;
# the items of ``faults:`` are one too, when a --set names another kind (``faults.0.kind=...``)
_SWITCHED = {"blacklist": BLACKLIST_POLICIES}


def _entry_name(section: dict, reg: registry.Registry) -> Any:
    """The entry a section names: its key, else its preset's, else the registry's default."""
    if reg.key in section:
        return section[reg.key]
    preset = section.get("preset")
    if isinstance(preset, str) and preset in reg.presets:
        return reg.presets[preset][0].get(reg.key)
    return reg.default


def switch_entry(section: dict, reg: registry.Registry, name: Any,
                 given: Iterable[str] = ()) -> dict:
    """``section`` (of entry ``_entry_name(section)``) made over to entry ``name``: when that is
    another entry, the keys it has no parameter for are dropped (they were the old entry's:
    ``strikes`` of a strikes policy under ``--set blacklist.policy=never``); the keys it shares
    are kept, and so are the keys in ``given`` (the user's own, for validation to judge). An
    unknown name is left for validation to report."""
    if not isinstance(name, str) or name == _entry_name(section, reg) or name not in reg:
        return section
    keep = set(reg.get(name).model.model_fields) | set(given)
    return {k: v for k, v in section.items() if k in keep}


def apply_overrides(data: dict, sets: list[str]) -> dict:
    """Apply ``dotted.key=value`` overrides; values are parsed as YAML (bounded loader)."""
    ctx = getattr(data, "context", None)
    data = copy.deepcopy(dict(data))
    given: set[tuple[str, ...]] = set()  # the keys these overrides set, in order
    for item in sets:
        if not isinstance(item, str) or "=" not in item:
            raise ScenarioError(f"--set expects dotted.key=value, got {echo(item)}")
        key, raw = item.split("=", 1)
        shown = clip(key, 80)
        parts = key.split(".")
        if not key or any(not p for p in parts):
            raise ScenarioError(f"--set {shown}: a dotted key has no empty parts, e.g. "
                                f"clients.0.num_prompts=200")
        value = parse_yaml(raw, f"--set {shown}") if raw.strip() else None
        cur: Any = data
        for i, part in enumerate(parts[:-1]):
            nxt = parts[i + 1]
            here = ".".join(parts[: i + 1])
            if isinstance(cur, list):
                if not part.isdigit() or int(part) >= len(cur):
                    raise ScenarioError(f"--set {shown}: '{clip(here, 80)}' is not an index "
                                        f"into a list of {len(cur)}")
                child = cur[int(part)]
                if child is None:
                    child = cur[int(part)] = [] if nxt.isdigit() else {}
            elif isinstance(cur, dict):
                child = cur.get(part)
                if child is None:
                    child = cur[part] = [] if nxt.isdigit() else {}
            else:
                raise ScenarioError(f"--set {shown}: '{clip('.'.join(parts[:i]), 80)}' is a "
                                    f"{type(cur).__name__} ({echo(cur)}), not a mapping or list")
            cur = child
        last = parts[-1]
        if isinstance(cur, list):
            if not last.isdigit() or int(last) > len(cur):
                raise ScenarioError(f"--set {shown}: {echo(last)} is not an index into a list "
                                    f"of {len(cur)} (use {len(cur)} to append)")
            if int(last) == len(cur):
                cur.append(value)
            else:
                cur[int(last)] = value
        elif isinstance(cur, dict):
            reg = _switched_at(parts)
            if reg is not None and last == reg.key:  # another policy or fault kind: its keys,
                # and those an earlier --set gave (kept, for validation to judge)
                at = tuple(parts[:-1])
                kept = switch_entry(cur, reg, value, [k[-1] for k in given if k[:-1] == at])
                if kept is not cur:
                    cur.clear()
                    cur.update(kept)
            cur[last] = value
            given.add(tuple(parts))
        else:
            raise ScenarioError(f"--set {shown}: '{clip('.'.join(parts[:-1]), 80)}' is a "
                                f"{type(cur).__name__} ({echo(cur)}), not a mapping or list")
    return _with_context(data, ctx)


def _switched_at(parts: list[str]) -> registry.Registry | None:
    """The registry whose entry the dotted key ``parts`` lies in (``blacklist.x``,
    ``faults.N.x``), if any."""
    if len(parts) == 2 and parts[0] in _SWITCHED:
        return _SWITCHED[parts[0]]
    if len(parts) == 3 and parts[0] == "faults" and parts[1].isdigit():
        return FAULTS
    return None


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
        allowed = _allowed_keys(Scenario, loc[:-1])
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
    sc._context = Context(base, root, outside)
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


def _nesting(data: Any) -> None:
    """A dict given in Python is held to a YAML file's limits on nesting (a self-referring one
    never ends) and on values (a list holding itself twice, 40 deep, is 2^40 of them),
    iteratively: walking it recursively is what would overflow."""
    stack = [(data, 1, "")]
    seen = 0  # values visited, shared ones each time (as YAML counts an alias's expansion)
    while stack:
        node, depth, path = stack.pop()
        seen += 1
        if seen > MAX_YAML_VALUES:
            raise ScenarioError(f"the scenario holds more than {MAX_YAML_VALUES:,} values "
                                f"(shared ones counted each time they appear)")
        if depth > MAX_YAML_DEPTH:
            raise ScenarioError(f"the scenario is nested deeper than {MAX_YAML_DEPTH} levels "
                                f"(or refers to itself) at '{clip(path, 120)}'")
        if isinstance(node, dict):
            stack.extend((v, depth + 1, f"{path}.{k}" if path else str(k))
                         for k, v in node.items())
        elif isinstance(node, list | tuple):
            stack.extend((v, depth + 1, f"{path}.{i}") for i, v in enumerate(node))


def as_data(source: str | Path | dict, allow_outside_paths: bool = False,
            _dumped: bool = False) -> Any:
    """The raw scenario mapping of a path or dict, carrying where its paths resolve (a dict:
    its own context if read from a file, else the current directory). ``_dumped``: the dict
    of a validated Scenario (its defaults filled in: not held to a file's value count)."""
    if isinstance(source, dict):
        if not _dumped:
            _nesting(source)
        ctx = getattr(source, "context", None) or Context.cwd()
        ctx = Context(ctx.base_dir, ctx.root, ctx.allow_outside or allow_outside_paths)
        data = dict(source)
        if "extends" in data:  # as in a file, relative to where the dict's paths resolve
            parent = data.pop("extends")
            try:
                ppath = resolve_user_path(ctx.base_dir, parent, "'extends'", ctx.allow_outside,
                                          ctx.root)
            except UserFileError as err:
                raise ScenarioError(str(err)) from None
            base = read_yaml(ppath, _ctx=ctx, _via="'extends'")
            if not isinstance(base, dict):
                raise ScenarioError(f"'extends' file {show_path(parent)} is not a scenario "
                                    f"(its top level is not a mapping)")
            _rebase_paths(base, ppath.parent, Path(ctx.base_dir).resolve())
            data = _merge(dict(base), data)
        return _with_context(data, ctx)
    return read_yaml(source, allow_outside_paths=allow_outside_paths)


def load(source: str | Path | dict | Scenario, sets: list[str] | None = None, *,
         allow_outside_paths: bool = False) -> Scenario:
    """Load a scenario from a YAML path, a dict or a Scenario, applying ``--set`` overrides.

    Paths in the scenario (``extends:``, trace files) resolve relative to the scenario file
    (for a dict: the current directory) and must stay in that directory tree unless
    ``allow_outside_paths``. Declared unknowns (``{uniform: [a, b], nominal: x}``,
    pdsim/config/unknowns.py) are resolved to their nominal values after the overrides and before
    validation; ``Scenario.unknowns`` lists them.
    """
    if not isinstance(source, str | os.PathLike | dict | Scenario):
        raise ScenarioError(f"a scenario is a YAML path, a dict or a Scenario, not "
                            f"{type(source).__name__}")
    if sets is not None and (isinstance(sets, str | bytes)
                             or not all(isinstance(x, str) for x in sets)):
        raise ScenarioError(f"sets: a list of 'dotted.key=value' strings, e.g. ['seed=2'] "
                            f"(got {echo(sets)})")
    origin, before, inherits, dumped = None, (), "", False
    if isinstance(source, Scenario):
        ctx = source._context
        if not sets and ctx is not None and (ctx.allow_outside or not allow_outside_paths):
            return source
        origin, before, inherits = source._source, source._overrides, source._inherits
        dumped = True
        ctx = ctx or Context.cwd()
        source = _with_context(unknowns.redeclare(source.model_dump(mode="json"),
                                                  source.unknowns), ctx)
    elif not isinstance(source, dict):
        origin = str(source)
    elif "extends" in source and "reference" not in source:
        inherits = clip(str(source["extends"]), 80)
    data = as_data(source, allow_outside_paths, _dumped=dumped)
    ctx = getattr(data, "context", None)
    if sets:
        data = apply_overrides(data, sets)
    try:
        resolved, declared = unknowns.resolve(data)
    except unknowns.UnknownError as err:
        raise ScenarioError(str(err)) from None
    data = _with_context(resolved, ctx) if isinstance(resolved, dict) else resolved
    sc = from_dict(data)
    if declared:
        try:
            sc._unknowns = unknowns.finish(data, declared, sc, from_dict)
        except unknowns.UnknownError as err:
            raise ScenarioError(str(err)) from None
    sc._source, sc._overrides = origin, (*before, *(sets or ()))
    sc._inherits = inherits
    return sc


def limits() -> dict[str, float]:
    """The documented limits, by name (the README's table): this module's, and those of the
    modules that read files (YAML, traces, profiles, paths) or fan runs out."""
    from pdsim.config import trace
    from pdsim.model import profiles
    from pdsim.util import backends, safeio

    out = {}
    for space in (globals(), *(vars(m) for m in (trace, profiles, safeio, backends))):
        out.update((k, v) for k, v in space.items()
                   if k.startswith(("MAX_", "MIN_")) and isinstance(v, (int, float)))
    return out


def json_schema() -> dict:
    """JSON Schema of a scenario file, for editors (yaml-language-server, VS Code).

    A file may ``extends:`` another, which can supply any top-level key, so the editor schema
    allows ``extends`` and requires nothing at the top; ``pdsim validate`` checks the merged
    scenario in full. Numeric and categorical values also accept a declared unknown.
    """
    schema = unknowns.schema_with_unknowns(
        registry.hoist(Scenario.model_json_schema()), skip_defs=("ReferenceFigure", "Seeds"))
    schema["properties"]["extends"] = {
        "type": "string", "title": "Extends",
        "description": "Scenario file (relative to this one, inside its directory tree) merged "
                       "under this one"}
    schema.pop("required", None)
    return schema

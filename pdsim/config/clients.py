"""The scenario's load generators (``clients:``): bench_serving-style clients and their
datasets (random lengths or a trace file), and gsm8k-style eval clients."""


from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    PrivateAttr,
    field_validator,
    model_validator,
)

from pdsim.config import datasets, trace
from pdsim.config.units import (
    _NUM,
    MAX_REQUESTS,
    MAX_THREADS,
    MAX_TIME_S,
    MAX_TRIES,
    Context,
    Instant,
    Invalid,
    Name,
    NonNegInt,
    PosFloat,
    PosInt,
    Seconds,
    Strict,
    Tokens,
)
from pdsim.util.safeio import (
    UserFileError,
)

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


DatasetName = Literal[tuple(datasets.DATASETS)]  # type: ignore[valid-type]


def _one_source(ds: Strict) -> None:
    """``path`` or ``name``, not both (pydantic has set the defaults: a name left out is
    not one given)."""
    if ds.path is not None and "name" in ds.model_fields_set and ds.name is not None:
        raise ValueError("give path (a file of yours) or name (a shipped dataset), not both")


def _resolve(ds: Strict, ctx: Context) -> Path:
    """The dataset's file: the user's ``path`` (confined to the scenario's tree) or the
    shipped ``name``'s."""
    if ds.path is not None:
        return ctx.resolve(ds.path, "trace file" if ds.kind == "trace" else "dataset file")
    return datasets.path(ds.name or datasets.DEFAULT)


class TraceDataset(Strict):
    kind: Literal["trace"] = Field(description="trace: replay a Mooncake trace file "
                                   "(bench_serving --dataset-name mooncake), or a shipped "
                                   "dataset (name) at its own arrival times")
    path: str | None = Field(None, description="Mooncake-format JSONL (timestamp ms, "
                             "input/output_length), relative to the scenario file; must stay "
                             "in its directory tree; give this or name")
    name: DatasetName | None = Field(None, description="A trace shipped with pdsim instead of "
                                     "a path: " + datasets.describe())
    limit: PosInt | None = Field(None, le=MAX_REQUESTS,
                                 description="Replay only the trace's first rows (with "
                                 "num_prompts, the smaller wins); default: every row")
    time_scale: PosFloat = Field(1.0, le=1e6, description="Multiply inter-arrival times "
                                 "(bench_serving --mooncake-slowdown-factor); default 1")
    max_input_len: Tokens | None = Field(None, description="Cap each row's input_length at "
                                         "this many tokens; default: no cap")
    _resolved: Path | None = PrivateAttr(None)
    _rows: int | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _source(self) -> TraceDataset:
        _one_source(self)
        if self.path is None and self.name is None:
            raise ValueError("give path (a Mooncake-format trace file) or name (a shipped "
                             f"one: {', '.join(datasets.DATASETS)})")
        return self

    @property
    def resolved_path(self) -> Path:
        """The trace file, resolved against the scenario's directory at load time."""
        if self._resolved is not None:
            return self._resolved
        return Path(self.path) if self.path is not None else datasets.path(self.name)


class ShareGPTDataset(Strict):
    kind: Literal["sharegpt"] = Field(
        description="sharegpt: prompt/output length pairs sampled as bench_serving's "
        "--dataset-name sharegpt samples ShareGPT (shuffled with the seed; pairs with a "
        "prompt or output under 2 tokens, or longer than context_len, left out; each pair's "
        "own output length unless output_len), from a conversation-length dataset shipped "
        "with pdsim (name; ShareGPT itself is not shipped: pdsim/config/datasets.py says "
        "why) or a file of yours (path). Arrivals follow request_rate")
    name: DatasetName | None = Field(None, description="Shipped length pairs (default "
                                     f"{datasets.DEFAULT}): " + datasets.describe())
    path: str | None = Field(None, description="Instead of name: a JSONL file of "
                             "input_length/output_length pairs (the Mooncake trace format; "
                             "timestamps are not used), relative to the scenario file")
    output_len: Tokens | None = Field(None, ge=4, description="Every output this many tokens "
                                      "(bench_serving --sharegpt-output-len, at least 4); "
                                      "default: each pair's own")
    context_len: Tokens | None = Field(None, description="Leave out pairs whose prompt + output "
                                       "exceed this (bench_serving --sharegpt-context-len); "
                                       "default: keep every length")
    _resolved: Path | None = PrivateAttr(None)
    _usable: int | None = PrivateAttr(None)  # pairs left after the filters
    _longest: int = PrivateAttr(0)  # longest prompt among them

    @model_validator(mode="after")
    def _source(self) -> ShareGPTDataset:
        _one_source(self)
        return self

    @property
    def resolved_path(self) -> Path:
        """The length-pair file, resolved at load time (a shipped name's by default)."""
        if self._resolved is not None:
            return self._resolved
        return Path(self.path) if self.path is not None else datasets.path(
            self.name or datasets.DEFAULT)

    @property
    def label(self) -> str:
        """What the report says was sampled."""
        return self.path if self.path is not None else (self.name or datasets.DEFAULT)


Dataset = Annotated[RandomDataset | TraceDataset | ShareGPTDataset, Field(discriminator="kind")]


def sharegpt_usable(ins: int, out: int, output_len: int | None,
                    context_len: int | None) -> bool:
    """Whether bench_serving's ShareGPT sampling keeps a pair of ``ins`` prompt and ``out``
    output tokens: prompt and output (``output_len`` when fixed) at least 2 tokens, and their
    sum at most ``context_len`` when set (sgl-project/sglang
    python/sglang/benchmark/datasets/sharegpt.py, sample_sharegpt_requests; before the
    benchmark package, python/sglang/bench_serving.py)."""
    if output_len is not None:
        out = output_len
    return ins >= 2 and out >= 2 and not (context_len and ins + out > context_len)


class ClientFlush(Strict):
    mode: Literal["none", "bare", "raise_for_status", "timeout"] = Field(
        "none", description="POST /flush_cache after the warmup, as bench_serving does with "
        "--flush-cache (or SGLANG_IS_IN_CI): none; bare (no timeout, status ignored); "
        "raise_for_status (an HTTP error aborts the client); timeout (?timeout=timeout_s); "
        "default none"
    )
    timeout_s: Seconds = Field(60.0, description="The flush's ?timeout= in seconds, with mode "
                               "timeout; default 60 (bench_serving's --flush-cache-timeout "
                               "default, SGLang PR #33663)")


class BenchClientConfig(Strict):
    kind: Literal["bench"] = Field(description="bench: python -m sglang.bench_serving "
                                   "--backend sglang")
    name: Name = Field("bench", description="Client name, unique among the clients, keying "
                       "its results; default bench")
    start_s: Instant = Field(0.0, description="Simulated time the client starts (its warmup) "
                             "at; default 0")
    dataset: Dataset = Field(RandomDataset(), description="Prompt lengths: random "
                             "(bench_serving's random dataset), sharegpt (conversation length "
                             "pairs, sampled as bench_serving samples ShareGPT) or trace (a "
                             "Mooncake trace); default random")
    num_prompts: PosInt | None = Field(
        None, le=MAX_REQUESTS,
        description="Prompts to send; default: 1000 for a random or sharegpt dataset "
        "(bench_serving's default), every row of a trace (a smaller value replays the "
        "trace's first rows)")
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
    sdk_retries: NonNegInt = Field(
        0, le=MAX_TRIES, description="Retries of a request answered 408, 429 or >= 500 (a "
        "router's 502, a gateway's 504, a non-streamed 500), each a new request on a new pair, "
        "as an OpenAI SDK client's max_retries; a streamed abort is an HTTP 200 and is not "
        "retried. bench_serving has none; default 0")
    sdk_backoff_s: Annotated[float, Field(ge=0, le=MAX_TIME_S, allow_inf_nan=False), _NUM] = Field(
        0.5, description="Wait before the first retry, doubled per retry up to 8 s (the OpenAI "
        "SDK's INITIAL_RETRY_DELAY and MAX_RETRY_DELAY, without its jitter); default 0.5 s")

    @field_validator("request_rate")
    @classmethod
    def _rate(cls, v: Any) -> Any:
        if isinstance(v, float) and (v <= 0 or math.isnan(v)):
            raise ValueError("must be > 0, 'inf' or 'trace'")
        return v

    @model_validator(mode="after")
    def _default_prompts(self) -> BenchClientConfig:
        if self.num_prompts is None and self.dataset.kind != "trace":
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

    def prompts(self) -> int:
        """The prompts the client means to send: ``num_prompts`` of a random dataset, the rows
        of a trace it replays (counted when the scenario loaded)."""
        ds = self.dataset
        if ds.kind != "trace":
            return self.num_prompts
        if ds._rows is None:  # (a config made without load)
            ds._rows = trace.check_trace(ds.resolved_path, self.trace_limit())
        return ds._rows

    def most_requests(self) -> int:
        prompts = self.num_prompts or getattr(self.dataset, "_rows", None) or 0
        return prompts * (self.sdk_retries + 1) + self.warmup_requests

    def check(self, ctx: Context) -> None:
        ds = self.dataset
        if self.request_rate == "trace" and ds.kind != "trace":
            raise Invalid("request_rate", "'trace' needs dataset.kind: trace", "trace")
        where = "dataset.path" if getattr(ds, "path", None) is not None else "dataset.name"
        if ds.kind == "trace":
            try:
                p = _resolve(ds, ctx)
                rows = trace.check_trace(p, self.trace_limit())  # the client reads them later
            except (UserFileError, trace.TraceError) as err:
                raise Invalid(where, str(err)) from None
            if not rows:
                raise Invalid(where, "the trace file holds no requests")
            ds._resolved, ds._rows = p, rows
        elif ds.kind == "sharegpt":
            try:
                p = _resolve(ds, ctx)
                rows = trace.read_rows(p, pairs=True)  # (the client samples the same rows, cached)
            except (UserFileError, trace.TraceError) as err:
                raise Invalid(where, str(err)) from None
            usable = [r[1] for r in rows
                      if sharegpt_usable(r[1], r[2], ds.output_len, ds.context_len)]
            if len(usable) < self.num_prompts:
                raise Invalid("num_prompts", f"{self.num_prompts:,} prompts, but {ds.label} "
                              f"holds {len(usable):,} usable pairs (of {len(rows):,}: prompt "
                              f"and output at least 2 tokens"
                              + (f", prompt + output <= context_len {ds.context_len:,}"
                                 if ds.context_len else "") + "); send fewer",
                              self.num_prompts)
            ds._resolved, ds._usable, ds._longest = p, len(usable), max(usable)


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

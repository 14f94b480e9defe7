"""Clients: a ``bench_serving``-like benchmark and a gsm8k-style closed-loop eval.

Both talk to the router only. Their randomness comes from the ``arrivals`` and ``lengths``
streams, never from the fleet's.
"""

from __future__ import annotations

import math
from collections.abc import Generator
from typing import TYPE_CHECKING

import numpy as np
import simpy

from pdsim.rng import Streams
from pdsim.scenario import BenchClientConfig, EvalClientConfig
from pdsim.trace import count_rows, open_trace, read_trace  # noqa: F401 (open_trace: API)

if TYPE_CHECKING:
    from pdsim.fleet import Fleet
    from pdsim.router import MiniLB


def random_lengths(rng: np.random.Generator, n: int, input_len: int, output_len: int,
                   ratio: float, output_distribution: str = "uniform"
                   ) -> tuple[np.ndarray, np.ndarray]:
    """bench_serving ``random`` dataset: uniform in [len*ratio, len] (at least 1)."""
    ins = rng.integers(max(int(input_len * ratio), 1), input_len + 1, size=n)
    if output_distribution == "geometric":
        outs = rng.geometric(1.0 / output_len, size=n)
    else:
        outs = rng.integers(max(int(output_len * ratio), 1), output_len + 1, size=n)
    return ins, outs


class Client:
    def __init__(self, env: simpy.Environment, cfg: BenchClientConfig | EvalClientConfig,
                 index: int, router: MiniLB, fleet: Fleet, rngs: Streams) -> None:
        self.env = env
        self.cfg = cfg
        self.name = cfg.name
        self.router = router
        self.fleet = fleet
        self.rngs = rngs
        self.done = env.event()
        self.t0 = float("nan")
        self.aborted = ""
        self.index = index  # position in the scenario; namespaces this client's prompt blocks
        self.trace_rows: tuple[int, int] | None = None  # (replayed, in the file) for a trace
        self.planned = 0  # prompts (bench) or questions (eval) it means to send
        self.sent = 0  # prompts sent (bench) or questions finished (eval)
        env.process(self._main())

    def _main(self) -> Generator:
        yield from self.run()
        self.done.succeed()

    def unsent(self) -> int:
        """Prompts (bench) or questions (eval) it had not finished sending when the run ended."""
        return max(0, self.planned - self.sent)

    def send(self, kind: str, input_len: int, output_len: int, stream: bool,
             blocks: tuple[int, ...] | None = None, question: int = -1,
             attempt: int = 0) -> simpy.Process:
        req = self.fleet.new_request(self.name, kind, input_len, output_len, stream, blocks,
                                     question, attempt)
        return self.router.generate(req)


class BenchClient(Client):
    """``python -m sglang.bench_serving --backend sglang`` (streaming)."""

    def _prompts(self) -> list[dict]:
        ds = self.cfg.dataset
        if ds.kind == "trace":
            # every row unless num_prompts or dataset.limit cuts it (the smaller wins)
            limit = self.cfg.trace_limit()
            rows = read_trace(ds.resolved_path, limit, ds.time_scale, ds.max_input_len)
            self.trace_rows = (len(rows), count_rows(ds.resolved_path) if limit == len(rows)
                               else len(rows))
            return rows
        n = self.cfg.num_prompts
        ins, outs = random_lengths(self.rngs["lengths"], n, ds.input_len, ds.output_len,
                                   ds.range_ratio, ds.output_distribution)
        # random prompts share no prefix blocks, within a client or across clients
        base = (self.index + 1) << 40
        blocks_per = math.ceil(ds.input_len / 512)
        return [{"input": int(i), "output": int(o),
                 "blocks": tuple(base + k * blocks_per + b for b in range(blocks_per))}
                for k, (i, o) in enumerate(zip(ins, outs, strict=True))]

    def _arrivals(self, prompts: list[dict]) -> np.ndarray:
        rate = self.cfg.request_rate
        n = len(prompts)
        if rate == "trace":
            return np.array([p.get("t", 0.0) for p in prompts])
        if rate == "inf" or (isinstance(rate, float) and math.isinf(rate)):
            return np.zeros(n)
        gaps = self.rngs["arrivals"].exponential(1.0 / float(rate), size=n)
        return np.cumsum(gaps) - gaps[0]

    def run(self) -> Generator:
        """The client's process: warmup, flush, then the prompts."""
        env, cfg = self.env, self.cfg
        if cfg.start_s:
            yield env.timeout(cfg.start_s)
        prompts = self._prompts()
        if cfg.warmup_requests and prompts:
            p = prompts[0]
            warm = [self.send("warmup", p["input"], min(p["output"], cfg.warmup_output_len),
                              cfg.stream) for _ in range(cfg.warmup_requests)]
            yield env.all_of(warm)
        if cfg.flush.mode != "none":
            timeout = cfg.flush.timeout_s if cfg.flush.mode == "timeout" else None
            status, _answers = yield self.router.flush(timeout, self.name)
            if cfg.flush.mode == "raise_for_status" and status >= 400:
                self.aborted = f"flush_cache returned HTTP {status}; raise_for_status aborted"
                self.fleet.log("client_aborted", self.name, detail=self.aborted)
                return
            yield env.timeout(1.0)  # bench_serving sleeps 1 s after the flush
        self.t0 = env.now
        self.planned = len(prompts)
        arrivals = self._arrivals(prompts)
        slots = simpy.Resource(env, capacity=cfg.max_concurrency or len(prompts) or 1)
        procs = [env.process(self._one(p, float(t), slots))
                 for p, t in zip(prompts, arrivals, strict=True)]
        yield env.all_of(procs)

    def _one(self, prompt: dict, at: float, slots: simpy.Resource):
        if at > 0:
            yield self.env.timeout(at)
        with slots.request() as slot:
            yield slot
            self.sent += 1
            yield self.send("bench", prompt["input"], prompt["output"], self.cfg.stream,
                            prompt.get("blocks"))


class EvalClient(Client):
    """gsm8k-style eval: N questions over T threads, non-streaming, with retries.

    Each question: up to ``tries`` sampler tries, each a request the HTTP SDK retries
    ``sdk_retries`` times on a status >= 500 (with its own backoff, none after its last retry);
    after a failed try the sampler sleeps ``2**k`` s, after the last one too, then answers empty.
    """

    def __init__(self, *args, **kwargs) -> None:
        self.answers: list[dict] = []
        super().__init__(*args, **kwargs)

    def run(self) -> Generator:
        """The eval's process: ``threads`` workers over the questions."""
        env, cfg = self.env, self.cfg
        if cfg.start_s:
            yield env.timeout(cfg.start_s)
        self.t0 = env.now
        ds = cfg.dataset
        ins, outs = random_lengths(self.rngs["lengths"], cfg.questions, ds.input_len,
                                   min(ds.output_len, cfg.max_tokens), ds.range_ratio,
                                   ds.output_distribution)
        outs = np.minimum(outs, cfg.max_tokens)
        self._lens = list(zip(ins.tolist(), outs.tolist(), strict=True))
        self.planned = cfg.questions
        self._next = 0
        yield env.all_of([env.process(self._thread()) for _ in range(cfg.threads)])

    def _thread(self):
        while self._next < self.cfg.questions:
            q = self._next
            self._next += 1
            yield from self._ask(q)

    def _ask(self, q: int):
        env, cfg = self.env, self.cfg
        inp, out = self._lens[q]
        attempt = 0
        for k in range(cfg.tries):
            for j in range(cfg.sdk_retries + 1):
                req = yield self.send("eval", inp, out, False, question=q, attempt=attempt)
                attempt += 1
                if req.http_status < 500:
                    break
                if j < cfg.sdk_retries:
                    yield env.timeout(cfg.sdk_backoff_s * 2**j)
            if req.status == "completed":
                self.answers.append({"question": q, "answered": True, "attempts": attempt,
                                     "t_done": env.now})
                self.sent += 1
                return
            # the sampler sleeps 2**trial after every failed try, the last one included, before
            # its loop test gives up (sglang/test/simple_eval_common.py,
            # ChatCompletionSampler.__call__: the except branch sleeps, then trial += 1)
            yield env.timeout(2.0**k)
        self.answers.append({"question": q, "answered": False, "attempts": attempt,
                             "t_done": env.now})
        self.sent += 1


CLIENTS = {"bench": BenchClient, "eval": EvalClient}

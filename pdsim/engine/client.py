"""Clients: a ``bench_serving``-like benchmark and a gsm8k-style closed-loop eval.

Both talk to the router only. Their randomness comes from the ``arrivals`` and ``lengths``
streams, never from the fleet's.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Generator
from typing import Protocol

import numpy as np
import simpy

from pdsim.config.clients import BenchClientConfig, EvalClientConfig
from pdsim.config.trace import (  # noqa: F401 (open_trace, read_trace: API)
    HASH_ID_LIMIT,
    count_rows,
    open_trace,
    read_rows,
    read_trace,
    trace_prompts,
)
from pdsim.engine.clock import Link, Relay, later, reserve_block, soon, timer_at, urgent
from pdsim.engine.request import Request
from pdsim.util.rng import Streams


class Frontend(Protocol):
    """What a client needs of the fleet: a request record, the router's POST /generate and
    POST /flush_cache, and the event log (pdsim.engine.fleet.Fleet.frontend builds one). A small
    interface rather than the Fleet, so the client does not import the fleet that imports it.
    """

    def new_request(self, client: str, kind: str, input_len: int, output_len: int,
                    stream: bool, blocks: tuple[int, ...] | range | None, question: int,
                    attempt: int) -> Request: ...

    def generate(self, req: Request, on_return: Callable[[Request], None]) -> None:
        """POST /generate; ``on_return(req)`` when the response is back, as the last thing
        its simulation step does."""

    def flush(self, timeout: float | None, caller: str) -> simpy.Process: ...

    def log(self, kind: str, where: str, *args: object, **kw: object) -> None: ...


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


def sharegpt_lengths(rng: np.random.Generator, rows: tuple, n: int, output_len: int | None,
                     context_len: int | None) -> tuple[list[int], list[int]]:
    """bench_serving's ``sharegpt`` dataset over length pairs: the pairs shuffled (one
    permutation from ``rng``), each one's output replaced by ``output_len`` when set, those
    the filter leaves out skipped (pdsim.config.clients.sharegpt_usable: prompt or output
    under 2 tokens, longer than ``context_len``), the first ``n`` kept (sgl-project/sglang
    python/sglang/benchmark/datasets/sharegpt.py, sample_sharegpt_requests). ``rows``: the
    dataset's ``(timestamp, input, output, blocks)`` rows (validation made sure ``n`` fit)."""
    ins = np.fromiter((r[1] for r in rows), np.int64, len(rows))
    outs = np.fromiter((r[2] for r in rows), np.int64, len(rows))
    order = rng.permutation(len(rows))
    ins, outs = ins[order], outs[order] if output_len is None else np.full(len(rows),
                                                                            output_len)
    keep = (ins >= 2) & (outs >= 2)
    if context_len:
        keep &= ins + outs <= context_len
    return ins[keep][:n].tolist(), outs[keep][:n].tolist()


class Client:
    """A client of the router, without a process per request. Its reactions to a finished
    request keep the zero-delay steps of the processes they replace, counted from where the
    router returns the response (``on_return``): one for an eval thread, two for a bench
    warmup's end, three for a bench prompt's slot going to the next prompt (``clock.later``:
    at once when nothing else is due in the instant)."""

    # load spikes (the load_spike fault): (start, end, factor) in simulated s; an instance's
    # own only when a fault sets them (a client keeps its attributes inline while it has few:
    # tests/test_sim_speed.py)
    spikes: tuple[tuple[float, float, float], ...] = ()

    def __init__(self, env: simpy.Environment, cfg: BenchClientConfig | EvalClientConfig,
                 index: int, frontend: Frontend, rngs: Streams) -> None:
        self.env = env
        self.cfg = cfg
        self.name = cfg.name
        self.frontend = frontend
        self.rngs = rngs
        self.done = env.event()
        self.t0 = float("nan")
        self.aborted = ""
        self.index = index  # position in the scenario; namespaces this client's prompt blocks
        self.trace_rows: tuple[int, int] | None = None  # (replayed, in the file) for a trace
        # prompts (bench) or questions (eval) it means to send, known from the start: each is
        # sent and ended, in flight, or not sent (unsent), wherever the run ends
        self.planned = self.cfg.prompts() if cfg.kind == "bench" else cfg.questions
        self.sent = 0  # prompts sent (bench) or questions asked (eval)
        env.process(self._main())

    def _main(self) -> Generator:
        yield from self.run()
        self.done.succeed()

    def offered(self) -> np.ndarray:
        """When each prompt was to be sent (s): a bench client's schedule, the offered load,
        whether a concurrency limit held a prompt back or the run ended first
        (pdsim.engine.steady); empty before it starts and for an eval (a closed loop). (Made
        from the schedule it keeps, not kept: a client's attributes stay under CPython's
        inline limit, tests/test_sim_speed.py.)"""
        at = getattr(self, "_at", None)
        return np.asarray(at, float) + self.t0 if at else np.empty(0)

    def progress(self) -> tuple[int, int]:
        """(prompts answered, or questions finished; how many it will send): what the run's
        progress bar counts (read from its thread, so only plain ints are read)."""
        cfg = self.cfg
        if cfg.kind == "eval":
            return self.sent, cfg.questions
        if self.planned:
            return getattr(self, "_returned", 0), self.planned
        rows = getattr(cfg.dataset, "_rows", None)  # (a trace: its rows to replay, as checked)
        return 0, rows if rows is not None else (cfg.num_prompts or 0)

    def unsent(self) -> int:
        """Prompts (bench) or questions (eval) never sent when the run ended: a client that
        had not started, whose warmup or flush had not returned, or that aborted, sent none."""
        return self.planned - self.sent

    def send(self, kind: str, input_len: int, output_len: int, stream: bool,
             on_return: Callable[[Request], None], blocks: tuple[int, ...] | range | None = None,
             question: int = -1, attempt: int = 0) -> Request:
        front = self.frontend
        req = front.new_request(self.name, kind, input_len, output_len, stream, blocks,
                                question, attempt)
        front.generate(req, on_return)
        return req


class BenchClient(Client):
    """``python -m sglang.bench_serving --backend sglang`` (streaming).

    Prompts arrive on one chain of timers (one pending at a time, each under the event id its
    own timeout would have had), wait FIFO for one of ``max_concurrency`` slots, and free it
    when their response returns.
    """

    _retries = 0  # sdk_retries (an instance's own when set: see Client.spikes)

    def _prompts(self) -> list[tuple]:
        """The prompts as tuples ``(t, input, output, blocks)`` (``t``: a trace row's arrival,
        0.0 for a random prompt; see ``pdsim.config.trace.trace_prompts``)."""
        ds = self.cfg.dataset
        if ds.kind == "trace":
            # every row unless num_prompts or dataset.limit cuts it (the smaller wins)
            limit = self.cfg.trace_limit()
            rows = trace_prompts(ds.resolved_path, limit, ds.time_scale, ds.max_input_len)
            self.trace_rows = (len(rows), count_rows(ds.resolved_path) if limit == len(rows)
                               else len(rows))
            return rows
        n = self.cfg.num_prompts
        base = (self.index + 1) * HASH_ID_LIMIT
        if ds.kind == "sharegpt":
            pairs = read_rows(ds.resolved_path, pairs=True)
            ins, outs = sharegpt_lengths(self.rngs["lengths"], pairs, n, ds.output_len,
                                         ds.context_len)
            # private blocks as a random prompt's (below), each prompt as many as it needs
            per = np.cumsum([0] + [-(-i // 512) for i in ins]) + base
            blocks = map(range, per[:-1].tolist(), per[1:].tolist())
            return [(0.0, i, o, b) for i, o, b in zip(ins, outs, blocks, strict=True)]
        ins, outs = random_lengths(self.rngs["lengths"], n, ds.input_len, ds.output_len,
                                   ds.range_ratio, ds.output_distribution)
        # random prompts share no prefix blocks, within a client, across clients or with a
        # trace (whose ids are below HASH_ID_LIMIT): each prompt's are a range, which the
        # prefix cache keeps as one private run (kv.PrefixCache)
        blocks_per = math.ceil(ds.input_len / 512)
        # (prompt k's: range(base + k * blocks_per, base + (k + 1) * blocks_per), made by map)
        ends = range(base, base + (n + 1) * blocks_per, blocks_per)
        blocks = map(range, ends[:-1], ends[1:])
        return [(0.0, i, o, b)
                for i, o, b in zip(ins.tolist(), outs.tolist(), blocks, strict=True)]

    def _arrivals(self, prompts: list[tuple]) -> np.ndarray:
        rate = self.cfg.request_rate
        n = len(prompts)
        if rate == "trace":
            return self._spiked(np.array([p[0] for p in prompts]))
        if rate == "inf" or (isinstance(rate, float) and math.isinf(rate)):
            return np.zeros(n)
        gaps = self.rngs["arrivals"].exponential(1.0 / float(rate), size=n)
        with np.errstate(invalid="ignore"):
            at = np.cumsum(gaps) - gaps[0]
        if np.isnan(at).any():  # a rate so low (5e-324 req/s) its mean gap is inf: the first
            # prompt at once, the others never (inf - inf made every arrival NaN, sent at once)
            at = np.concatenate(([0.0], np.cumsum(gaps[1:])))
        return self._spiked(at)

    def _spiked(self, at: np.ndarray) -> np.ndarray:
        """Arrival times (from ``t0``) under the load spikes: a Poisson stream of rate
        ``r(t)`` is a unit-rate one in the operational time ``T(t)``, the integral of ``r``;
        with ``r`` the client's rate times ``factor`` inside a spike, an arrival at ``s`` of the
        unspiked stream arrives at ``T^-1(s)``: the same draws, the window's gaps divided by
        ``factor`` and the later arrivals moved up by what it saved."""
        for start, end, factor in self.spikes:
            a, b = start - self.t0, end - self.t0
            if b <= 0:
                continue
            a = max(a, 0.0)
            top = a + factor * (b - a)  # operational time at the spike's end
            at = np.where(at < a, at, np.where(at < top, a + (at - a) / factor,
                                               at - (factor - 1.0) * (b - a)))
        return at

    def run(self) -> Generator:
        """The client's process: warmup, flush, then the prompts."""
        env, cfg = self.env, self.cfg
        if cfg.start_s:
            yield env.timeout(cfg.start_s)
        prompts = self._prompts()
        rate = cfg.request_rate
        if cfg.warmup_requests and prompts:
            p = prompts[0]
            warm = env.event()
            left = [cfg.warmup_requests]

            def returned(_req: Request) -> None:
                left[0] -= 1
                if not left[0]:  # the warmups' all_of resumed this process two steps on
                    later(env, warm.succeed, 1)

            for _ in range(cfg.warmup_requests):
                self.send("warmup", p[1], min(p[2], cfg.warmup_output_len),
                          cfg.stream, returned)
            yield warm
        if cfg.flush.mode != "none":
            timeout = cfg.flush.timeout_s if cfg.flush.mode == "timeout" else None
            status, _answers = yield self.frontend.flush(timeout, self.name)
            if cfg.flush.mode == "raise_for_status" and status >= 400:
                self.aborted = f"flush_cache returned HTTP {status}; raise_for_status aborted"
                self.frontend.log("client_aborted", self.name, detail=self.aborted)
                return
            yield env.timeout(1.0)  # bench_serving sleeps 1 s after the flush
        self.t0 = env.now
        if not prompts:
            return
        self._prompt_list = prompts
        at = self._arrivals(prompts)
        self._at = at.tolist()  # (Python floats, the same values)
        # arrivals in prompt order (the usual: a Poisson or an all-at-once load, a trace's rows
        # by time): no sorting (see _start)
        self._in_order = bool((at[1:] >= at[:-1]).all())
        self._slots = cfg.max_concurrency or len(prompts)
        # as many slots as prompts: no prompt ever waits, so slots are not counted (a slot's
        # release, with nobody to grant it to, changes nothing)
        self._limited = self._slots < len(prompts)
        self._busy = 0
        self._backlog: deque[int] = deque()
        self._returned = 0
        self._all_returned = env.event()
        self._sender = Relay(env, self._send)  # a prompt sends one step after its slot
        self._on_return = self._returned_one  # (bound once, not per prompt)
        if cfg.sdk_retries:  # SDK retries: each request's prompt, each prompt's retries so far
            self._retries = cfg.sdk_retries
            self._prompt_of: dict[int, int] = {}
            self._tried: dict[int, int] = {}
        self._stream = cfg.stream
        self._releaser = Link(env, self._release)
        self._granter = Link(env, self._grant)
        if self.spikes and self._limited and (rate == "inf" or rate == math.inf):
            self._spike_slots()  # a closed loop: more slots
        urgent(env, self._start)  # where the prompts' processes would have started
        yield self._all_returned

    def _spike_slots(self) -> None:
        """A load spike on a closed loop: ``factor`` times the slots (``max_concurrency``)
        during the spike (prompts waiting for one take the new ones at once); back to the
        client's own after it (busy slots above it are not granted again as they free)."""
        env, base = self.env, self._slots

        def begin(factor: float) -> None:
            self._slots = max(base, round(base * factor))
            while self._backlog and self._busy < self._slots:
                self._busy += 1
                self._sender(self._backlog.popleft())

        def end() -> None:
            self._slots = base

        for start, stop, factor in self.spikes:
            if stop > env.now:
                env.timeout(max(0.0, start - env.now)).callbacks.append(
                    lambda _e, f=factor: begin(f))
                env.timeout(stop - env.now).callbacks.append(lambda _e: end())

    def _start(self) -> None:
        """Where the prompts' processes started: those due at once take free slots (or queue)
        and send one step later; each later one gets its place among same-time events now
        (where its own timeout would have been made: ids in prompt order), and they arrive in
        the order those timeouts would have fired, by time, then id."""
        at = self._at
        if self._in_order:  # those due at once come first; the first of them take the slots
            m = bisect_right(at, 0.0)  # (not at > 0)
            free = self._slots  # (none taken yet)
            self._busy = take = m if m < free else free
            self._backlog.extend(range(take, m))
            now: range | list[int] = range(take)
            self._later = list(range(m, len(at)))  # (a list: indexing a range makes an int)
        else:
            now = [k for k, a in enumerate(at) if not a > 0 and self._take_slot(k)]
            later = [k for k, a in enumerate(at) if a > 0]
            t0 = self.t0
            # by time (a stable sort: ties in prompt order, as their timeouts' ids would be)
            self._later = sorted(later, key=lambda k: t0 + at[k])
        soon(self.env, lambda: [self._send(k) for k in now])
        self._timer_ids = reserve_block(self.env, len(self._later))
        self._next_timer = 0
        self._arm_next()

    def _arm_next(self) -> None:
        i = self._next_timer
        if i < len(self._later):
            # the i-th arrival by time takes the block's i-th id: the block's ids were drawn
            # together (any other entry's is below or above them all), and among the arrivals
            # (time, i) sorts as (time, prompt order) would: the sort is stable
            k = self._later[i]
            timer_at(self.env, self.t0 + self._at[k], self, self._timer_ids + i)

    def tick(self) -> None:
        """The next prompt's arrival timer (a plain heap entry under its reserved id).

        Prompts arriving at this same instant after it (a trace's rows share timestamps:
        ~10 a row on the conversation trace) arrive in this step too, without timers of
        their own: each one's timer would have had a later id of the block, whose ids in
        between are other arrivals', at other times, so nothing else sorts between them, and
        an arrival's step makes nothing that sorts ahead of the next one (a slot, a send link
        drawn now; no id drawn otherwise). Their ids stay reserved."""
        later, at, t0 = self._later, self._at, self.t0
        i, n = self._next_timer, len(later)
        now = self.env._now
        while True:
            k = later[i]
            i += 1
            more = i < n and t0 + at[later[i]] == now  # the next arrival is due now too
            if not more:
                self._next_timer = i
                self._arm_next()
            # the granted slot resumed its prompt one step later
            if not self._limited or self._take_slot(k):
                if more or self.env.due_now():
                    self._sender(k)
                else:  # nothing else is due this instant and this step does nothing more
                    self._send(k)
            if not more:
                return

    def _take_slot(self, k: int) -> bool:
        """A free slot now, or the end of the queue for one (FIFO)."""
        if self._busy < self._slots and not self._backlog:
            self._busy += 1
            return True
        self._backlog.append(k)
        return False

    def _send(self, k: int, attempt: int = 0) -> None:
        _t, input_len, output_len, blocks = self._prompt_list[k]
        if not attempt:
            self.sent += 1
        front = self.frontend
        req = front.new_request(self.name, "bench", input_len, output_len, self._stream,
                                blocks, -1, attempt)
        if self._retries:
            self._prompt_of[req.rid] = k
        front.generate(req, self._on_return)

    def in_flight(self) -> int:
        """Prompts sent whose final response has not come back: a request in flight, or, with
        ``sdk_retries``, an SDK retry's backoff pending (then a prompt is several requests)."""
        return self.sent - getattr(self, "_returned", 0)

    def _returned_one(self, req: Request) -> None:
        """The prompt's process resumed a step on and released its slot; the release granted
        it to the longest-waiting prompt one step later, which sent a step after that. A
        request the SDK retries keeps its slot: a new request goes after the backoff."""
        if self._retries:
            k = self._prompt_of.pop(req.rid)
            status = req.http_status
            n = self._tried.get(k, 0)
            if (status >= 500 or status in (408, 429)) and n < self._retries:
                self._tried[k] = n + 1
                delay = min(self.cfg.sdk_backoff_s * 2.0**n, 8.0)
                self.env.timeout(delay).callbacks.append(lambda _e: self._send(k, n + 1))
                return
        self._returned += 1
        if self._returned == len(self._prompt_list):  # the all_of resumed the client
            if self._limited:
                self._releaser()
            later(self.env, self._all_returned.succeed, 2)
            return
        if not self._limited:
            return
        env = self.env
        if env.due_now():
            self._releaser()
        else:  # nothing else is due this instant and this is its step's last act (generate)
            self._release()

    def _release(self) -> None:
        """(Always its step's last act: a Link's tick, or the last act of ``_returned_one``.)"""
        self._busy -= 1
        if self._backlog:
            env = self.env
            if env.due_now():
                self._granter()
            else:  # nothing else is due this instant: the grant's step would come next
                self._grant()

    def _grant(self) -> None:
        """(Always its step's last act, as ``_release``.)"""
        if self._backlog and self._busy < self._slots:
            k = self._backlog.popleft()
            self._busy += 1
            env = self.env
            if env.due_now():
                self._sender(k)
            else:  # nothing else is due this instant: the send's step would come next
                self._send(k)


class EvalClient(Client):
    """gsm8k-style eval: N questions over T threads, non-streaming, with retries.

    Each question: up to ``tries`` sampler tries, each a request the HTTP SDK retries
    ``sdk_retries`` times on a status >= 500 (with its own backoff, none after its last retry);
    after a failed try the sampler sleeps ``2**k`` s, after the last one too, then answers empty.
    A thread is a small state machine (question, try, SDK retry) driven by its requests'
    returns and its sleeps' timers.
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
        self._next = 0
        self._running = cfg.threads
        self._all_done = env.event()
        urgent(env, self._start)  # where the threads' processes would have started
        yield self._all_done

    def _start(self) -> None:
        for _ in range(self.cfg.threads):
            self._next_question()

    def _next_question(self) -> None:
        if self._next < self.cfg.questions:
            q = self._next
            self._next += 1
            self.sent += 1  # (asked: in flight until it is answered or the run ends)
            self._ask(_Ask(q))
            return
        self._running -= 1
        if not self._running:  # the threads' all_of resumed the eval two steps on
            later(self.env, self._all_done.succeed, 1)

    def _ask(self, a: _Ask) -> None:
        inp, out = self._lens[a.q]
        self.send("eval", inp, out, False,
                  lambda req: later(self.env, lambda: self._answered(a, req), 1),
                  question=a.q, attempt=a.attempt)

    def _answered(self, a: _Ask, req: Request) -> None:
        """The thread resumed (one step after the router returned the response)."""
        cfg = self.cfg
        a.attempt += 1
        if req.http_status >= 500 and a.j < cfg.sdk_retries:  # the SDK retries
            a.j += 1
            self._after(cfg.sdk_backoff_s * 2 ** (a.j - 1), lambda: self._ask(a))
            return
        if req.status == "completed":
            self._finish(a, True)
            return
        # the sampler sleeps 2**trial after every failed try, the last one included, before
        # its loop test gives up (sglang/test/simple_eval_common.py,
        # ChatCompletionSampler.__call__: the except branch sleeps, then trial += 1)
        self._after(2.0**a.k, lambda: self._next_try(a))

    def _next_try(self, a: _Ask) -> None:
        if a.k < self.cfg.tries - 1:
            a.k += 1
            a.j = 0
            self._ask(a)
        else:
            self._finish(a, False)

    def _after(self, delay: float, then: Callable[[], None]) -> None:
        self.env.timeout(delay).callbacks.append(lambda _e: then())

    def _finish(self, a: _Ask, answered: bool) -> None:
        self.answers.append({"question": a.q, "answered": answered, "attempts": a.attempt,
                             "t_done": self.env.now})
        self._next_question()

    def in_flight(self) -> int:
        """Questions asked and not yet answered (a request of theirs in flight, or a thread
        sleeping before its next try)."""
        return self.sent - len(self.answers)


class _Ask:
    """Where one eval thread is with its question: try ``k``, SDK retry ``j``, requests sent."""

    __slots__ = ("q", "k", "j", "attempt")

    def __init__(self, q: int) -> None:
        self.q, self.k, self.j, self.attempt = q, 0, 0, 0


CLIENTS = {"bench": BenchClient, "eval": EvalClient}

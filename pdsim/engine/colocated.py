"""Colocated SGLang server rank: prefill and decode on the same GPUs, as SGLang schedules them
without ``--disaggregation-mode`` (python/sglang/srt/managers/scheduler.py and
schedule_policy.py, read in the 0.5.1.post1, 0.5.6.post2, 0.5.8.post1, 0.5.9 and 0.5.23 wheels).

A step is one forward, formed as ``Scheduler.get_next_batch_to_run`` forms it:

- **Prefill first.** Whenever a prefill batch can be formed (a request being chunked, or
  waiting requests and the running batch not marked full), the step is that prefill and every
  running request's decode pauses for it. A chunked request takes the steps that follow until
  its last chunk (its chunk goes first). With ``enable_mixed_chunk`` (off by default) the
  running requests decode a token inside the prefill forward instead, and the budgets shrink
  by their number.
- **Admission** is ``PrefillAdder``'s (:mod:`pdsim.engine.adder`): FCFS, under
  ``chunked_prefill_size`` and ``max_prefill_tokens`` (the first request exempt), request slots
  (``max_running_requests`` less the running batch), and memory: a new request reserves its
  prompt and its output (clipped to 4,096 tokens), a running one its remaining output times the
  **new-token ratio**; with the radix cache off and ``ignore_eos`` requests (bench_serving's),
  the exact shortest-first check instead. A refusal for memory marks the batch full: no
  prefill is tried again until a request leaves the running batch.
- **The new-token ratio** starts at 0.7 x ``schedule_conservativeness`` (x 0.3 under DP
  attention), falls linearly to 14% of that over 600 decode steps (not on prefill or mixed
  steps), goes back to its start when the scheduler idles, and after a retraction jumps to the
  completed share of the running requests' outputs plus 20 steps of headroom.
- **Otherwise a decode step** of the running batch (pdsim.engine.decode_batch: one event per
  step, spans of steps that cannot change the batch). A growth the free pages do not cover
  retracts (fewest generated tokens first; the stop rule of ``engine.version``); a retracted
  request frees its KV and goes to the back of the waiting queue, to be prefilled again,
  prompt and generated tokens both (it recomputes, unlike a PD decode server's, which offloads).

The first token comes with the request's last prefill chunk (the prefill forward samples it),
as does the next token after a retraction's re-prefill.
"""

from __future__ import annotations

import math
from collections import deque

import simpy

from pdsim.config.fleet import ColocatedConfig
from pdsim.engine import frontend
from pdsim.engine.adder import Adder
from pdsim.engine.clock import call_later
from pdsim.engine.decode_batch import (
    CLIP_MAX_NEW_TOKENS,
    GROWTH_TOKENS,
    RETRACT_DECODE_STEPS,
    RunningBatch,
)
from pdsim.engine.frontend import FrontEnd
from pdsim.engine.kv import PrefixCache
from pdsim.engine.log import EventLog
from pdsim.engine.request import Request, end
from pdsim.engine.stats import Stats
from pdsim.model.predictor import Predictor


class ColocatedRank(RunningBatch):
    role = "colocated"
    SPANS = True
    __slots__ = ("max_running", "waiting", "running", "step",
                 "ctx_sum", "_finish", "_grow", "_seq", "growth_pages", "_block_tokens", "_lag",
                 "_late", "_epoch", "_planned", "retract_20_steps", "port", "session",
                 "tokenize_s_per_token", "request_s", "chunk_budget", "max_prefill", "cache",
                 "chunked", "batch", "batch_is_full", "mixed_chunk", "ratio_init", "ratio_min",
                 "ratio_decay", "_r_base", "_r_at", "_r_skip", "ratio_plus_one",
                 "page_aligned_chunk", "chunk_capped_by_memory", "in_sum", "out_sum", "_long",
                 "_arriving", "_aborts", "front", "_front_t", "_delivering")

    def __init__(self, env: simpy.Environment, server: int, index: int, cfg: ColocatedConfig,
                 predictor: Predictor, pool_pages: int, flush_semantics: str, log: EventLog,
                 stats: Stats, chunk_budget: int, version_rules: dict[str, bool]) -> None:
        super().__init__(env, server, index, cfg, predictor, pool_pages, flush_semantics, log,
                         stats)
        self.max_running = cfg.max_running_requests or 1  # (the fleet sets it: its pool's)
        # FCFS (--schedule-policy fcfs, the default); retracted requests come back here too
        # (RunningBatch's PD-only parts, the retracted queue and its resumes, are not used)
        self.waiting: deque[Request] = deque()
        self.running: dict[int, Request] = {}
        self.step = 0  # decode steps (a mixed step is one): the running batch's token clock
        self.ctx_sum = 0
        self._finish: list = []
        self._grow: list = []
        self._seq = 0
        self.growth_pages = max(1, self.alloc.pages_for(GROWTH_TOKENS))
        self._block_tokens = self.growth_pages * self.alloc.page_size
        self._lag = 0
        self._late = False
        self._epoch = self._planned = 0
        self.retract_20_steps = not version_rules["retract_until_next_step_fits"]
        self.ratio_plus_one = version_rules["retract_ratio_plus_one"]
        self.page_aligned_chunk = version_rules["page_aligned_chunk"]
        self.chunk_capped_by_memory = version_rules["chunk_capped_by_memory"]
        self.port = 0
        self.session = f"colocated-{server}.r{index}"  # (faults name it; no KV session)
        self.tokenize_s_per_token = 0.0  # set by the fleet (engine profile)
        self.request_s = 0.0  # the front end's fixed cost per request (the fleet sets it)
        self.chunk_budget = chunk_budget  # per rank, after SGLang's DP division (fleet.py)
        self.max_prefill = cfg.max_prefill_tokens
        self.cache = PrefixCache(self.alloc, cfg.prefix_block_tokens) if cfg.prefix_cache \
            else None
        self.chunked: Request | None = None
        self.batch: list[tuple[Request, int, bool]] = []
        self.batch_is_full = False  # ScheduleBatch.batch_is_full of the running batch
        self.mixed_chunk = cfg.enable_mixed_chunk
        # Scheduler.__init__ (and ServerArgs._handle_data_parallelism: x 0.3 under DP
        # attention): init, floor and linear decay per decode step of the new-token ratio
        conservativeness = cfg.schedule_conservativeness * (0.3 if cfg.dp_attention else 1.0)
        self.ratio_init = min(cfg.init_new_token_ratio * conservativeness, 1.0)
        self.ratio_min = min(self.ratio_init * cfg.min_new_token_ratio_factor, 1.0)
        self.ratio_decay = (self.ratio_init - self.ratio_min) / cfg.new_token_ratio_decay_steps
        # the ratio is ratio_at(step): _r_base less the decay of each decode step after
        # decode step _r_at, but for the _r_skip mixed steps among them (they do not decay it)
        self._r_base, self._r_at, self._r_skip = self.ratio_init, 0, 0
        # the running batch's prompt and output tokens, and how many outputs are past the
        # 4,096-token clip (the adder's reservation of the running requests: _running_left)
        self.in_sum = self.out_sum = self._long = 0
        self._arriving = 0  # requests being tokenized (not queued yet)
        self._aborts: list[Request] = []  # running requests the router aborted (commit_step)
        # the server's front end (pdsim.engine.frontend; the fleet sets it, None: none) and
        # when this rank last handed it a step's output
        self.front: FrontEnd | None = None
        self._front_t = 0.0
        # requests done here whose last token the front end has not delivered yet (rid ->
        # request): still unfinished for the client (a router timeout or a crash ends them)
        self._delivering: dict[int, Request] = {}

    def forget_deadlines(self) -> None:
        """(No per-request deadlines on a colocated rank: the router's timeout aborts.)"""

    # --- arrivals ------------------------------------------------------------------------

    def submit(self, req: Request) -> None:
        """POST /generate reached this rank: it is tokenized, then queued."""
        req.p_server = req.d_server = self.server
        req.p_rank = req.d_rank = self.index
        self.load_tokens += req.input_len + req.output_len
        req.fill_target, req.fill_done = req.input_len, 0
        front = self.front
        if front is None:
            delay = self.request_s + self.tokenize_s_per_token * req.input_len
        else:  # tokenized in the front end's turn, behind the output it has not handled yet
            self._catch_up()  # (the steps of a span already past hand theirs over first)
            now = self.env._now
            delay = front.take(now, self.tokenize_s_per_token * req.input_len) - now \
                + self.request_s
            self._front_t = now  # (this rank's later output is handed over after the prompt)
        if delay > 0:
            self._arriving += 1
            epoch = self._epoch
            call_later(self.env, delay, lambda: self._tokenized(req, epoch))
        else:
            self._queue(req)

    def _tokenized(self, req: Request, epoch: int) -> None:
        self._arriving -= 1
        if epoch != self._epoch:  # the process died meanwhile
            self._arriving = 0
            self._fail(req, "decode_crashed", 502)
            return
        if req.status != "unfinished":  # aborted meanwhile (the router timed out)
            self._maybe_idle()
            return
        self._queue(req)

    def _queue(self, req: Request) -> None:
        self.waiting.append(req)
        if self.chunked is None and not self.batch_is_full:  # a prefill may form next
            self._changed_next()
        self._kick()

    def queued(self) -> int:
        """Requests not started (waiting, retracted ones included), the prefill queue gauge."""
        return len(self.waiting) + self._arriving

    # --- the scheduler loop --------------------------------------------------------------

    def ratio(self) -> float:
        """The new-token ratio now."""
        n = self.step - self._r_at - self._r_skip
        r = self._r_base - self.ratio_decay * n if n > 0 else self._r_base
        return r if r > self.ratio_min else self.ratio_min

    def _running_left(self) -> float:
        """Sum over the running requests of their outputs still to come, each clipped to
        4,096 tokens (``_get_running_request_total_token_offset`` before the ratio)."""
        if not self._long:
            return self.out_sum - (self.ctx_sum - self.in_sum)
        step = self.step
        total = 0
        for r in self.running.values():
            left = r.output_len - (r.gen_at_join + step - r.join_step)
            total += left if left < CLIP_MAX_NEW_TOKENS else CLIP_MAX_NEW_TOKENS
        return total

    def _admits_next(self) -> bool:
        return self.chunked is not None or bool(self.waiting and not self.batch_is_full)

    def span_steps(self, limit: int) -> int:
        """A prefill forward is a span of one; decode steps as RunningBatch's, ending before a
        plan that would form a prefill batch."""
        if self.batch:
            return 1
        return super().span_steps(limit)

    def plan_step(self) -> tuple | None:
        """The next forward: a prefill (or mixed) one when a prefill batch forms, else a decode
        step of the running batch, else None (idle: the new-token ratio resets).

        A prefill plan: (decode batch mixed in, its context, 0, tokens, sum len*(len+prefix),
        causal pairs, requests, prefix tokens attended, attention tokens); a decode plan:
        (batch, context, 0), RunningBatch's."""
        running = self.running
        if self.chunked is not None or (self.waiting and not self.batch_is_full):
            mix = len(running) if self.mixed_chunk else 0
            ratio = self.ratio()
            batch = Adder(self, running, self.max_running - len(running), mix,
                          mix + self._running_left() * ratio, ratio).form()
            if batch:
                return self._extend_plan(batch)
        if not running:
            self._r_base, self._r_at, self._r_skip = self.ratio_init, self.step, 0
            return None
        self.stats.decode_steps += 1
        self._planned = self._epoch
        return len(running), self.ctx_sum, 0

    def _extend_plan(self, batch: list[tuple[Request, int, bool]]) -> tuple:
        tokens = 0
        sq = pairs = 0.0
        prefix = 0
        now = self.env._now
        for req, n, first in batch:
            if first and math.isnan(req.t_prefill_start):
                req.t_prefill_start = now
            ctx = req.fill_done
            tokens += n
            sq += n * (n + ctx)
            pairs += n * ctx + n * (n + 1) / 2
            prefix += ctx
        self.batch = batch
        self.stats.prefill_steps += 1
        self._planned = self._epoch
        b = len(self.running) if self.mixed_chunk else 0
        return (b, self.ctx_sum if b else 0, 0, tokens + b, sq, pairs, len(batch) + b, prefix,
                tokens + b)

    def step_time(self, plan: tuple) -> float:
        """A decode step's time, or a prefill forward's (its chunks and any decode tokens
        mixed in through the GEMMs; the mixed requests' attention as what a decode step's
        attention over their context adds: decode_gpu(b, ctx) - decode_gpu(b, 0)), at least
        the CPU work on the mixed requests (decode()'s floor)."""
        pred = self.predictor
        n = len(plan)
        if n <= 4:
            return pred.decode(plan[0], plan[1], plan[3] if n == 4 else plan[0])
        dt = pred.prefill(plan[3], plan[4], plan[5], plan[6], plan[7], plan[8])
        b = plan[0]
        if b:
            # (the forward's part, without decode()'s CPU floor: the mixed forward's result
            # processing covers its decode requests too, and is floored as a whole)
            dt += pred.decode_gpu(b, plan[1]) - pred.decode_gpu(b, 0)
            cpu = b * pred.decode_request_s
            if cpu > dt:
                dt = cpu
        return dt

    def combine(self, plans: list[tuple], n_ranks: int) -> tuple:
        """A DP-attention forward: a decode step when no rank extends (RunningBatch's rule);
        else a prefill forward of the tokens of every rank gathered into the MLP (their mean
        over the ranks, decode tokens included), attention terms at the slowest rank, and the
        decode attention of the rank reading most context."""
        if all(len(p) == 3 for p in plans):
            return RunningBatch.combine(plans, n_ranks)
        total = 0.0
        sq = pairs = 0.0
        reqs = prefix = attn = db = dctx = 0
        for p in plans:
            if len(p) == 3:
                b, c = p[0], p[1]
                total += b
                if b > reqs:
                    reqs = b
                if b > attn:
                    attn = b
            else:
                b, c = p[0], p[1]
                total += p[3]
                sq, pairs = max(sq, p[4]), max(pairs, p[5])
                reqs, prefix, attn = max(reqs, p[6]), max(prefix, p[7]), max(attn, p[8])
            if b > db:
                db = b
            if c > dctx:
                dctx = c
        return db, dctx, 0, total / n_ranks, sq, pairs, reqs, prefix, attn

    def commit_step(self, plan: tuple) -> None:
        if self._planned != self._epoch:  # the process died during this step
            return
        if self.front is not None:
            frontend.hand_over(self, plan)
        if len(plan) <= 4:
            super().commit_step(plan)
        else:
            if plan[0]:  # mixed: the running requests decoded a token in this forward
                self._r_skip += 1  # (update_running_batch did not run: no decay)
                super().commit_step((plan[0], plan[1], 0))
            self._commit_prefill(plan[3] - plan[0])
        if self._aborts:
            self._drop_aborted()

    def quiet_steps(self, n: int, plans: int | None = None) -> None:
        """(RunningBatch's) and their output to the front end, after this rank's last commit
        (pdsim.engine.frontend: the inner steps of a span)."""
        front = self.front
        if front is not None:
            if self.running:
                front.steps(self._front_t, n, len(self.running), self.ctx_sum - self.in_sum)
            # (these steps have ended by now: what is handed over next is later than them)
            self._front_t = self.env._now
        super().quiet_steps(n, plans)

    def _drop_aborted(self) -> None:
        """Running requests the router aborted leave the batch (``filter_batch``)."""
        aborts, self._aborts = self._aborts, []
        for req in aborts:
            if req.rid in self.running:  # (else it finished at this step)
                self._leave(req)
                self.batch_is_full = False
                self._drop(req)

    def _commit_prefill(self, tokens: int) -> None:
        """The prefill forward ended: finished fills sample a token and join the batch."""
        batch, self.batch = self.batch, []
        self.stats.prefill_tokens += tokens
        now = self.env._now
        reset = not self.running  # (a batch merged into an empty running batch starts unfull)
        page = self.alloc.page_size
        for req, n, _first in batch:
            req.prefill_tokens += n
            req.fill_done += n
            if req.status != "unfinished":  # aborted or crashed meanwhile: abort() left it
                self._drop(req)
                continue
            if req.fill_done < req.fill_target:
                reset = True  # (filter_batch drops the chunked request: batch_is_full off)
                continue
            if self.chunked is req:
                self.chunked = None
            if math.isnan(req.t_prefill_end):
                req.t_prefill_end = now
                # (the client has it when the front end has handled this step's output)
                req.t_first_token = now if self.front is None else self.front.busy
            req.generated += 1  # the forward sampled its next token
            self.stats.tokens_out += 1
            if req.generated >= req.output_len:
                self._complete(req)
                reset = True
                continue
            req.cap_tokens = req.d_pages.n * page + req.cached_tokens
            self._join(req)
        if reset:
            self.batch_is_full = False
        if self._idle_waiters:
            self._maybe_idle()

    # --- the running batch ---------------------------------------------------------------

    def _join(self, req: Request) -> None:
        super()._join(req)
        self.in_sum += req.input_len
        self.out_sum += req.output_len
        if req.output_len > CLIP_MAX_NEW_TOKENS:
            self._long += 1

    def _leave(self, req: Request) -> None:
        super()._leave(req)
        self.in_sum -= req.input_len
        self.out_sum -= req.output_len
        if req.output_len > CLIP_MAX_NEW_TOKENS:
            self._long -= 1

    def _try_prealloc(self) -> None:
        """(RunningBatch calls it when a request left the running batch:) the batch is no
        longer full (``update_running_batch``)."""
        self.batch_is_full = False

    def _complete(self, req: Request, refill: bool = True) -> None:
        if self.front is None or not frontend.defer(self, req, refill):
            self._completed(req, refill)

    def _completed(self, req: Request, refill: bool, answer: bool = True) -> None:
        if req.rid in self.running:
            super()._complete(req, refill, answer)
        else:  # done with its prefill's token: it never ran
            self.alloc.release(req.d_pages)
            req.d_pages = None
            self.load_tokens -= req.input_len + req.output_len
            if answer:
                self._respond(req, "completed", http_status=200)
        if self.cache is not None and req.blocks:  # the radix cache keeps its prompt
            self.cache.insert(req.blocks)

    def _retract_for(self, needy: Request) -> bool:
        """Retract to cover a growth: ``check_decode_mem`` evicts from the radix cache first,
        then ``retract_decode`` (RunningBatch's rule); the new-token ratio then jumps to what
        the requests left have generated of their outputs, plus 20 steps each (from the next
        decode step on: the step after a retraction does not decay it). True if ``needy``
        still runs."""
        alloc, cache = self.alloc, self.cache
        if cache is not None and cache.blocks:
            cache.evict(self.growth_pages)
            if alloc.capacity - alloc.used >= self.growth_pages:
                return True
        kept = super()._retract_for(needy)
        n = len(self.running)
        decoded = self.ctx_sum - self.in_sum
        denominator = self.out_sum + (1 if self.ratio_plus_one else 0)
        ratio = (decoded + RETRACT_DECODE_STEPS * n) / denominator if denominator else 1.0
        self._r_base, self._r_at, self._r_skip = min(1.0, ratio), self.step + 1, 0
        self.batch_is_full = False
        return kept

    def _requeue(self, victim: Request) -> int:
        """A colocated victim's KV is freed, not kept: it goes to the back of the waiting queue
        to be prefilled again, prompt and generated tokens both (``recompute``)."""
        victim.fill_target, victim.fill_done = victim.input_len + victim.generated, 0
        self.waiting.append(victim)
        return -1

    def take(self, req: Request, n: int) -> bool:
        """Allocate pages for ``n`` more tokens of ``req``'s fill (cached blocks evicted for
        them if need be); False if they are not free."""
        alloc = self.alloc
        need = -(-n // alloc.page_size)
        if alloc.capacity - alloc.used < need and self.cache is not None:
            self.cache.evict(need)
        pages = req.d_pages
        if pages is None:
            req.d_pages = alloc.alloc(need)
            return req.d_pages is not None
        return alloc.grow(pages, need)

    # --- responses, aborts, crashes, flushes ---------------------------------------------

    def _respond(self, req: Request, status: str, reason: str = "",
                 http_status: int | None = None) -> None:
        """Answer ``req`` (its end, :func:`pdsim.engine.request.end`), unless it already
        ended (the gateway timed it out, maybe in this same instant): one request, one end."""
        if http_status is None:
            http_status = 200 if status == "completed" or req.stream else 500
        if not end(req, status, reason, http_status, self.env._now, self.stats):
            return
        answer = req.on_response
        if answer is not None:
            req.on_response = None
            answer.responded()

    def _fail(self, req: Request, reason: str, http_status: int) -> None:
        self._respond(req, "failed", reason, http_status)

    def _drop(self, req: Request) -> None:
        """Forget a request that is no longer served (its pages freed)."""
        if self.chunked is req:
            self.chunked = None
        if req.d_pages is not None and not req.d_pages.freed:
            self.alloc.release(req.d_pages)
        req.d_pages = None
        self.load_tokens -= req.input_len + req.output_len
        self._kick()
        self._maybe_idle()

    def abort(self, req: Request) -> None:
        """The router timed the request out (``AbortReq``): it leaves the queue, the chunk in
        progress or the running batch, and frees its KV. One in the forward now in flight is
        dropped when the forward ends."""
        if req.rid in self.running:  # it leaves when the step in flight ends (its token
            self._aborts.append(req)  # counted: the step was planned with it)
            self._changed_next()
        elif any(r is req for r, _n, _f in self.batch):
            return  # (_commit_prefill drops it)
        elif req is self.chunked:
            self._drop(req)
            self._changed_next()
        else:
            try:
                self.waiting.remove(req)
            except ValueError:
                if req.d_pages is not None:  # (holding KV, it must be in one of the above)
                    raise AssertionError(f"{self.name}/r{self.index}: aborted request "
                                         f"{req.rid} holds KV but is in no queue") from None
                return  # (being tokenized: _tokenized drops it)
            self._drop(req)

    def holds(self, req: Request) -> bool:
        """Whether ``req``, holding KV here, is in one of this rank's queues (the forward,
        the request being chunked, the running batch): ``Fleet.check_held``'s invariant."""
        return (req.rid in self.running or req is self.chunked
                or any(r is req for r, _n, _f in self.batch))

    def refuse(self, req: Request) -> None:
        """The server is down: the connection is refused, the router answers 502 at once."""
        self._fail(req, "decode_unavailable", 502)

    def crash(self) -> None:
        """The process died: every request it held gets a broken connection (HTTP 502), its
        KV and queues are gone."""
        self.halt()
        self._epoch += 1
        held = [*self.waiting, *self.running.values(), *(r for r, _n, _f in self.batch)]
        if self.chunked is not None:
            held.append(self.chunked)
        for req in self.running.values():
            self._sync(req)
        for req in held:
            self._fail(req, "decode_crashed", 502)
        if self.front is not None:
            frontend.crash(self)
        self.waiting.clear()
        self.running.clear()
        self._aborts = []
        self.batch = []
        self.chunked = None
        self._finish.clear()
        self._grow.clear()
        self.ctx_sum = self.in_sum = self.out_sum = self._long = self.load_tokens = 0
        self.batch_is_full = False
        self._r_base, self._r_at, self._r_skip = self.ratio_init, self.step, 0
        self.alloc.reset()
        if self.cache is not None:
            self.cache.reset()
        self.log("decode_crash", self.name, self.index, peer=self.session, value=len(held))

    def restart(self) -> None:
        """Serving again (the fleet gave it a new session first)."""
        self.resume()
        self.log("decode_restart", self.name, self.index, peer=self.session)

    def is_fully_idle(self) -> bool:
        return not (self.waiting or self.running or self.chunked or self.batch
                    or self._arriving)

    def busy_summary(self) -> str:
        return (f"waiting={len(self.waiting) + self._arriving} "
                f"chunked={int(self.chunked is not None)} forward={len(self.batch)} "
                f"running={len(self.running)}")

    def flush_now(self, how: str) -> None:
        """Free every page and the radix cache (``flush_cache``): the running requests' and
        the chunked one's KV stays where it is, but the allocator hands it out again."""
        self._catch_up()
        stale = [*self.running.values(), *(r for r, _n, _f in self.batch)]
        if self.chunked is not None:
            stale.append(self.chunked)
        for req in stale:
            req.stale_pages = True
        self.log("flush_executed", self.name, self.index, value=0,
                 detail=f"{how}; {self.flush_state()}; {len(stale)} running or prefilling on "
                 f"freed pages")
        self.alloc.reset()
        if self.cache is not None:
            self.cache.reset()
        self.stats.flushes_executed += 1
        self.batch_is_full = False
        self._kick()
        self._changed()


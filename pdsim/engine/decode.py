"""Decode DP rank: pre-allocation -> transfer queue -> waiting queue -> running batch.

Pre-allocation reserves KV pages for the prompt (waiting while the pool is full) and then
bootstraps the room, so the prefill may run. The request waits in the transfer queue for its KV,
then joins the continuous batch. One simulated event per batch step: tokens are counted lazily
from the rank's step counter, and page growth and completions come off a sorted list and a
heap keyed by step.
Under memory pressure the rank retracts requests (fewest generated tokens first, as SGLang's
``retract_decode``) and re-admits them later at the cost of recomputing their context.
"""

from __future__ import annotations

import heapq
import math
from bisect import insort
from collections import deque
from collections.abc import Callable, Iterator
from itertools import chain, islice

import simpy

from pdsim.config.scenario import DecodeConfig
from pdsim.engine.clock import KeptDeadlines
from pdsim.engine.log import EventLog
from pdsim.engine.rank import Rank
from pdsim.engine.request import SUCCESS, WAITING_FOR_INPUT, Request
from pdsim.engine.stats import Stats
from pdsim.model.predictor import Predictor

GROWTH_TOKENS = 64  # KV growth is booked in 64-token blocks: a simulation granularity


def _decode_series(decode: Callable[..., float], batch: float, attn: float, ctx: int,
                   grow: int) -> Iterator[float]:
    """``decode(batch, ctx + grow*j, attn)`` for j = 0, 1, ... (a predictor without
    ``decode_series``)."""
    while True:
        yield decode(batch, ctx, attn)
        ctx += grow


def _leader(lines: list[tuple[int, int]], i: int) -> tuple[int, int, int]:
    """Of context lines (``(b, c)``: context c + b*j at step j), the one with the largest
    context at step ``i`` (the steepest of equals): that context, its ``b``, and the first
    step a steeper line is above it (0: none ever is)."""
    ctx = b = c = -1
    for bj, cj in lines:
        v = cj + bj * i
        if v > ctx or (v == ctx and bj > b):
            ctx, b, c = v, bj, cj
    return ctx, b, _overtaken(b, c, lines, 0)


def _overtaken(b: int, c: int, lines: list[tuple[int, int]], nxt: int) -> int:
    """The first step one of ``lines`` steeper than the line ``(b, c)`` is above it, if
    before ``nxt`` (else ``nxt``; 0: none ever is)."""
    for bj, cj in lines:
        if bj > b:
            t = (c - cj) // (bj - b) + 1
            if not nxt or t < nxt:
                nxt = t
    return nxt


class Lead:
    """A lazy lockstep group's leading context line, kept from span to span (its span ends
    re-plan a rank or two; the others keep their lines): the line that led at a span's first
    step and the first step another line is above it (``_leader``'s answer, 0: none ever
    is). While that line is still one of the group's and that step is ahead, no line kept
    since is above it, so only the lines made since (``fresh``) need checking: the same
    leader and segment end ``_leader`` gives, or a later-starting segment's (any line
    leading a step gives its context, so the same durations)."""

    __slots__ = ("line", "until")

    def __init__(self) -> None:
        self.line: tuple[int, int] | None = None
        self.until = -1  # (nothing kept)

    def at(self, lines: list[tuple[int, int]], fresh: list[tuple[int, int]],
           i: int) -> tuple[int, int, int]:
        """``_leader(lines, i)``: the largest context at step ``i``, its line's ``b`` and a
        step before which no line is above it (0: none ever is)."""
        until = self.until
        if (i < until or not until) and self.line in lines:
            b, c = self.line
            ctx = c + b * i
            for bj, cj in fresh:
                if cj + bj * i > ctx:
                    break  # a new leader
            else:
                self.until = until = _overtaken(b, c, fresh, until)
                return ctx, b, until
        ctx, b, nxt = _leader(lines, i)
        self.line, self.until = (b, ctx - b * i), nxt
        return ctx, b, nxt


def _envelope(series: Callable[..., Iterator[float]], batch: float, attn: float,
              lines: list[tuple[int, int]], i: int) -> Iterator[Iterator[float]]:
    """The durations of a lockstep span's steps ``i``, ``i`` + 1, ..., segment by segment:
    in each, one rank's context line is the largest (``_leader``)."""
    while True:
        ctx, b, nxt = _leader(lines, i)
        if not nxt:
            yield series(batch, attn, ctx, b)
            return
        yield islice(series(batch, attn, ctx, b), nxt - i)
        i = nxt


class DecodeRank(Rank):
    role = "decode"
    SPANS = True
    __slots__ = ("flush_dooms", "max_running", "reserve_tokens", "waiting_timeout", "port",
                 "session", "alive", "on_waiting_timeout", "prealloc", "transfer", "waiting",
                 "retracted", "running", "step", "ctx_sum", "_finish", "_grow", "_seq",
                 "growth_pages", "_block_tokens", "_lag", "_late", "bootstrap_s",
                 "tokenize_s_per_token", "_dropped", "_epoch", "_planned", "_waiting_deadlines")

    def __init__(self, env: simpy.Environment, server: int, index: int, cfg: DecodeConfig,
                 predictor: Predictor, pool_pages: int, waiting_timeout_s: float, port: int,
                 flush_semantics: str, log: EventLog, stats: Stats,
                 flush_dooms: str = "source_and_destination") -> None:
        super().__init__(env, server, index, cfg, predictor, pool_pages, flush_semantics, log,
                         stats)
        self.flush_dooms = flush_dooms  # scenario flush.dooms: which destinations a flush fails
        # (cfg fields as plain attributes, read from here only: a pydantic model's are slow to
        # read per request; nothing changes them during a run)
        self.max_running = cfg.max_running_requests
        self.reserve_tokens = cfg.retract_reserve_tokens
        self.waiting_timeout = waiting_timeout_s
        self.port = port
        self.session = f"decode-{server}.r{index}:{port}"
        self.alive = True
        self.on_waiting_timeout = None  # set by the fleet: the connection is invalidated
        self.prealloc: deque[Request] = deque()
        self.transfer: dict[int, Request] = {}
        self.waiting: deque[Request] = deque()
        self.retracted: deque[Request] = deque()
        self.running: dict[int, Request] = {}
        self.step = 0
        self.ctx_sum = 0
        self._finish: list[tuple[int, int, int, Request]] = []
        # Growth entries (step, seq, version, request), sorted: a list, not a heap, since a
        # grown request's next growth, a block of tokens later, nearly always goes at its
        # back: taking the front and appending compare no tuples, where a heap operation
        # compares ~log2(n) of them (~300 instructions each: ~2k a heapreplace at 50 entries).
        self._grow: list[tuple[int, int, int, Request]] = []
        self._seq = 0
        self.growth_pages = max(1, self.alloc.pages_for(GROWTH_TOKENS))
        # A running request grows a block of tokens (P) once its pages are full: P steps
        # after its last growth, or, after a first growth at the commit after it joined with
        # its context d >= 0 tokens past its pages, P - 1 - d steps. So L steps hold at most
        # 1 + (L - 1) // (P - 1 - lag) of its growths, ``lag`` the largest d so far; a
        # request that grows sooner (none should) sets ``_late`` (span_steps then walks).
        # ``_late`` is a safeguard no test reaches: were a request ever to grow sooner (a
        # growth booked after its step), the bound would not hold, so span_steps walks the
        # growths instead of trusting it (the same span, found more slowly).
        self._block_tokens = self.growth_pages * self.alloc.page_size
        self._lag = 0
        self._late = False
        # per-request TTFT-path costs (engine profile), set by the fleet: the decode's
        # bootstrap handshake with the prefill, after both servers tokenized the prompt
        self.bootstrap_s = 0.0
        self.tokenize_s_per_token = 0.0
        self._dropped: set[int] = set()  # rooms a crash abandoned: their outcome is not ours
        self._epoch = self._planned = 0  # a crash voids the step in flight (pdsim.engine.faults)
        # per-request waiting timeouts, kept on the requests of ``transfer`` (in the order
        # they started) with one pending timer
        self._waiting_deadlines = KeptDeadlines(env, waiting_timeout_s, self._in_transfer,
                                                self._waiting_timeout, "wait_at", "wait_eid",
                                                lambda: self.transfer.values())

    def forget_deadlines(self) -> None:
        """The run is over: forget the armed waiting deadline's request (the others are only
        in ``transfer``; ``pdsim.engine.fleet.Fleet.release``)."""
        self._waiting_deadlines.clear()

    # --- arrivals, pre-allocation, transfer ----------------------------------------------

    def submit(self, req: Request) -> None:
        """POST /generate reached this rank (``pdsim.engine.server.Server.dispatch``)."""
        req.d_server, req.d_rank = self.server, self.index
        self._catch_up()
        room = req.room
        room.session = self.session
        room.port = self.port
        room.decode = self  # it hears room_done
        self.prealloc.append(req)
        self.load_tokens += req.input_len + req.output_len
        self._try_prealloc()
        # it may have taken pages (only when nothing is retracted: _try_prealloc)
        stepper = self.stepper
        if stepper is None or not stepper.taken(self):
            self._changed()

    def _try_prealloc(self) -> None:
        prealloc = self.prealloc
        if not prealloc or self.halted:  # pre-allocation runs in the scheduler loop
            return
        alloc, transfer, limit = self.alloc, self.transfer, self.max_running
        # retracted requests get freed pages before new ones are pre-allocated
        while prealloc and not self.retracted:
            req = prealloc[0]
            room = req.room
            if room.resolved:
                prealloc.popleft()
                continue
            if (len(transfer) + len(self.waiting) + len(self.running)
                    + len(self.retracted)) >= limit:  # slots used
                return
            pages = alloc.alloc(alloc.pages_for(req.input_len + self.reserve_tokens))
            if pages is None:
                return
            prealloc.popleft()
            req.d_pages = pages
            req.cap_tokens = pages.n * alloc.page_size
            transfer[req.rid] = req
            room.state = WAITING_FOR_INPUT
            delay = self.bootstrap_s + self.tokenize_s_per_token * req.input_len
            if delay > 0:  # the handshake (and tokenization) before the prefill may run
                room.start_bootstrap(delay)
            else:
                room.bootstrap()
            # (``transfer`` holds it: its order is the deadlines')
            req.wait_at, req.wait_eid = self._waiting_deadlines.start(req)

    def _in_transfer(self, req: Request) -> bool:
        return req.rid in self.transfer and not req.room.resolved

    def _waiting_timeout(self, req: Request) -> None:
        """(KeptDeadlines calls it only while the request still waits for its KV.)"""
        req.room.fail("waiting_timeout")
        # the cached connection is invalidated; the decode re-registers with the prefill
        if self.on_waiting_timeout is not None:
            self.on_waiting_timeout(self.session, req)

    def room_done(self, req: Request) -> None:
        """The room resolved (pdsim.engine.request.Room)."""
        if self._dropped and req.rid in self._dropped:
            self._dropped.discard(req.rid)
            return
        if (req.room.state == SUCCESS and (len(self.running) < self.max_running or self.halted)
                and self.transfer.pop(req.rid, None) is not None):
            # (the usual case) its KV arrived and the rank's next plan admits it (span_steps'
            # first rule, which reads nothing the steps ended since change): the step in
            # flight becomes the span's last with no catch-up (the span's end commits them)
            self._arrived(req)
            self._changed_next()
            return
        self._catch_up()
        if req.room.state != SUCCESS:
            self._failed(req)
        elif self.transfer.pop(req.rid, None) is not None:
            self._arrived(req)
        self._changed()

    def _arrived(self, req: Request) -> None:
        """Its KV arrived: it waits to run."""
        req.t_transfer_done = self.env._now
        self.waiting.append(req)
        self._kick()

    def _failed(self, req: Request) -> None:
        """Its room failed: free KV and answer the client (500, or 200 with an abort chunk
        when streaming)."""
        self.transfer.pop(req.rid, None)
        if req.d_pages is not None and not req.d_pages.freed:
            self.alloc.release(req.d_pages)
        self.load_tokens -= req.input_len + req.output_len
        self.stats.count_request_failure(req.room.reason)
        self._respond(req, "failed", req.room.reason)
        self._try_prealloc()
        self._kick()  # freed pages may let a retracted request back in
        self._maybe_idle()

    def _respond(self, req: Request, status: str, reason: str = "",
                 http_status: int | None = None) -> None:
        if req.status == "timed_out":  # the router already answered the client
            return
        req.status = status
        req.reason = reason
        req.t_done = self.env._now
        if http_status is not None:
            req.http_status = http_status
        elif status == "completed":
            req.http_status = 200
        else:
            req.http_status = 200 if req.stream else 500
        answer = req.on_response
        if answer is not None:  # the router learns of it once
            req.on_response = None
            answer.responded()

    # --- the batch loop ------------------------------------------------------------------

    def _entry(self, step: int, req: Request) -> tuple[int, int, int, Request]:
        """An entry of the finish heap or the growth list for a request in the batch: live
        while its version is the request's (``_leave`` changes it as the request leaves
        ``running``, the only way out but a crash, which clears both)."""
        self._seq += 1
        return step, self._seq, req.version, req

    def _join(self, req: Request) -> None:
        """Add to the running batch at the current step."""
        self.running[req.rid] = req
        req.join_step = self.step
        req.gen_at_join = req.generated
        ctx = req.input_len + req.generated
        self.ctx_sum += ctx
        heapq.heappush(self._finish,
                       self._entry(self.step + req.output_len - req.generated, req))
        if ctx - req.cap_tokens > self._lag:
            self._lag = ctx - req.cap_tokens
        # the step its pages are full (its context is one more token a step): a growth's
        # then, or now if they already are (growths move it on: _grow_due)
        req.full_at = full = self.step + req.cap_tokens - ctx
        insort(self._grow, self._entry(full if full > self.step else self.step, req))

    def _admit(self) -> int:
        """Admit retracted (first) and waiting requests; returns tokens to recompute."""
        recompute = 0
        limit = self.max_running
        while self.retracted and len(self.running) < limit:
            req = self.retracted[0]
            ctx = req.input_len + req.generated
            pages = self.alloc.alloc(self.alloc.pages_for(ctx) + self.growth_pages)
            if pages is None:
                break
            self.retracted.popleft()
            req.d_pages = pages
            req.cap_tokens = pages.n * self.alloc.page_size
            recompute += ctx
            self._join(req)
        # waiting requests already hold their KV: running them is how pages come back
        while self.waiting and len(self.running) < limit:
            req = self.waiting.popleft()  # its room reached Success, which is terminal
            req.generated = 1  # the prefill's first token arrives with the KV
            req.t_first_token = self.env._now
            self.stats.tokens_out += 1
            if req.d_pages.epoch != self.alloc.epoch:
                req.stale_pages = True
            self._join(req)
            if req.output_len <= 1:
                self._complete(req)  # a one-token output is done on arrival
        return recompute

    def _sync(self, req: Request) -> None:
        """``generated`` is counted lazily: tokens at joining plus the steps since. (The
        same count is written inline, marked ``# generated``, in ``_retract_for``; growths
        need no count: their steps come from ``Request.full_at``, set in ``_join``.)"""
        req.generated = req.gen_at_join + (self.step - req.join_step)

    def sync_running(self) -> None:
        """Bring ``generated`` of running requests up to date (they are counted lazily)."""
        self._catch_up()
        for req in self.running.values():
            self._sync(req)

    def _leave(self, req: Request) -> None:
        self._sync(req)
        del self.running[req.rid]
        self.ctx_sum -= req.input_len + req.generated
        req.version += 1

    def _retract_for(self, needy: Request) -> bool:
        """Free pages by retracting; True if ``needy`` still runs afterwards."""
        while self.alloc.free < self.growth_pages:
            victim = min(self.running.values(),
                         key=lambda r: (r.gen_at_join + self.step - r.join_step,  # generated
                                        -r.input_len))
            self._leave(victim)
            self.alloc.release(victim.d_pages)
            victim.d_pages = None
            self.retracted.append(victim)
            self.stats.retractions += 1
            self.log("retract", self.name, self.index, victim.rid, victim.room.id,
                     value=victim.generated)
            if victim is needy:
                return False
        return True

    def plan_step(self) -> tuple[int, int, int] | None:
        """Admit and size the next step: (batch, summed context, tokens to recompute) or None."""
        recompute = self._admit() if self.retracted or self.waiting else 0
        running = self.running
        if not running:
            return None
        self.stats.decode_steps += 1
        self._planned = self._epoch
        return len(running), self.ctx_sum, recompute

    def step_time(self, plan: tuple) -> float:
        batch, ctx, recompute = plan[:3]
        attn = plan[3] if len(plan) > 3 else batch
        dt = self.predictor.decode(batch, ctx, attn)
        if recompute:
            dt += self._recompute_s(recompute)
        return dt

    def _recompute_s(self, tokens: int) -> float:
        """What a step adds when re-admitted requests recompute ``tokens`` of context (as one
        extend)."""
        return self.predictor.prefill(tokens, 0.0, tokens * (tokens + 1) / 2)

    @staticmethod
    def combine(plans: list[tuple], n_ranks: int) -> tuple:
        """Gathered MoE batch at the mean over the ranks; attention batch, KV reads and
        recompute at the max."""
        p = plans[0]
        total = batch = p[0]
        ctx, recompute = p[1], p[2]
        for p in plans[1:]:  # (one pass: the same sum, in order, and the same maxima)
            b = p[0]
            total += b
            if b > batch:
                batch = b
            if p[1] > ctx:
                ctx = p[1]
            if p[2] > recompute:
                recompute = p[2]
        return total / n_ranks, ctx, recompute, batch

    def commit_step(self, plan: tuple[int, int, int]) -> None:
        """The step finished: one token for every request in the batch.

        Requests that produced their last token leave (and free their pages) before the next
        step's KV growth is booked, as SGLang frees finished requests before its memory check:
        a request done at this step is never retracted (it would come back for a token past
        its output length). Growth then comes before new pre-allocations, as SGLang's
        ``DecodePreallocQueue._allocatable_tokens`` holds back space for the running requests'
        decoding (sgl-project/sglang, python/sglang/srt/disaggregation/decode.py).
        """
        if self._planned != self._epoch:  # the process died during this step
            return
        batch = plan[0]
        self.step = step = self.step + 1
        self.ctx_sum += batch
        self.stats.tokens_out += batch
        heap = self._finish
        done = False
        while heap and heap[0][0] <= step:
            _s, _q, version, req = heapq.heappop(heap)
            if version == req.version:  # (else it left the batch since: see ``_entry``)
                self._complete(req, refill=False)
                done = True
        grow = self._grow
        if grow and grow[0][0] <= step:
            self._grow_due(step, step)  # running requests grow first, then new ones pre-allocate
        if done:
            self._try_prealloc()
            self._maybe_idle()

    def _grow_due(self, end: int, first: int) -> None:
        """Grow, by a block each, the running requests whose growth falls due by step
        ``end``, in their entries' (step, seq) order, each at (the commit of) its own step, or
        ``first`` if that is later. A growth the free pages do not cover retracts first
        (``_retract_for``; never within a span's quiet steps, ``span_steps``). A grown
        request's next growth gets the next seq and goes at the list's back when its step is
        not earlier than the back's (nearly always), else in its place after the entries
        taken (its step is later than the growth's), so the list stays sorted.

        While the free pages cover them, growths of holdings of the allocator's epoch (what
        ``PageAllocator.grow`` does for those: pages added to the holding) are booked with the
        allocator in one ``book`` when the loop stops, or before anything else: an orphan's
        growth or a shortfall goes through ``grow`` (and may retract), which reads ``used``.
        Within the loop nothing else reads the allocator, and ``used`` only rises, so its
        peak is the same."""
        queue, alloc = self._grow, self.alloc
        gp, tokens = self.growth_pages, self._block_tokens
        soon = tokens - 1 - self._lag  # a growth sooner than this after the last is late
        check = soon if soon > 1 else 1  # (a next growth sooner is late or moves to step + 1)
        seq, epoch = self._seq, alloc.epoch
        free = left = alloc.capacity - alloc.used  # (grown, not booked yet: free - left)
        # (in order: an entry added meanwhile goes at the back or after this one; the qi
        # entries taken are dropped at the end)
        qi, back = 0, queue[-1][0] if queue else 0  # (the back's step)
        for s, _q, version, req in queue:
            if s > end:
                break
            qi += 1
            if version != req.version:  # it left the batch since (see ``_entry``)
                continue
            pages = req.d_pages
            if left >= gp and pages.epoch == epoch:
                pages.n += gp
                left -= gp
            else:
                if free != left:
                    alloc.book(free - left)
                if not alloc.grow(pages, gp):  # the free pages do not cover it
                    if first > self.step:  # quiet steps: span_steps ends a span before it
                        raise AssertionError(f"{self.name}/r{self.index}: a growth short of "
                                             f"pages within a span's quiet steps (step {s})")
                    if not self._retract_for(req):  # (it was retracted itself)
                        free = left = alloc.capacity - alloc.used
                        continue
                    alloc.grow(pages, gp)  # (_retract_for freed enough)
                free = left = alloc.capacity - alloc.used
            if s < first:
                s = first  # (the step it grows at)
            # the step its pages are full again (``_growth_steps`` walks the same rule): its
            # next growth's, or the next step if that is later
            req.full_at = f = req.full_at + tokens
            if f < s + check:
                if f < s + soon:  # (none should: see _late)
                    self._late = True
                if f <= s:
                    f = s + 1
            seq += 1  # (_entry's counter)
            if f >= back:  # (at the back: its seq is the largest yet)
                queue.append((f, seq, version, req))
                back = f
            else:  # (after the entries taken: its step is later than this one's)
                insort(queue, (f, seq, version, req), qi)
        self._seq = seq
        del queue[:qi]
        if free != left:
            alloc.book(free - left)

    # --- spans of steps that cannot change the batch (pdsim.engine.lockstep.Stepper) --------------

    def span_steps(self, limit: int) -> int:
        """Steps from the next one on that run the current batch unchanged, up to ``limit``:
        the last is the first that finishes a request or grows one while free pages might not
        suffice (it may retract), or the next, if the plan after it admits a request."""
        if limit <= 1 or self.halted:
            return 1
        running = self.running
        if len(running) < self.max_running:
            if self.waiting:
                return 1
            if self.retracted:
                head = self.retracted[0]
                alloc = self.alloc
                need = alloc.pages_for(head.input_len + head.generated) + self.growth_pages
                if alloc.capacity - alloc.used >= need:
                    return 1
        if not running:
            return limit
        step = self.step
        fin = self._finish
        while fin and fin[0][2] != fin[0][3].version:
            heapq.heappop(fin)  # stale: the commit loop would skip it too
        if fin and fin[0][0] - step < limit:
            limit = fin[0][0] - step
            if limit <= 1:
                return 1
        # a request grows at most once a step, and at most once in P - 1 - lag (see
        # ``_lag``): when the free pages cover that, no walk
        alloc = self.alloc
        cover = (alloc.capacity - alloc.used) // self.growth_pages
        n = len(running)
        if cover >= n * limit:
            return limit
        gap = self._block_tokens - 1 - self._lag
        if gap > 0 and not self._late and cover >= n * (1 + (limit - 1) // gap):
            return limit
        growths = self._growth_steps(step + limit, cover + 1)
        if cover < len(growths):  # the first growth the free pages do not cover may retract
            return max(1, growths[cover] - step)
        return limit

    def _growth_steps(self, end: int, most: int | None = None) -> list[int]:
        """The steps (up to ``end``) whose commits will grow a running request, one entry per
        growth, in commit order, if nothing else changes: the walk ``quiet_steps`` makes,
        without applying it. ``most``: only the first that many (``span_steps`` reads the
        first growth the free pages do not cover; a long output on a small pool would
        otherwise walk every block of it, ~2 heap operations a block, at every span end)."""
        first = self.step + 1
        walk = [(s if s > first else first, q, r, r.full_at)
                for s, q, v, r in self._grow if s <= end and v == r.version]
        if not walk:
            return walk
        heapq.heapify(walk)
        tokens = self._block_tokens
        steps = []
        while walk and len(steps) != most:
            at, q, req, full = heapq.heappop(walk)
            steps.append(at)
            full += tokens  # (the next growth's step as _grow_due books it)
            nxt = full if full > at + 1 else at + 1
            if nxt <= end:
                heapq.heappush(walk, (nxt, q, req, full))
        return steps

    @staticmethod
    def nth_plan(plan: tuple[int, int, int], i: int) -> tuple[int, int, int]:
        """Step ``i`` of a span: the same batch, its context grown by a token per request per
        step, and recompute only in the first step."""
        batch, ctx, recompute = plan
        return plan if i == 1 else (batch, ctx + batch * (i - 1), 0)

    def span_durations(self, plans: list[tuple[int, int, int]],
                       n_ranks: int) -> Iterator[float]:
        """``Rank.span_durations`` without building every step's plans: past a span's first
        step no rank recomputes, the batches (mean and largest in lockstep) stay, and each
        rank's context grows by its batch a step, so a step's time is the predictor's decode
        time at the largest context (what ``combine`` takes): the upper envelope of the
        ranks' context lines, followed segment by segment (integers, so the same contexts)."""
        if n_ranks:
            return self.group_durations([(b, c - b) for b, c, _r in plans],
                                        [p[0] for p in plans], 1, n_ranks,
                                        max(p[2] for p in plans))
        b, c, recompute = plans[0]
        durations = self._series(b, b, c, b)  # (its first: step_time's decode)
        if not recompute:
            return durations
        first = next(durations) + self._recompute_s(recompute)  # (step_time's sum, in order)
        return chain((first,), durations)

    def group_durations(self, lines: list[tuple[int, int]], batches: list[int], step: int,
                        n_ranks: int, recompute: int, stop: int = 0,
                        lead: tuple[int, int, int] | None = None) -> Iterator[float]:
        """``span_durations`` of a lockstep group of ``n_ranks`` whose live ranks follow
        ``lines`` (``line``), for a span beginning at step ``step``: ``combine``'s rule read
        off the lines, step after step (the mean of ``batches`` over the ranks, their largest,
        the largest context: the lines' upper envelope), and in the first step only the most
        any rank recomputes, ``recompute``. ``stop``: the span ends before that step (no
        duration from it on is asked for: they may not follow the envelope), so a first
        segment reaching it is the span's only one (the usual case); 0: no end. ``lead``:
        the first segment's leader, if known (``Lead.at``)."""
        batch, attn = sum(batches) / n_ranks, max(batches)
        ctx, b, nxt = _leader(lines, step) if lead is None else lead
        durations = self._series(batch, attn, ctx, b)
        if nxt and (nxt < stop or not stop):  # another line leads from step nxt on
            durations = chain(islice(durations, nxt - step), chain.from_iterable(
                _envelope(self._series, batch, attn, lines, nxt)))
        if not recompute:
            return durations
        first = next(durations) + self._recompute_s(recompute)  # (step_time's sum, in order)
        return chain((first,), durations)

    def _series(self, batch: float, attn: float, ctx: int, grow: int) -> Iterator[float]:
        """The predictor's ``decode(batch, ctx + grow*j, attn)``, j = 0, 1, ..."""
        series = getattr(self.predictor, "decode_series", None)
        if series is None:
            return _decode_series(self.predictor.decode, batch, attn, ctx, grow)
        return series(batch, attn, ctx, grow)

    @staticmethod
    def lead() -> Lead:
        """What a lazy group keeps of its lines' leader across spans (``group_durations``'
        ``lead`` comes from its ``at``)."""
        return Lead()

    @staticmethod
    def line(plan: tuple[int, int, int], step: int) -> tuple[tuple[int, int], int]:
        """A plan for group step ``step`` as a context line ``(b, c)``, its context at step j
        being c + b*j while its batch runs unchanged (``nth_plan``), and its recompute."""
        batch, ctx, recompute = plan
        return (batch, ctx - batch * step), recompute

    def quiet_steps(self, n: int, plans: int | None = None) -> None:
        """``n`` steps that finish nothing and retract nothing (a span's inner steps): their
        commits (tokens, context, KV growth at each one's own step) and the plans after them
        (``plans`` of them: a lazy lockstep group counts a continued plan when it makes it)."""
        end = self.step + n
        if self._grow and self._grow[0][0] <= end:
            self._grow_due(end, self.step + 1)
        self.step = end
        batch = len(self.running)
        self.ctx_sum += batch * n
        self.stats.tokens_out += batch * n
        self.stats.decode_steps += n if plans is None else plans

    def _complete(self, req: Request, refill: bool = True) -> None:
        self._leave(req)
        self.alloc.release(req.d_pages)
        req.d_pages = None
        self.load_tokens -= req.input_len + req.output_len
        if req.status != "timed_out":  # _respond(req, "completed"), inline
            req.status = "completed"
            req.reason = ""
            req.t_done = self.env._now
            req.http_status = 200
            answer = req.on_response
            if answer is not None:  # the router learns of it once
                req.on_response = None
                answer.responded()
        if refill:
            self._try_prealloc()
            if self._idle_waiters:
                self._maybe_idle()

    # --- crash and restart (pdsim.engine.faults) --------------------------------------------

    def refuse(self, req: Request) -> None:
        """The server is down: the router's POST is refused, mini_lb answers 502 at once."""
        self.stats.count_request_failure("decode_unavailable")
        self._respond(req, "failed", "decode_unavailable", http_status=502)

    def crash(self) -> None:
        """The process died: every request it held sees its connection break (HTTP 502), its
        KV and queues are gone. Their rooms stay open at the prefill, which learns of the crash
        only when its next write to this session fails."""
        self.halt()
        self._epoch += 1
        held = [*self.prealloc, *self.transfer.values(), *self.waiting,
                *self.running.values(), *self.retracted]
        for req in held:
            if not req.room.resolved:
                self._dropped.add(req.rid)
            if req.status == "unfinished":
                self.stats.count_request_failure("decode_crashed")
                self._respond(req, "failed", "decode_crashed", http_status=502)
        for req in self.running.values():
            self._sync(req)
        self.prealloc.clear()
        self.transfer.clear()
        self.waiting.clear()
        self.running.clear()
        self.retracted.clear()
        self._finish.clear()
        self._grow.clear()
        self.ctx_sum = 0
        self.load_tokens = 0
        self.alloc.reset()
        self.log("decode_crash", self.name, self.index, peer=self.session, value=len(held))

    def resume(self) -> None:
        """Out of a stall: pre-allocate what queued meanwhile, then step again."""
        super().resume()
        self._try_prealloc()

    def restart(self) -> None:
        """Serving again (the fleet gave it a new session first)."""
        self.resume()
        self.log("decode_restart", self.name, self.index, peer=self.session)

    # --- flush -----------------------------------------------------------------------------

    def is_fully_idle(self) -> bool:
        return not (self.running or self.waiting or self.transfer or self.retracted
                    or any(not r.room.resolved for r in self.prealloc))

    def busy_summary(self) -> str:
        """Its queues' lengths (a pre-allocation whose room failed waits only to be dropped:
        not counted, as ``is_fully_idle`` does not)."""
        prealloc = sum(not r.room.resolved for r in self.prealloc)
        return (f"prealloc={prealloc} transfer={len(self.transfer)} "
                f"waiting={len(self.waiting)} running={len(self.running)} "
                f"retracted={len(self.retracted)}")

    def unfit(self) -> tuple[int, int]:
        """How many retracted requests the whole KV pool could never take back (``_admit``
        re-allocates a request's context and a growth block), and the most tokens one of them
        needs: a run stalled on them says so (``pdsim.engine.sim``)."""
        alloc, extra = self.alloc, self.growth_pages
        need = [alloc.pages_for(r.input_len + r.generated) + extra for r in self.retracted]
        big = [n for n in need if n > alloc.capacity]
        return len(big), max(big, default=0) * alloc.page_size

    def _doomed_by_flush(self, req: Request) -> bool:
        """Does freeing this room's pre-allocated destination pages fail its transfer?

        ``flush.dooms`` decides: ``source`` never (only the prefill's freed pages fail
        transfers), ``source_and_destination`` once the room's prefill has started (a write
        into the freed pages is under way or queued), ``source_and_unstarted`` always (the
        prefill will write into pages the decode no longer holds).
        """
        if self.flush_dooms == "source":
            return False
        return self.flush_dooms == "source_and_unstarted" or not math.isnan(req.t_prefill_start)

    def flush_now(self, how: str) -> None:
        self._catch_up()
        doomed = 0
        for req in self.transfer.values():
            if (not req.room.resolved and not req.room.doomed
                    and self._doomed_by_flush(req)):
                req.room.doomed = f"{self.name}/r{self.index}"
                doomed += 1
                self.log("flush_doomed", self.name, self.index, req.rid, req.room.id,
                         req.room.session, detail="destination pages freed")
        stale = len(self.running) + len(self.waiting)
        for req in [*self.running.values(), *self.waiting]:
            req.stale_pages = True  # their KV stays put, but the allocator hands it out again
        self.log("flush_executed", self.name, self.index, value=doomed,
                 detail=f"{how}; {self.flush_state()}; {stale} running/waiting on freed pages")
        self.alloc.reset()
        self.stats.flushes_executed += 1
        self._try_prealloc()
        self._kick()
        self._changed()

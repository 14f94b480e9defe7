"""The running half of a decode rank: the continuous batch, retraction, and spans of steps.

:class:`RunningBatch` holds the methods of :class:`pdsim.engine.decode.DecodeRank` that run
the batch once a request's KV has arrived: admission from the waiting queue (re-admitting
retracted requests first), one planned and committed step at a time (tokens counted lazily
from the step counter; completions off a heap keyed by step, page growth off a sorted list),
retraction under memory pressure (fewest generated tokens first, as SGLang's
``retract_decode``), and the spans of steps that cannot change the batch which the lockstep
stepper (:mod:`pdsim.engine.lockstep`) takes in one go. The state it works on is set up by
``DecodeRank.__init__``; it calls back into the admission half for ``_respond`` and
``_try_prealloc`` (a finished request frees pages a pre-allocation may take). A colocated rank
(:mod:`pdsim.engine.colocated`) runs the same batch, retraction and spans; the retracted queue
and its resumes (``_admit``, ``_resume_ready``, ``_resumable``) are a PD decode's only.
"""

from __future__ import annotations

import heapq
from bisect import insort
from collections.abc import Callable, Iterator
from itertools import chain, islice

from pdsim.engine.rank import Rank
from pdsim.engine.request import Request

GROWTH_TOKENS = 64  # KV growth is booked in 64-token blocks: a simulation granularity
# SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION: admission counts at most this many tokens still to
# generate per request (python/sglang/srt/managers/schedule_policy.py, 0.5.x)
CLIP_MAX_NEW_TOKENS = 4096
RETRACT_DECODE_STEPS = 20  # SGLANG_RETRACT_DECODE_STEPS (same file; environ.py in 0.5.9)


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


class RunningBatch(Rank):
    """The continuous batch of a decode rank (the class docstring of this module)."""

    __slots__ = ()

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

    def _resumable(self) -> int:
        """Tokens the head of the retracted queue may take back now (its context and its
        reserve must fit in them: ``resume_retracted_reqs``): the free tokens beyond the
        reserves of the requests running, transferring and waiting."""
        alloc = self.alloc
        n = len(self.running) + len(self.transfer) + len(self.waiting)
        return (alloc.capacity - alloc.used) * alloc.page_size - self.reserve_tokens * n

    def _admits_next(self) -> bool:
        """Whether the next plan admits a request (a waiting one, or a retracted one that
        resumes): then no span, whatever the batch."""
        return bool((self.waiting and len(self.running) < self.max_running)
                    or (self.retracted and self._resume_ready()))

    def _resume_ready(self) -> bool:
        """Whether the next plan resumes the head of the retracted queue (``_admit``'s
        rule; quiet steps only take pages, so it cannot become true within a span)."""
        req = self.retracted[0]
        alloc = self.alloc
        ctx = req.input_len + req.generated
        return ((len(self.running) + len(self.transfer) + len(self.waiting)) < self.slots
                and ctx + self.reserve_tokens <= self._resumable()
                and alloc.pages_for(ctx) <= alloc.capacity - alloc.used)

    def _admit(self) -> int:
        """Resume retracted requests (their KV comes back from host memory: no recompute),
        then run waiting ones; returns tokens to recompute (none on a PD decode).

        As SGLang's ``process_decode_queue``: retracted requests resume FIFO while their
        context and reserve fit in :meth:`_resumable` and a request slot is free, and join
        the waiting queue's back; once none is left retracted, pre-allocation goes on."""
        limit = self.max_running
        retracted = self.retracted
        if retracted:
            alloc, reserve, waiting = self.alloc, self.reserve_tokens, self.waiting
            allocatable = self._resumable()
            while retracted and (len(self.running) + len(self.transfer)
                                 + len(waiting)) < self.slots:  # (req_to_token_pool's)
                req = retracted[0]
                ctx = req.input_len + req.generated
                if ctx + reserve > allocatable:
                    break
                pages = alloc.alloc(alloc.pages_for(ctx))
                if pages is None:
                    break
                allocatable -= ctx + reserve
                retracted.popleft()
                req.d_pages = pages
                req.cap_tokens = pages.n * alloc.page_size
                waiting.append(req)
            if not retracted:
                self._try_prealloc()
        # waiting requests already hold their KV: running them is how pages come back
        while self.waiting and len(self.running) < limit:
            req = self.waiting.popleft()  # its room reached Success, which is terminal
            if req.generated:  # resumed after a retraction: its tokens so far are kept
                self._join(req)
                continue
            req.generated = 1  # the prefill's first token arrives with the KV
            req.t_first_token = self.env._now
            self.stats.tokens_out += 1
            if req.d_pages.epoch != self.alloc.epoch:
                req.stale_pages = True
            self._join(req)
            if req.output_len <= 1:
                self._complete(req)  # a one-token output is done on arrival
        return 0

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
        """Free pages by retracting (``ScheduleBatch.retract_decode``, the one implementation
        of the rule, PD and colocated); True if ``needy`` still runs afterwards.

        Victims go fewest generated tokens first, the longest prompt first among equals, at
        least one, but never the last request (``if len(sorted_indices) == 1: break``: then
        ``_alone_short``); SGLang 0.5.2 on (PR #9989) stops once the next step fits (here: the
        growth due), earlier releases once the free tokens cover 20 decode steps of every
        request left (``retract_20_steps``). Each victim frees its pages and goes where its
        role puts it (``_requeue``)."""
        alloc = self.alloc
        while True:
            free = alloc.capacity - alloc.used
            if free >= self.growth_pages and (not self.retract_20_steps or free * alloc.page_size
                                              >= RETRACT_DECODE_STEPS * len(self.running)):
                return True
            if len(self.running) == 1:  # "Always keep at least one request" (it is needy)
                return True
            victim = min(self.running.values(),
                         key=lambda r: (r.gen_at_join + self.step - r.join_step,  # generated
                                        -r.input_len))
            self._leave(victim)
            alloc.release(victim.d_pages)
            victim.d_pages = None
            room = self._requeue(victim)
            self.stats.retractions += 1
            self.log("retract", self.name, self.index, victim.rid, room, value=victim.generated)
            if victim is needy:
                return False

    def _alone_short(self, req: Request) -> int:
        """The one request left still cannot grow a block. SGLang decodes it a token at a time
        while a page is free: it takes the free pages (returns the tokens they hold). With none
        free SGLang raises "Out of memory even after retracting all other requests in the
        decode batch" and its server exits; pdsim fails this request alone (HTTP 500, reason
        ``decode_out_of_memory``, logged) and returns 0."""
        alloc = self.alloc
        free = alloc.capacity - alloc.used
        if free > 0 and alloc.grow(req.d_pages, free):
            return free * alloc.page_size
        self._leave(req)
        alloc.release(req.d_pages)
        req.d_pages = None
        self.load_tokens -= req.input_len + req.output_len
        room = req.room.id if req.room is not None else -1
        self.log("decode_out_of_memory", self.name, self.index, req.rid, room,
                 value=req.generated, detail="out of memory even after retracting all other "
                 "requests in the decode batch (SGLang raises and its server exits; pdsim "
                 "fails this request only)")
        # (counted for the time series by request.end, unless the request had already ended)
        self._respond(req, "failed", "decode_out_of_memory", http_status=500)
        self._try_prealloc()
        self._maybe_idle()
        return 0

    def _requeue(self, victim: Request) -> int:
        """A PD decode's victim waits in the retracted queue, its KV offloaded to host memory
        (``release_req``: ``offload_kv_cache``); returns its room's id (the log's)."""
        self.retracted.append(victim)
        return victim.room.id

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
                    if not alloc.grow(pages, gp):  # (alone: retract_decode keeps one)
                        grown = self._alone_short(req)
                        free = left = alloc.capacity - alloc.used
                        if not grown:  # (it failed)
                            continue
                        req.full_at += grown - tokens  # (a part of a block)
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
        if self._admits_next():
            return 1
        running = self.running
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

    def _complete(self, req: Request, refill: bool = True, answer: bool = True) -> None:
        """``req`` generated its last token: it leaves the batch and frees its pages, and
        (``answer``) the client has it (False: a colocated front end delivers it later,
        pdsim.engine.frontend.defer)."""
        self._leave(req)
        self.alloc.release(req.d_pages)
        req.d_pages = None
        self.load_tokens -= req.input_len + req.output_len
        if answer and req.status == "unfinished":  # _respond(req, "completed"), inline
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

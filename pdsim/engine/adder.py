"""SGLang's ``PrefillAdder``: which waiting requests the next prefill forward takes, on a
colocated rank and on a PD prefill rank alike (python/sglang/srt/managers/schedule_policy.py
``PrefillAdder`` and scheduler.py ``Scheduler.get_new_batch_prefill``, 0.5.x; the releases'
differences in :mod:`pdsim.config.engine_version`).

A PD prefill server runs the same adder with no running batch and every request's
``max_new_tokens`` set to 1 (disaggregation/prefill.py ``_process_req``: "so PrefillAdder memory
estimation is accurate"), its request slots those ``req_to_token_pool`` has left (the requests
whose KV awaits its transfer hold theirs).

Budgets, in tokens (page-rounded where SGLang rounds them):

- ``rem_chunk``: ``chunked_prefill_size`` (per DP rank), ``rem_input``: ``max_prefill_tokens``,
  both less the running requests mixed in with ``enable_mixed_chunk``. A request that does not
  fit ``rem_chunk`` is truncated and becomes the chunked request; one whose tokens reach
  ``rem_input`` waits, unless it is the forward's first.
- request slots: ``max_running_requests`` less the running batch.
- ``rem_total``: free tokens (and, when that is short, the radix cache's evictable ones) less
  what is reserved: each running request's remaining output (clipped to 4,096) times the
  new-token ratio, each admitted request's tokens and its whole output (clipped; none for a
  truncated one). ``cur_rem``: free tokens less the admitted requests' tokens.

A request refused for memory (``NO_TOKEN``) marks the running batch full; any other refusal
(``OTHER``) only ends this forward's admission. With the radix cache off, ``ignore_eos``
requests go through ``add_one_req_ignore_eos``: admitted only if, with every request (running,
admitted and this one) finishing shortest-first, the free tokens never run out.

Pages are taken as requests are admitted (pdsim allocates a chunk's pages when its forward is
formed); the checks above read the free tokens as they were when the forward began forming,
as SGLang's do (it allocates after admission).
"""

from __future__ import annotations

from typing import Any

from pdsim.engine.decode_batch import CLIP_MAX_NEW_TOKENS
from pdsim.engine.request import Request

CONTINUE, NO_TOKEN, OTHER = 0, 1, 2  # AddReqResult
IGNORE_EOS_RESERVE_TOKENS = 1  # schedule_policy.py


def _clip(n: int) -> int:
    return n if n < CLIP_MAX_NEW_TOKENS else CLIP_MAX_NEW_TOKENS


NO_RUNNING: dict = {}  # (a PD prefill rank's running batch)


class Adder:
    """One forward's admission on a rank (``form``)."""

    __slots__ = ("rank", "page", "rem_input", "rem_chunk", "offset", "cur_offset", "avail",
                 "evictable_known", "ratio", "states", "running", "slots", "one_token",
                 "stale")

    def __init__(self, rank: Any, running: dict, slots: int, mix: int = 0,
                 offset: float = 0.0, ratio: float = 1.0, one_token: bool = False,
                 stale: Any = None) -> None:
        """``rank``: a :class:`pdsim.engine.colocated.ColocatedRank` or
        :class:`pdsim.engine.prefill.PrefillRank` (not imported: they import this module).
        ``running``: its running batch; ``slots``: the requests the forward may hold
        (``get_num_allocatable_reqs``, and on a PD prefill ``req_to_token_pool``'s free
        slots); ``mix``: decode tokens mixed in (``mixed_with_decode_tokens``); ``offset``:
        what the running batch reserves (``rem_total_token_offset``); ``ratio``: the
        new-token ratio; ``one_token``: every request's output reserved as one token (a PD
        prefill); ``stale``: a test of the waiting queue's head, dropped when true (a PD
        prefill's lazily deleted entries)."""
        self.rank = rank
        alloc = rank.alloc
        self.page = alloc.page_size
        self.rem_input = rank.max_prefill - mix
        self.rem_chunk = rank.chunk_budget - mix
        self.ratio = ratio
        self.offset = offset
        self.cur_offset = mix
        self.avail = (alloc.capacity - alloc.used) * self.page
        cache = rank.cache
        self.evictable_known = cache is None or not cache.blocks
        self.states: list[tuple[float, int]] | None = None
        self.running, self.slots, self.one_token = running, slots, one_token
        self.stale = stale

    def _paged(self, n: int) -> int:
        return -(-n // self.page) * self.page

    def _evictable(self) -> bool:
        """Count the radix cache's evictable tokens in (once, when the free ones fell short:
        summing the cache costs a pass over it); True if that added any."""
        if self.evictable_known:
            return False
        self.evictable_known = True
        self.avail += self.rank.cache.pages * self.page
        return True

    def rem_total(self) -> float:
        return self.avail - self.offset

    def cur_rem(self) -> int:
        return self.avail - self.cur_offset

    def _spend(self, tokens: int, reserve: int) -> None:
        """``_update_prefill_budget``: ``tokens`` page-rounded, plus the output reserved."""
        page = self.page
        tokens = -(-tokens // page) * page  # (_paged, inline: once a request a forward)
        self.offset += tokens + reserve
        self.cur_offset += tokens
        self.rem_input -= tokens
        self.rem_chunk -= tokens

    def _state(self) -> int:
        """``budget_state``."""
        avail = self.avail
        if avail - self.offset <= 0 or avail - self.cur_offset <= 0:  # (rem_total, cur_rem)
            if not (self._evictable() and self.rem_total() > 0 and self.cur_rem() > 0):
                return NO_TOKEN
        if self.rem_input <= 0 or self.rem_chunk <= 0:
            return OTHER
        return CONTINUE

    def form(self) -> list[tuple[Request, int, bool]]:
        """The forward's chunks ``(request, tokens, first chunk of its fill)``, pages taken;
        the rank's ``chunked`` and ``batch_is_full`` updated, the waiting queue popped."""
        rank = self.rank
        running_bs = len(self.running)
        one = self.one_token
        batch: list[tuple[Request, int, bool]] = []
        chunked = rank.chunked
        if chunked is not None:
            if running_bs >= rank.max_running:  # get_num_allocatable_reqs <= 0
                rank.batch_is_full = True
                return batch
            rem = self.rem_chunk
            if rank.chunk_capped_by_memory:  # add_chunked_req: min(rem_chunk, rem_total),
                fit = int(self.rem_total())  # rem_total counting the evictable tokens (when
                if fit < rem and self._evictable():  # the free ones would cap the chunk)
                    fit = int(self.rem_total())
                if fit < rem:  # (rem_chunk if that is <= 0: "the chunked_req must be added")
                    rem = fit if fit > 0 else rem
            left = chunked.fill_target - chunked.fill_done
            n = left if left <= rem else rem
            if n <= 0 or not rank.take(chunked, n):
                return batch  # (its pages are not free: it waits)
            self._spend(n, (1 if one else _clip(chunked.output_len)) if n == left else 0)
            batch.append((chunked, n, False))
            if n == left:  # its last chunk: another request may become the chunked one
                chunked = None
        waiting, cache = rank.waiting, rank.cache
        slots, stale = self.slots, self.stale
        while waiting:
            if len(batch) >= slots:
                rank.batch_is_full = True
                break
            req = waiting[0]
            if stale is not None and stale(req):
                waiting.popleft()
                continue
            cached = 0
            if cache is not None and req.blocks:
                hit = cache.match(req.blocks) * cache.block_tokens
                most = req.fill_target - 1
                cached = most if most < hit else hit
            extend = req.fill_target - cached
            if cache is None and req.kind != "eval":  # bench_serving sends ignore_eos
                n, res = self._one_ignore_eos(req, extend, batch)
            else:
                n, res = self._one(req, extend, bool(batch))
            if n:
                req.cached_tokens, req.fill_done = cached, cached
                if not rank.take(req, n):  # (page rounding: SGLang's checks passed)
                    rank.batch_is_full = True
                    break
                waiting.popleft()
                batch.append((req, n, True))
                if n < extend:
                    if chunked is not None:  # (it would be in no queue: never to finish)
                        raise AssertionError(
                            f"{rank.name}/r{rank.index}: request {req.rid} truncated while "
                            f"request {chunked.rid} is still being chunked")
                    rank.chunked = chunked = req
            if res != CONTINUE:
                if res == NO_TOKEN:
                    rank.batch_is_full = True
                break
        return batch

    def _one(self, req: Request, extend: int, others: bool) -> tuple[int, int]:
        """``add_one_req``: (tokens admitted, 0 if none; the budget state)."""
        one = self.one_token
        total = extend + (1 if one else _clip(max(req.output_len - req.generated, 0)))
        if total >= self.rem_total() and not (self._evictable() and total < self.rem_total()):
            return 0, NO_TOKEN
        paged = self._paged(extend)
        if paged >= self.rem_input and others:
            return 0, OTHER
        if paged <= self.rem_chunk:
            self._spend(extend, 1 if one else _clip(req.output_len))
            return extend, self._state()
        page = self.page
        if self.rank.page_aligned_chunk:
            trunc = self.rem_chunk // page * page
        else:
            trunc = self.rem_chunk - page + 1
        if trunc <= 0:
            return 0, OTHER
        self._spend(trunc, 0)
        return trunc, self._state()

    def _one_ignore_eos(self, req: Request, extend: int,
                        batch: list[tuple[Request, int, bool]]) -> tuple[int, int]:
        """``add_one_req_ignore_eos`` (radix cache off, an ``ignore_eos`` request): admitted
        only if every request, finishing shortest-first, always finds its tokens free."""
        page, avail = self.page, self.avail
        paged = -(-extend // page) * page
        cur, tot = avail - self.cur_offset, avail - self.offset  # (cur_rem, rem_total)
        if paged > (cur if cur < tot else tot):
            return 0, NO_TOKEN
        one = self.one_token
        if one:  # a PD prefill: every request (this one, those admitted) has one token left
            # and none running, so the first state of the walk below binds: the free tokens
            # less this prompt must exceed 2 tokens a request
            if cur - paged <= (IGNORE_EOS_RESERVE_TOKENS + 1) * (len(batch) + 1):
                return 0, NO_TOKEN
            return self._take_whole_or_chunk(extend, 1)
        rank = self.rank
        ratio = self.ratio
        left = req.output_len - req.generated  # (ignore_eos: ratio 1)
        mine = (left, req.input_len + req.generated)
        states = self.states
        if states is None:
            states = self.states = []
            if left > 0:
                states.append(mine)
            if self.running:
                step = rank.step
                for r in self.running.values():
                    gen = r.gen_at_join + step - r.join_step
                    r_left = r.output_len * (1.0 if r.kind != "eval" else ratio) - gen
                    if r_left > 0:
                        states.append((r_left, r.input_len + gen))
            for r, _n, _first in batch:  # (admitted this forward: the chunked request)
                r_left = r.output_len * (1.0 if r.kind != "eval" else ratio) - r.generated
                if r_left > 0:
                    states.append((r_left, r.input_len + r.generated))
            states.sort(key=lambda s: s[0])
        elif left > 0:  # (SGLang's insertion: before the first not shorter, else before last)
            i = 0
            for i in range(len(states)):
                if left <= states[i][0]:
                    break
            states.insert(i, mine)
        cur -= paged
        freed = 0
        n = len(states)
        block = rank._block_tokens  # (pdsim books KV growth a block at a time: each request
        # left may have taken up to a block more than its tokens by then, so that what SGLang
        # admits this way never has to be retracted, as in SGLang)
        for i, (t_left, occupied) in enumerate(states):
            bs = n - i
            if cur + freed - (t_left + block) * bs <= IGNORE_EOS_RESERVE_TOKENS * bs:
                return 0, NO_TOKEN
            freed += occupied
        return self._take_whole_or_chunk(extend, _clip(req.output_len))

    def _take_whole_or_chunk(self, extend: int, reserve: int) -> tuple[int, int]:
        """``add_one_req_ignore_eos``'s end: the whole request if the chunk budget holds it
        (its output reserved), else ``rem_chunk`` tokens of it (none reserved)."""
        if extend <= self.rem_chunk:
            self._spend(extend, reserve)
            return extend, self._state()
        if self.rem_chunk <= 0:
            return 0, OTHER
        trunc = self.rem_chunk
        self._spend(trunc, 0)
        return trunc, self._state()

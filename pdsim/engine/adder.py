"""SGLang's ``PrefillAdder`` over a colocated rank: which waiting requests the next prefill
forward takes (python/sglang/srt/managers/schedule_policy.py ``PrefillAdder`` and scheduler.py
``Scheduler.get_new_batch_prefill``, 0.5.x; the releases' differences in
:mod:`pdsim.config.engine_version`).

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


class Adder:
    """One forward's admission on a colocated rank (``form``)."""

    __slots__ = ("rank", "page", "rem_input", "rem_chunk", "offset", "cur_offset", "avail",
                 "evictable_known", "ratio", "states")

    def __init__(self, rank: Any) -> None:
        """``rank``: a :class:`pdsim.engine.colocated.ColocatedRank` (not imported: it
        imports this module)."""
        self.rank = rank
        alloc = rank.alloc
        self.page = alloc.page_size
        mix = len(rank.running) if rank.mixed_chunk else 0
        self.rem_input = rank.max_prefill - mix
        self.rem_chunk = rank.chunk_budget - mix
        self.ratio = rank.ratio()
        self.offset = mix + rank._running_left() * self.ratio
        self.cur_offset = mix
        self.avail = (alloc.capacity - alloc.used) * self.page
        cache = rank.cache
        self.evictable_known = cache is None or not cache.blocks
        self.states: list[tuple[float, int]] | None = None

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
        tokens = self._paged(tokens)
        self.offset += tokens + reserve
        self.cur_offset += tokens
        self.rem_input -= tokens
        self.rem_chunk -= tokens

    def _state(self) -> int:
        """``budget_state``."""
        if self.rem_total() <= 0 or self.cur_rem() <= 0:
            if not (self._evictable() and self.rem_total() > 0 and self.cur_rem() > 0):
                return NO_TOKEN
        if self.rem_input <= 0 or self.rem_chunk <= 0:
            return OTHER
        return CONTINUE

    def form(self) -> list[tuple[Request, int, bool]]:
        """The forward's chunks ``(request, tokens, first chunk of its fill)``, pages taken;
        the rank's ``chunked`` and ``batch_is_full`` updated, the waiting queue popped."""
        rank = self.rank
        running_bs = len(rank.running)
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
            self._spend(n, _clip(chunked.output_len) if n == left else 0)
            batch.append((chunked, n, False))
            if n == left:  # its last chunk: another request may become the chunked one
                chunked = None
        waiting, cache = rank.waiting, rank.cache
        slots = rank.max_running - running_bs
        while waiting:
            if len(batch) >= slots:
                rank.batch_is_full = True
                break
            req = waiting[0]
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
        total = extend + _clip(max(req.output_len - req.generated, 0))
        if total >= self.rem_total() and not (self._evictable() and total < self.rem_total()):
            return 0, NO_TOKEN
        paged = self._paged(extend)
        if paged >= self.rem_input and others:
            return 0, OTHER
        if paged <= self.rem_chunk:
            self._spend(extend, _clip(req.output_len))
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
        paged = self._paged(extend)
        cur, tot = self.cur_rem(), self.rem_total()
        if paged > (cur if cur < tot else tot):
            return 0, NO_TOKEN
        rank = self.rank
        ratio = self.ratio
        left = req.output_len - req.generated  # (ignore_eos: ratio 1)
        mine = (left, req.input_len + req.generated)
        states = self.states
        if states is None:
            states = self.states = []
            if left > 0:
                states.append(mine)
            step = rank.step
            for r in rank.running.values():
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
        if extend <= self.rem_chunk:
            self._spend(extend, _clip(req.output_len))
            return extend, self._state()
        if self.rem_chunk <= 0:
            return 0, OTHER
        trunc = self.rem_chunk
        self._spend(trunc, 0)
        return trunc, self._state()

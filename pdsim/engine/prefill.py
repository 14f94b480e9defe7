"""Prefill DP rank: bootstrap queue -> waiting queue -> chunked prefill -> in-flight queue.

A request waits in the bootstrap queue until its decode rank has pre-allocated KV (the room is
bootstrapped), then in the waiting queue. Each forward takes requests FIFO as SGLang's
``PrefillAdder`` does (:mod:`pdsim.engine.adder`, the colocated rank's implementation too;
python/sglang/srt/managers/schedule_policy.py and scheduler.py, 0.5.x): the request being
chunked first, then waiting ones under the chunked-prefill budget and ``max_prefill_tokens``
(the first request of a forward is exempt from the latter; a later one it does not fit waits,
even where the chunk budget would have taken part of it), under the free and evictable tokens
less each admitted request's tokens and its one output token (a prefill server sets
``max_new_tokens = 1``), while request slots are free (``max_running_requests``, less the
requests whose KV is still held for their transfer: ``req_to_token_pool.available_size()``);
every finished chunk's KV goes to the transfer engine at once.
After its last chunk the request sits in the in-flight queue until the transfer resolves, and
then its KV is released (into the prefix cache on success). A room that fails while its prompt
is mid-prefill still has its remaining chunks computed, as SGLang does. A request the prefill
aborts itself leaves the waiting queue (its abort path removes it); one whose room the decode's
ABORT failed (0.5.13 on) leaves it from 0.5.14 (``resolve_waiting_queue_bootstrap``), and in
0.5.13 is prefilled all the same, its chunks dropped.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import simpy

from pdsim.config.fleet import PrefillConfig
from pdsim.engine.adder import NO_RUNNING, Adder
from pdsim.engine.clock import KeptDeadlines
from pdsim.engine.kv import PrefixCache
from pdsim.engine.log import EventLog
from pdsim.engine.rank import Rank
from pdsim.engine.request import DECODE, FAILED, PREFILL, SUCCESS, Request
from pdsim.engine.stats import Stats
from pdsim.engine.transfer import TransferEngine, new_chunk
from pdsim.model.predictor import Predictor


class PrefillRank(Rank):
    role = "prefill"

    def __init__(self, env: simpy.Environment, server: int, index: int, cfg: PrefillConfig,
                 predictor: Predictor, kv_bytes_per_token: int, pool_pages: int,
                 bootstrap_timeout_s: float, flush_semantics: str, log: EventLog,
                 stats: Stats, chunk_budget: int) -> None:
        super().__init__(env, server, index, cfg, predictor, pool_pages, flush_semantics, log,
                         stats)
        self.kvb = kv_bytes_per_token
        self.chunk_budget = chunk_budget  # per rank, after SGLang's DP division (fleet.py)
        # (read per forward: a pydantic model's field is ~5x slower to read than an attribute)
        self.max_running = cfg.max_running_requests or 1  # (the fleet sets it: its pool's)
        self.max_prefill = cfg.max_prefill_tokens
        # SGLang releases (pdsim.config.engine_version; set by the fleet): a truncated
        # request's chunk page-aligned (else rem_chunk - page + 1), and a continuing chunk
        # shrunk to the free memory (else it waits for the whole chunk's pages)
        self.page_aligned_chunk = True
        self.chunk_capped_by_memory = True
        # 0.5.14 on (resolve_waiting_queue_bootstrap): a room the decode's ABORT failed leaves
        # the waiting queue; before, the request is prefilled all the same (its chunks dropped)
        self.drops_failed_waiting = True
        self.bootstrap_timeout = bootstrap_timeout_s
        self.engine: TransferEngine | None = None  # wired by the fleet
        self.bootstrap: dict[int, Request] = {}
        self.waiting: deque[Request] = deque()
        self._queued: set[int] = set()
        self.chunked: Request | None = None
        self.batch: list[tuple[Request, int, bool]] = []
        self.batch_is_full = False  # (the adder's; reset at every forward: get_next_disagg_
        # prefill_batch_to_run's "HACK", so no state here)
        self.inflight: dict[int, Request] = {}
        self.cache = PrefixCache(self.alloc, cfg.prefix_block_tokens) if cfg.prefix_cache else None
        # set by the fleet when a partition may cut this server off
        # (pdsim.engine.faults.Faults.cut_state)
        self.cut_state: Callable[[], int] | None = None
        # per-request bootstrap timeouts, kept on the requests of ``bootstrap`` (in the order
        # they started) with one pending timer
        self._bootstrap_deadlines = KeptDeadlines(env, bootstrap_timeout_s, self._in_bootstrap,
                                                  self._bootstrap_timeout, "boot_at", "boot_eid",
                                                  lambda: self.bootstrap.values())
        # a prefill-side end reaches the decode only with prefill_abort_notifies_decode
        # (no release: pdsim.config.pd_paths); set by the fleet (set_paths)
        self.notify_decode = 0
        # SGLANG_REQ_WAITING_TIMEOUT on the waiting queue (0.5.20+), when set: the waiting
        # requests' deadlines, on their boot_at/boot_eid (the bootstrap's are over by then)
        self._waiting_deadlines: KeptDeadlines | None = None
        self.gone = False  # the process died (prefill_restart): nothing it held goes on

    def set_paths(self, pd: dict) -> None:
        """Take the scenario's PD paths (``Scenario.pd``)."""
        self.notify_decode = DECODE if pd["prefill_abort_notifies_decode"] else 0
        wait = pd["req_waiting_timeout_s"]
        if wait is not None:
            self._waiting_deadlines = KeptDeadlines(
                self.env, wait, lambda r: r.rid in self._queued and not r.room.resolved,
                lambda r: self.abort(r, "req_waiting_timeout"), "boot_at", "boot_eid")

    def forget_deadlines(self) -> None:
        """The run is over: forget the armed bootstrap deadline's request (the others are
        only in ``bootstrap``; ``pdsim.engine.fleet.Fleet.release``)."""
        self._bootstrap_deadlines.clear()
        if self._waiting_deadlines is not None:
            self._waiting_deadlines.clear()

    # --- arrivals and room callbacks -----------------------------------------------------

    def submit(self, req: Request) -> None:
        """POST /generate reached this rank (``pdsim.engine.server.Server.dispatch``)."""
        req.p_server, req.p_rank = self.server, self.index
        req.fill_target = req.input_len
        self.bootstrap[req.rid] = req
        self.load_tokens += req.input_len
        req.room.prefill = self  # it hears room_bootstrapped and room_done
        # (after the insertion: ``bootstrap`` is the deadlines' order)
        req.boot_at, req.boot_eid = self._bootstrap_deadlines.start(req)

    def room_bootstrapped(self, req: Request) -> None:
        """The decode pre-allocated (pdsim.engine.request.Room)."""
        if req.room.resolved or req.rid not in self.bootstrap:
            return
        if self.cut_state is not None and (cut := self.cut_state()):
            if cut == 2:  # the decodes already lost this prefill: they fail the room at once
                req.room.fail("prefill_heartbeat_lost")
            return  # the decode's transfer info is lost in the partition: keep waiting
        del self.bootstrap[req.rid]
        self.waiting.append(req)
        self._queued.add(req.rid)
        if self._waiting_deadlines is not None:
            req.boot_at, req.boot_eid = self._waiting_deadlines.start(req)
        self._kick(last=True)  # (the room's step does nothing more)

    def _in_bootstrap(self, req: Request) -> bool:
        return req.rid in self.bootstrap and not req.room.resolved

    def _bootstrap_timeout(self, req: Request) -> None:
        """SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT: the sender, still Bootstrapping, fails
        (HTTP 500 on the prefill leg); its decode peer is not told (no release sends it)."""
        req.room.fail("bootstrap_timeout", PREFILL | self.notify_decode)

    def abort(self, req: Request, reason: str) -> None:
        """End this rank's copy of ``req`` (the router dropped the prefill leg, or a prefill
        waiting timeout): SGLang's AbortReq -> ``disagg_kv_sender.abort()``, which marks the
        room Failed so the transfer worker skips its chunks, and tells the decode nothing
        (every release to 0.5.23) unless prefill_abort_notifies_decode. A request mid-forward
        still has its remaining chunks computed (``room_done``)."""
        req.room.fail(reason, PREFILL | self.notify_decode)

    def _prefilling(self, req: Request) -> bool:
        if req is self.chunked:
            return True
        for r, _n, _f in self.batch:  # (a loop: any() over a generator makes two objects)
            if r is req:
                return True
        return False

    def _kept(self, req: Request) -> bool:
        """A failed room's request this prefill still prefills from its waiting queue: the
        decode's ABORT failed it (``Room.by_peer``) and the release does not drop such rooms
        from the waiting queue (before 0.5.14)."""
        return req.room.by_peer and not self.drops_failed_waiting and req.rid in self._queued

    def room_done(self, req: Request) -> None:
        """The room resolved (pdsim.engine.request.Room)."""
        if req.room.state == FAILED and (self._prefilling(req) or self._kept(req)):
            # SGLang does not stop a failed room's prefill: the scheduler keeps scheduling the
            # chunked request (disaggregation/prefill.py process_prefill_chunk and
            # process_batch_result_disagg_prefill never poll its sender), the transfer engine
            # drops its chunks (mooncake/conn.py add_transfer_request: "already failed"), and
            # only after its last chunk does the in-flight poll see Failed and free its KV.
            return  # commit_step releases it after the last chunk
        self._release(req, last=True)  # (the room's done step does nothing more after it)

    def _release(self, req: Request, last: bool = False) -> None:
        """Free the request's pages and forget it, once: the rank stops listening to its room.
        (A room that fails in the instant its last chunk commits is released by
        ``commit_step``, and its done step, already pending, would release it again.)
        ``last``: its step does nothing more."""
        req.room.prefill = None  # no room_done after this (pdsim.request.Room._done)
        rid = req.rid
        self.bootstrap.pop(rid, None)
        self._queued.discard(rid)
        self.inflight.pop(rid, None)
        if self.chunked is req:
            self.chunked = None
        self.alloc.release(req.p_pages)
        if req.room.state == SUCCESS and self.cache is not None and req.blocks:
            self.cache.insert(req.blocks)
        self.load_tokens -= req.input_len
        leg = req.p_leg
        if leg is not None:  # the router listens to the prefill leg's answer
            req.p_leg = None
            leg.prefill_ended(req)
        # freed pages may unblock a forward
        self._kick(last and not self._idle_waiters)
        if self._idle_waiters:
            self._maybe_idle()

    # --- the scheduler loop --------------------------------------------------------------

    def take(self, req: Request, n: int) -> bool:
        """Allocate pages for ``n`` more tokens of ``req``'s prefill (cached blocks evicted
        for them if need be); False if they are not free."""
        alloc = self.alloc
        need = -(-n // alloc.page_size)  # alloc.pages_for(n)
        if alloc.capacity - alloc.used < need and self.cache is not None:
            self.cache.evict(need)
        pages = req.p_pages
        if pages is None:  # its first chunk (an empty holding grown by ``need`` is the same)
            req.p_pages = alloc.alloc(need)
            return req.p_pages is not None
        return alloc.grow(pages, need)

    def _stale(self, req: Request) -> bool:
        """A waiting-queue entry no longer waiting (its room resolved, or it left): dropped
        when it reaches the head (unless ``_kept``)."""
        return (req.room.resolved and not self._kept(req)) or req.rid not in self._queued

    def _form_batch(self) -> list[tuple[Request, int, bool]]:
        """The next forward's chunks: SGLang's ``PrefillAdder`` (:mod:`pdsim.engine.adder`,
        the colocated rank's too) with no running batch and one output token reserved per
        request (``_process_req`` sets ``max_new_tokens = 1``). Request slots: those
        ``req_to_token_pool`` has left, less the requests whose KV awaits its transfer and
        the request being chunked (which counts again in the forward, as in SGLang)."""
        slots = self.max_running - len(self.inflight) - (self.chunked is not None)
        batch = Adder(self, NO_RUNNING, slots, 0, 0.0, 1.0, True, self._stale).form()
        queued = self._queued
        for req, _n, first in batch:
            if first:  # (taken from the waiting queue)
                queued.discard(req.rid)
        return batch

    def plan_step(self) -> tuple | None:
        """Form the next forward: (new tokens, sum len*(len+prefix), causal attention pairs,
        requests, prefix tokens attended), or None."""
        if self.chunked is None and not self.waiting:  # (_form_batch would find nothing)
            return None
        batch = self._form_batch()
        if not batch:
            return None
        tokens = 0
        sq = pairs = 0.0
        prefix = 0
        now = self.env._now
        for req, n, first in batch:
            if first:  # taken from the waiting queue: its first chunk
                req.t_prefill_start = now
            ctx = req.cached_tokens + req.prefill_tokens
            tokens += n
            sq += n * (n + ctx)
            pairs += n * ctx + n * (n + 1) / 2
            prefix += ctx
        self.batch = batch
        self.stats.prefill_steps += 1
        return tokens, sq, pairs, len(batch), prefix

    def step_time(self, plan: tuple) -> float:
        return self.predictor.prefill(*plan)

    @staticmethod
    def combine(plans: list[tuple], n_ranks: int) -> tuple:
        """Gathered MoE tokens at the mean over the ranks, attention at the slowest rank."""
        p = plans[0]
        total = tokens = p[0]
        sq, pairs, reqs, prefix = p[1], p[2], p[3], p[4]
        for p in plans[1:]:  # (one pass: the same sum, in order, and the same maxima)
            t = p[0]
            total += t
            if t > tokens:
                tokens = t
            if p[1] > sq:
                sq = p[1]
            if p[2] > pairs:
                pairs = p[2]
            if p[3] > reqs:
                reqs = p[3]
            if p[4] > prefix:
                prefix = p[4]
        return total / n_ranks, sq, pairs, reqs, prefix, tokens

    def commit_step(self, plan: tuple) -> None:
        """The forward finished: hand each chunk's KV to the transfer engine."""
        env = self.env
        batch, self.batch = self.batch, []
        self.stats.prefill_tokens += plan[0]
        for req, n, first in batch:
            req.prefill_tokens = done = req.prefill_tokens + n
            req.fill_done += n
            last = done >= req.input_len - req.cached_tokens
            if last:
                if self.chunked is req:
                    self.chunked = None
                req.t_prefill_end = env._now
            if req.room.resolved:  # failed mid-prefill: nothing is sent; freed after the last
                if last:
                    self._release(req)
                continue
            if last:
                self.inflight[req.rid] = req
            sent = n + (req.cached_tokens if first else 0)
            self.engine.submit(new_chunk(req, req.room, sent * self.kvb, last))
        self._maybe_idle()

    # --- flush -----------------------------------------------------------------------------

    def is_fully_idle(self) -> bool:
        return not (self.bootstrap or self._queued or self.chunked or self.batch
                    or self.inflight)

    def queued(self) -> int:
        """Requests the prefill has not started: bootstrapping or waiting for a batch (the
        time series' ``prefill_queue``)."""
        return len(self.bootstrap) + len(self._queued)

    def busy_summary(self) -> str:
        return (f"bootstrap={len(self.bootstrap)} waiting={len(self._queued)} "
                f"chunked={int(self.chunked is not None)} forward={len(self.batch)} "
                f"inflight={len(self.inflight)}")

    def holders(self) -> list[Request]:
        """Requests whose source KV pages are live under an unresolved transfer."""
        reqs = {r.rid: r for r in self.inflight.values()}
        for req, _n, _f in self.batch:
            reqs[req.rid] = req
        if self.chunked is not None:
            reqs[self.chunked.rid] = self.chunked
        return [r for r in reqs.values() if not r.room.resolved]

    def flush_now(self, how: str) -> None:
        """Free every page: transfers still reading this rank's pages fail (every
        ``flush.dooms`` choice includes the source side). Waiting and bootstrapping requests
        hold no pages yet and are untouched."""
        doomed = 0
        for req in self.holders():
            if not req.room.doomed:
                req.room.doomed = f"{self.name}/r{self.index}"
                doomed += 1
                self.log("flush_doomed", self.name, self.index, req.rid, req.room.id,
                         req.room.session, detail="source pages freed")
        self.log("flush_executed", self.name, self.index, value=doomed,
                 detail=f"{how}; {self.flush_state()}")
        self.alloc.reset()
        if self.cache is not None:
            self.cache.reset()
        self.stats.flushes_executed += 1

    # --- process death and restart (pdsim.engine.peers' prefill_restart fault) -----------------

    def crash(self) -> list[Request]:
        """The process died: every request it held ends on this side ("prefill_restarted"),
        its decode peers not told (nothing is sent by a dead process), its KV and prefix cache
        gone. Returns those requests (their prefill legs broke: the router hears)."""
        self.halt()
        self.gone = True
        held = [*self.bootstrap.values(), *(r for r in self.waiting if r.rid in self._queued),
                *self.inflight.values()]
        for req, _n, _f in self.batch:
            held.append(req)
        if self.chunked is not None:
            held.append(self.chunked)
        seen: set[int] = set()
        lost = [r for r in held if not (r.rid in seen or seen.add(r.rid))]
        # no forward goes on: what it was computing is gone with the process
        self.batch = []
        self.chunked = None
        for req in lost:  # (room_done releases it; one already failed, mid-prefill, now)
            if not req.room.fail("prefill_restarted", PREFILL):
                self._release(req)
        self.alloc.reset()
        if self.cache is not None:
            self.cache.reset()
        bl = self.engine.blacklist  # a new process's transfer engine has no failed sessions
        for session in list(bl.entries):
            bl.clear(session, "prefill restarted")
        self.log("prefill_crash", self.name, self.index, value=len(lost))
        return lost

    def restart(self) -> None:
        """A new process serves again, behind the same address."""
        self.gone = False
        self.resume()
        self.log("prefill_restart", self.name, self.index)

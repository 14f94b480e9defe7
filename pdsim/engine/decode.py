"""Decode DP rank: pre-allocation -> transfer queue -> waiting queue -> running batch.

Pre-allocation reserves KV pages for the prompt (waiting while the pool is full) and then
bootstraps the room, so the prefill may run. The request waits in the transfer queue for its KV,
then joins the continuous batch. One simulated event per batch step: tokens are counted lazily
from the rank's step counter, and page growth and completions come off a sorted list and a
heap keyed by step.
Under memory pressure the rank retracts requests (fewest generated tokens first, as SGLang's
``retract_decode``). A PD decode server does not recompute a retracted request: SGLang copies
its KV to host memory (``Req.offload_kv_cache``) and loads it back when the request resumes
(``DecodePreallocQueue.resume_retracted_reqs``, ``Req.load_kv_cache``;
python/sglang/srt/managers/schedule_batch.py and disaggregation/decode.py, 0.5.x). The copies'
PCIe time is not modelled: a resumed request rejoins the batch at no cost.

Admission follows SGLang's reserve gate (``DecodePreallocQueue._allocatable_tokens``): every
request running, transferring or waiting to run holds ``num_reserved_decode_tokens`` of
headroom in the bookkeeping, a request is pre-allocated (its prompt's pages) only while the
free tokens beyond those reserves cover its prompt and its own reserve, retracted requests
resume first under the same rule, and nothing new is pre-allocated while any is retracted.

This module holds the rank and its arrival side (pre-allocation, the transfer queue, crashes and
flushes); the running batch, retraction and spans of steps are its base class,
:class:`pdsim.engine.decode_batch.RunningBatch`.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

import simpy

from pdsim.config.fleet import DecodeConfig
from pdsim.config.pd_paths import ARMED_REASONS as ARMED
from pdsim.engine.clock import KeptDeadlines, call_later
from pdsim.engine.decode_batch import CLIP_MAX_NEW_TOKENS, GROWTH_TOKENS, RunningBatch
from pdsim.engine.log import EventLog
from pdsim.engine.request import (
    BY_PEER,
    DECODE,
    FAILED,
    PREFILL,
    SUCCESS,
    WAITING_FOR_INPUT,
    Request,
    end,
)
from pdsim.engine.stats import Stats
from pdsim.model.predictor import Predictor


class DecodeRank(RunningBatch):
    role = "decode"
    SPANS = True
    __slots__ = ("flush_dooms", "max_running", "slots", "reserve_tokens", "waiting_timeout", "port",
                 "session", "alive", "on_waiting_timeout", "prealloc", "transfer", "waiting",
                 "retracted", "running", "step", "ctx_sum", "_finish", "_grow", "_seq",
                 "growth_pages", "_block_tokens", "_lag", "_late", "bootstrap_s",
                 "tokenize_s_per_token", "_dropped", "_epoch", "_planned", "_waiting_deadlines",
                 "_needs", "retract_20_steps", "pd", "notify_prefill", "gate", "peers", "dead")

    def __init__(self, env: simpy.Environment, server: int, index: int, cfg: DecodeConfig,
                 predictor: Predictor, pool_pages: int, waiting_timeout_s: float, port: int,
                 flush_semantics: str, log: EventLog, stats: Stats,
                 flush_dooms: str = "source_and_destination") -> None:
        super().__init__(env, server, index, cfg, predictor, pool_pages, flush_semantics, log,
                         stats)
        self.flush_dooms = flush_dooms  # scenario flush.dooms: which destinations a flush fails
        # (cfg fields as plain attributes, read from here only: a pydantic model's are slow to
        # read per request; nothing changes them during a run)
        self.max_running = cfg.max_running_requests or 1  # (the fleet sets it: its pool's)
        # request slots (req_to_token_pool: max_running_requests + pre_alloc_size) that
        # pre-allocated, transferring, waiting and running requests share; set by the fleet
        self.slots = self.max_running + cfg.extra_slots(self.max_running)
        self.reserve_tokens = cfg.num_reserved_decode_tokens
        # what a running request needs to finish alone, as a max-heap of (-(prompt +
        # min(output, 4096)), seq, version, request): the gate's need_space_for_single_req
        self._needs: list[tuple[int, int, int, Request]] = []
        # SGLang before 0.5.2 retracts until 20 decode steps per remaining request fit
        # (pdsim.config.engine_version); set by the fleet
        self.retract_20_steps = False
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
        # SGLang's PD paths as the scenario's release runs them (pdsim.config.pd_paths; the
        # fleet sets ``pd``), and what this rank reads of them per request
        self.pd: dict = {}
        self.notify_prefill = PREFILL | BY_PEER  # decode_abort_notifies_prefill: ABORT sent
        self.gate = True  # metadata_gate: a room whose aux never landed stays Transferring
        self.peers = None  # the decode's connections to prefills (pdsim.engine.peers), if kept
        self.dead = 0  # slots held now by rooms that cannot complete (dead rooms)

    def set_paths(self, pd: dict) -> None:
        """Take the scenario's PD paths (``Scenario.pd``)."""
        self.pd = pd
        self.notify_prefill = PREFILL | BY_PEER if pd["decode_abort_notifies_prefill"] else 0
        self.gate = pd["metadata_gate"]

    def forget_deadlines(self) -> None:
        """The run is over: forget the armed waiting deadline's request (the others are only
        in ``transfer``; ``pdsim.engine.fleet.Fleet.release``), and the gate's heap."""
        self._waiting_deadlines.clear()
        self._needs.clear()

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

    def _allocatable(self, retractable: int) -> int:
        """SGLang's ``DecodePreallocQueue._allocatable_tokens`` as ``pop_preallocated`` asks
        it: the free tokens beyond a reserve of ``num_reserved_decode_tokens`` per request
        running, transferring or waiting, or, if larger, what the running request that needs
        most would need to finish with every other one retracted (``need_space_for_single_req``;
        ``retractable``: the running requests' tokens). (SGLang also subtracts what retracted
        requests need back, ``count_retracted``; but ``pop_preallocated`` runs only when none is
        retracted, ``process_decode_queue``, so that term is always 0 there: pdsim keeps the one
        rule that acts, ``_try_prealloc``'s.)"""
        alloc = self.alloc
        hold = self.reserve_tokens * (len(self.running) + len(self.transfer) + len(self.waiting))
        if self.running:
            needs = self._needs
            while needs[0][2] != needs[0][3].version:  # (left the batch since)
                heapq.heappop(needs)
            single = -needs[0][0] - retractable
            if single > hold:
                hold = single
        return (alloc.capacity - alloc.used) * alloc.page_size - hold

    def _join(self, req: Request) -> None:
        super()._join(req)
        out = req.output_len
        needs = self._needs
        heapq.heappush(needs, (-(req.input_len + (out if out < CLIP_MAX_NEW_TOKENS
                                                  else CLIP_MAX_NEW_TOKENS)),
                               self._seq, req.version, req))
        if len(needs) > 2 * len(self.running) + 64:  # entries of requests that left, dropped
            self._needs = [e for e in needs if e[2] == e[3].version]
            heapq.heapify(self._needs)

    def _try_prealloc(self) -> None:
        """Pre-allocate the queue's head requests, FIFO, while the gate admits them
        (``DecodePreallocQueue.pop_preallocated``; none while a request is retracted:
        ``process_decode_queue``). A request takes its prompt's pages; the gate's reserve is
        bookkeeping."""
        prealloc = self.prealloc
        if not prealloc or self.halted or self.retracted:  # (pre-allocation runs in the
            return  # scheduler loop; retracted requests resume before new ones come in)
        alloc, transfer, limit = self.alloc, self.transfer, self.slots
        reserve = self.reserve_tokens
        allocatable = retractable = -1
        while prealloc:
            req = prealloc[0]
            room = req.room
            if room.d_resolved:
                prealloc.popleft()
                continue
            if (len(transfer) + len(self.waiting) + len(self.running)) >= limit:  # slots
                return
            if allocatable == -1:  # (the running batch is caught up: callers' _catch_up)
                retractable = self.ctx_sum
                allocatable = self._allocatable(retractable)
            n_in = req.input_len
            out = req.output_len
            need = n_in + reserve
            single = n_in + (out if out < CLIP_MAX_NEW_TOKENS else CLIP_MAX_NEW_TOKENS) \
                - retractable
            if (need if need > single else single) > allocatable:
                return
            pages = alloc.alloc(alloc.pages_for(n_in))
            if pages is None:
                return
            allocatable -= need
            prealloc.popleft()
            req.d_pages = pages
            req.cap_tokens = pages.n * alloc.page_size
            transfer[req.rid] = req
            room.d_state = WAITING_FOR_INPUT
            if self.peers is not None:  # its metadata may go to a stale prefill connection
                self.peers.send_metadata(self, req)
            if room.resolved or room.stale:  # its prefill ended, or will never hear of it
                self._dead(req, room.stale or f"prefill {room.reason}, decode not told")
            delay = self.bootstrap_s + self.tokenize_s_per_token * req.input_len
            if delay > 0:  # the handshake (and tokenization) before the prefill may run
                room.start_bootstrap(delay)
            else:
                room.bootstrap()
            # (``transfer`` holds it: its order is the deadlines')
            req.wait_at, req.wait_eid = self._waiting_deadlines.start(req)

    def _in_transfer(self, req: Request) -> bool:
        """Its waiting timeout still counts: it waits for its KV (WaitingForInput), or, under
        PR #31800's fix, it is held in Transferring by the metadata gate."""
        room = req.room
        return req.rid in self.transfer and (
            not room.d_resolved or (room.d_state == SUCCESS and room.aux_lost and self.gate
                                    and self.pd["waiting_timeout_in_transferring"]))

    def _waiting_timeout(self, req: Request) -> None:
        """(KeptDeadlines calls it only while the request still waits for its KV.) SGLang's
        ``_check_waiting_timeout``: the receiver fails the room and, from 0.5.13, sends ABORT
        to its prefill ranks (a room the prefill already concluded ignores it)."""
        room = req.room
        if room.d_resolved:  # held in Transferring (waiting_timeout_in_transferring)
            room.d_state, room.d_reason = FAILED, "waiting_timeout_transferring"
            room._notify(DECODE)
        else:
            room.fail("waiting_timeout", DECODE | self.notify_prefill)
        # the cached connection is invalidated; the decode re-registers with the prefill
        if (self.on_waiting_timeout is not None
                and self.pd.get("waiting_timeout_invalidates_peer_cache", True)):
            self.on_waiting_timeout(self.session, req)

    def peer_ended(self, req: Request) -> None:
        """The room's prefill side concluded and this side was not told (a bootstrap timeout
        or abort not notified, a lost done signal): its slot, if held, is held by a dead room
        until this side's own timeout (pdsim.engine.request.Room.fail)."""
        if req.rid in self.transfer and not req.room.d_resolved:
            room = req.room
            why = ("done signal lost" if room.state == SUCCESS
                   else f"prefill {room.reason}, decode not told")
            self._dead(req, why)

    def _dead(self, req: Request, why: str) -> None:
        """Its slot is now held by a room that cannot complete (logged; the time series and
        plots count these slots)."""
        if req.dead_at != req.dead_at:  # (NaN: not yet)
            req.dead_at = self.env._now
            self.dead += 1
            self.stats.dead_rooms += 1
            self.log("dead_room", self.name, self.index, req.rid, req.room.id, self.session,
                     value=self.dead, detail=why)

    def _undead(self, req: Request, how: str) -> None:
        """A dead room's slot is free again."""
        if req.dead_at == req.dead_at:
            self.dead -= 1
            self.log("dead_room_freed", self.name, self.index, req.rid, req.room.id,
                     self.session, value=self.env._now - req.dead_at, detail=how)
            req.dead_at = float("inf")  # (freed: not NaN, so never counted again)

    def room_done(self, req: Request) -> None:
        """The room resolved (pdsim.engine.request.Room)."""
        if self._dropped and req.rid in self._dropped:
            self._dropped.discard(req.rid)
            return
        room = req.room
        if room.d_state == SUCCESS and room.aux_lost and self.gate:
            # the KV is here but its metadata row never landed: SGLang's metadata gate keeps
            # the poll at Transferring, and only PR #31800 would time it out
            self._dead(req, "KV done but its metadata never landed (held in Transferring)")
            return
        if (room.d_state == SUCCESS and (len(self.running) < self.max_running or self.halted)
                and self.transfer.pop(req.rid, None) is not None):
            # (the usual case) its KV arrived and the rank's next plan admits it (span_steps'
            # first rule, which reads nothing the steps ended since change): the step in
            # flight becomes the span's last with no catch-up (the span's end commits them)
            self._arrived(req)
            self._changed_next()
            return
        self._catch_up()
        if room.d_state != SUCCESS:
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
        """Its room failed: answer the client (500, or 200 with an abort chunk when
        streaming) and free its KV and slot, or, after an abort this side sent with deferred
        release on (0.5.21+), hold them until the prefill's ABORT_ACK."""
        reason = req.room.d_reason
        if (reason in ARMED and self.pd.get("deferred_decode_kv_release")
                and req.rid in self.transfer and self._ack_later(req)):
            self._respond(req, "failed", reason)
            return
        self.transfer.pop(req.rid, None)
        if req.d_pages is not None and not req.d_pages.freed:
            self.alloc.release(req.d_pages)
        self.load_tokens -= req.input_len + req.output_len
        if req.dead_at == req.dead_at:
            self._undead(req, reason)
        self._respond(req, "failed", reason)
        self._try_prealloc()
        self._kick()  # freed pages may let a retracted request back in
        self._maybe_idle()

    def _ack_later(self, req: Request) -> bool:
        """Deferred release (PR #35049): whether the ABORT_ACK comes later (then the slot and
        pages are held until it does, or until the timeout). The prefill answers at once unless
        it is writing the room's KV: then after the write (PR #40645, ack_after_drain) or
        never (the ACK target was dropped: the timeout); an ABORT it never gets (not sent
        before 0.5.13, a stale connection, a prefill that is gone) is never answered."""
        room = req.room
        prefill = room.prefill
        if not self.notify_prefill or room.stale or prefill is None or prefill.gone:
            after_write = False
        elif prefill.engine.writing_room(room):
            after_write = self.pd["ack_after_drain"]
        else:
            return False  # ACK at once: freed now, as without deferral
        self._dead(req, "deferred release: waiting for ABORT_ACK")
        release = self._release_held
        if after_write:
            room.ack = lambda: release(req, "ABORT_ACK after the write drained")
        call_later(self.env, self.pd["deferred_release_timeout_s"],
                   lambda: release(req, "deferred release timed out"))
        return True

    def _release_held(self, req: Request, how: str) -> None:
        """A held slot and its pages are freed (ABORT_ACK, or the deferred release's timeout)."""
        if self.transfer.get(req.rid) is not req:  # freed already (or a crash dropped it)
            return
        self._catch_up()
        del self.transfer[req.rid]
        req.room.ack = None
        if req.d_pages is not None and not req.d_pages.freed:
            self.alloc.release(req.d_pages)
        self.load_tokens -= req.input_len + req.output_len
        self._undead(req, how)
        self._try_prealloc()
        self._kick()
        self._maybe_idle()
        self._changed()

    def _respond(self, req: Request, status: str, reason: str = "",
                 http_status: int | None = None) -> None:
        """Answer ``req`` (its end, :func:`pdsim.engine.request.end`), unless it already
        ended (the router timed it out, maybe in this same instant): one request, one end."""
        if http_status is None:
            http_status = 200 if status == "completed" or req.stream else 500
        if not end(req, status, reason, http_status, self.env._now, self.stats):
            return
        answer = req.on_response
        if answer is not None:  # the router learns of it once
            req.on_response = None
            answer.responded()

    # --- crash and restart (pdsim.engine.faults) --------------------------------------------

    def refuse(self, req: Request, reason: str = "decode_unavailable") -> None:
        """The router's POST never reaches the scheduler (the server is down, or the leg
        failed at transport level): the router sees a 502 at once (what it does with it is
        its dispatch's: pdsim.engine.router)."""
        self._respond(req, "failed", reason, http_status=502)

    def crash(self) -> None:
        """The process died: every request it held sees its connection break (HTTP 502), its
        KV and queues are gone. Their rooms stay open at the prefill, which learns of the crash
        only when its next write to this session fails."""
        self.halt()
        self._epoch += 1
        held = [*self.prealloc, *self.transfer.values(), *self.waiting,
                *self.running.values(), *self.retracted]
        for req in held:
            if not req.room.d_resolved:
                self._dropped.add(req.rid)
            if req.dead_at == req.dead_at:
                self._undead(req, "decode crashed")
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
        self._needs.clear()
        self.ctx_sum = 0
        self.load_tokens = 0
        self.alloc.reset()
        self.log("decode_crash", self.name, self.index, peer=self.session, value=len(held))

    def resume(self) -> bool:
        """Out of a stall: pre-allocate what queued meanwhile, then step again. Only when
        it resumed: a rank still held, or stepping, takes no pages here (a hang ending after
        another had resumed it pre-allocated mid-span without a catch-up or a change, and a
        growth of the span's quiet steps found its pages gone: AssertionError)."""
        if not super().resume():
            return False
        self._try_prealloc()
        return True

    def restart(self) -> None:
        """Serving again (the fleet gave it a new session first)."""
        self.resume()
        self.log("decode_restart", self.name, self.index, peer=self.session)

    # --- flush -----------------------------------------------------------------------------

    def is_fully_idle(self) -> bool:
        return not (self.running or self.waiting or self.transfer or self.retracted
                    or any(not r.room.d_resolved for r in self.prealloc))

    def busy_summary(self) -> str:
        """Its queues' lengths (a pre-allocation whose room failed waits only to be dropped:
        not counted, as ``is_fully_idle`` does not)."""
        prealloc = sum(not r.room.d_resolved for r in self.prealloc)
        return (f"prealloc={prealloc} transfer={len(self.transfer)} "
                f"waiting={len(self.waiting)} running={len(self.running)} "
                f"retracted={len(self.retracted)}")

    def unfit(self) -> tuple[int, int]:
        """How many requests the whole KV pool could never take, and the most tokens one of
        them needs: a run stalled on them says so (``pdsim.engine.sim``). Retracted requests
        (``_admit`` resumes one when its context and its reserve fit in the free tokens) and
        requests waiting to pre-allocate (``_try_prealloc``'s gate: the prompt and the larger
        of its reserve and its output clipped to 4,096 tokens; FIFO, so one such request at
        the head holds back the queue behind it for ever, as SGLang's
        ``pop_preallocated``)."""
        alloc, reserve = self.alloc, self.reserve_tokens
        pool = alloc.capacity * alloc.page_size
        need = [alloc.pages_for(r.input_len + r.generated) * alloc.page_size + reserve
                for r in self.retracted]
        need += [max(alloc.pages_for(r.input_len) * alloc.page_size,
                     r.input_len + max(reserve, min(r.output_len, CLIP_MAX_NEW_TOKENS)))
                 for r in self.prealloc if not r.room.d_resolved]
        big = [n for n in need if n > pool]
        return len(big), max(big, default=0)

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

"""A request and its PD transfer room (the bootstrap room both sides poll)."""

from __future__ import annotations

import math
from collections.abc import Callable
from enum import IntEnum
from typing import Protocol

import simpy

from pdsim.engine.stats import Stats

NAN = float("nan")


class Poll(IntEnum):
    """Mooncake/SGLang KV poll states; ranks combine by minimum and Failed is terminal."""

    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4


# The members again as module names for the per-request path: reading a member through its
# enum class (``Poll.Success``) is a metaclass look-up, ~5x a global's (CPython 3.11).
FAILED, BOOTSTRAPPING, WAITING_FOR_INPUT, TRANSFERRING, SUCCESS = Poll

# The sides of a room a conclusion reaches (``Room.fail``, ``Room.succeed``): a bit each.
PREFILL, DECODE, BOTH = 1, 2, 3
# (with PREFILL in a failure's sides: the prefill side concluded by the decode's ABORT message,
# not by the prefill's own scheduler; a prefill before 0.5.14 leaves such a request in its
# waiting queue, to be prefilled: Room.by_peer)
BY_PEER = 4


class Responder(Protocol):
    """Who hears that the decode answered a request (pdsim.engine.router's call)."""

    def responded(self) -> None: ...


class Listener(Protocol):
    """A rank that hears of a room's steps (pdsim.engine.prefill.PrefillRank,
    pdsim.engine.decode.DecodeRank)."""

    def room_bootstrapped(self, req: Request) -> None: ...

    def room_done(self, req: Request) -> None: ...

    def peer_ended(self, req: Request) -> None:
        """(The decode) the room's prefill side concluded without telling this side."""


class Room:
    """The transfer session of one request between its prefill rank and its decode rank.

    **Two sides.** As in SGLang, where prefill and decode each keep their own
    ``request_status[room]`` and sender or receiver object and learn of each other only through
    messages (docs/pd_paths.md, "Two state machines"), a room has a prefill side (``state``,
    ``resolved``, ``reason``: the KV sender and its transfer worker, which the transfer engine
    reads) and a decode side (``d_state``, ``d_resolved``, ``d_reason``: the KV receiver). A
    conclusion names the sides it reaches (``sides``, a bitmask of :data:`PREFILL` and
    :data:`DECODE`): the transfer worker's Success or Failed (``ret != 0``, a blacklisted
    pair) reaches both, as its status message does (P->D, every release); a prefill bootstrap
    timeout or abort reaches the decode only when the release sends it
    (``prefill_abort_notifies_decode``, no release does), a decode waiting timeout or abort
    reaches the prefill as ABORT from 0.5.13 (``decode_abort_notifies_prefill``); the router
    dropping both legs (its timeout, a client disconnect) ends each side's own copy. A message
    is delivered in the step it is sent (ZMQ, sub-millisecond: as the shared room of earlier
    pdsim versions was), so a message that only updates state costs no event.

    Both ranks hear of its events one zero-delay step after they happen, after anything else
    already due in that instant (a flush arriving with the dispatch, a time-series sample at a
    timeout's instant): where the SimPy events ``bootstrapped`` and ``done`` it replaces were
    processed. The room is itself the plain heap entry (``pdsim.engine.clock.Environment.link``) of
    those steps, and of the decode's bootstrap delay (``start_bootstrap``): no event objects.
    A conclusion made while the room's own done step is pending gets a step of its own
    (:class:`_SideDone`), after it.

    Who hears: the ranks the request was dispatched to, each setting itself as ``decode`` or
    ``prefill`` in its ``submit`` (rank objects, not bound methods in a list: a room costs no
    allocation per listener). ``room_done(req)`` goes to the decode first, then the prefill,
    the order in which the router dispatches (and the order their callbacks were added in).

    The room's entries never overlap in a way ``tick`` cannot tell apart: a bootstrap delay's
    timer, when pending, is what ticks at its own instant (its id was drawn before any link
    of this instant's); the bootstrapped link is made only while the room is unresolved, so it
    comes before the done link when both are pending.

    Made by :func:`new_room` (no Python ``__init__``: see ``pdsim.engine.transfer.Chunk``).
    """

    __slots__ = ("id", "state", "resolved", "session", "port", "doomed", "reason", "env",
                 "req", "booted", "decode", "prefill", "_boot_link", "_boot_at", "d_state",
                 "d_resolved", "d_reason", "_pend", "aux_lost", "stale", "ack", "by_peer")
    # (the fields, as new_room sets them)
    id: int
    env: simpy.Environment
    req: Request | None  # what the listeners are called with
    state: Poll  # the prefill side's (sender's) state
    resolved: bool  # the prefill side is Failed or Success (terminal; succeed() and fail())
    d_state: Poll  # the decode side's (receiver's): WaitingForInput once pre-allocated
    d_resolved: bool  # the decode side is Failed or Success (terminal)
    d_reason: str
    _pend: int  # sides the room's own pending done step delivers to (0: none pending)
    aux_lost: bool  # its metadata (aux) write never lands (the lost_done fault)
    stale: str  # its metadata went to a stale prefill connection (why), '' if not
    ack: Callable[[], None] | None  # the decode's held release, when ABORT_ACK waits for a write
    booted: bool  # bootstrapped signalled: decode pre-allocated, prefill may run
    # the listening ranks: the prefill hears room_bootstrapped(req), both room_done(req)
    decode: Listener | None
    prefill: Listener | None
    _boot_link: bool  # the bootstrapped step is pending
    _boot_at: float  # when a pending bootstrap delay ends (-1: none pending)
    session: str  # decode session id host:port
    port: int
    doomed: str  # set when a flush freed pages under this transfer
    reason: str
    by_peer: bool  # the prefill side failed on the decode's ABORT (BY_PEER)

    def bootstrap(self) -> None:
        """The decode holds KV pages for it: the prefill hears one zero-delay step later. A
        prefill side already concluded (or a lost metadata send) hears nothing: the metadata
        is stored for a room no one polls."""
        self.booted = True
        if self.resolved or self.stale:
            return
        self._boot_link = True
        self.env.link(self)

    def start_bootstrap(self, delay: float) -> None:
        """Bootstrap after ``delay`` s (the handshake), unless the room resolves first."""
        self._boot_at = self.env._now + delay
        self.env.timer(delay, self)

    def tick(self) -> None:
        """One of the room's steps (see the class docstring for which)."""
        env = self.env
        now = env._now
        if self._boot_at >= 0.0 and self._boot_at == now:  # the bootstrap delay
            self._boot_at = -1.0
            # (a failed room signals no bootstrap: the prefill would ignore it)
            if not self.resolved and not self.booted and not self.stale:
                self.booted = True
                if env.due_now():
                    self._boot_link = True
                    env.link(self)
                elif self.prefill is not None:
                    # nothing else is due this instant and this step does nothing more: the
                    # bootstrapped step would come next
                    self.prefill.room_bootstrapped(self.req)
        elif self._boot_link:
            self._boot_link = False
            if self.prefill is not None:
                self.prefill.room_bootstrapped(self.req)
        else:
            self._done()

    def _done(self) -> None:
        """The done step: the sides it concluded hear, the decode first."""
        pend, self._pend = self._pend, 0
        self.deliver(pend)

    def deliver(self, sides: int) -> None:
        """The listeners of ``sides`` hear the room's conclusion, the decode first."""
        req = self.req
        if sides & DECODE and self.decode is not None:
            self.decode.room_done(req)
        if sides & PREFILL and self.prefill is not None:
            self.prefill.room_done(req)

    def _notify(self, sides: int) -> None:
        """A done step for ``sides`` (its own when the room's is already pending)."""
        if self._pend:
            self.env.link(_SideDone(self, sides))
        else:
            self._pend = sides
            self.env.link(self)

    def succeed(self, last: bool = False, sides: int = BOTH) -> None:
        """Mark Success (terminal), on the prefill side and, when its status message arrives
        (``sides``: not when the done signal is lost), the decode side. ``last``: the caller's
        step does nothing more, so with nothing else due this instant the done step (which
        would come next) runs at once."""
        if not self.resolved:
            self.state = SUCCESS
            self.resolved = True
            new = PREFILL
            if sides & DECODE and not self.d_resolved:
                self.d_state = SUCCESS
                self.d_resolved = True
                new = BOTH
            env = self.env
            if new == PREFILL and self.decode is not None and not self.d_resolved:
                self.decode.peer_ended(self.req)  # the done signal is lost
            if last and not self._pend:
                if not env.due_now():
                    self._pend = new
                    self._done()
                    return
            self._notify(new)

    def fail(self, reason: str, sides: int = BOTH) -> bool:
        """Mark Failed (terminal) on ``sides`` (those not concluded yet). Returns False if
        none was left to conclude. (The prefill ignores a bootstrap of a resolved room, so
        none is signalled.)"""
        new = 0
        if sides & PREFILL and not self.resolved:
            self.state = FAILED
            self.resolved = True
            self.reason = reason
            self.by_peer = bool(sides & BY_PEER)
            new = PREFILL
        if sides & DECODE and not self.d_resolved:
            self.d_state = FAILED
            self.d_resolved = True
            self.d_reason = reason
            new |= DECODE
        if not new:
            return False
        if new == PREFILL and self.decode is not None and not self.d_resolved:
            self.decode.peer_ended(self.req)  # the decode is not told
        self._notify(new)
        return True


class _SideDone:
    """A done step of a room made while the room's own was pending (its own heap entry)."""

    __slots__ = ("room", "sides")

    def __init__(self, room: Room, sides: int) -> None:
        self.room, self.sides = room, sides

    def tick(self) -> None:
        self.room.deliver(self.sides)


def new_room(env: simpy.Environment, room_id: int, req: Request | None = None) -> Room:
    """The room ``room_id`` of ``req``, bootstrapping, no listener yet."""
    room = Room()
    room.id, room.env, room.req = room_id, env, req
    room.state, room.resolved, room.booted = BOOTSTRAPPING, False, False
    room.d_state, room.d_resolved, room.d_reason, room._pend = BOOTSTRAPPING, False, "", 0
    room.decode = room.prefill = None
    room._boot_link, room._boot_at = False, -1.0
    room.session, room.port, room.doomed, room.reason = "", 0, "", ""
    room.aux_lost, room.stale, room.ack, room.by_peer = False, "", None, False
    return room


class Request:
    """One HTTP generate request as the router sees it; its fields become the records table.

    Made by :func:`new_request` (no Python ``__init__``: see ``pdsim.engine.transfer.Chunk``).
    """

    __slots__ = (
        "rid", "client", "kind", "input_len", "output_len", "stream", "blocks", "question",
        "attempt", "t_arrival", "t_first_token", "t_done", "generated", "status", "reason",
        "http_status", "room", "p_server", "p_rank", "d_server", "d_rank", "prefill_tokens",
        "cached_tokens", "on_response", "d_pages", "p_pages", "gen_at_join", "join_step",
        "version", "cap_tokens", "full_at", "stale_pages", "t_prefill_end", "t_transfer_done",
        "t_prefill_start", "boot_at", "boot_eid", "wait_at", "wait_eid", "fill_target",
        "fill_done", "dead_at", "p_leg",
    )
    # (fill_*: a prefill of the request (pdsim.engine.adder, on a colocated or a PD prefill
    # rank): the tokens whose KV it needs, its prompt and, colocated, any tokens generated
    # before a retraction, and those computed so far, cached prefix included; set by the
    # rank that prefills it)
    # (boot_*, wait_*: the prefill's bootstrap and the decode's waiting deadline, set when
    # each starts: pdsim.engine.clock.KeptDeadlines)
    room: Room | None
    on_response: Responder | None
    # (dead_at: when the decode began holding a slot for a room that cannot complete, NaN if
    # it does not; p_leg: the router's call told when the prefill leg ends, None when the
    # router ignores that leg: pdsim.engine.router)
    dead_at: float
    p_leg: object


def new_request(env: simpy.Environment, rid: int, client: str, kind: str, input_len: int,
                output_len: int, stream: bool, blocks: tuple[int, ...] | range | None = None,
                question: int = -1, attempt: int = 0) -> Request:
    """Request ``rid`` arriving now, as ``client`` sent it."""
    req = Request()
    req.rid = rid
    req.client = client
    req.kind = kind  # "bench", "warmup", "eval"
    req.input_len = input_len
    req.output_len = output_len
    req.stream = stream
    req.blocks = blocks
    req.question = question
    req.attempt = attempt
    req.t_arrival = env._now
    req.t_first_token = NAN
    req.t_done = NAN
    req.t_prefill_end = NAN
    req.t_transfer_done = NAN
    req.generated = 0
    req.status = "unfinished"  # completed | failed | timed_out | unfinished
    req.reason = ""
    req.http_status = 0
    req.room = None
    req.p_server = req.p_rank = req.d_server = req.d_rank = -1
    # prefill forward work spent on this request (on a PD prefill rank, with its cached
    # prefix, its position in its prompt, fill_done): sound because a Request is dispatched
    # to one prefill rank once (a retry is a new Request)
    req.prefill_tokens = 0
    req.t_prefill_start = NAN  # its first prefill forward began
    req.cached_tokens = 0
    # the router's call, once dispatched: on_response.responded() when the decode answers
    req.on_response = None
    req.d_pages = None
    req.p_pages = None
    req.gen_at_join = 0
    req.join_step = 0
    req.version = 0
    req.cap_tokens = 0  # tokens its decode pages hold when they are allocated
    req.full_at = 0  # (running) the decode step its pages are full: DecodeRank._join
    req.stale_pages = False
    req.dead_at = NAN
    req.p_leg = None
    return req


def end(req: Request, status: str, reason: str, http_status: int, now: float,
        stats: Stats) -> bool:
    """Give ``req`` its terminal status, once: the first end wins.

    A request ends exactly once (``completed``, ``failed`` or ``timed_out``), whoever ends it:
    the decode (its answer, a failed room, a refusal, a crash) or the router (its
    ``request_timeout_s``). Both may try in the same instant (a bootstrap timeout and a router
    timeout of 300 s each), and the router times out requests the decode still finishes
    later; every attempt after the first is ignored (returns False), so the request table,
    the failure counter behind the time series and what the client was answered agree.
    ``pdsim.engine.decode_batch.RunningBatch._complete`` inlines this on the hot path (a
    completion).

    A failure or a timeout, whichever side ends it, is counted in ``stats.request_failures``
    by reason as it ends: the time series' ``failed`` (``pdsim.engine.sim``) counts what the request
    table counts, every kind of failure."""
    if req.status != "unfinished":
        return False
    req.status = status
    req.reason = reason
    req.t_done = now
    req.http_status = http_status
    if status != "completed":
        stats.count_request_failure(reason)
        if req.t_first_token > now:  # (a colocated front end had not delivered it yet)
            req.t_first_token = math.nan
    return True

"""A request and its PD transfer room (the bootstrap room both sides poll)."""

from __future__ import annotations

from enum import IntEnum
from typing import Protocol

import simpy

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


class Responder(Protocol):
    """Who hears that the decode answered a request (pdsim.engine.router's call)."""

    def responded(self) -> None: ...


class Listener(Protocol):
    """A rank that hears of a room's steps (pdsim.engine.prefill.PrefillRank,
    pdsim.engine.decode.DecodeRank)."""

    def room_bootstrapped(self, req: Request) -> None: ...

    def room_done(self, req: Request) -> None: ...


class Room:
    """The transfer session of one request between its prefill rank and its decode rank.

    Both ranks hear of its events one zero-delay step after they happen, after anything else
    already due in that instant (a flush arriving with the dispatch, a time-series sample at a
    timeout's instant): where the SimPy events ``bootstrapped`` and ``done`` it replaces were
    processed. The room is itself the plain heap entry (``pdsim.engine.clock.Environment.link``) of
    those steps, and of the decode's bootstrap delay (``start_bootstrap``): no event objects.

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
                 "req", "booted", "decode", "prefill", "_boot_link", "_boot_at")
    # (the fields, as new_room sets them)
    id: int
    env: simpy.Environment
    req: Request | None  # what the listeners are called with
    state: Poll
    resolved: bool  # Failed or Success (terminal; only succeed() and fail() set it)
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

    def bootstrap(self) -> None:
        """The decode holds KV pages for it: the prefill hears one zero-delay step later."""
        self.booted = True
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
            if not self.resolved and not self.booted:
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
        """The done step: the listeners hear, the decode first."""
        req = self.req
        if self.decode is not None:
            self.decode.room_done(req)
        if self.prefill is not None:
            self.prefill.room_done(req)

    def succeed(self, last: bool = False) -> None:
        """Mark Success (terminal). ``last``: the caller's step does nothing more, so with
        nothing else due this instant the done step (which would come next) runs at once."""
        if not self.resolved:
            self.state = SUCCESS
            self.resolved = True
            env = self.env
            if last:
                if not env.due_now():
                    self._done()
                    return
            env.link(self)

    def fail(self, reason: str) -> bool:
        """Mark Failed (terminal). Returns False if the room was already resolved. (The
        prefill ignores a bootstrap of a resolved room, so none is signalled.)"""
        if self.resolved:
            return False
        self.state = FAILED
        self.resolved = True
        self.reason = reason
        self.env.link(self)
        return True


def new_room(env: simpy.Environment, room_id: int, req: Request | None = None) -> Room:
    """The room ``room_id`` of ``req``, bootstrapping, no listener yet."""
    room = Room()
    room.id, room.env, room.req = room_id, env, req
    room.state, room.resolved, room.booted = BOOTSTRAPPING, False, False
    room.decode = room.prefill = None
    room._boot_link, room._boot_at = False, -1.0
    room.session, room.port, room.doomed, room.reason = "", 0, "", ""
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
        "fill_done",
    )
    # (fill_*: a colocated server's prefill of the request, pdsim.engine.colocated: the tokens
    # whose KV it needs, its prompt and any tokens generated before a retraction, and those
    # computed so far, cached prefix included)
    # (boot_*, wait_*: the prefill's bootstrap and the decode's waiting deadline, set when
    # each starts: pdsim.engine.clock.KeptDeadlines)
    room: Room | None
    on_response: Responder | None


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
    # prefill forward work spent on this request, which is also the prefill scheduler's
    # position in its prompt (PrefillRank._take): sound because a Request is dispatched
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
    return req

"""The load balancer in front of the fleet (``mini_lb`` request path) and its /flush_cache.

Request path (``mini_lb``): draw a prefill and a decode server independently and uniformly,
add a random 63-bit bootstrap room, POST to both at once, answer with the decode's response.

Flush handlers (``router.flush_handler``):

- ``mini_lb_0.3.2``: the handler takes no parameters, so ``?timeout=`` is dropped; a bare
  POST goes to every prefill and decode server at once; statuses ignored; always 200.
- ``mini_lb_fixed``: forwards ``timeout`` only when the caller gave one; still always 200.
- ``model_gateway`` (sgl-model-gateway): at most 32 concurrent, 5 s per-worker HTTP timeout,
  no query forwarded; 200 if all succeed, else 206 with the failed workers.
- ``rust_router`` (experimental sgl-router): at most 32 concurrent, bypasses circuit breakers,
  no query forwarded; 200 if all succeed (or no workers), else 502 with a per-worker breakdown.
"""

from __future__ import annotations

from collections.abc import Callable, Generator

import numpy as np
import simpy

from pdsim.config.fleet import RouterConfig
from pdsim.engine.clock import KeptDeadlines, call_later, later, urgent, urgent_pending
from pdsim.engine.log import EventLog
from pdsim.engine.request import BY_PEER, DECODE, PREFILL, SUCCESS, Request, end, new_room
from pdsim.engine.server import Server, refused
from pdsim.engine.stats import Stats


class RoutingDraws:
    """The routing stream's draws exactly as ``rng.integers`` makes them, one at a time, from
    the bit generator's raw 64-bit outputs taken in blocks (a numpy call per draw cost more
    than the rest of routing a request).

    numpy 1.17+ ``Generator.integers`` (Lemire's method, numpy/random/src/distributions/
    distributions.c): a 63-bit room id ``integers(0, 2**63, dtype=int64)`` is one raw output
    shifted right by one (no rejection is possible for that range); a server index
    ``integers(n)`` (n <= 2**32) multiplies a 32-bit output by ``n`` and keeps the high half,
    redrawing while the low half is under ``(2**32 - n) % n``; 32-bit outputs are the low then
    the high half of one raw output (PCG64's ``next_uint32`` keeps the high half for the next
    call). tests/test_sim_speed.py checks these against numpy itself. Drawing ahead only
    advances this stream: it takes the generator over (nothing else may draw from it).
    """

    __slots__ = ("bitgen", "block", "raw", "pos", "half")

    def __init__(self, rng: np.random.Generator, block: int = 1024) -> None:
        if type(rng.bit_generator) is not np.random.PCG64:  # the 32-bit halves are PCG64's
            raise TypeError("RoutingDraws needs a PCG64 generator")
        self.bitgen = rng.bit_generator
        self.block = block  # raw outputs drawn at a time
        self.raw: list[int] = []
        self.pos = 0
        state = self.bitgen.state  # a 32-bit half numpy kept from an earlier draw comes first
        # the high half of the last raw output, when its low half was used (-1: none)
        self.half = state["uinteger"] if state["has_uint32"] else -1

    def _next(self) -> int:
        pos = self.pos
        if pos == len(self.raw):
            self.raw = self.bitgen.random_raw(self.block).tolist()
            pos = 0
        self.pos = pos + 1
        return self.raw[pos]

    def _next32(self) -> int:
        half = self.half
        if half >= 0:
            self.half = -1
            return half
        x = self._next()
        self.half = x >> 32
        return x & 0xFFFFFFFF

    def room(self) -> int:
        """``int(rng.integers(0, 2**63, dtype=np.int64))``."""
        pos = self.pos
        if pos == len(self.raw):
            return self._next() >> 1
        self.pos = pos + 1
        return self.raw[pos] >> 1

    def index(self, n: int) -> int:
        """``int(rng.integers(n))`` for 2 <= n <= 2**32."""
        m = self._next32() * n
        low = m & 0xFFFFFFFF
        if low < n:
            threshold = (0xFFFFFFFF - (n - 1)) % n
            while low < threshold:
                m = self._next32() * n
                low = m & 0xFFFFFFFF
        return m >> 32


class MiniLB:
    def __init__(self, env: simpy.Environment, prefills: list[Server], decodes: list[Server],
                 cfg: RouterConfig, rng: np.random.Generator, log: EventLog,
                 stats: Stats) -> None:
        self.env = env
        self.stats = stats  # (a timeout ends a request: pdsim.engine.request.end counts it)
        self.prefills = prefills
        self.decodes = decodes
        self.cfg = cfg
        self.log = log
        self.hop = cfg.http_latency_ms / 1e3
        self.flush_calls: list[dict] = []
        self.draws = RoutingDraws(rng)  # the routing stream is the router's alone
        self.timeout = cfg.request_timeout_s
        self._deadlines = KeptDeadlines(env, self.timeout, self._waiting, self._timed_out,
                                        "dl_at", "dl_eid")  # (on the calls, in its own FIFO)
        # dual dispatch (RouterConfig.dispatch): whether the prefill leg's answer counts
        self.dispatch = cfg.dispatch
        self.join = cfg.dispatch != "mini_lb_gather"
        # a gateway's TTFT timeout: its deadlines (one set per value: a change applies to
        # requests arriving after it), what it cancels; None: no TTFT timeout
        self._ttft: KeptDeadlines | None = None
        self.ttft_timeout: float | None = None
        self.ttft_cancels = cfg.ttft_timeout_cancels
        if cfg.ttft_timeout_s is not None:
            self.set_ttft(cfg.ttft_timeout_s, cfg.ttft_timeout_cancels)
        # which sides hear an abort of one leg (pdsim.config.pd_paths; the fleet sets them)
        self.notify_decode = 0  # prefill_abort_notifies_decode
        self.notify_prefill = PREFILL | BY_PEER  # decode_abort_notifies_prefill
        # the leg_failure fault: None, or a callable giving '' or the leg ('prefill',
        # 'decode') whose POST fails at transport level (pdsim.engine.faults_pd)
        self.leg_fault: Callable[[Request], str] | None = None
        self._old_ttft: list[KeptDeadlines] = []

    def set_ttft(self, timeout: float | None, cancels: str) -> None:
        """The gateway's TTFT timeout from now on (requests already routed keep theirs)."""
        if self._ttft is not None:
            self._old_ttft.append(self._ttft)
        self.ttft_timeout = timeout
        self._ttft = (None if timeout is None else
                      KeptDeadlines(self.env, timeout, self._no_first_token, self._ttft_expired,
                                    "tt_at", "tt_eid"))
        self.ttft_cancels = cancels

    def forget_deadlines(self) -> None:
        """The run is over: drop the pending request timeouts and the requests they hold
        (``pdsim.engine.fleet.Fleet.release``)."""
        self._deadlines.clear()
        for d in (self._ttft, *self._old_ttft):
            if d is not None:
                d.clear()

    # --- generate --------------------------------------------------------------------------
    #
    # A request costs no process and no timeout of its own: a timer per hop, a callback from
    # the decode's answer, and the router timeout as a deadline in one FIFO
    # (clock.KeptDeadlines). The handler process this replaces waited on response-or-timeout;
    # its steps are kept, as plain heap entries of the request's _Call. ``on_return(req)``
    # runs where it returned the response to the client (after the return hop).

    def generate(self, req: Request, on_return: Callable[[Request], None],
                 started: bool = False) -> None:
        """POST /generate: pick a prefill and a decode server and a bootstrap room, then
        dispatch to both after one hop. ``on_return(req)`` is always the last thing its
        simulation step does (pdsim.engine.client.Frontend relies on it). ``started``: the handler
        process this replaces has started (see below)."""
        env = self.env
        if not started:
            if urgent_pending(env):
                # urgent events (processes not yet started) wait in this instant: the handler
                # process would have started after those
                urgent(env, lambda: self.generate(req, on_return, True))
                return
        draws = self.draws
        prefills, decodes = self.prefills, self.decodes
        p = prefills[0] if len(prefills) == 1 else prefills[draws.index(len(prefills))]
        d = decodes[0] if len(decodes) == 1 else decodes[draws.index(len(decodes))]
        req.room = new_room(env, draws.room(), req)
        call = _Call()  # (no Python __init__: see pdsim.engine.transfer.Chunk)
        call.lb, call.req, call.p, call.d, call.on_return = self, req, p, d, on_return
        call.fired = call.answered = False
        call.stage = _DISPATCH
        call.why, call.p_done, call.held = "router_timeout", False, False
        if self.hop:
            env.timer(self.hop, call)  # call.tick: the dispatch
        else:
            call.tick()

    @staticmethod
    def _waiting(call: _Call) -> bool:
        return not call.fired

    @staticmethod
    def _no_first_token(call: _Call) -> bool:
        """No first byte yet: a streamed request's first token (NaN: none yet), a
        non-streamed one's whole answer (its first byte is the response)."""
        req = call.req
        return not call.fired and (req.t_first_token != req.t_first_token or not req.stream)

    def _timed_out(self, call: _Call) -> None:
        """The router timeout fired first: response-or-timeout, then the handler."""
        call.fired = True
        later(self.env, lambda: self._resume(call), 1)

    def _ttft_expired(self, call: _Call) -> None:
        """The gateway's TTFT timeout fired first: 504 to the client, and the legs it reaches
        aborted (``ttft_timeout_cancels``)."""
        call.fired = True
        call.why = "gateway_ttft_timeout"
        later(self.env, lambda: self._resume(call), 1)

    def _resume(self, call: _Call) -> None:
        """The handler resumes: the response, or a 504 if it had not come by then."""
        req = call.req
        # (the server may have ended it in this instant, its answer not yet processed: the
        # first end wins, pdsim.engine.request.end)
        why = call.why
        if not call.answered and end(req, "timed_out", why, 504, self.env._now, self.stats):
            self._abort(req, why != "router_timeout" and self.ttft_cancels == "prefill")
        if not self.hop:
            call.on_return(req)
        elif call.stage == _RESUME:  # (answered in time: its own entries end here)
            call.stage = _RETURN
            self.env.timer(self.hop, call)
        else:  # resumed by the timeout: the call's entries may still see the answer
            call_later(self.env, self.hop, lambda: call.on_return(req))

    def _abort(self, req: Request, prefill_only: bool = False) -> None:
        """The router gave up on ``req``: both legs dropped, each server aborts its own copy
        (an abort never blacklists); ``prefill_only``: only the prefill leg is (a gateway's
        TTFT timeout that reaches only the prefill): the decode hears of it only if the
        release tells it (pdsim.config.pd_paths)."""
        if prefill_only:
            req.room.fail("aborted", PREFILL | self.notify_decode)
        else:
            req.room.fail("aborted")

    # --- flush -----------------------------------------------------------------------------

    def flush(self, timeout: float | None, caller: str) -> simpy.Process:
        return self.env.process(self._flush(timeout, caller))

    def _flush(self, timeout: float | None, caller: str) -> Generator:
        handler = self.cfg.flush_handler
        servers = self.prefills + self.decodes
        forwarded = timeout if handler == "mini_lb_fixed" else None
        dropped = timeout is not None and forwarded is None
        if dropped:
            what = f"?timeout={timeout:g} dropped"
        elif forwarded is not None:
            what = f"forwarded ?timeout={forwarded:g}"
        else:
            what = "no timeout given"
        self.log("router_flush", "router", value=-1 if timeout is None else timeout,
                 peer=caller, detail=f"{handler}: {what}; fan-out to {len(servers)} servers")
        if self.hop:
            yield self.env.timeout(self.hop)
        if handler.startswith("mini_lb"):
            procs = [s.flush(forwarded) for s in servers]
            yield self.env.all_of(procs)
            answers = {s.name: p.value for s, p in zip(servers, procs, strict=True)}
            status = 200  # statuses ignored
        else:
            answers = yield self.env.process(self._bounded_fanout(servers, handler))
            failed = [n for n, (code, _m) in answers.items() if code != 200]
            if not failed:
                status = 200
            else:
                status = 206 if handler == "model_gateway" else 502
        self.log("router_flush_answer", "router", value=status, peer=caller,
                 detail="; ".join(f"{n}: {c}" for n, (c, _m) in answers.items()))
        self.flush_calls.append({"time": self.env.now, "caller": caller, "timeout": timeout,
                                 "forwarded": forwarded, "status": status,
                                 "servers": {n: c for n, (c, _m) in answers.items()}})
        return status, answers

    def _bounded_fanout(self, servers: list[Server], handler: str) -> Generator:
        sem = simpy.Resource(self.env, capacity=self.cfg.fanout_concurrency)
        answers: dict[str, tuple[int, str]] = {}

        def one(server: Server) -> Generator:
            with sem.request() as slot:
                yield slot
                proc = server.flush(None)
                if handler == "model_gateway":
                    res = yield proc | self.env.timeout(self.cfg.worker_timeout_s)
                    answers[server.name] = (proc.value if proc in res
                                            else (408, "worker timeout"))
                else:
                    answers[server.name] = yield proc

        yield self.env.all_of([self.env.process(one(s)) for s in servers])
        return {s.name: answers[s.name] for s in servers}


# a _Call's stages (module names: a class constant read through the class is slower)
_DISPATCH, _ANSWER, _RESUME, _RETURN = 0, 1, 2, 3


class _Call:
    """One POST /generate in the router: where it goes and how far its handler got.

    It is also the plain heap entry of the handler's steps (``tick``): the hop to the servers,
    then, once the decode answered, the response event's step, the response-or-timeout
    condition's step, and the hop back. (A timeout resumes the handler through its own
    entries, so that an answer in the same instant still finds these.)

    Made in ``MiniLB.generate`` (no Python ``__init__``: see ``pdsim.engine.transfer.Chunk``).
    """

    __slots__ = ("lb", "req", "p", "d", "on_return", "fired", "answered", "stage", "dl_at",
                 "dl_eid", "why", "p_done", "held", "tt_at", "tt_eid")
    lb: MiniLB
    req: Request
    p: Server
    d: Server
    on_return: Callable[[Request], None]
    fired: bool  # response-or-timeout triggered
    answered: bool  # the response event was processed
    stage: int  # _DISPATCH, _ANSWER, _RESUME or _RETURN
    why: str  # what a timeout answers (router_timeout, gateway_ttft_timeout)
    p_done: bool  # the prefill leg answered (only followed when the dispatch joins legs)
    held: bool  # the decode answered, and the answer waits for the prefill leg (join)

    def responded(self) -> None:
        """The decode answered (the call is the request's ``on_response``): its response
        event is processed one zero-delay step later. A joining dispatch (smg_join, or a
        decode failure under smg_cancel_on_prefill_fail) holds the answer until the prefill
        leg answers; smg_cancel_both drops an unanswered prefill leg when the decode failed."""
        lb = self.lb
        if lb.join and not self.p_done and self.req.status != "completed":
            if lb.dispatch == "smg_cancel_both":
                self._drop_prefill()
            else:
                self.held = True
                return
        self.stage = _ANSWER
        lb.env.link(self)

    def prefill_ended(self, req: Request) -> None:
        """The prefill leg answered (its copy ended: Success, or an error: bootstrap timeout,
        abort, a broken connection). Under the cancelling dispatches an error drops the decode
        leg and answers 502 at once."""
        self.p_done = True
        lb = self.lb
        if self.held:  # the decode's (failed) answer waited for this leg: it goes now
            self.held = False
            now = lb.env._now
            lb.log("wedge_ended", "router", rid=req.rid, room=req.room.id,
                   value=now - req.t_done, detail=f"prefill leg ended ({req.room.reason or 'ok'})")
            req.t_done = now  # (the client's answer, held since the decode's)
            self.stage = _ANSWER
            lb.env.link(self)
            return
        if (req.room.state != SUCCESS and lb.dispatch != "smg_join"
                and req.status == "unfinished" and not self.fired):
            self._fail_if_prefill_failed(req)
            # the decode leg is dropped: the decode aborts its copy (ABORT to the prefill from
            # 0.5.13); its answer is not the client's any more
            req.on_response = None
            req.room.fail("aborted", DECODE | lb.notify_prefill)
            self.stage = _ANSWER
            lb.env.link(self)

    def _fail_if_prefill_failed(self, req: Request) -> None:
        """The answer is the prefill leg's error when it failed (502: the gateway maps a
        transport error or a 5xx to 502)."""
        if req.room.state != SUCCESS:  # (a first end: pdsim.engine.request.end)
            end(req, "failed", f"prefill_{req.room.reason}", 502, self.lb.env._now,
                self.lb.stats)

    def _drop_prefill(self) -> None:
        """Drop the unanswered prefill leg: the prefill aborts its copy."""
        req = self.req
        req.p_leg = None
        self.p_done = True
        req.room.fail("aborted", PREFILL | self.lb.notify_decode)

    def tick(self) -> None:
        stage = self.stage
        if stage == _DISPATCH:  # the hop to the servers: POST to both
            req = self.req
            lb = self.lb
            # (set first: a crashed decode server refuses at once, answering in dispatch)
            req.on_response = self  # responded() when the decode answers
            req.p_server = self.p.index  # (the decode's metadata goes to it: pdsim.engine.peers)
            if lb.join:
                req.p_leg = self  # prefill_ended() when the prefill leg answers
            broken = lb.leg_fault(req) if lb.leg_fault is not None else ""
            if broken:
                lb.log("leg_failed", "router", rid=req.rid, room=req.room.id,
                       detail=f"{broken} leg: error sending request")
            if broken == "decode":
                req.d_server = self.d.index
                self.d.ranks[0].refuse(req, "decode_leg_failed")
            else:
                self.d.dispatch(req)  # the decode registers the destination session first
            if broken == "prefill":
                req.p_server = self.p.index
                refused(req)
            elif not self.p_done:  # (smg_cancel_both dropped it if the decode refused)
                self.p.dispatch(req)
            self.dl_at, self.dl_eid = lb._deadlines.start(self)  # the router timeout
            if lb._ttft is not None:
                self.tt_at, self.tt_eid = lb._ttft.start(self)
        elif stage == _ANSWER:  # the response event, then response-or-timeout
            self.answered = True
            if not self.fired:
                self.fired = True
                self.stage = _RESUME
                env = self.lb.env
                if env.due_now():
                    env.link(self)
                else:  # nothing else is due this instant: its step would come next
                    self.lb._resume(self)
        elif stage == _RESUME:  # the handler resumes
            self.lb._resume(self)
        else:  # the hop back to the client
            self.on_return(self.req)

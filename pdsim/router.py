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

from pdsim.clock import Deadlines, call_later, later, urgent, urgent_pending
from pdsim.log import EventLog
from pdsim.request import Request, Room
from pdsim.scenario import RouterConfig
from pdsim.server import Server


class MiniLB:
    def __init__(self, env: simpy.Environment, prefills: list[Server], decodes: list[Server],
                 cfg: RouterConfig, rng: np.random.Generator, log: EventLog) -> None:
        self.env = env
        self.prefills = prefills
        self.decodes = decodes
        self.cfg = cfg
        self.rng = rng
        self.log = log
        self.hop = cfg.http_latency_ms / 1e3
        self.flush_calls: list[dict] = []
        self._deadlines = Deadlines(env, cfg.request_timeout_s, self._waiting, self._timed_out)

    # --- generate --------------------------------------------------------------------------
    #
    # A request costs no process and no timeout of its own: a timer per hop, a callback from
    # the decode's answer, and the router timeout as a deadline in one heap (clock.Deadlines).
    # The handler process this replaces waited on response-or-timeout; its steps are kept
    # (clock.later: at once when nothing else is due in the instant). ``on_return(req)`` runs
    # where it returned the response to the client (after the return hop).

    def generate(self, req: Request, on_return: Callable[[Request], None]) -> None:
        """POST /generate: pick a prefill and a decode server and a bootstrap room, then
        dispatch to both after one hop."""
        if urgent_pending(self.env):  # the handler process would have started after those
            urgent(self.env, lambda: self._route(req, on_return))
        else:
            self._route(req, on_return)

    def _route(self, req: Request, on_return: Callable[[Request], None]) -> None:
        env = self.env
        p = self.prefills[self._pick(len(self.prefills))]
        d = self.decodes[self._pick(len(self.decodes))]
        room = Room(env, int(self.rng.integers(0, 2**63, dtype=np.int64)))
        req.room = room
        call = _Call(req, p, d, on_return)
        if self.hop:
            call_later(env, self.hop, lambda: self._dispatch(call))
        else:
            self._dispatch(call)

    def _pick(self, n: int) -> int:
        """Uniform server index. numpy draws nothing for a one-value range (its bounded
        integers return ``low`` at once), so one server costs no call and the stream is the
        same (tests/test_sim_speed.py checks that numpy still behaves so)."""
        return 0 if n == 1 else int(self.rng.integers(n))

    def _dispatch(self, call: _Call) -> None:
        req = call.req
        # (set first: a crashed decode server refuses at once, answering in dispatch)
        req.on_response = lambda: self._answered(call)
        call.d.dispatch(req)  # the decode registers the destination session first
        call.p.dispatch(req)
        self._deadlines.add(call)

    @staticmethod
    def _waiting(call: _Call) -> bool:
        return not call.fired

    def _answered(self, call: _Call) -> None:
        """The decode answered: its response event, then response-or-timeout, then the
        handler."""

        def processed() -> None:
            call.answered = True
            if not call.fired:
                call.fired = True
                later(self.env, lambda: self._resume(call), 1)

        later(self.env, processed, 1)

    def _timed_out(self, call: _Call) -> None:
        """The router timeout fired first: response-or-timeout, then the handler."""
        call.fired = True
        later(self.env, lambda: self._resume(call), 1)

    def _resume(self, call: _Call) -> None:
        """The handler resumes: the response, or a 504 if it had not come by then."""
        req = call.req
        if not call.answered:
            req.status, req.reason, req.http_status = "timed_out", "router_timeout", 504
            req.t_done = self.env._now
            req.room.fail("aborted")  # frees KV on both sides; an abort never blacklists
        if self.hop:
            call_later(self.env, self.hop, lambda: call.on_return(req))
        else:
            call.on_return(req)

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


class _Call:
    """One POST /generate in the router: where it goes and how far its handler got."""

    __slots__ = ("req", "p", "d", "on_return", "fired", "answered")

    def __init__(self, req: Request, p: Server, d: Server,
                 on_return: Callable[[Request], None]) -> None:
        self.req, self.p, self.d, self.on_return = req, p, d, on_return
        self.fired = False  # response-or-timeout triggered
        self.answered = False  # the response event was processed

"""The router in front of a colocated fleet: sgl-model-gateway in regular mode.

A colocated fleet has no prefill/decode pairing (``mini_lb`` and the gateway's PD mode pair a
prefill and a decode server); the gateway's regular mode sends each request to one worker,
picked by its ``--policy`` (sgl-project/sglang, sgl-model-gateway/src/policies/):

- ``round_robin`` (round_robin.rs): the workers in turn.
- ``random`` (random.rs): uniform over the workers (here from the routing random stream).
- ``least_load`` (least_load.rs): the worker with the least load, ties to the first; a
  request's load is its text length, added when it is routed and taken off when a request
  to that worker completes (the oldest pending load first, as the gateway's FIFO does).
  pdsim has no text: the prompt's tokens stand for its length.

The gateway's default, ``cache_aware`` (a prefix tree per worker, falling back to the least
loaded one past its balance thresholds), is not modelled. Hops, the request timeout (an
abort: the server frees the request's KV) and ``/flush_cache`` (fanned out to every server,
as ``router.flush_handler`` says) are :class:`pdsim.engine.router.MiniLB`'s.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np
import simpy

from pdsim.config.fleet import RouterConfig
from pdsim.engine.clock import urgent, urgent_pending
from pdsim.engine.log import EventLog
from pdsim.engine.request import Request
from pdsim.engine.router import _DISPATCH, MiniLB, _Call
from pdsim.engine.server import Server
from pdsim.engine.stats import Stats


class Gateway(MiniLB):
    def __init__(self, env: simpy.Environment, servers: list[Server], cfg: RouterConfig,
                 rng: np.random.Generator, log: EventLog, stats: Stats) -> None:
        super().__init__(env, servers, [], cfg, rng, log, stats)  # (flushes fan out to them)
        self.servers = servers
        self.policy = cfg.policy or "round_robin"
        self._next = 0
        self._load = [0] * len(servers)
        self._pending: list[deque[int]] = [deque() for _ in servers]

    def _pick(self, req: Request) -> int:
        n = len(self.servers)
        if n == 1:
            return 0
        if self.policy == "round_robin":
            i = self._next % n
            self._next += 1
            return i
        if self.policy == "random":
            return self.draws.index(n)
        load = self._load  # least_load
        best = 0
        for i in range(1, n):
            if load[i] < load[best]:
                best = i
        return best

    def generate(self, req: Request, on_return: Callable[[Request], None],
                 started: bool = False) -> None:
        """POST /generate: pick a server, dispatch after one hop (as ``MiniLB.generate``)."""
        env = self.env
        if not started:
            if urgent_pending(env):
                urgent(env, lambda: self.generate(req, on_return, True))
                return
        i = self._pick(req)
        server = self.servers[i]
        if self.policy == "least_load":
            self._load[i] += req.input_len
            self._pending[i].append(req.input_len)
            on_return = self._completing(i, on_return)
        call = _GatewayCall()
        call.lb, call.req, call.p, call.d, call.on_return = self, req, server, server, on_return
        call.fired = call.answered = False
        call.stage = _DISPATCH
        call.why, call.p_done, call.held = "router_timeout", False, False  # (MiniLB's call's)
        if self.hop:
            env.timer(self.hop, call)
        else:
            call.tick()

    def _completing(self, i: int, on_return: Callable[[Request], None]
                    ) -> Callable[[Request], None]:
        """``on_return`` that first takes the oldest pending load off server ``i``."""
        def done(req: Request) -> None:
            pending = self._pending[i]
            self._load[i] = max(0, self._load[i] - (pending.popleft() if pending else 1))
            on_return(req)
        return done

    def _abort(self, req: Request, prefill_only: bool = False) -> None:
        """The gateway gave up: the server aborts the request (frees its KV)."""
        if req.p_rank >= 0:
            self.servers[req.p_server].ranks[req.p_rank].abort(req)


class _GatewayCall(_Call):
    """A request's call through the gateway: one server, dispatched once."""

    __slots__ = ()

    def tick(self) -> None:
        if self.stage == _DISPATCH:
            req = self.req
            req.on_response = self
            self.d.dispatch(req)
            self.dl_at, self.dl_eid = self.lb._deadlines.start(self)
            return
        super().tick()

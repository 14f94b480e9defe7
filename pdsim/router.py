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

from collections.abc import Generator

import numpy as np
import simpy

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

    # --- generate --------------------------------------------------------------------------

    def generate(self, req: Request) -> simpy.Process:
        return self.env.process(self._generate(req))

    def _generate(self, req: Request) -> Generator:
        env = self.env
        p = self.prefills[int(self.rng.integers(len(self.prefills)))]
        d = self.decodes[int(self.rng.integers(len(self.decodes)))]
        room = Room(env, int(self.rng.integers(0, 2**63, dtype=np.int64)))
        req.room = room
        if self.hop:
            yield env.timeout(self.hop)
        d.dispatch(req)  # the decode registers the destination session first
        p.dispatch(req)
        res = yield req.response | env.timeout(self.cfg.request_timeout_s)
        if req.response not in res:
            req.status, req.reason, req.http_status = "timed_out", "router_timeout", 504
            req.t_done = env.now
            room.fail("aborted")  # frees KV on both sides; an abort never blacklists
        if self.hop:
            yield env.timeout(self.hop)
        return req

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

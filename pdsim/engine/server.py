"""An SGLang server: N DP ranks behind a DP load balancer, and its ``/flush_cache``."""

from __future__ import annotations

from collections.abc import Generator

import simpy

from pdsim.engine.balance import FollowBootstrapRoom, RoundRobin, TotalTokens
from pdsim.engine.log import EventLog
from pdsim.engine.request import PREFILL, Request

IN_PROGRESS = (400, "Another flush_cache is already in progress")


class Server:
    """An SGLang server. ``dispatch(req)`` is the router's POST /generate to it: an attribute
    bound to what the server does now (``_bind``): with one rank, up, that rank's ``submit``
    itself (every balancer picks the only rank, and none keeps state another pick would read),
    so a request costs no call of the server's own; with several, ``_pick``; down, ``_refuse``.
    The rank records the server and rank index in its ``submit``."""

    def __init__(self, env: simpy.Environment, role: str, index: int, ranks: list,
                 balancer: RoundRobin | TotalTokens | FollowBootstrapRoom, log: EventLog) -> None:
        self.env = env
        self.role = role
        self.index = index
        self.name = f"{role}-{index}"
        self.ranks = ranks
        self.balancer = balancer
        self.log = log
        self._flushing = False
        self._down = False
        self._bind()

    @property
    def down(self) -> bool:
        """A crashed server refuses connections until it restarts."""
        return self._down

    @down.setter
    def down(self, value: bool) -> None:
        self._down = value
        self._bind()

    def _bind(self) -> None:
        ranks = self.ranks
        if self._down:
            self.dispatch = self._refuse
        elif len(ranks) == 1:
            self.dispatch = ranks[0].submit
        else:
            self.dispatch = self._pick

    def _pick(self, req: Request) -> None:
        ranks = self.ranks
        room = req.room  # (a colocated fleet's requests have none)
        ranks[self.balancer.pick(ranks, room.id if room is not None else -1)].submit(req)

    def _refuse(self, req: Request) -> None:
        """The router's POST cannot reach a server that is down (connection refused)."""
        if self.role != "prefill":  # (decode or colocated: the server that answers)
            req.d_server = self.index
            self.ranks[0].refuse(req)
        else:  # the prefill never hears of the request; the decode is not told
            req.p_server = self.index
            refused(req)

    def flush(self, timeout: float | None) -> simpy.Process:
        """POST /flush_cache[?timeout=]: every rank decides; the answer is rank 0's."""
        return self.env.process(self._flush(timeout))

    def _flush(self, timeout: float | None) -> Generator:
        if self._flushing:
            self.log("flush_rejected", self.name, detail=IN_PROGRESS[1])
            return IN_PROGRESS
        self._flushing = True
        self.log("flush_received", self.name, value=-1 if timeout is None else timeout,
                 detail="no timeout" if timeout is None else f"timeout={timeout:g}")
        procs = [r.flush.request(timeout) for r in self.ranks]
        yield self.env.all_of(procs)
        self._flushing = False
        answers = [p.value for p in procs]
        for i, (code, msg) in enumerate(answers):
            self.log("flush_answer", self.name, i, value=code, detail=msg)
        return answers[0]

    def is_fully_idle(self) -> bool:
        return all(r.is_fully_idle() for r in self.ranks)


def refused(req: Request) -> None:
    """The request's prefill leg failed at transport level: no prefill has its room, so it
    ends on the prefill side at once ("prefill_unreachable"; the decode is not told), and the
    router hears the leg's error."""
    req.room.fail("prefill_unreachable", PREFILL)
    leg = req.p_leg
    if leg is not None:
        req.p_leg = None
        leg.prefill_ended(req)

"""An SGLang server: N DP ranks behind a DP load balancer, and its ``/flush_cache``."""

from __future__ import annotations

from collections.abc import Generator

import simpy

from pdsim.balance import FollowBootstrapRoom, RoundRobin, TotalTokens
from pdsim.log import EventLog
from pdsim.request import Request

IN_PROGRESS = (400, "Another flush_cache is already in progress")


class Server:
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
        self.down = False  # a crashed server refuses connections until it restarts

    def dispatch(self, req: Request) -> None:
        if self.down:
            if self.role == "decode":
                req.d_server = self.index
                self.ranks[0].refuse(req)
            return
        ranks = self.ranks
        # (one rank: every balancer picks it, and none keeps state another pick would read)
        i = 0 if len(ranks) == 1 else self.balancer.pick(ranks, req.room.id)
        rank = ranks[i]
        if self.role == "prefill":
            req.p_server, req.p_rank = self.index, i
        else:
            req.d_server, req.d_rank = self.index, i
        rank.submit(req)

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

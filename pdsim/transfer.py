"""Mooncake-like KV transfer engine of one prefill rank. Transfers fail here.

Per prefill rank: ``queues`` FIFO transfer queues with one worker each; a chunk goes to queue
``port % queues`` (SGLang: sum of destination session ports mod 4). A worker, per chunk:

1. skips chunks of rooms that already resolved (aborted or failed elsewhere);
2. fails the room at once if the (this rank, decode session) pair is blacklisted:
   "Decode instance could be dead" (reason ``blacklisted_session``), without a write;
3. writes the chunk (one synchronous batch write of all layers) through the rank's NIC;
4. on ``ret != 0`` counts a failure for the session (which may blacklist it) and fails the room.
   ``ret != 0`` happens when a flush freed pages under the transfer (``flush_freed_pages``),
   when the write outlives the transfer timeout (``transfer_timeout``), the decode cannot be
   reached (``decode_unreachable``) or a fault injects an error (``injected_error``).
5. after the last chunk, the room reaches Success.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass

import simpy

from pdsim.blacklist import Blacklist
from pdsim.log import EventLog
from pdsim.nic import NIC
from pdsim.request import Poll, Request, Room
from pdsim.stats import Stats

DEAD_MSG = "Decode instance could be dead, remote mooncake session is not alive"


@dataclass(slots=True)
class Chunk:
    req: Request
    room: Room
    nbytes: float
    last: bool


class TransferEngine:
    recorder = None  # a pdsim.perfetto.Recorder when the run records its writes (set by the fleet)

    def __init__(self, env: simpy.Environment, owner: str, rank: int, nic: NIC,
                 blacklist: Blacklist, call_latency_s: float, timeout_s: float,
                 queues: int, log: EventLog, stats: Stats, reachable: Callable[[str], bool],
                 injected_error: Callable[[], bool] | None = None) -> None:
        self.env = env
        self.owner = owner
        self.rank = rank
        self.nic = nic
        self.blacklist = blacklist
        self.latency = call_latency_s
        self.timeout = timeout_s
        self.log = log
        self.stats = stats
        self.reachable = reachable
        self.injected_error = injected_error or (lambda: False)
        self.queues = [deque() for _ in range(queues)]
        self._wake = [env.event() for _ in range(queues)]
        self.writing: dict[int, Chunk] = {}  # queue index -> chunk being written
        for i in range(queues):
            env.process(self._worker(i))

    def submit(self, chunk: Chunk) -> None:
        i = chunk.room.port % len(self.queues)
        self.queues[i].append(chunk)
        if not self._wake[i].triggered:
            self._wake[i].succeed()

    def queued(self) -> int:
        return sum(len(q) for q in self.queues) + len(self.writing)

    def fail(self, chunk: Chunk, reason: str, counts: bool) -> None:
        """Fail the room; ``counts``: a ``ret != 0`` that the blacklist counts."""
        room = chunk.room
        newly = self.blacklist.record_failure(room.session) if counts else False
        if room.fail(reason):
            self.stats.transfer_failures[reason] = self.stats.transfer_failures.get(reason, 0) + 1
            self.log("transfer_failed", self.owner, self.rank, chunk.req.rid, room.id,
                     room.session, value=float(newly), detail=reason)

    def _worker(self, i: int) -> Generator:
        q = self.queues[i]
        rec = self.recorder
        while True:
            if not q:
                self._wake[i] = self.env.event()
                yield self._wake[i]
                continue
            chunk = q.popleft()
            room = chunk.room
            if room.resolved:
                continue
            sid = room.session
            blocked = self.blacklist.blocked(sid)  # may drop an idle entry (0.5.23)
            self.blacklist.touch(sid)
            if blocked:
                self.fail(chunk, "blacklisted_session", counts=False)
                continue
            room.state = Poll.Transferring
            self.writing[i] = chunk
            t0 = self.env.now
            if self.latency:  # per-call cost before the bytes move (1.6 ms + bytes / bw)
                yield self.env.timeout(self.latency)
            write = self.nic.write(chunk.nbytes)
            res = yield write | self.env.timeout(self.timeout)
            del self.writing[i]
            if write not in res:
                self.fail(chunk, "transfer_timeout", counts=True)
            elif room.doomed:
                self.fail(chunk, "flush_freed_pages", counts=True)
            elif not self.reachable(sid):
                self.fail(chunk, "decode_unreachable", counts=True)
            elif self.injected_error():
                self.fail(chunk, "injected_error", counts=True)
            elif not room.resolved:
                self.stats.bytes_transferred += chunk.nbytes
                if chunk.last:
                    room.succeed()
            if rec is not None:
                rec.write(self, i, chunk, t0, self.env.now)

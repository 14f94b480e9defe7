"""Mooncake-like KV transfer engine of one prefill rank. Transfers fail here.

Per prefill rank: ``queues`` FIFO transfer queues with one worker each; a chunk goes to queue
``port % queues`` (SGLang: sum of destination session ports mod 4). A worker, per chunk:

1. skips chunks of rooms that already resolved (aborted or failed elsewhere);
2. fails the room at once if the blacklist policy does not admit the (this rank, decode
   session) pair: "Decode instance could be dead" (reason ``blacklisted_session``), no write;
3. writes the chunk (one synchronous batch write of all layers) through the rank's NIC;
4. on ``ret != 0`` counts a failure for the session (which may blacklist it) and fails the room;
   on success tells the policy (a success resets windowed strikes, closes a half-open breaker).
5. after the last chunk, the room reaches Success.

What a write costs when it fails (``pdsim.faults.Paths`` says what the path is):

- a healthy path: ``call_latency + bytes / bandwidth``; ``ret != 0`` after it when a flush freed
  the pages (``flush_freed_pages``) or a fault injects an error (``injected_error``);
- bytes too slow (a degraded NIC): ``ret != 0`` at the deadline ``transfer_timeout_s`` + 1 ns
  per byte, as Mooncake's ``batchTransferSync`` polls (``transfer_timeout``);
- a peer that is gone (crashed decode, host up): ``ret != 0`` after ``qp_retry_s`` (the RDMA QP's
  retries run out; the reconnect is refused);
- a silent path (hung decode, partition, link down): after ``qp_retry_s`` the QP errors and its
  other slices are flushed as failed (Mooncake ``worker_pool.cpp``), so the write fails; the
  retried slice ends when the path returns or at the deadline, and ``ret != 0`` comes then.
  An outage shorter than ``qp_retry_s`` costs nothing (RDMA retransmits).

Probes (blacklist recovery) use the same write model with a 4 KiB write, off the queues.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass

import simpy

from pdsim.blacklist import Policy
from pdsim.faults import SILENT, UP, Paths
from pdsim.log import EventLog
from pdsim.nic import NIC
from pdsim.request import Poll, Request, Room
from pdsim.stats import Stats

DEAD_MSG = "Decode instance could be dead, remote mooncake session is not alive"
TIMEOUT_S_PER_BYTE = 1e-9  # Mooncake batchTransferSync: timeout = MC_TRANSFER_TIMEOUT + length ns
PROBE_BYTES = 4096


@dataclass(slots=True)
class Chunk:
    req: Request
    room: Room
    nbytes: float
    last: bool


class TransferEngine:
    recorder = None  # a pdsim.perfetto.Recorder when the run records its writes (set by the fleet)

    def __init__(self, env: simpy.Environment, owner: str, rank: int, nic: NIC,
                 blacklist: Policy, call_latency_s: float, timeout_s: float,
                 queues: int, log: EventLog, stats: Stats, paths: Paths, server: int,
                 qp_retry_s: float, injected_error: Callable[[], bool] | None = None) -> None:
        self.env = env
        self.owner = owner
        self.rank = rank
        self.server = server  # prefill server index (paths are per prefill server)
        self.nic = nic
        self.blacklist = blacklist
        self.latency = call_latency_s
        self.timeout = timeout_s
        self.qp_retry = qp_retry_s
        self.log = log
        self.stats = stats
        self.paths = paths
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

    def probe(self, session: str) -> Generator:
        """A recovery probe: a small write on the path; True when it succeeds."""
        t0 = self.env.now
        if self.latency:
            yield self.env.timeout(self.latency)
        reason, _dead = yield from self._write(session, PROBE_BYTES)
        self.stats.probes += 1
        self.stats.probe_s += self.env.now - t0
        return not reason

    def _worker(self, i: int) -> Generator:
        q = self.queues[i]
        rec = self.recorder
        bl = self.blacklist
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
            if not bl.admit(sid):
                self.fail(chunk, "blacklisted_session", counts=False)
                continue
            room.state = Poll.Transferring
            self.writing[i] = chunk
            t0 = self.env.now
            if self.latency:  # per-call cost before the bytes move (1.6 ms + bytes / bw)
                yield self.env.timeout(self.latency)
            reason, dead = yield from self._write(sid, chunk.nbytes)
            del self.writing[i]
            if dead:
                self.stats.dead_peer_writes += 1
                self.stats.dead_peer_write_s += self.env.now - t0
            if reason:
                self.fail(chunk, reason, counts=True)
            elif room.doomed:
                self.fail(chunk, "flush_freed_pages", counts=True)
            elif self.injected_error():
                self.fail(chunk, "injected_error", counts=True)
            else:
                bl.record_success(sid)
                if not room.resolved:
                    self.stats.bytes_transferred += chunk.nbytes
                    if chunk.last:
                        room.succeed()
            if rec is not None:
                rec.write(self, i, chunk, t0, self.env.now)

    def _write(self, sid: str, nbytes: float) -> Generator:
        """One synchronous batch write: returns (failure reason or '', met a dead path)."""
        env, paths = self.env, self.paths
        budget = self.timeout + nbytes * TIMEOUT_S_PER_BYTE
        if not paths.active:
            write = self.nic.write(nbytes)
            res = yield write | env.timeout(budget)
            if write in res:
                return "", False
            self.nic.cancel(write)
            return "transfer_timeout", False
        deadline = env.now + budget
        write = None
        dead = False
        p = self.server
        while True:
            state, cause = paths.state(p, sid)
            if state != UP:
                dead = True
                # no ACKs: the QP retransmits for qp_retry_s; a path back by then loses nothing
                key, up = paths.watch(p, sid, down=False)
                res = yield up | env.timeout(max(0.0, min(self.qp_retry, deadline - env.now)))
                if up in res:
                    continue
                paths.unwatch(key)
                if write is not None:
                    self.nic.cancel(write)
                state, cause = paths.state(p, sid)
                if state == SILENT and env.now < deadline:
                    # the retried slice waits for a reconnect: the path's return or the deadline
                    key, up = paths.watch(p, sid, down=False)
                    res = yield up | env.timeout(deadline - env.now)
                    if up not in res:
                        paths.unwatch(key)
                return cause, dead
            if write is None:
                write = self.nic.write(nbytes)
            key, down = paths.watch(p, sid, down=True)
            res = yield write | env.timeout(max(0.0, deadline - env.now)) | down
            if write in res:
                paths.unwatch(key)
                return "", dead
            if down in res:
                continue  # the path went down under the write
            paths.unwatch(key)
            self.nic.cancel(write)
            return "transfer_timeout", dead

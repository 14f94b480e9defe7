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

What a write costs when it fails (``pdsim.engine.faults.Paths`` says what the path is):

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

Each queue's worker is a small state machine, not a process: asleep (no chunk), woken (one
zero-delay event after a submit, as the worker process was), or writing one chunk (a
call-latency timer, then, while no fault touches any path, the NIC's completion callback or the
write's deadline, one timer pending per engine (``_arm``); with a path fault active, the
general write below, driven in place as the worker process ran it).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator

import simpy

from pdsim.engine.blacklist import Policy
from pdsim.engine.clock import call_at, later, reserve, run_inline
from pdsim.engine.faults import SILENT, UP, Paths
from pdsim.engine.log import EventLog
from pdsim.engine.nic import NIC
from pdsim.engine.request import PREFILL, TRANSFERRING, Request, Room
from pdsim.engine.stats import Stats

DEAD_MSG = "Decode instance could be dead, remote mooncake session is not alive"
TIMEOUT_S_PER_BYTE = 1e-9  # Mooncake batchTransferSync: timeout = MC_TRANSFER_TIMEOUT + length ns
PROBE_BYTES = 4096



class TransferEngine:
    recorder = None  # a Recorder (pdsim.engine.recorder) when the run records its writes (fleet)

    def __init__(self, env: simpy.Environment, owner: str, rank: int, nic: NIC,
                 blacklist: Policy, call_latency_s: float, timeout_s: float,
                 queues: int, log: EventLog, stats: Stats, paths: Paths, server: int,
                 qp_retry_s: float, injected_error: Callable[[], bool] | None = None) -> None:
        self.env = env
        self.recorder = None  # (the class default as its own: read per write)
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
        self.injected_error = injected_error  # None: no injected errors (no call per write)
        self.queues = [deque() for _ in range(queues)]
        self._asleep = [True] * queues  # no chunk and no wake-up pending
        self._wakers = [_Wake(self, i) for i in range(queues)]
        # (most policies ignore successes: skip the call when this one's is the base no-op)
        self._records_success = type(blacklist).record_success is not Policy.record_success
        self.writing: dict[int, Chunk] = {}  # queue index -> chunk being written
        self._front: Chunk | None = None  # the write whose deadline is armed (see _deadline)
        # whether a room's last write loses its done signal (the lost_done fault): None, or
        # a callable giving '' (delivered), 'status' or 'aux' (pdsim.engine.faults_pd)
        self.lost_done: Callable[[Room], str] | None = None

    def writing_room(self, room: Room) -> bool:
        """Whether a write of ``room``'s KV is in flight (an ABORT_ACK waits for it, PR
        #40645)."""
        return any(c.room is room for c in self.writing.values())

    def submit(self, chunk: Chunk) -> None:
        i = chunk.room.port % len(self.queues)
        self.queues[i].append(chunk)
        if self._asleep[i]:  # the worker wakes one zero-delay step later
            self._asleep[i] = False
            self.env.link(self._wakers[i])

    def queued(self) -> int:
        return sum(map(len, self.queues)) + len(self.writing)

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

    # --- a queue's worker ------------------------------------------------------------------

    def _serve(self, i: int) -> None:
        """Take queue ``i``'s chunks in order until one is written (or none is left)."""
        q, bl = self.queues[i], self.blacklist
        while q:
            chunk = q.popleft()
            room = chunk.room
            if room.resolved:
                continue
            if not bl.admit(room.session):
                self.fail(chunk, "blacklisted_session", counts=False)
                continue
            room.state = TRANSFERRING
            self.writing[i] = chunk
            env = self.env
            chunk.engine, chunk.queue, chunk.t0 = self, i, env._now
            # its write: pending, the call latency first, no deadline yet (see _deadline)
            chunk.state, chunk.links, chunk.dl_eid, chunk.dl_armed = _PENDING, -1, -1, False
            if self.latency:  # per-call cost before the bytes move (1.6 ms + bytes / bw)
                env.timer(self.latency, chunk)  # chunk.tick: _start
            else:
                self._start(chunk)
            return
        self._asleep[i] = True

    def _start(self, w: Chunk) -> None:
        nbytes = w.nbytes
        if self.paths.active:  # a fault may cut the path: the general write, run in place
            run_inline(self._write(w.room.session, nbytes),
                       lambda result: self._end(w, *result))
            return
        # every path is up: the bytes end the write, or its deadline does
        w.fid = self.nic.start(nbytes, w)  # w.written()
        self._start_deadline(w, self.timeout + nbytes * TIMEOUT_S_PER_BYTE)

    def _start_deadline(self, w: Chunk, timeout: float) -> None:
        """``w``'s deadline starts now, ``timeout`` s ahead: where its own timeout would be
        made (tests/test_clock.py runs this rule against SimPy timeouts)."""
        w.dl_at = at = self.env._now + timeout
        w.dl_eid = reserve(self.env)  # the id its timeout would have drawn now
        front = self._front
        if front is None or at < front.dl_at:  # (an equal time: the earlier id stays first)
            self._arm(w)

    # The writes' deadlines. Each write's deadline fires where its own timeout (made when the
    # bytes started) would have, under the id reserved then, if the write is still pending;
    # but only the earliest pending one (``_front``, by time then id) needs its timer on the
    # heap: a write's deadline is armed when it starts earlier than the front's, or when the
    # front's timer fires and it is the earliest pending write left (``writing`` holds at
    # most one write per queue). A timer whose write was overtaken, or ended, does nothing
    # (a heap of every write would give the same order; this engine has at most ``queues``
    # pending writes to look through, so it keeps none).

    def _arm(self, w: Chunk) -> None:
        self._front = w
        if not w.dl_armed:  # (a timer of its own may be pending from before it was overtaken)
            w.dl_armed = True
            # an event in SimPy's queue, not an entry of the step heap: it is due seconds
            # ahead (see clock.KeptDeadlines._arm)
            call_at(self.env, w.dl_at, _Deadline(self, w).fire, w.dl_eid)

    def _deadline(self, w: Chunk) -> None:
        """``w``'s deadline timer fired."""
        w.dl_armed = False
        if w is not self._front:
            return  # overtaken, and ended since (else it is the front again by now)
        due = w.state == _PENDING
        # the next deadline's timer goes on the heap first, so that while ``_timed_out`` runs
        # the heaps show everything due this instant (as clock.KeptDeadlines._fire)
        nxt = None
        for c in self.writing.values():
            if (c is not w and c.state == _PENDING and c.dl_eid >= 0
                    and (nxt is None or c.dl_at < nxt.dl_at
                         # (defensive: ``writing`` holds writes in the order their one
                         # fixed call latency began, so also their bytes and deadlines:
                         # the first of equal deadlines already has the lower id)
                         or (c.dl_at == nxt.dl_at and c.dl_eid < nxt.dl_eid))):
                nxt = c
        self._front = None
        if nxt is not None:
            self._arm(nxt)
        if due:
            self._timed_out(w)

    def _timed_out(self, w: Chunk) -> None:
        """The deadline came first (the worker resumed one zero-delay step later)."""
        w.state = _TIMED_OUT
        later(self.env, lambda: self._gave_up(w), 1)

    def _gave_up(self, w: Chunk) -> None:
        self.nic.cancel(w.fid)  # the write stops sharing the NIC
        self._end(w, "transfer_timeout", False)

    def _end(self, chunk: Chunk, reason: str, dead: bool, last: bool = False) -> None:
        """The worker's step after a write. ``last``: this is that step's last act."""
        i = chunk.queue
        room = chunk.room
        del self.writing[i]
        if room.ack is not None:  # the decode waits for this write to drain (ABORT_ACK)
            ack, room.ack = room.ack, None
            ack()
        if dead:
            self.stats.dead_peer_writes += 1
            self.stats.dead_peer_write_s += self.env.now - chunk.t0
        if reason:
            self.fail(chunk, reason, counts=True)
        elif room.doomed:
            self.fail(chunk, "flush_freed_pages", counts=True)
        elif self.injected_error is not None and self.injected_error():
            self.fail(chunk, "injected_error", counts=True)
        else:
            if self._records_success:
                self.blacklist.record_success(room.session)
            if not room.resolved:
                self.stats.bytes_transferred += chunk.nbytes
                if chunk.last and self.lost_done is not None and self._lose_done(room):
                    pass  # (the prefill concluded; the decode heard nothing, or no metadata)
                elif chunk.last:
                    if last and not self.queues[i] and self.recorder is None:
                        # nothing follows in this step but the worker falling asleep
                        # (_serve on an empty queue): the room's done step may run at once
                        self._asleep[i] = True
                        room.succeed(last=True)
                        return
                    room.succeed()
        if self.recorder is not None:
            self.recorder.write(self, i, chunk, chunk.t0, self.env.now)
        self._serve(i)

    def _lose_done(self, room: Room) -> bool:
        """The lost_done fault at a room's last write: True when it took the room's Success
        (the status message never reaches the decode); an aux loss marks the room and lets
        Success go (the decode's metadata gate then holds it)."""
        what = self.lost_done(room)
        if what == "status":
            room.succeed(sides=PREFILL)
            self.log("done_lost", self.owner, self.rank, room.req.rid, room.id, room.session,
                     detail="KV send done; the Success message never reached the decode")
            return True
        if what == "aux":
            room.aux_lost = True
            self.log("done_lost", self.owner, self.rank, room.req.rid, room.id, room.session,
                     detail="KV send done; the metadata (aux) write never landed")
        return False

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


class _Deadline:
    """The timer of one write's deadline (an event under the id reserved at its start)."""

    __slots__ = ("engine", "chunk")

    def __init__(self, engine: TransferEngine, chunk: Chunk) -> None:
        self.engine, self.chunk = engine, chunk

    def fire(self, _ev: object) -> None:
        self.engine._deadline(self.chunk)


class _Wake:
    """A queue's worker waking (a plain zero-delay link, where its wake-up event was)."""

    __slots__ = ("engine", "queue")

    def __init__(self, engine: TransferEngine, queue: int) -> None:
        self.engine, self.queue = engine, queue

    def tick(self) -> None:
        self.engine._serve(self.queue)


# a chunk's write states (module names, as router's call stages)
_PENDING, _WRITTEN, _TIMED_OUT = 0, 1, 2


class Chunk:
    """A finished prefill chunk's KV, queued for a write to the decode; also its write.

    Made by :func:`new_chunk` (the request, its room, the bytes, whether it is the last
    chunk). Once a worker takes it, its write's fields are set (``TransferEngine._serve``:
    ``engine``, ``queue``, ``t0``, ``state``, ``links``, ``dl_eid``, ``dl_armed``; ``fid``
    and ``dl_at`` when the bytes start) and the chunk is the plain heap entry of its write's
    steps on the fast path (``tick``): the call-latency timer, then, once the NIC wrote the
    last byte (``written``: the chunk is the NIC's listener), the two zero-delay steps after
    which the worker that waited on write-or-deadline resumed. The write is pending until
    the NIC finishes it or its deadline comes.

    No Python ``__init__``: making an instance of a class that has one is a call from C back
    into the interpreter (~1,850 instructions in all for a small object here, ~930 without);
    a request makes one to three chunks.
    """

    __slots__ = ("req", "room", "nbytes", "last", "engine", "queue", "t0", "state", "fid",
                 "links", "dl_at", "dl_eid", "dl_armed")

    engine: TransferEngine  # (set when a worker takes it)

    def written(self) -> None:
        """The NIC wrote the last byte. The worker waited on that and on the deadline: it
        resumed two zero-delay steps later."""
        if self.state == _PENDING:
            self.state = _WRITTEN
            engine = self.engine
            env = engine.env
            # nothing follows in this step (nic.last): if nothing else is due this instant,
            # both steps would come next, nothing between
            if engine.nic.last and not env.due_now():
                engine._end(self, "", False, True)
                return
            self.links = 2
            env.link(self)

    def tick(self) -> None:
        links = self.links
        if links < 0:  # the call latency passed: the bytes start moving
            self.engine._start(self)
        elif links == 2:
            self.links = 1
            env = self.engine.env
            if env.due_now():
                env.link(self)
            else:  # nothing else is due this instant: the worker's step would come next
                self.engine._end(self, "", False, True)
        else:
            self.engine._end(self, "", False, True)


def new_chunk(req: Request, room: Room, nbytes: float, last: bool) -> Chunk:
    """A finished prefill chunk's KV for the transfer engine (see :class:`Chunk`)."""
    chunk = Chunk()
    chunk.req, chunk.room, chunk.nbytes, chunk.last = req, room, nbytes, last
    return chunk

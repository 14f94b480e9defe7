"""What a run records of its batch steps and KV writes, for the Perfetto export.

Kept apart from :mod:`pdsim.output.perfetto` (the exporter, which reads a finished
:class:`pdsim.output.result.Result`) so that the simulation imports only this and the exporter
imports the simulation's types without an import circle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pdsim.engine.request import FAILED

if TYPE_CHECKING:
    from pdsim.engine.rank import Rank
    from pdsim.engine.transfer import Chunk, TransferEngine

KV_STEP = 0.005  # a rank's KV counter is written when its use moved by 0.5% of the pool


class Recorder:
    """Collects batch steps and KV writes as a run goes (the ranks and engines call it).

    ``step`` takes ``steps``: a span of ``k`` identical steps (a fast-forwarded run of decode
    steps) is one slice that says how many steps it holds.
    """

    def __init__(self) -> None:
        self.steps: list[tuple] = []  # (track, t0, t1, kind, batch, tokens, steps)
        self.writes: list[tuple] = []  # (nic, track, t0, t1, rid, room, nbytes, last, outcome)
        self.kv: list[tuple] = []  # (track, t, used share)
        self._kv_last: dict[str, float] = {}

    def step(self, rank: Rank, t0: float, t1: float, plan: tuple | None, steps: int = 1) -> None:
        """``rank`` finished a batch step (``plan`` None: an idle batch in lockstep)."""
        track = f"{rank.name}.r{rank.index}"
        if plan is None:
            self.steps.append((track, t0, t1, "idle batch", 0, 0, steps))
        elif rank.role == "prefill":
            self.steps.append((track, t0, t1, "prefill", 0, int(plan[0]), steps))
        elif len(plan) > 4:  # a colocated rank's prefill forward (decode batch mixed in)
            kind = "prefill+decode" if plan[0] else "prefill"
            self.steps.append((track, t0, t1, kind, int(plan[0]), int(plan[3] - plan[0]),
                               steps))
        else:
            self.steps.append((track, t0, t1, "decode", int(plan[0]), int(plan[0]) * steps,
                               steps))
        self.kv_use(rank, t1)

    def kv_use(self, rank: Rank, t: float) -> None:
        track = f"{rank.name}.r{rank.index}"
        share = rank.alloc.used / rank.alloc.capacity
        last = self._kv_last.get(track)
        if last is None or abs(share - last) >= KV_STEP or (share == 0 and last != 0):
            self._kv_last[track] = share
            self.kv.append((track, t, share))

    def write(self, engine: TransferEngine, queue: int, chunk: Chunk, t0: float,
              t1: float) -> None:
        """A transfer worker finished one KV write (successful or not)."""
        room = chunk.room
        outcome = room.reason if room.state == FAILED else "ok"
        self.writes.append((engine.nic.name, f"{engine.owner}.r{engine.rank} q{queue}", t0, t1,
                            chunk.req.rid, room.id, chunk.nbytes, chunk.last, outcome))

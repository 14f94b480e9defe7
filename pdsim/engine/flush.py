"""Scheduler flush semantics (``SchedulerFlushWrapper``), one per DP rank.

``timeout`` missing or <= 0 takes the immediate path: ``skip_idle_check`` flushes at once (as the
incident report describes); ``reject_if_busy`` answers 400 when the rank is not fully idle (as
released 0.5.10-0.5.23 do). A positive timeout waits until the rank is fully idle, re-checking
whenever the rank's queues shrink, and answers 400 "Timed out waiting for idle state." at the
deadline.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Protocol

import simpy

if TYPE_CHECKING:
    from pdsim.engine.log import EventLog

OK = (200, "Cache flushed.")
BUSY = (400, "Cache not flushed because there are pending requests")
TIMED_OUT = (400, "Timed out waiting for idle state.")


class Flushable(Protocol):
    """What the wrapper needs of a DP rank (rank.Rank provides it; flush.py does not import it)."""

    name: str
    index: int

    def is_fully_idle(self) -> bool: ...
    def busy_summary(self) -> str: ...
    def idle_event(self) -> simpy.Event: ...
    def flush_now(self, how: str) -> None: ...


class FlushWrapper:
    def __init__(self, env: simpy.Environment, rank: Flushable, semantics: str,
                 log: EventLog) -> None:
        self.env = env
        self.rank = rank
        self.semantics = semantics
        self.log = log
        self.executed = self.rejected = self.timed_out = 0

    def request(self, timeout: float | None) -> simpy.Process:
        """A process answering ``(status, message)`` for one flush request to this rank."""
        return self.env.process(self._run(timeout))

    def _run(self, timeout: float | None) -> Generator:
        rank = self.rank
        if timeout is None or timeout <= 0:
            if self.semantics == "reject_if_busy" and not rank.is_fully_idle():
                return self._reject(BUSY)
            return self._do("no timeout reached the rank: immediate")
        deadline = self.env.now + timeout
        while not rank.is_fully_idle():
            left = deadline - self.env.now
            if left <= 0:
                self.timed_out += 1
                self.log("flush_timed_out", rank.name, rank.index, value=timeout,
                         detail=rank.busy_summary())
                return TIMED_OUT
            yield rank.idle_event() | self.env.timeout(left)
        return self._do(f"idle within timeout={timeout:g}")

    def _reject(self, answer: tuple[int, str]) -> tuple[int, str]:
        self.rejected += 1
        self.log("flush_rejected", self.rank.name, self.rank.index, detail=self.rank.busy_summary())
        return answer

    def _do(self, how: str) -> tuple[int, str]:
        self.executed += 1
        self.rank.flush_now(how)
        return OK

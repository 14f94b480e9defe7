"""What prefill and decode DP ranks share: identity, KV pool, idle tracking and flush."""

from __future__ import annotations

from collections.abc import Generator

import simpy

from pdsim.flush import FlushWrapper
from pdsim.kv import PageAllocator
from pdsim.log import EventLog
from pdsim.predictor import Predictor
from pdsim.scenario import DecodeConfig, PrefillConfig
from pdsim.stats import Stats


class Rank:
    role = "rank"
    recorder = None  # a pdsim.perfetto.Recorder when the run records its steps (set by the fleet)

    def __init__(self, env: simpy.Environment, server: int, index: int,
                 cfg: PrefillConfig | DecodeConfig, predictor: Predictor, pool_pages: int,
                 flush_semantics: str, log: EventLog, stats: Stats) -> None:
        self.env = env
        self.server = server
        self.index = index
        self.name = f"{self.role}-{server}"
        self.cfg = cfg  # the role's scenario section (PrefillConfig / DecodeConfig)
        self.predictor = predictor
        self.alloc = PageAllocator(pool_pages, cfg.page_size)
        self.log = log
        self.stats = stats
        self.flush = FlushWrapper(env, self, flush_semantics, log)
        self.load_tokens = 0  # what total_tokens DP balancing reads
        self._idle_waiters: list[simpy.Event] = []
        self._wake = env.event()
        self.halted = False  # a stalled or dead process: no steps until resume()
        self._resumed: simpy.Event | None = None

    # --- idle tracking (SchedulerFlushWrapper re-checks when queues shrink) -----------------

    def is_fully_idle(self) -> bool:
        raise NotImplementedError

    def busy_summary(self) -> str:
        raise NotImplementedError

    def idle_event(self) -> simpy.Event:
        ev = self.env.event()
        self._idle_waiters.append(ev)
        return ev

    def _maybe_idle(self) -> None:
        if self._idle_waiters and self.is_fully_idle():
            waiters, self._idle_waiters = self._idle_waiters, []
            for ev in waiters:
                ev.succeed()

    def _kick(self) -> None:
        if not self._wake.triggered:
            self._wake.succeed()

    def _sleep(self) -> simpy.Event:
        self._wake = self.env.event()
        return self._wake

    def flush_now(self, how: str) -> None:
        raise NotImplementedError

    def halt(self) -> None:
        """Stop stepping (a hang or a crash) until :meth:`resume`."""
        if not self.halted:
            self.halted = True
            self._resumed = self.env.event()

    def resume(self) -> None:
        if self.halted:
            self.halted = False
            ev, self._resumed = self._resumed, None
            ev.succeed()
            self._kick()

    def flush_state(self) -> str:
        """``idle`` or ``busy (queue sizes)``, as the flush log and timeline show it."""
        return "idle" if self.is_fully_idle() else f"busy ({self.busy_summary()})"

    # --- stepping: alone, or in lockstep with the server's other ranks (pdsim.lockstep) ----

    def plan_step(self) -> tuple | None:
        raise NotImplementedError

    def step_time(self, plan: tuple) -> float:
        raise NotImplementedError

    @staticmethod
    def combine(plans: list[tuple], n_ranks: int) -> tuple:
        """The plan of one rank equivalent to ``plans`` run in lockstep over ``n_ranks``."""
        raise NotImplementedError

    def commit_step(self, plan: tuple) -> None:
        raise NotImplementedError

    def run_alone(self) -> Generator:
        """One scheduler loop: one event per batch step."""
        env, rec = self.env, self.recorder
        while True:
            if self.halted:
                yield self._resumed
                continue
            plan = self.plan_step()
            if plan is None:
                yield self._sleep()
                continue
            t0 = env.now
            yield env.timeout(self.step_time(plan))
            self.commit_step(plan)
            if rec is not None:
                rec.step(self, t0, env.now, plan)

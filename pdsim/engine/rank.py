"""What prefill and decode DP ranks share: identity, KV pool, idle tracking and flush."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import count

import simpy

from pdsim.config.fleet import DecodeConfig, PrefillConfig
from pdsim.engine.flush import FlushWrapper
from pdsim.engine.kv import PageAllocator
from pdsim.engine.log import EventLog
from pdsim.engine.stats import Stats
from pdsim.model.predictor import Predictor


class _Awake:
    """The wake-up event of a rank no stepper waits on through SimPy (a solo stepper's rank,
    woken by :attr:`Rank._waker` instead): always triggered, so ``_kick`` passes it by."""

    triggered = True


AWAKE = _Awake()


class Rank:
    role = "rank"
    SPANS = False  # whether span_steps may exceed 1 (a solo stepper skips the call if not)
    # What every rank holds, as slots: CPython 3.11 reads an instance's attributes from its
    # inline values only while its class's instances have fewer than 30 names (past that,
    # each read is a dict look-up); a role's own attributes are its own slots, or in its
    # instances' dicts.
    __slots__ = ("env", "server", "index", "name", "cfg", "predictor", "alloc", "log", "stats",
                 "flush", "load_tokens", "_idle_waiters", "_wake", "halted", "_resumed",
                 "_waker", "recorder", "stepper", "_mods", "spans", "_holds")

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
        self._wake = AWAKE  # (its stepper sets it: AWAKE for a solo rank, a _RankWake in a group)
        self.halted = False  # a stalled or dead process: no steps until resume()
        self._holds = 0  # the faults holding it halted (halts not yet resumed)
        self._resumed: simpy.Event | None = None
        # a solo stepper asleep on this rank: its wake-up link (pdsim.engine.clock.Link)
        self._waker = None
        self.recorder = None  # a Recorder (pdsim.engine.recorder) when the run records its steps
        self.stepper = None  # the Stepper (pdsim.engine.lockstep) running this rank's steps
        self._mods = 0  # times _changed() was called (a lockstep group's cached span ends check it)
        # (the class's flag as the instance's own: CPython 3.11 reads a class attribute through
        # an instance ~2.5x slower, its loads not specialised)
        self.spans = type(self).SPANS

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

    def _kick(self, last: bool = False) -> None:
        """Wake the stepper. ``last``: this is the last act of its simulation step, so with
        nothing else due this instant a solo stepper's wake-up link would be processed next,
        nothing between: it plans at once (pdsim.engine.clock's "nothing else is due" rule)."""
        waker = self._waker
        if waker is not None:  # a plain link where the wake-up event would be scheduled
            self._waker = None
            env = self.env
            if last and not env.due_now():
                waker.callback()
            else:
                env.link(waker)  # (what waker() does)
        elif not self._wake.triggered:
            self._wake.succeed()

    def flush_now(self, how: str) -> None:
        raise NotImplementedError

    def halt(self) -> None:
        """Stop stepping (a hang or a crash) until :meth:`resume`: the step in flight is the
        last (a fast-forwarded span ends with it). Halts nest: a rank two faults hold (two
        overlapping hangs, a hang of a crashed server) steps again when both have ended."""
        self._holds += 1
        if not self.halted:
            self._catch_up()
            self.halted = True
            if self.stepper is not None:
                self.stepper.halted += 1
            self._resumed = self.env.event()
            self._changed()

    def resume(self) -> bool:
        """One halt ends; the rank steps again when none holds it (True: it resumed now)."""
        if not self._holds:
            return False
        self._holds -= 1
        if self._holds or not self.halted:
            return False
        self.halted = False
        if self.stepper is not None:
            self.stepper.halted -= 1
        ev, self._resumed = self._resumed, None
        ev.succeed()
        self._kick()
        return True

    def flush_state(self) -> str:
        """``idle`` or ``busy (queue sizes)``, as the flush log and timeline show it."""
        return "idle" if self.is_fully_idle() else f"busy ({self.busy_summary()})"

    # --- stepping: alone, or in lockstep with the server's other ranks (pdsim.engine.lockstep) ----

    def plan_step(self) -> tuple | None:
        raise NotImplementedError

    def step_time(self, plan: tuple) -> float:
        raise NotImplementedError

    @staticmethod
    def combine(plans: list[tuple], n_ranks: int) -> tuple:
        """The plan of one rank equivalent to ``plans`` run in lockstep over ``n_ranks``."""
        raise NotImplementedError

    def commit_step(self, plan: tuple) -> None:
        """The step planned as ``plan`` ended. A span's last step passes the span's first
        plan: ``plan[0]`` (what a commit reads) is the same in every step of a span."""
        raise NotImplementedError

    def span_steps(self, limit: int) -> int:
        """Steps (1..``limit``), the next one first, after which this rank's plan would first
        differ from the current one's continuation (see ``nth_plan``). 1: plan every step."""
        return 1

    def nth_plan(self, plan: tuple, i: int) -> tuple:
        """The plan of the ``i``-th step of a span whose first step had ``plan``."""
        raise NotImplementedError

    def span_durations(self, plans: list[tuple], n_ranks: int) -> Iterator[float]:
        """The durations of a span's steps 1, 2, ... that began with ``plans`` (this rank's,
        or with ``n_ranks`` > 0 the live ranks' of a lockstep group): each step's
        ``step_time`` of its own plan (``nth_plan``, ``combine``d over the group)."""
        for i in count(1):
            ps = plans if i == 1 else [self.nth_plan(p, i) for p in plans]
            yield self.step_time(self.combine(ps, n_ranks) if n_ranks else ps[0])

    def quiet_steps(self, n: int, plans: int | None = None) -> None:
        """Commit ``n`` inner steps of a span and count the plans after them, in bulk."""
        raise NotImplementedError

    def _catch_up(self) -> None:
        """Bring step-dependent state (tokens, KV growth) up to now, mid-span."""
        stepper = self.stepper
        if stepper is not None and (stepper._k > 1 or stepper._lazy):
            stepper.catch_up(self)

    def _changed_next(self) -> None:
        """``_changed`` for a change after which this rank's next plan differs whatever the
        steps ended since did (``span_steps`` says 1 from its queues alone): the step in
        flight becomes the span's last, and the rank need not be caught up first."""
        self._mods += 1
        stepper = self.stepper
        if stepper is not None:
            stepper.changes += 1
            if stepper._k > 1:
                stepper.cut()

    def _changed(self) -> None:
        """This rank's queues or pages changed: a span may have to end sooner."""
        self._mods += 1
        stepper = self.stepper
        if stepper is not None:
            stepper.changes += 1  # (a lazy group's span end checks it)
            if stepper._k > 1:
                stepper.interrupt(self)

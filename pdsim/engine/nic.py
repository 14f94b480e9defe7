"""A NIC shared by concurrent writes (fluid processor sharing).

Each active write progresses at ``line_rate * utilisation(size) / n_active``; the NIC keeps one
pending wake-up for the earliest finishing write and re-plans on every start and finish, so a
write costs a start and an end event, whatever its size.

A write reports its end either as a SimPy event (``write``: for processes that wait on it) or
to a listener's ``written()`` (``start``: the transfer engine's fast path, whose chunk
listens), which runs after the NIC has re-planned, where the worker that waited on the event
resumed. (A listener object, not a callback: no bound method per write.)
"""

from __future__ import annotations

from typing import Protocol

import simpy
from simpy.events import Event

from pdsim.engine.clock import soon


class Listener(Protocol):
    """What hears of a write's last byte on the fast path (pdsim.engine.transfer.Chunk)."""

    def written(self) -> None: ...


class NIC:
    def __init__(self, env: simpy.Environment, name: str, bytes_per_s: float,
                 peak_util: float, min_util: float, saturation_bytes: float) -> None:
        self.env = env
        self.name = name
        self.rate = bytes_per_s
        self.peak_util = peak_util
        self.min_util = min_util
        self.saturation = saturation_bytes
        self._active: dict[int, list] = {}  # id -> [remaining_bytes, cap_rate, event or callback]
        self._last = 0.0
        self._plan = 0
        self._next_id = 0
        self._factor = 1.0  # a degraded NIC runs at this fraction of its rate
        self._full = self.rate * self._factor * peak_util  # a write's cap at peak utilisation
        self.last = False  # a completion callback running now is its step's last act
        self._spare: list[_Finish] = []  # wake-ups that ran, for reuse (see ``_wake_at``)

    def utilisation(self, nbytes: float) -> float:
        """Share of line rate one write of this size reaches alone (small writes do worse)."""
        frac = nbytes / self.saturation
        if frac >= 1:
            return self.peak_util
        util = self.peak_util * frac  # (the larger of it and min_util; ``start`` inlines this)
        return util if util > self.min_util else self.min_util

    def write(self, nbytes: float) -> simpy.Event:
        """Start writing ``nbytes``; the event succeeds when the last byte is out."""
        ev = Event(self.env)
        ev.fid = self.start(nbytes, ev)
        return ev

    def start(self, nbytes: float, done: Listener | simpy.Event) -> int:
        """Start writing ``nbytes``; ``done`` (a listener's ``written()``, or an event) when
        the last byte is out. Returns the write's id (for ``cancel``)."""
        active = self._active
        idle = not active
        if idle:  # (what _advance does with no write active)
            self._last = self.env._now
        else:
            self._advance()
        fid = self._next_id
        self._next_id = fid + 1
        frac = nbytes / self.saturation
        if frac >= 1:  # (the usual: a write at least saturation bytes long reaches the peak)
            cap = self._full
        else:  # utilisation(nbytes), inline (its max as a comparison: the builtin costs ~7x)
            util = self.peak_util * frac
            cap = self.rate * self._factor * (util if util > self.min_util else self.min_util)
        active[fid] = flow = [float(nbytes), cap, done]
        if idle:  # (what _replan does for one write: it alone finishes first, at full share)
            self._plan = plan = self._plan + 1
            self._wake_at(flow[0] / flow[1], plan, fid)
        else:
            self._replan()
        return fid

    def cancel(self, write: simpy.Event | int) -> None:
        """Stop a write that gave up (timeout, dead peer): it no longer shares the NIC."""
        fid = write if isinstance(write, int) else getattr(write, "fid", -1)
        if fid in self._active:
            self._advance()  # progress so far was shared with this write
            del self._active[fid]
            self._replan()

    def scale(self, factor: float) -> None:
        """Run at ``factor`` of the line rate from now on (1.0: restored)."""
        self._advance()
        ratio = factor / self._factor
        self._factor = factor
        self._full = self.rate * factor * self.peak_util
        for flow in self._active.values():
            flow[1] *= ratio
        self._replan()

    def _advance(self) -> None:
        now = self.env._now
        dt = now - self._last
        self._last = now
        if dt <= 0 or not self._active:
            return
        n = len(self._active)
        for flow in self._active.values():
            flow[0] -= flow[1] / n * dt

    def _replan(self) -> None:
        """One wake-up for the write that finishes first at today's shares (earlier plans'
        wake-ups find themselves superseded)."""
        self._plan = plan = self._plan + 1
        active = self._active
        if not active:
            return
        n = len(active)
        items = iter(active.items())
        fid, flow = next(items)
        if n > 1:  # the first write with the least time left at its own rate (as min(key))
            least = flow[0] / flow[1]
            for f, other in items:
                left = other[0] / other[1]
                if left < least:
                    fid, flow, least = f, other, left
        delay = flow[0] / (flow[1] / n)
        if not delay > 0.0:  # max(0.0, delay), without the builtin's call (~7x the cost)
            delay = 0.0
        self._wake_at(delay, plan, fid)

    def _wake_at(self, delay: float, plan: int, fid: int) -> None:
        """The wake-up of plan ``plan`` for write ``fid``, in ``delay`` s: a _Finish that ran
        already if there is one (making an object costs ~3x reusing one; most plans are
        superseded before they are due, and a run makes ~1.5 a write)."""
        spare = self._spare
        if spare:
            wake = spare.pop()
            wake.plan, wake.fid = plan, fid
        else:
            wake = _Finish(self, plan, fid)
        self.env.timer(delay, wake)

    def _finish(self, fid: int) -> None:
        active = self._active
        if len(active) > 1:
            self._advance()
        # (else the finishing write was alone: _advance would only move its own bytes, which
        # go with it, and the clock mark, which the next start on an idle NIC sets again)
        done = active.pop(fid)[2]
        # writes that finish at the same instant (a loop: a list comprehension is a call)
        others = None
        if active:
            for k, f in active.items():
                if f[0] <= 1e-6:
                    if others is None:
                        others = [k]
                    else:
                        others.append(k)
        if others is None:  # (the usual case: one write ends)
            if isinstance(done, Event):
                done.succeed()
                self._replan()
            else:
                if active:
                    self._replan()
                else:  # (what _replan does with no write left)
                    self._plan += 1
                self.last = True  # the listener is the last thing this step does
                done.written()
                self.last = False
            return
        finished = [done]
        for other in others:
            finished.append(active.pop(other)[2])
        callbacks = []
        for done in finished:
            if isinstance(done, Event):
                done.succeed()
            else:
                callbacks.append(done.written)
        self._replan()
        mixed = len(callbacks) != len(finished)  # waiters on events resume two steps on
        for done in callbacks:
            if mixed:
                soon(self.env, done, 2)
            else:
                done()


class _Finish:
    """The NIC's wake-up for its earliest-finishing write (a plain timer entry)."""

    __slots__ = ("nic", "plan", "fid")

    def __init__(self, nic: NIC, plan: int, fid: int) -> None:
        self.nic, self.plan, self.fid = nic, plan, fid

    def tick(self) -> None:
        nic = self.nic
        if self.plan == nic._plan:  # (else superseded by a later start or finish)
            nic._finish(self.fid)
        nic._spare.append(self)  # (popped off the heap: nothing else holds it)

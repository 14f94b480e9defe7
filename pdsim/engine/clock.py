"""Scheduling with fewer SimPy events, in exactly SimPy's order.

SimPy processes events by (time, priority, id), the id drawn from one counter when an event is
scheduled. Within one instant that means: urgent events (process starts) first, then the
instant's *roots* (events scheduled at earlier times, in id order), then the zero-delay events
they cause, level after level (first in, first out). pdsim keeps the outputs of the
event-per-everything model byte-identical while scheduling far fewer events, with these
pieces:

- :class:`Environment` keeps batch-step ends (``pdsim.engine.lockstep.Stepper``), timers and urgent
  links as plain heap entries, and the other links of zero-delay chains in a FIFO of this
  instant's links, sorted among events under the ids their timeouts or triggered events would
  have drawn.
- :func:`reserve` / :func:`call_at`: an id taken now (where a timeout made now would sort)
  and a callback scheduled later under it.
- :func:`later` / :func:`soon` / :func:`urgent`: a callback one or more zero-delay steps later
  (where a chain of events, e.g. response event, condition, process resumption, would have run
  it), or where a process started now would run; :func:`urgent_pending`: whether one such
  start is due this instant (work standing for a process started now waits behind it).
- :func:`run_inline`: a generator driven as the process that used to ``yield from`` it.
- :func:`timer_at`, :class:`KeptDeadlines`, :class:`Relay`, :class:`Link`: the per-request
  path's entries (a timer under a reserved id; fixed-timeout deadlines carried by the items
  an owner keeps anyway, one timer pending per owner, each deadline firing under the id its
  own timeout would have had; reusable targets of zero-delay links, no object per call). The
  transfer engine's write deadlines, whose timeouts vary with the bytes, keep the same rule
  by hand (``pdsim.engine.transfer.TransferEngine._arm``).

The "nothing else is due" rule: a zero-delay link that is the last act of the step making it
would be processed next, with nothing in between, when neither heap nor the FIFO of links holds
anything else for this instant; its work then runs at once and no id is drawn for it (ids only
order entries, so skipping one moves nothing). :class:`_Chain`, the per-request path (``Room``,
the router's call, the transfer engine's write end, the client's slots) and
``Rank._kick(last=True)`` use it, each through :meth:`Environment.due_now`; whatever runs code
that might read the heaps or the FIFO for it keeps them complete first (see
``KeptDeadlines._fire``). tests/test_clock.py checks the primitives against SimPy;
tests/test_properties.py compares random scenarios run with the rule on and off (``due_now``
always true: every such link queued as its event would have been).

They use SimPy 4's scheduling internals (``Environment._queue`` entries
``(time, priority, id, event)``, the ``_eid`` counter, ``Event._ok/_value/callbacks``);
tests/test_sim_speed.py checks that contract. Those internals are private, so pdsim supports
only the SimPy releases it was verified on (:data:`SIMPY_SUPPORTED`, pinned in pyproject.toml):
importing this module under another raises one ImportError line saying so
(:func:`check_simpy`), rather than simulating wrongly or failing deep in a run.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator
from heapq import heappop, heappush
from itertools import count
from math import inf as INF

import simpy
from simpy.core import EmptySchedule, StopSimulation
from simpy.events import NORMAL, URGENT, Event, Timeout

# SimPy releases whose scheduling internals this module was verified against (4.1.2 installed
# when the pin was made): major.minor, and the pip requirement that says the same.
SIMPY_SUPPORTED = ((4, 1), "simpy>=4.1,<4.2")


def check_simpy(version: str) -> None:
    """Raise ImportError (one line, ``name="simpy"``) unless SimPy ``version`` is one this
    module supports: it reads SimPy's private event queue, and another release may order or
    store events differently (outputs would change, or a run would fail midway)."""
    (major, minor), requirement = SIMPY_SUPPORTED
    try:
        got = tuple(int(p) for p in version.split(".")[:2])
    except ValueError:
        got = ()
    if got != (major, minor):
        raise ImportError(f"pdsim needs SimPy {major}.{minor}.x ({requirement}), found "
                          f"{version}: pdsim.engine.clock relies on SimPy {major}.{minor}'s "
                          f"private scheduling internals (Environment._queue, _eid); run: "
                          f"pip install '{requirement}'", name="simpy")


check_simpy(simpy.__version__)


class Environment(simpy.Environment):
    """SimPy's environment plus a heap of plain entries: batch-step ends and zero-delay
    callbacks.

    An entry is ``(time, priority, id, obj)``, its id drawn from SimPy's own counter when it is
    scheduled, as an event's would be; ``step`` takes whichever of the two heaps has the
    smaller key next and calls ``obj.tick()``, so the entry sorts among events exactly where
    its timeout (a step end) or triggered event (a link of a zero-delay chain) would have,
    without an event object, its callbacks or a process to resume. A link (``link``) is not
    on the heap: its key would be (now, normal, an id larger than any drawn before), so the
    instant's links are a FIFO (``_links``) whose front comes next unless a heap's front is
    due now under a smaller key; the loop, ``due_now``, ``peek`` and the inner steps of a
    batch step (``pdsim.engine.lockstep.Stepper.tick``) read it too.
    """

    def __init__(self, initial_time: float = 0) -> None:
        super().__init__(initial_time)
        self._steps: list = []
        # What the ids drawn name is counted where it is rare, not per plain entry (an entry
        # is most of what a run schedules; see ``counts``): SimPy events, and ids reserved
        # that name nothing (yet).
        self.events = 0  # SimPy events scheduled (``schedule``, ``call_at``)
        self.reserved = 0  # ids drawn that name no event or entry (see ``reserve``)
        # when SimPy's queue's front is due (inf: empty). Kept where the queue changes, which
        # is rare (``schedule``, ``call_at``, an event processed), so that the loop and
        # ``due_now``, which read it per entry, compare one float
        self._queue_at = INF
        # this instant's links, ``(id, obj, now)``, in the order they were made: a link sorts at
        # (now, NORMAL, its id), after everything already due now under a smaller id, so the
        # links of one instant are processed first in, first out, and none is left when the
        # clock moves on (``link``: a deque append and popleft instead of a heap push and pop)
        # (``now`` as it was when the link was made: processing it sets the clock to that, as
        # a heap entry's pop does; the same value, and the same type: SimPy's instants are
        # ints until a float delay makes them floats, and outputs keep that type)
        self._links: deque = deque()

    def schedule(self, event: Event, priority: int = NORMAL, delay: float = 0) -> None:
        """SimPy's ``schedule`` (the same heap entry), counting the event."""
        self.events += 1
        queue = self._queue
        heappush(queue, (self._now + delay, priority, next(self._eid), event))
        self._queue_at = queue[0][0]

    def step_at(self, when: float, stepper: object) -> None:
        """``stepper.tick()`` at ``when`` (>= now), in the place a timeout made now would take."""
        heappush(self._steps, (when, NORMAL, next(self._eid), stepper))

    def timer(self, delay: float, obj: object) -> None:
        """``obj.tick()`` in ``delay`` s, where a timeout made now would be processed."""
        heappush(self._steps, (self._now + delay, NORMAL, next(self._eid), obj))

    def link(self, obj: object) -> None:
        """``obj.tick()`` in this instant, where an event triggered now would be processed
        (``_links``; an urgent one: :func:`urgent`)."""
        self._links.append((next(self._eid), obj, self._now))

    def _link_next(self) -> bool:
        """Whether the front of ``_links`` (not empty) is what comes next: neither heap's
        front is due now under a smaller key (an urgent one, or a normal one drawn before
        it). ``run`` inlines this."""
        eid, now = self._links[0][0], self._now
        steps = self._steps
        if steps and steps[0][0] == now and (steps[0][1] < NORMAL or steps[0][2] < eid):
            return False
        queue = self._queue
        return not (self._queue_at == now and (queue[0][1] < NORMAL or queue[0][2] < eid))

    def step(self) -> None:
        if self._links and self._link_next():
            _eid, obj, self._now = self._links.popleft()
            obj.tick()
            return
        steps = self._steps
        # (ids differ: no objects compared; the times first, as a float compare, where the
        # tuples' compare would test their times for equality and then for order)
        if steps and (steps[0][0] < self._queue_at
                      or (steps[0][0] == self._queue_at and steps[0] < self._queue[0])):
            when, _prio, _eid, obj = heappop(steps)
            self._now = when
            obj.tick()
            return
        try:
            super().step()
        finally:
            queue = self._queue
            self._queue_at = queue[0][0] if queue else INF

    def run(self, until: object = None) -> object:
        """SimPy's ``run``: with an ``until`` event, one loop over both heaps (what ``step``
        does, inlined: the same entries in the same order, without a call per entry)."""
        if not isinstance(until, Event) or until.callbacks is None:
            return super().run(until)
        until.callbacks.append(StopSimulation.callback)
        steps, queue, links = self._steps, self._queue, self._links
        try:
            while True:
                if links:  # (``_link_next``, inline)
                    eid, now = links[0][0], self._now
                    if not ((steps and steps[0][0] == now
                             and (steps[0][1] < NORMAL or steps[0][2] < eid))
                            or (self._queue_at == now
                                and (queue[0][1] < NORMAL or queue[0][2] < eid))):
                        _eid, obj, self._now = links.popleft()
                        obj.tick()
                        continue
                # (as ``step``: the times first)
                if steps and (steps[0][0] < self._queue_at
                              or (steps[0][0] == self._queue_at and steps[0] < queue[0])):
                    self._now, _prio, _eid, obj = heappop(steps)
                    obj.tick()
                    continue
                if not queue:
                    raise EmptySchedule
                self._now, _prio, _eid, event = heappop(queue)
                self._queue_at = queue[0][0] if queue else INF
                callbacks, event.callbacks = event.callbacks, None
                try:
                    for callback in callbacks:
                        callback(event)
                except StopSimulation:  # as SimPy: the rest run when the run resumes
                    event.callbacks = callbacks[callbacks.index(callback) + 1:]
                    self.schedule(event, -1)
                    raise
                if not event._ok and not hasattr(event, "_defused"):
                    exc = type(event._value)(*event._value.args)
                    exc.__cause__ = event._value
                    raise exc
        except StopSimulation as stop:
            return stop.args[0]
        except EmptySchedule:
            raise RuntimeError(f'No scheduled events left but "until" event was not '
                               f"triggered: {until}") from None

    def due_now(self) -> bool:
        """Whether either heap, or the FIFO of links, holds an entry for this instant. When
        not, a zero-delay link that is the last act of the step making it would be processed
        next, with nothing in between, so its work may run at once (the run-now rule, module
        docstring)."""
        now = self._now
        if self._queue_at == now or self._links:
            return True
        steps = self._steps
        if steps and steps[0][0] == now:
            return True
        return False

    def peek(self) -> float:
        if self._links:
            return self._links[0][2]
        t = super().peek()
        return min(t, self._steps[0][0]) if self._steps else t

    def next_is(self, event: Event) -> bool:
        """Whether ``event`` (scheduled) is what the environment processes next."""
        queue = self._queue
        if not (queue and queue[0][3] is event) or (self._steps and self._steps[0] < queue[0]):
            return False
        links = self._links
        return not (links and queue[0] > (self._now, NORMAL, links[0][0]))


class _Chain:
    """A chain of zero-delay links ending in a callback (see :func:`soon`)."""

    __slots__ = ("env", "callback", "steps")

    def __init__(self, env: Environment, callback: Callable[[], None], steps: int) -> None:
        self.env, self.callback, self.steps = env, callback, steps

    def tick(self) -> None:
        self.steps -= 1
        if self.steps > 0:
            env = self.env
            if env.due_now():
                env.link(self)
                return
            # nothing else is due this instant: the rest of the chain would run next, link
            # after link, with nothing in between, so its callback runs now
        self.callback()


class _Timer:
    """A heap entry whose ``tick`` is the callback itself (a timer, or a one-link chain)."""

    __slots__ = ("tick",)

    def __init__(self, callback: Callable[[], None]) -> None:
        self.tick = callback


def call_later(env: simpy.Environment, delay: float, callback: Callable[[], None]) -> None:
    """Run ``callback`` in ``delay`` s, where a ``Timeout(env, delay)`` made now with this one
    callback would have run it (a plain heap entry on :class:`Environment`)."""
    if isinstance(env, Environment):
        env.timer(delay, _Timer(callback))
    else:
        Timeout(env, delay).callbacks.append(lambda _e: callback())


def later(env: simpy.Environment, callback: Callable[[], None], steps: int) -> None:
    """Run ``callback`` where a chain of ``steps`` zero-delay events (an event whose
    processing triggers the next) would have run it (:func:`soon`)."""
    soon(env, callback, steps)


def soon(env: simpy.Environment, callback: Callable[[], None], steps: int = 1) -> None:
    """Run ``callback`` ``steps`` zero-delay steps from now: where a chain of that many
    triggered events would have run it, behind everything already scheduled for this instant.
    ``steps`` 0 runs it now. On :class:`Environment` each link is an entry of this instant's
    FIFO under the id its event would have drawn, so the order is SimPy's, at a fraction of
    the cost."""
    if steps <= 0:
        callback()
        return
    if isinstance(env, Environment):
        env.link(_Timer(callback) if steps == 1 else _Chain(env, callback, steps))
        return
    ev = Event(env)
    ev.callbacks.append(lambda _e: soon(env, callback, steps - 1))
    ev.succeed()


def urgent(env: simpy.Environment, callback: Callable[[], None]) -> None:
    """Run ``callback`` in a zero-delay step ahead of this instant's normal events, where a
    process started now would have run (SimPy starts processes with urgent priority)."""
    if isinstance(env, Environment):  # (on the step heap: ahead of the instant's links)
        heappush(env._steps, (env._now, URGENT, next(env._eid), _Timer(callback)))
        return
    ev = Event(env)
    ev._ok = True
    ev._value = None
    ev.callbacks.append(lambda _e: callback())
    env.schedule(ev, URGENT)


def urgent_pending(env: simpy.Environment) -> bool:
    """Whether an urgent entry (a process starting, or :func:`urgent`'s callback) is due this
    instant: then work that stands for a process started now (a handler the router would have
    started) must wait for it, behind it (``urgent``)."""
    now = env._now
    if isinstance(env, Environment):
        steps = env._steps
        if steps and steps[0][1] == URGENT and steps[0][0] == now:
            return True
        return env._queue_at == now and env._queue[0][1] == URGENT
    queue = env._queue
    return bool(queue) and queue[0][0] == now and queue[0][1] == URGENT


def run_inline(gen: Generator, then: Callable[[object], None]) -> None:
    """Drive ``gen`` as the process that ran it inline (``yield from``) did: its first step
    now, each later one when the event it yielded is processed, then ``then(result)`` in that
    same step."""

    def resume(value: object = None) -> None:
        while True:
            try:
                event = gen.send(value)
            except StopIteration as stop:
                then(stop.value)
                return
            if event.callbacks is not None:  # not processed yet: resume when it is
                event.callbacks.append(lambda ev: resume(ev._value))
                return
            value = event._value  # already processed: go on at once, as a process would


    resume()


def reserve(env: simpy.Environment) -> int:
    """An event id taken now: where a timeout scheduled now would sort among same-time events."""
    try:
        env.reserved += 1
    except AttributeError:  # a plain SimPy environment (unit tests)
        env.reserved = 1
    return next(env._eid)


def reserve_block(env: simpy.Environment, n: int) -> int:
    """``n`` consecutive event ids taken now (as :func:`reserve` n times); returns the first."""
    first = next(env._eid)
    env._eid = count(first + n)
    env.reserved = getattr(env, "reserved", 0) + n
    return first


def reserved(env: simpy.Environment) -> int:
    """Ids drawn that name no scheduled event (they count in SimPy's counter)."""
    return getattr(env, "reserved", 0)


def call_at(env: simpy.Environment, when: float, callback: Callable[[Event], None],
            eid: int | None = None) -> Event:
    """Schedule ``callback`` at the absolute time ``when`` (>= now), under the event id ``eid``
    (from :func:`reserve`) or a fresh one. Returns the (already triggered) event."""
    ev = Event(env)
    ev._ok = True
    ev._value = None
    ev.callbacks.append(callback)
    if eid is None:
        eid = next(env._eid)
    else:
        env.reserved -= 1  # the reserved id now names a scheduled event
    heappush(env._queue, (when, NORMAL, eid, ev))
    if isinstance(env, Environment):
        env.events += 1
        env._queue_at = env._queue[0][0]
    return ev


def counts(env: simpy.Environment) -> tuple[int, int]:
    """(SimPy events, plain heap entries) that ``env`` scheduled: every id drawn names one of
    them or a reservation still unused. Draws an id: for a run that is over."""
    drawn = next(env._eid)
    if not isinstance(env, Environment):
        return drawn - reserved(env), 0
    return env.events, drawn - env.reserved - env.events


# --- helpers of the per-request path --------------------------------------------------------


def timer_at(env: Environment, when: float, obj: object, eid: int) -> None:
    """``obj.tick()`` at ``when`` (>= now) under the id ``eid`` taken by :func:`reserve` (or
    :func:`reserve_block`): where ``call_at(env, when, ..., eid)`` would run its callback, as a
    plain heap entry instead of an event."""
    env.reserved -= 1  # the reserved id now names a scheduled entry
    heappush(env._steps, (when, NORMAL, eid, obj))


class Relay:
    """A reusable target of zero-delay links: ``relay(arg)`` runs ``callback(arg)`` one
    zero-delay step later, as ``soon(env, lambda: callback(arg))`` would, without an object
    per call. The links of one relay all sort at the current instant with one priority, so
    they are processed in the order they were made: a FIFO of arguments says whose turn it is.
    """

    __slots__ = ("env", "callback", "args")

    def __init__(self, env: Environment, callback: Callable[[object], None]) -> None:
        self.env, self.callback, self.args = env, callback, deque()

    def __call__(self, arg: object) -> None:
        self.args.append(arg)
        self.env.link(self)

    def tick(self) -> None:
        self.callback(self.args.popleft())


class KeptDeadlines:
    """Deadlines of one fixed timeout (they fall due in the order they started), with no entry
    per deadline: each item carries its own.

    An item's deadline is two of its own fields (named by ``at`` and ``eid``): when it falls
    due and the id its timeout would have drawn when it started (reserved then, as
    :func:`reserve`). The items are found in the order their deadlines started, oldest first,
    in ``kept()``: a collection the owner keeps anyway (a rank's dict of requests waiting for
    something, in insertion order), or, with ``kept`` None, this object's own FIFO. One timer
    is pending, under the earliest live item's id, so each deadline that matters fires exactly
    where its own timeout would have; an item that leaves the owner's collection, or stops
    being live, costs nothing more (items must not become live again).

    ``start(item)`` starts a deadline now; an owner whose ``kept()`` holds the item calls it
    right after inserting the item there, so that collection's order is the deadlines'.
    """

    __slots__ = ("env", "timeout", "live", "expire", "at", "eid", "kept", "items", "armed",
                 "_front")

    def __init__(self, env: Environment, timeout: float, live: Callable[[object], bool],
                 expire: Callable[[object], None], at: str, eid: str,
                 kept: Callable[[], object] | None = None) -> None:
        self.env = env
        self.timeout = timeout
        self.live = live
        self.expire = expire
        self.at, self.eid = at, eid  # the items' field names
        self.kept = kept  # () -> the owner's items, oldest deadline first (None: ``items``)
        self.items: deque = deque()  # (kept None) the items, oldest deadline first
        self.armed = False  # a timer is pending (for ``_front``)
        self._front: object = None  # the item the pending timer is for

    def clear(self) -> None:
        """Forget the items this object holds: its own FIFO's (``kept`` None) and the armed
        one (an owner's ``kept()`` collection is the owner's to drop). Only for a run that is
        over (its armed timer must not fire any more): ``pdsim.engine.fleet.Fleet.release``."""
        self.items.clear()
        self._front = None

    def start(self, item: object) -> tuple[float, int]:
        """Start ``item``'s deadline now (where ``env.timeout(timeout)`` would be created).
        Returns its two fields, (when it falls due, the id reserved for it), which the caller
        stores in the item at once (``req.boot_at, req.boot_eid = deadlines.start(req)``:
        cheaper than setting fields by name here, on the per-request path)."""
        env = self.env
        env.reserved += 1  # (reserve, inline: this is the per-request path)
        at, eid = env._now + self.timeout, next(env._eid)
        if self.kept is None:
            self.items.append(item)
        if not self.armed:
            self._arm(item, at, eid)
        return at, eid

    def arm(self, item: object) -> None:
        """Arm the timer for ``item``'s deadline (the earliest live one), under its id."""
        self._arm(item, getattr(item, self.at), getattr(item, self.eid))

    def _arm(self, item: object, at: float, eid: int) -> None:
        """The timer is an event in SimPy's queue (``call_at``), not an entry of the step
        heap: it is due a timeout (minutes) ahead, and an entry that far ahead would sit in
        the heap that every batch step and timer of the run goes through, making each
        push and pop compare more (the same key in either heap, so the same order)."""
        self.armed = True
        self._front = item
        call_at(self.env, at, self._fire, eid)

    def _fire(self, _ev: Event) -> None:
        """The pending timer fired: the next live item's timer goes on the heap first (so that
        while ``expire`` runs the heaps show everything due this instant: the run-now rule
        reads them), then the item expires if it is still live."""
        item, self._front, self.armed = self._front, None, False
        due = self.live(item)
        live = self.live
        if self.kept is None:
            items = self.items
            items.popleft()  # (the front: items before it were dropped when it was armed)
            while items and not live(items[0]):
                items.popleft()
            if items:
                self.arm(items[0])
        else:  # items started after this one, in order: the first live one
            fired, name = getattr(item, self.eid), self.eid
            for other in self.kept():
                if getattr(other, name) > fired and live(other):
                    self.arm(other)
                    break
        if due:
            self.expire(item)


class Link:
    """A reusable target of zero-delay links: ``link()`` runs ``callback()`` one zero-delay
    step later, as ``soon(env, callback)`` would, without an object per call."""

    __slots__ = ("env", "callback")

    def __init__(self, env: Environment, callback: Callable[[], None]) -> None:
        self.env, self.callback = env, callback

    def __call__(self) -> None:
        self.env.link(self)

    def tick(self) -> None:
        self.callback()

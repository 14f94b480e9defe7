"""pdsim.engine.clock against SimPy itself: every shortcut processes callbacks in SimPy's order.

pdsim.engine.clock replaces SimPy events with plain heap entries (timers, zero-delay links, reserved
ids, deadlines carried by their items, the run-now rule) and promises the order SimPy would
have given. These tests run random programs of callbacks twice, once with pdsim.engine.clock's
primitives and once written with plain SimPy events (timeouts, triggered events, processes),
and compare the order and times in which the callbacks ran. Integer delays of 0-2 s make many
callbacks share an instant, where only the (time, priority, id) order decides. A primitive
that drew its id at another moment, skipped an entry that something else was due beside, or
ran a chain's callback early would reorder them.
"""

from __future__ import annotations

import itertools

import simpy
from hypothesis import example, given, settings
from hypothesis import strategies as st
from simpy.events import Event, Timeout

from pdsim.engine import clock
from pdsim.engine.transfer import Chunk, TransferEngine

KINDS = ("timer", "call_later", "step_at", "link", "urgent", "soon", "reserved_timer",
         "reserved_call", "relay", "link_obj", "tail", "kept", "kept_fifo", "write")

# a program: a tree of callbacks; a node runs (is logged), then schedules its children with
# each child's kind (its delay: seconds, chain length, deadline timeout), in order
def _node(children):
    return st.tuples(st.sampled_from(KINDS), st.integers(0, 2), st.integers(0, 3), children)


programs = st.lists(_node(st.recursive(st.just([]), lambda kids: st.lists(_node(kids),
                                                                           max_size=3),
                                       max_leaves=12)), min_size=1, max_size=5)

HORIZON = 40.0


class _Tick:
    __slots__ = ("fn",)

    def __init__(self, fn):
        self.fn = fn

    def tick(self):
        self.fn()


class _World:
    """Runs a program and logs (time, node number) as each node's callback runs."""

    def __init__(self, env):
        self.env = env
        self.log: list[tuple[float, int]] = []
        self.numbers: dict[int, int] = {}

    def number(self, program):
        """Number the nodes in the order they are written (the same in both worlds)."""
        stack = list(reversed(program))
        while stack:
            n = stack.pop()
            self.numbers[id(n)] = len(self.numbers)
            stack.extend(reversed(n[3]))

    def fire(self, n):
        self.log.append((self.env.now, self.numbers[id(n)]))
        kids = n[3]
        tail = kids[-1] if kids and kids[-1][0] == "tail" else None
        late = [f for f in (self.schedule(c) for c in (kids[:-1] if tail else kids))
                if f is not None]
        for finish in late:  # (reserved ids used after the siblings drew theirs)
            finish()
        if tail is not None:  # a zero-delay link as the step's last act
            self.schedule_tail(tail)

    def schedule_tail(self, n):
        self.schedule(n)

    def alive(self, n, born):
        """A deadline's item stays live for ``extra`` s (its third field) after it was added:
        some expire, some resolve first, some resolve exactly when their deadline falls."""
        return self.env.now < born + n[2]


class _Reference(_World):
    """The same program written with plain SimPy events."""

    def schedule(self, n):
        env, kind, d, k = self.env, n[0], n[1], n[2]
        fire = self.fire
        if kind in ("timer", "call_later", "step_at", "reserved_timer", "reserved_call"):
            Timeout(env, d).callbacks.append(lambda _e: fire(n))
        elif kind in ("link", "relay", "link_obj", "tail"):
            ev = Event(env)
            ev.callbacks.append(lambda _e: fire(n))
            ev.succeed()
        elif kind == "urgent":  # where a process started now runs its first step
            def proc():
                fire(n)
                yield from ()
            env.process(proc())
        elif kind == "soon":  # a chain of k triggered events, the callback in the last
            if k == 0:
                fire(n)
                return None

            def link(left):
                ev = Event(env)
                ev.callbacks.append(lambda _e: link(left - 1) if left > 1 else fire(n))
                ev.succeed()
            link(k)
        elif kind in ("kept", "kept_fifo", "write"):
            # a timeout per item (a write's: its own length), acting if it is still live
            born = env.now
            Timeout(env, d if kind == "write" else 1).callbacks.append(
                lambda _e: fire(n) if self.alive(n, born) else None)
        return None


class _Item:
    """An item carrying its own deadline (pdsim.engine.clock.KeptDeadlines), as a request does."""

    __slots__ = ("n", "born", "at", "eid")

    def __init__(self, n, born):
        self.n, self.born = n, born


class _Write(Chunk):
    """A KV write whose deadline the transfer engine keeps (pdsim.engine.transfer), as in a test."""

    __slots__ = ("n", "born", "key")


class _End:
    """A write's bytes all out (it stops being pending), as the NIC's completion would."""

    def __init__(self, engine, w):
        self.engine, self.w = engine, w

    def tick(self):
        self.w.state = -1  # (not pending)
        del self.engine.writing[self.w.key]


class _Clock(_World):
    """The same program with pdsim.engine.clock's primitives."""

    def __init__(self, env):
        super().__init__(env)
        self.relay = clock.Relay(env, self.fire)
        # KeptDeadlines: items in an owner's dict (which drops items once they are not live,
        # as a rank drops requests), and items in the deadlines' own FIFO
        self.owned: dict[int, _Item] = {}
        live = lambda it: self.alive(it.n, it.born)  # noqa: E731
        self.kept = clock.KeptDeadlines(env, 1.0, live, lambda it: self.fire(it.n), "at",
                                        "eid", lambda: self.owned.values())
        self.kept_fifo = clock.KeptDeadlines(env, 1.0, live, lambda it: self.fire(it.n), "at",
                                             "eid")
        # the transfer engine's write deadlines (variable timeouts: they overtake each other),
        # on an engine holding only what that rule reads
        self.engine = engine = TransferEngine.__new__(TransferEngine)
        engine.env, engine.writing, engine._front = env, {}, None
        engine._timed_out = self._write_timed_out
        self.keys = itertools.count()

    def _write_timed_out(self, w):
        w.state = -1  # (as the engine's _timed_out: no longer pending)
        self.fire(w.n)

    def fire(self, n):
        for key in [k for k, it in self.owned.items() if not self.alive(it.n, it.born)]:
            del self.owned[key]
        super().fire(n)

    def schedule(self, n):
        env, kind, d, k = self.env, n[0], n[1], n[2]
        fire = self.fire
        if kind == "timer":
            env.timer(d, _Tick(lambda: fire(n)))
        elif kind == "call_later":
            clock.call_later(env, d, lambda: fire(n))
        elif kind == "step_at":
            env.step_at(env.now + d, _Tick(lambda: fire(n)))
        elif kind == "link":
            env.link(_Tick(lambda: fire(n)))
        elif kind == "urgent":
            clock.urgent(env, lambda: fire(n))
        elif kind == "soon":
            clock.soon(env, lambda: fire(n), k)
        elif kind == "reserved_timer":
            eid, when = clock.reserve(env), env.now + d
            return lambda: clock.timer_at(env, when, _Tick(lambda: fire(n)), eid)
        elif kind == "reserved_call":
            eid, when = clock.reserve(env), env.now + d
            return lambda: clock.call_at(env, when, lambda _e: fire(n), eid)
        elif kind == "kept":
            item = self.owned[len(self.log) * 1000 + len(self.owned)] = _Item(n, env.now)
            item.at, item.eid = self.kept.start(item)
        elif kind == "write":
            w = _Write.__new__(_Write)
            w.n, w.born, w.key = n, env.now, next(self.keys)
            w.state, w.dl_at, w.dl_eid, w.dl_armed = 0, 0.0, -1, False  # (pending)
            self.engine.writing[w.key] = w
            env.timer(k, _End(self.engine, w))  # it ends k s on (before a deadline then)
            self.engine._start_deadline(w, d)
        elif kind == "kept_fifo":
            item = _Item(n, env.now)
            item.at, item.eid = self.kept_fifo.start(item)
        elif kind == "relay":
            self.relay(n)
        elif kind in ("link_obj", "tail"):  # (a tail not last in its step: a plain link)
            clock.Link(env, lambda: fire(n))()
        return None

    def schedule_tail(self, n):
        """The run-now rule as the per-request path applies it (router, transfer, client):
        nothing else due this instant, so the link's work runs at once."""
        if self.env.due_now():
            clock.Link(self.env, lambda: self.fire(n))()
        else:
            self.fire(n)


def _run(world_type, env, program, stepwise=False):
    w = world_type(env)
    w.number(program)
    for n in program:  # the roots start together at t = 0, each in its own process
        env.process(_start(w, n))
    if stepwise:  # Environment.step, one entry at a time
        while env.peek() < HORIZON:
            env.step()
    else:  # Environment.run's inlined loop over both heaps
        env.run(until=env.timeout(HORIZON))
    return w.log


def _start(w, n):
    late = w.schedule(n)
    if late is not None:
        late()
    yield from ()


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(programs)
# two deadlines due together, the first expiring into a tail link: the second's timer must be
# on the heap while the first expires, or the tail would run ahead of it
@example([("kept", 0, 2, [("tail", 0, 0, [])]), ("kept", 0, 2, [])])
@example([("kept_fifo", 0, 2, [("tail", 0, 0, [])]), ("kept_fifo", 0, 2, [])])
@example([("write", 1, 2, [("tail", 0, 0, [])]), ("write", 1, 2, [])])
def test_clock_primitives_run_callbacks_in_simpys_order(program):
    want = _run(_Reference, simpy.Environment(), program)
    assert _run(_Clock, clock.Environment(), program) == want
    assert _run(_Clock, clock.Environment(), program, stepwise=True) == want


def test_the_comparison_catches_a_chain_run_too_early(monkeypatch):
    """The comparison above can fail: a two-link chain started before a zero-delay timer
    runs its callback after the timer in SimPy (its second link is drawn after the timer's
    id). A clock whose run-now rule ignored the timer would run the chain first."""
    program = [("soon", 0, 2, []), ("timer", 0, 0, [])]
    want = _run(_Reference, simpy.Environment(), program)
    assert want == [(0, 1), (0, 0)]
    assert _run(_Clock, clock.Environment(), program) == want
    monkeypatch.setattr(clock.Environment, "due_now", lambda self: False)
    assert _run(_Clock, clock.Environment(), program) == [(0, 0), (0, 1)]


def test_a_chain_runs_at_once_only_when_nothing_else_is_due():
    """The run-now rule (``Environment.due_now``): with nothing else due this instant, a
    chain's callback runs at once and draws no further id; with a timer due, it waits."""
    env = clock.Environment()
    ran = []
    clock.soon(env, lambda: ran.append(env.now), 3)
    env.step()  # the first link: nothing else is due, so the rest runs now
    # (no further link)
    assert ran == [0] and env.peek() == float("inf") and clock.counts(env)[1] == 1
    env.timer(0, _Tick(lambda: ran.append("timer")))
    clock.soon(env, lambda: ran.append("chain"), 2)
    while env.peek() < float("inf"):
        env.step()
    assert ran == [0, "timer", "chain"]


def test_urgent_pending_sees_a_process_start_or_an_urgent_callback_due_now():
    """``urgent_pending`` (the router's and gateway's check before acting for a handler
    process started now): true while a process start (SimPy's urgent queue entry) or an
    ``urgent`` callback (the step heap's) is due this instant, on either environment."""
    for env in (clock.Environment(), simpy.Environment()):
        assert not clock.urgent_pending(env)
        env.timeout(1)
        assert not clock.urgent_pending(env)  # (normal priority)
        env.process(x for x in ())
        assert clock.urgent_pending(env)
        env.step()
        assert not clock.urgent_pending(env)
        clock.urgent(env, lambda: None)
        assert clock.urgent_pending(env)
        env.step()
        assert not clock.urgent_pending(env)


def test_an_inner_step_end_waits_for_this_instants_links():
    """A link made at an instant is processed at that instant, before the clock moves on: a
    batch step's inner steps (pdsim.engine.lockstep.Stepper.tick) end without entries of their own
    only while nothing else is due, and a pending link is due now, though on neither heap."""
    from pdsim.engine.lockstep import Stepper

    env = clock.Environment()
    stepper = Stepper.__new__(Stepper)  # mid-span: 5 steps of 1 s, the first ending at 1 s
    stepper.env, stepper._k, stepper._ended = env, 5, 0
    stepper._durations = itertools.repeat(1.0)
    ran = []
    env.timer(1.0, _Tick(lambda: env.link(_Tick(lambda: ran.append(env.now)))))
    env.step_at(1.0, stepper)  # (after the timer: a later id)
    while env.peek() <= 1.0:
        env.step()
    assert ran == [1.0] and stepper._ended == 1 and stepper.next_end == 2.0


def test_a_link_sets_the_clock_to_its_instant_type_and_all():
    """Processing a link sets the clock to the instant it was made at, as a heap entry's pop
    does: the same value and the same type (SimPy's instants stay ints until a float delay
    makes them floats, and the outputs keep that type: a request's t_arrival 0 or 0.0)."""
    def seen_by_the_link(loop):
        env = clock.Environment()  # now: the int 0
        seen = []
        env.timer(0.0, _Tick(lambda: env.link(_Tick(lambda: seen.append(env.now)))))  # at 0.0
        env.timeout(0)  # at the int 0, its id between the timer's and the link's
        if loop == "step":
            while env.peek() < float("inf"):
                env.step()
        else:
            env.run(until=env.timeout(1))
        return seen

    for loop in ("step", "run"):
        seen = seen_by_the_link(loop)
        assert seen == [0] and type(seen[0]) is float, loop


def test_an_int_instant_stays_an_int_in_the_outputs():
    """review 9's finding 1: a prompt sent at the int instant 0 in a run whose operator flush at
    0.0 (a float) is processed first keeps t_arrival int, as SimPy's clock had it: its send
    comes through links made while the clock read the int 0 (CSV '0', not '0.0')."""
    import pdsim

    d = {"name": "min1", "seed": 7, "horizon_s": 900,
         "fleet": {"gpu": "H20", "model": "dsv3-ci-test",
                   "prefill": {"dp": 1, "tp": 2}, "decode": {"dp": 1, "tp": 2}},
         "clients": [{"kind": "bench", "num_prompts": 1, "request_rate": "inf",
                      "warmup_requests": 0,
                      "dataset": {"kind": "random", "input_len": 100, "output_len": 4}}],
         "operator_flushes": [{"at_s": 0.0}]}
    requests = pdsim.run(d).requests
    assert str(requests["t_arrival"].dtype) == "int64"
    assert requests[["t_arrival"]].to_csv(index=False).split() == ["t_arrival", "0"]


def test_kept_deadlines_keep_one_timer_pending():
    """A thousand fixed-timeout deadlines resolved before they fall schedule one timer at a
    time (the front's), and none fires."""
    env = clock.Environment()
    fired = []
    live = set()
    fifo = clock.KeptDeadlines(env, 5.0, lambda it: it.n in live, lambda it: fired.append(it.n),
                               "at", "eid")
    for i in range(1000):
        live.add(i)
        item = _Item(i, 0.0)
        item.at, item.eid = fifo.start(item)
    assert len(env._queue) == 1 and len(fifo.items) == 1000
    assert env.reserved == 999  # ids reserved and not (yet) used by a timer
    live.clear()
    live.add(999)
    env.run(until=env.timeout(100))
    assert fired == [999] and env.now == 100
    assert env.reserved == 998  # the front's timer, then the only live one's


def test_kept_deadlines_skip_items_that_left_or_fired():
    """KeptDeadlines over an owner's dict: items that leave it, or stop being live, never
    fire; a live item fires exactly at its start + timeout; an item that fired but stays in
    the dict (as a request whose room failed waits for its done step) is not armed again, and
    one timer is pending at a time."""
    env = clock.Environment()
    owned: dict[int, _Item] = {}
    resolved: set[int] = set()
    fired = []
    armed = []

    class Counted(clock.KeptDeadlines):
        def _arm(self, item, at, eid):  # (start and arm both arm through it)
            assert not self.armed  # one timer pending at a time
            armed.append(item.n)
            super()._arm(item, at, eid)

    dl = Counted(env, 5.0, lambda it: it.n in owned and it.n not in resolved,
                 lambda it: (fired.append((it.n, env.now)), resolved.add(it.n)),
                 "at", "eid", lambda: owned.values())

    class At:
        def __init__(self, t, fn):
            self.fn = fn
            env.timer(t, self)

        def tick(self):
            self.fn()

    def add(n):
        owned[n] = _Item(n, env.now)
        item = owned[n]
        item.at, item.eid = dl.start(item)

    for n in range(3):
        At(float(n), lambda n=n: add(n))  # deadlines at 5, 6, 7
    At(0.5, lambda: owned.pop(0))  # item 0 leaves before its deadline
    At(5.5, lambda: add(3))  # due at 10.5
    env.run(until=env.timeout(20))
    assert fired == [(1, 6.0), (2, 7.0), (3, 10.5)]
    assert sorted(owned) == [1, 2, 3]  # (they fired but stay: not armed again)
    assert armed == [0, 1, 2, 3]  # one timer per item that was ever the earliest live one


def test_the_queue_front_time_and_the_counts_follow_simpy_s_queue():
    """``Environment._queue_at`` is the time of SimPy's queue's front (inf: empty) after
    whatever changes that queue (its own events, ``call_at``, processing), and ``counts``
    tells the SimPy events from the plain entries among the ids drawn."""
    env = clock.Environment()
    ran = []

    def front() -> float:
        return env._queue[0][0] if env._queue else float("inf")

    assert env._queue_at == front() == float("inf")
    env.timeout(5.0)
    clock.call_at(env, 2.0, lambda _e: ran.append("call"), clock.reserve(env))
    clock.call_at(env, 9.0, lambda _e: ran.append("late"))
    env.timer(1.0, _Tick(lambda: ran.append("timer")))
    clock.reserve(env)  # an id that names nothing
    env.link(_Tick(lambda: env.timeout(0.5)))
    for _ in range(4):
        assert env._queue_at == front()
        env.step()
    assert env._queue_at == front() == 5.0 and ran == ["timer", "call"]
    env.run(env.timeout(20.0))  # (SimPy queues the stopping event again, for the rest of
    assert env._queue_at == front() == 22.0 and ran == ["timer", "call", "late"]  # its callbacks)
    env.step()
    assert env._queue_at == front() == float("inf")
    # SimPy events: 5 s, call, late, 0.5 s, 20 s timeouts and the stopping event queued
    # again; entries: the timer and the link
    assert clock.counts(env) == (6, 2)


def test_an_unsupported_simpy_is_refused_at_import_in_one_line():
    """pdsim.engine.clock reads SimPy's private event queue (verified on 4.1.x, pinned in
    pyproject.toml): another release is one ImportError line naming the supported versions and
    why, at import of the clock, and the CLI prints it as a user error (exit 2), not a bug
    (fails without the check: the child imports and runs)."""
    import subprocess
    import sys

    import pytest
    from conftest import ROOT

    clock.check_simpy(simpy.__version__)  # the installed one passes
    for version in ("4.1.0", "4.1.9", "4.1"):
        clock.check_simpy(version)
    for version in ("4.0.2", "4.2.0", "5.0.0", "3.0.13", "dev"):
        with pytest.raises(ImportError, match=r"^pdsim needs SimPy 4\.1\.x \(simpy>=4\.1,<4\.2"
                           rf"\), found {version}: pdsim\.engine\.clock relies on") as err:
            clock.check_simpy(version)
        assert "\n" not in str(err.value) and err.value.name == "simpy"

    child = """
import sys, simpy
simpy.__version__ = "4.2.0"  # as if another release were installed
try:
    import pdsim.engine.clock
except ImportError as err:
    print("import:", err)
else:
    print("imported")
from pdsim.cli.main import main
sys.exit(main(["run", "scenarios/healthy.yaml"]))
"""
    out = subprocess.run([sys.executable, "-c", child], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.stdout.startswith("import: pdsim needs SimPy 4.1.x"), out.stdout + out.stderr
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("pdsim: error: pdsim needs SimPy 4.1.x (simpy>=4.1,<4.2), "
                                 "found 4.2.0") and out.stderr.count("\n") == 1, out.stderr

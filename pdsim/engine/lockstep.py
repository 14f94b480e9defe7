"""DP-attention lockstep: the ranks of one server run each forward together.

With ``--enable-dp-attention`` every forward ends in MoE/MLP collectives across the server's
GPUs, so its DP ranks step together and a rank with nothing to do runs an idle batch. The step
takes as long as the predictor says for an "equivalent rank": the gathered (MoE) terms at the
mean load over the ranks, the rank-local (attention) terms at the slowest rank. For the fitted
predictor that is ``a + b*mean(tokens) + c*max(sum len^2)`` for prefill and
``a + b*max(context) + c*mean(batch)`` for decode, whose per-token coefficients already assume
``dp`` ranks' tokens gathered on every GPU.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from heapq import heappush

from simpy.events import NORMAL, Event

from pdsim.engine.clock import Environment, Link
from pdsim.engine.rank import AWAKE, Rank

_IDLE = 1 << 62  # (lazy) the span end of an idle rank: none


def step_time(ranks: Sequence[Rank], plans: list) -> float:
    """Duration of one lockstep forward given each rank's plan (None: idle batch)."""
    live = [p for p in plans if p is not None]
    rank = ranks[0]
    return rank.step_time(rank.combine(live, len(ranks)))


class _Asleep:
    """A lockstep group asleep: the ``AnyOf`` condition over its ranks' wake-up events it
    used to wait on, as plain heap entries under the ids those events would have drawn
    (``pdsim.engine.clock``): each rank's wake-up (:class:`_RankWake`) is linked where its event was
    triggered (``Rank._kick``: ``succeed``), and the first of them processed links this one
    (the condition's step), where the group plans again. The others do nothing when
    processed (the condition's check had already been met, or removed)."""

    __slots__ = ("stepper", "pending")

    def __init__(self, stepper: Stepper) -> None:
        self.stepper = stepper
        self.pending = True  # (the condition not triggered yet)

    def tick(self) -> None:
        self.stepper._go()


class _RankWake:
    """One rank's wake-up event of a group's sleep (:class:`_Asleep`), for ``Rank._kick``."""

    __slots__ = ("asleep", "triggered")

    def __init__(self, asleep: _Asleep) -> None:
        self.asleep = asleep
        self.triggered = False

    def succeed(self) -> None:
        self.triggered = True
        self.asleep.stepper.env.link(self)  # (where Event.succeed schedules it)

    def tick(self) -> None:
        asleep = self.asleep
        if asleep.pending:  # the first processed: the condition is met (AnyOf._check)
            asleep.pending = False
            asleep.stepper.env.link(asleep)


class Stepper:
    """The scheduler loop of one rank, or of a server's DP ranks in lockstep.

    Each batch step ends at a plain entry in the environment's step heap
    (``pdsim.engine.clock.Environment``), not a SimPy event: it sorts among events exactly as the
    step's timeout would (drawn from the same id counter when the step before it ends), so
    whatever happens at the same instant happens before or after it as it would have.

    Where nothing can change a decode batch, from a step on, the batch runs unchanged until a
    step finishes a request or grows one whose pages might run out (``Rank.span_steps``),
    unless something from outside reaches a rank. The steps of such a span end without doing
    anything: whoever reads or changes a rank mid-span first brings it up to the steps already
    ended (``catch_up``, their commits in bulk), and a change that alters the next plan makes
    the step in flight, or a later one, the span's last (``interrupt``). The last step commits
    and plans as any step does, except in a DP-attention group run without a step recorder:
    there only the ranks whose own span ends there, or that changed, commit and plan; the
    others owe their quiet steps until someone reads them (``Rank._catch_up``). Each step's
    duration is that of the plan it would have had.
    """

    # (slots: CPython 3.11 reads an instance's attributes from its inline values only while
    # its class's instances have fewer than 30 names; past that each read is a dict look-up)
    __slots__ = ("env", "ranks", "together", "solo", "rec", "_plans", "_live", "_plan", "_t0",
                 "_k", "_ended", "_done", "_t_ended", "_durations", "next_end", "_own", "_mods",
                 "_lazy", "_index", "_base", "_committed", "_counted", "_lines", "_batches",
                 "_due", "_lead", "_cursor", "halted", "changes", "_dues", "_wake_link")

    def __init__(self, env: Environment, ranks: Sequence[Rank], together: bool) -> None:
        self.env = env
        self.ranks = list(ranks)
        self.together = together  # lockstep: one forward for all, idle ranks run idle batches
        if not together and len(self.ranks) != 1:
            raise ValueError("a Stepper runs one rank, or a lockstep group (together)")
        self.solo = None if together else self.ranks[0]
        self.rec = self.ranks[0].recorder
        for r in self.ranks:
            r.stepper = self
        self._plans: list = []  # the span's first plans, one per rank (None: idle rank)
        self._live: list = []  # (rank, first plan) of the ranks with a batch (not lazy)
        self._plan = None  # a solo rank's first plan of the span
        self._t0 = 0.0  # when the span's first step started
        self._k = 0  # steps in the span (0: asleep)
        self._ended = 0  # span steps that ended
        self._done = 0  # span steps committed
        self._t_ended = 0.0  # when the last of them ended
        self._durations: Iterator[float] = iter(())
        self.next_end = 0.0  # when the step in flight ends
        # per rank of a group: the step (of the span) its own span ends at (0: idle), and its
        # _mods when that was computed; unchanged since, it holds in the next span
        n = len(self.ranks)
        self._own: list[int] = [0] * n
        self._mods: list[int] = [0] * n
        # A decode group without a recorder commits lazily: at a span's end only the ranks
        # whose own span ends there, or that changed, commit and plan; the others owe their
        # quiet steps (all of which would only count tokens and grow pages) until someone
        # catches them up (``catch_up(rank)``, as anything reading a rank does) or they are
        # due, and their next plan is their plan's continuation.
        self._lazy = together and n > 1 and self.rec is None and self.ranks[0].spans
        self._index = {r: i for i, r in enumerate(self.ranks)}
        # (lazy) group steps are counted from the group's first: a rank's own span end is the
        # group step it falls on (_IDLE: an idle rank), its plans are its line's
        self._base = 0  # (lazy) steps of the group's earlier spans
        self._committed = [0] * n  # (lazy) the group step up to which each rank committed
        self._counted = [0] * n  # (lazy) the group step up to which its plans were counted
        self._lines: list = [None] * n  # (lazy) each rank's context line (None: idle)
        self._batches = [0] * n  # (lazy) each rank's batch (0: idle)
        self._due = [True] * n  # (lazy) ranks that committed and planned at the last span end
        # (lazy) the lines' leader, kept across spans (pdsim.engine.decode_batch.Lead)
        self._lead = None
        if self._lazy:
            self._lead = self.ranks[0].lead()
            self._plans = [None] * n  # (lazy) each rank's last plan_step (its line's batch)
            self._own = [_IDLE] * n
        self._cursor = -1  # (lazy) the rank committing at a span's end (-1: not ending)
        self.halted = 0  # how many of its ranks are halted (Rank.halt and resume count them)
        self.changes = 0  # how many times its ranks changed (Rank._changed counts them)
        self._dues: list[int] | None = None  # (lazy) see _lazy_end
        # a solo rank wakes its stepper with a plain link where a SimPy event was scheduled
        # (same id drawn at the same moment; the stepper was its event's only waiter)
        self._wake_link = Link(env, self._go)
        if self.solo is not None:
            self.solo._wake = AWAKE
        self._sleep()

    # --- the loop ------------------------------------------------------------------------

    def _sleep(self) -> None:
        if self.solo is not None:  # its wake-up is a plain link, not a SimPy event
            self.solo._waker = self._wake_link
        else:  # a lockstep group: an AnyOf over the ranks' wake-ups, as plain entries (_Asleep)
            asleep = _Asleep(self)
            for r in self.ranks:
                r._wake = _RankWake(asleep)

    def _wake_up(self, _ev: Event) -> None:
        self._go()

    def _go(self, after: int = 0) -> None:
        """Plan the next step of every rank and start it (and the span it may begin), unless
        a rank is halted (a hang or a crash, pdsim.engine.faults): then wait for its resumption.
        ``after``: the steps of the span that just ended (0: waking up)."""
        r = self.solo
        if r is not None:  # one rank: no plan lists (the same steps, fewer objects)
            if r.halted:
                self._k = 0
                r._resumed.callbacks.append(self._wake_up)
                return
            p = r.plan_step()
            if p is None:
                self._k = 0
                r._waker = self._wake_link  # (see _sleep)
                return
            self._plan = p
            k = r.span_steps(1 << 30) if r.spans else 1
            self._k, self._ended, self._done = k, 0, 0
            self._t0 = now = self.env._now
            if k == 1:  # (a span's first duration: its first plan's step time)
                self.next_end = now + r.step_time(p)  # exactly SimPy's now + delay
            else:
                self._durations = durations = r.span_durations([p], 0)
                self.next_end = now + next(durations)
            self.env.step_at(self.next_end, self)
            return
        ranks = self.ranks
        if self.halted:  # (how many of its ranks are: Rank.halt)
            for r in ranks:
                if r.halted:
                    self._k = 0
                    r._resumed.callbacks.append(self._wake_up)
                    return
        if self._lazy:
            self._go_lazy(after)
            return
        # each rank's plan and own span (span_steps(limit) is min(limit, its own)), in one
        # pass (a rank's planning reaches no other rank: what it sets off goes on the heaps).
        # A rank that nothing changed since the last span began keeps that span's end,
        # ``after`` steps on.
        own, mods = self._own, self._mods
        plans, live, ps = [], [], []
        k = 1 << 30
        for i, r in enumerate(ranks):
            p = r.plan_step()
            plans.append(p)
            if p is None:
                own[i] = 0
                continue
            live.append((r, p))
            ps.append(p)
            m = r._mods
            if after and own[i] > after and mods[i] == m:
                n = own[i] - after
            else:
                n = r.span_steps(1 << 30) if r.spans else 1
                mods[i] = m
            own[i] = n
            if n < k:
                k = n
        if not ps:
            self._k = 0
            self._sleep()
            return
        self._plans, self._live = plans, live
        self._k, self._ended, self._done = k, 0, 0
        self._t0 = now = self.env._now
        rank = ranks[0]
        n = len(ranks) if self.together else 0
        if k == 1:
            self.next_end = now + rank.step_time(rank.combine(ps, n) if n else ps[0])
        else:
            self._durations = durations = rank.span_durations(ps, n)
            self.next_end = now + next(durations)  # exactly SimPy's now + delay
        self.env.step_at(self.next_end, self)

    def _go_lazy(self, after: int) -> None:
        """``_go`` of a lazy group: only the ranks that committed at the span's end (or changed
        since they planned, or all when waking up) plan and ask their span end; the others
        continue their context line (``DecodeRank.line``) and keep their span end, with no
        work here (their continued plans are counted when they commit, ``_owe``). A span end
        costs the ranks due, plus the group's first step and its envelope (over the lines)."""
        ranks, plans, lines, batches = self.ranks, self._plans, self._lines, self._batches
        own, mods, due, committed, counted = (self._own, self._mods, self._due,
                                              self._committed, self._counted)
        base = self._base
        first = base + 1  # the group step this span begins with
        recompute = 0
        fresh = []  # the lines made here (the others are kept: Lead)
        dues = self._dues
        for i in dues if after and dues is not None else range(len(ranks)):
            r = ranks[i]
            # (not due: it had a plan, so a line, at the span's end, _lazy_end)
            if not due[i] and after and r._mods == mods[i]:
                continue  # continues its line; its own span end (a group step) holds
            # one that committed at the span's end owes nothing, nor one idle; one that did
            # not may (the group waking after a halt of one of its ranks: test_lockstep)
            if not due[i]:
                self._catch(i)
            committed[i] = base
            due[i] = True  # (fresh: its span end is asked, not carried)
            p = r.plan_step()
            plans[i] = p
            if p is None:
                lines[i] = None
                own[i] = _IDLE
                batches[i] = 0
                continue
            counted[i] = first  # (plan_step counted this plan)
            line, rec = r.line(p, first)
            lines[i] = line
            fresh.append(line)
            batches[i] = line[0]
            if rec > recompute:
                recompute = rec
            mods[i] = r._mods
            own[i] = base + (r.span_steps(1 << 30) if r.spans else 1)
        k = min(own)
        if k == _IDLE:  # every rank idle
            self._k = 0
            self._sleep()
            return
        k -= base
        self._k, self._ended, self._done = k, 0, 0
        self._t0 = now = self.env._now
        live = list(filter(None, lines))
        self._durations = durations = ranks[0].group_durations(
            live, batches, first, len(ranks), recompute, first + k,
            self._lead.at(live, fresh, first))
        self.next_end = now + next(durations)  # exactly SimPy's now + delay
        self.env.step_at(self.next_end, self)

    def tick(self) -> None:
        """The step in flight ended (called by the environment, in its place in the order)."""
        env = self.env
        ended = self._ended + 1
        now = env._now
        k = self._k
        if ended < k:  # an inner step of a span: the next one starts at once
            steps, durations = env._steps, self._durations
            end = now + next(durations)
            # inner steps that end before anything else is due end here and now (nothing
            # runs meanwhile, so the heaps' fronts stay)
            last = k - 1
            if ended < last:
                due = env._queue_at  # (SimPy's queue's front; inf: empty)
                if steps and steps[0][0] < due:
                    due = steps[0][0]
                if end < due and not env._links:  # (links pending: due now)
                    while ended < last and end < due:
                        ended += 1
                        now = end
                        end = now + next(durations)
                    env._now = now
            self._ended, self._t_ended, self.next_end = ended, now, end
            # env.step_at(end, self), inline
            heappush(steps, (end, NORMAL, next(env._eid), self))
            return
        self._ended, self._t_ended = ended, now
        if self._lazy:
            self._k = 0
            self._lazy_end(ended)
            return
        if ended - 1 > self._done:
            self._advance(ended - 1)
        self._k = 0  # the last step commits as any step does; nothing is in flight meanwhile
        r = self.solo
        if r is not None:
            p = self._plan
            r.commit_step(p)  # (nth_plan keeps the batch, all commit_step reads)
            if self.rec is not None:
                self.rec.step(r, self._t0, now, p, steps=ended)
            self._go()
            return
        for r, p in self._live:  # (a span's steps commit what its first plan's batch made)
            r.commit_step(p)
        if self.rec is not None:
            for r, p in zip(self.ranks, self._plans, strict=True):
                self.rec.step(r, self._t0, now, p, steps=ended)
        self._go(ended)

    def _lazy_end(self, ended: int) -> None:
        """A lazy group's span ended after ``ended`` steps: the ranks due commit, in order."""
        end = self._base + ended
        own, mods, committed, due = self._own, self._mods, self._committed, self._due
        ranks, plans = self.ranks, self._plans
        changes = self.changes
        dues = []  # the ranks _go_lazy would not pass by, if no rank changes meanwhile
        for i, p in enumerate(plans):
            if p is None:
                dues.append(i)  # (idle: it plans again)
                continue
            r = ranks[i]
            if own[i] == end or r._mods != mods[i]:
                dues.append(i)
                self._cursor = i
                if committed[i] < end - 1:
                    self._owe(i, end - 1, end)
                committed[i] = end
                r.commit_step(p)  # (its batch: the same in every step of its line)
                due[i] = True
            else:
                due[i] = False  # its commit of this step is owed
        self._cursor = -1
        self._base = end
        self._ended = 0
        # a commit may reach a rank (a change): then _go_lazy looks at every rank
        self._dues = dues if self.changes == changes else None
        self._go(ended)

    def _catch(self, i: int) -> None:
        """(lazy) Commit the steps rank ``i`` owes (all quiet for it)."""
        if self._plans[i] is None:
            return
        cursor = self._cursor
        target = self._base + self._ended
        if self._k:  # mid-span: the step in flight is planned (catch_up() of every rank
            frontier = target + 1  # writes this case inline, in one loop: change both)
        else:  # a span's end: the next step is not planned yet
            frontier = target
            if cursor >= 0:  # ranks after the one committing have not committed it
                if i == cursor:
                    return
                if i > cursor:
                    target -= 1
        if target > self._committed[i]:
            self._owe(i, target, frontier)

    def _owe(self, i: int, target: int, frontier: int) -> None:
        """(lazy) Commit rank ``i``'s quiet steps up to group step ``target`` and count the
        plans after them, up to the group step ``frontier`` planned so far (a rank continuing
        its line makes each of its plans when the group plans that step; they are counted
        here, where the old per-span ``nth_plan`` counted them one span end at a time)."""
        n = target - self._committed[i]
        last = target + 1 if target < frontier else frontier
        self.ranks[i].quiet_steps(n, last - self._counted[i])
        self._counted[i] = last
        self._committed[i] = target

    def _advance(self, m: int) -> None:
        """Commit the span's steps up to the ``m``-th (none of them finishes a request)."""
        n = m - self._done
        if n > 0:
            r = self.solo
            if r is not None:
                r.quiet_steps(n)
            else:
                for r, _p in self._live:
                    r.quiet_steps(n)
            self._done = m

    # --- what ranks call when something reaches them mid-span -----------------------------

    def catch_up(self, rank: Rank | None = None) -> None:
        """Commit the span's steps that ended by now (the step in flight stays in flight): of
        ``rank`` at least (of a lazy group: what it owes), or of every rank."""
        if self._lazy:
            if rank is not None:
                self._catch(self._index[rank])
            elif self._k:  # mid-span: each live rank owes up to the steps ended (``_catch``)
                target = self._base + self._ended
                committed = self._committed
                for i, p in enumerate(self._plans):
                    if p is not None and target > committed[i]:
                        self._owe(i, target, target + 1)
            else:
                for i in range(len(self.ranks)):
                    self._catch(i)
        elif self._k > 1 and self._ended > self._done:
            self._advance(self._ended)

    def interrupt(self, rank: Rank) -> None:
        """``rank`` changed (call after ``catch_up`` and the change): if its next plan may
        differ, the step in flight, or a later one, becomes the span's last."""
        if self._k > 1:
            m = self._ended if self._lazy else self._done  # (it was caught up first)
            k = m + rank.span_steps(self._k - m)
            if k < self._k:  # (a span never grows: no durations past its first k are read,
                self._k = k  # and a lazy group's reach only its k, group_durations' stop)

    def taken(self, rank: Rank) -> bool:
        """``rank`` (caught up) took free pages and changed nothing else its plans read (a
        pre-allocation): its plan's continuation holds, and its own span may only end sooner,
        at a growth the free pages no longer cover. A lazy group mid-span moves that end (and
        the span's) to what the rank would ask for if it planned at its span's end, and lets
        it continue its line (True); otherwise it is a change (False: ``Rank._changed``)."""
        if not self._k or not self._lazy:
            return False
        i = self._index[rank]
        if self._plans[i] is None:  # (idle: it plans at every span end anyway)
            return False
        m = self._ended  # (the rank committed up to the steps ended: its own span starts on)
        own = self._base + m + rank.span_steps(1 << 30)
        if own < self._own[i]:
            self._own[i] = own
            if own - self._base < self._k:
                self._k = own - self._base
        return True

    def cut(self) -> None:
        """``interrupt`` for a rank whose next plan differs (``span_steps`` 1): the step in
        flight becomes the span's last. It needs no catch-up: the steps ended are counted by
        ``_ended`` whether or not they were committed."""
        k = self._ended + 1
        if k < self._k:
            self._k = k

    def close(self) -> None:
        """The run ends: bring the span up to now and record the steps it committed."""
        if self._lazy:
            self.catch_up()
        elif self._k > 1:
            self.catch_up()
            if self.rec is not None and self._done:
                plans = [self._plan] if self.solo is not None else self._plans
                for r, p in zip(self.ranks, plans, strict=True):
                    self.rec.step(r, self._t0, self._t_ended, p, steps=self._done)

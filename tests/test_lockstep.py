"""DP-attention lockstep: ranks of a server step together; MoE terms at mean, attention at max."""

from __future__ import annotations

import pytest
from conftest import small_fleet

import pdsim
from pdsim.engine.decode import DecodeRank
from pdsim.engine.lockstep import step_time
from pdsim.engine.prefill import PrefillRank
from pdsim.model.predictor import FittedPredictor

P = FittedPredictor(10, 2, 1, 5, 0.5, 0.1)


class _Prefill(PrefillRank):
    def __init__(self):  # only what step_time reads
        self.predictor = P


class _Decode(DecodeRank):
    def __init__(self):
        self.predictor = P


def test_prefill_step_gathers_tokens_and_waits_for_slowest_attention():
    ranks = [_Prefill() for _ in range(4)]
    # plans: (tokens, sum len*(len+prefix), causal pairs, requests, prefix tokens)
    plans = [(4000, 8e6, 4e6, 2, 0), (2000, 2e6, 1e6, 1, 0), None, None]
    # mean tokens over all 4 ranks (idle ones count), max attention term
    assert step_time(ranks, plans) == pytest.approx(P.prefill(1500, 8e6))


def test_decode_step_gathers_batch_and_waits_for_longest_context():
    ranks = [_Decode() for _ in range(2)]
    plans = [(64, 300_000, 0), (16, 50_000, 0)]
    assert step_time(ranks, plans) == pytest.approx(P.decode(40, 300_000))
    plans = [(64, 300_000, 0), (16, 50_000, 2048)]  # a re-admitted request's recompute
    assert step_time(ranks, plans) == pytest.approx(P.decode(40, 300_000) + P.prefill(2048, 0))


def _one_at_a_time(lockstep: bool):
    d = small_fleet()
    d["fleet"]["decode"]["lockstep"] = lockstep
    d["clients"][0].update(num_prompts=20, max_concurrency=1)
    d["predictor"] = {"kind": "fitted", "coefficients": {"decode_c_ms_per_seq": 5.0}}
    return pdsim.run(d).measured


def test_an_idle_partner_adds_no_moe_work():
    """One request at a time on 2 DP ranks: in lockstep the other rank runs an idle batch, so
    the gathered MoE term sees half a sequence per rank on average."""
    alone = _one_at_a_time(False)
    together = _one_at_a_time(True)
    tpot = lambda m: ((m.t_done - m.t_first_token) / (m.generated - 1)).mean()  # noqa: E731
    assert tpot(alone) - tpot(together) == pytest.approx(2.5e-3, rel=0.02)


def test_lockstep_default_follows_dp_attention():
    sc = pdsim.load(small_fleet())
    assert sc.fleet.prefill.lockstep is None and sc.fleet.prefill.dp_attention


@pytest.mark.parametrize("lockstep,page_size,reserve", [(False, 16, 32), (True, 1, 0),
                                                        (True, 16, 0)])
def test_growth_bound_never_cuts_a_span_the_walk_would_not(monkeypatch, lockstep, page_size,
                                                            reserve):
    """span_steps skips walking the growth entries when the free pages cover every running
    request growing once per P - 1 - lag steps (DecodeRank._lag): under memory pressure
    (spans cut by growths, retractions) its answer is always the walk's, and it does skip."""
    seen = {"calls": 0, "bound": 0, "cut": 0, "capped": 0}
    span_steps, walk = DecodeRank.span_steps, DecodeRank._growth_steps

    def counted_walk(self, end, most=None):
        """The walk, checked against the whole walk: its first ``most`` growths (span_steps
        reads only the first one the free pages do not cover)."""
        seen["walked"] = True
        whole, got = walk(self, end), walk(self, end, most)
        assert got == (whole if most is None else whole[:most])
        seen["capped"] += len(got) < len(whole)
        return got

    def both(self, limit):
        seen["walked"] = False
        fast = span_steps(self, limit)
        skipped = not seen["walked"]
        late, self._late = self._late, True  # (the walk whenever the bound is not enough)
        slow = span_steps(self, limit)
        self._late = late
        assert fast == slow
        seen["calls"] += 1
        seen["bound"] += skipped and seen["walked"]  # the bound spared a walk
        seen["cut"] += slow < limit
        return fast

    monkeypatch.setattr(DecodeRank, "_growth_steps", counted_walk)
    monkeypatch.setattr(DecodeRank, "span_steps", both)
    d = small_fleet()  # few long outputs on tight pools: spans of hundreds of steps
    d["fleet"]["decode"].update(lockstep=lockstep, page_size=page_size, kv_pool_tokens=4000,
                                num_reserved_decode_tokens=reserve)
    d["clients"][0].update(num_prompts=40, max_concurrency=16,
                           dataset={"kind": "random", "input_len": 1024, "output_len": 1024})
    res = pdsim.run(d)
    assert res.summary["retractions"] > 0
    assert seen["bound"] > 0 and seen["cut"] > 0 and seen["capped"] > 0


@pytest.mark.parametrize("faults", [
    [], [{"preset": "decode_hang", "at_s": 2.0, "duration_s": 3.0}]])
def test_a_lazy_group_counts_and_commits_what_a_recorded_one_does(faults, monkeypatch):
    """A lazy DP-attention group (no recorder) lets ranks that continue their context line
    skip span ends and counts their plans when their steps are committed (Stepper._owe); a
    recorded group plans and commits every rank at each span end. Their counts and outputs
    are the same, with a hang (every rank halts, then plans afresh) or without; and the lazy
    one really skipped plans (else this compares two plain groups)."""
    d = small_fleet(faults=faults)
    d["fleet"]["decode"].update(dp=4, tp=4)
    d["clients"][0].update(num_prompts=120, max_concurrency=48)
    d["clients"][0]["dataset"]["output_len"] = 300
    plan_step, planned = DecodeRank.plan_step, []

    def counted(self):
        planned[-1] += 1
        return plan_step(self)

    monkeypatch.setattr(DecodeRank, "plan_step", counted)
    planned.append(0)
    lazy = pdsim.run(d)
    planned.append(0)
    recorded = pdsim.run(d, record_steps=True)
    assert 0 < planned[0] < planned[1] / 2, planned  # continued lines skip most plans
    for key in ("decode_steps", "total_generated_tokens", "completed_requests", "duration_s"):
        assert lazy.summary.get(key) == recorded.summary.get(key), key
    assert lazy.requests.equals(recorded.requests)
    assert lazy.summary["decode_steps"] > 0


def test_a_lazy_rank_reached_while_its_group_commits_counts_each_plan_once(monkeypatch):
    """A rank of a lazy group caught up while another rank commits at a span end (as a
    request submitted to it then would) has committed that step but not planned the next; if
    it changed, it plans afresh at the span's start (plan_step counts that plan): the catch-up
    must not count it too (Stepper._owe counts plans only up to the step planned so far)."""
    d = small_fleet()
    d["fleet"]["decode"].update(dp=4, tp=4)
    d["clients"][0].update(num_prompts=120, max_concurrency=48)
    d["clients"][0]["dataset"]["output_len"] = 300
    want = pdsim.run(d, record_steps=True).summary  # (a recorded group is never lazy)
    commit = DecodeRank.commit_step
    reached = []

    def commit_and_reach_rank_0(self, plan):
        commit(self, plan)
        stepper = self.stepper
        if stepper._lazy and stepper._cursor > 0 and self is stepper.ranks[stepper._cursor]:
            other = stepper.ranks[0]
            other._catch_up()
            other._changed()  # (nothing it plans changes: its plan is its line's continuation)
            reached.append(other)

    monkeypatch.setattr(DecodeRank, "commit_step", commit_and_reach_rank_0)
    got = pdsim.run(d).summary
    assert reached
    for key in ("decode_steps", "total_generated_tokens", "completed_requests", "duration_s"):
        assert got[key] == want[key], key


def test_a_lazy_group_commits_what_its_ranks_owe_when_one_rank_halts_alone(monkeypatch):
    """A rank of a lazy group halted alone (its GPU hangs; the group's collectives wait for
    it) ends the span: the others, continuing their lines, owe that span's quiet steps, and
    when the group plans again after the resumption (``_go_lazy`` waking, ``after`` 0) they
    commit them first. The shipped faults halt every rank of a server, so only this test
    reaches that catch-up; without it the owed tokens are lost."""
    from pdsim.engine import clock
    from pdsim.engine.lockstep import Stepper

    d = small_fleet(timeseries_interval_s=60.0)  # (samples catch every rank up)
    d["fleet"]["decode"].update(dp=4, tp=4)
    d["clients"][0].update(num_prompts=120, max_concurrency=48)
    d["clients"][0]["dataset"]["output_len"] = 300
    init = Stepper.__init__

    def with_a_lone_hang(self, env, ranks, together):
        init(self, env, ranks, together)
        if together and len(self.ranks) > 1 and isinstance(self.ranks[0], DecodeRank):
            rank = self.ranks[1]
            clock.call_later(env, 2.0, rank.halt)
            clock.call_later(env, 3.5, rank.resume)

    monkeypatch.setattr(Stepper, "__init__", with_a_lone_hang)
    go_lazy, owed = Stepper._go_lazy, []

    def counted(self, after):
        if after == 0:  # waking up: the quiet steps each rank still owes
            owed.append(sum(self._base - self._committed[i] for i in range(len(self.ranks))
                            if self._plans[i] is not None))
        go_lazy(self, after)

    monkeypatch.setattr(Stepper, "_go_lazy", counted)
    lazy = pdsim.run(d)
    recorded = pdsim.run(d, record_steps=True)  # (a recorded group is never lazy)
    assert max(owed) > 0, owed  # (else nothing reaches that catch-up)
    for key in ("decode_steps", "total_generated_tokens", "completed_requests", "duration_s"):
        assert lazy.summary[key] == recorded.summary[key], key
    assert lazy.requests.equals(recorded.requests)


def test_growths_booked_in_one_go_keep_the_pool_exact(monkeypatch):
    """DecodeRank._grow_due adds the pages of a pass's growths to their holdings and books
    them with the allocator once (PageAllocator.book), going through grow for an orphan
    holding (after a flush) or a shortfall (it retracts): after every pass the pool's used
    pages are exactly those of the epoch's holdings, and its peak is at least that; the run
    passes through all three paths."""
    from pdsim.engine.kv import PageAllocator

    seen = {"passes": 0, "orphans": 0}
    grow_due, grow = DecodeRank._grow_due, PageAllocator.grow

    def checked(self, end, first):
        grow_due(self, end, first)
        a = self.alloc
        held = [*self.transfer.values(), *self.waiting, *self.running.values()]
        assert a.used == sum(r.d_pages.n for r in held if r.d_pages.epoch == a.epoch)
        assert a.peak >= a.used
        seen["passes"] += 1

    def counted(self, pages, n):
        seen["orphans"] += pages.epoch != self.epoch
        return grow(self, pages, n)

    monkeypatch.setattr(DecodeRank, "_grow_due", checked)
    monkeypatch.setattr(PageAllocator, "grow", counted)
    d = small_fleet(operator_flushes=[{"at_s": 6.0}],
                    flush={"semantics": "skip_idle_check"})
    d["fleet"]["decode"].update(page_size=1, kv_pool_tokens=8000, num_reserved_decode_tokens=0)
    d["clients"][0].update(num_prompts=60, max_concurrency=24,
                           dataset={"kind": "random", "input_len": 1024, "output_len": 600})
    res = pdsim.run(d)
    assert res.summary["retractions"] > 0
    assert seen["passes"] > 100 and seen["orphans"] > 0  # (an orphan: the flush freed pages)


def test_growths_come_in_their_entries_step_and_seq_order(monkeypatch):
    """DecodeRank keeps its growth entries as a sorted list, each grown request's next
    growth appended at its back or, when earlier than the back's, inserted in its place:
    every pass grows the requests due in the (step, seq) order of their entries, as a heap
    would. Checked against a heap replaying each pass that retracts nothing (the same rule
    for each next growth's step and seq), on runs where some next growths are inserted, one of
    them at the front of the entries left (review 8: a re-admitted request's first growth
    later than a running one's next; fails if they are appended, inserted one place late, or
    the list is taken out of order)."""
    import bisect
    import heapq

    import pdsim.engine.decode_batch

    seen = {"passes": 0, "inserted": 0, "at_front": 0}
    grow_due, insort = DecodeRank._grow_due, pdsim.engine.decode_batch.insort

    def checked(self, end, first):
        live = lambda: sorted((e[0], e[1], e[3]) for e in self._grow  # noqa: E731
                              if e[2] == e[3].version)
        one = live()
        full = {r: r.full_at for _s, _q, r in one}
        seq, running = self._seq, len(self.running)
        seen["in_pass"] = True
        grow_due(self, end, first)
        seen["in_pass"] = False
        assert self._grow == sorted(self._grow, key=lambda e: e[:2])
        if len(self.running) != running:
            return  # (a retraction: growths of those retracted stop)
        heapq.heapify(one)
        while one and one[0][0] <= end:
            s, _q, r = heapq.heappop(one)
            full[r] += self._block_tokens
            seq += 1
            heapq.heappush(one, (max(full[r], max(s, first) + 1), seq, r))
        assert sorted(one) == live()
        seen["passes"] += 1

    def counted(a, x, lo=0):
        if seen.get("in_pass", False):
            seen["inserted"] += 1
            seen["at_front"] += bisect.bisect_right(a, x, lo) == lo  # (the first left)
        insort(a, x, lo)

    monkeypatch.setattr(DecodeRank, "_grow_due", checked)
    monkeypatch.setattr(pdsim.engine.decode_batch, "insort", counted)
    d = small_fleet(operator_flushes=[{"at_s": 6.0}],
                    flush={"semantics": "skip_idle_check"})
    d["fleet"]["decode"].update(page_size=16, kv_pool_tokens=8000, num_reserved_decode_tokens=0)
    d["clients"][0].update(num_prompts=100, max_concurrency=32,
                           dataset={"kind": "random", "input_len": 1024, "output_len": 600,
                                    "range_ratio": 0.8})
    res = pdsim.run(d)
    assert res.summary["retractions"] > 0 and seen["passes"] > 100 and seen["inserted"], seen
    # a running request whose pages are full now, beside one whose pages last 500 more steps
    # (a holding larger than its context: since SGLang's reserve gate became pdsim's, no
    # shipped path makes one, so it is set up by hand): its next growth, a block later, goes
    # before every entry left
    from pdsim.engine.fleet import Fleet
    from pdsim.engine.request import new_request

    rank = Fleet(pdsim.load(small_fleet())).decode_ranks[0]
    for rid, slack in ((0, 0), (1, 500)):
        req = new_request(rank.env, rid, "c", "bench", 100, 2000, True)
        req.d_pages = rank.alloc.alloc(rank.alloc.pages_for(100 + slack))
        req.cap_tokens = req.d_pages.n * rank.alloc.page_size
        req.generated = 1
        rank._join(req)
    rank._grow_due(0, 0)
    assert seen["at_front"], seen


def test_a_recorded_group_follows_the_whole_envelope_of_its_lines():
    """A recorded DP-attention group (record_steps: not lazy) plans every rank at each span
    end and takes a span's durations from the whole envelope of its ranks' context lines
    (group_durations without stop); a lazy one only up to its span's end. With 8 ranks
    whose lines cross within spans, both give the same requests and summary (fails when
    the recorded group's durations stop following the envelope at the first crossing)."""
    import copy

    import golden

    d = copy.deepcopy(golden.EXTRA["small_poisson"])
    d["fleet"]["decode"].update(dp=8, tp=8, dp_attention=True)
    lazy, recorded = pdsim.run(copy.deepcopy(d)), pdsim.run(d, record_steps=True)
    assert lazy.requests.equals(recorded.requests)
    assert lazy.summary == recorded.summary
    assert lazy.summary["completed_requests"] > 100


def test_a_lazy_rank_that_takes_pages_mid_span_ends_its_span_at_the_growth_left_uncovered(
        monkeypatch):
    """A request submitted to a rank of a lazy group mid-span pre-allocates pages and changes
    nothing its plans read, so the rank continues its line (Stepper.taken) instead of
    planning afresh at the span's end; but the pages it took may leave a growth of its batch
    uncovered, so its own span end (and the span's) move there. Under memory pressure the
    lazy group's outputs are the recorded group's (which plans every rank at every span
    end); without the move a span's quiet steps reach a growth short of pages."""
    from pdsim.engine.lockstep import Stepper

    taken, moved, continued = Stepper.taken, [], []

    def counted(self, rank):
        before = list(self._own)
        continued.append(taken(self, rank))
        moved.append(before != self._own)
        return continued[-1]

    monkeypatch.setattr(Stepper, "taken", counted)
    d = small_fleet()
    d["fleet"]["decode"].update(dp=4, tp=4, page_size=1, kv_pool_tokens=3000,
                                num_reserved_decode_tokens=0)
    d["clients"][0].update(num_prompts=100, max_concurrency=48,
                           dataset={"kind": "random", "input_len": 256, "output_len": 300})
    lazy = pdsim.run(d)
    recorded = pdsim.run(d, record_steps=True)  # (a recorded group is never lazy)
    assert any(moved) and any(continued), (sum(moved), sum(continued))
    assert lazy.summary["retractions"] > 0
    for key in ("decode_steps", "total_generated_tokens", "completed_requests", "duration_s"):
        assert lazy.summary[key] == recorded.summary[key], key
    assert lazy.requests.equals(recorded.requests)


def _sleep_and_wake(plain: bool) -> tuple[list, int]:
    """A group of 3 ranks asleep, woken at t=1 by two ranks among zero-delay chains, and the
    third rank's late kick at t=2; the log of what ran, and the ids drawn."""
    from simpy.events import Event

    from pdsim.engine import clock
    from pdsim.engine.lockstep import _Asleep, _RankWake

    env = clock.Environment()
    log = []

    class _Group:  # what _Asleep reads of a Stepper
        pass

    group = _Group()
    group.env = env
    group._go = lambda: log.append(("wake", env.now))
    if plain:
        asleep = _Asleep(group)
        wakes = [_RankWake(asleep) for _ in range(3)]
    else:  # what Stepper._sleep did: an AnyOf over one SimPy event per rank
        wakes = [Event(env) for _ in range(3)]
        env.any_of(wakes).callbacks.append(lambda _ev: group._go())

    def at_1():
        wakes[2].succeed()
        clock.soon(env, lambda: log.append(("a", env.now)), 1)
        wakes[0].succeed()
        clock.soon(env, lambda: log.append(("b", env.now)), 2)

    def at_2():
        wakes[1].succeed()
        clock.soon(env, lambda: log.append(("c", env.now)), 1)
        clock.soon(env, lambda: log.append(("d", env.now)), 2)

    clock.call_later(env, 1.0, at_1)
    clock.call_later(env, 2.0, at_2)
    env.run(until=5)
    return log, next(env._eid)


def test_a_sleeping_group_wakes_where_its_anyof_condition_would_have():
    """Stepper._sleep's plain entries (_Asleep, _RankWake) run the group's wake-up where the
    AnyOf over its ranks' wake-up events ran it: one zero-delay step after the first rank's
    event (its condition's step), the other ranks' events doing nothing, drawing the same
    ids (a wake-up at the first rank's step runs it before "a" and fails)."""
    plain, simpy_ = _sleep_and_wake(True), _sleep_and_wake(False)
    assert plain == simpy_
    assert plain[0] == [("a", 1.0), ("wake", 1.0), ("b", 1.0), ("c", 2.0), ("d", 2.0)]


def test_a_lazy_span_ends_where_a_taking_rank_leaves_a_growth_uncovered(monkeypatch):
    """Stepper.taken moves the span's end with the taking rank's own (review 7: a scenario
    where nothing else ends that span first, review 6's fuzz case 201 minimised): without
    the move, the group's quiet steps cross a growth short of pages (AssertionError in
    _grow_due); with it, the lazy group's outputs are the recorded group's."""
    from pdsim.engine.lockstep import Stepper

    taken, cut = Stepper.taken, []

    def counted(self, rank):
        k = self._k
        held = taken(self, rank)
        cut.append(self._k < k)
        return held

    monkeypatch.setattr(Stepper, "taken", counted)
    d = {"name": "taken_cut", "seed": 1, "horizon_s": 900,
         "fleet": {"gpu": "H200", "model": "dsv3-ci-test", "prefill": {"dp": 1, "tp": 2},
                   "decode": {"dp": 2, "tp": 2, "dp_attention": True, "lockstep": True,
                              "page_size": 64, "kv_pool_tokens": 9000,
                              # (found with no reserve, the default before SGLang's gate)
                              "num_reserved_decode_tokens": 0}},
         "predictor": {"kind": "operator"},
         "clients": [{"kind": "bench", "num_prompts": 100, "request_rate": 20.0,
                      "max_concurrency": 16, "warmup_requests": 0,
                      "dataset": {"kind": "random", "input_len": 300, "output_len": 256,
                                  "range_ratio": 0.9}}],
         "faults": [{"preset": "decode_hang", "at_s": 1.5, "duration_s": 1.0,
                     "kv_writes": "land"}],
         "router": {"request_timeout_s": 0.7, "http_latency_ms": 0.5}}
    lazy = pdsim.run(d)
    recorded = pdsim.run(d, record_steps=True)  # (a recorded group is never lazy)
    assert any(cut)
    for key in ("decode_steps", "total_generated_tokens", "completed_requests", "duration_s"):
        assert lazy.summary[key] == recorded.summary[key], key
    assert lazy.requests.equals(recorded.requests)

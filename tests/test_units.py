"""Unit tests: KV allocator, prefix cache, NIC sharing, predictors, profiles, balancers."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from pdsim.config.fleet import PredictorConfig
from pdsim.engine import balance, clock
from pdsim.engine.kv import KVError, PageAllocator, PrefixCache
from pdsim.engine.nic import NIC
from pdsim.model import profiles
from pdsim.model.predictor import FittedPredictor, RooflinePredictor, build


def test_allocator_capacity_and_double_free():
    a = PageAllocator(10, page_size=4)
    assert a.pages_for(9) == 3
    p = a.alloc(6)
    assert a.used == 6 and a.alloc(5) is None
    a.release(p)
    assert a.used == 0
    with pytest.raises(KVError):
        a.release(p)


def test_flush_orphans_old_pages_and_new_owners_keep_theirs():
    a = PageAllocator(10, page_size=1)
    old = a.alloc(8)
    a.reset()
    assert a.used == 0
    new = a.alloc(10)  # the flush made every page free again
    assert new is not None and a.used == 10
    a.release(old)  # the old owner's release must not free the new owner's pages
    assert a.used == 10
    a.release(new)
    assert a.used == 0


def test_grow_after_flush_reenters_the_epoch():
    a = PageAllocator(10, page_size=1)
    p = a.alloc(4)
    a.reset()
    assert a.grow(p, 2) and a.used == 2 and p.n == 2
    a.release(p)
    assert a.used == 0


def test_book_counts_pages_added_to_holdings_and_the_peak():
    a = PageAllocator(10, page_size=1)
    p = a.alloc(3)
    p.n += 4  # two growths added to the holding, booked at once
    a.book(4)
    assert a.used == 7 and a.peak == 7
    a.release(p)
    assert a.used == 0 and a.peak == 7


def test_prefix_cache_lru_and_reset():
    a = PageAllocator(6, page_size=1)
    c = PrefixCache(a, block_tokens=2)
    c.insert((1, 2, 3))
    assert a.used == 6 and c.match((1, 2, 9)) == 2
    c.evict(2)  # LRU is block 3 (1 and 2 were just touched)
    assert c.match((3,)) == 0 and c.match((1, 2)) == 2
    c.reset()
    a.reset()
    assert c.match((1,)) == 0 and a.used == 0


def test_prefix_cache_insert_evicts_lru_and_keeps_use_and_peak():
    """Inserting into a full cache evicts least recently used blocks one at a time as each
    new block needs room (an earlier block of the same prompt, once touched, stays), and
    the allocator's use and peak are what allocating block by block gives."""
    a = PageAllocator(8, page_size=1)
    c = PrefixCache(a, block_tokens=2)
    c.insert((1, 2, 3))
    assert (a.used, a.peak) == (6, 6)
    c.insert((3, 4, 5))  # 3 touched; 4 fits; 5 evicts block 1 (LRU), not 2 or 3
    assert list(c.blocks) == [2, 3, 4, 5] and (a.used, a.peak) == (8, 8)
    a.reset()  # a flush: the cached blocks are orphans, evicting them frees nothing
    c.insert((6,))
    assert list(c.blocks) == [2, 3, 4, 5, 6] and (a.used, a.peak) == (2, 8)
    p = a.alloc(6)
    c.insert((7,))  # full: every orphan goes before block 6 (the epoch's only one) frees room
    assert list(c.blocks) == [7] and (a.used, a.peak) == (8, 8)
    a.release(p)
    assert not c.evict(9) and a.used == 0 and not c.blocks

def _write_times(sizes):
    env = clock.Environment()  # pdsim's: the hot path schedules plain heap entries
    nic = NIC(env, "n", bytes_per_s=1e9, peak_util=1.0, min_util=1.0, saturation_bytes=1.0)
    done = {}
    for i, size in enumerate(sizes):
        ev = nic.write(size)
        ev.callbacks.append(lambda _e, i=i: done.__setitem__(i, env.now))
    env.run()
    return done


def test_nic_alone_and_shared():
    assert _write_times([1e9])[0] == pytest.approx(1.0)
    both = _write_times([1e9, 1e9])
    assert both[0] == pytest.approx(2.0) and both[1] == pytest.approx(2.0)
    # a short write finishes first, then the long one speeds up again
    mixed = _write_times([1e9, 0.5e9])
    assert mixed[1] == pytest.approx(1.0) and mixed[0] == pytest.approx(1.5)


def test_nic_alone_again_after_idle_and_shared_after_alone():
    """A write on an idle NIC (planned without _replan) and the last write's end (without
    _advance) leave the NIC as the general path would: the next writes share it exactly."""
    env = clock.Environment()
    nic = NIC(env, "n", bytes_per_s=1e9, peak_util=1.0, min_util=1.0, saturation_bytes=1.0)
    done = {}

    class Listener:  # the fast path's listener (pdsim.engine.transfer.Chunk.written)
        def __init__(self, name):
            self.name = name

        def written(self):
            done[self.name] = env.now

    nic.start(1e9, Listener("a"))  # alone: 1 s
    env.timer(5.0, type("T", (), {"tick": lambda _s: nic.start(1e9, Listener("b"))})())
    # 0.5 s into b, c joins: b's last 0.5e9 bytes and c's 0.25e9 share the NIC
    env.timer(5.5, type("T", (), {"tick": lambda _s: nic.start(0.25e9, Listener("c"))})())
    env.run()
    assert done == {"a": 1.0, "b": pytest.approx(6.25), "c": pytest.approx(6.0)}


def test_nic_small_writes_reach_less_of_line_rate():
    env = clock.Environment()  # pdsim's: the hot path schedules plain heap entries
    nic = NIC(env, "n", 50e9, peak_util=0.84, min_util=0.12, saturation_bytes=100e6)
    assert nic.utilisation(1e6) == pytest.approx(0.12)
    assert nic.utilisation(50e6) == pytest.approx(0.42)
    assert nic.utilisation(200e6) == pytest.approx(0.84)


def test_fitted_predictor_formula():
    p = FittedPredictor(10, 2, 1, 5, 0.5, 0.1)
    assert p.prefill(1000, 1e6) == pytest.approx((10 + 2 + 1) / 1e3)
    assert p.decode(10, 4000) == pytest.approx((5 + 2 + 1) / 1e3)


def test_roofline_scales_sensibly():
    g, m = profiles.gpu("H100"), profiles.model("llama-3.1-8b")
    r = RooflinePredictor(g, m, tp=1)
    assert r.prefill(4096, 0) > r.prefill(1024, 0)
    assert r.decode(64, 64 * 2000) > r.decode(1, 2000)
    # H20 has a seventh of H100's BF16 FLOP/s: prefill is compute-bound
    slow = RooflinePredictor(profiles.gpu("H20"), m, tp=1)
    assert slow.prefill(8192, 0) > 4 * r.prefill(8192, 0)


def test_predictor_without_fitted_coefficients_says_what_to_do():
    with pytest.raises(ValueError, match="roofline"):
        build(PredictorConfig(kind="fitted"), profiles.gpu("A100"), profiles.model("qwen3-8b"),
              tp=1)


def test_kv_bytes_per_token_match_reference():
    ref = {"deepseek-v2-lite": 31104, "deepseek-v3": 70272, "llama-3.1-8b": 131072,
           "qwen3-8b": 147456}
    for name, value in ref.items():
        assert profiles.model(name).kv_bytes_per_token == value
    # GQA under TP beyond the KV head count sends replicated heads
    llama = profiles.model("llama-3.1-8b")
    assert llama.kv_bytes_per_token_sent(16, False) == 2 * llama.kv_bytes_per_token
    assert llama.kv_bytes_per_token_sent(4, False) == llama.kv_bytes_per_token


def test_every_profile_value_names_its_source():
    from importlib import resources

    def walk(node, path):
        if path.endswith(".extends") and isinstance(node, str):
            return  # names the entry this one copies; its values carry their own sources
        if isinstance(node, dict) and "value" in node:
            assert node.get("source"), f"{path} has no source"
        elif isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{path}.{k}")
        else:
            raise AssertionError(f"{path} is a bare value without a source")

    shipped = resources.files("pdsim.model").joinpath("data")
    for fname in ("gpus.yaml", "models.yaml", "engines.yaml"):
        data = yaml.safe_load(shipped.joinpath(fname).read_text())
        walk({k: v for k, v in data.items() if not k.startswith("_")}, fname)
    cal = yaml.safe_load(shipped.joinpath("calibrations.yaml").read_text())
    for i, entry in enumerate(cal["calibrations"]):
        walk(entry["set"], f"calibrations.yaml.{i}")
    assert {"A100", "H100", "H200", "H20"} <= set(profiles.gpu_names())
    assert {"llama-3.1-8b", "qwen3-8b", "deepseek-v2-lite", "deepseek-v3",
            "dsv3-ci-test"} <= set(profiles.model_names())


class _R:
    def __init__(self, load):
        self.load_tokens = load


def test_balancers():
    ranks = [_R(5), _R(1), _R(3)]
    assert balance.build("total_tokens").pick(ranks, 0) == 1
    rr = balance.build("round_robin")
    assert [rr.pick(ranks, 0) for _ in range(4)] == [0, 1, 2, 0]
    assert balance.build("follow_bootstrap_room").pick(ranks, 10) == 1


def test_transfer_time_is_call_latency_plus_bytes_over_bandwidth():
    from pdsim.config.registry import BLACKLIST_POLICIES
    from pdsim.engine import blacklist
    from pdsim.engine.faults import Paths
    from pdsim.engine.request import Request, new_request, new_room
    from pdsim.engine.stats import Stats
    from pdsim.engine.transfer import TransferEngine, new_chunk

    env = clock.Environment()  # pdsim's: the hot path schedules plain heap entries
    nic = NIC(env, "n", 1e9, peak_util=1.0, min_util=1.0, saturation_bytes=1.0)
    bl = blacklist.build(BLACKLIST_POLICIES.validate({}), env, "p", lambda *a, **k: None)
    eng = TransferEngine(env, "p", 0, nic, bl, 0.0016, 30.0, 4, lambda *a, **k: None, Stats(),
                         Paths(env), 0, 0.537)
    room = new_room(env, 1)
    room.session, room.port = "d:1", 1
    req = new_request(env, 0, "c", "bench", 10, 1, True)
    done = []

    class Decode:  # a listener of the room (pdsim.engine.request.Listener)
        def room_done(self, _req: Request) -> None:
            done.append(env.now)

    room.decode = Decode()
    eng.submit(new_chunk(req, room, 0.5e9, last=True))
    env.run()
    assert done == [pytest.approx(0.0016 + 0.5)]


def test_write_deadlines_fire_at_their_own_time_when_overtaken():
    """TransferEngine keeps one write deadline armed (the earliest pending write's) instead of
    a heap of every write's: a write still pending at its deadline fails exactly at its start
    + transfer_timeout_s + 1 ns per byte, whether its timer was armed at its start, overtaken
    by a later write's earlier deadline, or armed when an earlier one fired; a write done in
    time fails nothing."""
    from pdsim.config.registry import BLACKLIST_POLICIES
    from pdsim.engine import blacklist
    from pdsim.engine.faults import Paths
    from pdsim.engine.request import Request, new_request, new_room
    from pdsim.engine.stats import Stats
    from pdsim.engine.transfer import TIMEOUT_S_PER_BYTE, TransferEngine, new_chunk

    env = clock.Environment()
    nic = NIC(env, "n", 1e8, peak_util=1.0, min_util=1.0, saturation_bytes=1.0)
    failed = []

    def log(event, *args, **kw):
        if event == "transfer_failed":
            failed.append((args[2], kw["detail"], env.now))

    bl = blacklist.build(BLACKLIST_POLICIES.validate({"policy": "never"}), env, "p",
                         lambda *a, **k: None)
    eng = TransferEngine(env, "p", 0, nic, bl, 0.0, 1.0, 4, log, Stats(), Paths(env), 0, 0.5)

    class Decode:  # a listener of the rooms (pdsim.engine.request.Listener)
        def room_done(self, _req: Request) -> None:
            pass

    def send(rid: int, port: int, nbytes: float) -> None:
        room = new_room(env, rid)
        room.session, room.port, room.decode = f"d:{port}", port, Decode()
        eng.submit(new_chunk(new_request(env, rid, "c", "bench", 10, 1, True), room, nbytes, True))

    # three writes share the NIC from t=0, one per queue: A's deadline (1.2 s) is armed
    # first, B's (1.05 s) overtakes it, C's (1.01 s) overtakes B's; C ends in time (0.3 s),
    # so its timer fires for nothing and B's is the front again; B then A time out
    sizes = {1: 2e8, 2: 0.5e8, 3: 1e7}
    for rid, nbytes in sizes.items():
        send(rid, rid - 1, nbytes)
    env.run()
    want = [(rid, "transfer_timeout", 1.0 + sizes[rid] * TIMEOUT_S_PER_BYTE) for rid in (2, 1)]
    assert failed == want


def test_chunked_prefill_default_follows_sglang():
    """server_args.py: 8192 for 60-160 GB GPUs, 4096 for 40 GB; DP attention divides by dp."""
    from pdsim.config.fleet import PrefillConfig
    from pdsim.engine.fleet import chunk_budget, default_chunked_prefill_size

    for name in ("H20", "H100", "H200", "A100"):
        assert default_chunked_prefill_size(profiles.gpu(name)) == 8192, name
    h20 = profiles.gpu("H20")
    dpa = dict(dp=4, tp=4, dp_attention=True)
    assert chunk_budget(PrefillConfig(**dpa), h20) == 2048  # the incident's prefill ranks
    assert chunk_budget(PrefillConfig(**dpa, chunked_prefill_size=16384), h20) == 4096
    assert chunk_budget(PrefillConfig(dp=4, tp=4), h20) == 8192  # no DP attention: no division
    small = profiles.GPU(**{**vars(h20), "name": "40GB", "hbm_mib": 40 * 1024})
    assert default_chunked_prefill_size(small) == 4096


def test_bench_metrics_count_streamed_aborts_as_bench_serving_does():
    """bench_serving.calculate_metrics: a streamed abort is a success with TTFT 0, output_len
    the requested length and latency its arrival; it enters TTFT, TPOT and E2E, not ITL."""
    import pandas as pd

    from pdsim.engine.summary import request_metrics

    rows = [  # arrival, first token, done, generated, output_len, status, http
        (0.0, 1.0, 3.0, 11, 11, "completed", 200),
        (0.0, 2.0, 4.0, 21, 21, "completed", 200),
        (0.0, float("nan"), 5.0, 0, 101, "failed", 200),  # streamed abort after 5 s
    ]
    df = pd.DataFrame(rows, columns=["t_arrival", "t_first_token", "t_done", "generated",
                                     "output_len", "status", "http_status"])
    df["stream"], df["input_len"], df["prefill_tokens"], df["cached_tokens"] = True, 100, 100, 0
    m = request_metrics(df, duration=5.0)
    assert m["successful_requests"] == 3 and m["failed"] == 1 and m["empty_responses"] == 1
    assert m["mean_ttft_ms"] == pytest.approx((1000 + 2000 + 0) / 3, abs=1e-3)
    tpots = [(3 - 1) / 10, (4 - 2) / 20, 5 / 100]
    assert m["mean_tpot_ms"] == pytest.approx(1000 * sum(tpots) / 3, abs=1e-3)
    assert m["mean_itl_ms"] == pytest.approx(1000 * (2 + 2) / (10 + 20), abs=1e-3)
    assert m["mean_e2e_ms"] == pytest.approx(1000 * (3 + 4 + 5) / 3, abs=1e-3)
    assert m["output_throughput_tok_s"] == pytest.approx((11 + 21 + 101) / 5)
    assert m["true_output_throughput_tok_s"] == pytest.approx((11 + 21) / 5)
    assert m["completed_mean_ttft_ms"] == pytest.approx(1500, abs=1e-3)


def test_summary_quantiles_are_pandas_quantiles_one_by_one():
    """summary._q takes several quantiles of a series in one np.quantile: each is, to the bit,
    what pandas' Series.quantile gives alone (NaNs dropped, linear), NaN for an empty series."""
    import numpy as np
    import pandas as pd

    from pdsim.engine.summary import _q

    rng = np.random.default_rng(7)
    for n in (0, 1, 2, 3, 10, 101, 1000):
        a = rng.random(n) * 1e3
        for nans in (0, 1, n // 2, n):
            b = a.copy()
            b[:nans] = np.nan
            rng.shuffle(b)
            want = [float(pd.Series(b).quantile(q)) for q in (0.5, 0.99, 0.9)]
            got = _q(b, 0.5, 0.99, 0.9)
            assert np.array_equal(got, want, equal_nan=True), (n, nans, got, want)
            assert _q(b, 0.99) == want[1:2] or (np.isnan(want[1]) and np.isnan(_q(b, 0.99)[0]))


def test_summary_codes_and_counts_are_the_string_comparisons_they_replace():
    """summary.codes gives each value the index of the name it equals (-1: none, a missing
    value too) and summary.counts the value_counts() of the strings under a mask, for pandas'
    pyarrow-backed strings (looked up by pyarrow) and for object columns alike: each the same
    as comparing the column's Python objects with each name."""
    from collections import Counter

    import numpy as np
    import pandas as pd

    from pdsim.engine.summary import codes, counts

    rng = np.random.default_rng(3)
    pool = ["completed", "failed", "timed_out", "", "failedx", "Failed", None]
    names = ("completed", "failed", "timed_out", "unfinished")
    for n in (0, 1, 7, 200):
        values = [pool[i] for i in rng.integers(0, len(pool), n)]
        mask = rng.random(n) < 0.5
        for col in (pd.Series(values, dtype="str"), pd.Series(values, dtype=object)):
            objects = col.to_numpy()
            want = np.full(n, -1)
            for i, name in enumerate(names):
                want[objects == name] = i
            assert np.array_equal(codes(col, names), want), (n, col.dtype)
            assert np.array_equal(codes(col.array, names), want), (n, col.dtype)
            assert np.array_equal(codes(col, ("failed",)) != 0, objects != "failed")
            got = counts(col, mask)
            assert got == Counter(v for v in objects[mask] if isinstance(v, str))
            assert got == col[mask].value_counts().to_dict() == counts(col.array, mask)
    assert isinstance(pd.Series(["a"], dtype="str").array, pd.arrays.ArrowStringArray)


def test_a_client_needs_only_its_frontend():
    """The client talks to a small interface (pdsim.engine.client.Frontend), not the Fleet: a stub
    that answers every request after 1 s runs a bench client to the end, with at most
    ``max_concurrency`` requests in flight, and client.py imports neither fleet nor router."""
    import ast
    from pathlib import Path

    import pdsim.engine.client as client_mod
    from pdsim.config.clients import BenchClientConfig
    from pdsim.engine.client import BenchClient
    from pdsim.engine.request import new_request
    from pdsim.util.rng import Streams

    env = clock.Environment()  # pdsim's: the hot path schedules plain heap entries
    made, live, peak, logged = [], [0], [0], []

    class Stub:
        def new_request(self, client, kind, input_len, output_len, stream, blocks, question,
                        attempt):
            made.append(new_request(env, len(made), client, kind, input_len, output_len,
                                    stream, blocks, question, attempt))
            return made[-1]

        def generate(self, req, on_return):
            live[0] += 1
            peak[0] = max(peak[0], live[0])

            def answer(_e):
                live[0] -= 1
                req.status, req.http_status, req.t_done = "completed", 200, env.now
                on_return(req)

            env.timeout(1.0).callbacks.append(answer)

        def flush(self, timeout, caller):
            raise AssertionError("no flush configured")

        def log(self, *args, **kw):
            logged.append(args)

    cfg = BenchClientConfig(kind="bench", num_prompts=7, max_concurrency=2, warmup_requests=1,
                            dataset={"kind": "random", "input_len": 64, "output_len": 8})
    c = BenchClient(env, cfg, 0, Stub(), Streams(1, {}))
    env.run(until=c.done)
    assert [r.kind for r in made].count("bench") == 7 and made[0].kind == "warmup"
    assert peak[0] == 2 and c.sent == 7 and c.unsent() == 0
    assert env.now == pytest.approx(1.0 + 4 * 1.0)  # warmup, then 7 prompts 2 at a time
    tree = ast.parse(Path(client_mod.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not imported & {"pdsim.engine.fleet", "pdsim.engine.router"}


class _EveryBlockChecked(PrefixCache):
    """A PrefixCache that never takes the no-orphan shortcuts of evict and insert (its epoch
    never matches)."""

    @property
    def _epoch(self) -> None:
        return None

    @_epoch.setter
    def _epoch(self, _value: object) -> None:
        pass


def _cache_op(op, ids, n, pages, c, a, held, seen) -> bool:
    """The prefix-cache property tests' common ops on cache ``c`` over allocator ``a``: insert
    ("i") or match ("m") ``ids``, evict ``n`` pages ("e"), or allocate ``pages`` outside the
    cache ("g", kept in ``held``); what match and evict return goes to ``seen``. False for
    any other op (the caller's own)."""
    if op == "i":
        c.insert(tuple(dict.fromkeys(ids)))
    elif op == "m":
        seen.append(c.match(tuple(ids)))
    elif op == "e":
        seen.append(c.evict(n))
    elif op == "g":
        p = a.alloc(pages)
        if p is not None:
            held.append(p)
    else:
        return False
    return True


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("imefg"), st.lists(st.integers(0, 12), max_size=6),
                          st.integers(0, 9)), max_size=40))
def test_prefix_cache_evicts_as_block_by_block_without_orphans(ops):
    """evict's shortcut (no orphans: pop as many least recent blocks as the missing pages
    need, at once) leaves the same blocks, use and peak as checking each block's epoch, over
    random inserts, matches, evictions, outside allocations and flushes."""
    caches = []
    for cls in (PrefixCache, _EveryBlockChecked):
        a = PageAllocator(8, page_size=1)
        caches.append((cls(a, block_tokens=2), a, []))
    for op, ids, n in ops:
        seen = []
        for c, a, held in caches:
            if not _cache_op(op, ids, n, n % 5, c, a, held, seen):  # "f": free a holding, or flush
                if held and n % 3 == 2:
                    a.release(held.pop())
                elif n % 3 == 0:  # a flush
                    a.reset()
                    c.reset()
                else:  # the allocator's alone: the cached blocks become orphans
                    a.reset()
            seen.append((list(c.blocks.items()), a.used, a.peak))
        assert seen[: len(seen) // 2] == seen[len(seen) // 2:]



@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("pimefgo"), st.lists(st.integers(0, 12), max_size=6),
                          st.integers(0, 9)), max_size=40),
       st.sampled_from([1, 2, 3]))
def test_a_private_run_is_cached_as_its_blocks_one_by_one(ops, block_tokens):
    """A prompt's private blocks given as a range (one LRU entry) leave the cache
    block by block exactly as the same ids given as a tuple do: the same blocks in the same
    LRU order, use, peak, matches and evictions, mixed with shared blocks, outside
    allocations, flushes and orphans. Fails if a run's insert evicted whole runs, or kept its
    first blocks instead of its last, or counted the peak after the evictions only."""
    caches = []
    for private in (True, False):
        a = PageAllocator(12, page_size=1)
        caches.append((PrefixCache(a, block_tokens=block_tokens), a, [], private))
    fresh = 100  # private ids: never inserted twice, never looked up
    for op, ids, n in ops:
        seen = []
        run = range(fresh, fresh + n)
        fresh += n
        for c, a, held, private in caches:
            if op == "p":
                c.insert(run if private else tuple(run))
            elif _cache_op(op, ids, n, n % 7, c, a, held, seen):
                pass
            elif op == "o":  # the allocator's reset alone: the cached blocks become orphans
                a.reset()
            elif held and n % 2:
                a.release(held.pop())
            else:  # a flush
                a.reset()
                c.reset()
            seen.append((c.cached(), c.pages, a.used, a.peak))
        assert seen[: len(seen) // 2] == seen[len(seen) // 2:]
        assert caches[1][0].runs == 0 and list(caches[1][0].blocks) == caches[1][0].cached()

def test_the_gauges_are_in_the_order_their_names_say():
    """Fleet.gauges returns the time series' gauges as a tuple in the order of fleet.GAUGES
    (the sampler's columns): each value is the gauge its name says, at instants through
    drop_timeout's flush, where every gauge but decode_prealloc is sometimes non-zero."""
    from pdsim.config import loader
    from pdsim.engine.fleet import GAUGES, Fleet

    f = Fleet(loader.load("scenarios/drop_timeout.yaml"), None)
    p, d = f.prefill_ranks, f.decode_ranks
    nonzero = set()
    t = 0.0
    while t < 40:
        t += 0.37
        f.env.run(until=t)
        got = dict(zip(GAUGES, f.gauges(), strict=True))  # (it catches the ranks up first)
        assert got == {
            "prefill_kv_used": sum(r.alloc.used for r in p) / sum(r.alloc.capacity for r in p),
            "decode_kv_used": sum(r.alloc.used for r in d) / sum(r.alloc.capacity for r in d),
            "prefill_queue": sum(r.queued() for r in p),
            "prefill_inflight": sum(len(r.inflight) for r in p),
            "transfer_queue": sum(e.queued() for e in f.engines),
            "decode_prealloc": sum(len(r.prealloc) for r in d),
            "decode_transfer": sum(len(r.transfer) for r in d),
            "decode_running": sum(len(r.running) for r in d),
            "blacklisted_pairs": f.stats.blacklisted_pairs}, t
        nonzero |= {k for k, v in got.items() if v}
    assert nonzero == set(GAUGES) - {"decode_prealloc"}


def test_pool_pages_reads_the_role_s_operator_predictor():
    """pool_pages takes the weights and KV per layer of the role's operator predictor, which
    also has the role's gather, two-batch overlap and imbalance: the same pages as the
    predictor of the bare layout it otherwise builds."""
    from pdsim.config.fleet import DecodeConfig
    from pdsim.model import profiles
    from pdsim.model.memory import pool_pages
    from pdsim.model.predictor import Layout, OperatorPredictor

    engine, fits = profiles.engine(), 0
    for gpu, model in (("H20", "dsv3-ci-test"), ("H100", "llama-3.1-8b"), ("H200", "deepseek-v3"),
                       ("H100", "qwen3-235b-a22b-fp8")):
        g, m = profiles.gpu(gpu), profiles.model(model)
        for tp, dp, dpa, ep in ((1, 1, False, 1), (8, 1, False, 1), (8, 8, True, 1),
                                (8, 4, True, 8), (4, 2, False, 4)):
            cfg = DecodeConfig(tp=tp, dp=dp, dp_attention=dpa, ep=ep)
            lay = Layout(tp=tp, dp=dp, dp_attention=dpa, ep=ep, gather=dp if dpa else 1,
                         tbo=True, imbalance=1.4)
            got = []
            for pred in (OperatorPredictor(g, m, engine, lay), None):
                try:
                    got.append(pool_pages(cfg, g, m, engine, pred))
                except ValueError as err:  # (weights that do not fit: the same message)
                    got.append(str(err))
            assert got[0] == got[1], (gpu, model, tp, dp, dpa, ep)
            fits += isinstance(got[0], int)
    assert fits >= 12


def test_a_fleet_that_fails_both_load_checks_names_its_pool_first():
    """The fleet check builds a role's predictor before its KV pool (the pool reads it) but
    reports the pool's error first, as it did: weights that do not fit, then a predictor
    without coefficients."""
    from conftest import small_fleet

    import pdsim

    d = small_fleet(predictor={"kind": "fitted"})
    d["fleet"]["gpu"] = "A10"  # dsv3-ci-test: too big for it, and never fitted on it
    with pytest.raises(pdsim.ScenarioError, match="at 'fleet.prefill': .* do not fit"):
        pdsim.load(d)
    d["fleet"]["gpu"] = "A100"  # fits, not fitted
    with pytest.raises(pdsim.ScenarioError, match="at 'predictor': .* no fitted coefficients"):
        pdsim.load(d)


def test_weights_that_do_not_fit_say_the_budget_and_what_moves_it():
    """The error said only 'do not fit in H100 memory': not that the budget is
    mem_fraction_static of HBM, nor what to change (DeepSeek-V3 on 8xH100 is a common try)."""
    from conftest import small_fleet

    import pdsim

    d = small_fleet()
    d["fleet"].update(gpu="H100", model="deepseek-v3")
    d["fleet"]["prefill"] = {"tp": 8}
    d["fleet"]["decode"] = {"tp": 8, "dp": 8, "dp_attention": True}
    with pytest.raises(pdsim.ScenarioError) as err:
        pdsim.load(d)
    msg = str(err.value)
    assert ("at 'fleet.prefill': deepseek-v3 weights (79 GiB per GPU at tp 8) do not fit in "
            "H100 memory: mem_fraction_static 0.818 (SGLang 0.5.9's default) of the 76.5 GiB "
            "free at start-up is 63 GiB and leaves no KV pool; spread them over more GPUs (a "
            "larger tp), pick a GPU "
            "with more memory or raise mem_fraction_static") in msg, msg
    d["fleet"]["prefill"]["tp"] = 16
    with pytest.raises(pdsim.ScenarioError,
                       match=r"\(89 GiB per GPU at tp 8 with dp attention\)"):
        pdsim.load(d)


"""Clients and routers beyond the incident: trace replay, the eval client, flush variants."""

from __future__ import annotations

import pytest
from conftest import TRACES, run_cached, small_fleet

import pdsim


def test_trace_replay_hits_the_prefix_cache():
    d = small_fleet()
    d["fleet"]["prefill"]["chunked_prefill_size"] = 32768  # 16384 per rank at dp 2
    d["clients"] = [{"kind": "bench", "num_prompts": 300, "request_rate": "trace",
                     "warmup_requests": 0,
                     "dataset": {"kind": "trace", "path": str(TRACES / "synthetic_trace.jsonl.gz"),
                                 "max_input_len": 16000}}]
    res = pdsim.run(d)
    m = res.measured
    assert len(m) == 300 and (m.status == "completed").all()
    # arrivals follow the trace's timestamps (ms -> s)
    import json

    from pdsim.engine.client import open_trace

    with open_trace(TRACES / "synthetic_trace.jsonl.gz") as f:
        ts = [json.loads(next(f))["timestamp"] for _ in range(300)]
    assert m.t_arrival.max() == pytest.approx((ts[-1] - ts[0]) / 1e3, abs=1e-6)
    # the synthetic trace shares prefixes: the radix cache saves prefill work
    assert m.cached_tokens.sum() > 0
    assert (m.prefill_tokens == m.input_len - m.cached_tokens).all()


def _block_hit_rate(path, capacity_blocks):
    """Share of prompt blocks found as cached prefixes, replaying the trace in order."""
    import json

    from pdsim.engine.client import open_trace
    from pdsim.engine.kv import PageAllocator, PrefixCache

    alloc = PageAllocator(capacity_blocks, page_size=512)
    cache = PrefixCache(alloc, block_tokens=512)
    hits = total = 0
    with open_trace(path) as f:
        for line in f:
            blocks = tuple(json.loads(line)["hash_ids"])
            hits += cache.match(blocks)
            total += len(blocks)
            cache.insert(blocks)
    return hits / total


@pytest.mark.parametrize("trace,unbounded,lru10k", [("synthetic_trace.jsonl.gz", 0.640, 0.424),
                                                   ("conversation_trace.jsonl.gz", 0.366, 0.211)])
def test_prefix_cache_matches_the_traces_published_hit_rates(trace, unbounded, lru10k):
    """scenarios/traces/README.md: hit rates with an unbounded and a 10,000-block LRU cache."""
    path = TRACES / trace
    assert _block_hit_rate(path, 10**9) == pytest.approx(unbounded, abs=0.002)
    assert _block_hit_rate(path, 10_000) == pytest.approx(lru10k, abs=0.002)


HOP = 0.5e-3  # router <-> server, each way (router.http_latency_ms)


def _eval_fleet(**eval_cfg):
    """The eval on a fleet whose decode rank 0 is unreachable for its first 2 s: the writes to
    it fail, the one-strike blacklist takes both prefill ranks' pairs to it for good, and every
    later request routed there fails with a 500 after its prefill."""
    d = small_fleet()
    d["clients"] = [{"kind": "eval", "questions": 120, "threads": 16, "sdk_backoff_s": 0.1,
                     "dataset": {"kind": "random", "input_len": 600, "output_len": 64},
                     **eval_cfg}]
    d["faults"] = [{"kind": "decode_unreachable", "decode_rank": 0, "at_s": 0.0,
                    "duration_s": 2.0}]
    return d


def test_eval_client_retries_and_answers():
    res = pdsim.run(_eval_fleet())
    assert res.summary["blacklisted_pairs_max"] == 2  # both prefill ranks -> decode rank 0
    ans = res.answers
    assert len(ans) == 120
    m = res.measured[res.measured.client == "eval"].sort_values(["question", "attempt"])
    # non-streaming failures are 500s that the SDK and the sampler retry
    failed = m[m.status == "failed"]
    assert len(failed) > 100 and (failed.http_status == 500).all()
    assert set(m.http_status) == {200, 500}
    assert ans.attempts.sum() == len(m)
    # a question is answered iff its last attempt completed; retries rescue some questions
    # (their later tries land on decode rank 1) and not others (18 requests, all failed)
    last = m.groupby("question").tail(1).set_index("question")
    joined = ans.set_index("question").join(
        last[["status", "t_done"]].rename(columns={"t_done": "t_done_req"}))
    assert ((joined.status == "completed") == joined.answered).all()
    assert ((ans.attempts > 1) & ans.answered).sum() > 10
    empty = joined[~joined.answered]
    assert len(empty) > 0 and (empty.attempts == 18).all()
    # spacing: the SDK backs off 0.1 * 2^j after its j-th 500 within a try; the sampler sleeps
    # 2^k after failed try k -- after the last (k = 5) too, before the empty answer
    nxt = m.groupby("question").t_arrival.shift(-1)
    gap = (nxt - m.t_done - HOP).dropna()
    a = m.loc[gap.index, "attempt"]
    expected = (0.1 * 2.0 ** (a % 3)).where(a % 3 < 2, 2.0 ** (a // 3))
    assert ((gap - expected).abs() < 1e-6).all()
    assert ((empty.t_done - empty.t_done_req - HOP - 2.0**5).abs() < 1e-6).all()


def test_eval_exhausted_retries_give_empty_answers():
    res = pdsim.run(_eval_fleet(tries=1, sdk_retries=0))
    s = res.summary["clients"]["eval"]
    assert res.summary["blacklisted_pairs_max"] == 2
    assert s["requests"] == 120  # one request per question: no retry of any kind
    assert s["empty_answers"] == s["failed"] > 0
    ans = res.answers.set_index("question")
    m = res.measured.set_index("question")
    empty = ans[~ans.answered]
    assert (m.loc[empty.index, "status"] == "failed").all()
    # even with one try, the sampler sleeps 2^0 s after it before answering empty
    assert ((empty.t_done - m.loc[empty.index, "t_done"] - HOP - 1.0).abs() < 1e-6).all()


def test_model_gateway_reports_partial_success_on_refusals():
    res = run_cached("drop_timeout", "router.flush_handler=model_gateway",
                     "flush.semantics=reject_if_busy")
    call = [c for c in res.flush_calls if c["caller"] == "ci_bench"][0]
    assert call["status"] == 206
    assert res.summary["transfer_failures"] == 0


def test_rust_router_answers_502_on_refusals():
    res = run_cached("drop_timeout", "router.flush_handler=rust_router",
                     "flush.semantics=reject_if_busy")
    call = [c for c in res.flush_calls if c["caller"] == "ci_bench"][0]
    assert call["status"] == 502


def test_raise_for_status_sees_a_refusal_only_through_a_router_that_reports_it():
    sets = ("flush.semantics=reject_if_busy", "clients.1.flush.mode=raise_for_status")
    hidden = run_cached("drop_timeout", *sets).summary["clients"]["ci_bench"]
    assert "aborted" not in hidden and hidden["requests"] == 1000  # mini_lb: always 200
    told = run_cached("drop_timeout", *sets, "router.flush_handler=rust_router")
    s = told.summary["clients"]["ci_bench"]
    assert "raise_for_status" in s.get("aborted", "")
    assert s["requests"] == 0


def test_flush_waits_then_times_out_when_never_idle():
    """A positive timeout on a fleet that never idles answers 400 at the deadline."""
    res = run_cached("drop_timeout", "router.flush_handler=mini_lb_fixed",
                     "clients.1.flush.timeout_s=5")
    s = res.summary
    assert sum(v["timed_out"] for v in s["flushes"].values()) > 0
    assert s["transfer_failures"] == 0
    ev = res.events
    t_out = ev[ev.event == "flush_timed_out"].time
    t_in = ev[(ev.event == "router_flush") & (ev.peer == "ci_bench")].time.iloc[0]
    hop = 0.5e-3  # router -> server
    assert ((t_out - t_in - hop - 5.0).abs() < 1e-6).all()


def test_one_pending_flush_per_server():
    d = small_fleet()
    d["router"] = {"flush_handler": "mini_lb_fixed"}
    d["operator_flushes"] = [{"at_s": 2.0, "timeout_s": 30}, {"at_s": 2.5, "timeout_s": 30}]
    res = pdsim.run(d)
    ev = res.events
    refused = ev[(ev.event == "flush_rejected") & ev.detail.str.contains("already in progress")]
    assert len(refused) == 2  # the second call, on the prefill and on the decode server


def test_retraction_under_memory_pressure_keeps_invariants():
    d = small_fleet()
    d["fleet"]["decode"]["kv_pool_tokens"] = 30000
    d["clients"][0]["dataset"] = {"kind": "random", "input_len": 2048, "output_len": 1024,
                                  "range_ratio": 0.5}
    res = pdsim.run(d)
    s = res.summary
    assert s["retractions"] > 0
    m = res.measured
    assert (m.status == "completed").all()
    assert s["tokens_generated_fleet"] == int(res.requests.generated.sum())
    for pool in res.kv_pools.values():
        assert pool["peak"] <= pool["capacity"]


def test_random_prompts_of_different_clients_share_no_prefix():
    # two bench clients and no flush: the second runs on the cache the first filled
    res = run_cached("drop_timeout", "clients.0.flush.mode=none", "clients.1.flush.mode=none")
    m = res.measured
    # only the prompt each client's warmup used (bench_serving warms up on prompt 0) hits
    assert ((m.cached_tokens > 0).groupby(m.client).sum() <= 1).all()

"""SGLang's admission on PD servers (issue 29, item 4): the decode reserve gate
(``num_reserved_decode_tokens``), retraction that offloads rather than recomputes, the
version-keyed retraction stop rule, and prefill admission by SGLang's PrefillAdder budgets
(``max_prefill_tokens`` with its first-request exemption, request slots held by transfers).
"""

from __future__ import annotations

import numpy as np
import pytest

import pdsim
from pdsim.engine.decode import DecodeRank


def _pressure(**decode) -> dict:
    """A Hopper PD pair under KV pressure: Llama-3.1-8B on H100 (one GPU a role; SGLang sizes
    the decode pool to ~366k tokens), 512 requests in flight of ~0.9k prompt and up to 1k
    output tokens: ~1M tokens wanted at once."""
    d = {"name": "kv_pressure", "seed": 1, "horizon_s": 3600,
         "fleet": {"gpu": "H100", "model": "llama-3.1-8b", "prefill": {},
                   "decode": {"max_running_requests": 1024, **decode}},
         "clients": [{"kind": "bench", "num_prompts": 1536, "max_concurrency": 512,
                      "warmup_requests": 0,
                      "dataset": {"kind": "random", "input_len": 1024, "output_len": 1024,
                                  "range_ratio": 0.8}}]}
    return d


def test_the_reserve_gate_keeps_retractions_rare_under_kv_pressure():
    """Issue 29: without SGLang's gate pdsim retracted thousands of times under KV pressure
    (GB200 at concurrency 4,096: 13,760 retractions, TPOT +163%). With it (512 tokens a
    request, SGLang's default) this run retracts a few dozen of 1,536 requests; with no
    reserve, most of them."""
    gated = pdsim.run(_pressure()).summary
    assert gated["completed_requests"] == 1536
    assert gated["retractions"] < 0.05 * 1536
    bare = pdsim.run(_pressure(num_reserved_decode_tokens=0)).summary
    assert bare["retractions"] > 0.5 * 1536
    assert bare["retractions"] > 10 * gated["retractions"]
    assert gated["mean_tpot_ms"] < 0.9 * bare["mean_tpot_ms"]


def test_nothing_new_is_pre_allocated_while_a_request_is_retracted(monkeypatch):
    """``process_decode_queue``: while the retracted queue is not empty, no request is
    pre-allocated (and retracted ones resume under the same gate, at no recompute: a PD
    decode offloads their KV to host memory)."""
    seen = {"prealloc_while_retracted": 0, "retracted_seen": 0, "recompute": 0}
    orig_try, orig_time = DecodeRank._try_prealloc, DecodeRank.step_time

    def tried(self):
        before = len(self.transfer)
        orig_try(self)
        if self.retracted:
            seen["retracted_seen"] += 1
            seen["prealloc_while_retracted"] += len(self.transfer) > before

    def timed(self, plan):
        seen["recompute"] += plan[2]
        return orig_time(self, plan)

    monkeypatch.setattr(DecodeRank, "_try_prealloc", tried)
    monkeypatch.setattr(DecodeRank, "step_time", timed)
    d = _pressure(num_reserved_decode_tokens=64)
    d["clients"][0]["num_prompts"] = 800
    res = pdsim.run(d)
    assert res.summary["retractions"] > 0 and seen["retracted_seen"] > 0
    assert seen["prealloc_while_retracted"] == 0
    assert seen["recompute"] == 0
    assert (res.requests.generated == res.requests.output_len).all()


def test_the_gate_keeps_room_for_the_running_request_that_needs_most():
    """``need_space_for_single_req``: the gate holds back, if larger than the reserves, what
    the running request that needs most would need to finish alone (prompt + output clipped
    to 4,096, less what the running batch holds). On a 6,000-token decode pool, a 1k+4k
    request running leaves ~1,000 tokens allocatable, so a second 1k prompt (which needs 1,000
    + 512) is pre-allocated only once the first has finished; the reserves alone (512) would
    have let it in at once."""
    def bench(name, start, out):
        return {"kind": "bench", "name": name, "num_prompts": 1, "start_s": start,
                "warmup_requests": 0,
                "dataset": {"kind": "random", "input_len": 1000, "output_len": out,
                            "range_ratio": 1.0}}
    d = {"name": "single", "seed": 1, "horizon_s": 600,
         "fleet": {"gpu": "H100", "model": "llama-3.1-8b", "prefill": {},
                   "decode": {"kv_pool_tokens": 6000}},
         "clients": [bench("first", 0.0, 4000), bench("second", 1.0, 16)]}
    req = pdsim.run(d).requests.set_index("client")
    assert (req.status == "completed").all()
    assert req.t_prefill_start["second"] >= req.t_done["first"]
    assert req.t_done["first"] > 10.0


@pytest.mark.parametrize("running,extra,held", [(4, None, 12), (4, 0, 4), (40, None, 40)])
def test_a_small_decode_batch_has_twice_its_slots_again_for_pre_allocation(
        monkeypatch, running, extra, held):
    """SGLang's DecodeReqToTokenPool has max_running_requests + pre_alloc_size slots,
    pre_alloc_size = 2 x max_running_requests when that is <= 32, else 0 (every release;
    0.5.23's --disaggregation-decode-extra-slots): pre-allocated, transferring, waiting and
    running requests share them, the running batch alone stays within max_running_requests.
    40 requests at once: a 4-request decode holds 12 (4 with no extra slots), a 40-request
    one 40."""
    most = {"held": 0}
    orig = DecodeRank._try_prealloc

    def tried(self):
        orig(self)
        most["held"] = max(most["held"],
                           len(self.transfer) + len(self.waiting) + len(self.running))

    monkeypatch.setattr(DecodeRank, "_try_prealloc", tried)
    decode = {"max_running_requests": running}
    if extra is not None:
        decode["disaggregation_decode_extra_slots"] = extra
    d = {"name": "slots", "seed": 1, "horizon_s": 600,
         "fleet": {"gpu": "H100", "model": "llama-3.1-8b", "prefill": {}, "decode": decode},
         "clients": [{"kind": "bench", "num_prompts": 40, "warmup_requests": 0,
                      "dataset": {"kind": "random", "input_len": 256, "output_len": 256,
                                  "range_ratio": 1.0}}]}
    res = pdsim.run(d)
    assert (res.requests.status == "completed").all()
    assert most["held"] == held
    assert res.timeseries.decode_running.max() == min(running, 40)


def test_retraction_stops_by_the_release_rule():
    """SGLang before 0.5.2 retracts until 20 decode steps of every request left fit; from 0.5.2
    (PR #9989) only until the next step does: the older release retracts more per event."""
    d = _pressure(num_reserved_decode_tokens=0)
    d["clients"][0]["num_prompts"] = 800
    new = pdsim.run(d)
    old = pdsim.run(d, sets=["engine.version=0.5.1.post1"])

    def per_event(res):
        ev = res.events
        return ev[ev.event == "retract"].groupby("time").size().mean()

    assert old.summary["retractions"] > 0 and new.summary["retractions"] > 0
    assert per_event(old) > 1.5 * per_event(new)


def test_the_decode_reserve_is_the_scenario_field_with_sglang_name():
    sc = pdsim.load({"fleet": {"gpu": "H100", "model": "llama-3.1-8b"},
                     "clients": [{"kind": "bench", "num_prompts": 1}]})
    assert sc.fleet.decode.num_reserved_decode_tokens == 512
    with pytest.raises(pdsim.ScenarioError, match="num_reserved_decode_tokens"):
        pdsim.load({"fleet": {"gpu": "H100", "model": "llama-3.1-8b",
                              "decode": {"retract_reserve_tokens": 0}},
                    "clients": [{"kind": "bench", "num_prompts": 1}]})


# --- prefill admission (PrefillAdder) on a PD prefill server ------------------------------------


def _prefill_only(max_prefill: int, n: int = 40, input_len: int = 3000) -> dict:
    return {"name": "adder", "seed": 2, "horizon_s": 900,
            "fleet": {"gpu": "H100", "model": "llama-3.1-8b",
                      "prefill": {"chunked_prefill_size": 8192,
                                  "max_prefill_tokens": max_prefill}},
            "clients": [{"kind": "bench", "num_prompts": n, "request_rate": "inf",
                         "warmup_requests": 0,
                         "dataset": {"kind": "random", "input_len": input_len, "output_len": 4,
                                     "range_ratio": 1.0}}]}


def test_max_prefill_tokens_holds_back_a_second_request_it_does_not_fit():
    """``real_input_tokens >= rem_input_tokens and can_run_list`` -> OTHER: with 4,096 tokens
    of max_prefill_tokens, a second 3,000-token prompt waits for the next forward (the chunk
    budget, 8,192, would have taken it whole): one request a forward. SGLang's default
    (16,384) packs two and a chunk of a third."""
    tight = pdsim.run(_prefill_only(4096)).summary
    assert tight["prefill_steps"] == 40
    loose = pdsim.run(_prefill_only(16384)).summary
    assert loose["prefill_steps"] <= 16


def test_the_first_request_of_a_forward_is_exempt_from_max_prefill_tokens():
    res = pdsim.run(_prefill_only(1024, n=3, input_len=10000))
    assert (res.requests.status == "completed").all()
    # 10,000 tokens in chunks of the 8,192-token budget: two forwards each
    assert res.summary["prefill_steps"] == 6


def test_requests_whose_kv_awaits_transfer_hold_prefill_request_slots():
    """``req_to_token_pool.available_size()`` on a prefill server: a request keeps its slot
    until its KV is sent, so with 4 slots and a slow NIC at most 4 requests are between their
    prefill's start and their transfer's end at any time."""
    d = _prefill_only(16384, n=30, input_len=1000)
    d["fleet"]["prefill"]["max_running_requests"] = 4
    d["transfer"] = {"nic_gbps": 2.0}  # ~0.5 s a prompt's KV: transfers pile up
    res = pdsim.run(d)
    req = res.requests
    assert (req.status == "completed").all()
    start, sent = req.t_prefill_start.to_numpy(), req.t_transfer_done.to_numpy()
    held = [int(((start <= t) & (sent > t)).sum()) for t in np.unique(start)]
    assert max(held) == 4


# --- retraction (one rule for PD decode and colocated ranks) -------------------------------------


@pytest.mark.parametrize("mode", ["pd", "colocated"])
def test_the_last_running_request_is_never_retracted(mode):
    """``retract_decode`` keeps at least one request (``if len(sorted_indices) == 1: break``).
    One request whose output (6,000 tokens, past the 4,096 admission clip) outgrows a
    6,000-token pool: it is never retracted; it takes the last free pages, and when none is
    left SGLang raises "Out of memory even after retracting all other requests": pdsim fails
    it then (decode_out_of_memory), having generated what the pool held."""
    client = [{"kind": "bench", "num_prompts": 1, "warmup_requests": 0,
               "dataset": {"kind": "random", "input_len": 1000, "output_len": 6000,
                           "range_ratio": 1.0}}]
    if mode == "pd":
        fleet = {"gpu": "H100", "model": "llama-3.1-8b", "prefill": {},
                 "decode": {"kv_pool_tokens": 6000}}
    else:
        fleet = {"gpu": "H100", "model": "llama-3.1-8b", "mode": "colocated",
                 "colocated": {"kv_pool_tokens": 6000}}
    res = pdsim.run({"name": "alone", "seed": 1, "horizon_s": 600, "fleet": fleet,
                     "clients": client})
    req = res.requests.iloc[0]
    assert res.summary["retractions"] == 0
    assert req.status == "failed" and req.reason == "decode_out_of_memory"
    assert req.input_len + req.generated == 6000  # (the pool: its last pages taken)
    assert "decode_out_of_memory" in set(res.events.event)
    assert res.timeseries.failed.iloc[-1] == 1  # (counted once: by request.end)


@pytest.mark.parametrize("pool,forwards", [(2050, 2), (2051, 1)])
def test_a_prefill_server_admits_by_prefill_adder_budgets(pool, forwards):
    """A PD prefill runs SGLang's PrefillAdder (the colocated rank's implementation) with
    ``max_new_tokens = 1``: a request is admitted while its tokens plus that one output token
    are fewer than the free tokens less what the forward took already (its page-rounded
    tokens and one token each). Two 1,024-token prompts share a forward only from a pool of
    2,051 tokens; allocating pages alone would pack them from 2,048."""
    d = _prefill_only(16384, n=2, input_len=1024)
    d["fleet"]["prefill"].update(kv_pool_tokens=pool, prefix_cache=True)
    res = pdsim.run(d)
    assert (res.requests.status == "completed").all()
    assert res.summary["prefill_steps"] == forwards


@pytest.mark.parametrize("mode", ["pd", "colocated"])
def test_a_truncated_prompt_is_page_aligned_from_0_5_6_post2(mode):
    """PrefillAdder.add_one_req truncates a prompt the chunk budget does not hold to
    ``rem_chunk // page * page`` tokens (0.5.6.post2 on), ``rem_chunk - page + 1`` before; a
    continuing chunk takes the whole budget (add_chunked_req). Page 16, a 1,000-token budget,
    one 5,000-token prompt: chunks of 992 then 1,000s (0.5.9), 985 then 1,000s (0.5.1.post1)."""
    role = {"page_size": 16, "chunked_prefill_size": 1000}
    fleet = ({"gpu": "H100", "model": "llama-3.1-8b", "prefill": role,
              "decode": {"page_size": 16}} if mode == "pd" else
             {"gpu": "H100", "model": "llama-3.1-8b", "mode": "colocated", "colocated": role})
    d = {"name": "pages", "seed": 1, "horizon_s": 100, "fleet": fleet,
         "clients": [{"kind": "bench", "num_prompts": 1, "warmup_requests": 0,
                      "dataset": {"kind": "random", "input_len": 5000, "output_len": 4,
                                  "range_ratio": 1.0}}]}
    for version, first in (("0.5.9", 992), ("0.5.1.post1", 985)):
        res = pdsim.run(d, sets=[f"engine.version={version}"], record_steps=True)
        chunks = [s[5] for s in res.recorder.steps if s[3] == "prefill"]
        assert chunks == [first, 1000, 1000, 1000, 1000, 5000 - first - 4000], version

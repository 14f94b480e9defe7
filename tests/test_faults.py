"""Other ways onto and off the blacklist: dead decodes, partitions, rare random errors."""

from __future__ import annotations

import pytest
from conftest import small_fleet

import pdsim


def _fleet(**over):
    d = small_fleet(**over)
    # paced, so that the run outlasts the faults (a run ends when its clients are done)
    d["clients"][0].update(num_prompts=1500, max_concurrency=32, request_rate=10.0)
    d["clients"][0]["dataset"] = {"kind": "random", "input_len": 1024, "output_len": 64}
    return d


def test_dead_decode_is_probed_with_backoff_then_cleared():
    d = _fleet(blacklist={"policy": "v0_5_23"},
               faults=[{"kind": "decode_unreachable", "decode_rank": 0, "at_s": 1.0,
                        "duration_s": 100.0}])
    d["clients"][0]["num_prompts"] = 2500  # outlast the third probe
    res = pdsim.run(d)
    ev = res.events
    adds = ev[ev.event == "blacklist_add"]
    assert len(adds) == 2 and set(adds.peer) == {"decode-0.r0:17000"}  # both prefill ranks
    assert set(ev[ev.event == "transfer_failed"].detail) >= {"decode_unreachable"}
    for owner, group in ev[ev.event == "probe"].groupby("component"):
        added = adds[adds.component == owner].time.iloc[0]
        gaps = (group.time - added).tolist()
        # the first probe goes out 30 s after the add; a silent peer holds it for the 30 s
        # transfer timeout and it fails; the interval doubles to 60 s; the second probe finds
        # the decode back (at 101 s) and costs a call and a 4 KiB write
        assert gaps == pytest.approx([60.0, 120.0], abs=0.01)
        assert [d.split()[0] for d in group.detail] == ["failed", "ok"]
    removes = ev[ev.event == "blacklist_remove"]
    assert set(removes.detail) == {"probe"} and (removes.time > 101.0).all()
    assert res.summary["blacklisted_pairs_final"] == 0


def _partition(**blacklist):
    # a partition also stops bootstrapping across the cut, so only writes in flight at the cut
    # meet it: a 0.3 s call per write makes sure some are
    return _fleet(blacklist=blacklist, transfer={"call_latency_ms": 300},
                  faults=[{"kind": "partition", "prefill_server": 0, "at_s": 2.0,
                           "duration_s": 20.0}])


def test_partition_heartbeat_loss_then_reregistration_clears_the_blacklist():
    d = _partition()  # recovery probe off
    # a burst of long prompts 2 s before the heartbeat is lost: the decode has pre-allocated
    # them and waits for KV while they queue at the prefill
    d["clients"].append({"kind": "bench", "name": "burst", "start_s": 8.0, "num_prompts": 64,
                         "warmup_requests": 0, "dataset": {"kind": "random", "input_len": 8192,
                                                           "output_len": 16, "range_ratio": 1.0}})
    res = pdsim.run(d)
    ev = res.events
    lost = ev[ev.event == "heartbeat_lost"]
    assert len(lost) == 1
    t_lost = lost.time.iloc[0]
    assert 2.0 + 5.0 <= t_lost <= 2.0 + 15.0  # two 5 s heartbeats missed
    assert res.summary["blacklisted_pairs_max"] > 0
    removes = ev[ev.event == "blacklist_remove"]
    assert len(removes) == len(ev[ev.event == "blacklist_add"])
    assert set(removes.detail) == {"decode re-registered"}
    assert (removes.time >= 22.0).all()
    assert res.summary["blacklisted_pairs_final"] == 0
    # the heartbeat loss fails, at that instant, every room from the partitioned prefill the
    # decode was still waiting on -- here the burst queued behind the prefill
    failed = res.requests[res.requests.status == "failed"]
    lost_rooms = failed[failed.reason == "prefill_heartbeat_lost"]
    waiting = lost_rooms[lost_rooms.t_arrival <= t_lost]
    assert len(waiting) >= 64
    assert (waiting.t_done == t_lost).all()
    # and, until the partition heals, a new room from that prefill fails as soon as the decode
    # takes it (it can no longer reach the prefill's bootstrap server): after the decode's
    # tokenize and bootstrap handshake (~0.08 s here), not after any timeout
    later = lost_rooms[lost_rooms.t_arrival > t_lost]
    assert len(later) and ((later.t_done - later.t_arrival) < 0.5).all()
    assert (later.t_arrival < 22.0 + 5.0).all()
    # after the heal and re-registration, requests complete again
    late = res.measured[res.measured.t_arrival > 40.0]
    assert len(late) and (late.status == "completed").all()


def test_without_reregistration_the_partition_leaves_pairs_blacklisted():
    res = pdsim.run(_partition(reregister_on_invalidate=False))
    assert res.summary["blacklisted_pairs_final"] == res.summary["blacklisted_pairs_max"] > 0


def test_rare_errors_amplified_by_one_strike_not_by_three():
    errs = [{"kind": "transfer_errors", "probability": 0.05, "from_s": 5.0, "to_s": 10.0}]
    one = pdsim.run(_fleet(faults=errs)).summary
    three = pdsim.run(_fleet(faults=errs, blacklist={"strikes": 3})).summary
    injected = one["transfer_failures_by_reason"]["injected_error"]
    assert injected >= 1 and one["blacklisted_pairs_max"] >= 1
    assert one["failed"] > 100 * injected  # fast-fails on the pairs those errors blacklisted
    # three strikes: the same rare errors fail only the requests they hit
    assert three["blacklisted_pairs_max"] == 0
    assert three["failed"] == three["transfer_failures_by_reason"]["injected_error"] >= 1


def test_fault_stream_does_not_move_arrivals_or_lengths():
    d = _fleet()
    d["clients"][0].update(request_rate=50.0, max_concurrency=None)
    base = pdsim.run(d).measured
    d["faults"] = [{"kind": "transfer_errors", "probability": 0.01}]
    faulty = pdsim.run(d).measured
    assert base.t_arrival.equals(faulty.t_arrival)
    assert base.input_len.equals(faulty.input_len)

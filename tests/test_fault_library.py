"""The fault library and what a write to a dead peer costs, policy by policy (mechanisms)."""

from __future__ import annotations

import pytest
from conftest import small_fleet

import pdsim
from pdsim.cli.main import main
from pdsim.config.registry import FAULTS
from pdsim.config.scenario import from_dict
from pdsim.config.units import ScenarioError

CALL = 0.0016  # transfer.call_latency_ms default
QP = 0.537  # transfer.qp_retry_s default


def _fleet(policy: str = "permanent", faults: list | None = None, backlog: bool = False,
           **over) -> dict:
    """1 prefill server (2 ranks), 2 decode servers (2 ranks each): 4 sessions, one per
    transfer queue. ``backlog``: an open burst the prefill works through for ~20 s, so
    requests bootstrapped before a fault keep reaching the transfer stage after it."""
    d = small_fleet(**over)
    d["fleet"]["decode"]["servers"] = 2
    d["blacklist"] = {"policy": policy, **d.get("blacklist", {})}
    d["faults"] = faults or []
    d["horizon_s"] = 120
    c = d["clients"][0]
    if backlog:
        c.update(num_prompts=500, max_concurrency=256, request_rate="inf")
        c["dataset"] = {"kind": "random", "input_len": 8192, "output_len": 16}
        d["fleet"]["prefill"]["chunked_prefill_size"] = 2048
    else:
        c.update(num_prompts=300, max_concurrency=None, request_rate=10.0)
        c["dataset"] = {"kind": "random", "input_len": 2048, "output_len": 32}
    return d


def _failures(res: pdsim.Result, reason: str):
    ev = res.events
    return ev[(ev.event == "transfer_failed") & (ev.detail == reason)]


# --- what a write to a dead peer costs --------------------------------------------------------


def test_under_never_each_request_to_a_silent_decode_waits_out_the_transfer_timeout():
    dead = [{"kind": "decode_unreachable", "decode_rank": 0, "at_s": 2.0, "duration_s": 1000}]
    res = pdsim.run(_fleet("never", dead, transfer={"transfer_timeout_s": 2.0}))
    s = res.summary
    failed = res.requests[res.requests.reason == "decode_unreachable"]
    assert len(failed) >= 20 and s["failed_by_reason"] == {"decode_unreachable": len(failed)}
    assert s["dead_peer_writes"] == len(failed)  # every one of them tried the write
    per = s["dead_peer_write_s"] / s["dead_peer_writes"]
    # the call, then the QP's retries and the reconnect wait until Mooncake's deadline:
    # transfer_timeout_s plus 1 ns per byte (a chunk here is at most 4096 x 4,608 B)
    assert 2.0 + CALL <= per <= 2.0 + CALL + 4096 * 4608e-9
    # the same decode under one strike: one write per (prefill rank, session), then fast fails
    perm = pdsim.run(_fleet("permanent", dead, transfer={"transfer_timeout_s": 2.0})).summary
    assert perm["dead_peer_writes"] == 2  # two prefill ranks
    assert perm["failed_by_reason"]["blacklisted_session"] == perm["failed"] - 2


def test_permanent_cuts_a_crashed_decode_off_after_one_failure_per_pair():
    crash = [{"kind": "decode_crash", "decode_server": 0, "at_s": 3.0,
              "restart_after_s": 200.0}]
    perm = pdsim.run(_fleet("permanent", crash, backlog=True))
    never = pdsim.run(_fleet("never", crash, backlog=True))
    old = {"decode-0.r0:17000", "decode-0.r1:17001"}
    # never: every request whose KV was bound for a crashed session tries the write, each
    # failing after the QP's retry budget (the reconnect is refused at once)
    writes = _failures(never, "decode_crashed")
    assert len(writes) >= 20 and set(writes.peer) == old
    assert never.summary["dead_peer_writes"] == len(writes)
    assert never.summary["dead_peer_write_s"] == pytest.approx(len(writes) * (CALL + QP), abs=1e-3)
    # permanent: exactly one such write per (prefill rank, old session); the rest fail fast
    writes = _failures(perm, "decode_crashed")
    assert writes.groupby(["component", "rank", "peer"]).size().tolist() == [1, 1, 1, 1]
    fast = _failures(perm, "blacklisted_session")
    assert set(fast.peer) == old and len(fast) == len(_failures(never, "decode_crashed")) - 4
    # both answer every request that was on the crashed server with a broken connection
    for res in (perm, never):
        r = res.requests
        assert (r[r.reason == "decode_crashed"].http_status == 502).all()


def test_a_ttl_shorter_than_a_hang_lets_requests_fail_again_after_expiry():
    hang = [{"kind": "decode_hang", "decode_server": 0, "at_s": 3.0, "duration_s": 60.0}]
    over = {"transfer": {"transfer_timeout_s": 3.0}}
    perm = pdsim.run(_fleet("permanent", hang, backlog=True, **over))
    ttl = pdsim.run(_fleet("ttl", hang, backlog=True, blacklist={"ttl_s": 1.0}, **over))
    # one strike: one write per pair waits out the 3 s deadline against the hung decode
    assert _failures(perm, "decode_hung").groupby(["rank", "peer"]).size().max() == 1
    # TTL 1 s: the entry expires while the decode still hangs; the next chunk tries the write,
    # waits 3 s again and fails again
    again = _failures(ttl, "decode_hung")
    per_pair = again.groupby(["rank", "peer"]).time.apply(sorted)
    assert per_pair.map(len).max() >= 2
    ev = ttl.events
    for (rank, peer), times in per_pair.items():
        owner = f"prefill-0.r{rank}"
        expiries = ev[(ev.event == "blacklist_remove") & (ev.component == owner)
                      & (ev.peer == peer) & (ev.detail == "ttl")].time.tolist()
        for t in times[1:]:  # each later failure follows an expiry by the write's 3 s
            assert any(e + 3.0 <= t + 1e-6 for e in expiries)
    assert (again.time < 3.0 + 60.0).all()  # all of it while the decode hangs
    assert ttl.summary["dead_peer_writes"] > perm.summary["dead_peer_writes"]


def test_a_breakers_half_open_trial_to_a_healthy_peer_closes_it():
    burst = [{"kind": "transfer_errors", "probability": 1.0, "from_s": 2.0, "to_s": 2.5}]
    res = pdsim.run(_fleet("circuit_breaker", burst,
                           blacklist={"failures": 2, "window_s": 5, "cooldown_s": 2,
                                      "trials": 1}))
    ev = res.events
    opened = ev[(ev.event == "breaker") & ev.detail.str.startswith("open")]
    trials = ev[ev.event == "breaker_trial"]
    closed = ev[(ev.event == "blacklist_remove") & (ev.detail == "trial ok")]
    assert len(opened) >= 1 and len(closed) == len(opened) == len(trials)
    for o in opened.itertuples():
        t = trials[(trials.component == o.component) & (trials.peer == o.peer)].time.iloc[0]
        c = closed[(closed.component == o.component) & (closed.peer == o.peer)].time.iloc[0]
        assert t >= o.time + 2.0  # half-open only after the cooldown
        assert c > t  # closed by the trial's own (real) write finishing
    assert res.summary["blacklisted_pairs_final"] == 0
    late = res.measured[res.measured.t_arrival > 10.0]
    assert len(late) and (late.status == "completed").all()


def test_an_outage_shorter_than_the_qp_retry_budget_costs_nothing():
    def flaps(down_s):
        return _fleet("never", [{"kind": "nic_flaps", "prefill_server": 0, "at_s": 2.0,
                                 "flaps": 20, "every_s": 1.5, "down_s": down_s}],
                      transfer={"call_latency_ms": 300})  # 0.3 s per write: many in flight
    short = pdsim.run(flaps(0.3)).summary
    long = pdsim.run(flaps(1.0)).summary
    assert short["dead_peer_writes"] > 0 and short["failed"] == 0  # RDMA retransmitted
    assert long["transfer_failures_by_reason"]["nic_flap"] > 0


# --- the library's faults do what they say ----------------------------------------------------


def test_decode_crash_restarts_under_new_sessions_and_refuses_meanwhile():
    crash = [{"preset": "decode_crash", "at_s": 5.0, "restart_after_s": 10.0}]
    res = pdsim.run(_fleet("permanent", crash))
    r = res.measured
    down = r[(r.d_server == 0) & r.t_arrival.between(5.01, 14.99)]
    assert len(down) and (down.reason == "decode_unavailable").all()
    assert (down.http_status == 502).all() and ((down.t_done - down.t_arrival) < 0.01).all()
    after = r[(r.d_server == 0) & (r.t_arrival > 15.5)]
    assert len(after) and (after.status == "completed").all()
    assert set(after.session) == {"decode-0.r0:17004", "decode-0.r1:17005"}


def test_decode_hang_stops_the_server_then_it_carries_on():
    hang = [{"preset": "decode_hang", "at_s": 5.0, "duration_s": 8.0}]
    res = pdsim.run(_fleet("never", hang))
    r = res.measured
    during = r[(r.d_server == 0) & r.t_arrival.between(5.01, 12.9)]
    assert len(during) and (during.status == "completed").all()  # queued behind the stall
    assert (during.t_first_token >= 13.0).all()
    # writes bootstrapped before the stall met a silent peer and failed when it came back
    hung = _failures(res, "decode_hung")
    assert ((hung.time - 13.0).abs() < 0.01).all()
    other = r[(r.d_server == 1) & r.t_arrival.between(5.01, 12.9)]
    assert (other.t_first_token < 13.0).any()


def test_degraded_nic_writes_hit_the_transfer_timeout_in_its_window_only():
    slow = [{"preset": "nic_degraded", "at_s": 5.0, "duration_s": 10.0,
             "bandwidth_fraction": 1e-6}]
    res = pdsim.run(_fleet("never", slow, transfer={"transfer_timeout_s": 2.0}))
    timeouts = _failures(res, "transfer_timeout")
    assert len(timeouts) > 0
    assert timeouts.time.between(5.0, 15.0 + 2.1).all()


def test_flush_race_and_transient_errors_presets():
    res = pdsim.run(_fleet("permanent", [{"preset": "flush_race", "at_s": 5.0}], backlog=True))
    assert res.summary["transfer_failures_by_reason"]["flush_freed_pages"] > 0
    assert res.events[res.events.event == "router_flush"].time.tolist() == [5.0]
    res = pdsim.run(_fleet("never", [{"preset": "transient_errors", "probability": 0.05}]))
    assert res.summary["transfer_failures_by_reason"]["injected_error"] > 0


# --- validation -----------------------------------------------------------------------------


@pytest.mark.parametrize("fault,path,hint", [
    ({"kind": "decode_crash", "decode_server": 2, "at_s": 1}, "faults.0.decode_server",
     "must be < 2, the decode servers of the fleet (indices 0..1)"),
    ({"kind": "decode_unreachable", "decode_rank": 4, "at_s": 1, "duration_s": 1},
     "faults.0.decode_rank", "must be < 4, the decode ranks"),
    ({"kind": "nic_flaps", "prefill_server": 1, "at_s": 1}, "faults.0.prefill_server",
     "must be < 1, the prefill servers"),
    ({"preset": "decode_crash", "decode_server": 5}, "faults.0.decode_server", "indices 0..1"),
    ({"preset": "decode_crashh"}, "faults.0.preset", "'decode_crash', 'decode_hang'"),
    ({"preset": "decode_crash", "kind": "partition"}, "faults.0.kind", "leave 'kind' out"),
    ({"kind": "nic_flaps", "at_s": 1, "every_s": 2, "down_s": 3}, "faults.0.down_s",
     "must be shorter than every_s (2)"),
    ({"kind": "transfer_errors", "probability": 0.1, "from_s": 5, "to_s": 5}, "faults.0.to_s",
     "must be after from_s (5)"),
    ({"kind": "decode_hang", "at_s": 1e9, "duration_s": 1}, "faults.0.at_s", "less than or"),
    ({"kind": "decode_hang", "at_s": 1, "duration_s": float("inf")}, "faults.0.duration_s",
     "finite"),
    ({"kind": "decode_hang", "at_s": 1, "duration_s": 5, "kv_writes": "maybe"},
     "faults.0.kv_writes", "'time_out' or 'land'"),
    ({"kind": "meteor", "at_s": 1}, "faults.0.kind", "'decode_unreachable', 'partition'"),
])
def test_faults_are_validated_against_the_fleet(fault, path, hint):
    with pytest.raises(ScenarioError) as err:
        from_dict(_fleet(faults=[fault]))
    msg = str(err.value)
    assert f"'{path}'" in msg and hint in msg, msg
    assert "\n" not in msg


def test_validate_catches_a_fault_index_beyond_the_fleet(tmp_path, capsys):
    import yaml

    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(_fleet(faults=[{"preset": "nic_degraded",
                                                "prefill_server": 3}])))
    assert main(["validate", str(p)]) == 2
    err = capsys.readouterr().err
    assert "faults.0.prefill_server" in err and err.count("\n") == 1


def test_every_library_entry_validates_on_any_fleet_and_is_listed(capsys):
    for name in FAULTS.presets:
        sc = from_dict(small_fleet(faults=[{"preset": name}]))
        assert sc.faults[0].kind == FAULTS.presets[name][0]["kind"]
    assert main(["faults"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in FAULTS.presets)
    assert all(kind in out for kind in FAULTS.names())

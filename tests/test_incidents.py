"""The incident library (scenarios/incidents/): each incident's harm comes from its mechanism,
its ``_fixed`` twin (the PR's behaviour) removes it, and so does removing the mechanism by
another route (the checks a causal claim needs: the harm is there, the fix takes it away, and
without the mechanism it is not there either)."""

from __future__ import annotations

import pytest
from conftest import run_cached

import pdsim


def _inc(res: pdsim.Result) -> dict:
    return res.summary["incident"]


def _dead(res: pdsim.Result, cause: str = "") -> int:
    ev = res.events
    d = ev[ev.event == "dead_room"]
    return int(d.detail.str.contains(cause, regex=False).sum()) if cause else len(d)


# --- the abort storm (PR #28651) ------------------------------------------------------------


def test_abort_storm_prefill_aborts_the_decode_never_hears_of_hold_slots_for_300_s():
    res = run_cached("incidents/abort_storm")
    inc = _inc(res)
    assert _dead(res, "prefill aborted, decode not told") == inc["dead_rooms"] > 0
    assert inc["dead_room_held_max_s"] == pytest.approx(300, abs=1)  # the waiting timeout
    # they fill the decode's slots, and goodput is not back within the run
    d = res.scenario.fleet.decode
    assert inc["dead_rooms_max"] == d.servers * d.dp * d.max_running_requests
    assert not inc["recovered"] and inc["trough_ratio"] == 0


def test_abort_storm_fixed_by_notifying_the_decode_and_gone_when_the_gateway_cancels_both():
    broken = _inc(run_cached("incidents/abort_storm"))
    for res in (run_cached("incidents/abort_storm_fixed"),  # PR #28651: decode told
                # the mechanism removed another way: the gateway's cancel reaches the decode
                # leg too, so the decode aborts its own copy
                run_cached("incidents/abort_storm", "faults.1.cancels=both")):
        inc = _inc(res)
        assert inc["dead_rooms"] == 0
        assert inc["recovered"] and inc["recovery_s"] < 120
        assert res.summary["completed_requests"] > 2 * run_cached(
            "incidents/abort_storm").summary["completed_requests"]
    assert broken["dead_rooms"] > 0


def test_no_release_has_the_abort_storm_fix():
    """prefill_abort_notifies_decode is off in every release: 0.5.23 storms as 0.5.13 does."""
    res = run_cached("incidents/abort_storm", "engine.version=0.5.23")
    assert _dead(res, "prefill aborted, decode not told") > 0 and not _inc(res)["recovered"]


# --- receivers stuck in Transferring (PR #31800) --------------------------------------------


def test_stuck_transferring_holds_every_slot_whose_metadata_never_landed_for_good():
    res = run_cached("incidents/stuck_transferring")
    inc = _inc(res)
    n = _dead(res, "metadata never landed")
    assert n == inc["dead_rooms"] > 10
    assert inc["dead_rooms_at_end"] == n  # none is ever freed
    lost = (res.events.event == "done_lost").sum()
    assert lost == n  # one dead room per lost metadata write, nothing else


def test_stuck_transferring_fixed_bounds_each_hold_and_no_gate_no_hold():
    fixed = run_cached("incidents/stuck_transferring_fixed")  # PR #31800
    inc = _inc(fixed)
    assert inc["dead_rooms"] > 10 and inc["dead_room_held_max_s"] <= 300 + 1e-6
    assert inc["dead_rooms_at_end"] == 0  # (its horizon lets the last holds time out)
    ev = fixed.events
    assert set(ev[ev.event == "dead_room_freed"].detail) == {"waiting_timeout_transferring"}
    # without the metadata gate (0.5.12 and earlier) the decode takes Success as it comes
    gone = run_cached("incidents/stuck_transferring", "disaggregation.metadata_gate=false")
    assert _dead(gone) == 0 and (gone.events.event == "done_lost").sum() > 10


def test_a_lost_status_message_is_bounded_by_the_waiting_timeout():
    """A lost Success message leaves the receiver WaitingForInput, where its waiting timeout
    does fire (fact sheet section 5): bounded, whatever the gate."""
    res = run_cached("incidents/stuck_transferring", "faults.0.what=status")
    inc = _inc(res)
    assert _dead(res, "done signal lost") == inc["dead_rooms"] > 10
    assert inc["dead_room_held_max_s"] <= 300 + 1


# --- bootstrap timeouts under a small decode window (#9726 / #10110, TokenSpeed's figures) ---


def test_small_window_rooms_the_prefill_timed_out_fill_the_decode_window_for_300_s():
    res = run_cached("incidents/small_decode_window")
    inc = _inc(res)
    assert _dead(res, "prefill bootstrap_timeout, decode not told") == inc["dead_rooms"] > 0
    assert inc["dead_rooms_max"] == res.scenario.fleet.decode.max_running_requests  # all 4
    assert inc["dead_room_held_max_s"] == pytest.approx(300, abs=1)


@pytest.mark.parametrize("fix", [
    "router.dispatch=smg_cancel_on_prefill_fail",  # PR #29017 (the _fixed twin)
    "disaggregation.prefill_abort_notifies_decode=true",  # the decode told (#28651's idea)
])
def test_small_window_harm_goes_when_the_decode_copy_is_dropped(fix):
    broken = run_cached("incidents/small_decode_window")
    res = run_cached("incidents/small_decode_window", fix)
    assert _dead(res) == 0
    assert (res.summary["clients"]["eval"]["duration_s"]
            < broken.summary["clients"]["eval"]["duration_s"] / 3)
    assert res.summary["clients"]["eval"]["questions"] == 64  # every question answered
    if fix.startswith("router"):
        assert res.summary == run_cached("incidents/small_decode_window_fixed").summary


# --- a prefill restarted behind a stable address (#34289, #36029) ----------------------------


def test_prefill_restart_on_0_5_16_every_request_after_the_swap_dies_on_the_waiting_timeout():
    res = run_cached("incidents/prefill_restart")
    inc = _inc(res)
    assert _dead(res, "stale connection") > 0
    assert inc["dead_room_held_max_s"] == pytest.approx(300, abs=1)
    assert not inc["recovered"]
    after = res.requests[(res.requests.t_arrival > 75) & (res.requests.kind == "bench")]
    assert len(after) and not (after.status == "completed").any()  # stuck for ever


@pytest.mark.parametrize("how", [
    [],  # the _fixed twin: PR #34289's instance id
    ["engine.version=0.5.19"],  # Mooncake: ZMQ send timeout + PR #36029's invalidation
    ["disaggregation.heartbeat_interval_s=5", "faults.0.down_s=12"],  # a swap the stock
    # heartbeat sees (12 s down > 2 misses x 5 s): the mechanism (a swap inside the window)
    # removed
])
def test_prefill_restart_recovers_once_the_stale_connection_is_dropped(how):
    name = "incidents/prefill_restart" + ("" if how else "_fixed")
    res = run_cached(name, *how)
    inc = _inc(res)
    # goodput is back within a minute; the recovery also waits for every dead room of the
    # swap to be freed (the waiting timeout, up to 300 s, where the heartbeat saw the swap)
    assert inc["recovered"] and inc["goodput_recovery_s"] <= 60
    assert inc["recovery_s"] >= inc["goodput_recovery_s"] and inc["dead_rooms_at_end"] == 0
    assert (res.events.event == "peer_invalidated").any()
    late = res.requests[res.requests.t_arrival > 200]
    assert len(late) and (late.status == "completed").all()


# --- the router's dual-dispatch hang (#29482) ------------------------------------------------


def test_dual_dispatch_wedges_each_failed_decode_leg_until_the_bootstrap_timeout():
    res = run_cached("incidents/dual_dispatch_hang")
    ev = res.events
    wedged = ev[ev.event == "wedge_ended"]
    failed_legs = (ev.event == "leg_failed").sum()
    assert failed_legs > 0 and len(wedged) == failed_legs
    assert (wedged.value.round(3) == 300).all()  # transfer.bootstrap_timeout_s
    assert _inc(res)["longest_failed_s"] == pytest.approx(300, abs=0.1)
    # the author's 1800 s: the same wedge with a bootstrap timeout of 1800 s (the discrepancy)
    long = run_cached("incidents/dual_dispatch_hang", "transfer.bootstrap_timeout_s=1800")
    assert _inc(long)["longest_failed_s"] == pytest.approx(1800, abs=0.1)


@pytest.mark.parametrize("dispatch", ["smg_cancel_both", "mini_lb_gather"])
def test_dual_dispatch_no_wedge_when_a_failed_decode_leg_is_answered_at_once(dispatch):
    """smg_cancel_both (the _fixed twin: PR #29482's behaviour) drops the prefill leg;
    mini_lb_gather answers the decode's error without waiting for the prefill (no join)."""
    res = run_cached("incidents/dual_dispatch_hang", f"router.dispatch={dispatch}")
    ev = res.events
    assert (ev.event == "leg_failed").sum() > 0 and not (ev.event == "wedge_ended").any()
    assert _inc(res)["longest_failed_s"] < 1
    if dispatch == "smg_cancel_both":
        assert res.summary == run_cached("incidents/dual_dispatch_hang_fixed").summary


# --- the sticky blacklist (#13054) -----------------------------------------------------------


def test_sticky_blacklist_keeps_healthy_pairs_out_for_good():
    res = run_cached("incidents/sticky_blacklist")
    s = res.summary
    assert s["blacklisted_pairs_final"] == s["blacklisted_pairs_max"] > 0
    late = res.requests[res.requests.t_arrival > 150]
    assert (late.reason == "blacklisted_session").sum() > 50  # persistent failures
    assert not _inc(res)["recovered"]


@pytest.mark.parametrize("fix", ["blacklist.policy=v0_5_23", "blacklist.policy=never"])
def test_sticky_blacklist_gone_with_the_probe_or_without_a_blacklist(fix):
    res = run_cached("incidents/sticky_blacklist", fix)
    late = res.requests[res.requests.t_arrival > 150]
    assert (late.reason == "blacklisted_session").sum() == 0
    assert _inc(res)["recovered"]
    if fix.endswith("v0_5_23"):
        assert res.summary == run_cached("incidents/sticky_blacklist_fixed").summary


def test_restarting_the_prefill_pods_restores_processing():
    """The issue's remedy: a new prefill process has no failed sessions."""
    d = {"extends": "scenarios/incidents/sticky_blacklist.yaml",
         "faults": [{"kind": "transfer_errors", "probability": 0.03, "from_s": 60, "to_s": 70},
                    {"kind": "prefill_restart", "prefill_server": 0, "at_s": 150,
                     "down_s": 30},
                    {"kind": "prefill_restart", "prefill_server": 1, "at_s": 150,
                     "down_s": 30}]}
    res = pdsim.run(d)
    assert res.summary["blacklisted_pairs_final"] == 0
    late = res.requests[res.requests.t_arrival > 200]
    assert len(late) and (late.reason == "blacklisted_session").sum() == 0
    assert (late.status == "completed").mean() > 0.95

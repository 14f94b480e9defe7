"""SGLang's PD timeout and abort paths, mechanism by mechanism (pdsim.config.pd_paths,
pdsim.engine.request's two sides of a room, .router, .peers, .faults_pd), on small fleets."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import small_fleet

import pdsim
from pdsim.cli.main import main
from pdsim.config.engine_version import SGLANG_VERSIONS, at_least, parse
from pdsim.config.registry import FAULTS, PD_PATHS
from pdsim.config.scenario import from_dict
from pdsim.config.units import ScenarioError


def _ev(res: pdsim.Result, name: str):
    ev = res.events
    return ev[ev.event == name]


# --- releases and their defaults ----------------------------------------------------------------


@pytest.mark.parametrize("version,expect", [
    ("0.5.2", {"decode_abort_notifies_prefill": False, "metadata_gate": False,
               "waiting_timeout_invalidates_peer_cache": False, "zmq_send_timeout_s": None,
               "deferred_decode_kv_release": False, "ack_after_drain": False}),
    ("0.5.13", {"decode_abort_notifies_prefill": True, "metadata_gate": True,
                "waiting_timeout_invalidates_peer_cache": False}),
    ("0.5.17", {"zmq_send_timeout_s": 1.0, "waiting_timeout_invalidates_peer_cache": False}),
    ("0.5.19", {"waiting_timeout_invalidates_peer_cache": True,
                "deferred_decode_kv_release": False}),
    ("0.5.21", {"deferred_decode_kv_release": True, "ack_after_drain": True}),
])
def test_each_switch_takes_its_release_value_unless_set(version, expect):
    sc = from_dict(small_fleet(engine={"version": version}))
    for k, v in expect.items():
        assert sc.pd[k] == v, (version, k)
    assert sc.pd["prefill_abort_notifies_decode"] is False  # no release has it
    assert sc.pd["waiting_timeout_in_transferring"] is False  # nor this (PR #31800)
    own = from_dict(small_fleet(engine={"version": version},
                                disaggregation={"metadata_gate": not sc.pd["metadata_gate"]}))
    assert own.pd["metadata_gate"] is not sc.pd["metadata_gate"]


def test_the_default_release_and_the_blacklist_it_implies():
    sc = from_dict(small_fleet())
    assert sc.engine.version == "0.5.9" and sc.blacklist.policy == "permanent"
    assert not sc.pd["decode_abort_notifies_prefill"]  # (0.5.9: before PR #27372)
    assert from_dict(small_fleet(engine={"version": "0.5.23"})).blacklist.policy == "v0_5_23"
    # a policy the scenario names is kept
    kept = from_dict(small_fleet(engine={"version": "0.5.23"}, blacklist={"policy": "never"}))
    assert kept.engine.version == "0.5.23" and kept.blacklist.policy == "never"
    numbered = [v for v in SGLANG_VERSIONS if v[0].isdigit()]
    assert numbered == sorted(numbered, key=parse)  # (the table lists releases in order)
    assert {f"0.5.{i}" for i in range(2, 24)} <= set(SGLANG_VERSIONS)  # every wheel read
    assert at_least("0.5.10", "0.5.9") and not at_least("0.5.9", "0.5.10")
    assert at_least("glm5-hopper", "0.5.9") and not at_least("glm5-hopper", "0.5.13")


@pytest.mark.parametrize("over,path,hint", [
    ({"engine": {"version": "0.5.99"}}, "engine.version", "'0.5.2'"),
    ({"disaggregation": {"nope": True}}, "disaggregation.nope",
     "allowed keys here: prefill_abort_notifies_decode"),
    ({"disaggregation": {"heartbeat_interval_s": 1}}, "disaggregation.heartbeat_interval_s",
     "greater than or equal to 2"),
    ({"engine": {"version": "0.5.19"}, "disaggregation": {"req_waiting_timeout_s": 5}},
     "disaggregation.req_waiting_timeout_s", "before 0.5.20"),
    ({"faults": [{"kind": "load_spike", "client": 0, "at_s": 1, "duration_s": 1}],
      "clients": [{"kind": "eval", "questions": 4}]}, "faults.0.client", "bench client"),
    ({"faults": [{"kind": "load_spike", "client": 3, "at_s": 1, "duration_s": 1}]},
     "faults.0.client", "must be < 1"),
    ({"faults": [{"kind": "leg_failure", "probability": 0.1, "from_s": 5, "to_s": 5}]},
     "faults.0.to_s", "after from_s"),
    ({"faults": [{"kind": "lost_done", "probability": 0.1, "prefill_server": 2}]},
     "faults.0.prefill_server", "must be < 1"),
    ({"faults": [{"kind": "prefill_restart", "prefill_server": 1, "at_s": 1}]},
     "faults.0.prefill_server", "must be < 1"),
    ({"router": {"dispatch": "fast"}}, "router.dispatch", "mini_lb_gather"),
])
def test_bad_pd_path_input_is_one_line_naming_the_key(over, path, hint, tmp_path, capsys):
    with pytest.raises(ScenarioError) as err:
        from_dict(small_fleet(**over))
    msg = str(err.value)
    assert f"'{path}'" in msg and hint in msg and "\n" not in msg, msg
    import yaml

    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(small_fleet(**over)))
    assert main(["validate", str(f)]) == 2  # validate catches what run rejects
    assert capsys.readouterr().err.count("\n") == 1


def test_every_switch_is_in_the_schema_with_its_sglang_name():
    from pdsim.config.loader import json_schema

    fields = json_schema()["properties"]["disaggregation"]["properties"]
    assert set(fields) == {s.name for s in PD_PATHS.entries()}
    for s in PD_PATHS.entries():
        d = fields[s.name]["description"]
        assert "SGLang:" in d and "Default by engine.version" in d, s.name


# --- the two sides of a room ---------------------------------------------------------------


def _timeouts(**pd) -> dict:
    """A decode window of 1 slot (no pre-allocation slots beyond the running one: SGLang's
    rule would add 2), a prefill bootstrap deadline shorter than a request."""
    return small_fleet(
        horizon_s=200,
        transfer={"bootstrap_timeout_s": 2.0, "waiting_timeout_s": 6.0},
        disaggregation=pd,
        fleet={"gpu": "H20", "model": "dsv3-ci-test",
               "prefill": {"dp": 1, "tp": 2},
               "decode": {"dp": 1, "tp": 2, "max_running_requests": 1,
                          "disaggregation_decode_extra_slots": 0}},
        clients=[{"kind": "bench", "num_prompts": 4, "warmup_requests": 0,
                  "dataset": {"kind": "random", "input_len": 512, "output_len": 1500,
                              "range_ratio": 1.0}}])


def test_a_bootstrap_timeout_the_decode_is_not_told_of_holds_its_slot_until_its_own_timeout():
    res = pdsim.run(_timeouts())
    dead = _ev(res, "dead_room")
    assert len(dead) and (dead.detail == "prefill bootstrap_timeout, decode not told").all()
    freed = _ev(res, "dead_room_freed")
    assert (freed.detail == "waiting_timeout").all()
    assert np.allclose(freed.value, 6.0)  # the decode's waiting timeout, from pre-allocation
    told = pdsim.run(_timeouts(prefill_abort_notifies_decode=True))
    assert not len(_ev(told, "dead_room"))
    assert told.summary["simulated_s"] < res.summary["simulated_s"]


def test_the_bootstrap_timeout_runs_only_while_the_room_is_bootstrapping():
    """SGLang checks SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT only in KVPoll.Bootstrapping:
    once the decode's metadata arrived, a request prefilling (a 60k prompt, ~10 s of chunks)
    or waiting in the prefill's waiting queue (40 prompts behind it) has no prefill-side
    clock. A 1 s bootstrap timeout: every request bootstraps at once and none fails."""
    d = small_fleet(horizon_s=300, transfer={"bootstrap_timeout_s": 1.0}, clients=[
        {"kind": "bench", "name": "long", "num_prompts": 1, "warmup_requests": 0,
         "dataset": {"kind": "random", "input_len": 60000, "output_len": 4, "range_ratio": 1.0}},
        {"kind": "bench", "name": "short", "num_prompts": 40, "warmup_requests": 0,
         "start_s": 0.2, "request_rate": "inf",
         "dataset": {"kind": "random", "input_len": 4000, "output_len": 4, "range_ratio": 1.0}}])
    req = pdsim.run(d).requests
    long = req[req.client == "long"].iloc[0]
    assert long.t_prefill_end - long.t_prefill_start > 5.0
    assert ((req.t_prefill_start - req.t_arrival) > 1.0).sum() > 30
    assert (req.status == "completed").all()


def test_a_decode_abort_reaches_the_prefill_from_0_5_13_and_empties_its_queue_from_0_5_14():
    """A waiting timeout. Before 0.5.13 the prefill is not told: it prefills and writes the KV
    into pages the decode already freed. 0.5.13 sends ABORT (PR #27372): the room fails, the
    transfer worker drops its chunks (no KV written), but the request still in the prefill's
    waiting queue is prefilled all the same. 0.5.14 drops it from the waiting queue
    (resolve_waiting_queue_bootstrap): only the chunks under way are computed."""
    d = small_fleet(horizon_s=100, transfer={"waiting_timeout_s": 0.1},
                    clients=[{"kind": "bench", "num_prompts": 30, "warmup_requests": 0,
                              "request_rate": 5.0,
                              "dataset": {"kind": "random", "input_len": 8000,
                                          "output_len": 16, "range_ratio": 1.0}}])
    runs = {v: pdsim.run({**d, "engine": {"version": v}}).summary
            for v in ("0.5.12", "0.5.13", "0.5.14")}
    for s in runs.values():
        assert s["failed_by_reason"] == {"waiting_timeout": 30}
    old, told, dropped = runs["0.5.12"], runs["0.5.13"], runs["0.5.14"]
    assert old["kv_transferred_gb"] > 1
    assert told["kv_transferred_gb"] == dropped["kv_transferred_gb"] == 0
    assert told["prefill_tokens_computed"] == old["prefill_tokens_computed"]
    # (0.5.14's prefill still finishes the chunk it is on: SGLang does not stop a forward)
    assert told["prefill_tokens_computed"] > 1.5 * dropped["prefill_tokens_computed"]


def _deferred(**pd) -> dict:
    """Waiting timeouts while the prefill is still writing: the decode rank's KV endpoint
    stops answering, so each write waits for its path to return."""
    return small_fleet(
        horizon_s=120, engine={"version": "0.5.22"}, disaggregation=pd,
        transfer={"waiting_timeout_s": 1.0, "transfer_timeout_s": 30.0},
        faults=[{"kind": "decode_unreachable", "decode_rank": 0, "at_s": 2.0,
                 "duration_s": 4.0}],
        clients=[{"kind": "bench", "num_prompts": 120, "request_rate": 20.0,
                  "warmup_requests": 0,
                  "dataset": {"kind": "random", "input_len": 2048, "output_len": 32}}])


def test_deferred_release_holds_pages_until_the_write_drains_or_the_timeout():
    drain = pdsim.run(_deferred())
    held = _ev(drain, "dead_room")
    assert len(held) and (held.detail == "deferred release: waiting for ABORT_ACK").all()
    assert set(_ev(drain, "dead_room_freed").detail) == {"ABORT_ACK after the write drained"}
    # (the path comes back at 6 s: a timeout of 1.5 s passes first)
    dropped = pdsim.run(_deferred(ack_after_drain=False, deferred_release_timeout_s=1.5))
    freed = _ev(dropped, "dead_room_freed")
    assert len(freed) == len(held) and set(freed.detail) == {"deferred release timed out"}
    assert np.allclose(freed.value, 1.5)
    off = pdsim.run(_deferred(deferred_decode_kv_release=False))
    assert not len(_ev(off, "dead_room"))


def test_ack_after_drain_frees_at_the_drain_not_the_timeout():
    """PR #40645: the prefill answers ABORT_ACK once its write of the room drains. The path
    comes back at 6 s, before a 10 s release timeout: with the switch the held slots are freed
    at 6 s (held under 10 s); without it the ACK is dropped and they are held the whole 10 s."""
    for ack in (True, False):
        d = _deferred(ack_after_drain=ack, deferred_release_timeout_s=10.0)
        d["clients"][0]["num_prompts"] = 400  # (arrivals to 20 s: the run outlasts the timeout)
        res = pdsim.run(d)
        held, freed = _ev(res, "dead_room"), _ev(res, "dead_room_freed")
        assert len(held) and len(freed) == len(held)
        if ack:
            assert np.allclose(freed.time, 6.0) and (freed.value < 10.0).all()
            assert set(freed.detail) == {"ABORT_ACK after the write drained"}
        else:
            assert np.allclose(freed.value, 10.0)
            assert set(freed.detail) == {"deferred release timed out"}


# --- router: dispatch, gateway TTFT timeouts, leg failures ------------------------------------


def _gateway(**router) -> dict:
    return small_fleet(
        horizon_s=300, router=router,
        fleet={"gpu": "H20", "model": "dsv3-ci-test", "prefill": {"dp": 1, "tp": 2},
               "decode": {"dp": 1, "tp": 2, "max_running_requests": 4}},
        clients=[{"kind": "bench", "num_prompts": 40, "warmup_requests": 0,
                  "max_concurrency": 40,
                  "dataset": {"kind": "random", "input_len": 1024, "output_len": 400,
                              "range_ratio": 1.0}}])


def test_a_gateway_ttft_timeout_that_cancels_only_the_prefill_leaves_the_decode_copy():
    res = pdsim.run(_gateway(ttft_timeout_s=3.0, ttft_timeout_cancels="prefill"))
    r = res.requests
    out = r[r.reason == "gateway_ttft_timeout"]
    assert len(out) and (out.http_status == 504).all()
    assert np.allclose(out.t_done - out.t_arrival, 3.0, atol=0.01)
    assert (_ev(res, "dead_room").detail == "prefill aborted, decode not told").sum() > 0
    both = pdsim.run(_gateway(ttft_timeout_s=3.0, ttft_timeout_cancels="both"))
    assert (both.requests.reason == "gateway_ttft_timeout").sum() == len(out)
    assert not len(_ev(both, "dead_room"))


def test_the_gateway_timeout_fault_applies_to_requests_after_it():
    d = _gateway()
    d["faults"] = [{"kind": "gateway_timeout", "at_s": 0.0, "ttft_timeout_s": 3.0,
                    "cancels": "both", "duration_s": 1e-3}]
    res = pdsim.run(d)  # every request arrived at 0, under the 3 s timeout: it applies
    assert (res.requests.reason == "gateway_ttft_timeout").sum() > 0
    d["faults"][0]["at_s"] = 0.5  # after every arrival: nothing times out
    assert (pdsim.run(d).requests.reason == "gateway_ttft_timeout").sum() == 0


@pytest.mark.parametrize("dispatch,answer_s", [("mini_lb_gather", 0.0), ("smg_join", 7.0),
                                                ("smg_cancel_on_prefill_fail", 7.0),
                                                ("smg_cancel_both", 0.0)])
def test_a_decode_leg_that_fails_is_answered_as_the_dispatch_does(dispatch, answer_s):
    """A decode leg failing at transport level: the joining dispatches wait for the prefill
    leg, which ends at its bootstrap timeout (7 s); the others answer 502 at once."""
    d = small_fleet(horizon_s=100, router={"dispatch": dispatch},
                    transfer={"bootstrap_timeout_s": 7.0},
                    faults=[{"kind": "leg_failure", "leg": "decode", "probability": 1.0,
                             "from_s": 0.0, "to_s": 0.5}],
                    clients=[{"kind": "bench", "num_prompts": 10, "warmup_requests": 0,
                              "request_rate": 100.0,
                              "dataset": {"kind": "random", "input_len": 512,
                                          "output_len": 8}}])
    res = pdsim.run(d)
    r = res.requests
    bad = r[r.reason == "decode_leg_failed"]
    assert len(bad) > 0 and (bad.http_status == 502).all()
    assert np.allclose(bad.t_done - bad.t_arrival, answer_s, atol=0.01)
    assert (len(_ev(res, "wedge_ended")) > 0) == (answer_s > 0)


def test_a_failed_prefill_leg_cancels_the_decode_under_29017():
    """The prefill's bootstrap timeout, under a window of one slot: with PR #29017's dispatch
    the decode leg is dropped and the client gets 502 at once, with no dead room."""
    base = _timeouts()
    base["router"] = {"dispatch": "smg_cancel_on_prefill_fail"}
    res = pdsim.run(base)
    r = res.requests
    assert (r.reason == "prefill_bootstrap_timeout").sum() > 0
    assert (r[r.reason == "prefill_bootstrap_timeout"].http_status == 502).all()
    assert not len(_ev(res, "dead_room"))


# --- clients: load spikes, SDK retries ------------------------------------------------------------


def test_a_load_spike_compresses_arrivals_in_its_window_and_changes_nothing_else():
    d = small_fleet(horizon_s=400, clients=[
        {"kind": "bench", "num_prompts": 400, "request_rate": 4.0, "warmup_requests": 0,
         "dataset": {"kind": "random", "input_len": 256, "output_len": 8}}])
    base = pdsim.run(d).requests.sort_values("rid")
    d["faults"] = [{"kind": "load_spike", "client": 0, "at_s": 20.0, "duration_s": 10.0,
                    "factor": 4.0}]
    spiked = pdsim.run(d).requests.sort_values("rid")
    a, b = base.t_arrival.to_numpy(), spiked.t_arrival.to_numpy()
    before = a < 20
    assert np.array_equal(a[before], b[before])  # the same draws
    in_base = ((a >= 20) & (a < 30)).sum()
    in_spike = ((b >= 20) & (b < 30)).sum()
    assert 3 * in_base < in_spike < 5 * in_base + 5
    assert np.array_equal(base.input_len.to_numpy(), spiked.input_len.to_numpy())


def test_a_load_spike_on_a_closed_loop_raises_its_concurrency_for_a_while():
    d = small_fleet(horizon_s=400, clients=[
        {"kind": "bench", "num_prompts": 600, "max_concurrency": 4, "warmup_requests": 0,
         "dataset": {"kind": "random", "input_len": 256, "output_len": 64}}])
    d["faults"] = [{"kind": "load_spike", "client": 0, "at_s": 5.0, "duration_s": 5.0,
                    "factor": 4.0}]
    res = pdsim.run(d)
    r = res.requests
    t = np.arange(0.0, float(res.summary["simulated_s"]), 0.25)
    inflight = [((r.t_arrival <= x) & (r.t_done > x)).sum() for x in t]
    during = max(n for x, n in zip(t, inflight, strict=True) if 5.5 < x < 10)
    after = max(n for x, n in zip(t, inflight, strict=True) if x > 15)
    assert during == 16 and after <= 4


def test_sdk_retries_resend_a_504_as_a_new_request_and_not_a_streamed_abort():
    d = _gateway(ttft_timeout_s=3.0, ttft_timeout_cancels="both")
    d["clients"][0]["sdk_retries"] = 2
    res = pdsim.run(d)
    r = res.requests
    assert r.attempt.max() == 2 and (r[r.attempt > 0].kind == "bench").all()
    prompts = res.summary["clients"]["bench"]
    assert prompts["unsent"] == 0 and len(r) > 40
    # every retry follows a 504 of the same prompt: no prompt has more than 3 attempts
    assert (r.attempt <= 2).all()
    # a streamed abort (HTTP 200) is not retried
    s = _timeouts()
    s["clients"][0]["sdk_retries"] = 2
    streamed = pdsim.run(s).requests
    assert (streamed.attempt == 0).all() and (streamed.status == "failed").any()


# --- the fault library and pdsim whatif -----------------------------------------------------------


def test_the_new_faults_are_library_presets_documented_and_listed(capsys):
    for name in ("load_spike", "gateway_timeout", "lost_done", "prefill_restart", "leg_failure"):
        spec, why = FAULTS.presets[name]
        assert spec["kind"] == name and len(why) > 80
        assert FAULTS.get(name).doc
    assert main(["faults"]) == 0
    out = capsys.readouterr().out
    assert "lost_done" in out and "prefill_restart" in out


def test_whatif_takes_a_new_fault(tmp_path, capsys):
    rc = main(["whatif", "scenarios/whatif_base.yaml", "--faults", "gateway_timeout",
               "--policy", "permanent", "--seeds", "1",
               "--set", "clients.0.num_prompts=1500", "--workers", "1"])
    out = capsys.readouterr().out
    assert rc == 0 and "gateway_timeout" in out, out


# --- report and plots -----------------------------------------------------------------------------


def test_the_report_tells_the_release_the_dead_rooms_and_the_recovery():
    from pdsim.output import report

    res = pdsim.run("scenarios/incidents/abort_storm_fixed.yaml")
    text = report.render(res)
    assert "SGLang 0.5.13's PD paths: prefill_abort_notifies_decode on*" in text
    assert "Recovery (goodput back, no request stuck):" in text and "after the trigger" in text
    broken = report.render(pdsim.run("scenarios/incidents/abort_storm.yaml"))
    assert "newly held by dead rooms (prefill aborted, decode not told)" in broken
    assert "not within the run" in broken


def test_the_postmortem_shows_dead_slots_trigger_and_recovery(tmp_path):
    import matplotlib.pyplot as plt

    from pdsim.output import incident_plots, plots

    res = pdsim.run("scenarios/incidents/prefill_restart_fixed.yaml")
    iv = incident_plots.dead_room_intervals(res)
    assert len(iv) == res.summary["incident"]["dead_rooms"]
    assert np.isclose(iv.held_s.sum(), res.summary["incident"]["dead_room_slot_s"], atol=0.01)
    fig = plots.postmortem(res)
    fig.savefig(tmp_path / "pm.png", dpi=40)
    titles = [ax.get_title(loc="left") for ax in fig.axes]
    assert any(t.startswith("decode slots held by dead rooms") for t in titles)
    labels = {t.get_text() for ax in fig.axes if ax.get_legend() is not None
              for t in ax.get_legend().get_texts()}
    assert "trigger (faults)" in labels and any(x.startswith("recovered (+") for x in labels)
    assert "recovered" in fig._suptitle.get_text()
    plt.close("all")

"""Regressions for the defects issue #9 reported (reproductions in tests/fuzz_found/)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import simpy
from conftest import SCENARIOS, small_fleet

import pdsim
from pdsim.cli.main import main
from pdsim.config.registry import BLACKLIST_POLICIES
from pdsim.engine import blacklist
from pdsim.engine.log import EventLog
from pdsim.output.report import horizon_warning

FOUND = Path(__file__).parent / "fuzz_found"


# --- Blacklist._probe KeyError (0.5.23 idle drop before the probe starts) -------------------------


def test_an_entry_idle_dropped_before_its_probe_starts_is_not_probed():
    env = simpy.Environment()
    log = EventLog(env)

    def probe(session):
        yield env.timeout(0)
        return True

    params = BLACKLIST_POLICIES.validate({"policy": "v0_5_23", "probe_interval_s": 1.0,
                                          "probe_max_interval_s": 8.0})
    bl = blacklist.build(params, env, "prefill-0.r0", log, probe)
    assert bl.record_failure("decode-0.r0:17000")  # blacklisted; its probe process is queued
    bl.clear("decode-0.r0:17000", "idle_drop")  # dropped in the same instant, before it ran
    env.run(until=10)  # the probe process starts on an entry that is gone (was a KeyError)
    events = [(row[1], row[8]) for row in log.rows]
    assert events == [("blacklist_add", ""), ("blacklist_remove", "idle_drop")]


@pytest.mark.parametrize("name", ["min_blacklist_probe_keyerror.yaml",
                                  "min_blacklist_probe_keyerror_slow_nic.yaml"])
def test_fuzz_found_probe_keyerror_runs(name):
    res = pdsim.run(FOUND / name)
    ev = res.events
    assert (ev.event == "blacklist_add").sum() > 0
    assert ((ev.event == "blacklist_remove") & (ev.detail == "idle_drop")).sum() > 0
    assert res.summary["blacklisted_pairs_final"] >= 0


# --- a request retracted at the step it finishes got output_len + 1 tokens ----------------------


def test_fuzz_found_retraction_at_finish_keeps_output_len():
    res = pdsim.run(FOUND / "min_generated_gt_output_len.yaml")
    req = res.requests
    assert (req.status == "completed").all()
    assert (req.generated == req.output_len).all(), req[["rid", "output_len", "generated"]]
    assert res.summary["tokens_generated_fleet"] == int(req.generated.sum())


def test_retraction_under_pressure_keeps_token_counts():
    """A pool that forces retractions: every request still ends with exactly output_len."""
    d = {"seed": 3, "fleet": {"gpu": "H20", "model": "dsv3-ci-test",
                              # (no decode reserve: retraction, not SGLang's gate, is tested)
                              "decode": {"kv_pool_tokens": 700, "page_size": 16,
                                         "num_reserved_decode_tokens": 0}},
         "clients": [{"kind": "bench", "num_prompts": 30, "warmup_requests": 0,
                      "dataset": {"kind": "random", "input_len": 150, "output_len": 200,
                                  "range_ratio": 0.3}}]}
    res = pdsim.run(d)
    req = res.requests
    assert res.summary["retractions"] > 0
    assert (req.status == "completed").all() and (req.generated == req.output_len).all()
    assert res.summary["tokens_generated_fleet"] == int(req.generated.sum())


# --- --progress changed what was simulated ------------------------------------------------------


def _frames(res: pdsim.Result) -> dict:
    return {"summary": json.dumps(res.summary, sort_keys=True),
            **{k: getattr(res, k).to_csv(index=False)
               for k in ("requests", "events", "timeseries")}}


def test_progress_bar_changes_nothing():
    sets = ["clients.0.num_prompts=200", "clients.1.num_prompts=200"]
    plain = pdsim.run(SCENARIOS / "drop_timeout.yaml", sets=sets)
    shown = pdsim.run(SCENARIOS / "drop_timeout.yaml", sets=sets, progress=True)
    assert _frames(shown) == _frames(plain)
    assert plain.summary["simulated_s"] < 0.1 * plain.scenario.horizon_s  # clients done early


# --- the time series and an idle horizon ---------------------------------------------------------


def _stuck(horizon: float) -> dict:
    """One request that can never finish: SGLang's gate never pre-allocates it on the decode
    (its prompt and its output clipped to 4,096 tokens, 1,000 + 4,096, exceed the 4,200-token
    pool), and its prefill, failing it at the bootstrap timeout, does not tell the decode on
    the default release. (A request retracted alone no longer strands itself: retract_decode
    keeps the last one, test_sglang_admission.)"""
    return {"horizon_s": horizon, "timeseries_interval_s": 10,
            "router": {"request_timeout_s": 1e7},
            "fleet": {"gpu": "H20", "model": "dsv3-ci-test",
                      "decode": {"kv_pool_tokens": 4200, "num_reserved_decode_tokens": 0}},
            "clients": [{"kind": "bench", "num_prompts": 1, "warmup_requests": 0,
                         "dataset": {"kind": "random", "input_len": 1000, "output_len": 8000,
                                     "range_ratio": 1.0}}]}


def test_a_run_that_cannot_progress_stops_and_says_so():
    far, farther = pdsim.run(_stuck(1e6)), pdsim.run(_stuck(2e6))
    s = far.summary
    assert s["stalled_at_s"] == s["simulated_s"] < 1000 and not s["stopped_at_horizon"]
    assert len(far.timeseries) < 100  # not 1e5 samples
    assert far.timeseries.equals(farther.timeseries)  # independent of the idle horizon
    assert (far.events.event == "run_stalled").sum() == 1
    assert (far.requests.status == "unfinished").all()
    assert "nothing was left to simulate" in horizon_warning(far)[0]


def test_a_stalled_run_says_where_its_requests_wait_and_what_to_change():
    """The warning names the rank and queue, and a request its rank's whole pool can never
    take (1,000 + 4,096 > 4,200) with the keys to change; requests whose pre-allocation
    failed (the prefill's bootstrap timeout, told to the decode) are not counted as waiting:
    the run ends when they fail, not as stalled."""
    res = pdsim.run(_stuck(1e6))
    warning = horizon_warning(res)[0]
    assert ("1 request can never finish; where they wait: decode-0.r0 prealloc=1, of which 1 "
            "its whole KV pool of 4,200 tokens can never take (one needs 5,096): raise "
            "fleet.decode.kv_pool_tokens") in warning, warning
    sc = _stuck(1e6)
    sc["clients"][0]["num_prompts"] = 3
    sc["disaggregation"] = {"prefill_abort_notifies_decode": True}
    told = pdsim.run(sc)
    assert told.summary["failed"] == 3 and "stalled_at_s" not in told.summary
    assert not horizon_warning(told)


def test_a_bootstrap_timeout_the_decode_is_not_told_of_leaves_its_copy_waiting():
    """Three such requests on the default release: the prefill fails them at its bootstrap
    timeout, the decode is not told, so mini_lb (which answers with the decode's response)
    has no answer for them; the warning says where they wait."""
    sc = _stuck(1e6)
    sc["clients"][0]["num_prompts"] = 3
    res = pdsim.run(sc)
    assert res.summary["failed"] == 0 and (res.requests.status == "unfinished").all()
    warning = horizon_warning(res)[0]
    assert "3 requests can never finish" in warning and "prealloc=3" in warning, warning


def test_clients_done_ends_the_run_whatever_the_horizon():
    d = {"fleet": {"gpu": "H20", "model": "dsv3-ci-test"},
         "clients": [{"kind": "bench", "num_prompts": 20}]}
    a, b = pdsim.run(dict(d, horizon_s=100)), pdsim.run(dict(d, horizon_s=1e5))
    assert _frames(a) == _frames(b) and "stalled_at_s" not in a.summary


# --- validate catches what run rejects; the CLI's last resort -------------------------------------


def test_fuzz_found_negative_seed_fails_validate(capsys):
    assert main(["validate", str(FOUND / "min_negative_seed.yaml")]) == 2
    err = capsys.readouterr().err
    assert "'seed'" in err and "greater than or equal to 0" in err and err.count("\n") == 1


def test_an_unexpected_exception_is_one_line_asking_for_a_report(monkeypatch, capsys):
    from pdsim.cli import model

    def boom(_name):
        raise RuntimeError("kaboom\nsecond line")

    monkeypatch.setattr(model, "profiles_cmd", boom)
    monkeypatch.delenv("PDSIM_DEBUG", raising=False)
    assert main(["profiles"]) == 70
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "this is a bug in pdsim; please report it" in err
    monkeypatch.setenv("PDSIM_DEBUG", "1")
    with pytest.raises(RuntimeError):
        main(["profiles"])


def test_a_trace_run_directory_reruns_with_the_path_flag(tmp_path):
    res = pdsim.run(SCENARIOS / "trace_replay.yaml", sets=["clients.0.num_prompts=20"])
    res.write(tmp_path / "run")
    text = (tmp_path / "run" / "scenario.yaml").read_text()
    assert "--allow-outside-paths" in text.splitlines()[1]
    again = pdsim.run(tmp_path / "run" / "scenario.yaml", allow_outside_paths=True)
    assert again.summary == res.summary
    with pytest.raises(pdsim.ScenarioError, match="leads outside"):
        pdsim.load(tmp_path / "run" / "scenario.yaml")


def test_a_busy_run_cut_by_the_horizon_is_no_stall():
    """A run whose next batch step ends just past the horizon stops at the horizon; it was
    logged as stalled a few ms early when a time-series sample fell just before the horizon
    (review 4: seed 3, samples every 13.7 ms)."""
    import golden

    d = golden._small(
        seed=3, horizon_s=7.77, timeseries_interval_s=0.0137,
        fleet={"gpu": "H20", "model": "dsv3-ci-test",
               "prefill": {"dp": 2, "tp": 2, "dp_attention": True, "balance": "total_tokens",
                           "chunked_prefill_size": 4096, "page_size": 16},
               "decode": {"dp": 4, "tp": 4, "dp_attention": True, "balance": "total_tokens",
                          "page_size": 16, "kv_pool_tokens": 20000,
                          "num_reserved_decode_tokens": 32}},
        clients=[{"kind": "bench", "num_prompts": 200, "max_concurrency": 96,
                  "dataset": {"kind": "random", "input_len": 1024, "output_len": 512,
                              "range_ratio": 0.7}}])
    res = pdsim.run(d)
    assert res.summary["stopped_at_horizon"] and "stalled_at_s" not in res.summary
    assert not (res.events.event == "run_stalled").any()
    assert res.summary["simulated_s"] == 7.77


# --- model overrides that contradict the profile (each field valid alone) ---------------------


@pytest.mark.parametrize("name, key", [
    ("min_experts_below_topk.yaml", "model.experts_per_token"),  # was an OverflowError
    ("min_experts_below_topk_tbo.yaml", "model.experts"),  # complex step times (TBO)
    ("min_gqa_on_an_mla_profile.yaml", "model.attention"),  # ZeroDivisionError in validate
    ("min_gqa_without_kv_heads.yaml", "model.kv_heads"),  # ZeroDivisionError in run
])
def test_fuzz_found_contradictory_model_overrides_fail_validate(capsys, name, key):
    """validate names the overridden key and what the architecture needs, in one line; run
    refuses the same (it crashed in the simulation)."""
    assert main(["validate", str(FOUND / name)]) == 2
    err = capsys.readouterr().err
    assert f"invalid value at '{key}' (scenario override)" in err and err.count("\n") == 1
    with pytest.raises(pdsim.ScenarioError, match=key.replace(".", r"\.")):
        pdsim.run(FOUND / name, allow_outside_paths=True)


def test_a_consistent_model_override_still_loads():
    d = {"fleet": {"gpu": "H20", "model": "dsv3-ci-test"}, "clients": [{"kind": "bench"}],
         "model": {"experts": 16, "experts_per_token": 4}}
    assert pdsim.load(d).model.experts == 16
    d["model"] = {"attention": "gqa", "kv_heads": 8, "head_dim": 128}
    assert pdsim.load(d).model.attention == "gqa"


@pytest.mark.parametrize("name, key", [("min_fault_kind_a_list.yaml", "faults.0.kind"),
                                       ("min_blacklist_policy_a_dict.yaml", "blacklist.policy")])
def test_fuzz_found_a_list_or_dict_naming_a_policy_or_fault_is_one_line(capsys, name, key):
    """A registry name that is a list or a dict was an internal error (unhashable)."""
    assert main(["validate", str(FOUND / name)]) == 2
    err = capsys.readouterr().err
    assert f"invalid value at '{key}': unknown" in err and err.count("\n") == 1
    assert main(["run", "scenarios/healthy.yaml", "--set", "blacklist.policy=[]"]) == 2
    assert "invalid value at 'blacklist.policy'" in capsys.readouterr().err


def test_the_library_refuses_what_is_not_a_scenario_with_a_scenario_error():
    """pdsim.run of something that is not a path, dict or Scenario, ``sets`` given as one
    string (it was read character by character), and dicts nested past a YAML file's limit
    or referring to themselves (RecursionError) are ScenarioErrors in one line."""
    base = {"fleet": {"gpu": "H20", "model": "dsv3-ci-test"},
            "clients": [{"kind": "bench", "num_prompts": 1}]}
    for bad in (None, 5, b"fleet: {}"):
        with pytest.raises(pdsim.ScenarioError, match="a YAML path, a dict or a Scenario"):
            pdsim.run(bad)
    with pytest.raises(pdsim.ScenarioError, match=r"sets: a list of .* \(got 'seed=1'\)"):
        pdsim.run(base, "seed=1")
    deep: dict = {}
    node = deep
    for _ in range(900):
        node["a"] = node = {}
    selfref = dict(base)
    selfref["description"] = selfref
    for d in (dict(base, description=deep), selfref):
        with pytest.raises(pdsim.ScenarioError, match="nested deeper than 50 levels") as err:
            pdsim.run(d)
        assert "\n" not in str(err.value)
    wide: list = []
    for _ in range(40):  # 2^40 values as a walk sees them, in 40 lists
        wide = [wide, wide]
    with pytest.raises(pdsim.ScenarioError, match="more than 50,000 values"):
        pdsim.run(dict(base, bogus=wide))


def test_a_bar_shows_only_for_a_run_still_going_after_its_delay(capsys):
    """``progress`` as a number: a run still going after that many wall seconds shows a bar
    (``pdsim run`` on a terminal: 2 s), one that ends sooner shows none; either way the run
    is the run without a bar (the bar is drawn from a thread reading the clock)."""
    sets = ["clients.0.num_prompts=200", "clients.1.num_prompts=200"]
    plain = pdsim.run(SCENARIOS / "drop_timeout.yaml", sets=sets)
    capsys.readouterr()
    late = pdsim.run(SCENARIOS / "drop_timeout.yaml", sets=sets, progress=60)
    assert capsys.readouterr().err == ""
    soon = pdsim.run(SCENARIOS / "drop_timeout.yaml", sets=sets, progress=1e-6)
    err = capsys.readouterr().err
    total = 200 + 200  # the two benches' prompts (the bar counts requests)
    assert f"/{total} [" in err and "req" in err, err
    assert _frames(late) == _frames(plain) == _frames(soon)


@pytest.mark.parametrize("tty, flags, want", [
    (True, [], 2.0), (False, [], False), (True, ["--no-progress"], False),
    (False, ["--progress"], True)])
def test_pdsim_run_shows_a_late_bar_on_a_terminal(monkeypatch, tty, flags, want):
    """A long `pdsim run` on a terminal showed nothing until it ended (hours, for a big
    scenario): a run still going after 2 s now shows its bar; --no-progress never does."""
    import pdsim.output.result

    seen = []
    real = pdsim.output.result.run

    def spy(*a, **kw):
        seen.append(kw["progress"])
        return real(*a, **kw)

    monkeypatch.setattr(pdsim.output.result, "run", spy)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: tty)
    assert main(["run", "scenarios/healthy.yaml", "--json", *flags,
                 "--set", "clients.0.num_prompts=20"]) == 0
    assert seen == [want]


def test_a_stalled_fleet_names_a_few_ranks_those_that_explain_it_first():
    """A stall across a large fleet listed every busy rank in one line (41,703 characters at
    128 servers a role): at most STALL_RANKS, the ranks holding a request their pool cannot
    take first, then a count of the rest."""
    from pdsim.engine.sim import STALL_RANKS

    res = pdsim.run(SCENARIOS / "whatif_base.yaml", [
        "clients.0.num_prompts=400", "clients.0.request_rate=inf",
        # (prompts of 300-600 tokens and outputs clipped to 4,096: some never fit: _stuck)
        "clients.0.dataset.input_len=600", "clients.0.dataset.output_len=6000",
        "fleet.decode.kv_pool_tokens=4500", "fleet.decode.num_reserved_decode_tokens=0",
        "fleet.prefill.servers=4", "fleet.decode.servers=8"])
    assert res.summary.get("stalled_at_s") is not None
    where = horizon_warning(res)[0].split("where they wait: ", 1)[1].split("; ")
    assert len(where) == STALL_RANKS + 1 and where[-1].startswith("and ")
    assert where[-1].endswith("more ranks. The figures above leave them out.")
    unfit = ["can never take" in w for w in where[:STALL_RANKS]]
    assert unfit[0] and unfit == sorted(unfit, reverse=True)  # those ranks first


@pytest.mark.parametrize("progress, delay", [
    (None, None), (False, None), (True, 0.0), (2, 2.0), (0.5, 0.5)])
def test_run_progress_takes_a_bool_none_or_seconds(progress, delay):
    """``progress=None`` (falsy, as before) was a TypeError once a number meant a delay."""
    import numpy as np

    from pdsim.engine.sim import _bar_delay

    assert _bar_delay(progress) == delay
    assert _bar_delay(np.bool_(bool(progress))) == (0.0 if progress else None)


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), "soon", [1]])
def test_run_progress_refuses_what_is_no_delay(bad):
    with pytest.raises(ValueError, match="progress=.*give True, False or a number of seconds"):
        pdsim.run(SCENARIOS / "healthy.yaml", ["clients.0.num_prompts=5"], progress=bad)


def test_faults_and_flushes_timed_after_the_run_ended_are_reported_not_silently_dropped():
    """A run ends when its clients are done: a decode crash or an operator flush timed after
    that never happened, and the report read as 'no harm done' (a what-if of the library's
    60 s faults on a base whose load ends sooner showed 0% lost for every policy)."""
    from pdsim.output.report import not_reached, not_reached_warning, render

    sc = small_fleet(operator_flushes=[{"at_s": 1.0}, {"at_s": 500.0}],
                     faults=[{"kind": "decode_crash", "decode_server": 0, "at_s": 400.0}])
    sc["clients"][0]["num_prompts"] = 20
    res = pdsim.run(sc)
    end = res.end_s
    assert end < 400 and not res.summary["stopped_at_horizon"]
    assert not_reached(res.scenario, end) == ["operator_flushes.1 at 500 s",
                                              "faults.0 decode_crash at 400 s"]
    text = render(res)
    assert (f"WARNING: never happened, the run ended at {end:.6g} s (its clients were done): "
            "operator_flushes.1 at 500 s; faults.0 decode_crash at 400 s.") in text, text
    late = small_fleet(horizon_s=100)
    late["clients"][0].update(num_prompts=5, start_s=200.0)
    res = pdsim.run(late)
    assert not_reached(res.scenario, res.summary["simulated_s"]) == [
        "clients.0 'bench' starting at 200 s"]
    warnings = horizon_warning(res) + not_reached_warning(res)
    assert "can never finish" not in " ".join(warnings), warnings  # no request is stuck
    assert not_reached_warning(pdsim.run(small_fleet(operator_flushes=[{"at_s": 1.0}]))) == []


def test_a_fault_just_before_the_runs_end_happened_though_the_summary_rounds_the_end():
    """The summary's simulated_s has 3 decimals: a crash between it and the true end (3.44025 s
    in a run ending at 3.4405 s) happened, and the warning said it never did."""
    from pdsim.output.report import not_reached_warning

    for n in range(40, 60):
        d = small_fleet()
        d["clients"][0].update(num_prompts=n, max_concurrency=16)
        end = pdsim.run(d).end_s
        if round(end, 3) < end - 1e-5:
            break
    else:
        pytest.fail("no run ended off the summary's 3 decimals")
    d["faults"] = [{"kind": "decode_crash", "decode_server": 0, "restart_after_s": 1,
                    "at_s": (round(end, 3) + end) / 2}]
    res = pdsim.run(d)
    assert (res.events.event == "fault_start").any()  # it happened
    assert not_reached_warning(res) == []

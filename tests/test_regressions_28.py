"""Regressions for the defects issue #28 reported (reproductions in tests/fuzz_found/, one folder
each, the observed symptom in its first comment)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import check_accounting, small_fleet, watch_ends

import pdsim
from pdsim.cli.main import main
from pdsim.output.report import horizon_warning, render

FOUND = Path(__file__).parent / "fuzz_found"


def _run(name: str, *sets: str) -> pdsim.Result:
    return pdsim.run(FOUND / name / "scenario.yaml", list(sets), allow_outside_paths=True)


# --- 1. one request, one end ----------------------------------------------------------------------


def test_fuzz_found_a_request_ends_once_the_first_end_wins():
    """A bootstrap or waiting timeout (the decode answers ``failed``) and the router's
    request_timeout_s of 300 s fell in one instant: MiniLB._resume overwrote the status with
    ``timed_out`` before the answer was processed. The first end now wins."""
    with watch_ends() as watch:  # (found with 256 decode slots, pdsim's old default: with
        # SGLang's derived default, 4,096, every request pre-allocates and the decode's waiting
        # timeouts end them all, so no router timeout comes first)
        res = _run("min_request_ended_twice", "fleet.decode.max_running_requests=256")
    assert watch.writes and watch.ended_twice() == {}
    req = res.requests.set_index("rid")
    # rid 0: the decode's waiting timeout and the router's timeout, both at 300.0005 s
    assert req.t_done[0] == req.t_arrival[0] + 300.0005
    assert (req.status[0], req.reason[0], req.http_status[0]) == ("failed", "waiting_timeout",
                                                                   200)
    assert {"failed", "timed_out"} <= set(req.status) <= {"failed", "timed_out", "completed"}


# --- 3. the time series counts what the request table counts, to the run's end -----------------


def _ended_badly(res: pdsim.Result) -> int:
    return int(res.requests.status.isin(["failed", "timed_out"]).sum())


def test_fuzz_found_the_time_series_counts_router_timeouts():
    """975 router 504s (request_timeout_s 0.5 s, one request at a time) left
    timeseries.failed at 0: it counted only the decode's failures."""
    res = _run("min_timeseries_failed_router_timeout")
    assert (res.requests.status == "timed_out").sum() == 975 == _ended_badly(res)
    ts = res.timeseries
    assert ts.failed.iloc[-1] == 975 and ts.failed[ts.time <= 2.0].iloc[-1] == 3
    assert (ts.failed_per_s[ts.time > 1] == 2.0).mean() > 0.9  # one 504 every 0.5 s


def test_fuzz_found_the_time_series_closes_at_the_runs_end():
    """777 of 778 failures (a partition's heartbeat loss) came at 365.0 s after the last 1 s
    sample and the run ended at 365.0005 s with no sample: the time series said 1 failed."""
    res = _run("min_timeseries_final_interval_unsampled")
    ts, s = res.timeseries, res.summary
    bad = _ended_badly(res)
    assert s["failed"] + 1 == bad > 700  # (the summary leaves the warmup out)
    assert ts.time.iloc[-1] == res.end_s == 365.0005
    assert ts.failed.iloc[-1] == bad and ts.failed.iloc[-2] == 1
    assert ts.tokens_out.iloc[-1] == s["tokens_generated_fleet"]


def test_fuzz_found_the_time_series_counts_prefill_side_failures():
    """The shrunk case the heartbeat finding came from: its failures are the prefill's
    (heartbeat lost; the warmup's waiting timeout, in the instant of its router timeout), all
    in the time series by the run's end."""
    res = _run("min_timeseries_failed_heartbeat")
    reasons = res.requests.reason.value_counts().to_dict()
    assert set(reasons) == {"prefill_heartbeat_lost", "", "waiting_timeout"}
    assert res.timeseries.failed.iloc[-1] == _ended_badly(res) == (
        reasons["prefill_heartbeat_lost"] + reasons["waiting_timeout"]) > 700


# --- 2. every prompt is sent and ended, in flight, or not sent -----------------------------------


def test_fuzz_found_a_bench_whose_warmup_never_returns_has_every_prompt_unsent():
    """A prefill pool smaller than a prompt: the warmup never returns and the run stalls.
    The client said ``requests: 0, unsent: 0`` (``planned`` was set after the warmup)."""
    res = _run("min_bench_unsent_undercount")
    m = res.summary["clients"]["bench0"]
    assert (m["requests"], m["unfinished"], m["unsent"]) == (0, 0, 1000)
    warning = horizon_warning(res)[0]
    assert ("1000 prompts/questions not sent (bench0: 1 warmup request in flight, 1000 not "
            "sent)") in warning, warning
    check_accounting(res)


def test_a_bench_starting_after_the_horizon_or_aborting_has_every_prompt_unsent():
    late = small_fleet(horizon_s=100)
    late["clients"][0].update(num_prompts=5, start_s=200.0)
    res = pdsim.run(late)
    assert res.summary["clients"]["bench"]["unsent"] == 5
    check_accounting(res)
    # (the gateway answers 206 to a flush a busy rank refuses: raise_for_status aborts)
    aborts = small_fleet(router={"flush_handler": "rust_router"},
                         flush={"semantics": "reject_if_busy"},
                         operator_flushes=[], faults=[])
    aborts["clients"] = [
        {"kind": "bench", "name": "load", "num_prompts": 50, "request_rate": 10.0},
        {"kind": "bench", "name": "ci", "num_prompts": 7, "start_s": 1.0,
         "flush": {"mode": "raise_for_status"}}]
    res = pdsim.run(aborts)
    ci = res.summary["clients"]["ci"]
    assert ci["aborted"] and (ci["requests"], ci["unsent"]) == (0, 7)
    assert "raise_for_status aborted (7 prompts not sent)" in render(res)
    check_accounting(res)


def test_fuzz_found_eval_questions_in_flight_are_not_also_unsent():
    """3 questions on 3 threads, all in flight at the horizon: "3 in flight, 3 not sent"."""
    res = _run("min_eval_unsent_counts_in_flight")
    m = res.summary["clients"]["eval0"]
    assert (m["questions"], m["questions_in_flight"], m["unsent"]) == (0, 3, 0)
    warning = horizon_warning(res)[0]
    assert "0 prompts/questions not sent (eval0: 3 questions in flight)" in warning, warning
    check_accounting(res)


def test_eval_questions_never_asked_are_unsent():
    d = small_fleet(horizon_s=4.0)
    d["clients"] = [{"kind": "eval", "questions": 50, "threads": 4,
                     "dataset": {"kind": "random", "input_len": 256, "output_len": 64}}]
    res = pdsim.run(d)
    m = res.summary["clients"]["eval"]
    assert m["questions"] > 0 and m["questions_in_flight"] == 4 and m["unsent"] > 0
    assert m["questions"] + m["questions_in_flight"] + m["unsent"] == 50
    check_accounting(res)


def test_a_trace_cut_by_the_horizon_accounts_for_its_rows():
    from conftest import SCENARIOS

    res = pdsim.run(SCENARIOS / "trace_replay.yaml", ["clients.0.num_prompts=300",
                                                      "horizon_s=5"])
    m = next(iter(res.summary["clients"].values()))
    assert m["requests"] > 0 and m["unsent"] > 0 and m["requests"] + m["unsent"] == 300
    check_accounting(res)


# --- 4. a room failing in the instant its last chunk commits is freed once -----------------------


def test_fuzz_found_a_room_failing_as_its_last_chunk_commits_is_freed_once():
    """A waiting timeout in the instant a request's last prefill chunk committed: commit_step
    freed its pages, then the room's pending done step freed them again (KVError: double
    free). The prefill now stops listening to a room once it has released its request."""
    _run("min_kv_double_free")  # (runs clean; SGLang's admission now keeps it from the tie)
    # the tie by construction: every prefill forward takes 1 s (a fitted predictor), nothing
    # else takes time, a 128-token prompt goes in two 64-token chunks, and the decode's
    # waiting timeout of 2 s fails the room in the instant its last chunk commits (from
    # 0.5.13 the decode's abort reaches the prefill; 0.5.21+ holds the decode's pages after
    # it until the prefill's ABORT_ACK)
    d = {"fleet": {"gpu": "H20", "model": "dsv3-ci-test", "prefill": {"chunked_prefill_size": 64}},
         "engine": {"bootstrap_ms": 0, "tokenize_us_per_token": 0, "version": "0.5.20"},
         "router": {"http_latency_ms": 0},
         "transfer": {"call_latency_ms": 0, "waiting_timeout_s": 2.0},
         "predictor": {"kind": "fitted", "coefficients": {
             "prefill_a_ms": 1000, "prefill_b_ms_per_ktok": 0, "prefill_c_ms_per_mtok2": 0,
             "decode_a_ms": 10, "decode_b_ms_per_ktok": 0, "decode_c_ms_per_seq": 0}},
         "clients": [{"kind": "bench", "num_prompts": 2, "warmup_requests": 0, "dataset": {
             "kind": "random", "input_len": 128, "output_len": 4, "range_ratio": 1.0}}]}
    res = pdsim.run(d)
    req = res.requests
    timed = req[req.reason == "waiting_timeout"]
    assert (timed.t_prefill_end == timed.t_done).sum() > 0  # the tie
    assert all(pool["used"] == 0 for pool in res.kv_pools.values()), res.kv_pools


# --- 5. extreme values: rates that give no finite step or write time; fitted coefficients -------


@pytest.mark.parametrize("name, key, what", [
    ("min_predictor_zerodivision", "gpu", "gpu.bf16_tflops x gpu.gemm_eff is 0 (the product "
                                          "underflows)"),
    ("min_nic_zerodivision", "gpu.nic_gbps", "is 0 bytes/s"),
])
def test_fuzz_found_rates_that_underflow_to_zero_fail_validate(capsys, name, key, what):
    """gemm_eff and bf16_tflops of 1e-300 (peak FLOP/s 0), nic_gbps and peak_utilisation of
    1e-300 (a write's rate 0): validate said ok and the run divided by zero (exit 70)."""
    path = str(FOUND / name / "scenario.yaml")
    assert main(["validate", path]) == 2
    err = capsys.readouterr().err
    assert f"invalid value at '{key}'" in err and what in err and err.count("\n") == 1, err
    assert main(["run", path]) == 2
    assert capsys.readouterr().err == err


@pytest.mark.parametrize("sets, key", [
    # positive rates so small that the largest step or write a scenario allows overflows
    (["gpu.hbm_eff=1e-300", "gpu.hbm_tbps=1e-5"], "gpu"),
    (["predictor.kind=roofline", "predictor.prefill_mfu=1e-300", "gpu.fp8_tflops=1e-9"],
     "predictor"),
    (["gpu.nic_gbps=1e-300"], "gpu.nic_gbps"),
    (["transfer.nic_gbps=0.001", "transfer.min_utilisation=1e-300"], "transfer.nic_gbps"),
])
def test_rates_whose_largest_step_overflows_fail_validate_and_run(sets, key):
    for load in (pdsim.load, pdsim.run):
        with pytest.raises(pdsim.ScenarioError, match=f"invalid value at '{key}'.*no finite"):
            load(FOUND / "min_set_deep_recursion" / "scenario.yaml", sets,
                 allow_outside_paths=True)


def test_slow_but_finite_rates_validate_and_run():
    """A rate tiny but with finite steps is computed with, not refused (validate and run agree):
    every step outlasts the horizon."""
    res = _run("min_set_deep_recursion", "gpu.gemm_eff=1e-300", "clients.0.num_prompts=3")
    assert res.summary["stopped_at_horizon"] and res.summary["completed_requests"] == 0
    check_accounting(res)


@pytest.mark.parametrize("name, got", [("min_profile_fitted_nan", "finite number (got nan)"),
                                       ("min_profile_fitted_neg", "greater than or equal to 0")])
def test_fuzz_found_a_profiles_fitted_coefficients_are_bounded_as_the_scenarios(capsys, name,
                                                                                 got):
    """A user profile's models.X.fitted.<GPU> had no bounds: negative coefficients ended a
    run at -0.049 s, NaN made it send nothing. They take predictor.coefficients' bounds."""
    path = str(FOUND / name / "scenario.yaml")
    model = "fz-fitnan" if "nan" in name else "fz-fitneg"
    for cmd in ("validate", "run"):
        assert main([cmd, path]) == 2
        err = capsys.readouterr().err
        assert f"invalid value at 'models.{model}.fitted.H20.prefill_a_ms': " in err, err
        assert got in err and err.count("\n") == 1


@pytest.mark.parametrize("value, got", [(".inf", "finite number"), ("1.0e300", "less than"),
                                        ("-1", "greater than or equal to 0")])
def test_profile_and_scenario_coefficients_share_their_bounds(tmp_path, value, got):
    (tmp_path / "p.yaml").write_text(
        f"models: {{m: {{extends: dsv3-ci-test, fitted: {{H20: {{decode_a_ms: {value}}}}}}}}}\n")
    base = {"profiles": ["p.yaml"], "fleet": {"gpu": "H20", "model": "m"},
            "clients": [{"kind": "bench", "num_prompts": 1}]}
    (tmp_path / "s.yaml").write_text(json.dumps(base))
    with pytest.raises(pdsim.ScenarioError, match=f"fitted.H20.decode_a_ms.*{got}"):
        pdsim.load(tmp_path / "s.yaml")
    inline = dict(base, profiles=[], fleet={"gpu": "H20", "model": "dsv3-ci-test"},
                  predictor={"kind": "fitted",
                             "coefficients": {"decode_a_ms": float(value.strip("."))}})
    with pytest.raises(pdsim.ScenarioError, match=f"predictor.coefficients.decode_a_ms.*{got}"):
        pdsim.load(inline)


# --- 6. deep --set keys and symlink loops: one line, exit 2 --------------------------------------


DEEP = "a." * 500 + "b"


@pytest.mark.parametrize("argv", [
    ["validate", "{s}", "--set", DEEP + "=1"],
    ["run", "{s}", "--set", DEEP + "=1"],
    ["sweep", "{s}", "--vary", DEEP + "=1,2"],
    ["explore", "{s}", "--set", DEEP + "=1", "--samples", "2", "--out", "{tmp}/ex"],
    # a key within the limit whose value nests past it
    ["validate", "{s}", "--set", "a." * 45 + "b=" + "[" * 40 + "]" * 40],
])
def test_fuzz_found_a_deep_set_key_is_one_line(capsys, tmp_path, argv):
    """A --set key ~500 levels deep built a dict past the file's 50-level limit after it was
    checked: RecursionError in unknowns.resolve (exit 70)."""
    s = str(FOUND / "min_set_deep_recursion" / "scenario.yaml")
    assert main([a.format(s=s, tmp=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "50 levels" in err and "internal error" not in err, err
    assert not (tmp_path / "ex").exists()


def _loop(tmp_path: Path, name: str) -> None:
    """``name`` is a symlink loop (``loop_a`` -> ``loop_b`` -> ``loop_a``)."""
    stem, ext = name.rsplit(".", 1)
    (tmp_path / f"{stem}.{ext}").symlink_to(f"{stem.replace('_a', '_b')}.{ext}")
    (tmp_path / f"{stem.replace('_a', '_b')}.{ext}").symlink_to(f"{stem}.{ext}")


@pytest.mark.parametrize("where, key", [
    ("trace", "'clients.0.dataset.path': trace file: cannot resolve loop_a.jsonl"),
    ("profiles", "'profiles.0': cannot resolve loop_a.yaml"),
    ("extends", "'extends': cannot resolve loop_a.yaml"),
])
def test_fuzz_found_a_symlink_loop_is_one_line(capsys, tmp_path, where, key):
    """Path.resolve raises RuntimeError on a symlink loop (Python 3.11), and the handler read
    its .strerror: AttributeError, exit 70."""
    text = (FOUND / "min_symlink_loop" / "scenario.yaml").read_text()
    if where == "profiles":
        text = text.replace("dataset: {kind: trace, path: loop_a.jsonl}", "") + \
            "profiles: [loop_a.yaml]\n"
    elif where == "extends":
        text = "extends: loop_a.yaml\n"
    (tmp_path / "scenario.yaml").write_text(text)
    _loop(tmp_path, "loop_a.jsonl" if where == "trace" else "loop_a.yaml")
    for cmd in ("validate", "run"):
        assert main([cmd, str(tmp_path / "scenario.yaml")]) == 2
        err = capsys.readouterr().err
        assert key in err and "(a symlink loop)" in err and err.count("\n") == 1, err


# --- 7. validating declared unknowns stays linear ------------------------------------------------


def _counting(monkeypatch, limit: int) -> list:
    """Count the whole-scenario validations unknowns.finish makes; fail past ``limit`` (the
    quadratic version made 63,000 for the fuzz-found file: 292 s)."""
    from pdsim.config import loader as scenario_mod

    calls: list = []
    real = scenario_mod.from_dict

    def counted(data, context=None):
        calls.append(1)
        if len(calls) > limit:
            raise RuntimeError(f"more than {limit} validations")
        return real(data, context)

    monkeypatch.setattr(scenario_mod, "from_dict", counted)
    return calls


def test_fuzz_found_a_thousand_short_integer_unknowns_validate_in_a_bounded_number_of_checks(
        monkeypatch):
    """1,000 faults, each with flaps: {uniform: [1, 64], nominal: 1}: unknowns.finish
    validated the whole scenario once per value of every range (64,000 validations of a
    1,000-fault file). Now at most MAX_CHECKS rounds, every unknown at once."""
    from pdsim.config.unknowns import MAX_CHECKED_INTS, MAX_CHECKS

    calls = _counting(monkeypatch, 2 * MAX_CHECKS)
    sc = pdsim.load(FOUND / "min_unknowns_quadratic_validate" / "scenario.yaml")
    assert len(sc.unknowns) == 1000 and len(sc.faults) == 1000
    assert len(calls) == 1 + (MAX_CHECKED_INTS - 1)  # the nominal, then rounds of 2..64


def test_a_rejected_value_among_many_unknowns_is_found_and_named(monkeypatch):
    """In rounds, a rejected round is bisected to the one unknown whose value is rejected
    alone, and the error names it as a check of its own would."""
    faults = [{"kind": "nic_flaps", "at_s": i, "flaps": {"uniform": [1, 64], "nominal": 1}}
              for i in range(300)]
    faults[217]["prefill_server"] = {"uniform": [0, 2], "nominal": 0}  # one server only
    d = {"fleet": {"gpu": "H20", "model": "dsv3-ci-test"}, "faults": faults,
         "clients": [{"kind": "bench", "num_prompts": 5}]}
    calls = _counting(monkeypatch, 200)
    with pytest.raises(pdsim.ScenarioError, match=r"^invalid value at 'faults\.217\."
                       r"prefill_server': uniform \[0, 2\] \(integer\) includes 1, which is "
                       r"rejected; list the allowed values with choice: \[\.\.\.\]: "):
        pdsim.load(d)
    assert len(calls) < 1 + 2 + 2 * 10  # the nominal, round 1, a bisection of 301


def test_a_choice_lists_at_most_max_choices_values():
    from pdsim.config.unknowns import MAX_CHOICES

    d = {"fleet": {"gpu": "H20", "model": "dsv3-ci-test"},
         "clients": [{"kind": "bench", "num_prompts": 5,
                      "start_s": {"choice": list(range(MAX_CHOICES + 1)), "nominal": 0}}]}
    with pytest.raises(pdsim.ScenarioError, match=f"choice lists at most {MAX_CHOICES} values"):
        pdsim.load(d)


# --- 8. an output never replaces an input ------------------------------------------------------


def _inputs_dir(tmp_path: Path) -> Path:
    """A scenario (scenario.yaml) extending base.yaml, with a profile file and a trace."""
    from conftest import TRACES

    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "base.yaml").write_text(
        "fleet: {gpu: H20, model: mine}\nprofiles: [p.yaml]\n"
        "clients: [{kind: bench, num_prompts: 5, dataset: {kind: trace, path: t.jsonl}}]\n")
    (tmp_path / "p.yaml").write_text("models: {mine: {extends: dsv3-ci-test}}\n")
    import gzip

    rows = gzip.open(next(TRACES.glob("*.jsonl.gz")), "rt").read().splitlines()[:5]
    (tmp_path / "t.jsonl").write_text("\n".join(rows) + "\n")
    (tmp_path / "scenario.yaml").write_text("extends: base.yaml\nhorizon_s: 60\n")
    return tmp_path


@pytest.mark.parametrize("argv, what", [
    (["run", "{d}/scenario.yaml", "--perfetto", "{d}/scenario.yaml"], "scenario.yaml, a scenario"),
    (["run", "{d}/scenario.yaml", "--perfetto", "{d}/base.yaml"], "base.yaml, an extends: parent"),
    (["run", "{d}/scenario.yaml", "--perfetto", "{d}/p.yaml"], "p.yaml, a profile file"),
    (["run", "{d}/scenario.yaml", "--perfetto", "{d}/link.json"], "scenario.yaml, a scenario"),
    (["run", "{d}/scenario.yaml", "--out", "{d}"], "scenario.yaml, a scenario file"),
    (["sweep", "{d}/scenario.yaml", "--vary", "horizon_s=50,60", "--out", "{d}/t.jsonl"],
     "t.jsonl, a trace file"),
    (["explore", "{d}/scenario.yaml", "--set", "horizon_s={{uniform: [50, 60], nominal: 60}}",
      "--samples", "1", "--out", "{d}/.."], None),  # (nothing it writes there is an input)
    (["calibrate", "{d}/steps.csv", "--gpu", "H20", "--model", "mine", "--profiles", "{d}/p.yaml",
      "--out", "{d}/p.yaml"], "p.yaml, an input file"),
    (["calibrate", "{d}/steps.csv", "--gpu", "H20", "--model", "mine", "--plot",
      "{d}/steps.csv"], "steps.csv, an input file"),
])
def test_fuzz_found_an_output_that_is_an_input_is_refused(capsys, tmp_path, argv, what):
    """``pdsim run s.yaml --perfetto s.yaml`` replaced the scenario with the trace. An output
    that is one of the command's input files is refused in one line before anything is
    written (symlinks followed; a run directory's scenario.yaml over the scenario too)."""
    d = _inputs_dir(tmp_path / "in")
    (d / "steps.csv").write_text("phase,batch_size,input_len,step_ms\nprefill,1,1024,50\n")
    (d / "link.json").symlink_to("scenario.yaml")
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    code = main([a.format(d=d) for a in argv])
    err = capsys.readouterr().err
    if what is None:
        assert code == 0, err
        return
    assert code == 2 and f"would replace {d / what.split(',')[0]}, {what.split(', ')[1]}" in err
    assert err.count("\n") == 1, err
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before  # nothing written


def test_whatif_out_is_checked_against_its_inputs_before_the_matrix(capsys, tmp_path):
    d = _inputs_dir(tmp_path)
    (d / "table.csv").write_text("decode_crash:\n  kind: decode_crash\n  at_s: 1\n")
    assert main(["whatif", str(d / "scenario.yaml"), "--faults-file", str(d / "table.csv"),
                 "--out", str(d)]) == 2
    err = capsys.readouterr().err
    assert f"--out {d}: would replace {d / 'table.csv'}, an input file" in err, err


def test_a_run_directory_lists_what_it_writes():
    """The check of run --out reads sim.run_dir_names: the names Result.write uses."""
    from pdsim.output.result import RUN_DIR_FILES, run_dir_names

    res = _run("min_eval_unsent_counts_in_flight")
    assert set(res.describe()) | {"summary.json"} == set(RUN_DIR_FILES)
    assert "answers.parquet" in run_dir_names("parquet")
    # (compare reads a run directory's files by the same names: its --plot must not
    # replace one)
    from pdsim.cli import common

    assert {p.name for p in common.run_dir_inputs("d")} == {*run_dir_names("csv"),
                                                          *run_dir_names("parquet")}


# --- 9. explore's resume cache: content-keyed, and only rows that verify ------------------------


def _explore(d: Path, out: Path, *more: str) -> tuple[int, str, str]:
    import contextlib
    import io

    err, std = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(std):
        code = main(["explore", str(d / "scenario.yaml"), "--samples", "2", "--seeds", "1",
                     "--workers", "1", "--out", str(out), "--no-figures", *more])
    return code, std.getvalue(), err.getvalue()


def test_fuzz_found_planted_rows_are_ignored_with_a_warning_and_run_again(tmp_path):
    """Any Parquet file in OUT/runs.parquet/ whose key columns matched was taken as results:
    forged outputs (failed 99,999) and inputs (model.layers 8, the design gave 7 and 2) were
    reported, nothing re-run (the reproducer's steps)."""
    import shutil

    import pandas as pd

    d = tmp_path / "s"
    shutil.copytree(FOUND / "explore_resume_forged_rows", d)
    out = tmp_path / "ex"
    code, honest, _ = _explore(d, out)
    assert code == 0 and "0 already stored, 2 run now" in honest
    (f,) = (out / "runs.parquet").glob("*.parquet")
    df = pd.read_parquet(f)
    assert sorted(df["model.layers"]) == [2, 7] and (df.failed == 0).all()
    df["failed"] = 99999
    df["model.layers"] = 8
    f.unlink()
    df.to_parquet(str(f).replace("-all", "-s000000-k1"), index=False)
    code, forged, err = _explore(d, out)
    assert code == 0 and "0 already stored, 2 run now" in forged, forged
    assert err.count("warning:") == 1 and "2 stored row(s)" in err and "do not verify" in err
    assert forged.split("\n", 1)[1] == honest.split("\n", 1)[1]  # the honest results
    assert _explore(d, out)[1].startswith("wi: 2 runs") and "2 already stored, 0 run now" in \
        _explore(d, out)[1]  # the forged file was folded away; the verified rows resume


def test_a_row_whose_digest_was_recomputed_still_needs_the_designs_inputs(tmp_path):
    """A forger who recomputes row_digest with pdsim's code still cannot change a row's
    inputs: they must be the values the design gives its sample."""
    import shutil

    import pandas as pd

    from pdsim.analysis.explore import DIGEST, row_digest

    d = tmp_path / "s"
    shutil.copytree(FOUND / "explore_resume_forged_rows", d)
    out = tmp_path / "ex"
    _explore(d, out)
    (f,) = (out / "runs.parquet").glob("*.parquet")
    df = pd.read_parquet(f)
    df["model.layers"] = 8
    df[DIGEST] = [row_digest(r) for r in df.to_dict("records")]
    f.unlink()
    df.to_parquet(out / "runs.parquet" / "planted.parquet", index=False)
    code, text, err = _explore(d, out)
    assert "0 already stored, 2 run now" in text and "2 stored row(s)" in err


def test_the_resume_key_follows_the_content_of_the_files_read(tmp_path):
    """An edited profile (hbm_tbps) reused the rows of the old one: the key hashed the
    scenario with the file's path. It hashes the file's content now: edited, the runs are
    made again; moved with the same content, they are reused."""
    d = tmp_path / "s"
    d.mkdir()
    (d / "p.yaml").write_text("gpus: {mygpu: {extends: H20, hbm_tbps: 4.0}}\n")
    (d / "scenario.yaml").write_text(
        (FOUND / "explore_resume_forged_rows" / "scenario.yaml").read_text()
        .replace("gpu: H20", "gpu: mygpu") + "profiles: [p.yaml]\n")
    out = tmp_path / "ex"
    assert "0 already stored, 2 run now" in _explore(d, out)[1]
    assert "2 already stored, 0 run now" in _explore(d, out)[1]
    (d / "p.yaml").write_text("gpus: {mygpu: {extends: H20, hbm_tbps: 2.0}}\n")
    code, text, err = _explore(d, out)
    assert "0 already stored, 2 run now" in text and "another scenario version" in err
    (d / "sub").mkdir()
    (d / "p.yaml").rename(d / "sub" / "moved.yaml")
    (d / "scenario.yaml").write_text((d / "scenario.yaml").read_text()
                                     .replace("[p.yaml]", "[sub/moved.yaml]"))
    assert "2 already stored, 0 run now" in _explore(d, out)[1]


# --- found by tests/fuzz.py ----------------------------------------------------------------------


def test_a_request_rate_whose_mean_gap_overflows_sends_its_first_prompt_only():
    """request_rate 5e-324 (valid: > 0): exponential gaps of scale inf made every arrival
    inf - inf = NaN, and all 30 prompts went at once. The first goes at once, the rest never
    (a gap past any horizon), as at 1e-300."""
    for rate in (5e-324, 1e-300):
        d = small_fleet(horizon_s=100)
        d["clients"][0].update(num_prompts=30, request_rate=rate, warmup_requests=0)
        res = pdsim.run(d)
        m = res.summary["clients"]["bench"]
        assert (m["requests"], m["unsent"]) == (1, 29) and res.summary["stopped_at_horizon"]
        check_accounting(res)


def test_fuzz_found_overlapping_hangs_hold_the_server_until_the_last_ends():
    """Two hangs of one decode server (0-0.5 s and 0-10 s): the short one's end resumed the
    server, the long one's end pre-allocated pages mid-span (AssertionError, exit 70). Halts
    nest now: the server steps again at 10 s, and a resume that resumes nothing takes no
    pages."""
    res = _run("min_overlapping_hangs")
    req = res.requests
    on0 = req[req.d_server == 0]
    assert len(on0) and not on0.t_first_token.between(0.5, 10.0, inclusive="neither").any()
    assert (on0.t_first_token >= 10.0).any()
    check_accounting(res)


def test_a_restart_during_a_hang_waits_for_the_hang_to_end():
    """A decode server that crashes at 0 s (restart after 1 s) and hangs from 0.5 to 5 s
    serves again at 5 s: the restart ends the crash's halt, not the hang's (it resumed the
    server at 1 s)."""
    d = small_fleet(horizon_s=120, faults=[
        {"kind": "decode_crash", "decode_server": 0, "at_s": 0.0, "restart_after_s": 1.0},
        {"kind": "decode_hang", "decode_server": 0, "at_s": 0.5, "duration_s": 4.5,
         "kv_writes": "land"}])
    d["fleet"]["decode"]["servers"] = 2
    d["clients"][0].update(num_prompts=60, request_rate=10.0)
    req = pdsim.run(d).requests
    on0 = req[(req.d_server == 0) & (req.generated > 0)]
    assert len(on0) and on0.t_first_token.min() >= 5.0, on0.t_first_token.min()


def test_a_bench_prompt_waiting_out_an_sdk_retry_is_in_flight():
    """With bench SDK retries a prompt is several requests: one whose 504 is retried after a
    backoff past the horizon has no request in flight, and it read as sent and ended."""
    d = small_fleet(horizon_s=5, router={"request_timeout_s": 1.0})  # (backoff: 8 s at most)
    d["fleet"]["decode"]["kv_pool_tokens"] = 100  # (a prompt that never fits: 504 after 1 s)
    d["clients"][0].update(num_prompts=1, warmup_requests=0, sdk_retries=3, sdk_backoff_s=100.0)
    res = pdsim.run(d)
    m = res.summary["clients"]["bench"]
    assert (m["requests"], m["unfinished"], m["unsent"], m["prompts_in_flight"]) == (1, 0, 0, 1)
    # (the retry is due past the horizon: nothing is left to simulate before it)
    assert "In flight: bench: 1 prompt in flight." in horizon_warning(res)[0], \
        horizon_warning(res)
    check_accounting(res)

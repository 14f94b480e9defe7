"""`pdsim sweep` shows the metrics that fit the scenario (an incident's columns, or a capacity
sweep's latency percentiles, keeps-up verdicts and goodput), or those --metrics names."""

from __future__ import annotations

import pandas as pd
import pytest
from conftest import small_fleet

import pdsim
from pdsim.analysis import sweep
from pdsim.cli.main import main


def _capacity(**over) -> dict:
    return small_fleet(clients=[{"kind": "bench", "num_prompts": 200, "request_rate": 20,
                                 "dataset": {"kind": "random", "input_len": 1024,
                                             "output_len": 64}}], **over)


def test_every_column_of_a_run_row_is_a_metric_name_known_before_the_runs():
    """--metrics is checked before the sweep runs, against names built from the scenario:
    a run's rows must hold no metric those names miss."""
    d = _capacity(slo={"ttft_ms": 500})
    d["clients"].append({"kind": "eval", "questions": 20, "threads": 4})
    rows = sweep.sweep(d, {"clients.0.request_rate": [20, 40]}, [1], workers=1, progress=False)
    known = set(sweep.metric_names(pdsim.load(d)))
    labels = {"clients.0.request_rate", "seed"}
    extra = [c for c in rows.columns if c not in known | labels
             and not c.startswith("transfer_failures.")]
    assert not extra
    assert {"bench.steady.keeps_up", "bench.slo.goodput_req_s", "slo.attainment",
            "eval.steady.note", "p99_itl_ms"} <= set(rows.columns)
    co = "scenarios/capacity/colocated_8xh100.yaml"  # a colocated fleet's rows too
    rows = sweep.sweep(co, {}, [1], workers=1, progress=False, sets=["clients.0.num_prompts=60"])
    known = set(sweep.metric_names(pdsim.load(co))) | {"seed"}
    assert [c for c in rows.columns if c not in known
            and not c.startswith("transfer_failures.")] == []


@pytest.mark.parametrize(("d", "incident"), [
    (_capacity(), False),
    (_capacity(faults=[{"kind": "decode_unreachable", "decode_rank": 0, "at_s": 2,
                        "duration_s": 1}]), True),
    (_capacity(operator_flushes=[{"at_s": 3}]), True),
])
def test_an_incident_is_a_scenario_with_faults_or_flushes(d, incident):
    assert sweep.is_incident(pdsim.load(d)) is incident


def _dead_rooms_only(tmp_path) -> str:
    """small_decode_window without its reported figures read from the incident block: no
    fault, flush or such figure, nothing that says "incident" before it runs; its dead rooms
    (a decode window of 4 slots and a bootstrap timeout) say it once it runs."""
    import yaml

    d = yaml.safe_load(open("scenarios/incidents/small_decode_window.yaml"))
    d["reference"] = [r for r in d["reference"]
                      if not (r.get("metric") or "").startswith("incident.")]
    path = tmp_path / "dead_rooms_only.yaml"
    path.write_text(yaml.safe_dump(d))
    return str(path)


def test_a_sweep_is_an_incident_when_pdsim_run_calls_its_runs_one(tmp_path, capsys):
    """The sweep picked its columns from the scenario before any run: a scenario whose only
    incident sign is a dead room got capacity columns while pdsim run drew its postmortem."""
    from pdsim.engine.incident import is_incident

    path = _dead_rooms_only(tmp_path)
    sc = pdsim.load(path)
    assert not sweep.is_incident(sc)  # (nothing says it before the run)
    res = pdsim.run(path)
    assert res.summary["incident"]["dead_rooms"] > 0 and is_incident(res.scenario, res.summary)
    assert main(["sweep", path, "--vary", "clients.0.tries=1,2", "--seeds", "1",
                 "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "an incident" in out and "a capacity sweep" not in out
    table = out.split("\n\n")[0]
    assert "ret!=0" in table and "unanswered" in table and "TTFT" not in table
    # a grid whose runs differ (64 decode slots: no dead room): any run that is one
    vary = {"fleet.decode.max_running_requests": [4, 64]}
    rows = sweep.sweep(path, vary, [1], workers=1, progress=False)
    assert rows["incident.dead_rooms"].notna().tolist() == [True, False]
    assert rows.attrs["incident"] and sweep.is_incident(sc, rows)
    assert list(sweep.default_columns(sc, "eval", rows).values())[:2] == ["ret!=0", "pairs"]
    # rows read back without the record (a CSV): an incident block in a row says it
    assert sweep.is_incident(sc, pd.DataFrame(rows.to_dict("records")))
    assert not sweep.is_incident(sc, pd.DataFrame(rows.to_dict("records")[1:]))
    one = sweep.sweep(path, {"fleet.decode.max_running_requests": [64]}, [1], workers=1,
                      progress=False)
    assert not one.attrs["incident"] and not sweep.is_incident(sc, one)


def test_the_columns_fit_the_scenario():
    sc = pdsim.load(_capacity())
    cols = sweep.default_columns(sc, "bench")
    assert list(cols.values())[:3] == ["offered/s", "done/s", "keeps up"]
    assert "TTFT p99" in cols.values() and "tok/s" in cols.values()
    with_slo = sweep.default_columns(pdsim.load(_capacity(slo={"tpot_ms": 50})), "bench")
    assert with_slo["bench.slo.goodput_req_s"] == "goodput/s" and "tok/s" not in with_slo.values()
    at_once = small_fleet()  # request_rate inf: no offered rate, throughput instead
    assert "req/s" in sweep.default_columns(pdsim.load(at_once), "bench").values()
    drop = sweep.default_columns(pdsim.load("scenarios/drop_timeout.yaml"), "ci_bench")
    assert list(drop.values())[:2] == ["ret!=0", "pairs"]
    healthy = sweep.default_columns(pdsim.load("scenarios/healthy.yaml"), "bench")
    assert "mean_tpot_ms" in healthy  # its reported figures' metrics follow


def test_keeps_up_aggregates_as_the_seeds_that_kept_up():
    df = pd.DataFrame({"x": [1, 1, 1, 2, 2],
                       "bench.steady.keeps_up": [True, False, True, None, None],
                       "m": [1.0, 2.0, 4.0, 5.0, 7.0]})
    t = sweep.table(df, ["x"], {"bench.steady.keeps_up": "keeps up", "m": "m"})
    assert t["keeps up"].tolist() == ["2/3", "n/a"]
    assert t["m"].tolist() == [2.0, 6.0]


def test_the_cli_prints_a_capacity_sweeps_columns(tmp_path, capsys):
    import json

    (tmp_path / "s.yaml").write_text(json.dumps(_capacity()))
    assert main(["sweep", str(tmp_path / "s.yaml"), "--vary", "clients.0.request_rate=10,80",
                 "--seeds", "1", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "a capacity sweep" in out and "ret!=0" not in out
    table = out.split("\n\n")[0]
    assert "TTFT p99" in table and "keeps up" in table
    assert "1/1" in table.splitlines()[-2]  # 10 req/s: kept up


def test_metrics_names_columns_and_a_wrong_name_is_one_line_before_the_runs(
        tmp_path, capsys, monkeypatch):
    import json

    (tmp_path / "s.yaml").write_text(json.dumps(_capacity()))
    argv = ["sweep", str(tmp_path / "s.yaml"), "--vary", "clients.0.request_rate=10,20",
            "--seeds", "1", "--workers", "1"]
    assert main([*argv, "--metrics", "bench.p95_ttft_ms,bench.steady.keeps_up"]) == 0
    out = capsys.readouterr().out
    assert "bench.p95_ttft_ms" in out and "bench.steady.keeps_up" in out and "TTFT" not in out

    def no_runs(*a, **kw):
        raise AssertionError("ran")

    monkeypatch.setattr(sweep, "sweep", no_runs)
    assert main([*argv, "--metrics", "bench.p99_ttf"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "did you mean bench.p99_ttft_ms" in err and "p99_itl_ms" in err
    assert main([*argv, "--metrics", "failed,,empty_share"]) == 2
    assert "an empty name" in capsys.readouterr().err

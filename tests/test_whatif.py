"""pdsim whatif: the policy x fault x seed matrix, its measurements, table, ranking and CLI."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import yaml
from conftest import small_fleet

from pdsim.cli import main
from pdsim.whatif import blacklist_harm, expand_policies, recover_s, whatif

ERRS = [{"kind": "transfer_errors", "probability": 0.3, "from_s": 3.0, "to_s": 3.5}]
FLAPS = [{"kind": "nic_flaps", "prefill_server": 0, "at_s": 3.0, "flaps": 2, "every_s": 2.0,
          "down_s": 1.0}]


def _base() -> dict:
    d = small_fleet()
    d["fleet"]["decode"]["servers"] = 2
    d["horizon_s"] = 60
    c = d["clients"][0]
    c.update(num_prompts=120, max_concurrency=None, request_rate=10.0)
    c["dataset"] = {"kind": "random", "input_len": 1024, "output_len": 32}
    return d


POLICIES = ["permanent", {"policy": "ttl", "ttl_s": [2.0, 20.0]}]
FAULTS = {"errs": ERRS, "flaps": FLAPS}


@pytest.fixture(scope="module")
def matrix():
    return whatif(_base(), POLICIES, FAULTS, seeds=[1, 2], workers=1, progress=False)


def test_table_has_one_row_per_policy_and_fault(matrix):
    t = matrix.table
    assert len(t) == 3 * 2
    assert not t.duplicated(["policy", "fault"]).any()
    assert set(t.policy) == {"permanent", "ttl(ttl_s=2)", "ttl(ttl_s=20)"}
    assert set(t.fault) == {"errs", "flaps"} and (t.seeds == 2).all()
    assert len(matrix.runs) == 12 and len(matrix.healthy) == 2
    for m in ("goodput_tok_s", "failed", "recover_s", "max_healthy_blacklisted_s"):
        assert {m, f"{m}_lo", f"{m}_hi"} <= set(t.columns)


def test_matrix_is_deterministic_per_seed_in_process_or_pool(matrix):
    again = whatif(_base(), POLICIES, FAULTS, seeds=[1, 2], workers=2, progress=False)
    pd.testing.assert_frame_equal(matrix.table, again.table)
    pd.testing.assert_frame_equal(matrix.runs, again.runs)
    one = whatif(_base(), POLICIES, {"errs": ERRS}, seeds=[2], workers=1, progress=False)
    mine = matrix.runs[(matrix.runs.seed == 2) & (matrix.runs.fault == "errs")]
    pd.testing.assert_frame_equal(one.runs.reset_index(drop=True), mine.reset_index(drop=True))


def test_measurements_tell_the_policies_apart(matrix):
    r = matrix.runs.set_index(["fault", "policy", "seed"]).sort_index()
    for seed in (1, 2):
        perm = r.loc[("errs", "permanent", seed)]
        short = r.loc[("errs", "ttl(ttl_s=2)", seed)]
        assert perm.fast_fails > short.fast_fails > 0
        assert perm.failed > short.failed
        # the errors leave every pair healthy: a TTL entry stays exactly ttl_s; a permanent one
        # until the run ends
        assert short.max_healthy_blacklisted_s == pytest.approx(2.0)
        assert perm.max_healthy_blacklisted_s >= perm.simulated_s - 4.0  # added by 4 s
        assert perm.goodput_lost_pct > 0
    t = matrix.table
    best = t.groupby("fault").goodput_tok_s.transform("max")
    assert (t[t.goodput_tok_s == best].regret_pct == 0).all()
    assert (t[t.goodput_tok_s == best]["rank"] == 1).all()
    rk = matrix.ranking
    assert list(rk.overall_rank) == [1, 2, 3]
    assert rk.worst_regret_pct.is_monotonic_increasing
    assert rk.set_index("policy").worst_regret_pct["permanent"] == rk.worst_regret_pct.max()
    assert rk.policy.iloc[0] == "ttl(ttl_s=2)"


def test_a_written_matrix_reads_back_with_its_table_and_timelines(matrix, tmp_path):
    from pdsim.whatif import WhatIf

    matrix.write(tmp_path, ["csv"])
    back = WhatIf.read(tmp_path)
    pd.testing.assert_frame_equal(back.table, matrix.table, rtol=1e-5)
    pd.testing.assert_frame_equal(back.ranking, matrix.ranking, rtol=1e-5)
    assert back.policies == matrix.policies and back.faults == matrix.faults
    for a, b in zip(back.runs.series, matrix.runs.series, strict=True):
        assert a == pytest.approx(b, rel=1e-5) and len(a) > 10
    assert [len(s) for s in back.healthy.series] == [len(s) for s in matrix.healthy.series]


def test_recovery_counts_from_the_fault_end_against_healthy():
    healthy = [100.0] * 100
    faulty = [100.0] * 20 + [0.0] * 30 + [50.0] * 10 + [95.0] * 40
    # the fault ends at 30; 10 s windows reach 90% of healthy once they start at 59
    assert recover_s(faulty, healthy, end=30.0) == 29.0
    assert recover_s(healthy, healthy, end=30.0) == 0.0
    assert recover_s([0.0] * 100, healthy, end=30.0) == math.inf
    assert math.isnan(recover_s(faulty, healthy, end=math.inf))


def test_healthy_blacklisted_time_leaves_out_the_pairs_down_time():
    ev = pd.DataFrame([
        (10.0, "path", "prefill-0", "", 2.0),
        (12.0, "path", "prefill-0", "", 0.0),
        (11.0, "blacklist_add", "prefill-0.r0", "d:1", 1.0),
        (20.0, "path", "", "d:2", 1.0),
        (21.0, "blacklist_add", "prefill-1.r0", "d:2", 1.0),
        (30.0, "blacklist_remove", "prefill-0.r0", "d:1", 0.0),
        (40.0, "blacklist_add", "prefill-1.r1", "d:3", 1.0),
    ], columns=["time", "event", "component", "peer", "value"]).sort_values("time")
    longest, total = blacklist_harm(ev, t_end=50.0)
    # d:1 from prefill-0: blacklisted 11-30, its path down until 12 -> healthy 18 s;
    # d:2 is gone from 20 on -> never healthy; d:3 healthy from 40 to the end -> 10 s
    assert longest == pytest.approx(18.0) and total == pytest.approx(28.0)


def test_policy_grids_expand_and_validate():
    pols = expand_policies(["never", {"policy": "circuit_breaker", "failures": [2, 3],
                                      "cooldown_s": [1.0, 10.0]}])
    assert [lbl for lbl, _ in pols] == [
        "never", "circuit_breaker(failures=2, cooldown_s=1)",
        "circuit_breaker(failures=2, cooldown_s=10)",
        "circuit_breaker(failures=3, cooldown_s=1)",
        "circuit_breaker(failures=3, cooldown_s=10)"]
    with pytest.raises(Exception, match="ttl_s"):
        expand_policies([{"policy": "ttl", "ttl_s": [-1.0]}])


def test_whatif_cli_writes_tables_plots_and_explains_columns(tmp_path, capsys):
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump(_base()))
    faults = tmp_path / "faults.yaml"
    faults.write_text(yaml.safe_dump({"errs": ERRS}))
    out = tmp_path / "out"
    code = main(["whatif", str(base), "--policy", "never", "--policy", "ttl:ttl_s=1,5",
                 "--faults-file", str(faults), "--seeds", "1", "--workers", "1",
                 "--out", str(out), "--format", "csv,json,parquet", "--plots"])
    assert code == 0
    text = capsys.readouterr().out
    assert "ranking by worst-case regret" in text and "goodput_lost_pct" in text
    assert "ttl(ttl_s=5)" in text
    for name in ("table", "ranking", "runs", "healthy", "timelines"):
        for fmt in ("csv", "json", "parquet"):
            assert (out / f"{name}.{fmt}").is_file()
    assert {"heatmap.png", "timeline_errs.png", "vs_ttl_s.png"} <= {
        p.name for p in out.iterdir()}
    cols = json.loads((out / "columns.json").read_text())
    assert set(cols["columns"]) >= {"goodput_tok_s", "recover_s", "regret_pct"}
    assert len(pd.read_csv(out / "table.csv")) == 3
    assert main(["whatif", str(base), "--policy", "ttl:ttl_s=-1", "--faults-file",
                 str(faults)]) == 2
    assert main(["whatif", str(base), "--faults", "meteor"]) == 2
    err = capsys.readouterr().err
    assert "ttl_s" in err and "unknown fault 'meteor'" in err and "Traceback" not in err

"""pdsim whatif: the policy x fault x seed matrix, its measurements, table, ranking and CLI."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import yaml
from conftest import small_fleet

from pdsim.analysis import whatif as whatif_mod
from pdsim.analysis.whatif import blacklist_harm, expand_faults, expand_policies, recover_s
from pdsim.analysis.windows import Timeline
from pdsim.cli.main import main

TL = Timeline(steady_s=1.0, recovery_s=5.0, lasting_s=10.0, drain_s=5.0)  # a small base's


def whatif(*args, **kw):
    """pdsim.whatif on the small bases here: windows to their scale."""
    kw.setdefault("timeline", TL)
    return whatif_mod.whatif(*args, **kw)

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
    # a healthy run per seed, seen through each fault's windows
    assert len(matrix.runs) == 12 and len(matrix.healthy) == 2 * 2
    for m in ("goodput_tok_s", "failed", "recover_s", "max_healthy_blacklisted_s",
              "span_attainment", "lasting_goodput_tok_s"):
        assert {m, f"{m}_lo", f"{m}_hi"} <= set(t.columns)


def test_matrix_is_deterministic_per_seed_in_process_or_pool(matrix):
    again = whatif(_base(), POLICIES, FAULTS, seeds=[1, 2], workers=2, progress=False)
    pd.testing.assert_frame_equal(matrix.table, again.table)
    pd.testing.assert_frame_equal(matrix.runs, again.runs)
    # a seed's runs do not depend on the other seeds run (the faults set the windows, and
    # with them every run's length: the same faults, the same runs)
    one = whatif(_base(), POLICIES, FAULTS, seeds=[2], workers=1, progress=False)
    mine = matrix.runs[matrix.runs.seed == 2]
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
        assert perm.lasting_lost_pct > short.lasting_lost_pct  # the harm outlasts the errors
    t = matrix.table
    best = t.groupby("fault").goodput_tok_s.transform("max")
    assert (t[t.goodput_tok_s == best].regret_pct == 0).all()
    assert (t[t.goodput_tok_s == best]["rank"] == 1).all()
    rk = matrix.ranking
    assert list(rk["rank"]) == [1, 2, 2]  # TTL 20 s never expires here: permanent's twin
    assert rk.worst_regret_pct.is_monotonic_increasing
    assert rk.set_index("policy").worst_regret_pct["permanent"] == rk.worst_regret_pct.max()
    assert rk.policy.iloc[0] == "ttl(ttl_s=2)"


def test_a_written_matrix_reads_back_with_its_table_and_timelines(matrix, tmp_path):
    from pdsim.analysis.whatif_table import WhatIf

    matrix.write(tmp_path, ["csv"])
    back = WhatIf.read(tmp_path)
    pd.testing.assert_frame_equal(back.table, matrix.table, rtol=1e-5)
    pd.testing.assert_frame_equal(back.ranking, matrix.ranking, rtol=1e-5)
    assert back.policies == matrix.policies and back.faults == matrix.faults
    for a, b in zip(back.runs.series, matrix.runs.series, strict=True):
        assert a == pytest.approx(b, rel=1e-5) and len(a) > 10
    assert [len(s) for s in back.healthy.series] == [len(s) for s in matrix.healthy.series]
    assert back.plan == matrix.plan


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
    # every row names its parameters: those given, then the policy's own at their defaults
    assert [lbl for lbl, _ in pols] == [
        "never", "circuit_breaker(failures=2, cooldown_s=1, window_s=10)",
        "circuit_breaker(failures=2, cooldown_s=10, window_s=10)",
        "circuit_breaker(failures=3, cooldown_s=1, window_s=10)",
        "circuit_breaker(failures=3, cooldown_s=10, window_s=10)"]
    assert [lbl for lbl, _ in expand_policies(["ttl", "permanent", "v0_5_23"])] == [
        "ttl(ttl_s=30)", "permanent", "v0_5_23(probe_interval_s=30, probe_max_interval_s=300)"]
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
                 "--loads", "base", "--steady-s", "1", "--recovery-s", "5", "--lasting-s",
                 "10", "--drain-s", "5",
                 "--out", str(out), "--format", "csv,json,parquet", "--plots"])
    assert code == 0
    text = capsys.readouterr().out
    assert "ranking by worst-case goodput regret" in text and "ties: best or tied-best" in text
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


def test_ttft_p99_column_is_the_p99_of_completed_requests():
    import numpy as np

    import pdsim
    from pdsim.analysis.whatif import measure

    d = _base()
    d["faults"] = ERRS
    res = pdsim.run(d)
    req = res.requests
    done = req[(req.kind != "warmup") & (req.status == "completed")]
    assert 0 < len(done) < len(req[req.kind != "warmup"])  # some failed: they are left out
    want = np.percentile((done.t_first_token - done.t_arrival).to_numpy(float), 99)
    assert measure(res)["ttft_p99_s"] == pytest.approx(want, abs=1e-6)


def test_decode_nic_down_takes_work_it_cannot_receive_and_each_write_waits_the_timeout():
    """The preset's claim: the silent rank keeps being sent work, and every write to it that
    starts during the outage holds its transfer queue until the 30 s deadline or the path's
    return, then fails; writes after the return succeed."""
    import pdsim

    d = _base()
    d["fleet"]["decode"]["servers"] = 1
    d["horizon_s"] = 300
    d["blacklist"] = {"policy": "never"}
    d["faults"] = [{"preset": "decode_nic_down", "at_s": 2.0, "duration_s": 60.0}]
    res = pdsim.run(d, record_steps=True)
    req = res.requests.set_index("rid")
    timeout = res.scenario.transfer.transfer_timeout_s
    call = res.scenario.transfer.call_latency_ms / 1e3  # the write's fixed cost comes first
    to_silent = [w for w in res.recorder.writes if req.d_rank[w[4]] == 0]
    during = [w for w in to_silent if 2.0 <= w[2] < 62.0]
    assert len(during) >= 2  # its scheduler still pre-allocates: the router keeps sending
    for _nic, _q, t0, t1, _rid, _room, nbytes, _last, outcome in during:
        assert outcome == "decode_unreachable"
        assert t1 == pytest.approx(min(t0 + call + timeout + nbytes * 1e-9, 62.0), abs=1e-6)
    assert any(t1 - t0 > 20 for _n, _q, t0, t1, *_ in during)  # at least one waited it out
    after = [w for w in to_silent if w[2] >= 62.0]
    assert after and all(w[8] == "ok" for w in after)
    others = res.requests[(res.requests.d_rank == 1) & (res.requests.t_arrival > 2.5)]
    assert (others.status == "completed").all()


@pytest.mark.parametrize("args, says", [
    (["--seeds", "1000000000"], "--seeds 1000000000: give 1..10,000"),
    (["--policy", "ttl:ttl_s=" + ",".join(map(str, range(1, 400))) + ":strikes="
      + ",".join(map(str, range(1, 400)))], "runs; at most 100,000"),
    (["--workers", "0"], "--workers 0: give at least 1"),
    (["--policy", "ttl:ttl_s=-1"], "policy ttl(ttl_s=-1): invalid value at 'blacklist.ttl_s'"),
    # (the last value won silently; an empty one said "a valid number (got None)")
    (["--policy", "ttl:ttl_s=1:ttl_s=2"], "--policy ttl:ttl_s: given twice; give its values "
     "once, KEY=V1,V2,..."),
    (["--policy", "ttl:policy=never"], "--policy ttl:policy: the policy is NAME, before the "
     "first colon"),
    (["--policy", "ttl:ttl_s=1,,2"], "--policy ttl:ttl_s: an empty value in '1,,2'; give "
     "V1,V2,... with a value between each pair of commas"),
    (["--policy", "ttl:ttl_s=1, "], "--policy ttl:ttl_s: an empty value in '1, '"),
    # (a fault given twice ran twice; a format wrote its tables twice; an empty one was dropped)
    (["--faults", "flush_race, flush_race"], "--faults: 'flush_race' given twice in "
     "'flush_race, flush_race'; give each once"),
    (["--faults", "flush_race,,decode_hang"], "--faults: an empty name in"),
    (["--out", "{tmp}/o", "--format", "csv,csv"], "--format: 'csv' given twice in 'csv,csv'"),
    (["--out", "{tmp}/o", "--format", ","], "--format: an empty name in ','"),
    (["--plots", "--out", "{tmp}/o", "--timeline", "nope"], "--timeline 'nope': not a fault"),
    (["--plots", "--out", "{tmp}/o", "--param", "nope"], "--param 'nope': not a parameter"),
    (["--plots"], "add --out"),
    (["--format", "parquet"], "--format picks the table formats of --out DIR; add --out"),
    (["--faults-file", "{tmp}/missing.yaml"], "--faults-file"),
    # (an --out that cannot be a directory was an internal error after the whole matrix)
    (["--out", "{tmp}/base.yaml"], "--out {tmp}/base.yaml: exists and is not a directory"),
    (["--out", "{tmp}/base.yaml/o"], "--out {tmp}/base.yaml/o: cannot create the directory"),
])
def test_whatif_cli_refuses_before_any_run(tmp_path, monkeypatch, capsys, args, says):
    from pdsim.analysis import whatif as whatif_mod

    def no_runs(*_a, **_k):
        raise AssertionError("runs started before the command line was checked")

    monkeypatch.setattr(whatif_mod, "run_tasks", no_runs)
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump(_base()))
    tmp = str(tmp_path)
    argv = ["whatif", str(base), "--faults", "flush_race", *[a.format(tmp=tmp) for a in args]]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says.format(tmp=tmp) in err, err


def test_whatif_library_bounds_the_matrix_before_building_it():
    with pytest.raises(ValueError, match="at most 100,000"):
        whatif(_base(), ["never"], {"errs": ERRS}, seeds=range(1, 10**9), progress=False)
    with pytest.raises(ValueError, match="at most 100,000"):
        expand_policies([{"policy": "ttl", "ttl_s": list(range(1, 1000)),
                          "strikes": list(range(1, 1000))}])


def test_a_base_that_fails_transfers_without_faults_gives_each_policy_its_own_healthy_runs(
        matrix, tmp_path):
    """whatif measures goodput lost against the same seed without faults. A base whose
    operator flushes fail transfers (seeds 3 and 7 here) is one a policy changes without
    faults: each policy gets healthy runs of its own, and each run is measured against its
    policy's (with one shared run, never's loss came out negative: measured against
    permanent's fast-fail cascade). A base that fails nothing keeps one run per seed."""
    from pdsim.analysis.whatif_table import WhatIf

    assert "policy" not in matrix.healthy and (matrix.healthy.ret_failures == 0).all()
    d = _base()
    d["operator_flushes"] = [{"at_s": 4.0}, {"at_s": 6.0}]
    w = whatif(d, ["permanent", "never"], {"errs": [{**ERRS[0], "from_s": 8.0,
                                                      "to_s": 8.5}]},
               seeds=[3, 7], workers=1, progress=False)
    h = w.healthy.set_index(["policy", "seed"])
    assert sorted(set(h.index)) == [("never", 3), ("never", 7), ("permanent", 3),
                                    ("permanent", 7)]
    assert (h.ret_failures > 0).any()
    assert (h.loc["permanent"].fast_fails > 0).any() and (h.loc["never"].fast_fails == 0).all()
    for r in w.runs.itertuples():
        own = h[h.fault == r.fault].loc[(r.policy, r.seed)].goodput_tok_s
        assert r.goodput_lost_pct == pytest.approx(100 * (own - r.goodput_tok_s) / own)
    assert "each policy its own" in w.render()
    w.write(tmp_path, ["csv"])
    back = WhatIf.read(tmp_path)
    assert list(back.healthy.policy) == list(w.healthy.policy)
    assert [len(s) for s in back.healthy.series] == [len(s) for s in w.healthy.series]


def test_regret_with_per_policy_healthy_runs_does_not_move_with_the_other_policies():
    """A policy's regret under a fault is against its own healthy runs: adding a policy that
    does not win changes neither its goodput nor its regret (a pooled healthy median did)."""
    d = _base()
    d["operator_flushes"] = [{"at_s": 4.0}, {"at_s": 6.0}]
    errs = {"errs": [{**ERRS[0], "from_s": 8.0, "to_s": 8.5}]}
    two = whatif(d, ["permanent", "never"], errs, seeds=[3], workers=1, progress=False)
    three = whatif(d, ["permanent", "never", {"policy": "ttl", "ttl_s": [2.0]}], errs,
                   seeds=[3], workers=1, progress=False)
    assert "policy" in two.healthy and two.table.goodput_tok_s.max() == \
        three.table.goodput_tok_s.max()  # the same best policy in both
    for label in ("permanent", "never"):
        a = two.table.set_index("policy").loc[label]
        b = three.table.set_index("policy").loc[label]
        assert a.goodput_tok_s == b.goodput_tok_s and a.regret_pct == pytest.approx(b.regret_pct)
    own = two.healthy.drop_duplicates("policy").set_index("policy").goodput_tok_s
    p = two.table.set_index("policy").loc["permanent"]
    assert p.regret_pct == pytest.approx(100 * (two.table.goodput_tok_s.max()
                                                - p.goodput_tok_s) / own["permanent"])


def test_goodput_against_a_parameter_is_ticked_at_the_values_run(matrix):
    """ttl_s 2 and 20 on a log axis were labelled 10^1 and minor ticks such as 2x10^0 (5, 10,
    30 s read 6x10^0, 10^1, 2x10^1, 3x10^1): the ticks are now the values run, plainly."""
    import matplotlib.pyplot as plt

    ax = matrix.vs_param("ttl_s", policy="ttl")
    ax.figure.canvas.draw()
    major = [t.get_text() for t in ax.get_xticklabels() if t.get_visible() and t.get_text()]
    assert major == ["2", "20"]
    assert not [t.get_text() for t in ax.get_xticklabels(minor=True) if t.get_text()]
    plt.close(ax.figure)


def test_policies_with_the_same_regrets_share_a_rank_and_no_regret_names_no_worst_fault():
    """Identical results ranked 1, 2, 3 by table order (reports/blacklist_policy.md ranked
    `never` over `strikes_window` and `circuit_breaker` with every figure equal), and a policy
    best at every fault had a "worst fault" (the first one's name)."""
    from pdsim.analysis.whatif_table import METRICS, WhatIf

    def run(policy: str, fault: str, goodput: float) -> dict:
        return {**dict.fromkeys(METRICS, 0.0), "policy": policy, "fault": fault, "seed": 1,
                "goodput_tok_s": goodput}

    good = {"a": 100.0, "b": 100.0, "c": 90.0}
    runs = pd.DataFrame([run(p, f, g if f == "f2" else 100.0) for p, g in good.items()
                         for f in ("f1", "f2")])
    w = WhatIf(runs, pd.DataFrame({"seed": [1], "goodput_tok_s": [100.0]}),
               [(p, {"policy": p}) for p in good], {"f1": [], "f2": []})
    rk = w.ranking.set_index("policy")
    assert rk["rank"].to_dict() == {"a": 1, "b": 1, "c": 3}
    assert rk.worst_fault.to_dict() == {"a": "none", "b": "none", "c": "f2"}


@pytest.mark.parametrize("name, says", [
    ("healthy", "fault-set name 'healthy' is taken by the runs without faults"),
    ("../../evil", "fault-set name '../../evil': give printable text of at most 100"),
    ("a\tb", "fault-set name 'a\\tb': give printable text"),
    ("", "fault-set name '': give printable text"),
])
def test_fault_set_names_of_a_faults_file_are_checked(tmp_path, capsys, name, says):
    """A set named 'healthy' was taken for the runs without faults (the error: 'goodput_tok_s');
    one with a slash named --plots' timeline file (an internal FileNotFoundError)."""
    with pytest.raises(ValueError, match="fault-set name"):
        expand_faults({name: ERRS})
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump(_base()))
    faults = tmp_path / "faults.yaml"
    faults.write_text(yaml.safe_dump({name: ERRS}))
    assert main(["whatif", str(base), "--policy", "never", "--faults-file", str(faults),
                 "--seeds", "1", "--workers", "1", "--out", str(tmp_path / "o"),
                 "--plots"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err


def test_regret_is_paired_by_seed_and_a_difference_within_noise_is_a_tie():
    """Every policy meets the same seed's arrivals and faults, so regret compares them seed by
    seed (the best policy's goodput at that seed minus this one's), and the figure is its mean
    over seeds. ``a`` is best at two of three seeds by 10 points and worst at the third by 70:
    its mean regret (23.3) is above ``b``'s (6.7), but the paired difference (-10, -10, +70)
    is within its bootstrap interval of 0, so the two are printed tied (rank 1 both; an order
    by point estimate ranked them as if the seeds settled it). A consistent difference is not
    a tie: with ``b`` 10 points behind at every seed, ``a`` alone is best."""
    from pdsim.analysis.whatif_table import METRICS, WhatIf

    good = {"a": (50.0, 100.0, 30.0), "b": (40.0, 90.0, 100.0)}
    runs = pd.DataFrame([{**dict.fromkeys(METRICS, 0.0), "policy": p, "fault": "f", "seed": s,
                          "goodput_tok_s": g[s - 1]} for p, g in good.items() for s in (1, 2, 3)])
    healthy = pd.DataFrame({"seed": [1, 2, 3], "goodput_tok_s": [100.0, 100.0, 100.0]})
    w = WhatIf(runs, healthy, [(p, {"policy": p}) for p in good], {"f": []})
    t = w.table.set_index("policy")
    assert t.regret_pct.to_dict() == pytest.approx({"a": 70 / 3, "b": 20 / 3})
    assert t["rank"].to_dict() == {"a": 1, "b": 1}
    assert w.verdict("goodput", "f").best == ["b", "a"]
    apart = runs.assign(goodput_tok_s=[50.0, 100.0, 30.0, 40.0, 90.0, 20.0])
    t = WhatIf(apart, healthy, w.policies, {"f": []}).table.set_index("policy")
    assert t.regret_pct.to_dict() == pytest.approx({"a": 0.0, "b": 10.0})
    assert t["rank"].to_dict() == {"a": 1, "b": 2}
    own = pd.DataFrame({"policy": ["a"] * 3 + ["b"] * 3, "seed": [1, 2, 3] * 2,
                        "goodput_tok_s": [100.0] * 3 + [50.0] * 3})  # per policy healthy
    t = WhatIf(apart, own, w.policies, {"f": []}).table
    assert t.set_index("policy").regret_pct.to_dict() == pytest.approx({"a": 0.0, "b": 20.0})


def test_plots_default_to_the_fault_where_policies_differ():
    """`whatif --plots` drew the first fault's timelines, where every policy may be the same
    (a crash no policy changes): by default it now picks the fault with the largest regret."""
    from pdsim.analysis.whatif_table import METRICS, WhatIf

    good = {("a", "same"): 100.0, ("b", "same"): 100.0, ("a", "apart"): 100.0,
            ("b", "apart"): 60.0}
    runs = pd.DataFrame([{**dict.fromkeys(METRICS, 0.0), "policy": p, "fault": f, "seed": 1,
                          "goodput_tok_s": g} for (p, f), g in good.items()])
    w = WhatIf(runs, pd.DataFrame({"seed": [1], "goodput_tok_s": [100.0]}),
               [("a", {"policy": "a"}), ("b", {"policy": "b"})], {"same": [], "apart": []})
    assert w.telling_fault() == "apart"
    level = runs.assign(goodput_tok_s=100.0)
    assert WhatIf(level, w.healthy, w.policies, w.faults).telling_fault() == "same"


def test_a_seed_whose_healthy_run_completed_nothing_leaves_regret_to_the_others():
    """A healthy run with no goodput (nothing finished before a short horizon) made its
    seed's regret NaN, every median NaN, and the ranking raise after every run had finished
    ('Encountered all NA values'): the other seeds now give the regret, and a policy with no
    seed to measure ranks last with no worst fault."""
    from pdsim.analysis.whatif_table import METRICS, WhatIf

    good = {"a": (0.0, 100.0, 100.0), "b": (0.0, 80.0, 90.0)}
    runs = pd.DataFrame([{**dict.fromkeys(METRICS, 0.0), "policy": p, "fault": "f", "seed": s,
                          "goodput_tok_s": g[s - 1]} for p, g in good.items() for s in (1, 2, 3)])
    healthy = pd.DataFrame({"seed": [1, 2, 3], "goodput_tok_s": [0.0, 100.0, 100.0]})
    w = WhatIf(runs, healthy, [(p, {"policy": p}) for p in good], {"f": []})
    assert w.table.set_index("policy").regret_pct.to_dict() == {"a": 0.0, "b": 15.0}
    assert list(w.ranking.policy) == ["a", "b"]
    nothing = WhatIf(runs, healthy.assign(goodput_tok_s=0.0), w.policies, w.faults)
    assert nothing.table.regret_pct.isna().all()
    assert set(nothing.ranking.worst_fault) == {"n/a"}
    assert "n/a" in nothing.render()  # (the ranking's worst fault; it raised before)


def test_runs_last_until_every_faults_lasting_window_has_passed():
    """The library's faults start at 60 s and the closed-loop runs of 6,000 prompts ended before
    the crash restart (120 s) and the link's return (180 s), so no lasting harm was ever seen:
    the what-if now plans each run's length from the faults' own timing (their lasting-harm
    windows plus a drain) and keeps the open-loop load going to the end."""
    late = {"late_crash": [{"kind": "decode_crash", "decode_server": 0, "at_s": 30.0,
                            "restart_after_s": 20.0}], "errs": ERRS}
    wi = whatif(_base(), ["permanent"], late, seeds=[1], workers=1, progress=False)
    ws = wi.plan.windows["late_crash"]
    assert ws["during"] == (30.0, 50.0) and ws["recovery"] == (50.0, 55.0)
    assert ws["lasting"] == (55.0, 65.0) and wi.plan.t_end == 65.0
    r = wi.runs.set_index("fault").loc["late_crash"]
    assert r.simulated_s == pytest.approx(70.0)  # t_end + drain, not the base's 60 s
    assert r.load_until_s > 65.0  # the load outlasts the last window
    assert r.lasting_goodput_tok_s > 0 and "WARNING" not in wi.render()


def test_a_load_that_ends_before_the_span_is_flagged():
    """A closed-loop base with too few prompts stops loading the fleet before the span ends;
    its windows would measure an idle fleet: the table says so."""
    d = _base()
    d["clients"][0].update(request_rate="inf", max_concurrency=8, num_prompts=60)
    wi = whatif(d, ["permanent"], {"errs": ERRS}, seeds=[1], workers=1, progress=False)
    assert "WARNING: the load of 1 of 1 runs ended by" in wi.render()

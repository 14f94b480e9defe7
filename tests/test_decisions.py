"""Decision-grade what-if (issue 25): figures over fixed windows, capacity, the tie rule, the
study's recommendation."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import small_fleet

from pdsim.analysis import capacity as cap_mod
from pdsim.analysis import study as study_mod
from pdsim.analysis import verdict as vd
from pdsim.analysis import windows as win
from pdsim.config.scenario import SLOConfig
from pdsim.engine.summary import COMPLETED

# --- windows --------------------------------------------------------------------------------


def test_windows_are_named_from_each_faults_own_timing():
    tl = win.Timeline(steady_s=10, recovery_s=30, lasting_s=60, drain_s=60)
    p = win.plan({"crash": (60.0, 120.0), "nic": (60.0, 180.0), "flush": (60.0, 60.0),
                  "errors": (0.0, math.inf)}, tl)
    assert p.t_end == 180 + 30 + 60 and p.horizon == p.t_end + 60
    crash = p.windows["crash"]
    assert crash == {"before": (10, 60), "during": (60, 120), "recovery": (120, 150),
                     "lasting": (150, 210), "span": (10, 270)}
    assert p.windows["flush"]["during"] is None  # an instant fault has no during window
    assert p.windows["flush"]["recovery"] == (60, 90)
    errors = p.windows["errors"]  # no end in the run: no recovery or lasting window
    assert errors["before"] is None and errors["during"] == (10, 270)
    assert errors["recovery"] is errors["lasting"] is None


def _cols(done: list[tuple[float, float, int]], failed: int = 0) -> dict:
    """Request columns (pdsim.engine.summary.columns) of completed requests (arrival, done,
    tokens) with a 0.1 s TTFT, and ``failed`` failures."""
    n = len(done) + failed
    a = np.array([d[0] for d in done] + [20.0] * failed)
    t_done = np.array([d[1] for d in done] + [21.0] * failed)
    return {"status": np.array([COMPLETED] * len(done) + [1] * failed),
            "t_arrival": a, "t_first_token": a + 0.1, "t_done": t_done,
            "generated": np.array([d[2] for d in done] + [0] * failed),
            "input_len": np.zeros(n), "prefill_tokens": np.zeros(n)}


def test_goodput_is_over_a_fixed_window_not_the_runs_length():
    """The finding: goodput was completed tokens / (last completion - first arrival), so a run
    that did more but lasted longer scored worse (never under decode_nic_down: more tokens,
    fewer failures, 31.5% 'lost'). Over a fixed window the one that delivered more scores
    more, whatever the last straggler did."""
    slo = SLOConfig()
    more = _cols([(t, t + 1.0, 100) for t in np.linspace(10, 98, 100)] + [(99.0, 300.0, 100)])
    less = _cols([(t, t + 1.0, 100) for t in np.linspace(10, 98, 90)], failed=10)
    ws = {"span": (10.0, 100.0)}
    got_more = win.measure(more, slo, ws)["span_goodput_tok_s"]
    got_less = win.measure(less, slo, ws)["span_goodput_tok_s"]
    assert got_more == pytest.approx(100 * 100 / 90, abs=0.01)
    assert got_less == pytest.approx(90 * 100 / 90, abs=0.01)
    assert got_more > got_less
    # the old figure, for the record: the straggler drags the longer run below the other
    old = {k: c["generated"].sum() / (c["t_done"].max() - c["t_arrival"].min())
           for k, c in (("more", more), ("less", less))}
    assert old["more"] < old["less"]


def test_attainment_counts_arrivals_and_errors_their_ends():
    slo = SLOConfig(ttft_ms=50)  # the 0.1 s TTFT misses it
    c = _cols([(12.0, 13.0, 10)], failed=1)
    got = win.measure(c, slo, {"span": (10.0, 30.0), "lasting": (25.0, 30.0)})
    assert got["span_attainment"] == 0.0 and got["span_errors"] == 1
    assert got["span_completed_tok_s"] == pytest.approx(0.5)
    assert math.isnan(got["before_goodput_tok_s"])  # no such window: not a zero
    assert got["lasting_errors"] == 0


# --- the tie rule -----------------------------------------------------------------------------


def test_ranks_count_the_policies_better_beyond_noise():
    """a < b < c in regret, a-b and b-c within noise, a-c not: a and b share rank 1 (nothing
    is better than either beyond noise); a and its twin (equal figures: a tie) are better than
    c beyond noise, so c is 3rd."""
    rng = np.random.default_rng(3)
    noise = rng.normal(0, 1.0, 12)
    R = np.stack([np.stack([0.0 + noise]), np.stack([0.6 + noise[::-1]]),
                  np.stack([1.2 + noise]), np.stack([0.0 + noise])])  # (P=4, F=1, S=12)
    v = vd.decide(R, ["a", "b", "c", "a_twin"], 0)
    t = v.table.set_index("policy")
    assert t["rank"].to_dict() == {"a": 1, "b": 1, "c": 3, "a_twin": 1}
    assert t.vs_best["a_twin"] == 0 and t.vs_best_lo["a_twin"] == t.vs_best_hi["a_twin"] == 0
    assert v.best[:2] == ["a", "a_twin"] and set(v.best) == {"a", "a_twin", "b"}
    assert t.lo["c"] < t.regret["c"] < t.hi["c"]


def test_worst_and_mean_mixes_and_the_bootstrap_keeps_the_pairing():
    # policy x fault x seed: b is 5 points worse than a at every seed of fault 1 only
    R = np.zeros((2, 2, 4))
    R[1, 1, :] = 5.0
    worst = vd.decide(R, ["a", "b"], "worst").table.set_index("policy")
    mean = vd.decide(R, ["a", "b"], "mean").table.set_index("policy")
    assert worst.regret.to_dict() == {"a": 0.0, "b": 5.0}
    assert mean.regret.to_dict() == {"a": 0.0, "b": 2.5}
    assert worst["rank"].to_dict() == {"a": 1, "b": 2}  # paired: no seed noise to hide behind


def test_mean_ci_covers_the_mean_and_is_a_point_for_equal_seeds():
    m, lo, hi = vd.mean_ci(np.array([1.0, 2.0, 3.0, 4.0]))
    assert m == 2.5 and lo < 2.5 < hi
    assert vd.mean_ci(np.array([3.0, 3.0])) == (3.0, 3.0, 3.0)
    assert vd.fmt_iv(2.5, 1.25, 3.75) == "2.5 [1.2, 3.8]" and vd.fmt_iv(3.0, 3.0, 3.0) == "3.0"


# --- capacity and the study ------------------------------------------------------------------


def _tiny() -> dict:
    d = small_fleet()
    d["horizon_s"] = 60
    d["slo"] = {"ttft_ms": 1500, "attainment": 0.9}
    d["clients"][0].update(request_rate=4.0, max_concurrency=None, num_prompts=100)
    d["clients"][0]["dataset"] = {"kind": "random", "input_len": 2048, "output_len": 32}
    return d


@pytest.fixture(scope="module")
def tiny_capacity(tmp_path_factory):
    import os

    os.environ["PDSIM_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
    cap = cap_mod.measure(_tiny(), (2.0, 20.0), 25.0, seeds=(1,), workers=1, progress=False)
    return cap


def test_capacity_is_bracketed_and_bisected_to_its_resolution(tiny_capacity):
    cap = tiny_capacity
    t = cap.table().set_index("rate")
    assert t.loc[cap.rate, "meets"] and not t.loc[cap.hi, "meets"]
    assert cap.hi / cap.rate <= 1 + cap.resolution
    assert not t[t.index > cap.hi].meets.any()  # every faster rate probed failed
    assert "bracketing search" in cap.describe() and not cap.cached


def test_capacity_is_cached_by_content(tiny_capacity):
    again = cap_mod.measure(_tiny(), (2.0, 20.0), 25.0, seeds=(1,), workers=1, progress=False)
    assert again.cached and again.rate == tiny_capacity.rate and again.key == tiny_capacity.key
    other = _tiny()
    other["slo"]["ttft_ms"] = 1400  # other content, another key: measured again
    key = cap_mod.cache_key(other, {"seeds": [1], "window": [2.0, 20.0], "horizon": 25.0,
                                    "resolution": cap_mod.RESOLUTION, "target": 0.9})
    assert key != tiny_capacity.key
    named = _tiny()
    named["name"] = "renamed"  # what is not simulated does not count
    same = cap_mod.cache_key(named, {"seeds": [1], "window": [2.0, 20.0], "horizon": 25.0,
                                     "resolution": cap_mod.RESOLUTION, "target": 0.9})
    assert same == tiny_capacity.key


def test_the_capacity_key_follows_the_content_of_the_files_read(tmp_path):
    """A profile edited in place (hbm_tbps) gives another key; the same content under another
    name and the scenario's own path do not (the scenario is in the key as loaded)."""
    import yaml

    settings = {"seeds": [1], "window": [2.0, 20.0], "horizon": 25.0,
                "resolution": cap_mod.RESOLUTION, "target": 0.9}

    def key(where: Path, profile: str, hbm: float) -> str:
        where.mkdir(exist_ok=True)
        (where / profile).write_text(f"gpus: {{mygpu: {{extends: H20, hbm_tbps: {hbm}}}}}\n")
        d = _tiny()
        d["fleet"]["gpu"] = "mygpu"
        d["profiles"] = [profile]
        (where / "s.yaml").write_text(yaml.safe_dump(d))
        return cap_mod.cache_key(str(where / "s.yaml"), settings)

    a = key(tmp_path / "a", "p.yaml", 4.0)
    assert key(tmp_path / "b", "q.yaml", 4.0) == a
    assert key(tmp_path / "a", "p.yaml", 2.0) != a


def test_capacity_needs_an_slo():
    d = _tiny()
    del d["slo"]
    with pytest.raises(ValueError, match="give the base an slo: block"):
        cap_mod.measure(d, (2.0, 20.0), 25.0, seeds=(1,), progress=False, use_cache=False)


def test_a_study_runs_each_load_from_capacity_and_ends_with_a_recommendation(
        tiny_capacity, tmp_path):
    faults = {"errs": [{"kind": "transfer_errors", "probability": 0.3, "from_s": 3.0,
                        "to_s": 3.5}]}
    s = study_mod.study(_tiny(), ["permanent", {"policy": "ttl", "ttl_s": [2.0]}], faults,
                        seeds=[1, 2], loads=[0.5, "closed"], capacity=tiny_capacity,
                        timeline=win.Timeline(1, 5, 10, 5), workers=1, progress=False)
    assert list(s.conditions) == ["0.5x", "closed"]
    half = float(f"{tiny_capacity.rate / 2:.3g}")
    assert f"{half:g} req/s = 0.5 x capacity" in s.loads["0.5x"]
    assert (s.conditions["0.5x"].runs.load_until_s > s.conditions["0.5x"].plan.t_end).all()
    closed = s.conditions["closed"]
    assert (closed.runs.load_until_s > closed.plan.t_end).all()  # busy to the end
    r = s.recommendation
    assert set(r.metric) == {"goodput", "attainment", "throughput", "lasting"}
    assert {"worst", "mean"} == set(r["mix"])
    text = s.render(tables=False)
    assert "Recommendation: best or tied-best policy per condition" in text
    always, missing = s.dominant()
    if always:
        assert f"=> {', '.join(always)}: best or tied-best under every" in text
    else:
        assert "no single policy is best or tied-best under every condition" in text
    assert set(always) | set(missing) == {"permanent", "ttl(ttl_s=2)"}
    s.write(tmp_path)
    back = study_mod.Study.read(tmp_path)
    pd.testing.assert_frame_equal(back.recommendation.drop(columns="detail"),
                                  s.recommendation.drop(columns="detail"))


def test_no_single_policy_is_said_when_the_best_differs_by_condition():
    from pdsim.analysis.whatif_table import METRICS, WhatIf

    def cond(best: str) -> WhatIf:
        rows = [{**dict.fromkeys(METRICS, 0.0), "policy": p, "fault": "f", "seed": s,
                 "goodput_tok_s": 100.0 if p == best else 50.0, "span_attainment": 0.9,
                 "lasting_goodput_tok_s": 10.0} for p in ("a", "b") for s in (1, 2)]
        h = pd.DataFrame({"seed": [1, 2], "goodput_tok_s": 100.0, "span_attainment": 0.9,
                          "lasting_goodput_tok_s": 10.0})
        return WhatIf(pd.DataFrame(rows), h, [("a", {}), ("b", {})], {"f": []})

    cap = cap_mod.Capacity(10.0, 11.0, 0.9, [1], 0.05, (0, 1), 2, {}, [], "given")
    s = study_mod.Study(cap, {"0.3x": cond("a"), "closed": cond("b")},
                        {"0.3x": "x", "closed": "y"})
    assert s.dominant(["goodput"])[0] == []
    assert "no single policy is best or tied-best" in s.answer()
    one = study_mod.Study(cap, {"0.3x": cond("a"), "closed": cond("a")},
                          {"0.3x": "x", "closed": "y"})
    assert one.dominant()[0] == ["a"] and "=> a: best or tied-best under every" in one.answer()


def test_loads_are_fractions_or_closed():
    assert study_mod.parse_loads(["0.3", 0.9, "closed"]) == [0.3, 0.9, "closed"]
    for bad, says in ((["0"], "in \\(0, 2\\]"), (["x"], "fractions of capacity"),
                      (["0.3", "0.3"], "given twice"), ([], "at least one")):
        with pytest.raises(ValueError, match=says):
            study_mod.parse_loads(bad)


# --- the crash's declared unknown ------------------------------------------------------------


@pytest.mark.parametrize("session", ["new", "reused"])
def test_a_decode_restarted_on_its_old_port_stays_unwritable_and_blacklisted(session):
    """restart_session: reused: the restarted decode re-registers (clearing the entries the
    crash caused), but the prefill's cached descriptor makes its writes fail, so a one-strike
    blacklist holds it out to the end; with a new port nothing of it stays listed."""
    import pdsim

    d = small_fleet()
    d["fleet"]["decode"]["servers"] = 2
    d["horizon_s"] = 80
    d["blacklist"] = {"policy": "permanent"}
    d["clients"][0].update(request_rate=6.0, max_concurrency=None, num_prompts=400)
    d["clients"][0]["dataset"] = {"kind": "random", "input_len": 1024, "output_len": 32}
    d["faults"] = [{"preset": "decode_crash", "at_s": 10.0, "restart_after_s": 10.0,
                    "restart_session": session}]
    res = pdsim.run(d)
    ev = res.events
    after = ev[ev.time > 20.0]
    stale = after[(after.event == "transfer_failed")]
    req = res.requests
    late = req[(req.t_arrival > 25.0) & (req.d_server == 0)]
    if session == "new":
        assert res.summary["blacklisted_pairs_final"] == 0 or not len(stale)
        assert (late.status == "completed").all() and len(late)
    else:
        assert res.summary["blacklisted_pairs_final"] > 0
        assert len(late) and not (late.status == "completed").any()
        removed = ev[(ev.event == "blacklist_remove") & (ev.detail == "decode re-registered")]
        assert len(removed)  # the restart's registration cleared the crash's entries first


def test_across_unknowns_runs_each_declared_value_and_prints_its_verdict(tiny_capacity):
    """A fault-model choice declared as an unknown ({choice: [...], nominal: x}) runs at its
    nominal value in the fault mixes, and with --across-unknowns also at its other values, as
    fault sets of their own whose verdict is printed beside the nominal one's."""
    faults = {"errs": [{"kind": "transfer_errors", "from_s": 3.0, "to_s": 3.5,
                        "probability": {"choice": [0.3, 0.05], "nominal": 0.3,
                                        "why": "test"}}]}
    s = study_mod.study(_tiny(), ["permanent", {"policy": "ttl", "ttl_s": [2.0]}], faults,
                        seeds=[1], loads=[0.5], capacity=tiny_capacity, across_unknowns=True,
                        timeline=win.Timeline(1, 5, 10, 5), workers=1, progress=False)
    w = s.conditions["0.5x"]
    assert w.variants == {"errs[probability=0.05]": "errs"}
    assert w.nominal_faults == ["errs"]  # the mixes are over the nominal faults only
    runs = w.runs.set_index(["fault", "policy"])
    assert runs.loc[("errs", "permanent")].fast_fails > \
        runs.loc[("errs[probability=0.05]", "permanent")].fast_fails
    text = s.render(tables=False)
    assert "Across the faults' declared unknowns" in text
    assert "errs[probability=0.05]" in text and "(nominal errs:" in text

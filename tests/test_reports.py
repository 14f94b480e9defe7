"""reports/blacklist_policy.md cannot drift from the model or from pdsim whatif: a cell of its
matrix re-runs to the committed rows, the CLI's default is its matrix, and the report and the
what-if guide's answer paragraph are what the script writes from the committed CSVs."""

from __future__ import annotations

import importlib.util
import json
import sys

import pandas as pd
import pytest
from conftest import ROOT

from pdsim.analysis import study as study_mod
from pdsim.analysis import windows as win

DATA = ROOT / "reports" / "blacklist_policy"
HEAD = DATA / "headline"


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "reports" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_the_cli_default_is_the_reports_matrix():
    """`pdsim whatif scenarios/whatif_base.yaml` must print the report's answer: its defaults
    are the committed matrix's policies, faults, loads, seeds, windows and capacity search."""
    from pdsim.analysis.capacity import Capacity
    from pdsim.analysis.whatif import expand_policies
    from pdsim.cli.main import _parser

    args = _parser().parse_args(["whatif", "scenarios/whatif_base.yaml"])
    assert args.seeds == study_mod.DEFAULT_SEEDS and args.capacity is None
    assert args.loads.split(",") == [str(x) for x in study_mod.DEFAULT_LOADS]
    assert args.capacity_seeds == len(study_mod.CAPACITY_SEEDS) and args.faults == "library"
    assert (args.steady_s, args.recovery_s, args.lasting_s, args.drain_s) == tuple(
        win.Timeline().__dict__.values())
    meta = json.loads((HEAD / "study.json").read_text())
    assert meta["conditions"] == [study_mod.label(x) for x in study_mod.DEFAULT_LOADS]
    cap = Capacity.from_dict(meta["capacity"])
    assert cap.seeds == list(study_mod.CAPACITY_SEEDS) and cap.window[0] == win.Timeline().steady_s
    for cond in meta["conditions"]:
        cols = json.loads((HEAD / cond / "columns.json").read_text())
        assert list(cols["policies"]) == [lbl for lbl, _ in
                                          expand_policies(study_mod.DEFAULT_POLICIES)]
        assert list(cols["faults"]) == study_mod.DEFAULT_FAULTS
        assert cols["plan"]["timeline"] == win.Timeline().__dict__
        runs = pd.read_csv(HEAD / cond / "runs.csv")
        assert sorted(runs.seed.unique()) == list(range(1, study_mod.DEFAULT_SEEDS + 1))


def test_a_cell_of_the_report_reruns_to_the_committed_rows():
    """Two policies under one fault at the cheapest load, seed 1, and its healthy run: the
    committed runs.csv rows are what the model gives now (a model change that moves them
    must re-run the report's matrix)."""
    from pdsim.analysis.capacity import Capacity
    from pdsim.analysis.whatif import expand_faults, expand_policies, prepare, run_conditions

    cap = Capacity.from_dict(json.loads((HEAD / "study.json").read_text())["capacity"])
    cond = "0.3x"
    load = next(x for x in study_mod.DEFAULT_LOADS if study_mod.label(x) == cond)
    pols = [p for p in expand_policies(study_mod.DEFAULT_POLICIES)
            if p[0] in ("permanent", "ttl(ttl_s=3)")]
    fset = expand_faults(["flush_race"])
    over, _ = study_mod.condition_sets(load, cap.rate, cap.horizon)
    c = prepare(ROOT / "scenarios/whatif_base.yaml", pols, fset, [1], over, label=cond,
                t_end=cap.window[1])
    w = run_conditions([c], pols, workers=1, progress=False)[0]
    committed = pd.read_csv(HEAD / cond / "runs.csv").set_index(["policy", "fault", "seed"])
    cols = [k for k in ("goodput_tok_s", "span_attainment", "span_completed_tok_s",
                        "lasting_goodput_tok_s", "recovery_errors", "failed", "fast_fails",
                        "ttft_p99_s", "max_healthy_blacklisted_s") if k in committed]
    assert len(cols) == 9
    for r in w.runs.itertuples():
        want = committed.loc[(r.policy, r.fault, r.seed)]
        for k in cols:
            assert getattr(r, k) == pytest.approx(want[k], rel=1e-6, abs=1e-6, nan_ok=True), \
                (r.policy, k)
    h = pd.read_csv(HEAD / cond / "healthy.csv")
    h = h[(h.seed == 1) & (h.fault == "flush_race")].iloc[0]
    got = w.healthy[(w.healthy.seed == 1) & (w.healthy.fault == "flush_race")].iloc[0]
    assert got.goodput_tok_s == pytest.approx(h.goodput_tok_s, rel=1e-6)


def test_the_report_and_the_guide_are_the_tables():
    """The committed report and the what-if guide's answer paragraph are what
    reports/make_blacklist_policy.py writes from the committed CSVs (no hand-edited figure)."""
    mk = _module("make_blacklist_policy")
    s, u = mk.load_study()
    inc = pd.read_csv(DATA / "incident.csv")
    ev = pd.read_csv(DATA / "eval.csv")
    text, par = mk.render(s, u, inc, ev)
    assert (ROOT / "reports" / "blacklist_policy.md").read_text() == text
    guide = (ROOT / "docs" / "guides" / "blacklist-whatif.md").read_text()
    block = guide.split("<!-- begin:whatif -->\n", 1)[1].split("<!-- end:whatif -->", 1)[0]
    assert block == par + "\n"
    assert "pdsim whatif scenarios/whatif_base.yaml" in text.split("## The answer")[0]


def _flat(d: dict, pre: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{pre}{k}.") if isinstance(v, dict) else {f"{pre}{k}": v})
    return out


@pytest.mark.parametrize("story", ["story_bench_alone", "story_eval_running",
                                   "story_outside_flush", "story_two_benches"])
def test_a_point_of_each_story_reruns_to_the_committed_explore_rows(story):
    """reports/drop_timeout.md's story tables are computed from reports/explore_runs/*.csv: the
    first sample point of each story, seed 1, run at its committed unknowns' values, gives the
    committed figures (a model change that moves them must re-explore the stories:
    python reports/make_drop_timeout.py --explore)."""
    import pdsim
    from pdsim.config import loader

    df = pd.read_csv(ROOT / "reports" / "explore_runs" / f"{story}.csv")
    paths = [u.path for u in loader.load(ROOT / "scenarios" / f"{story}.yaml").unknowns]
    figs = [c for c in df.columns if c not in ("sample", "seed", *paths)]
    assert len(paths) >= 3 and len(figs) >= 5
    row = df[(df["sample"] == 0) & (df.seed == 1)].iloc[0]
    sets = [f"{p}={float(row[p])!r}" if isinstance(row[p], float) else f"{p}={row[p]}"
            for p in paths] + ["seed=1"]
    got = _flat(pdsim.run(ROOT / "scenarios" / f"{story}.yaml", sets=sets).summary)
    for f in figs:
        assert float(got[f]) == pytest.approx(float(row[f]), rel=1e-4, abs=1e-6), f


def test_the_cli_prints_the_reports_answer():
    """What `pdsim whatif scenarios/whatif_base.yaml` prints at its end, rendered from the
    committed runs, gives the report's answer: the same policies best or tied-best in every row,
    and the same TTL if the blacklist stays (the report and the CLI read one Study)."""
    from pdsim.analysis.study import Study
    from pdsim.cli.whatif import _summary

    s = Study.read(HEAD)
    printed = _summary(s).splitlines()
    report = (ROOT / "reports" / "blacklist_policy.md").read_text()
    always, missing = s.dominant()
    keep, _, best2, counts = s.if_stays()
    assert best2 and len(keep) >= 4
    if always:
        assert f"=> {', '.join(always)}: best or tied-best under every condition" in printed[-2]
        assert (f"**{', '.join(f'`{p}`' for p in always)} are best or tied-best under every "
                f"load" in report)
    else:  # the same policies, each named with a row where it is not
        assert printed[-2].startswith("=> no single policy is best or tied-best under every "
                                      "condition: ")
        assert "**No single policy is best or tied-best under every load, metric and fault " \
               "mix run**" in report
        for p, where in missing.items():
            assert f"{p} is not at {where}" in printed[-2]
            assert f"`{p}` is not at {where}" in report
    assert printed[-1].startswith(f"=> if the blacklist stays (among {', '.join(keep)};")
    assert f"): {', '.join(best2)} best or tied-best in every row" in printed[-1]
    assert (f"**If the blacklist stays** (among {', '.join(f'`{p}`' for p in keep)}, regret "
            f"against the best of them): {', '.join(f'`{p}`' for p in best2)} best or "
            f"tied-best in every row" in report)


def test_a_check_names_what_moved_and_the_report_lists_every_chunk(tmp_path):
    """blacklist_policy_runs.py check compares a re-run chunk's model outputs with the
    committed ones; the report's provenance table has a row for every committed chunk."""
    import shutil

    runs_mod = _module("blacklist_policy_runs")
    old = HEAD / "0.3x"
    new = tmp_path / "0.3x"
    shutil.copytree(old, new)
    assert runs_mod.compare(new, old) == "identical"
    df = pd.read_csv(new / "runs.csv")
    df.loc[3, "failed"] += 1
    df.to_csv(new / "runs.csv", index=False, float_format="%.9g")
    assert runs_mod.compare(new, old) == "moved: runs.csv (failed)"
    one = tmp_path / "seed1"  # a check of seed 1 only compares the committed rows of seed 1
    one.mkdir()
    for name in runs_mod.MODEL_OUTPUTS:
        t = pd.read_csv(old / name)
        t[t.seed == 1].to_csv(one / name, index=False, float_format="%.9g")
    assert runs_mod.compare(one, old, [1]) == "identical"
    assert runs_mod.compare(one, old, [1, 2]).startswith("moved: runs.csv (shape")
    assert runs_mod.n_runs(old) == 4 * (1 + 8 * 8)  # seeds x (healthy + policies x faults)
    report = (ROOT / "reports" / "blacklist_policy.md").read_text()
    for matrix in ("headline", "unknowns"):
        for cond in json.loads((DATA / matrix / "study.json").read_text())["conditions"]:
            assert f"| `{matrix}/{cond}` |" in report

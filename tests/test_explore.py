"""pdsim explore: acceptance, accepted region and sensitivity on a case with a known answer;
determinism; resume after a kill; Ray gives the process pool's rows; the CLI."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import ROOT, small_fleet

import pdsim
from pdsim.analysis.explore import WALL, read_runs
from pdsim.cli.main import main


def tiny() -> dict:
    """Two unknowns: one sets the figure exactly (num_prompts -> requests), one cannot move it
    (stream), and a loguniform integer that moves other figures only."""
    d = small_fleet()
    d["name"] = "tiny"
    d["clients"][0].update({
        "num_prompts": {"uniform": [20, 60], "nominal": 40, "why": "test"},
        "stream": {"choice": [True, False], "nominal": True},
        "dataset": {"kind": "random", "input_len": 1024,
                    "output_len": {"loguniform": [8, 64], "nominal": 32}}})
    d["reference"] = [
        {"label": "requests", "metric": "requests", "reported": 40, "tolerance": 10},
        {"label": "failed", "metric": "failed", "reported": 0, "tolerance": 0.5},
        {"label": "context only", "reported": 1}]
    return d


def _rows(df: pd.DataFrame) -> pd.DataFrame:
    return df.drop(columns=WALL).sort_values(["sample", "seed"]).reset_index(drop=True)


def test_acceptance_region_and_sensitivity_recover_the_known_answer(tmp_path):
    ex = pdsim.explore(tiny(), samples=32, seeds=1, workers=1, out=tmp_path, progress=False)
    runs = ex.runs
    assert len(runs) == 32 and ex.ran == 32 and ex.resumed == 0
    n = runs["clients.0.num_prompts"]
    assert n.map(type).eq(int).all() and n.between(20, 60).all() and n.nunique() > 20
    assert set(runs["clients.0.stream"]) == {True, False}
    assert runs["clients.0.dataset.output_len"].between(8, 64).all()
    assert (runs.requests == n).all()  # the unknown's value reached the simulation
    acc = ex.acceptance.set_index("figure")
    assert list(acc.index) == ["F1", "F2", "all"]  # the context-only figure is not judged
    inside = n.between(30, 50)
    assert acc.loc["F1", "share_within"] == pytest.approx(inside.mean())
    assert acc.loc["F2", "share_within"] == 1.0
    assert acc.loc["all", "share_within"] == pytest.approx(inside.mean())
    # ABC region: exactly the values that reproduce the figure
    reg = ex.region.set_index("unknown").loc["clients.0.num_prompts"]
    assert reg.accepted_runs == inside.sum()
    assert reg["min"] == n[inside].min() >= 30 and reg["max"] == n[inside].max() <= 50
    bins = ex.bins[ex.bins.unknown == "clients.0.num_prompts"]
    assert bins.runs.sum() == 32 and bins.iloc[0]["all"] == 0.0  # [20, 25): none accepted
    stream = ex.bins[ex.bins.unknown == "clients.0.stream"]
    assert list(stream.bin) == ["True", "False"]
    # sensitivity: requests depend on num_prompts alone
    s = ex.sensitivity.set_index(["figure", "unknown"])
    assert s.loc[("F1", "clients.0.num_prompts"), "S1"] > 0.8
    assert s.loc[("F1", "clients.0.num_prompts"), "spearman_rho"] > 0.99
    assert s.loc[("F1", "clients.0.stream"), "S1"] < 0.2
    assert abs(s.loc[("F1", "clients.0.stream"), "spearman_rho"]) < 0.3
    # each S1 carries its 95% half-width (SALib's S1_conf; a bootstrap for a choice): at 32
    # runs an unknown with no effect cannot be told from one with a little
    f1 = s.loc["F1"]  # (F2 never varies: no variance to share out, no S1)
    assert f1.S1_conf.notna().all() and (f1.S1_conf > 0).all()
    assert s.loc[("F1", "clients.0.stream"), "S1_conf"] > 0.02
    from pdsim.analysis.explore import render

    assert " ±" in render(ex) and "half-width" in render(ex)
    # the store on disk holds the same rows
    assert _rows(read_runs(tmp_path)).equals(_rows(runs))

    # determinism: the same exploration again gives the same rows (wall time aside);
    # more Sobol samples extend the same sequence, so the first 32 are reused, not rerun
    more = pdsim.explore(tiny(), samples=40, seeds=1, workers=2, out=tmp_path, progress=False)
    assert (more.resumed, more.ran) == (32, 8)
    assert _rows(more.runs).iloc[:32].equals(_rows(runs))
    other = pdsim.explore(tiny(), samples=4, seeds=1, design_seed=1, workers=1, progress=False)
    assert not other.runs["clients.0.num_prompts"].equals(n.iloc[:4])


def _cli(out: Path) -> list[str]:
    return [sys.executable, "-m", "pdsim.cli", "explore", str(out.parent / "tiny.yaml"),
            "--samples", "4", "--seeds", "2", "--workers", "1", "--out", str(out),
            "--no-figures"]


def test_killed_exploration_resumes_with_only_the_missing_runs(tmp_path):
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(tiny()))
    out = tmp_path / "ex"
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    proc = subprocess.Popen(_cli(out), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env, cwd=tmp_path)
    store = out / "runs.parquet"
    deadline = time.monotonic() + 60
    while len(list(store.glob("*.parquet"))) < 2 and time.monotonic() < deadline:
        assert proc.poll() is None, "finished before it could be interrupted"
        time.sleep(0.01)
    proc.terminate()
    proc.communicate(timeout=30)
    assert proc.returncode != 0
    stored = len(read_runs(out))
    assert 2 <= stored < 8

    rerun = subprocess.run(_cli(out), capture_output=True, text=True, env=env, cwd=tmp_path,
                           timeout=120)
    assert rerun.returncode == 0, rerun.stderr
    assert f"{stored} already stored, {8 - stored} run now" in rerun.stdout
    files = list(store.glob("*.parquet"))
    raw = pd.concat([pd.read_parquet(f) for f in files])
    assert len(raw) == 8 and not raw.duplicated(["sample", "seed"]).any()  # none repeated
    whole = pdsim.explore(tiny(), samples=4, seeds=2, workers=1, progress=False)
    assert _rows(read_runs(out)).equals(_rows(whole.runs))  # none lost or changed
    assert "Sensitivity" in rerun.stdout and "Accepted region" in rerun.stdout


def test_ray_backend_gives_the_process_pools_rows(tmp_path, monkeypatch):
    import os

    import ray

    # A local Ray instance. Ray's own processes import jsonschema, whose optional IRI checker
    # (rfc3987_syntax, when installed) builds a grammar at import: ~2.3 s of CPU per process.
    # On a busy 2-core machine that pushes Ray's dashboard agent past the 15 s its raylet waits
    # (hard-coded in Ray 2.60) and ray.init fails. Ray's processes get a path on which that
    # optional module is absent; jsonschema skips it, and nothing pdsim runs uses it.
    stub = tmp_path / "no_rfc3987_syntax" / "rfc3987_syntax"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ImportError('skipped in the Ray test: slow import')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(stub.parent), str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        on_ray = pdsim.explore(tiny(), samples=4, seeds=1, backend="ray", progress=False)
    finally:
        ray.shutdown()
    pool = pdsim.explore(tiny(), samples=4, seeds=1, workers=2, progress=False)
    assert len(on_ray.runs) == 4
    assert _rows(on_ray.runs).equals(_rows(pool.runs))
    swept = pdsim.sweep(tiny(), vary={"clients.0.num_prompts": [21]}, seeds=[1], workers=2,
                        progress=False)
    assert swept.requests.tolist() == [21]


def test_cli_tables_and_errors(tmp_path, capsys):
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(tiny()))
    code = main(["explore", str(tmp_path / "tiny.yaml"), "--samples", "4", "--seeds", "1",
                 "--workers", "1", "--out", str(tmp_path / "o")])
    out, err = capsys.readouterr()
    assert code == 0, err
    for text in ("Reproduces the reported figure", "all figures jointly", "Accepted region",
                 "per bin", "Sensitivity", "clients.0.num_prompts = 40"):
        assert text in out
    assert (tmp_path / "o" / "figures_vs_unknowns.png").is_file()
    assert (tmp_path / "o" / "accepted_pairs.png").is_file()
    assert (tmp_path / "o" / "acceptance.csv").is_file()
    # a scenario without unknowns, a bad design size: one line each
    (tmp_path / "plain.yaml").write_text(yaml.safe_dump(small_fleet()))
    assert main(["explore", str(tmp_path / "plain.yaml"), "--out", str(tmp_path / "h")]) == 2
    assert main(["explore", str(tmp_path / "tiny.yaml"), "--samples", "0"]) == 2
    err = capsys.readouterr().err
    assert "declares no unknowns" in err and "--samples 0: give 1..100,000" in err
    assert len(err.strip().splitlines()) == 2
    # sweep says which inputs stayed at nominal
    assert main(["sweep", str(tmp_path / "tiny.yaml"), "--vary", "clients.0.num_prompts=21",
                 "--seeds", "1", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "at nominal" in out and "clients.0.stream=True" in out
    assert "clients.0.num_prompts=" not in out.split("\n")[0]


def test_a_share_above_zero_never_prints_as_none():
    from pdsim.analysis.explore import _share

    assert _share(1 / 256) == "<0.01" and _share(0.0) == "0.00" and _share(0.005) == "0.01"
    assert _share(0.25) == "0.25" and _share(1.0) == "1.00"


def test_the_pair_plot_names_choices_and_spreads_each_axis_on_its_own():
    """Choices are named on both axes (flush.dooms was a 0-1 number on y) and an integer's
    spread is drawn apart per axis (one spread on both lined the points up on a diagonal)."""
    import matplotlib
    import numpy as np

    from pdsim.analysis import explore_plots
    from pdsim.analysis.explore import Exploration

    ex = Exploration.__new__(Exploration)
    u_choice = type("U", (), {"numeric": False, "choices": ["a_long_name", "b_long_name"],
                               "path": "flush.dooms", "integer": False})()
    u_int = type("U", (), {"numeric": True, "integer": True, "dist": "uniform", "low": 6,
                           "high": 8, "path": "model.layers"})()
    ex.unknowns = [u_choice, u_int]
    x = explore_plots._jitter(np.zeros(50), u_int, 1)
    y = explore_plots._jitter(np.zeros(50), u_int, 2)
    assert not np.allclose(x, y) and abs(np.corrcoef(x, y)[0, 1]) < 0.5
    fig, ax = matplotlib.pyplot.subplots()
    explore_plots._axis(ax, ex, 0, "y")
    explore_plots._axis(ax, ex, 1, "x")
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a_long_name", "b_long_name"]
    assert ax.get_xlim() == (5.5, 8.5)
    matplotlib.pyplot.close(fig)


def test_the_pair_plot_names_every_rows_unknown_on_its_y_axis(tmp_path):
    """Row 0's scatters plot the first unknown on y: with labels only in column 0 (its
    histogram) that row had none, and its 0-50 s axis read as nothing."""
    import matplotlib.pyplot as plt

    from pdsim.analysis import explore_plots

    ex = pdsim.explore(tiny(), samples=4, seeds=1, workers=1, out=tmp_path, progress=False)
    fig = explore_plots.accepted_pairs(ex)
    axes = fig.axes
    d = len(ex.unknowns)
    for i, u in enumerate(ex.unknowns):
        row = [axes[i * d + j].get_ylabel() for j in range(d) if j != i]
        assert u.path in row, (i, row)
    plt.close(fig)


def test_bin_labels_print_integers_as_integers_and_floats_in_plain_digits():
    """An integer unknown's bins name the whole values they hold (num_prompts read
    '[1e+03, 1.06e+03)'), a float's its interval without an exponent."""
    import numpy as np

    from pdsim.analysis.explore import _bins

    def unknown(low, high, integer, dist="uniform"):
        return type("U", (), {"numeric": True, "integer": integer, "dist": dist,
                              "low": low, "high": high})()

    bins = _bins(unknown(1000, 1500, True))
    assert [label for label, _ in bins][:2] == ["1,000–1,062", "1,063–1,124"]
    assert bins[-1][0] == "1,438–1,500"
    values = np.arange(1000, 1501)
    for label, test in bins:  # each label names exactly the values its bin holds
        first, last = (int(x.replace(",", "")) for x in label.split("–"))
        assert list(values[test(values)]) == list(range(first, last + 1))
    assert [label for label, _ in _bins(unknown(0, 50, False))][2:4] == [
        "[12.5, 18.75)", "[18.75, 25)"]
    assert [label for label, _ in _bins(unknown(1000, 1800, False))][0] == "[1000, 1100)"
    assert [label for label, _ in _bins(unknown(6, 8, True))] == ["6", "7", "8"]
    assert [label for label, _ in _bins(unknown(1000, 1004, True))][0] == "1,000"


def test_the_explore_figures_keep_their_legends_off_every_panel(tmp_path):
    """loc='best' put the legend of figures_vs_unknowns over the band of its first panel
    (and accepted_pairs' over its first histogram): each figure has one legend, outside the
    panels, and none of the suptitle's lines under it."""
    import matplotlib.pyplot as plt

    from pdsim.analysis import explore_plots

    ex = pdsim.explore(tiny(), samples=4, seeds=1, workers=1, out=tmp_path, progress=False)
    for make in (explore_plots.figures_vs_unknowns, explore_plots.accepted_pairs):
        fig = make(ex)
        fig.savefig(tmp_path / "f.png", dpi=50)  # lays the figure out
        assert all(ax.get_legend() is None for ax in fig.axes), make.__name__
        assert len(fig.legends) == 1, make.__name__
        box = fig.legends[0].get_window_extent()
        for other in [ax.get_window_extent() for ax in fig.axes] + [
                fig._suptitle.get_window_extent()]:
            assert not box.overlaps(other), make.__name__
        plt.close(fig)


def test_the_explore_printout_says_the_unknowns_are_sampled_not_run_at_their_nominal(tmp_path,
                                                                                       capsys):
    """explore listed 'Declared unknowns:' as 'path = nominal', which reads as the value it ran
    at; it samples the ranges, and the nominal is what pdsim run uses (audit finding)."""
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(tiny()))
    assert main(["explore", str(tmp_path / "tiny.yaml"), "--samples", "4", "--seeds", "1",
                 "--workers", "1", "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    head = [ln for ln in out.splitlines() if ln.startswith("Declared unknowns")]
    assert head == ["Declared unknowns (explore samples each range; '= x' is the nominal "
                    "pdsim run uses, not a value explored):"]


def test_a_small_exploration_says_why_its_sensitivity_cells_are_empty_and_rho_is_noise(
        tmp_path, capsys):
    """With 4 runs and one seed every numeric S1 and the seed noise printed '-' unexplained,
    next to Spearman rhos of 4 runs that read as findings (8 runs of drop_timeout gave
    model.experts rho 0.74, whose 256 runs give S1 0; audit finding)."""
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(tiny()))
    assert main(["explore", str(tmp_path / "tiny.yaml"), "--samples", "4", "--seeds", "1",
                 "--workers", "1", "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out.split("Sensitivity:", 1)[1]
    assert "S1 '-': RBD-FAST needs at least 32 runs (here 4)" in out
    assert "seed noise '-': needs --seeds 2 or more" in out
    assert "rho over 4 runs: too few runs to tell any rho from noise" in out
    from pdsim.analysis.explore import _sensitivity_notes

    ex = pdsim.explore(tiny(), samples=4, seeds=2, workers=1, out=tmp_path / "o2",
                       progress=False)
    ex.runs = pd.concat([ex.runs] * 3, ignore_index=True)  # 24 rows
    notes = _sensitivity_notes(ex)
    assert notes[0].startswith("S1 '-': RBD-FAST needs at least 32 runs (here 24)")
    assert not any(n.startswith("seed noise") for n in notes)  # two seeds per sample
    assert notes[-1] == ("rho over 24 runs: |rho| below about 2/sqrt(runs - 1) = 0.42 is "
                         "within noise")


def test_seed_noise_is_the_unbiased_share_left_between_seeds():
    """Two seeds per point: the within-point variance has one degree of freedom, and
    var(ddof=0) halves it (the seed noise read as half what it is). Pure noise, no effect of
    the point: the share left between seeds is ~1, not ~0.5."""
    from pdsim.analysis.explore_stats import seed_noise

    rng = np.random.default_rng(0)
    sample = np.repeat(np.arange(4000), 2)
    y = rng.normal(0.0, 1.0, len(sample))
    assert seed_noise(y, sample) == pytest.approx(1.0, abs=0.05)
    # half of the variance between points, half between seeds
    y2 = np.repeat(rng.normal(0, 1, 4000), 2) + rng.normal(0, 1, len(sample))
    assert seed_noise(y2, sample) == pytest.approx(0.5, abs=0.05)


def test_stories_are_compared_by_posterior_probability_with_matched_draws():
    """Stories sampled with different numbers of draws were ranked by their share of accepted
    runs. Model choice gives each story the same number of draws (a prefix of its Sobol
    design), an equal prior, and a posterior probability with a bootstrap interval over its
    sample points."""
    from pdsim.analysis.explore_stats import model_choice

    def runs(n_points: int, hits: set[int]) -> pd.DataFrame:
        return pd.DataFrame({"sample": np.repeat(np.arange(n_points), 2),
                             "accepted": [i in hits for i in np.repeat(np.arange(n_points),
                                                                       2)]})

    # a: 128 draws, its fits all early in the design; b: 32 draws, 2 fitting points
    got = model_choice({"a": runs(128, {1, 5, 9, 20}), "b": runs(32, {3, 30})}).set_index(
        "story")
    assert got.draws.to_dict() == {"a": 32, "b": 32}  # matched: the fewest any story has
    assert got.posterior.to_dict() == pytest.approx({"a": 4 / 6, "b": 2 / 6})
    assert got.posterior.sum() == pytest.approx(1.0)
    for r in got.itertuples():
        assert r.posterior_lo <= r.posterior <= r.posterior_hi
    assert got.posterior_lo["a"] < 0.5 < got.posterior_hi["a"]  # 6 points decide little
    # all draws, unmatched: b's share (2/32) looks twice a's (4/128)
    loose = model_choice({"a": runs(128, {1, 5, 9, 20}), "b": runs(32, {3, 30})}, draws=128)
    assert loose.set_index("story").posterior["b"] > 0.5
    none = model_choice({"a": runs(16, set()), "b": runs(16, set())})
    assert none.posterior.isna().all()  # no story accepts anything: no evidence either way


def test_explore_gives_the_caller_its_sigterm_handler_back(tmp_path):
    """`pdsim explore` turns SIGTERM into a clean stop while it runs; called from Python
    (cli.main), it leaves the calling process's own SIGTERM handler in place afterwards (it
    stayed installed before: a later SIGTERM raised KeyboardInterrupt in whatever the caller
    was doing)."""
    import signal

    from pdsim.cli.main import main

    def mine(signum, frame):  # noqa: ARG001
        pass

    before = signal.signal(signal.SIGTERM, mine)
    try:
        assert main(["explore", str(tmp_path / "missing.yaml")]) == 2
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, before)

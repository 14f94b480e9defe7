"""Plots draw from a Result; sweeps produce one row per run; the sweep CLI."""

from __future__ import annotations

import matplotlib
import pytest
from conftest import SCENARIOS, run_cached

import pdsim
from pdsim import plots
from pdsim.cli import main

matplotlib.use("Agg")


def test_postmortem_and_compare_figures(tmp_path):
    import matplotlib.pyplot as plt

    drop = run_cached("drop_timeout")
    fig = plots.postmortem(drop)
    assert len(fig.axes) >= 4
    fig.savefig(tmp_path / "pm.png")
    fig2 = plots.compare({"healthy": run_cached("healthy"), "drop": drop})
    assert len(fig2.axes[0].lines) >= 2
    plt.close("all")


def test_sweep_grid_rows_and_labels():
    df = pdsim.sweep(SCENARIOS / "healthy.yaml",
                     vary={"clients.0.num_prompts": [50, 80]}, seeds=[1, 2], workers=1,
                     progress=False)
    assert len(df) == 4
    assert sorted(df["clients.0.num_prompts"]) == [50, 50, 80, 80]
    assert (df.requests == df["clients.0.num_prompts"]).all()
    # same seed and values in-process and in a pool: identical rows
    pool = pdsim.sweep(SCENARIOS / "healthy.yaml", vary={"clients.0.num_prompts": [50]},
                       seeds=[1], workers=2, progress=False)
    cols = [c for c in df.columns if c != "sim_wall_s"]
    first = df[(df.seed == 1) & (df["clients.0.num_prompts"] == 50)][cols].reset_index(drop=True)
    assert first.equals(pool[cols].reset_index(drop=True))


def test_sweep_rejects_a_bad_key_before_running():
    with pytest.raises(pdsim.ScenarioError, match="blacklist.recoveryy"):
        pdsim.sweep(SCENARIOS / "healthy.yaml", vary={"blacklist.recoveryy": ["x"]},
                    progress=False)


def test_sweep_cli(capsys, tmp_path):
    out = tmp_path / "rows.csv"
    code = main(["sweep", "scenarios/healthy.yaml", "--vary", "clients.0.num_prompts=40,60",
                 "--seeds", "1", "--workers", "1", "--out", str(out)])
    assert code == 0
    text = capsys.readouterr().out
    assert "clients.0.num_prompts" in text and "gen tok/s" in text
    assert out.read_text().count("\n") == 3
    assert main(["sweep", "scenarios/healthy.yaml", "--vary", "nokey"]) == 2

"""Findings of the second user review (an SRE writing a postmortem, a capacity planner, a hostile
user, working from the docs): each test fails without its fix."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import ROOT

from pdsim.cli.main import main

# --- 1. one rule for every output: never an input, never another output ------------------------


def _scenario_dir(d: Path) -> Path:
    d.mkdir(exist_ok=True)
    shutil.copy(ROOT / "scenarios" / "healthy.yaml", d / "base.yaml")
    (d / "s.yaml").write_text("extends: base.yaml\nclients: [{kind: bench, num_prompts: 5, "
                              "dataset: {kind: random, input_len: 64, output_len: 8}}]\n")
    shutil.copy(ROOT / "tests" / "hf_configs" / "Llama-3.1-8B.json", d / "cfg.json")
    return d


@pytest.mark.parametrize("argv, says", [
    (["profiles", "import", "{d}/cfg.json", "--name", "v", "--out", "{d}/cfg.json"],
     "--out {d}/cfg.json: would replace {d}/cfg.json, an input file of this command"),
    (["run", "{d}/s.yaml", "--out", "{d}/rd", "--perfetto", "{d}/rd/requests.csv"],
     "--perfetto {d}/rd/requests.csv: would replace {d}/rd/requests.csv, a file --out writes"),
    (["run", "{d}/s.yaml", "--out", "{d}/rd", "--format", "parquet", "--plot",
      "{d}/rd/summary.json"],
     "--plot {d}/rd/summary.json: would replace {d}/rd/summary.json, a file --out writes"),
    (["run", "{d}/s.yaml", "--perfetto", "{d}/x.png", "--plot", "{d}/x.png"],
     "--plot {d}/x.png: is also --perfetto's output; give each its own file"),
    (["run", "{d}/s.yaml", "--plot", "{d}/base.yaml"],
     "--plot {d}/base.yaml: would replace {d}/base.yaml, an extends: parent of this command"),
    (["calibrate", "{d}/cfg.json", "--gpu", "H100", "--model", "llama-3.1-8b", "--out",
      "{d}/o.png", "--plot", "{d}/o.png"], "--plot {d}/o.png: is also --out's output"),
])
def test_every_output_option_follows_one_rule(tmp_path, capsys, argv, says):
    """``profiles import cfg.json --out cfg.json`` replaced the config with the profile and
    ``run --out rd --perfetto rd/requests.csv`` the request table with the trace (exit 0):
    one rule (pdsim.cli.common.check_outputs) now checks every output of every command against
    the command's inputs and its other outputs, in one line before anything is written."""
    d = _scenario_dir(tmp_path / "in")
    if argv[0] == "calibrate":  # (a table of its own: the check comes after it is read)
        (d / "cfg.json").write_text("phase,batch_size,input_len,step_ms\nprefill,1,1024,50\n")
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    assert main([a.format(d=d) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says.format(d=d) in err, err
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before  # nothing written


def test_compare_plot_never_replaces_a_file_of_a_run_directory_it_reads(tmp_path, capsys):
    import pdsim

    d = _scenario_dir(tmp_path / "in")
    pdsim.run(d / "s.yaml").write(d / "rd", "parquet")
    before = (d / "rd" / "events.parquet").read_bytes()
    assert main(["compare", str(d / "rd"), str(d / "s.yaml"), "--plot",
                 str(d / "rd" / "events.parquet")]) == 2
    err = capsys.readouterr().err
    assert f"would replace {d}/rd/events.parquet, a file of the run directory {d}/rd" in err
    assert (d / "rd" / "events.parquet").read_bytes() == before

"""Figures without Python: `pdsim run --plot`, `pdsim compare` (table, JSON, figure), run
directories read back."""

from __future__ import annotations

import json

import matplotlib.pyplot as plt
import pytest
from conftest import SCENARIOS, small_fleet

import pdsim
from pdsim.cli.main import main
from pdsim.output import compare, plots, plots_capacity, report
from pdsim.output.result import Result

CAPACITY = SCENARIOS / "capacity" / "llama70b_h100.yaml"
FEW = ["--set", "clients.0.num_prompts=200"]


@pytest.fixture(scope="module")
def capacity_run():
    return pdsim.run(CAPACITY, ["clients.0.num_prompts=600"])


# --- pdsim run --plot ------------------------------------------------------------------------


@pytest.mark.parametrize(("scenario", "drawn"), [
    ("scenarios/capacity/llama70b_h100.yaml", "capacity"),
    ("scenarios/forward_timeout.yaml", "postmortem"),  # a client's flush: an incident
])
def test_run_plot_draws_the_figure_that_fits_the_scenario(tmp_path, monkeypatch, capsys,
                                                          scenario, drawn):
    called = []
    for mod, name in ((plots, "postmortem"), (plots_capacity, "capacity")):
        real = getattr(mod, name)
        monkeypatch.setattr(mod, name, lambda res, *a, _r=real, _n=name, **k:
                            called.append(_n) or _r(res, *a, **k))
    out = tmp_path / "fig.png"
    sets = FEW if "capacity" in scenario else ["--set", "clients.0.num_prompts=100",
                                               "--set", "clients.1.num_prompts=100"]
    assert main(["run", scenario, *sets, "--plot", str(out)]) == 0
    assert called == [drawn]
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {out}" in capsys.readouterr().err


@pytest.mark.parametrize(("plot", "says"), [
    ("{scenario}", "would replace {scenario}, a scenario file of this command"),
    ("{dir}/fig.txt", ".txt is not an image format"),
    ("{dir}/nodir/fig.png", "does not exist"),
    ("{dir}/out/summary.json", "would replace {dir}/out/summary.json, a file --out writes"),
])
def test_run_plot_refuses_in_one_line_before_running(tmp_path, monkeypatch, capsys, plot,
                                                     says):
    import pdsim.output.result

    scenario = tmp_path / "s.yaml"
    scenario.write_text(json.dumps(small_fleet()))
    monkeypatch.setattr(pdsim.output.result, "run", lambda *a, **k: pytest.fail("ran"))
    target = plot.format(scenario=scenario, dir=tmp_path)
    assert main(["run", str(scenario), "--out", str(tmp_path / "out"), "--plot", target]) == 2
    err = capsys.readouterr().err
    assert says.format(scenario=scenario, dir=tmp_path) in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()  # (refused before the run directory was made)


def test_the_capacity_figure_states_its_finding_and_labels_every_axis(capacity_run):
    fig = plots_capacity.capacity(capacity_run)
    title = fig._suptitle.get_text()
    assert title.startswith("llama70b_h100: keeps up with") and "P99 TTFT" in title
    assert "meet the SLO" in title
    for ax in fig.axes:
        assert ax.get_xlabel() and ax.get_ylabel(), ax.get_title(loc="left")
    plt.close(fig)


# --- run directories and pdsim compare ---------------------------------------------------------


def test_a_run_directory_reads_back_as_the_run(tmp_path, capacity_run):
    capacity_run.write(tmp_path / "r")
    back = Result.read(tmp_path / "r")
    assert back.summary == capacity_run.summary
    assert report.render(back) == report.render(capacity_run)
    assert compare.render({"a": back}) == compare.render({"a": capacity_run})
    with pytest.raises(ValueError, match="not a run directory"):
        Result.read(tmp_path)


def test_gpus_used_counts_each_roles_servers_and_their_gpus():
    assert compare.gpus_used(pdsim.run(CAPACITY, ["clients.0.num_prompts=30"])) == 12
    healthy = pdsim.load(SCENARIOS / "healthy.yaml")  # dp 4 in tp 4 with DP attention: 4 + 4
    assert compare.gpus_used(Result(healthy, {})) == 8
    assert compare.gpus_used(Result(healthy, {"gpus": 24})) == 24  # a run that reports its own


def test_compare_prints_the_table_of_two_layouts_and_draws_the_figure(tmp_path, capsys):
    out = tmp_path / "cmp.png"
    assert main(["compare", str(CAPACITY), str(CAPACITY), *FEW, "--set-run",
                 "2:fleet.prefill.servers=3", "--names", "2P1D,3P1D", "--plot", str(out)]) == 0
    text = capsys.readouterr().out
    head = text.splitlines()[1].split()
    assert head == ["2P1D", "3P1D"]
    gpus = next(x for x in text.splitlines() if x.startswith("GPUs used")).split()[-2:]
    assert gpus == ["12", "16"]
    for label in ("Goodput per GPU (req/s)", "SLO attainment", "P90 TTFT (ms)", "P99 ITL (ms)",
                  "P95 E2E (ms)", "Keeps up (steady window)"):
        assert label in text, label
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_compare_reads_run_directories_without_running_them(tmp_path, capsys, monkeypatch):
    import pdsim.output.result

    for name, sets in (("a", []), ("b", ["fleet.decode.servers=2"])):
        pdsim.run(CAPACITY, ["clients.0.num_prompts=200", *sets]).write(tmp_path / name)
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert list(got) == ["a", "b"] and got["b"]["gpus_used"] == 16
    monkeypatch.setattr(pdsim.output.result, "run", lambda *a, **k: pytest.fail("ran"))
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--plot",
                 str(tmp_path / "a" / "report.txt")]) == 2
    assert "a file of the run directory" in capsys.readouterr().err


@pytest.mark.parametrize(("args", "says"), [
    (["scenarios/healthy.yaml"], "two or more runs"),
    (["scenarios/healthy.yaml", "scenarios/healthy.yaml", "--set-run", "3:seed=2"], "1..2"),
    (["scenarios/healthy.yaml", "scenarios/healthy.yaml", "--names", "a"], "2 distinct names"),
])
def test_compare_refuses_a_bad_command_line_in_one_line(capsys, args, says):
    assert main(["compare", *args]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1


def test_the_comparison_figure_says_which_serves_more_per_gpu(capacity_run):
    other = pdsim.run(CAPACITY, ["clients.0.num_prompts=600", "fleet.prefill.servers=1"])
    fig = plots_capacity.comparison({"2P1D": capacity_run, "1P1D": other})
    assert fig._suptitle.get_text().startswith("2P1D serves")
    assert all(ax.get_xlabel() or ax.get_xticklabels() for ax in fig.axes)
    plt.close(fig)

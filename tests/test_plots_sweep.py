"""Plots draw from a Result; sweeps produce one row per run; the sweep CLI."""

from __future__ import annotations

import matplotlib
import pytest
from conftest import SCENARIOS, run_cached

import pdsim
from pdsim.cli.common import UsageError
from pdsim.cli.main import main
from pdsim.output import plots

matplotlib.use("Agg")


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
    first = df[(df.seed == 1) & (df["clients.0.num_prompts"] == 50)].reset_index(drop=True)
    assert first.equals(pool.reset_index(drop=True))  # (no wall-time column: every byte)
    assert "sim_wall_s" not in df


def test_a_sweep_keeps_a_set_key_under_a_policy_its_grid_switches_to(tmp_path, capsys):
    """--set gives every run's overrides before the grid's, in one pass: a key the user set
    (strikes) reaches validation under a policy that has none, not dropped as the base's."""
    argv = ["sweep", "scenarios/drop_timeout.yaml", "--set", "blacklist.strikes=3",
            "--vary", "blacklist.policy=permanent,never", "--seeds", "1"]
    assert main(argv) == 2
    assert "blacklist.strikes" in capsys.readouterr().err


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
    assert "clients.0.num_prompts" in text and "TTFT p99" in text
    assert out.read_text().count("\n") == 3
    assert main(["sweep", "scenarios/healthy.yaml", "--vary", "nokey"]) == 2
    capsys.readouterr()
    for raw in ("1,,2", "1,", ",2", "1, ,2"):  # an empty value (YAML: null) is refused
        assert main(["sweep", "scenarios/healthy.yaml", "--vary", f"seed={raw}"]) == 2
        err = capsys.readouterr().err
        assert "--vary seed: an empty value" in err and err.count("\n") == 1


def test_postmortem_panels_say_what_the_docstring_promises(tmp_path):
    """Harmful vs harmless flushes, blacklisted pairs outlined, one outcome panel per client,
    a bar per blacklisted pair, every legend off the data; compare draws every run."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    drop = run_cached("drop_timeout")
    s = drop.summary
    flushes = plots.flush_table(drop)
    first, second = flushes.itertuples(index=False)
    assert first.caller == "ci_bench_first" and not first.harmful  # the fleet was idle
    assert second.caller == "ci_bench" and second.harmful
    assert second.doomed == s["flush_doomed_transfers"]
    assert not plots.flush_table(run_cached("forward_timeout")).harmful.any()
    # drop_timeout assumes source_and_unstarted: 6 of its 14 doomed transfers had not started
    # their prefill, so the legend no longer says the pages were under live transfers
    labels = {h.get_label() for h in plots.mark_flushes(drop, plt.figure().gca())}
    assert labels == {"flush freeing pages of pending transfers",
                      "flush with no transfer pending"}
    plt.close("all")

    iv = plots.blacklist_intervals(drop)
    assert len(iv) == s["blacklisted_pairs_max"]  # permanent: one interval per pair
    assert (iv.cause == "flush_freed_pages").all() and (iv.cleared_by == "").all()
    assert iv.fast_failed.sum() == s["transfer_failures_by_reason"]["blacklisted_session"]

    fig = plots.postmortem(drop)
    fig.savefig(tmp_path / "pm.png", dpi=50)  # draws: legend extents are known after this
    outlined = [p for ax in fig.axes for p in ax.patches
                if isinstance(p, Rectangle) and not p.get_fill()]
    assert len(outlined) == s["blacklisted_pairs_max"]
    clients = [c.name for c in drop.scenario.clients]
    labelled = [ax for ax in fig.axes if any(c in ax.get_ylabel() for c in clients)]
    assert len(labelled) == len(clients)
    bars = [ax for ax in fig.axes if ax.get_ylabel().startswith("pairs (")]
    assert len(bars) == 1 and len(bars[0].patches) == s["blacklisted_pairs_max"]
    flush_lines = {(ln.get_color(), ln.get_linestyle()) for ax in fig.axes for ln in ax.lines
                   if list(ln.get_xdata()) in ([t, t] for t in flushes.t_flush)}
    assert {(plots.FLUSH, "-"), (plots.HARMLESS, "--")} <= flush_lines
    for ax in fig.axes:  # every legend sits outside its axes
        leg = ax.get_legend()
        if leg is not None:
            a, b = ax.get_window_extent(), leg.get_window_extent()
            overlap_w = min(a.x1, b.x1) - max(a.x0, b.x0)
            overlap_h = min(a.y1, b.y1) - max(a.y0, b.y0)
            assert overlap_w <= 1 or overlap_h <= 1, ax.get_title(loc="left")
            if ax.get_title(loc="left") and b.y0 >= a.y1 - 1:  # a legend row above the axes
                t = ax._left_title.get_window_extent()  # goes under the title, not over it
                assert t.y0 >= b.y1 - 1, ax.get_title(loc="left")
    fig2 = plots.compare({"healthy": run_cached("healthy"), "drop": drop})
    assert len([ln for ln in fig2.axes[0].lines if len(ln.get_xdata()) > 2]) == 2
    plt.close("all")


def test_probe_recovery_shows_as_pairs_coming_off_the_blacklist():
    res = run_cached("drop_timeout", "blacklist.policy=probe")
    iv = plots.blacklist_intervals(res)
    assert len(iv) and (iv.cleared_by == "probe").all()
    # probe interval 30 s, plus what the probe costs (a call and a 4 KiB write)
    assert (iv.end - iv.start <= 30 + 0.01).all()


def test_sweep_vary_values_compare_by_type_and_value():
    """1 == True and 0 == False in Python, but not as YAML values of a key; 1 and 1.0 are."""
    from pdsim.cli.sweep import _parse_vary

    assert _parse_vary(["x=1,true,0,false,'1',[1],[true]"]) == {
        "x": [1, True, 0, False, "1", [1], [True]]}
    assert [type(v) for v in _parse_vary(["x=1,true"])["x"]] == [int, bool]
    for raw in ("1,1.0", "true,True", "[1],[1.0]", "{a: 1},{a: 1.0}", "~,null"):
        with pytest.raises(UsageError, match="again|given twice"):
            _parse_vary([f"x={raw}"])


@pytest.mark.parametrize("args, says", [
    (["--client", "nope"], "--client 'nope': no such client; the scenario has bench"),
    (["--vary", "seed=1,2"], "--vary seed: the seeds are --seeds N"),
    (["--vary", "clients.0.num_prompts=20,30", "--vary", "clients.0.num_prompts=40"],
     "--vary clients.0.num_prompts: given twice"),
    # a value given twice ran twice and its rows merged into one table row, without a note;
    # values compare as YAML reads them: 1 and 1.0 are one value, 1 and true are not
    (["--vary", "horizon_s=1,1"], "--vary horizon_s: '1' given twice in '1,1'; give each "
     "value once"),
    (["--vary", "horizon_s=1, 2,1.0"], "--vary horizon_s: '1.0' is '1' again (the same value) "
     "in '1, 2,1.0'"),
    (["--vary", "blacklist.policy=never,'never'"], "--vary blacklist.policy: \"'never'\" is "
     "'never' again"),
])
def test_sweep_cli_refuses_before_running(monkeypatch, capsys, args, says):
    """--client was checked after every run; --vary seed was replaced by each run's seed (the
    grid silently ran seed 1 twice) and a key given twice lost its first values."""
    from pdsim.util import backends

    def no_runs(*_a, **_k):
        raise AssertionError("runs started before the command line was checked")

    monkeypatch.setattr(backends, "run_all", no_runs)
    assert main(["sweep", "scenarios/healthy.yaml", "--seeds", "1", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err


@pytest.mark.parametrize("vary, says", [
    ({"seed": [1, 2]}, "vary: the seeds are the seeds argument"),
    ("blacklist.policy", "vary: a dict of dotted key -> list of values"),
    ({"blacklist.policy": "never"}, "vary: a dict of dotted key -> list of values"),
    # (10 and "10" differ as given, but validate to one value: the grid point ran twice)
    ({"clients.0.num_prompts": [10, "10"]}, "vary clients.0.num_prompts: 10 and '10' are the "
     "same value once validated; give it once"),
    # (given twice as the library's caller wrote it: the CLI refused it, the library ran it)
    ({"clients.0.num_prompts": [10, 10.0]}, "vary clients.0.num_prompts: 10.0 given twice"),
])
def test_library_sweep_refuses_a_vary_it_would_misread(vary, says):
    """A string of values ran each of its characters; a str vary was a TypeError."""
    with pytest.raises(pdsim.ScenarioError, match=says):
        pdsim.sweep(SCENARIOS / "healthy.yaml", vary=vary, seeds=[1], workers=1,
                    progress=False)


def test_per_client_throughput_adds_up_to_the_fleet_line():
    """Each client's line is its share of the fleet's tokens: spread evenly over each decode,
    ci_bench_first drew 13.2k tok/s at t=10 s over a fleet line of 12.4k."""
    import matplotlib.pyplot as plt
    import numpy as np

    drop = run_cached("drop_timeout")
    ax = plots.throughput(drop, plt.figure().gca(), per_client=True)
    lines = {ln.get_label(): ln for ln in ax.lines}
    fleet = dict(zip(lines["fleet"].get_xdata(), lines["fleet"].get_ydata(), strict=True))
    total = dict.fromkeys(fleet, 0.0)
    for c in drop.scenario.clients:
        for x, y in zip(*lines[c.name].get_data(), strict=True):
            assert y <= fleet[x] + 1e-6, (c.name, x, y, fleet[x])
            total[x] += y
    assert np.allclose(list(total.values()), list(fleet.values()), rtol=1e-9, atol=1e-6)
    assert max(total.values()) > 10_000  # (the lines are not all zero)
    plt.close("all")


def test_the_kv_panel_title_names_the_peak_it_gives():
    """The curves are each role's ranks together; the title's peak is the busiest rank's
    (it said 'peak 7%' over a prefill curve that peaks at 4%)."""
    import re

    import matplotlib.pyplot as plt

    drop = run_cached("drop_timeout")
    ax = plots.kv_use(drop, plt.figure().gca())
    assert {ln.get_label() for ln in ax.lines if "KV" in ln.get_label()} == {
        "prefill KV (all ranks)", "decode KV (all ranks)"}
    note = plots.kv_pool_note(drop)
    for role in ("prefill", "decode"):
        busiest = max(v["peak"] / v["capacity"] for k, v in drop.kv_pools.items()
                      if k.startswith(role))
        assert re.search(rf"busiest rank's peak: .*{role} {100 * busiest:.0f}%", note), note
    plt.close("all")


def test_the_postmortem_colorbar_sits_by_its_matrix_and_counts_group_thousands(tmp_path):
    """The pair matrix's colorbar floated at the figure's edge, a legend's width from its
    matrix; the title printed 1360 where the report prints 1,360."""
    import matplotlib.pyplot as plt

    drop = run_cached("drop_timeout")
    fig = plots.postmortem(drop)
    fig.savefig(tmp_path / "pm.png", dpi=50)  # lays the figure out
    matrix = next(ax for ax in fig.axes if ax.get_title(loc="left").startswith("not completed /"))
    bar = next(ax for ax in fig.axes + matrix.child_axes
               if ax.get_ylabel() == "share not completed")
    gap = bar.get_position().x0 - matrix.get_position().x1
    assert 0 < gap < 0.02, gap
    assert f"{drop.summary['failed']:,} failed requests" in fig._suptitle.get_text()
    assert drop.summary["failed"] >= 1000  # (so the comma is there to see)
    plt.close("all")

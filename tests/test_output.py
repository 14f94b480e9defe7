"""What the human output says: labels that say what they count, the truncation warning,
what-if runs labelled, the one-line blacklist growth and --verbose, --help with examples."""

from __future__ import annotations

import pytest
from conftest import run_cached, small_fleet

import pdsim
from pdsim.cli.main import main
from pdsim.output.report import render


def test_successful_requests_are_labelled_as_http_200s_beside_completed_and_failed():
    res = run_cached("drop_timeout")
    m = res.summary["clients"]["ci_bench"]
    assert m["successful_requests"] == m["requests"]  # streamed: every abort is an HTTP 200
    assert m["completed_requests"] + m["failed"] == m["requests"] and m["failed"] > 0
    out = render(res)
    assert f"Successful requests (HTTP 200, as bench_serving): {m['successful_requests']}" in out
    assert f"Completed with all tokens generated:              {m['completed_requests']}" in out
    assert f"streamed aborts counted as successful:          {m['failed']}" in out
    assert "doomed: a KV transfer on pages a flush freed" in out


def test_doomed_is_defined_by_the_flush_dooms_the_run_assumed():
    """drop_timeout assumes flush.dooms: source_and_unstarted, under which 6 of its 14 doomed
    transfers had not started their prefill: the report called them all "in flight"."""
    from pdsim.output import report

    res = run_cached("drop_timeout")
    assert res.scenario.flush.dooms == "source_and_unstarted"
    said = " ".join(" ".join(report.fleet_block(res.summary, 16, "source_and_unstarted")).split())
    assert "pre-allocated for a prefill not yet started" in said
    assert "flush.dooms: source_and_unstarted, an assumption" in said
    assert said in " ".join(render(res).split())
    other = " ".join(" ".join(report.fleet_block(res.summary, 16, "source")).split())
    assert "in flight on prefill pages a flush freed" in other


def test_blacklist_growth_is_one_line_and_verbose_lists_every_pair():
    res = run_cached("drop_timeout")
    ret = res.summary["transfer_failures_by_reason"]["flush_freed_pages"]
    pairs = res.summary["blacklisted_pairs_max"]
    short = render(res).splitlines()
    growth = [ln for ln in short if "failed with ret != 0" in ln]
    assert len(growth) == 1 and f"{ret} transfers failed" in growth[0]
    assert f"{pairs}/16 now" in growth[0]
    assert not any("-> pair blacklisted" in ln for ln in short)
    full = render(res, verbose=True).splitlines()
    assert sum("-> pair blacklisted" in ln for ln in full) == pairs


def test_reference_verdicts_only_for_the_scenario_they_belong_to(tmp_path):
    incident = render(run_cached("drop_timeout"))  # the incident itself: verdicts shown
    assert " within" in incident or " outside" in incident
    probe = render(run_cached("drop_timeout", "blacklist.policy=probe"))
    assert "Reported figures (context only)" in probe
    assert "blacklist.policy=probe" in probe
    assert "within" not in probe and "outside" not in probe
    # a file that extends the incident and inherits its reported figures is a what-if too
    from conftest import SCENARIOS

    (tmp_path / "mine.yaml").write_text(
        f"extends: {SCENARIOS / 'drop_timeout.yaml'}\nclients:\n  - kind: bench\n"
        f"    name: ci_bench\n    num_prompts: 40\n")
    sc = pdsim.load(tmp_path / "mine.yaml", allow_outside_paths=True)  # extends outside tmp_path
    assert "inherits its reported figures" in pdsim.engine.sim.what_if(sc)
    assert pdsim.engine.sim.what_if(pdsim.load(SCENARIOS / "forward_timeout.yaml")) == ""


def test_a_run_cut_by_the_horizon_says_so_in_the_human_output(capsys):
    d = small_fleet(horizon_s=3.0)
    res = pdsim.run(d)
    s = res.summary
    assert s["stopped_at_horizon"] and s["unfinished"] > 0
    out = render(res)
    warn = [ln for ln in out.splitlines() if ln.startswith("WARNING:")]
    assert len(warn) == 1
    m = s["clients"]["bench"]
    assert f"{int((res.requests.status == 'unfinished').sum())} requests still in flight" in warn[0]
    assert f"{m['unsent']} not sent" in warn[0] and m["unsent"] > 0
    assert "--set horizon_s=6" in out
    assert not pdsim.run(small_fleet(horizon_s=600)).summary["stopped_at_horizon"]


@pytest.mark.parametrize("cmd", ["run", "validate", "sweep", "schema", "profiles"])
def test_every_subcommand_has_a_description_and_examples(cmd, capsys):
    with pytest.raises(SystemExit):
        main([cmd, "--help"])
    out = capsys.readouterr().out
    assert "example" in out and "pdsim " + cmd in out
    assert "``" not in out  # no raw reStructuredText


def _subcommands() -> dict:
    import argparse

    from pdsim.cli.main import _parser

    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


@pytest.mark.parametrize("cmd", sorted(_subcommands()))
def test_every_positional_argument_is_described_in_help(cmd, capsys):
    parser = _subcommands()[cmd]
    positionals = [a for a in parser._actions if not a.option_strings]
    with pytest.raises(SystemExit):
        main([cmd, "--help"])
    out = " ".join(capsys.readouterr().out.split())  # help text wraps
    for a in positionals:
        assert a.help, f"pdsim {cmd}: positional {a.dest!r} has no help"
        assert " ".join(a.help.split()) in out


def test_sweep_help_and_output_explain_the_columns(capsys):
    with pytest.raises(SystemExit):
        main(["sweep", "--help"])
    helptext = capsys.readouterr().out
    for col in ("ret!=0", "pairs", "failed", "empty", "gen tok/s", "pairs end", "offered/s",
                "keeps up", "TTFT p99", "SLO met", "goodput/s"):
        assert f"  {col} " in helptext
    assert main(["sweep", "scenarios/healthy.yaml", "--vary", "clients.0.num_prompts=30",
                 "--seeds", "1", "--workers", "1"]) == 0
    out = capsys.readouterr().out  # (a capacity sweep: the legend of its own columns)
    assert "bench's median time to first token" in out and "ret!=0" not in out


def test_the_fleet_block_defines_doomed_only_after_a_flush_and_failed_only_after_failures():
    """A run with failures but no flush prints what "failed" means, not what "doomed" means;
    one with neither prints neither."""
    from pdsim.output import report

    res = pdsim.run("scenarios/whatif_base.yaml", ["faults=[{preset: nic_degraded}]",
                                                   "clients.0.num_prompts=2000"])
    s = res.summary
    assert s["flush_doomed_transfers"] == 0 and s["failed"] > 0
    block = "\n".join(report.fleet_block(s))
    assert "doomed: a KV transfer" not in block and "failed: a request answered" in block
    quiet = dict(s, failed=0)
    block = "\n".join(report.fleet_block(quiet))
    assert "doomed: a KV" not in block and "failed: a request" not in block


def test_the_unknowns_block_offers_a_fit_only_when_there_are_figures_to_fit():
    from pdsim.output import report

    trace = pdsim.run("scenarios/trace_replay.yaml", ["clients.0.num_prompts=50"])
    assert trace.unknowns and not trace.scenario.reference
    assert "no reported figures to fit" in "\n".join(report.unknowns_block(trace))
    incident = run_cached("drop_timeout")
    assert incident.unknowns and incident.scenario.reference
    assert "which values fit the reported figures" in "\n".join(report.unknowns_block(incident))


def test_a_reported_figure_s_long_label_wraps_and_keeps_every_word():
    """Cut at 51 characters, "..., for context" lost the qualifier that says a figure is not
    judged (review finding 8): a long label wraps, its first line beside the figures."""
    from pdsim.output import report

    res = pdsim.run("scenarios/forward_timeout.yaml", ["clients.0.num_prompts=100",
                                                      "clients.1.num_prompts=50"])
    labels = [r.label for r in res.scenario.reference]
    long = [x for x in labels if len(x) > 51]
    assert long
    lines = report.reference_block(res.summary, res.scenario.reference, "x", "forward_timeout")
    for x in long:
        first = next(i for i, line in enumerate(lines) if line.startswith(x[:30]))
        words = lines[first][:52].split()
        for line in lines[first + 1:]:
            if not line.startswith("  "):
                break
            words += line.split()
        assert words == x.split(), (x, words)
    assert not any("…" in line for line in lines)
    refs = pdsim.load("scenarios/incidents/small_decode_window.yaml").reference
    assert any(len(r.label) > 51 and r.label.endswith("for context") for r in refs)
    lines = report.reference_block({}, refs, "x", "small_decode_window")
    assert any(line.strip().endswith("for context") for line in lines)


def test_a_reference_metric_the_summary_lacks_is_named_not_left_blank():
    """A misspelt metric path (or one naming a section) validates (keys vary by client), so
    the report says which are not in the summary instead of printing an empty cell."""
    from pdsim.output import report

    refs = ("reference=[{label: typo, reported: 1, metric: nonexistent.path, tolerance: 1}, "
            "{label: ok, reported: 1, metric: failed, tolerance: 1}, "
            "{label: name, reported: 1, metric: clients.bench.kind, tolerance: 1}, "
            "{label: list, reported: 1, metric: unknowns_at_nominal, tolerance: 1}]")
    res = pdsim.run("scenarios/healthy.yaml", ["clients.0.num_prompts=20", refs])
    lines = report.reference_block(res.summary, res.scenario.reference)
    for i, label in ((2, "typo"), (4, "name"), (5, "list")):  # (a string or list was a crash)
        assert lines[i].startswith(label) and lines[i].endswith("not a figure of the summary")
    assert lines[3].startswith("ok") and lines[3].endswith("within")
    assert lines[-1].startswith("not a figure of this run's summary: nonexistent.path, "
                                "clients.bench.kind, unknowns_at_nominal (")


def test_verdicts_on_a_run_at_chosen_nominal_values_say_they_rest_on_them():
    """drop_timeout's "within" for F1 and F2 is a fit (its nominal start and flush.dooms were
    chosen for them): the comparison says its verdicts rest on the declared unknowns' values."""
    from pdsim.output import report

    res = run_cached("drop_timeout")
    text = report.render(res)
    block = text[text.index("Compared with the reported figures"):]
    assert "nominal values (above): chosen inputs" in " ".join(block.split())
    plain = report.reference_block(res.summary, res.scenario.reference)
    assert not any("chosen inputs" in line for line in plain)


def test_a_figure_fitted_by_chosen_inputs_says_so_beside_its_verdict():
    """drop_timeout's start of the second run and flush.dooms were chosen to give F1 and F2:
    their 'within' checked a fit and read as a prediction. While those inputs stay declared
    (at nominal) the verdict says '(fitted)' and names them; pinned by --set, it does not."""
    from conftest import SCENARIOS, run_cached

    lines = render(run_cached("drop_timeout")).splitlines()
    f1 = next(ln for ln in lines if ln.startswith("flush-caused transfer failures"))
    f4 = next(ln for ln in lines if ln.startswith("generated-token throughput"))
    assert f1.endswith("within (fitted)") and "(fitted)" not in f4
    assert any(ln.startswith("(fitted): the nominal values of clients.1.start_s, flush.dooms "
                             "were chosen") for ln in lines)
    pinned = pdsim.run(SCENARIOS / "drop_timeout.yaml",
                       ["clients.1.start_s=6", "flush.dooms=source_and_unstarted",
                        "clients.0.num_prompts=200", "clients.1.num_prompts=200"])
    assert "(fitted)" not in render(pinned)

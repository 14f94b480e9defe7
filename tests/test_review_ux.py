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


# --- 2. hostile JSON and malformed run directories: one line, exit 2 ---------------------------


@pytest.mark.parametrize("text, says", [
    ('{"architectures": ["LlamaForCausalLM"], "num_hidden_layers": ' + "9" * 5000 + "}",
     "cfg.json: an integer of 5,000 digits; at most 100"),
    ('{"a":' * 40_000, "cfg.json: nested deeper than 50 levels"),  # (200 KB, under the 1 MB cap)
    ('"' + '\\"' * 200_000, "cfg.json: not valid JSON"),  # (the nesting scan stays linear)
], ids=["5000_digits", "deep", "open_string"])
def test_profiles_import_reads_json_with_depth_and_integer_limits(tmp_path, capsys, text, says):
    """A 5,000-digit integer was Python's ValueError past its 4,300-digit limit, 200 KB of
    {"a": a RecursionError: internal errors, exit 70."""
    (tmp_path / "cfg.json").write_text(text)
    assert main(["profiles", "import", str(tmp_path / "cfg.json"), "--name", "v", "--out",
                 str(tmp_path / "v.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err
    assert not (tmp_path / "v.yaml").exists()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    import pdsim

    d = _scenario_dir(tmp_path_factory.mktemp("rd"))
    out = d / "good"
    pdsim.run(d / "s.yaml").write(out)
    return out


def _spoil(run_dir: Path, tmp_path: Path, name: str, text: str) -> Path:
    bad = tmp_path / "bad"
    shutil.copytree(run_dir, bad)
    (bad / name).write_text(text)
    return bad


@pytest.mark.parametrize("name, text, says", [
    ("summary.json", "[]", "bad: cannot read the run directory (summary.json holds list"),
    ("summary.json", '{"a": ' * 60 + "1" + "}" * 60, "summary.json: nested deeper than 50"),
    ("summary.json", "{}", "summary.json: 'simulated_s' must be a finite number of at least "
                           "0, got nothing"),
    ("requests.csv", "a,b\n1,2\n", "bad/requests.csv: not a run directory's requests table "
                                   "(no column rid, client"),
    ("timeseries.csv", None, "bad/timeseries.csv: column 'time' must hold numbers"),
], ids=["list", "deep", "empty", "columns", "clock_of_words"])
@pytest.mark.parametrize("plot", [False, True])
def test_compare_refuses_a_malformed_run_directory_in_one_line(run_dir, tmp_path, capsys, name,
                                                               text, says, plot):
    """rd/summary.json of [] was an AttributeError (exit 70); requests.csv with other columns
    an AttributeError with --plot and a table printed from the summary alone without it."""
    if text is None:  # (the right columns, a clock of words)
        lines = (run_dir / name).read_text().splitlines()
        text = "\n".join([lines[0]] + ["soon" + x[x.index(","):] for x in lines[1:]]) + "\n"
    bad = _spoil(run_dir, tmp_path, name, text)
    more = ["--plot", str(tmp_path / "c.png")] if plot else []
    assert main(["compare", str(run_dir), str(bad), *more]) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and says in err, err
    assert not out and not (tmp_path / "c.png").exists()


# --- 3. the pair matrix counts every request that did not complete -----------------------------


def test_the_pair_matrix_counts_timed_out_requests_as_rank_load_does():
    """abort_storm's 6,946 failures are all gateway_ttft_timeout (status timed_out): the
    matrix counted status == "failed" only and showed 0/1931 on every pair under a title of
    6,946 failed."""
    import matplotlib.pyplot as plt

    import pdsim
    from pdsim.output import plots

    res = pdsim.run(ROOT / "scenarios" / "incidents" / "abort_storm.yaml", ["horizon_s=150"])
    req = res.measured[res.measured.p_rank >= 0]
    assert (req.status == "timed_out").sum() > 100 and not (req.status == "failed").any()
    fig, ax = plt.subplots()
    plots.pair_matrix(res, ax)
    cells = [t.get_text().split("/") for t in ax.texts]
    assert sum(int(a) for a, _ in cells) == (req.status != "completed").sum()
    assert sum(int(b) for _, b in cells) == len(req)
    plt.close(fig)


# --- 4. incidents that tell their story -------------------------------------------------------


def test_small_decode_window_draws_the_postmortem_its_report_tells(monkeypatch, tmp_path):
    """Its dead rooms come of a small decode window, not of faults or flushes: the report told
    the incident while --plot drew the capacity figure (two rules); one predicate now."""
    from conftest import run_cached

    from pdsim.analysis import sweep
    from pdsim.cli import run as run_cli
    from pdsim.engine.incident import is_incident
    from pdsim.output import plots, plots_capacity

    res = run_cached("incidents/small_decode_window")
    assert not res.scenario.faults and not res.scenario.operator_flushes
    assert res.summary["incident"]["dead_rooms"] > 0
    drawn = []
    monkeypatch.setattr(plots, "postmortem", lambda r: drawn.append("postmortem") or _fig())
    monkeypatch.setattr(plots_capacity, "capacity", lambda r: drawn.append("capacity") or _fig())
    run_cli._plot(res, str(tmp_path / "f.png"))
    assert drawn == ["postmortem"]
    assert is_incident(res.scenario, res.summary) and sweep.is_incident(res.scenario)
    healthy = run_cached("healthy", "clients.0.num_prompts=50")
    assert not is_incident(healthy.scenario, healthy.summary)


def _fig():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.figure()


def test_prefill_restart_s_reported_figure_separates_stuck_forever_from_its_fix():
    """The trough of a prefill down >= 10 s is 0 for the fixed twin too, so both reproduced
    "stuck forever"; goodput at the load's end is 0 only for the fleet that stays stuck."""
    from conftest import run_cached

    from pdsim.output.report import _get

    for name, within in (("prefill_restart", True), ("prefill_restart_fixed", False)):
        res = run_cached(f"incidents/{name}")
        (ref,) = [r for r in res.scenario.reference if r.metric == "incident.final_ratio"]
        assert ref.within(_get(res.summary, ref.metric)) is within, name


def test_requests_that_can_never_finish_are_counted_beside_failed_and_block_recovery():
    """stuck_transferring printed "recovered 8 s after the trigger" and 0 failed while 46
    requests sat in dead rooms for ever; its fix looked worse (46 failed)."""
    from conftest import run_cached

    from pdsim.output import report

    broken = run_cached("incidents/stuck_transferring")
    fixed = run_cached("incidents/stuck_transferring_fixed")
    b, f = broken.summary["incident"], fixed.summary["incident"]
    assert broken.summary["failed"] == 0 and b["stuck_requests"] == 46 == b["dead_rooms_at_end"]
    assert b["goodput_recovery_s"] is not None and not b["recovered"] and b["recovery_s"] is None
    assert f["stuck_requests"] == 0 and f["recovered"]
    text = report.render(broken)
    assert "46 (can never finish" in text and "not recovered: goodput back" in text
    assert "recovered 8 s" not in text


@pytest.mark.parametrize("name,metric", [("abort_storm", "incident.recovery_s"),
                                         ("sticky_blacklist", "incident.recovered")])
def test_recovery_figures_read_the_summary_so_the_simulated_column_fills(name, metric):
    from conftest import run_cached

    from pdsim.output import report

    res = run_cached(f"incidents/{name}")
    (ref,) = [r for r in res.scenario.reference if "recover" in r.label]
    assert ref.metric == metric
    lines = report.reference_block(res.summary, res.scenario.reference, "", name)
    row = next(x for x in lines if x.startswith(ref.label[:40]))
    assert row[52:62].strip() in ("none", "0"), row


# --- 5. a colocated fleet refuses what only a PD fleet has --------------------------------------


@pytest.mark.parametrize("kv,key", [
    ("transfer.waiting_timeout_s=60", "transfer.waiting_timeout_s"),
    ("blacklist.policy=never", "blacklist.policy"),
    ("blacklist.strikes=3", "blacklist.strikes"),
    ("flush.dooms=source", "flush.dooms"),
    ("router.ttft_timeout_cancels=prefill", "router.ttft_timeout_cancels"),
])
@pytest.mark.parametrize("cmd", ["validate", "run"])
def test_a_colocated_fleet_refuses_a_pd_only_key_in_validate_and_run(tmp_path, capsys, kv, key,
                                                                     cmd):
    """They validated and ran (rc 0) though the colocated fleet ignores them."""
    argv = [cmd, str(ROOT / "scenarios/capacity/colocated_8xh100.yaml"), "--set", kv,
            "--set", "clients.0.num_prompts=20"]
    assert main(argv + (["--out", str(tmp_path / "o")] if cmd == "run" else [])) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and f"'{key}'" in err and "PD fleet" in err, err
    assert not (tmp_path / "o").exists()


def test_a_colocated_fleet_reloaded_from_its_dump_is_still_accepted():
    """By value, not by the keys the file wrote: a dump sets every key to its default."""
    import pdsim

    sc = pdsim.load(ROOT / "scenarios/capacity/colocated_8xh100.yaml")
    again = pdsim.load(sc, ["seed=3"])
    assert again.transfer.model_fields_set and again.fleet.mode == "colocated"
    v23 = pdsim.load(ROOT / "scenarios/capacity/colocated_8xh100.yaml", ["engine.version=0.5.23"])
    assert v23.blacklist.policy == "v0_5_23"  # the release's default policy is no one's choice


def test_whatif_on_a_colocated_fleet_says_it_needs_a_pd_fleet(capsys):
    """It said "invalid value at 'faults.0.kind': decode_unreachable", a key never written."""
    assert main(["whatif", str(ROOT / "scenarios/capacity/colocated_8xh100.yaml")]) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") <= 1 and "needs a PD fleet" in err and "faults.0" not in err, err


# --- 7. a fixed twin's reported figures belong to the parent it extends ------------------------


def test_a_fixed_twin_s_report_names_the_scenario_whose_figures_it_shows(tmp_path):
    """Every _fixed twin said "the reported figures belong to the scenario 'abort_storm_fixed'
    as shipped": they are its parent's (extends: abort_storm.yaml)."""
    import pdsim
    from pdsim.output import report

    res = pdsim.run(ROOT / "scenarios/incidents/abort_storm_fixed.yaml", ["horizon_s=60"])
    def said(r):  # (the note wraps)
        return " ".join(report.render(r).split())

    text = said(res)
    assert "belong to the scenario 'abort_storm' as shipped" in text, text
    assert "'abort_storm_fixed'" not in text
    res.write(tmp_path / "rd")  # (and so does the run directory's report)
    again = pdsim.Result.read(tmp_path / "rd")
    assert "belong to the scenario 'abort_storm' as shipped" in said(again)
    # a file declaring its own figures keeps its own name
    (tmp_path / "own.yaml").write_text(
        f"extends: {ROOT / 'scenarios/incidents/abort_storm.yaml'}\nname: mine\n"
        "reference: [{label: failed, metric: failed, reported: 1, tolerance: 1}]\n")
    own = pdsim.run(tmp_path / "own.yaml", ["horizon_s=60", "clients.0.request_rate=1"],
                    allow_outside_paths=True)
    assert "belong to the scenario 'mine' as shipped" in said(own)


# --- 6. a sharegpt dataset of length pairs needs no timestamps ----------------------------------


def test_a_sharegpt_file_of_length_pairs_without_timestamps_runs(tmp_path, capsys):
    """docs/reference/scenario.md: "a JSONL file of input_length/output_length pairs (the
    Mooncake trace format; timestamps are not used)"; such a file was refused ("'timestamp'
    (ms) must be a number")."""
    import json

    import pdsim

    rows = [{"input_length": 100 + 37 * i, "output_length": 20 + i} for i in range(40)]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    sc = {"name": "pairs", "seed": 1, "horizon_s": 600,
          "fleet": {"gpu": "H100", "model": "llama-3.1-8b"},
          "clients": [{"kind": "bench", "num_prompts": 30, "request_rate": 5,
                       "dataset": {"kind": "sharegpt", "path": "pairs.jsonl"}}]}
    (tmp_path / "s.yaml").write_text(json.dumps(sc))
    assert main(["validate", str(tmp_path / "s.yaml")]) == 0, capsys.readouterr().err
    res = pdsim.run(tmp_path / "s.yaml")
    assert res.summary["completed_requests"] == 30
    assert set(res.measured.input_len) <= {r["input_length"] for r in rows}
    # a trace still needs its timestamps (it replays them)
    sc["clients"][0]["dataset"] = {"kind": "trace", "path": "pairs.jsonl"}
    (tmp_path / "t.yaml").write_text(json.dumps(sc))
    assert main(["validate", str(tmp_path / "t.yaml")]) == 2
    assert "'timestamp' (ms) must be a number" in capsys.readouterr().err


# --- 8. smaller items ---------------------------------------------------------------------------


def test_compare_names_the_scenario_file_it_cannot_load(tmp_path, capsys):
    (tmp_path / "bad.yaml").write_text("name: bad\nseed: x\n")
    assert main(["compare", str(ROOT / "scenarios/healthy.yaml"), str(tmp_path / "bad.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bad.yaml: invalid value at 'seed'" in err, err


@pytest.mark.parametrize("base,over,says", [
    ("Llama-3.1-8B", {"num_key_value_heads": 0}, "num_key_value_heads is 0"),  # (read as MHA)
    ("Llama-3.1-8B", {"head_dim": 0}, "head_dim is 0"),  # (fell back to hidden / heads)
    ("DeepSeek-R1", {"n_routed_experts": 0}, "n_routed_experts is 0"),  # (became dense)
    ("DeepSeek-R1", {"first_k_dense_replace": 1000}, "first_k_dense_replace is 1000, more "
                                                     "than num_hidden_layers (61)"),
    ("Llama-3.1-8B", {"hidden_size": 10**9}, "cfg.json: hidden_size: Input should be"),
])
def test_profiles_import_refuses_nonsense_in_the_config_s_own_terms(tmp_path, capsys, base,
                                                                    over, says):
    """Each was accepted (written, exit 0) or said "huge_hidden.json: huge_hidden.json: invalid
    value at 'models.t_huge_hidden.hidden_size'": the file twice, a key of pdsim's profile."""
    import json

    cfg = {**json.loads((ROOT / f"tests/hf_configs/{base}.json").read_text()), **over}
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    argv = ["profiles", "import", str(tmp_path / "cfg.json"), "--name", "t_x", "--out",
            str(tmp_path / "p.yaml")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err and err.count("cfg.json") == 1, err
    assert "models.t_x" not in err and not (tmp_path / "p.yaml").exists()


def test_shipped_scenarios_cite_pages_that_exist_and_figures_validate_prints(capsys):
    """healthy.yaml's "(README, step-time model)" (printed by every drop_timeout report) and
    trace_replay.yaml's README sections pointed at a README that no longer holds them; and
    llama70b_h100.yaml said "~45 GB for KV at mem_fraction_static 0.8" where validate prints
    0.824 and 429,601 tokens (~35 GB/GPU; 407,926 since the start-up memory)."""
    import re

    for p in sorted((ROOT / "scenarios").rglob("*.yaml")):
        text = p.read_text()
        bare = [m.group(0) for m in re.finditer(r"(?<![/\w])README(?!\.md)\W{0,3}\w*", text)]
        assert not bare, (p.name, bare)
        for page in re.findall(r"\b(docs/[\w/.-]+\.md)", text):
            assert (ROOT / page).is_file(), (p.name, page)
    path = ROOT / "scenarios/capacity/llama70b_h100.yaml"
    assert main(["validate", str(path)]) == 0
    said = capsys.readouterr().out
    pool, frac = re.search(r"prefill ([\d,]+) tokens \(mem_fraction_static ([\d.]+)", said).groups()
    text = path.read_text()
    assert pool in text and f"mem_fraction_static {frac}" in text and "45 GB" not in text


def test_latency_cdf_tick_labels_do_not_overlap():
    """abort_storm's TTFT spans 0.13-6 s: matplotlib labelled the minor ticks (2x10^-1,
    3x10^-1, ...) on top of each other."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from conftest import run_cached

    from pdsim.output import plots

    res = run_cached("incidents/abort_storm")
    for metric in ("ttft", "e2e"):
        fig, ax = plt.subplots(figsize=(5, 2.5))
        plots.latency_cdf(res, ax, metric)
        fig.canvas.draw()
        r = fig.canvas.get_renderer()
        lo, hi = ax.get_xlim()
        boxes = sorted((t.get_window_extent(r) for t in
                        ax.xaxis.get_majorticklabels() + ax.xaxis.get_minorticklabels()
                        if t.get_text() and t.get_visible() and lo <= t.get_position()[0] <= hi),
                       key=lambda b: b.x0)
        assert len(boxes) >= 2, metric
        assert all(a.x1 <= b.x0 for a, b in zip(boxes[:-1], boxes[1:], strict=True)), metric
        plt.close(fig)


def test_the_slo_says_it_is_measured_from_the_send_when_prompts_wait_for_a_slot():
    """At rate 40 with max_concurrency 8 the report said "falling behind" beside "100% ...
    meets the SLO": bench_serving's TTFT starts at the send, after the wait for a slot."""
    from conftest import run_cached

    from pdsim.output import report

    sets = ("clients.0.num_prompts=300", "clients.0.request_rate=40")
    res = run_cached("capacity/llama70b_h100", *sets, "clients.0.max_concurrency=8")
    assert res.summary["steady"]["keeps_up"] is False and res.summary["slo"]["meets_slo"]
    text = " ".join(report.render(res).split())
    assert "SLO measured from each request's send" in text and "8 concurrency slots" in text
    assert "falls behind the offered rate" in text
    free = run_cached("capacity/llama70b_h100", *sets)  # (no slot to wait for: no note)
    assert "SLO measured from" not in report.render(free)


def test_compare_marks_an_slo_attainment_below_its_target():
    """88.8% against a 90% target was printed bare, read as a pass."""
    import copy

    from conftest import run_cached

    from pdsim.output import compare

    res = run_cached("capacity/llama70b_h100", "clients.0.num_prompts=300")
    low = copy.copy(res)
    low.summary = {**res.summary, "slo": {**res.summary["slo"], "attainment": 0.888,
                                          "meets_slo": False}}
    text = compare.render({"a": res, "b": low})
    row = next(line for line in text.splitlines() if line.startswith("SLO attainment"))
    assert "88.8% (misses 90%)" in row and "(meets 90%)" in row, row


def test_drop_timeout_s_median_ttft_of_zero_is_explained_beside_it():
    """Its 557 streamed aborts have a TTFT of 0 as bench_serving counts them: "Median TTFT
    0.00 ms" stood without a word."""
    from conftest import run_cached

    from pdsim.output import report

    res = run_cached("drop_timeout")
    text = report.render(res)
    for c in res.scenario.clients:
        m = res.summary["clients"][c.name]
        aborts = m["successful_requests"] - m["completed_requests"]
        if not (c.kind == "bench" and c.stream and aborts > 0):
            continue
        assert m["median_ttft_ms"] == 0
        block = text[text.index(f"Serving Benchmark Result: {c.name} "):]
        lines = block.splitlines()
        at = next(i for i, line in enumerate(lines) if line.startswith("Median TTFT"))
        near = " ".join(" ".join(lines[at:at + 8]).split())
        assert f"TTFT counts the {aborts:,} streamed aborts as bench_serving does" in near
        break
    else:
        raise AssertionError("no streamed aborts in drop_timeout")


# --- 9. the guide says what a whatif matrix costs -----------------------------------------------


def test_the_incident_guide_says_what_a_whatif_matrix_costs_and_its_counts_are_the_code_s():
    """The guide's cost of the default what-if is the CLI's own matrix: its arms, faults,
    loads and seeds (the counts read from pdsim.analysis.study, the prompts from the base)."""
    import re

    import pdsim
    from pdsim.analysis import study, whatif

    text = " ".join((ROOT / "docs/guides/incident-library.md").read_text().split())
    said = re.search(r"What a matrix costs: .*? runs (\d+) policy arms .*? the (\d+) faults of "
                     r"`--faults library` at (\d+) loads .*? with (\d+) seeds: (\d+) × (\d+) × "
                     r"\(1 \+ (\d+) × (\d+)\) = ([\d,]+) runs of `whatif_base` \(([\d,]+) prompts",
                     text)
    assert said, "the guide does not say what a whatif matrix costs"
    arms, faults, loads, seeds, l2, s2, a2, f2, runs, prompts = (
        int(x.replace(",", "")) for x in said.groups())
    assert arms == a2 == len(whatif.expand_policies(study.DEFAULT_POLICIES))
    assert faults == f2 == len(study.DEFAULT_FAULTS)
    assert loads == l2 == len(study.DEFAULT_LOADS) and seeds == s2 == study.DEFAULT_SEEDS
    assert runs == loads * seeds * (1 + arms * faults)
    assert f"(all: the {len(whatif.expand_faults(None))} of the library)" in text.replace(
        "`all`", "all")
    base = pdsim.load(ROOT / "scenarios/whatif_base.yaml")
    assert prompts == base.clients[0].num_prompts


def test_the_capacity_figure_spreads_requests_that_arrived_at_once_and_says_why_no_tpot():
    """small_decode_window's eval sends its questions at once: its TTFT panel drew every point
    on the y axis (by arrival, all at 0 s) and looked empty; its TPOT panel said "no streamed
    response" without saying that an eval's responses are not streamed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from conftest import run_cached

    from pdsim.output import plots_capacity

    res = run_cached("incidents/small_decode_window")
    fig = plots_capacity.capacity(res)
    ttft = next(a for a in fig.axes if a.get_title(loc="left").startswith("time to first"))
    xs = ttft.collections[0].get_offsets()[:, 0]
    assert xs.max() - xs.min() > 0.02 * res.summary["simulated_s"], xs
    assert ttft.get_xlabel().startswith("finish time")
    tpot = next(a for a in fig.axes if a.get_title(loc="left").startswith("time per output"))
    assert any("not streamed" in t.get_text() and "eval" in t.get_text() for t in tpot.texts)
    plt.close(fig)


def test_the_capacity_figure_s_headline_says_its_slo_is_measured_from_the_send():
    from conftest import run_cached

    from pdsim.output import plots_capacity

    sets = ("clients.0.num_prompts=300", "clients.0.request_rate=40")
    res = run_cached("capacity/llama70b_h100", *sets, "clients.0.max_concurrency=8")
    line = plots_capacity._headline(res)
    assert "falls behind" in line and "meet the SLO (target 90%, from the send: 8 slots)" in line
    assert "from the send" not in plots_capacity._headline(run_cached("capacity/llama70b_h100",
                                                                         *sets))


def test_an_incident_sweep_shows_unanswered_requests_beside_failed():
    from conftest import run_cached

    from pdsim.analysis import sweep

    res = run_cached("incidents/stuck_transferring")
    cols = list(sweep.default_columns(res.scenario, res.scenario.clients[0].name))
    assert cols[cols.index("failed") + 1] == "unfinished"
    assert res.summary["failed"] == 0 and res.summary["unfinished"] == 46

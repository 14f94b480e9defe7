"""pdsim command line: a thin layer over pdsim.run.

Results go to stdout; progress and notes go to stderr. Every user error exits 2 with one line;
an unexpected exception exits 70 with one line asking for a bug report (the traceback only with
``PDSIM_DEBUG=1``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pdsim.util.backends import MAX_RUNS, check_workers  # runs a fan-out may make; --workers
from pdsim.util.safeio import UserFileError, clip, echo, read_user_file, show_path

if TYPE_CHECKING:  # pdsim.config.scenario (pydantic) is imported after the parse: --help needs none
    from pdsim.config.scenario import Scenario

PROGRESS_AFTER_S = 2.0  # pdsim run on a terminal: a run still going after this shows a bar
MAX_SEEDS = 10_000  # sweep/explore/whatif --seeds


class UsageError(Exception):
    """A bad command line (not a bad scenario); ``str()`` is one line."""


RAW = argparse.RawDescriptionHelpFormatter


class _WhatIfHelp(RAW):
    """Fills the what-if table's column legend into the epilog only when the help is printed:
    the legend lives in pdsim.whatif, which imports pandas (~0.5 s every command would pay)."""

    def add_text(self, text: str | None) -> None:
        if text is not None and "{columns}" in text:
            text = text.format(columns=_legend())
        super().add_text(text)

TOP = """\
pdsim simulates prefill/decode-disaggregated LLM serving (SGLang-style PD fleets, a
Mooncake-like KV transfer engine with its peer blacklist, mini_lb, bench_serving and gsm8k
clients), one event per batch step. Replay an incident, ask what-if of a policy, draw a
postmortem's plots.

Results go to stdout, notes and progress bars to stderr. Run `pdsim COMMAND --help` for a
command's options and examples."""

TOP_EPILOG = """\
examples:
  pdsim run scenarios/drop_timeout.yaml               the incident, bench_serving-style report
  pdsim run scenarios/drop_timeout.yaml --set blacklist.policy=probe
  pdsim sweep scenarios/drop_timeout.yaml --vary blacklist.policy=permanent,probe,v0_5_23
  pdsim whatif scenarios/whatif_base.yaml --seeds 3   blacklist policies x fault library
  pdsim validate my.yaml                              check a scenario before running it
  pdsim profiles dsv3-ci-test                         a model profile, every value's source"""

RUN = """\
Simulate a scenario and print a bench_serving-style report per client, the fleet's counters
(transfer failures, blacklisted pairs, wasted prefill), the incident timeline and, when the
scenario lists reported figures, the run beside them. A run that --set changes (or a file that
inherits its reported figures through extends:) is a what-if: the figures are then shown for
context only, without verdicts. A run that reaches horizon_s with requests unfinished ends its
report with a WARNING line.

--out DIR writes a self-describing run directory: requests, events and timeseries tables,
summary.json, report.txt, the resolved scenario.yaml (re-run it with pdsim run
DIR/scenario.yaml) and run.json (pdsim version, seeds, overrides).

--perfetto FILE writes the run as Chrome trace-event JSON: a track per DP rank (a slice per
batch step) and per NIC transfer queue (a slice per KV write), instants for flushes, transfer
failures and blacklist changes, counters for KV use and queues. Recording the steps is off
otherwise and costs nothing then."""

RUN_EPILOG = """\
examples:
  pdsim run scenarios/healthy.yaml
  pdsim run scenarios/drop_timeout.yaml --verbose          every failed pair in the timeline
  pdsim run scenarios/drop_timeout.yaml --json | jq .clients.ci_bench.empty_share
  pdsim run scenarios/drop_timeout.yaml --seed 3 --out runs/dt3
  pdsim run scenarios/drop_timeout.yaml --set flush.semantics=reject_if_busy
  pdsim run scenarios/trace_replay.yaml --set clients.0.num_prompts=2000 --progress
  pdsim run scenarios/drop_timeout.yaml --perfetto drop.json   then open it in ui.perfetto.dev"""

VALIDATE = """\
Check a scenario file (after extends: and --set) and exit: 0 and one line when it would run,
2 and one line naming the key path and what is allowed when it would not."""

VALIDATE_EPILOG = """\
examples:
  pdsim validate scenarios/drop_timeout.yaml
  pdsim validate my.yaml --set fleet.decode.dp=8"""

SWEEP_COLUMNS = """\
table columns (median over the seeds of each grid point):
  ret!=0      transfers that failed with ret != 0 because a flush freed pages under them
              (summary key transfer_failures_by_reason.flush_freed_pages); under the
              one-strike blacklist each one blacklists its (prefill rank, decode session) pair
  pairs       most pairs blacklisted at once (blacklisted_pairs_max)
  failed      requests of all clients answered with a 5xx or an abort (failed)
  empty       share of --client's requests that got no token (<client>.empty_share)
  gen tok/s   --client's generated tokens per second, aborts counting 0, unlike
              bench_serving's printed figure (<client>.true_output_throughput_tok_s)
  pairs end   pairs still blacklisted when the run ended (blacklisted_pairs_final)
--out FILE and --json give every summary metric per run, not just these."""

SWEEP = """\
Run a scenario over the grid of --vary values (their product) and seeds 1..N, in parallel
processes, and print a table of medians per grid point. Values are YAML scalars."""

SWEEP_EPILOG = SWEEP_COLUMNS + """

examples:
  pdsim sweep scenarios/drop_timeout.yaml --vary blacklist.policy=permanent,probe,v0_5_23 --seeds 5
  pdsim sweep scenarios/drop_timeout.yaml --vary blacklist.strikes=1,2,3 \\
      --vary flush.semantics=skip_idle_check,reject_if_busy --out rows.csv
  pdsim sweep scenarios/healthy.yaml --set predictor.kind=roofline \\
      --vary predictor.prefill_mfu=0.25,0.35,0.5 --seeds 1"""

WHATIF = """\
Run blacklist policies (with parameter grids) under every fault of a library, seeds 1..N each,
in parallel, and print one decision table (a row per policy and fault: medians over the seeds
with 10-90% intervals) and a ranking of the policies by their worst-case regret across the
faults. Every seed also runs without faults: goodput lost and recovery are measured against it.

Policies: NAME, or NAME:KEY=V1,V2:KEY2=V (lists are a grid), e.g. ttl:ttl_s=10,30,120.
Default: every registered policy at its defaults. Faults: names from the library (`pdsim
faults`), or your own sets in a YAML file (name: a fault or a list of faults)."""

WHATIF_EPILOG = """\
{columns}

examples:
  pdsim whatif scenarios/whatif_base.yaml --seeds 3
  pdsim whatif scenarios/whatif_base.yaml --policy permanent --policy never \\
      --policy ttl:ttl_s=5,30,120,600 --faults flush_race,decode_hang --param ttl_s --plots
  pdsim whatif scenarios/whatif_base.yaml --faults-file my_faults.yaml --out runs/wi \\
      --format csv,parquet,json --timeline nic_flaps"""

PROFILES_EPILOG = """\
examples:
  pdsim profiles                 every GPU and model, one line each
  pdsim profiles H20             one profile, each value with its source"""

EXPLORE_EPILOG = """\
examples:
  pdsim explore scenarios/drop_timeout.yaml --samples 64 --seeds 2
  pdsim explore scenarios/drop_timeout.yaml --samples 128    reuses the first 64 samples' runs
  pdsim explore my.yaml --set 'clients.0.start_s={uniform: [0, 30], nominal: 10}'
  pdsim explore my.yaml --backend ray --address auto          pip install -e '.[ray]'
Killed or interrupted, the same command resumes: stored runs are not run again."""

SCHEMA_EPILOG = """\
example:
  pdsim schema > scenario.schema.json
  # then, first line of a scenario: # yaml-language-server: $schema=./scenario.schema.json"""


def _die(msg: str) -> int:
    print(f"pdsim: error: {clip(msg, 2000)}", file=sys.stderr)
    return 2


def _outside_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow-outside-paths", action="store_true",
                   help="let the scenario read files (extends:, traces) outside its directory "
                   "tree")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pdsim", description=TOP, epilog=TOP_EPILOG,
                                formatter_class=RAW)
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    r = sub.add_parser("run", help="simulate a scenario and print a bench_serving-style report",
                       description=RUN, epilog=RUN_EPILOG, formatter_class=RAW)
    r.add_argument("scenario", help="scenario YAML file")
    r.add_argument("--seed", type=int, help="override the scenario's seed")
    r.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario value by dotted key, e.g. router.flush_handler="
                   "mini_lb_fixed or clients.0.num_prompts=200 (repeatable)")
    r.add_argument("--out", metavar="DIR", help="write a self-describing run directory (tables, "
                   "summary.json, report.txt, scenario.yaml, run.json) into DIR")
    r.add_argument("--format", choices=["csv", "parquet"],
                   help="table format for --out: csv (default) or parquet")
    r.add_argument("--json", action="store_true", help="print only the summary as JSON")
    r.add_argument("--verbose", "-v", action="store_true",
                   help="timeline in full: every ret != 0 failure and blacklisted pair")
    bar = r.add_mutually_exclusive_group()
    bar.add_argument("--progress", action="store_true",
                     help="a bar of simulated seconds on stderr from the start (on a terminal "
                     "one shows anyway once a run has taken 2 s)")
    bar.add_argument("--no-progress", action="store_true", help="no bar, even on a terminal")
    _outside_flag(r)
    r.add_argument("--perfetto", metavar="FILE", help="record every batch step and KV write and "
                   "write a Chrome trace-event JSON to FILE: open it in https://ui.perfetto.dev")

    v = sub.add_parser("validate", help="check a scenario file and exit",
                       description=VALIDATE, epilog=VALIDATE_EPILOG, formatter_class=RAW)
    v.add_argument("scenario", help="scenario YAML file")
    v.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario value by dotted key (repeatable)")
    _outside_flag(v)

    sw = sub.add_parser("sweep", help="run a scenario over a grid of overrides and seeds",
                        description=SWEEP, epilog=SWEEP_EPILOG, formatter_class=RAW)
    sw.add_argument("scenario", help="scenario YAML file")
    sw.add_argument("--vary", action="append", default=[], metavar="KEY=V1,V2,...",
                    help="a dotted key and the values to try (repeatable: the grid is the "
                    "product), e.g. blacklist.policy=permanent,probe,v0_5_23")
    sw.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="fixed overrides applied to every run")
    sw.add_argument("--seeds", type=int, default=3, help="seeds 1..N per grid point")
    sw.add_argument("--workers", type=int, help="processes (default: one per core)")
    sw.add_argument("--out", metavar="FILE", help="write every run's row (CSV)")
    sw.add_argument("--json", action="store_true", help="print the rows as JSON records")
    sw.add_argument("--client", help="client whose empty share and throughput the table shows "
                    "(default: the last bench client)")
    _outside_flag(sw)

    sw.add_argument("--backend", choices=["process", "ray"], default="process",
                    help="where runs go: a local process pool, or Ray (pdsim[ray])")
    sw.add_argument("--address", help="Ray cluster address (default: start a local Ray)")

    ex = sub.add_parser(
        "explore", help="sample the declared unknowns x seeds and show which values reproduce "
        "the reported figures, and what moves them",
        description="Sample the scenario's declared unknowns ({uniform|loguniform|choice: ..., "
        "nominal: x}) with a space-filling design, run every sample with every seed, and "
        "compare each run with the scenario's reference figures and their bands. Runs are "
        "stored one by one under OUT/runs.parquet/; rerunning resumes.",
        epilog=EXPLORE_EPILOG, formatter_class=RAW)
    ex.add_argument("scenario", help="scenario YAML file declaring the unknowns to sample")
    ex.add_argument("--samples", type=int, default=64, help="design points (default 64)")
    ex.add_argument("--seeds", type=int, default=2, help="seeds 1..N per point (default 2)")
    ex.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="override (KEY=value pins an unknown; "
                    "'KEY={uniform: [a, b], nominal: x}' declares one)")
    ex.add_argument("--design", choices=["sobol", "lhs"], default="sobol",
                    help="scrambled Sobol (default; more samples extend the same sequence) or "
                    "Latin hypercube")
    ex.add_argument("--design-seed", type=int, default=0, help="seed of the design (default 0)")
    ex.add_argument("--out", metavar="DIR", help="results directory (default: "
                    "explore-<scenario name>); runs.parquet/, tables and figures go there")
    ex.add_argument("--workers", type=int, help="processes (default: one per core)")
    ex.add_argument("--backend", choices=["process", "ray"], default="process",
                    help="a local process pool, or Ray (pip install -e '.[ray]')")
    ex.add_argument("--address", help="Ray cluster address (default: start a local Ray)")
    ex.add_argument("--no-figures", action="store_true", help="skip the PNG figures")

    _outside_flag(ex)

    sc = sub.add_parser("schema", help="print the JSON Schema of the scenario format",
                        description="Print the JSON Schema of the scenario format (for "
                        "editors: completion and checking).", epilog=SCHEMA_EPILOG,
                        formatter_class=RAW)
    wi = sub.add_parser("whatif", help="blacklist policies x fault library x seeds: a "
                        "decision table", description=WHATIF, formatter_class=_WhatIfHelp,
                        epilog=WHATIF_EPILOG)
    wi.add_argument("scenario", help="base scenario (its blacklist and faults are replaced), "
                    "e.g. scenarios/whatif_base.yaml")
    wi.add_argument("--policy", dest="policies", action="append", default=[],
                    metavar="NAME[:KEY=V1,V2...]", help="a policy and its parameter grid "
                    "(repeatable)")
    wi.add_argument("--faults", default="all", metavar="NAME,NAME|all",
                    help="library faults to run (default: all)")
    wi.add_argument("--faults-file", metavar="FILE", help="YAML: fault-set name -> a fault "
                    "(or a list); replaces --faults")
    wi.add_argument("--seeds", type=int, default=3, help="seeds 1..N per policy and fault")
    wi.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="override a base-scenario value (repeatable)")
    wi.add_argument("--workers", type=int, help="processes (default: one per core)")
    wi.add_argument("--backend", choices=["process", "ray"], default="process",
                    help="a local process pool, or Ray (pip install -e '.[ray]')")
    wi.add_argument("--address", help="Ray cluster address (default: start a local Ray)")
    _outside_flag(wi)
    wi.add_argument("--out", metavar="DIR", help="write table, ranking, runs, healthy, "
                    "timelines and columns.json (and --plots) into DIR")
    wi.add_argument("--format", metavar="csv,parquet,json",
                    help="table formats for --out (comma-separated; default csv)")
    wi.add_argument("--plots", action="store_true", help="with --out: heatmap.png, "
                    "timeline_<fault>.png, vs_<param>.png")
    wi.add_argument("--timeline", metavar="FAULT", help="fault whose recovery timelines to "
                    "plot (default: the one where the policies differ most)")
    wi.add_argument("--param", metavar="KEY", help="policy parameter to plot goodput against "
                    "(default: the first one a grid varies)")
    wi.add_argument("--json", action="store_true", help="print table, ranking and column "
                    "meanings as JSON")
    fl = sub.add_parser("faults", help="list the fault kinds and the fault library",
                        description="Fault kinds (faults: items, kind: selects one) and the "
                        "library presets (faults: [{preset: NAME}]) that pdsim whatif runs.",
                        formatter_class=RAW)
    for sp in (r, v, sw, ex, sc, wi, fl):
        sp.add_argument("--plugin", dest="plugins", action="append", default=[],
                        metavar="MODULE|FILE.py", help="import a .py file, or a module or "
                        "package by name as `import MODULE` finds it (not a folder), that "
                        "registers policies or faults (pdsim.config.registry) before reading the "
                        "scenario")
    pr = sub.add_parser(
        "profiles", help="list the GPU, model and engine profiles and their sources",
        description="Without arguments: the shipped profiles. NAME: one profile, every value "
        "with its source. --scenario: the values a scenario runs with (its profile files, "
        "calibration and overrides applied) and where each came from.",
        epilog=PROFILES_EPILOG, formatter_class=RAW)
    pr.add_argument("name", nargs="?", help="show one profile with every value's source")
    pr.add_argument("--scenario", help="show what this scenario's fleet runs with")
    pr.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="with --scenario: overrides, e.g. gpu.hbm_tbps=3.0")
    _outside_flag(pr)

    ca = sub.add_parser(
        "calibrate", help="fit the step-time model's efficiency and overhead values to "
        "measurements and write a profile file",
        description="DATA.csv: bench_one_batch-style step rows (phase, batch_size, input_len, "
        "step_ms; optional tp, dp, dp_attention, ep, tbo, expert_imbalance) and/or "
        "bench_serving rows (input_len, output_len, max_concurrency, ttft_ms and/or tpot_ms; "
        "optional request_rate, num_prompts, tp). Example: pdsim calibrate steps.csv --gpu H100 "
        "--model llama-3.1-8b --out h100_llama.yaml, then `profiles: [h100_llama.yaml]` in a "
        "scenario.")
    ca.add_argument("data", help="CSV table of measurements (a regular, uncompressed UTF-8 "
                    "file; at most 4 MB and 10,000 rows)")
    ca.add_argument("--gpu", required=True, help="GPU profile name")
    ca.add_argument("--model", required=True, help="model profile name")
    ca.add_argument("--engine", default="sglang", help="engine profile name (default sglang)")
    ca.add_argument("--fit", help="comma-separated keys to fit, e.g. gpu.gemm_eff,"
                    "engine.decode_step_ms (default: what the table's rows can pin down)")
    ca.add_argument("--profiles", action="append", default=[], metavar="FILE",
                    help="extra profile files (a GPU or model of your own)")
    ca.add_argument("--out", help="profile file to write (default: DATA.profile.yaml)")
    ca.add_argument("--plot", help="residual plot image, .png, .svg, .pdf, ... (default: "
                    "DATA.residuals.png)")

    vm = sub.add_parser(
        "validate-model", help="published measurements vs pdsim, per row (validation/)",
        description="Runs every case in validation/cases.yaml against validation/"
        "published.csv and prints published vs simulated vs error.")
    vm.add_argument("--case", action="append", default=[], help="only this case (repeatable)")
    vm.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="override applied to every case's scenario")
    vm.add_argument("--csv", help="also write the rows to this CSV")
    vm.add_argument("--holdout", action="store_true", help="also refit each shipped parameter "
                    "set without some of its rows (validation/holdout.yaml, pdsim calibrate's "
                    "fit) and print every row's held-out error next to its in-sample one")
    vm.add_argument("--write-readme", metavar="README", help="replace the table between the "
                    "validate-model markers in this file (implies --holdout)")
    return p


def _profiles(args: argparse.Namespace) -> int:
    from pdsim.config import scenario as scenario_mod
    from pdsim.model import profiles

    if not args.scenario:  # (these change what a scenario reads; a shipped profile has none)
        for opt, given in (("--set", args.sets),
                           ("--allow-outside-paths", args.allow_outside_paths)):
            if given:
                return _die(f"{opt} applies to a scenario's values; it needs --scenario FILE "
                            f"(pdsim profiles NAME shows a profile as shipped)")
    elif args.name:
        return _die(f"profiles {echo(args.name)} --scenario: give a profile NAME or --scenario "
                    f"FILE, not both")
    if args.scenario:
        try:
            sc = _load(args)
            res = profiles.for_scenario(sc)
        except (scenario_mod.ScenarioError, profiles.ProfileError) as err:
            return _die(str(err))
        print(f"{args.scenario}: {res.gpu.name} / {res.model.name} / {res.engine.name}"
              + ("  (calibrated)" if res.calibrated else ""))
        declared = {u.path: u for u in sc.unknowns}
        for key, (value, origin) in res.origins.items():
            if key == "model.fitted":
                continue
            if key in declared:  # chosen, not known: its range and why are in the scenario
                origin = f"declared unknown at its nominal ({declared[key].describe()})"
            print(f"  {key:<30}{value!s:<12}{origin}")
        return 0
    gpus, models = profiles.raw_gpus(), profiles.raw_models()
    engines = profiles.raw_engines()
    if args.name:
        entry = gpus.get(args.name) or models.get(args.name) or engines.get(args.name)
        if entry is None:
            return _die(f"no profile {echo(args.name)}; GPUs: {', '.join(sorted(gpus))}; models: "
                        f"{', '.join(sorted(models))}; engines: {', '.join(sorted(engines))}")
        for k, v in entry.items():
            if k == "fitted" and isinstance(v["value"], dict):
                print(f"{k}:")
                for g, coeffs in v["value"].items():
                    print(f"  {g}: " + ", ".join(f"{c}={x:g}" for c, x in coeffs.items()))
                continue
            print(f"{k:<24}{v['value']!s:<12}{v['source']}")
        return 0
    print(f"{'GPU':<8}{'BF16 TF':>9}{'FP8 TF':>8}{'HBM GB':>8}{'HBM TB/s':>10}{'NVLink GB/s':>13}"
          f"{'NIC Gb/s':>10}")
    for g in profiles.gpu_names():
        x = profiles.gpu(g)
        print(f"{g:<8}{x.bf16_tflops:>9g}{x.fp8_tflops:>8g}{x.hbm_gb:>8g}{x.hbm_tbps:>10g}"
              f"{x.nvlink_gbps:>13g}{x.nic_gbps:>10g}")
    print(f"\n{'model':<24}{'attn':>5}{'layers':>7}{'experts':>8}{'active B':>9}{'total B':>8}"
          f"{'weights':>8}{'KV B/token':>11}")
    for m in profiles.model_names():
        x = profiles.model(m)
        experts = f"{x.experts_per_token}/{x.experts}" if x.is_moe else "-"
        print(f"{m:<24}{x.attention:>5}{x.layers:>7}{experts:>8}{x.params_active / 1e9:>9.1f}"
              f"{x.params_total / 1e9:>8.1f}{x.weight_dtype:>8}{x.kv_bytes_per_token:>11,}")
    print("\nengines: " + ", ".join(profiles.engine_names())
          + "; calibrated (GPU / model / engine): "
          + ", ".join("/".join(k) for k in profiles.calibrated()))
    print("pdsim profiles NAME shows every value with its source; --scenario FILE shows what a "
          "scenario runs with and where each value came from.")
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from pdsim.model import calibrate

    try:  # the table first (a path with no file name, '', '.', '/', has no stem to name
        # the outputs after), then the output paths, all before the fit
        rows = calibrate.read_table(args.data)
        stem = Path(args.data).with_suffix("")
        out = Path(args.out or f"{stem}.profile.yaml")
        plot = Path(args.plot or f"{stem}.residuals.png")
        _check_output_file(str(out), "--out")
        _check_output_file(str(plot), "--plot")
        kinds = calibrate.plot_formats()
        if plot.suffix[1:].lower() not in kinds:
            raise UsageError(f"--plot {show_path(plot)}: give a file name ending in an image "
                             f"format ({', '.join('.' + k for k in sorted(kinds))})")
        keys = [k.strip() for k in args.fit.split(",")] if args.fit else None
        fit = calibrate.fit(rows, args.gpu, args.model, args.engine, keys,
                            tuple(args.profiles), source=args.data)
    except (calibrate.CalibrationError, ValueError, UsageError) as err:
        return _die(str(err))
    try:
        out.write_text(fit.profile_yaml())
        calibrate.residual_plot(fit, plot)
    except OSError as err:
        return _die(f"cannot write ({err.strerror or type(err).__name__}): "
                    f"{show_path(err.filename or out)}")
    print(f"fitted {len(fit.params)} value(s) of {args.gpu} / {args.model} / {args.engine} to "
          f"{len(fit.rows)} measurement(s):")
    ends = fit.at_bounds()
    for k, v in fit.params.items():
        note = f"   at its {ends[k]}" if k in ends else ""
        print(f"  {k:<28}{fit.start[k]:>10.4g} -> {v:.4g}{note}")
    if ends:
        print(f"note: the fit pushed {', '.join(ends)} to the end of the allowed range, and "
              f"other values made up the rest: the model cannot reach these rows through "
              f"{'it' if len(ends) == 1 else 'them'}. Check the rows' layout columns (tp, dp, "
              f"ep, ...) and the GPU and model profile values, or --fit other values.")
    print()
    print(calibrate.text_residuals(fit))
    print(f"\nmedian |error| {fit.median_abs_error:.1%}")
    import os

    # (its GPU or model may be defined in --profiles' files; a scenario names files relative
    # to itself: say it for a scenario beside the written profile)
    rel = [os.path.relpath(f, out.parent or ".") for f in args.profiles]
    outside = ("; a file outside that folder needs --allow-outside-paths, or a copy inside"
               if any(r.startswith("..") for r in rel) else "")
    print(f"wrote {out} (load it from a scenario in {show_path(out.parent)} with `profiles: "
          f"[{', '.join([*rel, out.name])}]`{outside})", file=sys.stderr)
    print(f"wrote {plot}", file=sys.stderr)
    return 0


def _validate_model(args: argparse.Namespace) -> int:
    from pathlib import Path

    import pandas as pd

    from pdsim.analysis import holdout, validation
    from pdsim.config import scenario as scenario_mod

    do_holdout = args.holdout or bool(args.write_readme)
    if do_holdout and args.sets:
        return _die("--holdout (and --write-readme) refit the shipped parameter sets; they do "
                    "not take --set")
    try:  # the output paths are checked before the refit, not after it
        if args.csv:
            _check_output_file(args.csv, "--csv")
        if args.write_readme:
            _check_readme(args.write_readme)
    except UsageError as err:
        return _die(str(err))
    try:
        if do_holdout:
            if args.write_readme and not args.holdout:
                print("--write-readme: refitting for the held-out columns (--holdout)",
                      file=sys.stderr)
            ho = holdout.run(args.case or None, progress=sys.stderr.isatty())
            df = ho.table
        else:
            df = validation.validate(args.case or None, extra_sets=args.sets,
                                     progress=sys.stderr.isatty())
            if not args.sets:
                df = holdout.mark(df)
    except (scenario_mod.ScenarioError, ValueError) as err:
        return _die(str(err))
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        shown = df.assign(error=[validation.shown_error(e, m)
                                 for e, m in zip(df.error, df.metric, strict=True)])
        drop = ["unit", "source", "fitted_in"]
        if do_holdout:
            shown = shown.assign(held_out_error=[
                "" if pd.isna(e) else validation.shown_error(e, m)
                for e, m in zip(df.held_out_error, df.metric, strict=True)])
        print(shown.drop(columns=[c for c in drop if c in shown]).to_string(index=False))
    s = validation.summary(df)
    print(f"\n{s['rows']} rows: median |error| {s['median_abs_error']:.1%}, max "
          f"{s['max_abs_error']:.1%}, {s['within_25pct']} within +-25%")
    if "row" in df:
        print("\n".join(holdout.summary_lines(df)))
    if do_holdout:
        print("\nrefitted with pdsim calibrate on each split's rows (shipped -> refitted):")
        print(holdout.fits_text(ho.splits))
    try:
        if args.csv:
            df.to_csv(args.csv, index=False)
            print(f"wrote {show_path(args.csv)}", file=sys.stderr)
        if args.write_readme:
            validation.write_readme(df, Path(args.write_readme))
            print(f"wrote the table into {show_path(args.write_readme)}", file=sys.stderr)
    except OSError as err:
        return _die(f"cannot write ({err.strerror or type(err).__name__}): "
                    f"{show_path(err.filename or args.csv or args.write_readme)}")
    return 0


def _check_readme(path: str) -> None:
    """``validate-model --write-readme FILE``: a file holding the validate-model markers."""
    from pdsim.analysis import validation

    p = Path(path)
    if not p.is_file():
        raise UsageError(f"--write-readme {show_path(path)}: not a file; give the README whose "
                         f"table to refresh")
    try:
        text = read_user_file(p, "--write-readme", max_bytes=4 << 20).decode("utf-8", "replace")
    except UserFileError as err:
        raise UsageError(str(err)) from None
    if validation.README_BEGIN not in text or validation.README_END not in text:
        raise UsageError(f"--write-readme {show_path(path)}: no {validation.README_BEGIN} ... "
                         f"{validation.README_END} block to replace (add the two markers "
                         f"where the table goes)")


def _parse_vary(items: list[str]) -> dict[str, list]:
    from pdsim.analysis.sweep import same_value
    from pdsim.config import scenario as scenario_mod

    vary: dict[str, list] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key or not raw:
            raise UsageError(f"--vary expects KEY=V1,V2,..., got {echo(item)}")
        what = f"--vary {clip(key, 80)}"
        if key in vary:  # (the later one replaced the earlier)
            raise UsageError(f"{what}: given twice; give its values once, V1,V2,...")
        vary[key] = []
        for v in raw.split(","):
            if not v.strip():  # (YAML would read it as null)
                raise UsageError(f"{what}: an empty value in {echo(raw)}; give V1,V2,... "
                                 f"with a value between each pair of commas")
            value = scenario_mod.parse_yaml(v, what)
            for was, prev in zip(raw.split(","), vary[key], strict=False):
                if same_value(value, prev):  # (the grid ran it twice, one merged table row)
                    again = ("given twice" if was.strip() == v.strip() else
                             f"is {echo(was.strip())} again (the same value)")
                    raise UsageError(f"{what}: {echo(v.strip())} {again} in {echo(raw)}; give "
                                     f"each value once")
            vary[key].append(value)
        if key == "seed":  # (each run's seed, from --seeds, replaced it)
            raise UsageError(f"{what}: the seeds are --seeds N (1..N per grid point); vary "
                             f"another key")
    return vary


def _check_sweep_args(args: argparse.Namespace, grid_points: int) -> None:
    if not 1 <= args.seeds <= MAX_SEEDS:
        raise UsageError(f"--seeds {args.seeds}: give 1..{MAX_SEEDS:,} (runs seeds 1..N per "
                         f"grid point)")
    _check_workers(args)
    runs = grid_points * args.seeds
    if runs > MAX_RUNS:
        raise UsageError(f"the sweep has {runs:,} runs (grid points x seeds); at most "
                         f"{MAX_RUNS:,}")
    if args.out:
        _check_output_file(args.out, "--out")


def _check_workers(args: argparse.Namespace) -> None:
    try:
        check_workers(args.workers, args.backend)
    except ValueError as err:
        raise UsageError(f"--{err}") from None


def _check_explore_args(args: argparse.Namespace) -> None:
    """Bounds of ``explore``'s own options, before anything is loaded or run."""
    if not 1 <= args.samples <= MAX_RUNS:
        raise UsageError(f"--samples {args.samples}: give 1..{MAX_RUNS:,} design points")
    if not 1 <= args.seeds <= MAX_SEEDS:
        raise UsageError(f"--seeds {args.seeds}: give 1..{MAX_SEEDS:,} (runs seeds 1..N per "
                         f"design point)")
    if args.samples * args.seeds > MAX_RUNS:
        raise UsageError(f"the exploration has {args.samples * args.seeds:,} runs (samples x "
                         f"seeds); at most {MAX_RUNS:,}")
    _check_workers(args)
    if args.design_seed < 0:
        raise UsageError(f"--design-seed {args.design_seed}: give a non-negative integer")


def _check_output_file(out: str, option: str) -> None:
    """An output file named by ``option`` (sweep --out, run --perfetto, validate-model --csv):
    checked before the work that fills it."""
    p = Path(out)
    if p.is_dir():
        raise UsageError(f"{option} {show_path(out)}: is a directory; give a file name")
    if not p.parent.is_dir():
        raise UsageError(f"{option} {show_path(out)}: directory {show_path(p.parent)} does "
                         f"not exist")


def _prepare_out_dir(out: str) -> None:
    """``run --out DIR``: an existing directory or one we can create, before the run."""
    p = Path(out)
    if p.exists() and not p.is_dir():
        raise UsageError(f"--out {show_path(out)}: exists and is not a directory")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"--out {show_path(out)}: cannot create the directory "
                         f"({err.strerror or type(err).__name__})") from None


def _sweep(args: argparse.Namespace) -> int:
    import pandas as pd

    from pdsim.analysis.sweep import sweep
    from pdsim.config import scenario as scenario_mod

    try:
        vary = _parse_vary(args.vary)
        points = 1
        for values in vary.values():
            points *= len(values)
        _check_sweep_args(args, points)
        data = scenario_mod.read_yaml(args.scenario, allow_outside_paths=args.allow_outside_paths)
        sc = scenario_mod.load(data, args.sets)
        benches = [c.name for c in sc.clients if c.kind == "bench"] or [sc.clients[-1].name]
        main_client = benches[-1] if args.client is None else args.client
        if main_client not in {c.name for c in sc.clients}:  # before the runs, not after
            raise UsageError(f"--client {echo(main_client)}: no such client; the scenario has "
                             f"{', '.join(c.name for c in sc.clients)}")
        df = sweep(data, vary, range(1, args.seeds + 1), args.workers,
                   progress=sys.stderr.isatty(), backend=args.backend, address=args.address,
                   sets=args.sets)
    except (scenario_mod.ScenarioError, UsageError) as err:
        return _die(str(err))
    if args.out:
        try:
            df.to_csv(args.out, index=False)
        except OSError as err:
            return _die(f"--out {show_path(args.out)}: cannot write "
                        f"({err.strerror or type(err).__name__})")
        print(f"wrote {show_path(args.out)}", file=sys.stderr)
    if args.json:
        print(df.to_json(orient="records", indent=2))
        return 0
    cols = {"transfer_failures.flush_freed_pages": "ret!=0", "blacklisted_pairs_max": "pairs",
            "failed": "failed", f"{main_client}.empty_share": "empty",
            f"{main_client}.true_output_throughput_tok_s": "gen tok/s",
            "blacklisted_pairs_final": "pairs end"}
    keys = list(vary) or ["seed"]
    table = df.groupby(keys, sort=False)[list(cols)].median().rename(columns=cols)
    nominal = [u for u in sc.unknowns if u.path not in vary]
    with pd.option_context("display.width", 160, "display.max_columns", 20):
        if nominal:
            print("at nominal (declared unknowns not varied): " + "; ".join(
                f"{u.path}={u.nominal} ({u.describe()})" for u in nominal))
        print(f"median over {args.seeds} seed(s); empty and gen tok/s are {main_client}'s")
        print(table.round(3).to_string())
    print("\n" + SWEEP_COLUMNS.replace("--client's", f"{main_client}'s")
          .replace("--client", main_client).split("\n--out")[0])
    return 0


def _explore(args: argparse.Namespace) -> int:
    import signal
    from pathlib import Path

    from pdsim.analysis.explore import explore, render, write_tables
    from pdsim.config import scenario as scenario_mod

    def _stop(signum: int, frame: object) -> None:  # SIGTERM: stop cleanly, runs are stored
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)
    out = None
    try:
        _check_explore_args(args)
        data = scenario_mod.read_yaml(args.scenario, allow_outside_paths=args.allow_outside_paths)
        name = scenario_mod.load(scenario_mod.apply_overrides(data, args.sets)).name
        # (a name is free text: its slashes must not lead the default directory elsewhere)
        out = Path(args.out or "explore-" + name.replace("/", "_").replace("\\", "_"))
        ex = explore(data, args.samples, args.seeds, args.sets, args.design, args.design_seed,
                     out, args.backend, args.workers, args.address, progress=sys.stderr.isatty())
    except (scenario_mod.ScenarioError, UsageError, ValueError) as err:
        return _die(str(err))
    except OSError as err:
        return _die(f"--out {show_path(out) if out else ''}: cannot write "
                    f"({err.strerror or type(err).__name__})")
    except KeyboardInterrupt:
        where = f"in {show_path(out / 'runs.parquet')} " if out else ""
        print(f"pdsim: interrupted; finished runs are stored {where}and the same command "
              "resumes", file=sys.stderr)
        return 130
    import pandas as pd

    with pd.option_context("display.width", 200, "display.max_columns", 40):
        print(render(ex))
    written = write_tables(ex, out)
    if not args.no_figures:
        from pdsim.analysis import explore_plots

        written += explore_plots.save(ex, out)
    print(f"wrote {', '.join(p.name for p in written)} in {show_path(out)}", file=sys.stderr)
    return 0


def _legend() -> str:
    from pdsim.analysis.whatif import legend

    return legend().replace("columns:", "table columns (each a median over seeds, with _lo/_hi "
                            "the 10th/90th percentiles):", 1)


def _parse_policy(spec: str) -> dict:
    from pdsim.config import scenario as scenario_mod

    name, *params = spec.split(":")
    out: dict = {"policy": name}
    for item in params:
        key, sep, raw = item.partition("=")
        if not sep or not key or not raw:
            raise UsageError(f"--policy expects NAME[:KEY=V1,V2...], got {echo(spec)}")
        what = f"--policy {clip(name, 40)}:{clip(key, 40)}"
        if key == "policy":  # (it replaced NAME)
            raise UsageError(f"{what}: the policy is NAME, before the first colon")
        if key in out:  # (the later one replaced the earlier)
            raise UsageError(f"{what}: given twice; give its values once, KEY=V1,V2,...")
        if any(not v.strip() for v in raw.split(",")):  # (YAML would read it as null)
            raise UsageError(f"{what}: an empty value in {echo(raw)}; give V1,V2,... with a "
                             f"value between each pair of commas")
        values = [scenario_mod.parse_yaml(v, what) for v in raw.split(",")]
        out[key] = values if len(values) > 1 else values[0]
    return out


def _names(raw: str, opt: str) -> list[str]:
    """A comma-separated list (whatif --faults, --format): no empty item (it was dropped) and
    none twice (a fault given twice ran twice; a format, wrote its tables twice)."""
    items = [x.strip() for x in raw.split(",")]
    for i, x in enumerate(items):
        if not x:
            raise UsageError(f"{opt}: an empty name in {echo(raw)}; give NAME,NAME,... with a "
                             f"name between each pair of commas")
        if x in items[:i]:
            raise UsageError(f"{opt}: {echo(x)} given twice in {echo(raw)}; give each once")
    return items


def _faults_file(path: str) -> dict:
    """``whatif --faults-file``: read like a scenario file (regular file, size limit, the
    bounded YAML parser), not followed anywhere else."""
    from pdsim.config import scenario as scenario_mod

    try:
        text = read_user_file(path, "--faults-file", max_bytes=scenario_mod.MAX_FILE_BYTES)
    except UserFileError as err:
        raise UsageError(str(err)) from None
    data = scenario_mod.parse_yaml(text.decode("utf-8", "replace"), f"--faults-file {path}")
    if not isinstance(data, dict) or not data:
        raise UsageError(f"--faults-file {show_path(path)}: expected a mapping of fault-set "
                         f"name -> fault or list of faults")
    return data


def _check_whatif_args(args: argparse.Namespace, policies: list[dict], n_faults: int) -> None:
    """Bounds on the matrix, before anything is expanded or run."""
    if not 1 <= args.seeds <= MAX_SEEDS:
        raise UsageError(f"--seeds {args.seeds}: give 1..{MAX_SEEDS:,} (runs seeds 1..N per "
                         f"policy and fault)")
    _check_workers(args)
    points = 0
    for p in policies:
        n = 1
        for v in p.values():
            n *= len(v) if isinstance(v, list) else 1
        points += n
    runs = args.seeds * (1 + points * (1 + n_faults))  # (at most: healthy runs per policy)
    if runs > MAX_RUNS:
        raise UsageError(f"--policy x --faults x --seeds: {runs:,} runs; at most {MAX_RUNS:,}")


def _whatif(args: argparse.Namespace) -> int:
    from pdsim.analysis.whatif import COLUMNS, STATS_NOTE, whatif
    from pdsim.config import scenario as scenario_mod
    from pdsim.config.registry import BLACKLIST_POLICIES, FAULTS

    try:
        policies = [_parse_policy(p) for p in args.policies] or BLACKLIST_POLICIES.names()
        if args.faults_file:
            faults = _faults_file(args.faults_file)
        elif args.faults == "all":
            faults = None
        else:
            faults = _names(args.faults, "--faults")
        _check_whatif_args(args, [p if isinstance(p, dict) else {"policy": p}
                                  for p in policies],
                           len(FAULTS.presets) if faults is None else len(faults))
        if args.timeline and not args.plots:
            raise UsageError("--timeline picks the fault of --plots' timeline figure; add --plots")
        if args.param and not args.plots:
            raise UsageError("--param picks the parameter of --plots' figure; add --plots")
        if args.plots and not args.out:
            raise UsageError("--plots writes PNGs into --out DIR; add --out")
        if args.format and not args.out:
            raise UsageError("--format picks the table formats of --out DIR; add --out")
        names = list(FAULTS.presets) if faults is None else list(faults)
        if args.timeline and args.timeline not in names:
            raise UsageError(f"--timeline {echo(args.timeline)}: not a fault of this matrix; "
                             f"give one of: {', '.join(map(str, names))}")
        keys = sorted({k for p in policies if isinstance(p, dict) for k in p} - {"policy"})
        if args.param and args.param not in keys:
            raise UsageError(f"--param {echo(args.param)}: not a parameter given with --policy"
                             f"{'; give one of: ' + ', '.join(keys) if keys else ''}")
        formats = _names(args.format or "csv", "--format")
        for fmt in formats:
            if fmt not in ("csv", "parquet", "json"):
                raise ValueError(f"--format {fmt!r}: csv, parquet or json")
        if args.out:  # before the matrix runs, not after it
            _prepare_out_dir(args.out)
        if "parquet" in formats:
            try:
                import pyarrow  # noqa: F401
            except ImportError:
                raise ValueError("--format parquet needs pyarrow: pip install -e "
                                 "'.[parquet]'") from None
        w = whatif(args.scenario, policies, faults, range(1, args.seeds + 1), args.workers,
                   progress=sys.stderr.isatty(), sets=args.sets, plugins=args.plugins,
                   command="pdsim " + " ".join(sys.argv[1:]), backend=args.backend,
                   address=args.address, allow_outside_paths=args.allow_outside_paths)
    except (scenario_mod.ScenarioError, UsageError) as err:
        return _die(str(err))
    except (ValueError, KeyError, FileNotFoundError) as err:
        return _die(str(err).strip("'\""))
    if args.out:
        for path in w.write(args.out, formats):
            print(f"wrote {path}", file=sys.stderr)
        if args.plots:
            for path in _whatif_plots(w, args):
                print(f"wrote {path}", file=sys.stderr)
    if args.json:
        print(json.dumps({"table": json.loads(w.table.to_json(orient="records")),
                          "ranking": json.loads(w.ranking.to_json(orient="records")),
                          "columns": COLUMNS, "statistics": STATS_NOTE}, indent=1))
    else:
        print(w.render())
    return 0


def _whatif_plots(w: object, args: argparse.Namespace) -> list:
    from pathlib import Path

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(args.out)
    paths = []
    ax = w.heatmap()
    ax.figure.savefig(out / "heatmap.png", dpi=90)
    paths.append(out / "heatmap.png")
    fault = args.timeline or w.telling_fault()
    ax = w.timelines(fault)
    ax.figure.savefig(out / f"timeline_{fault}.png", dpi=90)
    paths.append(out / f"timeline_{fault}.png")
    params = [k for _lbl, sec in w.policies for k in sec if k != "policy"]
    param = args.param or next((k for k in params if params.count(k) > 1), None)
    if param:
        ax = w.vs_param(param)
        ax.figure.savefig(out / f"vs_{param}.png", dpi=90)
        paths.append(out / f"vs_{param}.png")
    plt.close("all")
    return paths


def _faults_list() -> int:
    from pdsim.config.registry import FAULTS

    print("fault kinds (faults: [{kind: NAME, ...}]; pdsim schema lists every key):")
    for e in FAULTS.entries():
        print(f"  {e.name:<20}{e.doc}")
    print("\nlibrary (faults: [{preset: NAME}], other keys override; pdsim whatif runs these):")
    for name, (spec, doc) in FAULTS.presets.items():
        shown = ", ".join(f"{k}: {v}" for k, v in spec.items())
        print(f"  {name:<20}{{{shown}}}\n  {'':<20}{doc}")
    return 0


def _load(args: argparse.Namespace) -> Scenario:
    from pdsim.config import scenario as scenario_mod

    sets = list(args.sets)
    if getattr(args, "seed", None) is not None:
        sets.append(f"seed={args.seed}")
    return scenario_mod.load(args.scenario, sets, allow_outside_paths=args.allow_outside_paths)


def main(argv: list[str] | None = None) -> int:
    """Entry point; user errors exit 2, an unexpected exception 70 (one line each)."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("pdsim: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `pdsim run ... | head`
        try:
            sys.stdout = open(os.devnull, "w")  # no second error when Python flushes at exit
        except OSError:
            pass
        return 0
    except MemoryError:
        return _die("out of memory; shorten the run (num_prompts, horizon_s) or the sweep")
    except Exception as err:  # last resort: a bug, not a user error
        if _interrupted(err):
            print("pdsim: interrupted", file=sys.stderr)
            return 130
        if os.environ.get("PDSIM_DEBUG"):
            raise
        print(f"pdsim: internal error: {type(err).__name__}: {clip(str(err), 200)}; this is a "
              f"bug in pdsim; please report it (PDSIM_DEBUG=1 shows the traceback)",
              file=sys.stderr)
        return 70


def _interrupted(err: BaseException) -> bool:
    """Ctrl-C wrapped in another exception: Python reports one that lands while a class is
    being built (an import) as RuntimeError('Error calling __set_name__ ...') from it."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, KeyboardInterrupt):
            return True
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return False


# options whose empty value (--out '') read as not given: the run went on and wrote nothing
_NOT_EMPTY = ("out", "perfetto", "csv", "plot", "write_readme", "faults_file", "scenario",
              "timeline", "param", "format", "address", "fit")


def _main(argv: list[str] | None) -> int:
    args = _parser().parse_args(argv)
    for opt in _NOT_EMPTY:
        if getattr(args, opt, None) == "" and (opt != "scenario" or args.cmd == "profiles"):
            return _die(f"--{opt.replace('_', '-')}: an empty value; give one, or leave the "
                        f"option out")
    from pdsim.config import scenario as scenario_mod
    from pdsim.config.registry import load_plugin

    try:
        for plugin in getattr(args, "plugins", []):
            load_plugin(plugin)
    except ValueError as err:
        return _die(str(err))
    if args.cmd == "schema":
        print(json.dumps(scenario_mod.json_schema(), indent=2))
        return 0
    if args.cmd == "sweep":
        return _sweep(args)
    if args.cmd == "explore":
        return _explore(args)
    if args.cmd == "whatif":
        return _whatif(args)
    if args.cmd == "faults":
        return _faults_list()
    if args.cmd == "profiles":
        return _profiles(args)
    if args.cmd == "calibrate":
        return _calibrate(args)
    if args.cmd == "validate-model":
        return _validate_model(args)
    try:
        if args.cmd == "run" and args.format and not args.out:  # not silently ignored
            raise UsageError("--format picks the table format of --out DIR; add --out")
        sc = _load(args)
        if args.cmd == "run" and args.out:
            _prepare_out_dir(args.out)
        if args.cmd == "run" and args.perfetto:
            _check_output_file(args.perfetto, "--perfetto")
    except (scenario_mod.ScenarioError, UsageError) as err:
        return _die(str(err))
    if args.cmd == "validate":
        print(f"{show_path(args.scenario)}: ok ({sc.name}, {len(sc.clients)} client(s), "
              f"horizon {sc.horizon_s:g} s)")
        from pdsim.model.memory import kv_pools

        pools = kv_pools(sc)
        how = {role: ("kv_pool_tokens" if cfg.kv_pool_tokens is not None else
                      f"mem_fraction_static {cfg.mem_fraction_static:g} after weights")
               + (f", in whole {cfg.page_size}-token pages" if cfg.page_size > 1 else "")
               for role, cfg in (("prefill", sc.fleet.prefill), ("decode", sc.fleet.decode))}
        print("KV pool per DP rank (SGLang's max_total_num_tokens): " + ", ".join(
            f"{role} {tokens:,} tokens ({how[role]})" for role, tokens in pools.items()))
        if sc.unknowns:  # each range end (or choice) was validated as a value of its own
            print(f"{len(sc.unknowns)} declared unknown(s); run uses the nominal, explore "
                  f"samples the range (validated at its ends, and at every value of a short "
                  f"integer range):")
            for u in sc.unknowns:
                print(f"  {u.path}: {u.describe()}, nominal {u.nominal}")
        return 0

    from pdsim.engine.sim import run
    from pdsim.output import report

    if args.format == "parquet" and args.out:
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            return _die("--format parquet needs pyarrow: pip install -e '.[parquet]'")
    try:
        progress = (True if args.progress else False if args.no_progress
                    else PROGRESS_AFTER_S if sys.stderr.isatty() else False)
        res = run(sc, progress=progress, record_steps=bool(args.perfetto))
    except (ValueError, FileNotFoundError) as err:
        return _die(str(err))
    if args.out:
        try:
            written = res.write(args.out, args.format or "csv")
        except OSError as err:
            return _die(f"--out {show_path(args.out)}: cannot write "
                        f"({err.strerror or type(err).__name__})")
        for path in written:
            print(f"wrote {show_path(path)}", file=sys.stderr)
    if args.perfetto:
        from pdsim.output import perfetto

        try:
            path = perfetto.write(res, args.perfetto)
        except OSError as err:
            return _die(f"--perfetto {show_path(args.perfetto)}: cannot write "
                        f"({err.strerror or type(err).__name__})")
        print(f"wrote {show_path(path)} (open it in https://ui.perfetto.dev)", file=sys.stderr)
    summary = res.summary  # (stdout is the same bytes for the same scenario and seed: the
    # wall time goes to stderr, as summary.json leaves it out)
    if args.json:
        print(json.dumps(summary, indent=2, sort_keys=True))
        for line in report.horizon_warning(res):  # the JSON has it too: stopped_at_horizon
            print(line, file=sys.stderr)
        for line in report.not_reached_warning(res):  # (on stderr only: no summary key)
            print(line, file=sys.stderr)
    else:
        print(report.render(res, verbose=args.verbose))
    sys.stdout.flush()
    print(f"simulated {summary['simulated_s']} s in {round(res.sim_wall_s, 3)} s wall "
          f"({res.scheduled} scheduled entries, of which {summary['events']} SimPy "
          f"events)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

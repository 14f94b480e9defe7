"""``pdsim sweep`` (a grid of overrides x seeds) and ``pdsim explore`` (the declared unknowns
sampled x seeds, against the reported figures)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pdsim.cli.common import (
    MAX_SEEDS,
    RAW,
    Output,
    UsageError,
    check_outputs,
    check_worker_args,
    die,
    inputs,
    outside_flag,
)
from pdsim.util.backends import MAX_RUNS
from pdsim.util.safeio import clip, echo, show_path, why

# what each column of the table means, by header (the help shows all; a sweep, its own)
INCIDENT_COLUMNS = {
    "ret!=0": "transfers that failed with ret != 0 because a flush freed pages under them "
              "(summary key transfer_failures_by_reason.flush_freed_pages); under the "
              "one-strike blacklist each one blacklists its (prefill rank, decode session) pair",
    "pairs": "most pairs blacklisted at once (blacklisted_pairs_max)",
    "failed": "requests of all clients answered with a 5xx or an abort (failed)",
    "unanswered": "requests of all clients with no answer when the run ended (unfinished): "
                  "in flight at the horizon, or stuck for ever where the run stalled "
                  "(incident.stuck_requests); a run that leaves requests stuck fails fewer",
    "empty": "share of --client's requests that got no token (<client>.empty_share)",
    "gen tok/s": "--client's generated tokens per second, aborts counting 0, unlike "
                 "bench_serving's printed figure (<client>.true_output_throughput_tok_s)",
    "pairs end": "pairs still blacklisted when the run ended (blacklisted_pairs_final)",
}
CAPACITY_COLUMNS = {
    "offered/s": "--client's offered requests per second over the steady window (the second "
                 "half of its arrivals, no drain tail; <client>.steady.offered_req_s)",
    "done/s": "of them, completed per second (<client>.steady.completed_req_s)",
    "keeps up": "seeds whose fleet kept up with the offered load: its queue did not grow "
                "(<client>.steady.keeps_up; pdsim run explains the verdict)",
    "req/s": "--client's completed requests per second over the run (request_rate inf or a "
             "closed loop: no offered rate)",
    "TTFT p50": "--client's median time to first token, ms (<client>.median_ttft_ms)",
    "TTFT p99": "its 99th percentile (<client>.p99_ttft_ms)",
    "TPOT p50": "--client's median time per output token, ms (<client>.median_tpot_ms)",
    "TPOT p99": "its 99th percentile (<client>.p99_tpot_ms)",
    "E2E p99": "--client's 99th percentile end-to-end latency, ms (<client>.p99_e2e_ms)",
    "SLO met": "share of --client's requests that met the scenario's slo: "
               "(<client>.slo.attainment)",
    "goodput/s": "of them, completed per second (<client>.slo.goodput_req_s)",
    "tok/s": "--client's output tokens per second (without an slo:)",
}


def legend(columns: dict[str, str], shown: list[str] | None = None, client: str = "") -> str:
    """The meaning of each column (of those ``shown``), wrapped as the help prints it."""
    import textwrap

    out = []
    for header, text in columns.items():
        if shown is not None and header not in shown:
            continue
        if client:
            text = text.replace("--client's", f"{client}'s").replace("<client>", client)
        out += textwrap.wrap(text, 90, initial_indent=f"  {header:<11} ", break_on_hyphens=False,
                             subsequent_indent=" " * 14)
    return "\n".join(out)


SWEEP_COLUMNS = f"""\
table columns (median over the seeds of each grid point; those that fit the runs):
an incident (any run that pdsim run calls one, pdsim.engine.incident.is_incident: faults:,
operator_flushes:, a client's flush:, reported figures read from the incident block, or
dead rooms in the run) shows
{legend(INCIDENT_COLUMNS)}
a capacity question (anything else) shows
{legend(CAPACITY_COLUMNS)}
then each of the scenario's reported figures (reference:) under its metric's name.
--metrics NAME,... shows those summary metrics instead (names as --json gives them; a
client's as <client>.<name>: bench.p99_ttft_ms, bench.steady.keeps_up).
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
      --vary predictor.prefill_mfu=0.25,0.35,0.5 --seeds 1
  pdsim sweep scenarios/capacity/llama70b_h100.yaml --vary clients.0.request_rate=12,16,20,24
  pdsim sweep scenarios/capacity/llama70b_h100.yaml --vary fleet.decode.servers=1,2,3 \\
      --metrics bench.p90_ttft_ms,bench.p90_tpot_ms,bench.slo.attainment"""


EXPLORE_EPILOG = """\
examples:
  pdsim explore scenarios/drop_timeout.yaml --samples 64 --seeds 2
  pdsim explore scenarios/drop_timeout.yaml --samples 128    reuses the first 64 samples' runs
  pdsim explore my.yaml --set 'clients.0.start_s={uniform: [0, 30], nominal: 10}'
  pdsim explore my.yaml --backend ray --address auto          pip install -e '.[ray]'
Killed or interrupted, the same command resumes: stored runs are not run again."""


def add_sweep(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """``pdsim sweep``."""
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
    sw.add_argument("--client", help="client whose metrics the table shows (default: the "
                    "last bench client)")
    sw.add_argument("--metrics", metavar="NAME,...", help="show these summary metrics "
                    "instead of the columns that fit the scenario, e.g. "
                    "bench.p99_ttft_ms,bench.steady.keeps_up (names as --json gives them)")
    outside_flag(sw)

    sw.add_argument("--backend", choices=["process", "ray"], default="process",
                    help="where runs go: a local process pool, or Ray (pdsim[ray])")
    sw.add_argument("--address", help="Ray cluster address (default: start a local Ray)")
    return sw


def add_explore(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """``pdsim explore``."""
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

    outside_flag(ex)
    return ex


def _parse_vary(items: list[str]) -> dict[str, list]:
    from pdsim.analysis.sweep import same_value
    from pdsim.config import loader

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
            value = loader.parse_yaml(v, what)
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
    check_worker_args(args)
    runs = grid_points * args.seeds
    if runs > MAX_RUNS:
        raise UsageError(f"the sweep has {runs:,} runs (grid points x seeds); at most "
                         f"{MAX_RUNS:,}")


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
    check_worker_args(args)
    if args.design_seed < 0:
        raise UsageError(f"--design-seed {args.design_seed}: give a non-negative integer")


def sweep_cmd(args: argparse.Namespace) -> int:
    import pandas as pd

    from pdsim.analysis.sweep import check_metrics, default_columns, is_incident, sweep, table
    from pdsim.config import loader, units

    try:
        vary = _parse_vary(args.vary)
        points = 1
        for values in vary.values():
            points *= len(values)
        _check_sweep_args(args, points)
        data = loader.read_yaml(args.scenario, allow_outside_paths=args.allow_outside_paths)
        sc = loader.load(data, args.sets)
        check_outputs(inputs(sc, *args.plugins), Output("--out", args.out))
        benches = [c.name for c in sc.clients if c.kind == "bench"] or [sc.clients[-1].name]
        main_client = benches[-1] if args.client is None else args.client
        if main_client not in {c.name for c in sc.clients}:  # before the runs, not after
            raise UsageError(f"--client {echo(main_client)}: no such client; the scenario has "
                             f"{', '.join(c.name for c in sc.clients)}")
        if args.metrics is not None:
            names = [n.strip() for n in args.metrics.split(",")]
            if not all(names):
                raise UsageError(f"--metrics {echo(args.metrics)}: an empty name; give "
                                 f"NAME,NAME,... (pdsim sweep --help)")
            try:
                check_metrics(names, sc)
            except ValueError as err:
                raise UsageError(str(err)) from None
            columns = {n: n for n in names}
        df = sweep(data, vary, range(1, args.seeds + 1), args.workers,
                   progress=sys.stderr.isatty(), backend=args.backend, address=args.address,
                   sets=args.sets)
    except (units.ScenarioError, UsageError) as err:
        return die(str(err))
    if args.out:
        try:
            df.to_csv(args.out, index=False)
        except OSError as err:
            return die(f"--out {show_path(args.out)}: cannot write "
                       f"({why(err)})")
        print(f"wrote {show_path(args.out)}", file=sys.stderr)
    if args.json:
        print(df.to_json(orient="records", indent=2))
        return 0
    keys = list(vary) or ["seed"]
    incident = is_incident(sc, df)  # (from the runs, as pdsim run decides: dead rooms show
    # only once a run ran)
    if args.metrics is None:
        columns = default_columns(sc, main_client, df)
    shown = table(df, keys, columns)
    nominal = [u for u in sc.unknowns if u.path not in vary]
    with pd.option_context("display.width", 160, "display.max_columns", 30):
        if nominal:
            print("at nominal (declared unknowns not varied): " + "; ".join(
                f"{u.path}={u.nominal} ({u.describe()})" for u in nominal))
        if args.metrics is not None:
            print(f"median over {args.seeds} seed(s)")
        else:
            print(f"median over {args.seeds} seed(s); "
                  f"{'an incident' if incident else 'a capacity sweep'}: "
                  f"{main_client}'s metrics (--metrics NAME,... for others)")
        print(shown.round(3).to_string())
    if args.metrics is None:
        print("\n" + legend(INCIDENT_COLUMNS if incident else CAPACITY_COLUMNS,
                            list(shown.columns), main_client))
    return 0


def explore_cmd(args: argparse.Namespace) -> int:
    import signal

    def _stop(signum: int, frame: object) -> None:  # SIGTERM: stop cleanly, runs are stored
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGTERM, _stop)
    try:
        return _explore(args)
    finally:  # (the command returns: a caller's process gets its own handler back)
        signal.signal(signal.SIGTERM, before)


def _explore(args: argparse.Namespace) -> int:
    from pdsim.analysis.explore import WRITTEN, explore, render, write_tables
    from pdsim.config import loader, units

    out = None
    try:
        _check_explore_args(args)
        data = loader.read_yaml(args.scenario, allow_outside_paths=args.allow_outside_paths)
        sc = loader.load(loader.apply_overrides(data, args.sets))
        name = sc.name
        # (a name is free text: its slashes must not lead the default directory elsewhere)
        out = Path(args.out or "explore-" + name.replace("/", "_").replace("\\", "_"))
        check_outputs(inputs(sc, *args.plugins),
                      Output("--out", str(out), tuple(WRITTEN)))
        ex = explore(data, args.samples, args.seeds, args.sets, args.design, args.design_seed,
                     out, args.backend, args.workers, args.address, progress=sys.stderr.isatty())
    except (units.ScenarioError, UsageError, ValueError) as err:
        return die(str(err))
    except OSError as err:
        return die(f"--out {show_path(out) if out else ''}: cannot write "
                   f"({why(err)})")
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

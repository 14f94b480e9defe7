"""``pdsim run``, ``pdsim validate`` and ``pdsim schema``: one scenario, simulated, checked, or
its format printed."""

from __future__ import annotations

import argparse
import json
import sys

from pdsim.cli.common import (
    PROGRESS_AFTER_S,
    RAW,
    Output,
    UsageError,
    check_outputs,
    die,
    inputs,
    load_scenario,
    outside_flag,
    prepare_out_dir,
)
from pdsim.util.safeio import show_path, why

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
otherwise and costs nothing then.

--plot FILE draws the run's figure (.png, .svg, .pdf, ...): for an incident (a scenario with
faults:, operator_flushes: or a client's flush:) the postmortem (throughput per client with
the flushes, outcomes, blacklisted pairs, KV use, queues, failures per pair, load per rank,
latency CDFs); for anything else the capacity figure (requests sent vs completed, requests in
the system with the steady window's trend, TTFT and TPOT by arrival against the SLO, queue
depth per stage, KV use), its title the verdict."""


RUN_EPILOG = """\
examples:
  pdsim run scenarios/healthy.yaml
  pdsim run scenarios/drop_timeout.yaml --verbose          every failed pair in the timeline
  pdsim run scenarios/drop_timeout.yaml --json | jq .clients.ci_bench.empty_share
  pdsim run scenarios/drop_timeout.yaml --seed 3 --out runs/dt3
  pdsim run scenarios/drop_timeout.yaml --set flush.semantics=reject_if_busy
  pdsim run scenarios/trace_replay.yaml --set clients.0.num_prompts=2000 --progress
  pdsim run scenarios/drop_timeout.yaml --perfetto drop.perfetto.json  open in ui.perfetto.dev
  pdsim run scenarios/drop_timeout.yaml --plot postmortem.png    the incident at a glance
  pdsim run scenarios/capacity/llama70b_h100.yaml --plot capacity.png   keeps up? how fast?"""


VALIDATE = """\
Check a scenario file (after extends: and --set) and exit: 0 and one line when it would run,
2 and one line naming the key path and what is allowed when it would not."""


VALIDATE_EPILOG = """\
examples:
  pdsim validate scenarios/drop_timeout.yaml
  pdsim validate my.yaml --set fleet.decode.dp=8"""


SCHEMA_EPILOG = """\
example:
  pdsim schema > scenario.schema.json
  # then, first line of a scenario: # yaml-language-server: $schema=./scenario.schema.json"""


def add_run(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """``pdsim run``."""
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
                     help="a bar of the requests answered (of all the clients will send) and the "
                     "simulated time, on stderr from the start (on a terminal one shows anyway "
                     "once a run has taken 2 s)")
    bar.add_argument("--no-progress", action="store_true", help="no bar, even on a terminal")
    outside_flag(r)
    r.add_argument("--perfetto", metavar="FILE", help="record every batch step and KV write and "
                   "write a Chrome trace-event JSON to FILE: open it in https://ui.perfetto.dev")
    r.add_argument("--plot", metavar="FILE", help="draw the run's figure to FILE (.png, .svg, "
                   ".pdf, ...): the postmortem for an incident, the capacity figure otherwise")
    return r


def add_validate(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """``pdsim validate``."""
    v = sub.add_parser("validate", help="check a scenario file and exit",
                       description=VALIDATE, epilog=VALIDATE_EPILOG, formatter_class=RAW)
    v.add_argument("scenario", help="scenario YAML file")
    v.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario value by dotted key (repeatable)")
    outside_flag(v)
    return v


def add_schema(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """``pdsim schema``."""
    sc = sub.add_parser("schema", help="print the JSON Schema of the scenario format",
                        description="Print the JSON Schema of the scenario format (for "
                        "editors: completion and checking).", epilog=SCHEMA_EPILOG,
                        formatter_class=RAW)
    return sc


def run_or_validate(args: argparse.Namespace) -> int:
    """``pdsim run`` or ``pdsim validate`` (the same load, then a run or a report of it)."""
    from pdsim.config import units

    try:
        if args.cmd == "run" and args.format and not args.out:  # not silently ignored
            raise UsageError("--format picks the table format of --out DIR; add --out")
        sc = load_scenario(args)
        if args.cmd == "run":
            from pdsim.output.result import run_dir_names

            tables = tuple(run_dir_names(args.format or "csv"))
            check_outputs(inputs(sc, *args.plugins), Output("--out", args.out, tables),
                          Output("--perfetto", args.perfetto),
                          Output("--plot", args.plot, image=True))
            if args.out:
                prepare_out_dir(args.out)
    except (units.ScenarioError, UsageError) as err:
        return die(str(err))
    if args.cmd == "validate":
        print(f"{show_path(args.scenario)}: ok ({sc.name}, {len(sc.clients)} client(s), "
              f"horizon {sc.horizon_s:g} s)")
        from pdsim.model.memory import pools

        roles = pools(sc)
        how = {role: roles[role].how
               + (f", in whole {cfg.page_size}-token pages" if cfg.page_size > 1 else "")
               for role, cfg in sc.fleet.roles()}
        print("KV pool per DP rank (SGLang's max_total_num_tokens): " + ", ".join(
            f"{role} {p.tokens:,} tokens ({how[role]})" for role, p in roles.items()))
        from pdsim.model.memory import running_limits

        given = dict(sc.fleet.roles())
        print("Running requests per DP rank (max_running_requests): " + ", ".join(
            f"{role} {n:,} ("
            + ("given" if given[role].max_running_requests is not None else
               "SGLang's default for the pool: min(pool // 2, request slots)")
            + (", capped by the recurrent-state pool" if roles[role].max_running is not None
               and n == roles[role].max_running else "") + ")"
            for role, n in running_limits(sc).items()))
        if sc.unknowns:  # each range end (or choice) was validated as a value of its own
            print(f"{len(sc.unknowns)} declared unknown(s); run uses the nominal, explore "
                  f"samples the range (validated at its ends, and at every value of a short "
                  f"integer range):")
            for u in sc.unknowns:
                print(f"  {u.path}: {u.describe()}, nominal {u.nominal}")
        return 0

    from pdsim.output import report
    from pdsim.output.result import run

    if args.format == "parquet" and args.out:
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            return die("--format parquet needs pyarrow: pip install -e '.[parquet]'")
    try:
        progress = (True if args.progress else False if args.no_progress
                    else PROGRESS_AFTER_S if sys.stderr.isatty() else False)
        res = run(sc, progress=progress, record_steps=bool(args.perfetto))
    except (ValueError, FileNotFoundError) as err:
        return die(str(err))
    if args.out:
        try:
            written = res.write(args.out, args.format or "csv")
        except OSError as err:
            return die(f"--out {show_path(args.out)}: cannot write "
                       f"({why(err)})")
        for path in written:
            print(f"wrote {show_path(path)}", file=sys.stderr)
    if args.perfetto:
        from pdsim.output import perfetto

        try:
            path = perfetto.write(res, args.perfetto)
        except OSError as err:
            return die(f"--perfetto {show_path(args.perfetto)}: cannot write "
                       f"({why(err)})")
        print(f"wrote {show_path(path)} (open it in https://ui.perfetto.dev)", file=sys.stderr)
    if args.plot:
        try:
            path = _plot(res, args.plot)
        except OSError as err:
            return die(f"--plot {show_path(args.plot)}: cannot write "
                       f"({why(err)})")
        print(f"wrote {show_path(path)}", file=sys.stderr)
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


def _plot(res: object, out: str) -> str:
    """The run's figure to ``out``: the postmortem for an incident, the capacity figure for
    anything else (``pdsim run --help``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pdsim.engine.incident import is_incident
    from pdsim.output import plots, plots_capacity

    fig = (plots.postmortem(res) if is_incident(res.scenario, res.summary)
           else plots_capacity.capacity(res))
    try:
        fig.savefig(out, dpi=90)
    finally:
        plt.close(fig)
    return out

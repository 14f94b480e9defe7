"""``pdsim compare``: runs side by side (a layout against another), as a table and a figure."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pdsim.cli.common import (
    PROGRESS_AFTER_S,
    RAW,
    Output,
    UsageError,
    check_outputs,
    die,
    inputs,
    outside_flag,
    run_dir_inputs,
)
from pdsim.util.safeio import show_path, why

COMPARE = """\
Put two or more runs side by side: each RUN is a scenario file (simulated now, with --set
and --seed applied to it) or a run directory written by `pdsim run --out DIR` (read back, not
run again). Prints one table, a column per run: GPUs used, request and output-token throughput
(and per GPU), whether the fleet keeps up with its offered load (the steady window, as
`pdsim run` reports it), SLO attainment and goodput under each scenario's slo: (and per GPU),
and the mean, P50, P90, P95 and P99 of TTFT, TPOT, ITL and E2E latency, with notes when the
runs are not like for like (different SLOs or offered loads).

--plot FILE draws the side-by-side figure: generated tokens/s over time, goodput per GPU,
and the TTFT and TPOT CDFs against the SLO; its title says which run serves more per GPU and
by how much. The figures are the runs' own summaries' (pdsim run --json)."""

COMPARE_EPILOG = """\
examples:
  pdsim compare scenarios/healthy.yaml scenarios/forward_timeout.yaml
  pdsim compare scenarios/capacity/llama70b_h100.yaml scenarios/capacity/llama70b_h100.yaml \\
      --set-run 2:fleet.prefill.servers=2 --plot layouts.png    two layouts of one file
  pdsim run a.yaml --out runs/a; pdsim run b.yaml --out runs/b
  pdsim compare runs/a runs/b --plot a_vs_b.png          run directories: nothing re-run
  pdsim compare runs/a b.yaml --json | jq '.[].goodput_per_gpu_req_s'"""


def add_compare(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """``pdsim compare``."""
    c = sub.add_parser("compare", help="runs side by side: latency percentiles, goodput, "
                       "GPUs used, and a figure", description=COMPARE, epilog=COMPARE_EPILOG,
                       formatter_class=RAW)
    c.add_argument("runs", nargs="+", metavar="RUN", help="a scenario file or a run directory "
                   "(pdsim run --out DIR); two or more")
    c.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override a value of every scenario file given (not of run "
                   "directories: they are read as they ran); repeatable")
    c.add_argument("--set-run", dest="set_runs", action="append", default=[],
                   metavar="N:KEY=VALUE", help="override a value of the N-th run only (1: the "
                   "first RUN), e.g. 2:fleet.decode.servers=3: two layouts of one scenario "
                   "file; repeatable")
    c.add_argument("--seed", type=int, help="override the scenario files' seed")
    c.add_argument("--names", metavar="A,B,...", help="the runs' names in the table and "
                   "figure (default: each scenario's name, or the run directory's)")
    c.add_argument("--plot", metavar="FILE", help="draw the side-by-side figure to FILE "
                   "(.png, .svg, .pdf, ...)")
    c.add_argument("--json", action="store_true", help="print the comparison as JSON")
    outside_flag(c)
    return c


def compare_cmd(args: argparse.Namespace) -> int:
    from pdsim.config import loader, units
    from pdsim.output import compare
    from pdsim.output.result import Result, run

    try:
        if len(args.runs) < 2:
            raise UsageError("give two or more runs to compare (scenario files or run "
                             "directories)")
        names = _names(args)
        sets = [*args.sets, *([f"seed={args.seed}"] if args.seed is not None else [])]
        per_run = _set_runs(args.set_runs, len(args.runs))
        scenarios, read, dirs = {}, {}, []
        for i, given in enumerate(args.runs):
            p = Path(given)
            if p.is_dir():
                if per_run[i]:
                    raise UsageError(f"--set-run {i + 1}:...: run {i + 1} ({show_path(given)}) "
                                     f"is a run directory, read as it ran; give a scenario file")
                dirs.append(p)
                read.update(run_dir_inputs(p))
                continue
            try:
                sc = loader.load(given, [*sets, *per_run[i]],
                                 allow_outside_paths=args.allow_outside_paths)
            except units.ScenarioError as err:  # (which of the runs it is)
                msg = str(err)
                raise units.ScenarioError(msg if show_path(given) in msg else
                                          f"{show_path(given)}: {msg}") from None
            scenarios[i] = sc
            read.update(inputs(sc))
        if dirs and len(dirs) == len(args.runs) and sets:
            raise UsageError("--set and --seed change scenario files; every run given is a "
                             "run directory, read as it ran")
        check_outputs({**read, **inputs(None, *args.plugins)},
                      Output("--plot", args.plot, image=True))
    except (units.ScenarioError, UsageError) as err:
        return die(str(err))
    runs = []
    progress = PROGRESS_AFTER_S if sys.stderr.isatty() else False
    for i, given in enumerate(args.runs):
        try:
            runs.append(Result.read(given) if i not in scenarios else
                        run(scenarios[i], progress=progress))
        except (ValueError, FileNotFoundError) as err:
            return die(str(err))
    results = (dict(zip(names, runs, strict=True)) if names is not None
               else _named(runs, args.runs, per_run))
    if args.json:
        print(json.dumps(compare.as_json(results), indent=2, sort_keys=True))
    else:
        print(compare.render(results))
    if args.plot:
        try:
            path = _plot(results, args.plot)
        except OSError as err:
            return die(f"--plot {show_path(args.plot)}: cannot write "
                       f"({why(err)})")
        print(f"wrote {show_path(path)}", file=sys.stderr)
    return 0


def _set_runs(items: list[str], n: int) -> list[list[str]]:
    """``--set-run N:KEY=VALUE`` as each run's own overrides."""
    out: list[list[str]] = [[] for _ in range(n)]
    for item in items:
        head, sep, kv = item.partition(":")
        if not sep or not head.strip().isdigit() or not 1 <= int(head) <= n or "=" not in kv:
            raise UsageError(f"--set-run {item!r}: give N:KEY=VALUE with N the run's place, "
                             f"1..{n}, e.g. 2:fleet.decode.servers=3")
        out[int(head) - 1].append(kv)
    return out


def _names(args: argparse.Namespace) -> list[str] | None:
    if args.names is None:
        return None
    names = [n.strip() for n in args.names.split(",")]
    if len(names) != len(args.runs) or not all(names) or len(set(names)) != len(names):
        raise UsageError(f"--names: give {len(args.runs)} distinct names, one per run, "
                         f"comma-separated")
    return names


def _named(runs: list, given: list[str], per_run: list[list[str]]) -> dict:
    """Each run under its scenario's name (a run directory: its own name); the path given
    when two would share one; a run's own overrides beside it when that is not enough."""
    names = [Path(g).name if Path(g).is_dir() else r.scenario.name
             for g, r in zip(given, runs, strict=True)]
    if len(set(names)) < len(names):
        names = [show_path(g) for g in given]
    if len(set(names)) < len(names):  # the same file twice, with --set-run overrides
        names = [f"{n} [{' '.join(s)}]" if s else n
                 for n, s in zip(names, per_run, strict=True)]
    if len(set(names)) < len(names):
        names = [f"{n} #{i + 1}" for i, n in enumerate(names)]
    return dict(zip(names, runs, strict=True))


def _plot(results: dict, out: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pdsim.output import plots_capacity

    fig = plots_capacity.comparison(results)
    try:
        fig.savefig(out, dpi=90)
    finally:
        plt.close(fig)
    return out

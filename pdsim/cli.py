"""``pdsim`` command line: a thin layer over :func:`pdsim.run`.

Results go to stdout; progress and notes go to stderr. Every user error exits 2 with one line.
"""

from __future__ import annotations

import argparse
import json
import sys

from pdsim import scenario as scenario_mod


def _die(msg: str) -> int:
    print(f"pdsim: error: {msg}", file=sys.stderr)
    return 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pdsim", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    r = sub.add_parser("run", help="simulate a scenario and print a bench_serving-style summary")
    r.add_argument("scenario", help="scenario YAML file")
    r.add_argument("--seed", type=int, help="override the scenario's seed")
    r.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario value by dotted key, e.g. router.flush_handler="
                   "mini_lb_fixed or clients.0.num_prompts=200 (repeatable)")
    r.add_argument("--out", metavar="DIR", help="write requests, events, time series and "
                   "summary.json into DIR")
    r.add_argument("--format", choices=["csv", "parquet"], default="csv",
                   help="table format for --out (parquet needs pdsim[parquet])")
    r.add_argument("--json", action="store_true", help="print only the summary as JSON")
    r.add_argument("--progress", action="store_true", help="show a progress bar on stderr")

    v = sub.add_parser("validate", help="check a scenario file and exit")
    v.add_argument("scenario")
    v.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")

    sub.add_parser("schema", help="print the JSON Schema of the scenario format")
    return p


def _load(args) -> scenario_mod.Scenario:
    sets = list(args.sets)
    if getattr(args, "seed", None) is not None:
        sets.append(f"seed={args.seed}")
    return scenario_mod.load(args.scenario, sets)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.cmd == "schema":
        print(json.dumps(scenario_mod.json_schema(), indent=2))
        return 0
    try:
        sc = _load(args)
    except scenario_mod.ScenarioError as err:
        return _die(str(err))
    if args.cmd == "validate":
        print(f"{args.scenario}: ok ({sc.name}, {len(sc.clients)} client(s), "
              f"horizon {sc.horizon_s:g} s)")
        return 0

    from pdsim import report
    from pdsim.sim import run

    if args.format == "parquet" and args.out:
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            return _die("--format parquet needs pyarrow: pip install -e '.[parquet]'")
    try:
        res = run(sc, progress=args.progress)
    except (ValueError, FileNotFoundError) as err:
        return _die(str(err))
    if args.out:
        for path in res.write(args.out, args.format):
            print(f"wrote {path}", file=sys.stderr)
    summary = dict(res.summary, sim_wall_s=round(res.sim_wall_s, 3))
    if args.json:
        print(json.dumps(summary, indent=2, sort_keys=True))
    else:
        print(report.render(res))
        sys.stdout.flush()
        print(f"simulated {summary['simulated_s']} s in {summary['sim_wall_s']} s wall "
              f"({summary['events']} events)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

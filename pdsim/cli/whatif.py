"""``pdsim whatif`` (blacklist policies x the fault library x seeds: a decision table) and
``pdsim faults`` (the fault kinds and the library)."""

from __future__ import annotations

import argparse
import json
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
    prepare_out_dir,
)
from pdsim.util.backends import MAX_RUNS
from pdsim.util.safeio import UserFileError, clip, echo, read_user_file, show_path


class _WhatIfHelp(RAW):
    """Fills the what-if table's column legend into the epilog only when the help is printed:
    the legend lives in pdsim.whatif, which imports pandas (~0.5 s every command would pay)."""

    def add_text(self, text: str | None) -> None:
        if text is not None and "{columns}" in text:
            text = text.format(columns=_legend())
        super().add_text(text)


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


def add_whatif(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """``pdsim whatif``."""
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
    outside_flag(wi)
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
    return wi


def add_faults(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """``pdsim faults``."""
    fl = sub.add_parser("faults", help="list the fault kinds and the fault library",
                        description="Fault kinds (faults: items, kind: selects one) and the "
                        "library presets (faults: [{preset: NAME}]) that pdsim whatif runs.",
                        formatter_class=RAW)
    return fl


def _legend() -> str:
    from pdsim.analysis.whatif_table import legend

    return legend().replace("columns:", "table columns (each a median over seeds, with _lo/_hi "
                            "the 10th/90th percentiles):", 1)


def _parse_policy(spec: str) -> dict:
    from pdsim.config import loader

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
        values = [loader.parse_yaml(v, what) for v in raw.split(",")]
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
    from pdsim.config import loader, units

    try:
        text = read_user_file(path, "--faults-file", max_bytes=units.MAX_FILE_BYTES)
    except UserFileError as err:
        raise UsageError(str(err)) from None
    data = loader.parse_yaml(text.decode("utf-8", "replace"), f"--faults-file {path}")
    if not isinstance(data, dict) or not data:
        raise UsageError(f"--faults-file {show_path(path)}: expected a mapping of fault-set "
                         f"name -> fault or list of faults")
    return data


def _check_whatif_args(args: argparse.Namespace, policies: list[dict], n_faults: int) -> None:
    """Bounds on the matrix, before anything is expanded or run."""
    if not 1 <= args.seeds <= MAX_SEEDS:
        raise UsageError(f"--seeds {args.seeds}: give 1..{MAX_SEEDS:,} (runs seeds 1..N per "
                         f"policy and fault)")
    check_worker_args(args)
    points = 0
    for p in policies:
        n = 1
        for v in p.values():
            n *= len(v) if isinstance(v, list) else 1
        points += n
    runs = args.seeds * (1 + points * (1 + n_faults))  # (at most: healthy runs per policy)
    if runs > MAX_RUNS:
        raise UsageError(f"--policy x --faults x --seeds: {runs:,} runs; at most {MAX_RUNS:,}")


def whatif_cmd(args: argparse.Namespace) -> int:
    from pdsim.analysis.whatif import whatif
    from pdsim.analysis.whatif_table import COLUMNS, STATS_NOTE, WhatIf
    from pdsim.config import loader, units
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
            try:  # (its base scenario's files; whatif reports a base it cannot load)
                base = loader.load(args.scenario, args.sets,
                                   allow_outside_paths=args.allow_outside_paths)
            except units.ScenarioError:
                base = None
            check_outputs(inputs(base, args.faults_file, *args.plugins),
                          Output("--out", args.out, tuple(WhatIf.written(formats))))
            prepare_out_dir(args.out)
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
    except (units.ScenarioError, UsageError) as err:
        return die(str(err))
    except (ValueError, KeyError, FileNotFoundError) as err:
        return die(str(err).strip("'\""))
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


def faults_cmd(_args: argparse.Namespace | None = None) -> int:
    from pdsim.config.registry import FAULTS

    print("fault kinds (faults: [{kind: NAME, ...}]; pdsim schema lists every key):")
    for e in FAULTS.entries():
        print(f"  {e.name:<20}{e.doc}")
    print("\nlibrary (faults: [{preset: NAME}], other keys override; pdsim whatif runs these):")
    for name, (spec, doc) in FAULTS.presets.items():
        shown = ", ".join(f"{k}: {v}" for k, v in spec.items())
        print(f"  {name:<20}{{{shown}}}\n  {'':<20}{doc}")
    return 0

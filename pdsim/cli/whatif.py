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
Should the blacklist have a TTL, and what value? Measures the base fleet's capacity (the highest
open-loop rate whose SLO attainment over the steady window meets the base's slo: target; a
bracketing search, cached by content), then runs every blacklist policy under every fault at
fractions of it (--loads) and in a closed loop, seeds 1..N each, and ends with the policy (and
parameter) that is best or tied-best under each load, metric and fault mix, or says that no
single policy is. Every figure is over a fixed window named from the fault's timing (before,
during, recovery, lasting harm; the span from the steady start to the last lasting window),
never divided by how long a run took; every ranking is by regret paired by seed, with a 95%
bootstrap interval over seeds, and ties are printed as ties.

Default: the policies below, the 8 faults of the library, loads 0.3,0.6,0.9 x capacity and a
closed loop, 4 seeds: about 1,050 runs, ~40 CPU-minutes (~20 min on 2 free cores); --loads base
runs the base's own load only (no capacity search).

Policies: NAME, or NAME:KEY=V1,V2:KEY2=V (lists are a grid), e.g. ttl:ttl_s=10,30,120; default
permanent, v0_5_23, never, ttl:ttl_s=3,10,30,120, circuit_breaker. NAME is a blacklist policy; a
dotted KEY is any other scenario setting the policy makes, so other remedies are weighed the same
way: never:transfer.waiting_timeout_s=10,30 or
permanent:disaggregation.prefill_abort_notifies_decode=true,false. Faults: names from the library
(`pdsim faults`; any registered fault), or your own sets in a YAML file (name: a fault or a list
of faults; values may be declared unknowns, {choice: [...], nominal: x})."""


WHATIF_EPILOG = """\
{columns}

examples:
  pdsim whatif scenarios/whatif_base.yaml --out runs/wi
  pdsim whatif scenarios/whatif_base.yaml --loads 0.9 --faults decode_nic_down,flush_race \\
      --policy permanent --policy ttl:ttl_s=3,10,30 --seeds 6
  pdsim whatif scenarios/whatif_base.yaml --across-unknowns --faults decode_crash
  pdsim whatif scenarios/whatif_base.yaml --loads base --seeds 2 --faults lost_done,leg_failure \
      --policy permanent:transfer.waiting_timeout_s=30,300
  pdsim whatif scenarios/whatif_base.yaml --loads base --faults-file my_faults.yaml --seeds 2"""


def add_whatif(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """``pdsim whatif``."""
    wi = sub.add_parser("whatif", help="blacklist policies x faults x loads from capacity: "
                        "which policy, with intervals", description=WHATIF,
                        formatter_class=_WhatIfHelp, epilog=WHATIF_EPILOG)
    wi.add_argument("scenario", help="base scenario (its blacklist and faults are replaced; "
                    "its slo: sets the SLO), e.g. scenarios/whatif_base.yaml")
    wi.add_argument("--policy", dest="policies", action="append", default=[],
                    metavar="NAME[:KEY=V1,V2...]", help="a policy and its parameter grid "
                    "(repeatable)")
    wi.add_argument("--faults", default="library", metavar="NAME,NAME|library|all",
                    help="faults to run: names, library (default: the 8 of the fault library) "
                    "or all (every registered preset)")
    wi.add_argument("--faults-file", metavar="FILE", help="YAML: fault-set name -> a fault "
                    "(or a list); replaces --faults")
    wi.add_argument("--seeds", type=int, default=4, help="seeds 1..N per policy, fault and "
                    "load (default 4)")
    wi.add_argument("--loads", default="0.3,0.6,0.9,closed", metavar="F,F,...,closed|base",
                    help="fractions of the measured capacity (open loop) and/or closed (256 in "
                    "flight); base: the base's own load, no capacity search")
    wi.add_argument("--capacity", type=float, metavar="REQ_S", help="take this capacity "
                    "instead of measuring it")
    wi.add_argument("--capacity-seeds", type=int, default=2, metavar="N",
                    help="seeds 1..N of each capacity probe (default 2)")
    wi.add_argument("--no-cache", action="store_true", help="measure the capacity even if a "
                    "measurement of the same content is cached ($PDSIM_CACHE_DIR)")
    wi.add_argument("--across-unknowns", action="store_true", help="also run each fault at "
                    "the other values of its declared unknowns (decode_crash's "
                    "restart_session, nic_degraded's bandwidth_fraction, ...)")
    for key, default, what in (("steady", 10, "steady start of the load"),
                               ("recovery", 30, "recovery window after a fault's end"),
                               ("lasting", 60, "lasting-harm window after the recovery"),
                               ("drain", 60, "run length past the span")):
        wi.add_argument(f"--{key}-s", type=float, default=float(default), metavar="S",
                        help=f"{what}, s (default {default})")
    wi.add_argument("--tables", action="store_true", help="print every load's policy x fault "
                    "table (--out writes them either way)")
    wi.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="override a base-scenario value (repeatable)")
    wi.add_argument("--workers", type=int, help="processes (default: one per core)")
    wi.add_argument("--backend", choices=["process", "ray"], default="process",
                    help="a local process pool, or Ray (pip install -e '.[ray]')")
    wi.add_argument("--address", help="Ray cluster address (default: start a local Ray)")
    outside_flag(wi)
    wi.add_argument("--out", metavar="DIR", help="write recommendation.csv, study.json and per "
                    "load table, ranking, runs, healthy, timelines and columns.json (and "
                    "--plots) into DIR")
    wi.add_argument("--format", metavar="csv,parquet,json",
                    help="table formats for --out (comma-separated; default csv)")
    wi.add_argument("--plots", action="store_true", help="with --out: per load heatmap.png, "
                    "timeline_<fault>.png, vs_<param>.png")
    wi.add_argument("--timeline", metavar="FAULT", help="fault whose recovery timelines to "
                    "plot (default: the one where the policies differ most)")
    wi.add_argument("--param", metavar="KEY", help="policy parameter to plot goodput against "
                    "(default: the first one a grid varies)")
    wi.add_argument("--json", action="store_true", help="print the recommendation, and each "
                    "load's table and ranking, as JSON")
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

    return legend().replace("columns:", "table columns (each a mean over seeds, with _lo/_hi "
                            "its 95% bootstrap interval):", 1)


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


def _check_whatif_args(args: argparse.Namespace, policies: list[dict], n_faults: int,
                       n_loads: int) -> None:
    """Bounds on the matrix, before anything is expanded or run."""
    if not 1 <= args.seeds <= MAX_SEEDS:
        raise UsageError(f"--seeds {args.seeds}: give 1..{MAX_SEEDS:,} (runs seeds 1..N per "
                         f"policy and fault)")
    if not 1 <= args.capacity_seeds <= 100:
        raise UsageError(f"--capacity-seeds {args.capacity_seeds}: give 1..100")
    if args.capacity is not None and not (0 < args.capacity < 1e9):
        raise UsageError(f"--capacity {args.capacity:g}: give a rate in req/s above 0")
    check_worker_args(args)
    points = 0
    for p in policies:
        n = 1
        for v in p.values():
            n *= len(v) if isinstance(v, list) else 1
        points += n
    runs = n_loads * args.seeds * (1 + points * (1 + n_faults))  # (at most)
    if runs > MAX_RUNS:
        raise UsageError(f"--policy x --faults x --loads x --seeds: {runs:,} runs; at most "
                         f"{MAX_RUNS:,}")


def _loads(raw: str) -> list | None:
    if raw.strip() == "base":
        return None
    from pdsim.analysis.study import parse_loads

    try:
        return parse_loads(_names(raw, "--loads"))
    except ValueError as err:
        raise UsageError(f"--loads: {err}") from None


def whatif_cmd(args: argparse.Namespace) -> int:
    from pdsim.analysis import study as study_mod
    from pdsim.analysis import windows as win
    from pdsim.analysis.whatif import whatif
    from pdsim.analysis.whatif_table import COLUMNS, STATS_NOTE, WhatIf
    from pdsim.config import loader, units
    from pdsim.config.registry import FAULTS

    try:
        policies = [_parse_policy(p) for p in args.policies] or study_mod.DEFAULT_POLICIES
        if args.faults_file:
            faults = _faults_file(args.faults_file)
        elif args.faults == "all":
            faults = None
        elif args.faults == "library":
            faults = list(study_mod.DEFAULT_FAULTS)
        else:
            faults = _names(args.faults, "--faults")
        loads = _loads(args.loads)
        _check_whatif_args(args, [p if isinstance(p, dict) else {"policy": p}
                                  for p in policies],
                           len(FAULTS.presets) if faults is None else len(faults),
                           len(loads or [None]))
        if loads is None and args.capacity is not None:
            raise UsageError("--capacity sets the loads' reference; --loads base runs the "
                             "base's own load: give one of them")
        try:
            timeline = win.Timeline(args.steady_s, args.recovery_s, args.lasting_s,
                                    args.drain_s)
        except ValueError as err:
            raise UsageError(str(err)) from None
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
        command = "pdsim " + " ".join(sys.argv[1:])
        common = {"workers": args.workers, "progress": sys.stderr.isatty(), "sets": args.sets,
                  "plugins": args.plugins, "command": command, "backend": args.backend,
                  "address": args.address, "allow_outside_paths": args.allow_outside_paths,
                  "timeline": timeline, "across_unknowns": args.across_unknowns}
        seeds = range(1, args.seeds + 1)
        if loads is None:
            one = whatif(args.scenario, policies, faults, seeds, **common)
            conds = {"base": one}
            result = None
        else:
            result = study_mod.study(args.scenario, policies, faults, seeds, loads,
                                     capacity=args.capacity,
                                     capacity_seeds=range(1, args.capacity_seeds + 1),
                                     use_cache=not args.no_cache, **common)
            conds = result.conditions
    except (units.ScenarioError, UsageError) as err:
        return die(str(err))
    except (ValueError, KeyError, FileNotFoundError) as err:
        return die(str(err).strip("'\""))
    if args.out:
        paths = (result.write(args.out, formats) if result is not None
                 else conds["base"].write(args.out, formats))
        for path in paths:
            print(f"wrote {path}", file=sys.stderr)
        if args.plots:
            for cond, w in conds.items():
                sub = Path(args.out) / cond if result is not None else Path(args.out)
                for path in _whatif_plots(w, args, sub):
                    print(f"wrote {path}", file=sys.stderr)
    if args.json:
        out = {"conditions": {c: {"table": json.loads(w.table.to_json(orient="records")),
                                  "ranking": json.loads(w.ranking.to_json(orient="records"))}
                              for c, w in conds.items()},
               "columns": COLUMNS, "statistics": STATS_NOTE}
        if result is not None:
            rec = result.recommendation.assign(best=["; ".join(b) for b in
                                                     result.recommendation.best])
            out["capacity"] = result.capacity.as_dict()
            out["recommendation"] = json.loads(rec.drop(columns="detail").to_json(
                orient="records"))
        print(json.dumps(out, indent=1, default=str))
    elif result is None:
        print(conds["base"].render())
    else:
        print(result.render(tables=args.tables) if args.tables else _summary(result))
    return 0


def _summary(result: object) -> str:
    """Without --tables: capacity, the windows (the same at every load), each load's ranking,
    the recommendation."""
    lines = [result.capacity.describe(), ""]
    first = next(iter(result.conditions.values()), None)
    if first is not None:
        lines += [x for x in first.header() if not x.startswith("set in the base")] + [""]
    for cond, w in result.conditions.items():
        text = w.render()
        lines.append(f"=== {cond}: {result.loads[cond]} ===")
        lines.append(text[text.index("ranking by worst-case"):text.index("\nties:")])
    body = result.render(tables=False)
    lines.append(body[body.index("\n") + 2:] if body.startswith(result.capacity.describe())
                 else body)
    return "\n".join(lines)


def _whatif_plots(w: object, args: argparse.Namespace, out: Path) -> list:

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
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
    from pdsim.engine.faults import DECLARED

    print("fault kinds (faults: [{kind: NAME, ...}]; pdsim schema lists every key):")
    for e in FAULTS.entries():
        print(f"  {e.name:<20}{e.doc}")
    print("\nlibrary (faults: [{preset: NAME}], other keys override; pdsim whatif runs these):")
    for name, (spec, doc) in FAULTS.presets.items():
        shown = ", ".join(f"{k}: {v}" for k, v in spec.items())
        print(f"  {name:<20}{{{shown}}}\n  {'':<20}{doc}")
        for key, v in DECLARED.get(name, {}).items():
            if isinstance(v, dict):
                rng = v.get("choice") or v.get("uniform") or v.get("loguniform")
                dist = next(k for k in ("choice", "uniform", "loguniform") if k in v)
                print(f"  {'':<20}declared unknown {key}: {dist} {rng}, nominal {v['nominal']}"
                      f" (--across-unknowns runs the others); why: {v.get('why', '')}")
    return 0

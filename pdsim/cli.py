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

    sw = sub.add_parser("sweep", help="run a scenario over a grid of overrides and seeds")
    sw.add_argument("scenario")
    sw.add_argument("--vary", action="append", default=[], metavar="KEY=V1,V2,...",
                    help="a dotted key and the values to try (repeatable: the grid is the "
                    "product), e.g. blacklist.recovery=none,probe,v0_5_23")
    sw.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="fixed overrides applied to every run")
    sw.add_argument("--seeds", type=int, default=3, help="seeds 1..N per grid point")
    sw.add_argument("--workers", type=int, help="processes (default: one per core)")
    sw.add_argument("--out", metavar="FILE", help="write every run's row (CSV)")
    sw.add_argument("--json", action="store_true", help="print the rows as JSON records")
    sw.add_argument("--client", help="client whose empty share and throughput the table shows "
                    "(default: the last bench client)")

    sub.add_parser("schema", help="print the JSON Schema of the scenario format")
    pr = sub.add_parser("profiles", help="list the GPU and model profiles and their sources")
    pr.add_argument("name", nargs="?", help="show one profile with every value's source")
    return p


def _profiles(name: str | None) -> int:
    from pdsim import profiles

    gpus, models = profiles.raw_gpus(), profiles.raw_models()
    if name:
        entry = gpus.get(name) or models.get(name)
        if entry is None:
            return _die(f"no profile {name!r}; GPUs: {', '.join(sorted(gpus))}; models: "
                        f"{', '.join(sorted(models))}")

        def show(node: dict, indent: str = "") -> None:
            for k, v in node.items():
                if isinstance(v, dict) and "value" in v:
                    print(f"{indent}{k:<24}{v['value']!s:<12}{v['source']}")
                elif isinstance(v, dict):
                    print(f"{indent}{k}:")
                    show(v, indent + "  ")

        show(entry)
        return 0
    print(f"{'GPU':<8}{'BF16 TF':>9}{'FP8 TF':>8}{'HBM GB':>8}{'HBM TB/s':>10}{'NIC Gb/s':>10}")
    for g in profiles.gpu_names():
        x = profiles.gpu(g)
        print(f"{g:<8}{x.bf16_tflops:>9g}{x.fp8_tflops:>8g}{x.hbm_gb:>8g}{x.hbm_tbps:>10g}"
              f"{x.nic_gbps:>10g}")
    print(f"\n{'model':<18}{'attn':>5}{'layers':>7}{'active B':>9}{'KV B/token':>11}  fitted for")
    for m in profiles.model_names():
        x = profiles.model(m)
        fitted = ", ".join(sorted(x.fitted or {})) or "-"
        print(f"{m:<18}{x.attention:>5}{x.layers:>7}{x.params_active_b:>9g}"
              f"{x.kv_bytes_per_token:>11,}  {fitted}")
    print("\npdsim profiles NAME shows every value with its source.")
    return 0


def _parse_vary(items: list[str]) -> dict[str, list]:
    import yaml

    vary: dict[str, list] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key or not raw:
            raise scenario_mod.ScenarioError(f"--vary expects KEY=V1,V2,..., got {item!r}")
        vary[key] = [yaml.safe_load(v) for v in raw.split(",")]
    return vary


def _sweep(args: argparse.Namespace) -> int:
    import pandas as pd

    from pdsim.sweep import sweep

    try:
        vary = _parse_vary(args.vary)
        data = scenario_mod.apply_overrides(scenario_mod.read_yaml(args.scenario), args.sets)
        sc = scenario_mod.load(data)
        df = sweep(data, vary, range(1, args.seeds + 1), args.workers,
                   progress=sys.stderr.isatty())
    except scenario_mod.ScenarioError as err:
        return _die(str(err))
    except (ValueError, FileNotFoundError) as err:
        return _die(str(err))
    if args.out:
        df.to_csv(args.out, index=False)
        print(f"wrote {args.out}", file=sys.stderr)
    if args.json:
        print(df.to_json(orient="records", indent=2))
        return 0
    benches = [c.name for c in sc.clients if c.kind == "bench"] or [sc.clients[-1].name]
    main_client = args.client or benches[-1]
    if main_client not in {c.name for c in sc.clients}:
        return _die(f"--client {main_client!r}: no such client; the scenario has "
                    f"{', '.join(c.name for c in sc.clients)}")
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
    return 0


def _load(args: argparse.Namespace) -> scenario_mod.Scenario:
    sets = list(args.sets)
    if getattr(args, "seed", None) is not None:
        sets.append(f"seed={args.seed}")
    return scenario_mod.load(args.scenario, sets)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.cmd == "schema":
        print(json.dumps(scenario_mod.json_schema(), indent=2))
        return 0
    if args.cmd == "sweep":
        return _sweep(args)
    if args.cmd == "profiles":
        return _profiles(args.name)
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

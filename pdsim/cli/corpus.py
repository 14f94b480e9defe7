"""``pdsim validate-model``'s corpus part: the measured corpus's rows run as generated scenarios
(pdsim.analysis.corpus), their table, ``--json``, ``--explain ROW_ID`` and ``--fit``."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from pdsim.cli.common import die
from pdsim.util.safeio import echo, show_path

CORPUS_EPILOG = """\
corpus (validation/corpus/: measured SGLang benchmarks, one scenario generated per row):
  pdsim validate-model                       published.csv's cases, then the training corpus
  pdsim validate-model --quick               a fixed stratified handful of corpus rows
  pdsim validate-model --corpus my.csv       any CSV with the corpus's columns (yours)
  pdsim validate-model --corpus my.csv --json     one JSON object per row
  pdsim validate-model --explain ROW_ID      the row's generated scenario and its assumptions
  pdsim validate-model --fit                 refit the (die, family, engine) parameter sets
                                             on the training rows and cross-validate them"""


def add_args(vm: argparse.ArgumentParser) -> None:
    g = vm.add_argument_group("corpus")
    g.add_argument("--corpus", metavar="FILE.csv", help="run this corpus CSV (the columns of "
                   "validation/corpus/README.md) instead of the published cases")
    g.add_argument("--quick", action="store_true", help="only the training corpus's quick "
                   "subset (one row per GPU, model and mode, and a refused one)")
    g.add_argument("--json", action="store_true", help="print one JSON object per corpus row: "
                   "id and sim_ttft_ms, sim_tpot_ms (or skipped: the reason)")
    g.add_argument("--explain", metavar="ROW_ID", help="print a corpus row's generated scenario "
                   "and the assumptions it makes, and exit")
    g.add_argument("--workers", type=int, default=None, help="processes running corpus rows "
                   "(default: one per core)")
    g.add_argument("--fit", action="store_true", help="refit the corpus parameter sets (one per "
                   "GPU die, model family and engine) and cross-validate them; on the training "
                   "corpus this rewrites validation/corpus/fits.yaml and the corpus block of "
                   "pdsim/model/data/calibrations.yaml, on --corpus FILE it writes --out")
    g.add_argument("--out", metavar="PROFILE.yaml", help="with --fit --corpus FILE: the profile "
                   "file to write (default FILE.profile.yaml)")
    g.add_argument("--family", action="append", default=[], metavar="FAMILY",
                   help="with --fit: refit only this model family's sets (repeatable), keeping "
                   "the others from the record")


def wanted(args: argparse.Namespace) -> bool:
    """Whether the command is about the corpus only."""
    return bool(args.corpus or args.quick or args.json or args.explain or args.fit
                or args.family)


def _cases(args: argparse.Namespace) -> list:
    from pdsim.analysis import corpus

    df = corpus.read(args.corpus or corpus.TRAIN)
    if args.quick:
        df = df[df.id.isin(corpus.QUICK)]
    return corpus.cases(df)


def explain(args: argparse.Namespace) -> int:
    import yaml

    from pdsim.analysis import corpus

    df = corpus.read(args.corpus or corpus.TRAIN)
    rows = df[df.id == args.explain]
    if rows.empty:
        return die(f"--explain {echo(args.explain)}: no row with that id in "
                   f"{show_path(args.corpus or corpus.TRAIN)}")
    case = corpus.generate(rows.iloc[0].to_dict())
    print(f"row {case.id}: {case.gpu} / {case.model} / {case.mode}, concurrency "
          f"{case.concurrency}, isl {case.isl}, osl {case.osl}")
    print(f"measured: mean TTFT {case.measured_ttft_ms:.2f} ms, mean TPOT "
          f"{case.measured_tpot_ms:.2f} ms")
    if case.skip is not None:
        print(f"skipped: {case.skip}")
        return 0
    from pdsim.config import loader
    from pdsim.model import profiles

    sc = loader.load(case.scenario)
    for role, cfg in sc.fleet.roles():
        cal = profiles.for_role(sc, cfg).calibration or "none: the profiles as shipped"
        print(f"calibration ({role}): {cal}")
    print("assumptions:")
    for a in case.assumptions:
        print(f"  - {a}")
    print("scenario:")
    print(yaml.safe_dump(case.scenario, sort_keys=False).rstrip())
    return 0


def _json_row(r: Any) -> dict:
    out: dict[str, Any] = {"id": r.id}
    if isinstance(getattr(r, "skipped", None), str):
        out["skipped"] = r.skipped
        return out
    for k in ("sim_ttft_ms", "sim_tpot_ms", "measured_ttft_ms", "measured_tpot_ms",
              "ttft_error", "tpot_error"):
        v = float(getattr(r, k))
        out[k] = round(v, 4) if math.isfinite(v) else None
    out["calibration"] = r.calibration
    return out


def run(args: argparse.Namespace) -> tuple[int, Any]:
    """Run the corpus rows the flags choose; print the table (or JSON). (exit code, rows)."""
    from pdsim.analysis import corpus_run, corpus_table

    # the training split's table takes its fit record and in-view record; a user's corpus
    # (--corpus), the quick subset and --json take neither
    fits = {} if args.corpus or args.quick or args.json else corpus_table.load_fits()
    if fits:
        corpus_table.load_in_view()  # a bad record is one line before the rows run, not after
    cases = _cases(args)
    df = corpus_run.run(cases, args.workers, progress=sys.stderr.isatty() and not args.json,
                        sets=args.sets)
    if args.json:
        for r in df.itertuples(index=False):
            print(json.dumps(_json_row(r)))
        return 0, df
    print(corpus_table.markdown(df, fits, in_sample=not args.corpus))
    return 0, df


def fit(args: argparse.Namespace) -> int:
    import yaml

    from pdsim.analysis import corpus, corpus_fit, corpus_ship
    from pdsim.model import profiles

    training = not args.corpus
    cases = _cases(args)
    log = (lambda m: print(m, file=sys.stderr))  # noqa: E731
    from pdsim.analysis import corpus_table

    if args.family and not training:
        return die("--family refits sets of the shipped record (validation/corpus/fits.yaml); "
                   "on --corpus FILE --fit fits every set")
    record = corpus_fit.fit_all(cases, args.workers, cv=True, log=log,
                                source=str(args.corpus or "validation/corpus/"
                                           "aic_sglang_hopper_train.csv"),
                                families=args.family or None,
                                previous=corpus_table.load_fits() if args.family else None)
    entries = corpus_ship.calibration_entries(record, cases)
    head = ("# Written by `pdsim validate-model --fit` (pdsim/analysis/corpus_fit.py): the\n"
            "# corpus parameter sets, their rows, and their cross-validation. Do not edit.\n")
    if training:
        (corpus.ROOT / "fits.yaml").write_text(
            head + yaml.safe_dump(record, sort_keys=False, width=100))
        cal = Path(profiles.__file__).parent / "data" / "calibrations.yaml"
        corpus_ship.write_calibrations(entries, cal)
        print(f"wrote {show_path(corpus.ROOT / 'fits.yaml')} and the corpus block of "
              f"{show_path(cal)}", file=sys.stderr)
    else:
        out = Path(args.out or Path(args.corpus).with_suffix(".profile.yaml"))
        out.write_text(head + yaml.safe_dump({"calibrations": entries}, sort_keys=False,
                                             width=100))
        print(f"wrote {show_path(out)}", file=sys.stderr)
    by_id = {c.id: c for c in cases}
    for s in record["sets"]:
        ok, why = corpus_ship.ships(s, by_id)
        print(f"{s['name']}: " + ", ".join(f"{k} {v:g}" for k, v in s["values"].items())
              + (f" (at bound: {', '.join(s['at_bound'])})" if s["at_bound"] else "")
              + ("" if ok else f"; {why}"))
    return 0

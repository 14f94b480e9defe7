"""The runs behind reports/blacklist_policy.md, in resumable chunks (one load at a time).

    nice -n 10 python reports/blacklist_policy_runs.py capacity
    nice -n 10 python reports/blacklist_policy_runs.py headline            # every load
    nice -n 10 python reports/blacklist_policy_runs.py headline --load 0.9x
    nice -n 10 python reports/blacklist_policy_runs.py unknowns --load closed
    python reports/blacklist_policy_runs.py rewrite     # tables from the runs (no re-run)
    nice -n 10 python reports/blacklist_policy_runs.py check headline --load closed
    nice -n 10 python reports/blacklist_policy_runs.py check unknowns --load 0.9x --seeds 1

``check`` re-runs a chunk into a scratch directory under the model checked out now, compares
its runs, healthy runs and timelines with the committed ones, and records the result (commit,
runs, identical or what moved) in reports/blacklist_policy/provenance.json, which the report
prints: which committed runs were re-checked under which model, and which were not.

``headline`` is exactly what ``pdsim whatif scenarios/whatif_base.yaml --out DIR`` runs (the
CLI's defaults, from pdsim.analysis.study), one load per chunk; ``unknowns`` runs the other
values of the library's declared unknowns (what ``--across-unknowns`` adds), as fault sets of
their own. A chunk whose directory already holds the same command's output is skipped, so an
interrupted regeneration resumes where it stopped. Each chunk writes what ``pdsim whatif --out``
writes (timelines gzipped) under reports/blacklist_policy/<matrix>/<load>/.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "reports" / "blacklist_policy"
BASE = "scenarios/whatif_base.yaml"
CLI = f"pdsim whatif {BASE}"


def specs() -> dict:
    """matrix -> (fault sets, the CLI command that gives the same runs)."""
    from pdsim.analysis import study
    from pdsim.analysis.whatif import expand_faults, unknown_variants
    from pdsim.config import loader, unknowns

    fset = expand_faults(study.DEFAULT_FAULTS)
    variants = {}
    base = loader.as_data(ROOT / BASE)
    for name, items in fset.items():
        data = loader.ScenarioData({**base, "faults": items})
        data.context = base.context
        sc = loader.load(data)
        resolved = unknowns.resolve({"faults": items})[0]
        for vname, values in unknown_variants(name, sc.unknowns).items():
            variants[vname] = unknowns.substitute(resolved, values)["faults"]
    return {"headline": (fset, f"{CLI} --out DIR"),
            "unknowns": (variants, f"{CLI} --across-unknowns --out DIR (its variant rows)")}


def capacity(workers: int | None) -> None:
    from pdsim.analysis import capacity as cap_mod
    from pdsim.analysis import study
    from pdsim.analysis import windows as win
    from pdsim.analysis.whatif import expand_faults, expand_policies

    fset = expand_faults(study.DEFAULT_FAULTS)
    plan = study.plan_of(ROOT / BASE, fset, expand_policies(study.DEFAULT_POLICIES), [],
                         win.Timeline())
    cap = cap_mod.measure(ROOT / BASE, (win.Timeline().steady_s, plan.t_end), plan.horizon,
                          study.CAPACITY_SEEDS, workers=workers, progress=True,
                          use_cache=False)
    DATA.mkdir(parents=True, exist_ok=True)
    (DATA / "capacity.json").write_text(json.dumps(cap.as_dict(), indent=1) + "\n")
    print(cap.describe(), file=sys.stderr)


def load_capacity():
    from pdsim.analysis import capacity as cap_mod

    path = DATA / "capacity.json"
    if not path.is_file():
        sys.exit(f"{path.relative_to(ROOT)} missing: run `python {Path(__file__).name} "
                 f"capacity` first")
    return cap_mod.Capacity.from_dict(json.loads(path.read_text()))


def run_chunk(matrix: str, load: str, workers: int | None, data: Path | None = None,
              seeds: list[int] | None = None) -> None:
    """Run one load of ``matrix`` into ``data`` (default: the committed DATA); ``seeds``: only
    these (a check's; default the CLI's)."""
    from pdsim.analysis import study

    data = DATA if data is None else data
    fset, command = specs()[matrix]
    out = data / matrix / load
    meta = out / "columns.json"
    if meta.is_file():
        old = json.loads(meta.read_text())
        if old.get("command") == command and old.get("condition") == load:
            print(f"{out}: done, skipped", file=sys.stderr)
            return
    value = next(x for x in study.DEFAULT_LOADS if study.label(x) == load)
    cap = load_capacity()
    s = study.study(ROOT / BASE, study.DEFAULT_POLICIES, fset, seeds=seeds or (),
                    loads=[value], capacity=cap, workers=workers, progress=True, command=command,
                    t_end=cap.window[1])  # the headline's span, whatever faults run
    w = s.conditions[load]
    w.base = BASE
    if out.exists():
        shutil.rmtree(out)
    w.write(out, ["csv"])
    plain = out / "timelines.csv"
    with plain.open("rb") as src, gzip.GzipFile(out / "timelines.csv.gz", "wb", mtime=0) as dst:
        shutil.copyfileobj(src, dst)  # mtime=0: the same runs give the same bytes
    plain.unlink()
    study_json = data / matrix / "study.json"
    loads = json.loads(study_json.read_text())["loads"] if study_json.is_file() else {}
    loads[load] = s.loads[load]
    order = [study.label(x) for x in study.DEFAULT_LOADS]
    (data / matrix / "study.json").write_text(json.dumps({
        "capacity": s.capacity.as_dict(), "command": command,
        "loads": {k: loads[k] for k in order if k in loads},
        "conditions": [k for k in order if k in loads]}, indent=1) + "\n")
    print(f"wrote {out}", file=sys.stderr)


PROVENANCE = DATA / "provenance.json"
MODEL_OUTPUTS = ("runs.csv", "healthy.csv", "timelines.csv.gz")  # what the model gives


def _commit() -> str:
    import subprocess

    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()

    try:
        dirty = git("status", "--porcelain", "--", "pdsim")
        return git("rev-parse", "--short", "HEAD") + (" (pdsim/ modified)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown (no git)"


def compare(new: Path, old: Path, seeds: list[int] | None = None) -> str:
    """'identical' when the model outputs of two chunk directories are (timelines
    uncompressed; ``seeds``: the committed rows of those seeds only), else which files and
    columns moved."""
    import pandas as pd

    moved = []
    for name in MODEL_OUTPUTS:
        a, b = old / name, new / name
        if seeds is None:
            if name.endswith(".gz"):
                same = gzip.open(a).read() == gzip.open(b).read()
            else:
                same = a.read_bytes() == b.read_bytes()
            if same:
                continue
        x, y = pd.read_csv(a), pd.read_csv(b)
        if seeds is not None:
            x = x[x.seed.isin(seeds)].reset_index(drop=True)
        if list(x.columns) != list(y.columns) or len(x) != len(y):
            moved.append(f"{name} (shape {x.shape} -> {y.shape})")
        elif not x.equals(y):
            moved.append(f"{name} ({', '.join(c for c in x.columns if not x[c].equals(y[c]))})")
    return "identical" if not moved else "moved: " + "; ".join(moved)


def record(key: str, entry: dict) -> None:
    """Add one check's result to provenance.json (``key``: matrix/load)."""
    doc = json.loads(PROVENANCE.read_text()) if PROVENANCE.is_file() else {}
    doc.setdefault("checks", {})[key] = entry
    PROVENANCE.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


def check(matrix: str, load: str, workers: int | None, seeds: list[int] | None = None) -> None:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="pdsim-check-") as tmp:
        scratch = Path(tmp)  # (at the committed capacity: load_capacity reads DATA's)
        run_chunk(matrix, load, workers, scratch, seeds)
        result = compare(scratch / matrix / load, DATA / matrix / load, seeds)
        runs = n_runs(scratch / matrix / load)
    entry = {"model": _commit(), "runs": runs, "result": result}
    if seeds:
        entry["seeds"] = seeds
    record(f"{matrix}/{load}", entry)
    print(f"{matrix}/{load}: {result}", file=sys.stderr)


def n_runs(chunk: Path) -> int:
    """Simulations behind a chunk: its runs and its healthy runs (one per seed, or per policy
    and seed when the base fails transfers without faults)."""
    import pandas as pd

    h = pd.read_csv(chunk / "healthy.csv")
    keys = ["policy", "seed"] if "policy" in h.columns else ["seed"]
    return len(pd.read_csv(chunk / "runs.csv")) + len(h.drop_duplicates(keys))


def rewrite(matrix: str) -> None:
    """Recompute each load's table, ranking and columns.json from its committed runs and
    healthy runs (after a change to the statistics, not to the model: nothing re-runs)."""
    import json as _json

    from pdsim.analysis.whatif_table import COLUMNS, STATS_NOTE, WhatIf

    for d in sorted((DATA / matrix).iterdir()):
        if not (d / "columns.json").is_file():
            continue
        w = WhatIf.read(d)
        w.table.to_csv(d / "table.csv", index=False, float_format="%.9g")
        w.ranking.to_csv(d / "ranking.csv", index=False, float_format="%.9g")
        meta = _json.loads((d / "columns.json").read_text())
        meta.update({"columns": COLUMNS, "statistics": STATS_NOTE})
        (d / "columns.json").write_text(_json.dumps(meta, indent=1, default=str) + "\n")
        print(f"rewrote {d.relative_to(ROOT)}", file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    from pdsim.analysis import study

    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["capacity", "headline", "unknowns", "rewrite", "check"])
    ap.add_argument("matrix", nargs="?", choices=["headline", "unknowns"],
                    help="check: which matrix")
    ap.add_argument("--load", action="append", default=[],
                    help="a load (0.3x, 0.6x, 0.9x, closed); default every one")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seeds", type=lambda v: [int(x) for x in v.split(",")], default=None,
                    help="check: re-run only these seeds (e.g. 1) and compare their rows")
    args = ap.parse_args(argv)
    if args.what == "capacity":
        capacity(args.workers)
        return
    if args.what == "rewrite":
        for matrix in ("headline", "unknowns"):
            if (DATA / matrix).is_dir():
                rewrite(matrix)
        return
    loads = args.load or [study.label(x) for x in study.DEFAULT_LOADS]
    for load in loads:
        if args.what == "check":
            check(args.matrix or "headline", load, args.workers, args.seeds)
        else:
            run_chunk(args.what, load, args.workers)


if __name__ == "__main__":
    main()

"""Running the corpus (:mod:`pdsim.analysis.corpus`): every generated scenario simulated, in
parallel through pdsim's backends, and its mean TTFT and TPOT set against the measured ones.

:func:`run` returns one row per corpus row (simulated, measured, error; or the reason it was
skipped); :func:`groups` the per-(GPU, model, mode) medians and shares the README table prints.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from pathlib import Path
from typing import Any

import pandas as pd

from pdsim.analysis import corpus
from pdsim.util import backends


def simulate(case: corpus.Case) -> dict[str, Any]:
    """One generated scenario run (module level: the process pool pickles it by reference):
    bench_serving's mean TTFT and TPOT over the timed requests, the calibration the run used
    and its wall time."""
    import pdsim
    from pdsim.config import loader
    from pdsim.model import profiles

    t0 = time.perf_counter()
    sc = loader.load(case.scenario, list(case.sets))
    res = pdsim.run(sc)
    s = res.summary
    cals = {profiles.for_role(sc, cfg).calibration or "none (profile defaults)"
            for _r, cfg in sc.fleet.roles()}
    return {"id": case.id, "sim_ttft_ms": float(s["mean_ttft_ms"]),
            "sim_tpot_ms": float(s["mean_tpot_ms"]),
            "calibration": "; ".join(sorted(cals)),
            "completed": int(s["completed_requests"]), "requests": int(s["requests"]),
            "wall_s": round(time.perf_counter() - t0, 3)}


def _err(sim: float, measured: float) -> float:
    if not (math.isfinite(sim) and math.isfinite(measured)) or measured <= 0:
        return float("nan")
    return sim / measured - 1


def run(cases: list[corpus.Case], workers: int | None = None, progress: bool = False,
        sets: list[str] | tuple[str, ...] = ()) -> pd.DataFrame:
    """Simulate every case that has a scenario (with ``sets``: --set overrides of each); one
    row per case, in the cases' order."""
    todo = [c for c in cases if c.scenario is not None]
    if sets:
        todo = [dataclasses.replace(c, sets=tuple(sets)) for c in todo]
    out = {r["id"]: r for r in backends.run_all(simulate, todo, workers, progress)}
    rows = []
    for c in cases:
        r: dict[str, Any] = {"id": c.id, "gpu": c.gpu, "model": c.model, "mode": c.mode,
                             "family": c.family, "concurrency": c.concurrency, "isl": c.isl,
                             "osl": c.osl, "measured_ttft_ms": c.measured_ttft_ms,
                             "measured_tpot_ms": c.measured_tpot_ms}
        if c.skip is not None:
            r["skipped"] = str(c.skip)
        else:
            sim = out[c.id]
            r.update({k: v for k, v in sim.items() if k != "id"})
            r["ttft_error"] = _err(sim["sim_ttft_ms"], c.measured_ttft_ms)
            r["tpot_error"] = _err(sim["sim_tpot_ms"], c.measured_tpot_ms)
        rows.append(r)
    cols = ["sim_ttft_ms", "sim_tpot_ms", "calibration", "completed", "requests", "wall_s",
            "ttft_error", "tpot_error", "skipped"]
    df = pd.DataFrame(rows)
    for c in cols:  # (every column, whether or not any row ran or was skipped)
        if c not in df:
            df[c] = None if c in ("calibration", "skipped") else float("nan")
    return df


def _share(errs: list[float], within: float) -> float:
    return sum(abs(e) <= within for e in errs) / len(errs) if errs else float("nan")


def groups(df: pd.DataFrame) -> pd.DataFrame:
    """Per (GPU, model, mode): rows run and skipped, median |error| of mean TTFT and TPOT, and
    the share within +-10% and +-25%; a last row over all."""
    out = []
    ran = df[df.skipped.isna()] if "skipped" in df else df
    keys = list(dict.fromkeys(zip(df.gpu, df.model, df["mode"], strict=True)))
    for key in [*keys, None]:
        sel = df if key is None else df[(df.gpu == key[0]) & (df.model == key[1])
                                         & (df["mode"] == key[2])]
        r = ran.loc[ran.index.intersection(sel.index)]
        row = {"gpu": "all" if key is None else key[0], "model": "" if key is None else key[1],
               "mode": "" if key is None else key[2], "rows": len(sel), "ran": len(r)}
        for m in ("ttft", "tpot"):
            errs = [e for e in r[f"{m}_error"] if math.isfinite(e)] if len(r) else []
            row[f"{m}_median_abs"] = statistics.median(abs(e) for e in errs) if errs \
                else float("nan")
            row[f"{m}_within_10"] = _share(errs, 0.10)
            row[f"{m}_within_25"] = _share(errs, 0.25)
        out.append(row)
    return pd.DataFrame(out)


def load_and_run(path: str | Path = corpus.TRAIN, workers: int | None = None,
                 progress: bool = False) -> pd.DataFrame:
    return run(corpus.cases(corpus.read(path)), workers, progress)

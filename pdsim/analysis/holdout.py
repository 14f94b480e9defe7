"""Out-of-sample checks of the validation suite: refit each shipped parameter set without some
of its rows and predict those rows.

The validation table (:mod:`pdsim.analysis.validation`) simulates every published row with the
shipped profiles, whose fitted values saw most of those rows: it shows that one parameter set spans
them, not that the model predicts what it was not fitted on. ``validation/holdout.yaml`` names,
per (GPU, model) parameter set, the values that were fitted, the rows they were fitted on and
splits of those rows; :func:`run` refits the values on each split's training rows with
:func:`pdsim.model.calibrate.fit` (the code ``pdsim calibrate`` runs; no second fitting code) and
simulates the held-out rows with the refitted values, through the same cases as the table.
Every row ends up marked: ``in-sample`` (a shipped value was fitted on it; its held-out
prediction comes from the split that left it out), ``in-sample (reference)`` (fitted upstream
by a constant pdsim calibrate does not fit), ``chosen in view`` (nothing was fitted on it, but a
shipped value was chosen with its figure in view: not evidence of prediction) or
``out-of-sample`` (nothing was fitted or chosen on it). Medians count point predictions only
(:func:`pdsim.analysis.validation.is_point`): a met upper bound is not a 0% miss.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from pdsim.analysis import validation
from pdsim.model import calibrate
from pdsim.util.backends import progress_bar

IN_SAMPLE = "in-sample"
REFERENCE = "in-sample (reference)"
IN_VIEW = "chosen in view"
OUT_OF_SAMPLE = "out-of-sample"
SERVING_METRICS = {"mean_ttft_ms": "ttft_ms", "mean_tpot_ms": "tpot_ms"}
SELECTOR_KEYS = {"case", "metric", "setup", "x_min", "x_max"}


class HoldoutError(ValueError):
    """A holdout spec that cannot be used; ``str()`` is one line."""


@dataclass
class Split:
    parameter_set: str
    name: str
    train: pd.DataFrame  # published rows the refit saw
    held_out: pd.DataFrame  # published rows it did not
    params: dict[str, float] = field(default_factory=dict)
    shipped: dict[str, float] = field(default_factory=dict)
    at_bound: list[str] = field(default_factory=list)


@dataclass
class Holdout:
    table: pd.DataFrame  # validation.validate's columns + row, held_out, held_out_error, split
    splits: list[Split]

    def summary(self) -> dict[str, Any]:
        return summary(self.table)


def load_spec(root: Path = validation.ROOT) -> dict:
    path = root / "holdout.yaml"
    spec = yaml.safe_load(path.read_text()) or {}
    for i, ps in enumerate(spec.get("parameter_sets", [])):
        where = f"{path.name}: parameter_sets.{i}"
        missing = {"name", "gpu", "model", "fit", "rows", "splits"} - set(ps)
        if missing:
            raise HoldoutError(f"{where}: missing {', '.join(sorted(missing))}")
        unknown = [k for k in ps["fit"] if k not in calibrate.BOUNDS]
        if unknown:
            raise HoldoutError(f"{where}.fit: {unknown[0]!r} is not fittable by pdsim calibrate")
        for sel in [ps["rows"], *(s["train"] for s in ps["splits"])]:
            bad = set(sel) - SELECTOR_KEYS
            if bad:
                raise HoldoutError(f"{where}: unknown selector {sorted(bad)[0]!r}; allowed: "
                                   f"{', '.join(sorted(SELECTOR_KEYS))}")
    return spec


def select(pub: pd.DataFrame, sel: dict) -> pd.Series:
    """Boolean mask of the published rows a selector names."""
    mask = pd.Series(True, index=pub.index)
    for key in ("case", "metric", "setup"):
        if key in sel:
            mask &= pub[key].isin(sel[key])
    x = pub.x.astype("Float64")
    if "x_min" in sel:
        mask &= (x >= sel["x_min"]).fillna(False)
    if "x_max" in sel:
        mask &= (x <= sel["x_max"]).fillna(False)
    return mask.astype(bool)


def _key(case: str, metric: str, x: Any) -> tuple:
    return case, metric, None if x is None or pd.isna(x) else int(x)


def classify(pub: pd.DataFrame, spec: dict) -> dict[tuple, tuple[str, str]]:
    """(case, metric, x) -> (row kind, what it was fitted in / why) for every published row."""
    out: dict[tuple, tuple[str, str]] = {}
    for ref in spec.get("reference_fits", []):
        for r in pub[select(pub, ref["rows"])].itertuples(index=False):
            out[_key(r.case, r.metric, r.x)] = (REFERENCE, " ".join(ref["why"].split()))
    for ch in spec.get("chosen_in_view", []):
        for r in pub[select(pub, ch["rows"])].itertuples(index=False):
            out[_key(r.case, r.metric, r.x)] = (IN_VIEW, " ".join(ch["why"].split()))
    for ps in spec.get("parameter_sets", []):
        for r in pub[select(pub, ps["rows"])].itertuples(index=False):
            k = _key(r.case, r.metric, r.x)
            if k in out:
                raise HoldoutError(f"holdout.yaml: row {k} is in two parameter sets")
            out[k] = (IN_SAMPLE, ps["name"])
    for r in pub.itertuples(index=False):
        out.setdefault(_key(r.case, r.metric, r.x), (OUT_OF_SAMPLE, "nothing fitted on it"))
    return out


def splits(pub: pd.DataFrame, ps: dict) -> list[Split]:
    """The splits of one parameter set: training and held-out published rows."""
    rows = pub[select(pub, ps["rows"])]
    if rows.empty:
        raise HoldoutError(f"holdout.yaml: parameter set {ps['name']!r} selects no rows")
    out, held = [], pd.Series(0, index=rows.index)
    for sp in ps["splits"]:
        train_mask = select(rows, sp["train"])
        train, held_out = rows[train_mask], rows[~train_mask]
        if train.empty or held_out.empty:
            raise HoldoutError(f"holdout.yaml: split {sp['name']!r} of {ps['name']!r} leaves "
                               f"no {'training' if train.empty else 'held-out'} rows")
        held[held_out.index] += 1
        out.append(Split(ps["name"], sp["name"], train, held_out))
    if (held != 1).any():
        bad = rows[held != 1].iloc[0]
        raise HoldoutError(f"holdout.yaml: in {ps['name']!r} the row {bad.case} {bad.metric} "
                           f"x={bad.x} is held out in {held[held != 1].iloc[0]} splits (give 1)")
    return out


def training_table(rows: pd.DataFrame, root: Path = validation.ROOT
                   ) -> tuple[pd.DataFrame, dict | None]:
    """Published rows as a ``pdsim calibrate`` table (and the serving rows' base scenario):
    one-forward throughputs become ``bench_one_batch`` step rows, simulated TTFT/TPOT rows
    ``bench_serving`` rows of the case's scenario."""
    from pdsim.config import loader

    specs = validation._load_cases(root)
    steps, serving, bases = [], [], {}
    for r in rows.itertuples(index=False):
        spec = specs[r.case]
        sc = validation._scenario(root, spec, [])
        x = None if pd.isna(r.x) else int(r.x)
        measure = spec["measure"]
        if measure in ("prefill_step", "decode_step"):
            role = "prefill" if measure == "prefill_step" else "decode"
            cfg = getattr(sc.fleet, role)
            per_node = validation.ranks_per_node(sc, role)
            if role == "prefill":
                tokens = spec["tokens_per_rank"]
                batch, step_s = tokens / x, per_node * tokens / r.value
            else:
                batch = spec["batch_per_rank"]
                step_s = per_node * batch / r.value
            steps.append({"phase": role, "batch_size": batch, "input_len": x,
                          "step_ms": step_s * 1e3, "tp": cfg.tp, "dp": cfg.dp,
                          "dp_attention": cfg.dp_attention, "ep": cfg.ep,
                          "tbo": sc.predictor.two_batch_overlap,
                          "expert_imbalance": sc.predictor.expert_imbalance,
                          "moe_a2a_backend": cfg.moe_a2a_backend,
                          "moe_dense_tp_size": cfg.moe_dense_tp_size,
                          "enable_dp_lm_head": cfg.enable_dp_lm_head,
                          "deepep_ll_nvlink": cfg.deepep_ll_nvlink})
        elif measure == "run" and r.metric in SERVING_METRICS:
            if spec.get("vary") != "clients.0.dataset.input_len" or x is None:
                raise HoldoutError(f"{r.case}: a serving row needs vary: "
                                   f"clients.0.dataset.input_len and an x")
            client = sc.clients[0]
            serving.append({"input_len": x, "output_len": client.dataset.output_len,
                            "max_concurrency": client.max_concurrency,
                            "num_prompts": client.num_prompts,
                            "request_rate": client.request_rate,
                            SERVING_METRICS[r.metric]: r.value})
            data = loader.read_yaml(root / spec["scenario"])
            bases[r.case] = loader.apply_overrides(data, list(spec.get("sets", [])))
        else:
            raise HoldoutError(f"{r.case}: pdsim calibrate cannot fit {r.metric} rows "
                               f"(measure {measure})")
    if steps and serving:
        raise HoldoutError("one parameter set's rows are either step rows or serving rows")
    if len(bases) > 1:
        raise HoldoutError(f"serving rows of one split come from one case, got {sorted(bases)}")
    table = pd.DataFrame(steps or serving)
    return table, (dict(next(iter(bases.values()))) if bases else None)


def refit(split: Split, ps: dict, root: Path = validation.ROOT) -> Split:
    """Fit the parameter set's values on the split's training rows only."""
    from pdsim.model import profiles

    table, base = training_table(split.train, root)
    bounds = {k: tuple(v) for k, v in (ps.get("bounds") or {}).items()}
    fit = calibrate.fit(table, ps["gpu"], ps["model"], ps.get("engine", "sglang"),
                        keys=list(ps["fit"]), base=base, start=ps.get("start"), bounds=bounds,
                        source=f"holdout split {split.name!r}")
    res = profiles.resolve(ps["gpu"], ps["model"], ps.get("engine", "sglang"))
    split.params = fit.params
    split.shipped = {k: float(getattr(res.gpu if k.startswith("gpu.") else res.engine,
                                      k.split(".", 1)[1])) for k in ps["fit"]}
    for k, v in fit.params.items():
        lo, hi = calibrate._narrowed(k, bounds.get(k))
        if math.isclose(v, lo, rel_tol=1e-3) or math.isclose(v, hi, rel_tol=1e-3):
            split.at_bound.append(k)
    return split


def run(cases: list[str] | None = None, root: Path = validation.ROOT,
        progress: bool = False, published: pd.DataFrame | None = None) -> Holdout:
    """The validation table (shipped parameters) with each row's held-out prediction.

    ``published``: the published rows to use (default: ``validation/published.csv``); the fits
    always use every row of a parameter set, ``cases`` only narrows the rows shown."""
    pub = validation.published(root) if published is None else published
    spec = load_spec(root)
    table = validation.validate(cases, root, progress=progress, rows=pub)
    kinds = classify(pub, spec)
    all_splits = [(sp, ps) for ps in spec.get("parameter_sets", []) for sp in splits(pub, ps)]
    shown = {_key(r.case, r.metric, r.x) for r in table.itertuples(index=False)}
    todo = [(sp, ps) for sp, ps in all_splits
            if any(_key(r.case, r.metric, r.x) in shown for r in sp.held_out.itertuples())]
    bar = progress_bar(len(todo), enabled=progress, unit="split", desc="holdout fits")
    held: dict[tuple, tuple[float, float, str]] = {}
    done = []
    with bar:
        for sp, ps in todo:
            refit(sp, ps, root)
            sets = [f"{k}={v!r}" for k, v in sp.params.items()]
            rows = sp.held_out[[_key(r.case, r.metric, r.x) in shown
                                for r in sp.held_out.itertuples()]]
            pred = validation.validate(None, root, extra_sets=sets, rows=rows)
            for r in pred.itertuples(index=False):
                held[_key(r.case, r.metric, r.x)] = (r.simulated, r.error, sp.name)
            done.append(sp)
            bar.update()
    kind, why, h_sim, h_err, h_split = [], [], [], [], []
    for r in table.itertuples(index=False):
        k = _key(r.case, r.metric, r.x)
        kd, wh = kinds[k]
        kind.append(kd)
        why.append(wh)
        if kd == IN_SAMPLE:
            s, e, name = held[k]
        elif kd in (OUT_OF_SAMPLE, IN_VIEW):  # nothing was fitted on it: nothing to refit
            s, e, name = r.simulated, r.error, ""
        else:
            s, e, name = math.nan, math.nan, ""
        h_sim.append(s)
        h_err.append(e)
        h_split.append(name)
    table = table.assign(row=kind, fitted_in=why, held_out=h_sim, held_out_error=h_err,
                         split=h_split)
    return Holdout(table, done)


def mark(table: pd.DataFrame, root: Path = validation.ROOT) -> pd.DataFrame:
    """``validate``'s table with each row marked in-sample / out-of-sample (no refits)."""
    kinds = classify(validation.published(root), load_spec(root))
    marks = [kinds[_key(r.case, r.metric, r.x)] for r in table.itertuples(index=False)]
    return table.assign(row=[m[0] for m in marks], fitted_in=[m[1] for m in marks])


def _median(rows: pd.DataFrame, column: str = "error") -> tuple[int, float]:
    """(count, median |value|) of ``column`` over the point predictions among ``rows``."""
    vals = [abs(e) for e, m in zip(rows[column], rows.metric, strict=True)
            if validation.is_point(m) and not pd.isna(e)]
    return len(vals), (statistics.median(vals) if vals else math.nan)


def summary(table: pd.DataFrame) -> dict[str, Any]:
    """Median |error| of the shipped parameters and of the held-out predictions, per kind."""
    out: dict[str, Any] = {"all_shipped": _median(table)}
    if "row" not in table:
        return out
    ins = table[table.row == IN_SAMPLE]
    out["in_sample_shipped"] = _median(ins)
    if "held_out_error" in table:
        out["in_sample_held_out"] = _median(ins, "held_out_error")
        out["all_held_out"] = _median(table[table.row != IN_VIEW], "held_out_error")
    out["out_of_sample"] = _median(table[table.row == OUT_OF_SAMPLE])
    out["in_view"] = _median(table[table.row == IN_VIEW])
    out["reference"] = _median(table[table.row == REFERENCE])
    return out


def summary_lines(table: pd.DataFrame) -> list[str]:
    s = summary(table)

    def fmt(key: str) -> str:
        n, m = s[key]
        return f"{m:.1%} over {n} rows" if n else "no rows"

    lines = [f"median |error| with the shipped parameters: {fmt('all_shipped')}"]
    if "in_sample_shipped" in s:
        lines.append(f"  rows a shipped value was fitted on (in-sample): "
                     f"{fmt('in_sample_shipped')}")
        if "in_sample_held_out" in s:
            lines.append(f"  the same rows held out of the refit (held-out): "
                         f"{fmt('in_sample_held_out')}")
            ins = table[table.row == IN_SAMPLE]
            for name, grp in ins.groupby("fitted_in", sort=False):
                n, m_in = _median(grp)
                _n, m_out = _median(grp, "held_out_error")
                worst = grp.held_out_error.abs().max()
                lines.append(f"    {name}: in-sample {m_in:.1%}, held out {m_out:.1%} "
                             f"(worst {worst:.1%}) over {n} rows")
        lines.append(f"  rows nothing was fitted or chosen on (out-of-sample): "
                     f"{fmt('out_of_sample')}")
        lines.append(f"  rows nothing was fitted on but a value was chosen with them in view "
                     f"(chosen in view, not counted as out-of-sample): {fmt('in_view')}")
        lines.append(f"  rows fitted upstream, not refittable (reference): {fmt('reference')}")
    if "all_held_out" in s:
        lines.append(f"median |error| of every prediction made without its row (held-out and "
                     f"out-of-sample): {fmt('all_held_out')}")
    lines.append("(medians over point predictions only: a met upper bound is not a 0% row)")
    return lines


def fits_text(splits_: list[Split]) -> str:
    """One line per split: the refitted values next to the shipped ones."""
    lines = []
    for sp in splits_:
        vals = ", ".join(
            f"{k} {sp.shipped[k]:.4g} -> {v:.4g}{' (at bound)' if k in sp.at_bound else ''}"
            for k, v in sp.params.items())
        lines.append(f"{sp.parameter_set}, {sp.name} ({len(sp.train)} rows fitted, "
                     f"{len(sp.held_out)} held out): {vals}")
    return "\n".join(lines)

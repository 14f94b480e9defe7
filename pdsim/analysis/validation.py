"""The validation suite: published measurements of real PD deployments against pdsim.

``validation/published.csv`` holds the published figures (with ``validation/README.md``: their
sources and setups); ``validation/cases.yaml`` says how each case is reproduced: a scenario
(the setup), and a measure (a full simulation, or one forward of the role's ranks for the
per-node throughputs that were measured at a fixed batch). ``validate()`` returns published vs
simulated vs error per row; ``pdsim validate-model`` prints it and can write it into the docs
(``--write-docs docs/validation.md``).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from pdsim.util.backends import progress_bar

ROOT = Path(__file__).resolve().parents[2] / "validation"
README_BEGIN = "<!-- validate-model:begin -->"  # the block --write-docs replaces (the names
README_END = "<!-- validate-model:end -->"  # are from when that block was in the README)


def _load_cases(root: Path) -> dict[str, dict]:
    return yaml.safe_load((root / "cases.yaml").read_text())


def published(root: Path = ROOT) -> pd.DataFrame:
    return pd.read_csv(root / "published.csv", dtype={"x": "Int64"})


def _scenario(root: Path, spec: dict, extra: list[str]) -> Any:
    from pdsim.config import loader

    return loader.load(root / spec["scenario"], list(spec.get("sets", [])) + extra)


def ranks_per_node(sc: Any, role_name: str) -> int:
    """Ranks of ``role_name`` (prefill/decode) on one node: per-node figures are per-rank
    figures times this."""
    from pdsim.model import profiles

    role = getattr(sc.fleet, role_name)
    gpus_per_rank = role.tp // role.dp if role.dp_attention else role.tp
    return max(1, profiles.for_scenario(sc).gpu.gpus_per_node // gpus_per_rank)


def _step_predictor(sc: Any, role_name: str) -> tuple[Any, Any, int]:
    from pdsim.model import predictor, profiles

    role = getattr(sc.fleet, role_name)
    prof = profiles.for_role(sc, role)
    gather = role.dp if role.dp_attention else 1
    lay = predictor.layout_for(role, sc.predictor, gather, prof.gpu, sc.engine.version)
    pred = predictor.build(sc.predictor, prof.gpu, prof.model, role.tp, gather, prof.engine, lay)
    return pred, prof, ranks_per_node(sc, role_name)


def prefill_step_rate(sc: Any, tokens_per_rank: int, prompt_len: int) -> float:
    """Prefill tokens/s per node when every rank runs forwards of ``tokens_per_rank`` tokens
    made of ``prompt_len``-token prompts."""
    pred, _prof, per_node = _step_predictor(sc, "prefill")
    reqs = tokens_per_rank / prompt_len
    pairs = reqs * prompt_len * (prompt_len + 1) / 2
    t = pred.prefill(tokens_per_rank, reqs * prompt_len**2, pairs, reqs, 0, tokens_per_rank)
    return per_node * tokens_per_rank / t


def decode_step_rate(sc: Any, batch_per_rank: int, context: int) -> float:
    """Output tokens/s per node when every rank decodes ``batch_per_rank`` sequences of
    ``context`` tokens."""
    pred, _prof, per_node = _step_predictor(sc, "decode")
    t = pred.decode(batch_per_rank, batch_per_rank * context, batch_per_rank)
    return per_node * batch_per_rank / t


def _run_metric(res: Any, metric: str) -> float:
    s = res.summary
    if metric == "transfer_ms":
        m = res.measured
        m = m[m.status == "completed"]
        return float(((m.t_transfer_done - m.t_prefill_end) * 1e3).mean())
    if metric == "input_throughput_tok_s":  # bench_serving's "Input token throughput"
        return float(s["total_input_tokens"]) / float(s["duration_s"])
    key = metric.removesuffix("_upper_bound")
    return float(s[key])


def is_point(metric: str) -> bool:
    """A row that publishes a value to predict (not a bound a simulation only has to meet):
    medians count these only, since a met bound's error is 0 by definition, not a 0% miss."""
    return not metric.endswith("_upper_bound")


def error(published_value: float, simulated: float, metric: str) -> float:
    """Signed relative error; an upper bound is met (0) unless the simulation exceeds it."""
    if metric.endswith("_upper_bound"):
        return max(0.0, simulated - published_value) / published_value
    return (simulated - published_value) / published_value


def shown_error(err: float, metric: str) -> str:
    """An error as the table prints it: a met upper bound says so (its error is 0 by
    definition, which "+0.0%" would show as an exact match)."""
    if metric.endswith("_upper_bound") and err == 0:
        return "within bound"
    return f"{err:+.1%}"


def validate(cases: list[str] | None = None, root: Path = ROOT, extra_sets: list[str] = (),
             progress: bool = False, rows: pd.DataFrame | None = None) -> pd.DataFrame:
    """Published vs simulated for every row (or the rows of ``cases``, or the given rows of
    ``published()``)."""
    import pdsim

    specs = _load_cases(root)
    pub = published(root) if rows is None else rows
    if cases:
        unknown = set(cases) - set(specs)
        if unknown:
            raise ValueError(f"unknown case(s) {sorted(unknown)}; known: {', '.join(specs)}")
        pub = pub[pub.case.isin(cases)]
    out = []
    runs: dict[tuple, Any] = {}
    with progress_bar(len(pub), enabled=progress, unit="row", desc="validate-model") as bar:
        for row in pub.itertuples(index=False):
            spec = specs[row.case]
            x = None if pd.isna(row.x) else int(row.x)
            sets = list(extra_sets)
            if spec.get("vary") and x is not None:
                sets.append(f"{spec['vary']}={x}")
            sc = _scenario(root, spec, sets)
            measure = spec["measure"]
            if measure == "run":
                key = (row.case, x)
                if key not in runs:
                    runs[key] = pdsim.run(sc)
                sim = _run_metric(runs[key], row.metric)
            elif measure == "prefill_step":
                sim = prefill_step_rate(sc, spec["tokens_per_rank"], x)
            elif measure == "decode_step":
                sim = decode_step_rate(sc, spec["batch_per_rank"], x)
            else:
                raise ValueError(f"{row.case}: unknown measure {measure!r}")
            out.append({"case": row.case, "metric": row.metric, "x": x, "published": row.value,
                        "simulated": round(sim, 2), "error": error(row.value, sim, row.metric),
                        "unit": row.unit, "source": row.source, "setup": row.setup})
            bar.update()
    return pd.DataFrame(out)


def summary(df: pd.DataFrame) -> dict:
    """Median and max |error| and the share within 25% over the point predictions
    (:func:`is_point`); ``bounds`` counts the bound rows and ``bounds_met`` those met."""
    point = [is_point(m) for m in df.metric]
    errs = [abs(e) for e, p in zip(df.error, point, strict=True) if p and not math.isnan(e)]
    bound_errs = [e for e, p in zip(df.error, point, strict=True) if not p]
    return {"rows": len(errs), "median_abs_error": statistics.median(errs) if errs else 0.0,
            "max_abs_error": max(errs) if errs else 0.0,
            "within_25pct": sum(e <= 0.25 for e in errs), "bounds": len(bound_errs),
            "bounds_met": sum(e == 0 for e in bound_errs)}

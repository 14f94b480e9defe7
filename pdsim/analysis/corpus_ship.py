"""Which corpus parameter sets ship, and the shipped calibrations: the ship rule over the fit
record ``validation/corpus/fits.yaml`` (:mod:`pdsim.analysis.corpus_fit` writes it) and the
corpus block of ``pdsim/model/data/calibrations.yaml`` it gives.

A set ships (:func:`ships`) only with every value inside its physical range
(:data:`~pdsim.analysis.corpus_fit.PHYSICAL`), none pulling against an end of it (the
relaxation test: :func:`~pdsim.analysis.corpus_fit.relax` refits, :func:`not_pulling` reads
it), and its cross-validated error within :data:`SHIP_MAX_CV_ERROR`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pdsim.analysis import corpus
from pdsim.analysis.corpus_fit import PHYSICAL, kept_start, unphysical

RELAX_GAIN = 0.01
"""The relaxation test (``corpus_fit.relax``) calls a value pressed against an end of its
physical range *pulling* when, refitted with that end moved out (``corpus_fit.widened``), it
leaves the range and the cost falls by more than this share: the rows want a value physics does
not allow, so the value is absorbing a missing mechanism's error. Chosen (labelled so) with the
fit-design analysis's figures in view: with the Triton expert rate removed (a known-correct
mechanism deleted) the DeepSeek-R1/GLM-5 fit gained 2.8% by leaving its range; with it, under
0.01%. The fit stops at a relative change of ``corpus_fit.FTOL`` (0.1%), so a gain under 1% is
not told from the fit's own tolerance."""


SHIP_MAX_CV_ERROR = 0.5
"""A set ships (calibrations.yaml) unless its cross-validated median |error| of mean TTFT or
TPOT exceeds this: it then does not predict its own family's held-out rows, and shipped it would
move every scenario of that family on that die (the capacity examples' Llama-3.1-70B on H100,
for one) by values the model cannot tie to a mechanism. Chosen with the sets' cross-validated
figures in view; the record keeps every set, shipped or not."""
BLOCK_BEGIN = "# --- corpus fits (pdsim validate-model --fit): begin"
BLOCK_END = "# --- corpus fits: end"


def _rows_line(s: dict[str, Any], cases: dict[str, corpus.Case]) -> str:
    """Which rows a set was fitted on, by what they are (the ids: the fit record)."""
    what: dict[tuple, int] = {}
    for rid in s["rows"]:
        c = cases.get(rid)
        key = (c.gpu, c.model, c.mode) if c else (rid,)
        what[key] = what.get(key, 0) + 1
    parts = [f"{n} {' '.join(k)}" for k, n in what.items()]
    return (f"[fitted] corpus training split (validation/corpus/aic_sglang_hopper_train.csv), "
            f"{len(s['rows'])} distinct rows: {'; '.join(parts)} (ids: validation/corpus/"
            f"fits.yaml)")


def cv_errors(s: dict[str, Any], cases: dict[str, corpus.Case]) -> tuple[float, float]:
    """A set's cross-validated median |error| of mean TTFT and TPOT (nan: no folds)."""
    pred = (s.get("cv") or {}).get("predictions", {})
    errs = [(abs(p[0] / cases[k].measured_ttft_ms - 1), abs(p[1] / cases[k].measured_tpot_ms - 1))
            for k, p in pred.items() if k in cases]
    if not errs:
        return float("nan"), float("nan")
    t, p = zip(*errs, strict=True)
    return float(np.median(t)), float(np.median(p))


def not_pulling(s: dict[str, Any]) -> set[str]:
    """The values of a record's set pressed against an end of their range that passed the
    relaxation test (``corpus_fit.relax``): refitted with that end moved out, the value stayed
    inside its physical range or the cost fell by no more than :data:`RELAX_GAIN` (held at the
    end, not pulling past it)."""
    r = s.get("relaxation") or {}
    if not r.get("widened"):
        return set()
    out = set()
    for k in r["widened"]:
        lo, hi = PHYSICAL[k]
        v = r["values"].get(k, math.nan)
        if lo <= v <= hi or r.get("gain", math.inf) <= RELAX_GAIN:
            out.add(k)
    return out


def ships(s: dict[str, Any], cases: dict[str, corpus.Case]) -> tuple[bool, str]:
    """Whether a set of the record ships, and why not: every value inside its physical range
    (:data:`PHYSICAL`), none pressed against an end of it unless the relaxation test found it
    not pulling (:func:`not_pulling`; bounded there, a value that would leave the range when
    let is absorbing a missing mechanism's error as far as physics allows; a value at a lower
    end of 0 cannot be tested and does not ship), and the cross-validated errors within
    :data:`SHIP_MAX_CV_ERROR`."""
    held = not_pulling(s)
    bad = {k: v for k, v in unphysical(s["values"]).items() if k not in held}
    if bad:
        r = s.get("relaxation") or {}
        why = []
        for k, v in bad.items():
            if k in r.get("widened", {}):
                a, b = r["widened"][k]
                v += (f", and pulling: refitted in [{a:g}, {b:g}] it went to "
                      f"{r['values'][k]:g} and the cost fell {r['gain']:.1%}")
            why.append(v)
        return False, ("not shipped: outside or pressed against its physical range ("
                       + "; ".join(why) + ")")
    t, p = cv_errors(s, cases)
    if (math.isfinite(t) and t > SHIP_MAX_CV_ERROR) or (math.isfinite(p)
                                                        and p > SHIP_MAX_CV_ERROR):
        return False, (f"not shipped: cross-validated median |error| TTFT {t:.0%}, TPOT "
                       f"{p:.0%} (more than {SHIP_MAX_CV_ERROR:.0%})")
    return True, ""


def calibration_entries(record: dict[str, Any], cases: list[corpus.Case]) -> list[dict]:
    """The record's sets that ship (:func:`ships`) as ``calibrations:`` entries (written for the
    die and the family, holding for the layout they were fitted in), each value naming its
    rows."""
    by_id = {c.id: c for c in cases}
    out = []
    for s in record.get("sets", []):
        if not ships(s, by_id)[0]:
            continue
        src = _rows_line(s, by_id)
        note = ("Fitted by pdsim validate-model --fit (pdsim/analysis/corpus_fit.py): "
                "least squares on the log errors of mean TTFT and TPOT, full simulations of "
                "the generated scenarios, "
                + (f"the lowest cost of {len(s['starts'])} fixed starts (this one from "
                   f"{kept_start(s)}); "
                   if s.get("starts") else "from the shipped values; ")
                + f"{s['evaluations']} evaluations.")
        sets = {}
        for k, v in s["values"].items():
            at = s.get("at_bound", {}).get(k)
            sets[k] = {"value": v, "source": src + (f"; at its {at}" if at else "")}
        out.append({"die": s["die"], "family": s["family"], "engine": s["engine"],
                    "layout": s["layout"], "note": note, "set": sets})
    return out


def write_calibrations(entries: list[dict], path: Any) -> None:
    """Replace the corpus block of a calibrations file (``calibrations.yaml``) with
    ``entries``."""
    import yaml

    text = path.read_text()
    if BLOCK_BEGIN not in text or BLOCK_END not in text:
        raise ValueError(f"{path}: no '{BLOCK_BEGIN}' ... '{BLOCK_END}' block to replace")
    head, rest = text.split(BLOCK_BEGIN, 1)
    _old, tail = rest.split(BLOCK_END, 1)
    body = yaml.safe_dump(entries, sort_keys=False, width=100, allow_unicode=True)
    body = "".join(f"  {ln}\n" if ln else "\n" for ln in body.splitlines())
    path.write_text(f"{head}{BLOCK_BEGIN}\n{body}  {BLOCK_END}{tail}")

"""SLO attainment and goodput, over a whole run or over a window of it.

Why windows: a run's length depends on what happened in it (a closed loop of fixed prompts ends
when its last prompt does, later under a fault), so a figure normalised by the run's length
mixes "how much was done" with "how long it took". A figure over a fixed window of simulated
time ([a, b), the same for every policy and seed compared) measures one thing: what the fleet
delivered in that stretch.

Two denominators, each where it means something:

- **attainment** is over the requests that *arrived* in the window: the share of them that
  completed within the SLO (a request still unfinished when the run ended, or one that failed,
  did not meet it). A fault harms the requests that arrive during it, whenever they end.
- **goodput** is over the window's length, counting requests that *completed* in it within the
  SLO (``goodput_req_s``) and their generated tokens (``goodput_tok_s``); ``completed_tok_s``
  counts every completed request's tokens, SLO or not, and ``errors`` the requests that ended
  failed or timed out in the window.

The request columns are :func:`pdsim.engine.summary.columns`' (``status`` as its index in
``STATUSES``), so a run's summary and a what-if read the same arrays without pandas.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from pdsim.engine.summary import COMPLETED, FAILED, TIMED_OUT

if TYPE_CHECKING:
    from pdsim.config.scenario import SLOConfig


def met(col: dict[str, np.ndarray], slo: SLOConfig) -> np.ndarray:
    """Per request: completed, and within each threshold ``slo`` sets."""
    t_arrival, t_first, t_done = col["t_arrival"], col["t_first_token"], col["t_done"]
    gen = col["generated"]
    ok = col["status"] == COMPLETED
    with np.errstate(invalid="ignore", divide="ignore"):
        if slo.ttft_ms is not None:
            ok &= (t_first - t_arrival) * 1e3 <= slo.ttft_ms
        if slo.tpot_ms is not None:  # a one-token output has no TPOT to miss
            tpot = np.where(gen > 1, (t_done - t_first) / np.maximum(gen - 1, 1), 0.0)
            ok &= tpot * 1e3 <= slo.tpot_ms
        if slo.e2e_ms is not None:
            ok &= (t_done - t_arrival) * 1e3 <= slo.e2e_ms
    return ok


def window(col: dict[str, np.ndarray], slo: SLOConfig, a: float, b: float,
           ok: np.ndarray | None = None) -> dict:
    """Attainment, goodput and errors over the simulated window [a, b) (module docstring).
    ``ok``: :func:`met`'s array when the caller has it (several windows of one run)."""
    if ok is None:
        ok = met(col, slo)
    span = b - a
    t_arrival, t_done, gen = col["t_arrival"], col["t_done"], col["generated"]
    status = col["status"]
    arrived = (t_arrival >= a) & (t_arrival < b)
    with np.errstate(invalid="ignore"):
        ended = (t_done >= a) & (t_done < b)
    done_here = ended & (status == COMPLETED)
    good_here = ended & ok
    n_arrived = int(arrived.sum())
    n_met = int((arrived & ok).sum())
    return {
        "from_s": round(float(a), 3), "to_s": round(float(b), 3),
        "arrived": n_arrived,
        "met_slo": n_met,
        "attainment": round(n_met / n_arrived, 4) if n_arrived else None,
        "goodput_req_s": round(int(good_here.sum()) / span, 3) if span > 0 else None,
        "goodput_tok_s": round(float(gen[good_here].sum()) / span, 2) if span > 0 else None,
        "completed_tok_s": round(float(gen[done_here].sum()) / span, 2) if span > 0 else None,
        "errors": int((ended & ((status == FAILED) | (status == TIMED_OUT))).sum()),
    }


def summary(col: dict[str, np.ndarray], slo: SLOConfig, t0: float, t_end: float) -> dict:
    """The run's SLO block: its thresholds, attainment over every measured request (arrived from
    ``t0``) and goodput over [t0, t_end], and whether the fleet met the SLO."""
    ok = met(col, slo)
    n = len(ok)
    n_met = int(ok.sum())
    span = t_end - t0 if np.isfinite(t_end) and t_end > t0 else float("nan")
    attainment = n_met / n if n else None
    return {
        "ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms, "e2e_ms": slo.e2e_ms,
        "attainment_target": slo.attainment,
        "met_slo": n_met,
        "attainment": round(attainment, 4) if attainment is not None else None,
        "meets_slo": bool(attainment is not None and attainment >= slo.attainment),
        "goodput_req_s": round(n_met / span, 3) if np.isfinite(span) else None,
        "goodput_tok_s": round(float(col["generated"][ok].sum()) / span, 2)
        if np.isfinite(span) else None,
    }

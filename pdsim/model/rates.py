"""Rates a step-time model divides by (peak FLOP/s, HBM, NVLink and RDMA bytes/s): each
must be positive and finite, and the largest step any scenario allows must take a finite time.
Products of valid fields can underflow (``gpu.gemm_eff`` and ``gpu.bf16_tflops`` of 1e-300
each: a peak of 0 FLOP/s, a division by zero in a run that validate had accepted); the
predictors check their rates as they are built (``pdsim.model.predictor``), and
``pdsim.model.memory`` checks the largest step when a scenario loads, so validate and run
refuse the same, in one line.
"""

from __future__ import annotations

import math
from typing import Any

from pdsim.config.units import MAX_RUNNING, MAX_TOKENS


class RateError(ValueError):
    """Rates (peak FLOP/s, bandwidths) with which a step takes no finite, positive time: a
    product of valid fields that underflows to 0 (``gpu.gemm_eff`` and ``gpu.bf16_tflops`` of
    1e-300 each), or one so small that the largest step overflows. ``key``: the section to
    blame (``gpu`` or ``predictor``); ``str()`` is the one-line message."""

    def __init__(self, key: str, msg: str) -> None:
        super().__init__(msg)
        self.key = key


def check_rates(key: str, rates: list[tuple[str, float]]) -> None:
    """Each rate ``(what, value)`` is a positive, finite number (work over it is a time)."""
    for what, v in rates:
        if not (v > 0 and math.isfinite(v)):
            got = "0 (the product underflows)" if v == 0 else f"{v!r}"
            raise RateError(key, f"{what} is {got}: no step could take a finite time; raise it")


def check_step_times(pred: Any, key: str = "gpu") -> None:
    """The largest step any scenario may ask of ``pred`` (a ``pdsim.model.predictor``
    predictor) takes a finite time (step times grow with tokens, context and sequences:
    every smaller step then does too). Its rates, if it has them, are named when it does not.
    Raises :class:`RateError`."""
    tokens = float(MAX_TOKENS)  # a forward's chunk budget, and each prompt's length
    context = 2.0 * MAX_TOKENS  # a sequence's input and output
    try:
        times = (pred.prefill(tokens, tokens * (tokens + context),
                              tokens * context + tokens * (tokens + 1) / 2, MAX_RUNNING,
                              MAX_RUNNING * context, tokens),
                 pred.decode(MAX_RUNNING, MAX_RUNNING * context, MAX_RUNNING))
    except (ArithmeticError, ValueError):
        times = (math.nan,)
    if all(math.isfinite(t) and t >= 0 for t in times):
        return
    rates = sorted(getattr(pred, "rates", list)(), key=lambda r: r[1])
    slowest = "; ".join(f"{what} is {v:.3g}" for what, v in rates[:2])
    raise RateError(key, f"the largest step a scenario allows ({MAX_TOKENS:,} tokens, "
                         f"{MAX_RUNNING:,} sequences) takes no finite time with these rates"
                         f"{f' (slowest: {slowest})' if slowest else ''}; raise them")

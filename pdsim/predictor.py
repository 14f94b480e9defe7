"""Step-latency predictors: swappable objects mapping a batch to seconds.

Both implement ``prefill(tokens, sq_tokens)`` (sum of new tokens and sum of squared chunk
lengths in the forward) and ``decode(batch, context)`` (requests and summed context tokens).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from pdsim.profiles import GPU, Model
from pdsim.scenario import PredictorConfig

FITTED_KEYS = ("prefill_a_ms", "prefill_b_ms_per_ktok", "prefill_c_ms_per_mtok2",
               "decode_a_ms", "decode_b_ms_per_ktok", "decode_c_ms_per_seq")


class Predictor(Protocol):
    def prefill(self, tokens: int, sq_tokens: float) -> float: ...
    def decode(self, batch: int, context: int) -> float: ...


@dataclass(frozen=True)
class FittedPredictor:
    """``prefill = a + b*sum(tokens) + c*sum(len^2)``; ``decode = a + b*sum(context) + c*batch``.

    Coefficients come from the model profile (``fitted.<GPU>``) and are in ms.
    """

    prefill_a_ms: float
    prefill_b_ms_per_ktok: float
    prefill_c_ms_per_mtok2: float
    decode_a_ms: float
    decode_b_ms_per_ktok: float
    decode_c_ms_per_seq: float

    def prefill(self, tokens: int, sq_tokens: float) -> float:
        return (self.prefill_a_ms + self.prefill_b_ms_per_ktok * tokens / 1e3
                + self.prefill_c_ms_per_mtok2 * sq_tokens / 1e6) / 1e3

    def decode(self, batch: int, context: int) -> float:
        return (self.decode_a_ms + self.decode_b_ms_per_ktok * context / 1e3
                + self.decode_c_ms_per_seq * batch) / 1e3


@dataclass(frozen=True)
class RooflinePredictor:
    """Analytical roofline for one DP rank.

    Prefill is compute-bound: ``2*active_params*tokens`` plus attention ``~4*layers*hidden*len^2``
    FLOPs over ``prefill_mfu`` of peak. Decode is memory-bound: weights read once per step plus
    the batch's KV, over ``hbm_derate`` of HBM bandwidth. Under DP attention the MLP/MoE is
    tensor-parallel over ``tp`` GPUs and gathers the tokens of all ``dp_gather`` ranks, so one
    rank's token costs ``dp_gather * 2 * active / tp`` FLOPs of one GPU (assuming the ranks are
    equally loaded). A fixed ``overhead`` (kernel launches, scheduler) is added per step; decode
    takes the larger of its memory and compute times.
    """

    gpu: GPU
    model: Model
    tp: int
    dp_gather: int = 1
    prefill_mfu: float = 0.35
    hbm_derate: float = 0.8
    overhead_s: float = 0.005

    @property
    def _flops(self) -> float:
        peak = self.gpu.fp8_tflops if self.model.weight_bytes <= 1 else self.gpu.bf16_tflops
        return peak * 1e12

    def prefill(self, tokens: int, sq_tokens: float) -> float:
        m = self.model
        flops = 2 * m.params_active_b * 1e9 * tokens * self.dp_gather / self.tp
        flops += 4 * m.layers * m.hidden_size * sq_tokens / self.tp
        return self.overhead_s + flops / (self._flops * self.prefill_mfu)

    def decode(self, batch: int, context: int) -> float:
        m = self.model
        weights = m.params_total_b * 1e9 * m.weight_bytes / self.tp
        kv = context * m.kv_bytes_per_token
        memory = (weights + kv) / (self.gpu.hbm_tbps * 1e12 * self.hbm_derate)
        compute = (2 * m.params_active_b * 1e9 * batch * self.dp_gather / self.tp
                   / (self._flops * self.prefill_mfu))
        return self.overhead_s + max(memory, compute)


def build(cfg: PredictorConfig, gpu: GPU, model: Model, tp: int, dp_gather: int = 1) -> Predictor:
    """Make the predictor a scenario asks for (``dp_gather``: dp under DP attention, else 1)."""
    if cfg.kind == "roofline":
        return RooflinePredictor(gpu, model, tp, dp_gather, cfg.prefill_mfu, cfg.hbm_derate,
                                 cfg.step_overhead_ms / 1e3)
    fitted = (model.fitted or {}).get(gpu.name)
    coeffs = dict(fitted or {})
    coeffs.update(cfg.coefficients)
    unknown = set(cfg.coefficients) - set(FITTED_KEYS)
    if unknown:
        raise ValueError(f"predictor.coefficients: unknown {sorted(unknown)}; "
                         f"allowed: {', '.join(FITTED_KEYS)}")
    missing = [k for k in FITTED_KEYS if k not in coeffs]
    if missing:
        raise ValueError(
            f"model '{model.name}' has no fitted coefficients for GPU '{gpu.name}' "
            f"(missing {', '.join(missing)}); set predictor.kind: roofline or give "
            f"predictor.coefficients")
    return FittedPredictor(**{k: float(coeffs[k]) for k in FITTED_KEYS})

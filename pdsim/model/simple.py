"""The simple step-time predictors, kept selectable beside the operator model
(:mod:`pdsim.model.predictor`): ``fitted`` (``a + b*... + c*...`` coefficients from the model
profile) and ``roofline`` (one MFU and one HBM derate)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from pdsim.config.profile_schema import GPU, Model
from pdsim.model.rates import check_rates


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

    def prefill(self, tokens: float, sq_tokens: float, pairs: float | None = None,
                reqs: float = 1, prefix: float = 0, attn_tokens: float | None = None) -> float:
        return (self.prefill_a_ms + self.prefill_b_ms_per_ktok * tokens / 1e3
                + self.prefill_c_ms_per_mtok2 * sq_tokens / 1e6) / 1e3

    def decode(self, batch: float, context: float, attn_batch: float | None = None) -> float:
        return (self.decode_a_ms + self.decode_b_ms_per_ktok * context / 1e3
                + self.decode_c_ms_per_seq * batch) / 1e3

    decode_gpu = decode  # (no CPU floor: the forward is the step)
    decode_request_s = 0.0

    def decode_series(self, batch: float, attn_batch: float, context: int, grow: int
                      ) -> Iterator[float]:
        """``decode(batch, context + grow*j, attn_batch)`` for j = 0, 1, ...: the same floats
        (a decode span's steps, pdsim.engine.decode_batch.RunningBatch.span_durations). The
        context counts as a float, as in ``OperatorPredictor.decode_series`` (the same floats:
        an int below 2**53 is a double exactly; float-with-float takes CPython's specialized
        path, ~13% less a step than float-with-int)."""
        a, b, cb = self.decode_a_ms, self.decode_b_ms_per_ktok, self.decode_c_ms_per_seq * batch
        context, grow = float(context), float(grow)
        while True:
            yield (a + b * context / 1e3 + cb) / 1e3
            context += grow


@dataclass(frozen=True)
class RooflinePredictor:
    """Analytical roofline for one DP rank (the predictor before ``operator``).

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
    # the model's derived sizes, read once (properties that recount the architecture each
    # call): the same subexpressions, so every step time is the same float
    _c: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        m = self.model
        object.__setattr__(self, "_c", (
            2 * m.params_active, 4 * m.layers * m.hidden_size, self._flops * self.prefill_mfu,
            m.weight_bytes_total / self.tp, m.kv_bytes_per_token,
            self.gpu.hbm_tbps * 1e12 * self.hbm_derate))
        check_rates("predictor", self.rates())

    def rates(self) -> list[tuple[str, float]]:
        """The rates its step times divide by, each with the fields it is the product of."""
        peak = "fp8_tflops" if self.model.weight_bytes <= 1 else "bf16_tflops"
        return [(f"peak FLOP/s gpu.{peak} x predictor.prefill_mfu", self._c[2]),
                ("HBM bytes/s gpu.hbm_tbps x predictor.hbm_derate", self._c[5])]

    @property
    def _flops(self) -> float:
        peak = self.gpu.fp8_tflops if self.model.weight_bytes <= 1 else self.gpu.bf16_tflops
        return peak * 1e12

    def prefill(self, tokens: float, sq_tokens: float, pairs: float | None = None,
                reqs: float = 1, prefix: float = 0, attn_tokens: float | None = None) -> float:
        active2, attn4, flops_s, _w, _kv, _bw = self._c
        flops = active2 * tokens * self.dp_gather / self.tp
        flops += attn4 * sq_tokens / self.tp
        return self.overhead_s + flops / flops_s

    def decode(self, batch: float, context: float, attn_batch: float | None = None) -> float:
        active2, _a, flops_s, weights, kv_per_token, bw = self._c
        kv = context * kv_per_token
        memory = (weights + kv) / bw
        compute = active2 * batch * self.dp_gather / self.tp / flops_s
        return self.overhead_s + max(memory, compute)

    decode_gpu = decode  # (no CPU floor: the forward is the step)
    decode_request_s = 0.0

    def decode_series(self, batch: float, attn_batch: float, context: int, grow: int
                      ) -> Iterator[float]:
        """``decode(batch, context + grow*j, attn_batch)`` for j = 0, 1, ...: the same floats."""
        active2, _a, flops_s, weights, kv_per_token, bw = self._c
        compute = active2 * batch * self.dp_gather / self.tp / flops_s
        overhead = self.overhead_s
        while True:
            yield overhead + max((weights + context * kv_per_token) / bw, compute)
            context += grow

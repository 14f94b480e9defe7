"""DP-attention lockstep: the ranks of one server run each forward together.

With ``--enable-dp-attention`` every forward ends in MoE/MLP collectives across the server's
GPUs, so its DP ranks step together and a rank with nothing to do runs an idle batch. The step
takes as long as the predictor says for an "equivalent rank": the gathered (MoE) terms at the
mean load over the ranks, the rank-local (attention) terms at the slowest rank. For the fitted
predictor that is ``a + b*mean(tokens) + c*max(sum len^2)`` for prefill and
``a + b*max(context) + c*mean(batch)`` for decode, whose per-token coefficients already assume
``dp`` ranks' tokens gathered on every GPU.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence

import simpy

from pdsim.decode import DecodeRank
from pdsim.prefill import PrefillRank


def step_time(ranks: Sequence, plans: list) -> float:
    """Duration of one lockstep forward given each rank's plan (None: idle batch)."""
    n = len(ranks)
    live = [(r, p) for r, p in zip(ranks, plans, strict=True) if p is not None]
    r0 = live[0][0]
    if isinstance(r0, PrefillRank):
        tokens = sum(p[0] for _r, p in live) / n
        sq = max(p[1] for _r, p in live)
        return r0.predictor.prefill(tokens, sq)
    assert isinstance(r0, DecodeRank)
    batch = sum(p[0] for _r, p in live) / n
    ctx = max(p[1] for _r, p in live)
    dt = r0.predictor.decode(batch, ctx)
    recompute = max(p[2] for _r, p in live)
    return dt + r0.predictor.prefill(recompute, 0.0) if recompute else dt


def run_group(env: simpy.Environment, ranks: Sequence) -> Generator:
    """One process stepping all ``ranks`` together (one event per forward)."""
    while True:
        plans = [r.plan_step() for r in ranks]
        if all(p is None for p in plans):
            yield env.any_of([r._sleep() for r in ranks])
            continue
        yield env.timeout(step_time(ranks, plans))
        for r, p in zip(ranks, plans, strict=True):
            if p is not None:
                r.commit_step(p)

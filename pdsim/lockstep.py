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

from pdsim.rank import Rank


def step_time(ranks: Sequence[Rank], plans: list) -> float:
    """Duration of one lockstep forward given each rank's plan (None: idle batch)."""
    live = [p for p in plans if p is not None]
    rank = ranks[0]
    return rank.step_time(rank.combine(live, len(ranks)))


def run_group(env: simpy.Environment, ranks: Sequence[Rank]) -> Generator:
    """One process stepping all ``ranks`` together (one event per forward)."""
    rec = ranks[0].recorder
    while True:
        halted = [r for r in ranks if r.halted]
        if halted:
            yield halted[0]._resumed
            continue
        plans = [r.plan_step() for r in ranks]
        if all(p is None for p in plans):
            yield env.any_of([r._sleep() for r in ranks])
            continue
        t0 = env.now
        yield env.timeout(step_time(ranks, plans))
        for r, p in zip(ranks, plans, strict=True):
            if p is not None:
                r.commit_step(p)
        if rec is not None:
            for r, p in zip(ranks, plans, strict=True):
                rec.step(r, t0, env.now, p)

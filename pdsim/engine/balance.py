"""DP load balancing inside a server: which rank takes a request."""

from __future__ import annotations

from collections.abc import Sequence


class RoundRobin:
    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def pick(self, ranks: Sequence, room: int) -> int:
        i = self._next % len(ranks)
        self._next += 1
        return i


class TotalTokens:
    """Least loaded by tokens assigned and not yet finished (SGLang ``total_tokens``).

    Ranks whose requests fail fast look empty here and draw more traffic.
    """

    name = "total_tokens"

    def pick(self, ranks: Sequence, room: int) -> int:
        best, best_load = 0, ranks[0].load_tokens  # the first least loaded
        for i in range(1, len(ranks)):
            load = ranks[i].load_tokens
            if load < best_load:
                best, best_load = i, load
        return best


class FollowBootstrapRoom:
    name = "follow_bootstrap_room"

    def pick(self, ranks: Sequence, room: int) -> int:
        return room % len(ranks)


POLICIES = {c.name: c for c in (RoundRobin, TotalTokens, FollowBootstrapRoom)}


def build(name: str) -> RoundRobin | TotalTokens | FollowBootstrapRoom:
    return POLICIES[name]()

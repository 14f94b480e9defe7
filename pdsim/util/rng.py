"""One independent random stream per subsystem.

Streams are derived from the scenario seed and the subsystem's name, so adding draws in one
subsystem (say, a fault injector) never shifts another (arrivals stay put).
"""

from __future__ import annotations

import zlib

import numpy as np

SUBSYSTEMS = ("arrivals", "lengths", "routing", "faults")


def seeds_of(seed: int, overrides: dict[str, int | None] | None = None) -> dict[str, int]:
    """The seed each subsystem's stream starts from: its override (``seeds.<name>``), or the
    scenario's ``seed``; the stream is ``SeedSequence([that seed, crc32(name)])``."""
    given = overrides or {}
    return {name: given[name] if given.get(name) is not None else seed
            for name in SUBSYSTEMS}


class Streams:
    def __init__(self, seed: int, overrides: dict[str, int | None] | None = None) -> None:
        self._seeds = seeds_of(seed, overrides)
        self._cache: dict[str, np.random.Generator] = {}

    def __getitem__(self, name: str) -> np.random.Generator:
        gen = self._cache.get(name)
        if gen is None:
            gen = np.random.default_rng(np.random.SeedSequence(
                [self._seeds[name], zlib.crc32(name.encode())]))  # (a name not in SUBSYSTEMS:
            self._cache[name] = gen  # a KeyError, not a stream no run.json names)
        return gen

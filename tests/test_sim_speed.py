"""Mechanics of the simulator's speed work (issue #10) that outputs alone do not show.

Output equivalence itself is tests/test_golden.py; speed is measured in benchmarks/speed.py.
"""

from __future__ import annotations

import gc

import pytest
from conftest import small_fleet

import pdsim
import pdsim.sim as sim


def test_cyclic_gc_paused_during_the_run_and_restored(monkeypatch):
    seen = []
    records = sim._records
    monkeypatch.setattr(sim, "_records", lambda fleet: seen.append(gc.isenabled())
                        or records(fleet))
    d = small_fleet()
    d["clients"][0]["num_prompts"] = 20
    assert gc.isenabled()
    pdsim.run(d)
    assert seen == [False] and gc.isenabled()
    # a caller who turned it off keeps it off
    gc.disable()
    try:
        pdsim.run(d)
        assert not gc.isenabled()
    finally:
        gc.enable()
    # and an error inside the run restores it
    monkeypatch.setattr(sim, "_records", lambda fleet: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        pdsim.run(d)
    assert gc.isenabled()

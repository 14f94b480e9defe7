from __future__ import annotations

import os
from functools import cache
from pathlib import Path

import matplotlib
import pytest

import pdsim

matplotlib.use("Agg")  # tests draw figures without a display

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "scenarios"
TRACES = SCENARIOS / "traces"  # the Mooncake traces ship in the repo (gzip)


@pytest.fixture(autouse=True, scope="session")
def _at_the_repo_root():
    """Tests name shipped files as a user at the repo's root types them
    (``pdsim run scenarios/healthy.yaml``): run them from there, wherever pytest started."""
    before = os.getcwd()
    os.chdir(ROOT)
    yield
    os.chdir(before)


@cache
def run_cached(name: str, *sets: str) -> pdsim.Result:
    """Run a shipped scenario once per test session (results are deterministic)."""
    return pdsim.run(SCENARIOS / f"{name}.yaml", sets=list(sets))


@pytest.fixture
def run_scenario():
    return run_cached


def small_fleet(**over) -> dict:
    """A small, fast scenario dict for unit-level mechanism tests."""
    d = {
        "name": "small",
        "seed": 7,
        "horizon_s": 600,
        "fleet": {
            "gpu": "H20", "model": "dsv3-ci-test",
            "prefill": {"dp": 2, "tp": 2, "dp_attention": True, "balance": "total_tokens",
                        "chunked_prefill_size": 8192},
            "decode": {"dp": 2, "tp": 2, "dp_attention": True, "balance": "total_tokens"},
        },
        "clients": [{"kind": "bench", "num_prompts": 200, "max_concurrency": 64,
                     "dataset": {"kind": "random", "input_len": 2048, "output_len": 128}}],
    }
    for k, v in over.items():
        d[k] = v
    return d

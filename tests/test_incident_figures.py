"""The incident's reported figures against drop_timeout.yaml (slow: whole-incident runs).

Bands are the issue's. Figures the mechanisms do not reach at the scenario's seed are marked
xfail(strict=True): they fail loudly the day they start to match, and the reason says why.
"""

from __future__ import annotations

import pytest
from conftest import SCENARIOS, run_cached

import pdsim

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def incident():
    return run_cached("drop_timeout").summary


def test_flush_caused_transfer_failures_about_12(incident):
    assert 10 <= incident["transfer_failures_by_reason"]["flush_freed_pages"] <= 14


def test_failed_requests_about_1465(incident):
    assert abs(incident["failed"] - 1465) <= 0.15 * 1465


@pytest.mark.xfail(strict=True, reason="emerges at 83.5% (seed 1); seeds 1-6 give 73-93%. "
                   "See README, 'The incident story'.")
def test_empty_responses_about_86_9_percent(incident):
    assert abs(incident["clients"]["ci_bench"]["empty_share"] - 0.869) <= 0.03


@pytest.mark.xfail(strict=True, reason="emerges at ~1.35k tok/s (seed 1): the flushing run's "
                   "few successes wait behind the first run's load, which stretches its "
                   "duration. See README, 'The incident story'.")
def test_generated_throughput_about_2039(incident):
    tput = incident["clients"]["ci_bench"]["true_output_throughput_tok_s"]
    assert abs(tput - 2039) <= 0.10 * 2039


def test_healthy_figure_and_tpot():
    s = run_cached("healthy").summary
    assert abs(s["output_throughput_tok_s"] - 9994) <= 0.05 * 9994
    assert s["mean_tpot_ms"] < 20


def test_collapse_is_robust_across_seeds():
    """Not one lucky seed: the amplification holds for every seed tried."""
    healthy = run_cached("healthy").summary["output_throughput_tok_s"]
    for seed in range(2, 7):
        s = pdsim.run(SCENARIOS / "drop_timeout.yaml", sets=[f"seed={seed}"]).summary
        b = s["clients"]["ci_bench"]
        ret = s["transfer_failures_by_reason"]["flush_freed_pages"]
        assert ret >= 8, seed
        assert s["failed"] > 50 * ret, seed  # each real failure becomes dozens of failed requests
        assert b["empty_share"] > 0.6, seed
        assert b["true_output_throughput_tok_s"] < 0.35 * healthy, seed

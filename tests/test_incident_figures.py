"""The incident's reported figures against drop_timeout.yaml (slow: 10 whole-incident runs).

Which pairs have a transfer in flight at the flush instant is a draw, so one seed is a noisy
sample: the test compares the median over seeds 1-10 with the issue's bands. Figures the
mechanisms do not reach are marked xfail(strict=True): the test fails loudly the day they start
to match, and the reason says by how much they miss.
"""

from __future__ import annotations

import statistics

import pytest
from conftest import SCENARIOS, run_cached

import pdsim

pytestmark = pytest.mark.slow
SEEDS = range(1, 11)
NEW = ("with the operator step-time predictor (the default since the steptime work) the first "
       "run's prompts clear the prefill sooner: 0-6 pairs (median 4 over seeds 1-10; ~14 under "
       "the fitted predictor) have a transfer in flight at the flush; the two-runs story's 10 s "
       "offset was chosen under the fitted predictor (README, 'Step-time model and validation')")


@pytest.fixture(scope="module")
def runs():
    return [pdsim.run(SCENARIOS / "drop_timeout.yaml", sets=[f"seed={s}"]).summary
            for s in SEEDS]


def _median(runs, get):
    return statistics.median(get(s) for s in runs)


@pytest.mark.xfail(strict=True, reason="median 4 over seeds 1-10 (reported 12 +/- 2; seeds give "
                   "0-6): " + NEW)
def test_flush_caused_transfer_failures_about_12(runs):
    ret = _median(runs, lambda s: s["transfer_failures_by_reason"]["flush_freed_pages"])
    assert 10 <= ret <= 14


@pytest.mark.xfail(strict=True, reason="median 470 over seeds 1-10 (reported 1,465 +/- 15%; "
                   "seeds give 0-717): fewer pairs caught, each still failing over a hundred "
                   "requests; " + NEW)
def test_failed_requests_about_1465(runs):
    assert abs(_median(runs, lambda s: s["failed"]) - 1465) <= 0.15 * 1465


@pytest.mark.xfail(strict=True, reason="median 0.29 over seeds 1-10 (reported 0.869 +/- 0.03; "
                   "seeds give 0.00-0.43): the failed share tracks the dead-pair share (4 of "
                   "16); " + NEW)
def test_empty_responses_about_86_9_percent(runs):
    assert abs(_median(runs, lambda s: s["clients"]["ci_bench"]["empty_share"]) - 0.869) <= 0.03


@pytest.mark.xfail(strict=True, reason="median 6.6k tok/s over seeds 1-10 (reported 2,039 "
                   "+/- 10%; seeds give 5.6k-8.4k): with 4 of 16 pairs dead most requests "
                   "complete; " + NEW)
def test_generated_throughput_about_2039(runs):
    tput = _median(runs, lambda s: s["clients"]["ci_bench"]["true_output_throughput_tok_s"])
    assert abs(tput - 2039) <= 0.10 * 2039


def test_healthy_figure_and_tpot():
    s = run_cached("healthy").summary
    assert abs(s["output_throughput_tok_s"] - 9994) <= 0.05 * 9994
    assert s["mean_tpot_ms"] < 20


def test_the_fix_holds_on_every_seed():
    healthy = run_cached("healthy").summary["output_throughput_tok_s"]
    for seed in (1, 2, 3):
        s = pdsim.run(SCENARIOS / "forward_timeout.yaml", sets=[f"seed={seed}"]).summary
        assert s["transfer_failures"] == 0 and s["failed"] == 0
        tput = s["clients"]["ci_bench"]["output_throughput_tok_s"]
        assert abs(tput - healthy) / healthy < 0.05


@pytest.mark.xfail(strict=True, reason="seeds 1-10 catch 0-6 pairs (not >= 5 on every seed) "
                   "and the empty share stays at 0.00-0.43: " + NEW)
def test_collapse_is_robust_across_seeds(runs):
    """Not one lucky seed: the amplification holds for every seed."""
    healthy = run_cached("healthy").summary["output_throughput_tok_s"]
    for seed, s in zip(SEEDS, runs, strict=True):
        b = s["clients"]["ci_bench"]
        ret = s["transfer_failures_by_reason"]["flush_freed_pages"]
        assert ret >= 5, seed
        assert s["failed"] > 50 * ret, seed  # each real failure becomes dozens of failed requests
        assert b["empty_share"] > 0.5, seed
        assert b["true_output_throughput_tok_s"] < 0.4 * healthy, seed


def test_each_real_failure_fails_dozens_of_requests(runs):
    """The amplification itself (one blacklisted pair fails every later request routed over
    it) holds on every seed whose flush caught a transfer, however many it caught."""
    caught = [(seed, s) for seed, s in zip(SEEDS, runs, strict=True)
              if s["transfer_failures_by_reason"]["flush_freed_pages"] > 0]
    assert len(caught) >= len(SEEDS) // 2
    for seed, s in caught:
        ret = s["transfer_failures_by_reason"]["flush_freed_pages"]
        assert s["failed"] > 50 * ret, seed

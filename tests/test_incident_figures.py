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


@pytest.fixture(scope="module")
def runs():
    return [pdsim.run(SCENARIOS / "drop_timeout.yaml", sets=[f"seed={s}"]).summary
            for s in SEEDS]


def _median(runs, get):
    return statistics.median(get(s) for s in runs)


@pytest.mark.xfail(strict=True, reason="median 14.5 over seeds 1-10 (reported 12 +/- 2; seeds "
                   "give 11-16) since the prefill ranks take SGLang's default 2,048-token chunks "
                   "(8192 // dp 4) instead of 4,096: more prompts are mid-prefill at the flush")
def test_flush_caused_transfer_failures_about_12(runs):
    ret = _median(runs, lambda s: s["transfer_failures_by_reason"]["flush_freed_pages"])
    assert 10 <= ret <= 14


def test_failed_requests_about_1465(runs):
    assert abs(_median(runs, lambda s: s["failed"]) - 1465) <= 0.15 * 1465


@pytest.mark.xfail(strict=True, reason="median 0.92 over seeds 1-10 (reported 0.869 +/- 0.03; "
                   "seeds give 0.70-1.00): the failed share tracks the dead-pair share "
                   "(14-16 of 16 pairs dead on most seeds)")
def test_empty_responses_about_86_9_percent(runs):
    assert abs(_median(runs, lambda s: s["clients"]["ci_bench"]["empty_share"]) - 0.869) <= 0.03


@pytest.mark.xfail(strict=True, reason="median 0.64k tok/s over seeds 1-10 (reported 2,039 "
                   "+/- 10%; seeds give 0-2.2k): with most pairs dead few requests complete")
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

"""The incident's reported figures: what the stories can and cannot reproduce (slow).

reports/drop_timeout.md explores each story (scenarios/story_*.yaml) with ``pdsim explore``.
drop_timeout.yaml is story (iii), two overlapping bench runs, with two nominal values CHOSEN
from the region of its unknowns where both failure counts are reproduced (F1: 12 ret != 0,
F2: ~1,465 failed): the second run starts 6 s after the first, and the flush also fails rooms
whose prefill had not started (flush.dooms: source_and_unstarted). So F1 and F2 at those values
check the fit (a model change that moves the region fails them), not the story; F3 (86.9% empty)
and F4 (2,039 tok/s) are what the fitted point then gives. Which pairs have a transfer in
flight at the flush is a draw, so the figure tests compare the median over seeds 1-10 with the
issue's bands; a figure the nominal point misses is a strict xfail with its measured numbers,
so the test fails loudly the day it starts to match. The other tests check causal claims the
report rests on (the bench alone cannot hurt itself; story (iii) hurts only while the first
run still has prompts to send; forwarding the timeout removes every failure).
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


@pytest.mark.parametrize("corner", [
    ["flush.dooms=source_and_unstarted", "model.layers=8", "model.experts=16"],
    ["flush.dooms=source_and_destination", "model.layers=6", "model.experts=256"],
])
def test_the_bench_alone_cannot_reproduce_any_figure(corner):
    """bench_serving awaits its warmup before it flushes: the flush meets an idle fleet."""
    s = pdsim.run(SCENARIOS / "story_bench_alone.yaml", sets=corner).summary
    assert s["flush_doomed_transfers"] == 0 and s["transfer_failures"] == 0
    assert s["failed"] == 0 and s["clients"]["ci_bench"]["empty_share"] == 0
    assert sum(v["executed"] for v in s["flushes"].values()) == 8  # it did flush, every rank


def test_two_benches_hurt_only_while_the_first_has_prompts_to_send():
    """Story (iii)'s flush frees pages under transfers only while the first run still has
    prompts at the prefill (early on, its 256 prompts queue there while the decode has
    pre-allocated them); near its end the prefill has sent them all and the flush is
    harmless."""
    wide = ["flush.dooms=source_and_unstarted"]
    early = run_cached("story_two_benches", "clients.1.start_s=6", *wide).summary
    late = run_cached("story_two_benches", "clients.1.start_s=45", *wide).summary
    assert early["transfer_failures_by_reason"]["flush_freed_pages"] >= 8
    assert late["flush_doomed_transfers"] == 0 and late["failed"] == 0


def test_flush_caused_transfer_failures_about_12(runs):
    ret = _median(runs, lambda s: s["transfer_failures_by_reason"]["flush_freed_pages"])
    assert abs(ret - 12) <= 2


def test_failed_requests_about_1465(runs):
    assert abs(_median(runs, lambda s: s["failed"]) - 1465) <= 0.15 * 1465


@pytest.mark.xfail(strict=True, reason="median 0.819 over seeds 1-10 at drop_timeout's nominal "
                   "values (reported 0.869 +/- 0.03; seeds give 0.68-0.91, 3 of 10 within): "
                   "where the model's flushing run is 86.9% empty it generates ~1.2-1.5k tok/s, "
                   "not 2,039; of the 1,024 explored runs one (story iii, one seed of its "
                   "point) reproduces all four figures (reports/drop_timeout.md)")
def test_empty_responses_about_86_9_percent(runs):
    assert abs(_median(runs, lambda s: s["clients"]["ci_bench"]["empty_share"]) - 0.869) <= 0.03


def test_generated_throughput_about_2039(runs):
    """The median (1.88k) is within the band; single seeds spread 0.85k-3.3k (3 of 10 within)."""
    tput = _median(runs, lambda s: s["clients"]["ci_bench"]["true_output_throughput_tok_s"])
    assert abs(tput - 2039) <= 0.10 * 2039


def test_healthy_figure_and_tpot_a_check_of_the_fit():
    """A check of the fit, not a prediction: healthy.yaml's model.layers (nominal 7) was chosen
    with the reported 9,994 tok/s in view (its why: says so); a model change that moves the
    healthy fleet off it fails here and must say why."""
    s = run_cached("healthy").summary
    assert abs(s["output_throughput_tok_s"] - 9994) <= 0.05 * 9994
    assert s["mean_tpot_ms"] < 20


def test_the_fix_holds_on_every_seed():
    """Forwarding the timeout is the cause: the same seeds fail under drop_timeout."""
    healthy = run_cached("healthy").summary["output_throughput_tok_s"]
    for seed in (1, 2, 3):
        s = pdsim.run(SCENARIOS / "forward_timeout.yaml", sets=[f"seed={seed}"]).summary
        assert s["transfer_failures"] == 0 and s["failed"] == 0
        tput = s["clients"]["ci_bench"]["output_throughput_tok_s"]
        assert abs(tput - healthy) / healthy < 0.05
        dropped = pdsim.run(SCENARIOS / "drop_timeout.yaml", sets=[f"seed={seed}"]).summary
        assert dropped["flush_doomed_transfers"] > 0 and dropped["failed"] > 100


def test_collapse_is_robust_across_seeds(runs):
    """Not one lucky seed: at the nominal values every seed's flush catches most pairs and each
    real failure becomes dozens of failed requests."""
    healthy = run_cached("healthy").summary["output_throughput_tok_s"]
    for seed, s in zip(SEEDS, runs, strict=True):
        b = s["clients"]["ci_bench"]
        ret = s["transfer_failures_by_reason"]["flush_freed_pages"]
        assert ret >= 8, seed
        assert s["failed"] > 50 * ret, seed
        assert b["empty_share"] > 0.5, seed
        assert b["true_output_throughput_tok_s"] < 0.4 * healthy, seed


def test_the_declared_10_s_flush_timeout_matters_only_once_the_router_forwards_it():
    """The flushing bench's ?timeout= is declared {10, 60} (nominal 60: the write-up's
    ?timeout=60 and bench_serving's default; a review read 10.0). Dropped by mini_lb 0.3.2 the
    value is moot; forwarded, 10 s is too short to wait out the first run: decode ranks time
    out (HTTP 400) and the two runs overlap, with no transfer lost either way."""

    def summary(name: str, t: int) -> dict:
        return pdsim.run(SCENARIOS / f"{name}.yaml", sets=[f"clients.1.flush.timeout_s={t}"]
                         ).summary

    def timed_out(s: dict) -> int:
        return sum(f["timed_out"] for f in s["flushes"].values())

    dropped = [summary("drop_timeout", t) for t in (60, 10)]
    assert dropped[0]["failed"] == dropped[1]["failed"]  # moot: the balancer drops it
    fixed60, fixed10 = summary("forward_timeout", 60), summary("forward_timeout", 10)
    assert timed_out(fixed60) == 0 and timed_out(fixed10) >= 2
    assert fixed10["transfer_failures"] == fixed60["transfer_failures"] == 0
    tok = "true_output_throughput_tok_s"
    assert fixed10["clients"]["ci_bench"][tok] < 0.95 * fixed60["clients"]["ci_bench"][tok]

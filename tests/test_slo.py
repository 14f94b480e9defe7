"""SLO attainment and goodput (pdsim.engine.slo): the thresholds, the two denominators of a
window, and the run summary's SLO block."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import small_fleet

import pdsim
from pdsim.config.scenario import ScenarioError, SLOConfig, from_dict
from pdsim.engine import slo
from pdsim.engine.summary import COMPLETED, FAILED, UNFINISHED


def _cols(rows):
    """Request columns as pdsim.engine.summary.columns gives them, from (status, arrival,
    first token, done, generated) rows."""
    a = np.array(rows, dtype=float)
    return {"status": a[:, 0].astype(int), "t_arrival": a[:, 1], "t_first_token": a[:, 2],
            "t_done": a[:, 3], "generated": a[:, 4].astype(int)}


NAN = float("nan")
COLS = _cols([
    (COMPLETED, 0.0, 0.5, 1.5, 11),   # ttft 500 ms, tpot 100 ms, e2e 1.5 s
    (COMPLETED, 1.0, 3.0, 3.2, 3),    # ttft 2 s, tpot 100 ms
    (COMPLETED, 2.0, 2.1, 12.1, 11),  # tpot 1 s, e2e 10.1 s
    (FAILED, 2.5, NAN, 4.0, 0),
    (UNFINISHED, 3.0, 3.5, NAN, 5),
])


@pytest.mark.parametrize(("over", "want"), [
    ({}, [True, True, True, False, False]),                      # no threshold: completed
    ({"ttft_ms": 1000}, [True, False, True, False, False]),
    ({"tpot_ms": 200}, [True, True, False, False, False]),
    ({"e2e_ms": 5000}, [True, True, False, False, False]),
    ({"ttft_ms": 1000, "tpot_ms": 200}, [True, False, False, False, False]),
])
def test_each_threshold_is_checked_on_completed_requests_only(over, want):
    assert slo.met(COLS, SLOConfig(**over)).tolist() == want


def test_a_one_token_output_has_no_tpot_to_miss():
    cols = _cols([(COMPLETED, 0.0, 0.1, 0.1, 1)])
    assert slo.met(cols, SLOConfig(tpot_ms=1)).tolist() == [True]


def test_a_window_counts_attainment_by_arrival_and_goodput_by_completion():
    w = slo.window(COLS, SLOConfig(ttft_ms=1000), 0.0, 2.0)
    # arrived in [0, 2): requests 0 and 1; request 1 missed its TTFT
    assert (w["arrived"], w["met_slo"], w["attainment"]) == (2, 1, 0.5)
    # completed in [0, 2): request 0 only (11 tokens over 2 s)
    assert (w["goodput_req_s"], w["goodput_tok_s"], w["completed_tok_s"]) == (0.5, 5.5, 5.5)
    late = slo.window(COLS, SLOConfig(ttft_ms=1000), 2.0, 13.0)
    # arrived: 2 (met), 3 (failed), 4 (unfinished: not met); ended: 1 (missed), 2, 3 (error)
    assert (late["arrived"], late["met_slo"], late["errors"]) == (3, 1, 1)
    assert late["completed_tok_s"] == round(14 / 11, 2)
    assert late["goodput_tok_s"] == 1.0


def test_a_window_without_arrivals_has_no_attainment():
    assert slo.window(COLS, SLOConfig(), 20.0, 30.0)["attainment"] is None


def test_the_run_summary_carries_the_slo_block_only_when_a_threshold_is_set():
    base = small_fleet()
    assert "slo" not in pdsim.run(base).summary
    loose = pdsim.run({**base, "slo": {"ttft_ms": 1e6, "tpot_ms": 1e6}}).summary["slo"]
    tight = pdsim.run({**base, "slo": {"ttft_ms": 1e-3}}).summary["slo"]
    assert loose["meets_slo"] and loose["attainment"] == 1.0
    assert not tight["meets_slo"] and tight["met_slo"] == 0 and tight["goodput_tok_s"] == 0
    assert loose["met_slo"] == pdsim.run(base).summary["completed_requests"]


def test_a_negative_threshold_is_refused_naming_its_key():
    with pytest.raises(ScenarioError, match="slo.ttft_ms"):
        from_dict({**small_fleet(), "slo": {"ttft_ms": -1}})

"""Regressions for the defects issue #28 reported (reproductions in tests/fuzz_found/, one folder
each, the observed symptom in its first comment)."""

from __future__ import annotations

from pathlib import Path

from conftest import watch_ends

import pdsim

FOUND = Path(__file__).parent / "fuzz_found"


def _run(name: str, *sets: str) -> pdsim.Result:
    return pdsim.run(FOUND / name / "scenario.yaml", list(sets), allow_outside_paths=True)


# --- 1. one request, one end ----------------------------------------------------------------------


def test_fuzz_found_a_request_ends_once_the_first_end_wins():
    """A bootstrap or waiting timeout (the decode answers ``failed``) and the router's
    request_timeout_s of 300 s fell in one instant: MiniLB._resume overwrote the status with
    ``timed_out`` before the answer was processed. The first end now wins."""
    with watch_ends() as watch:
        res = _run("min_request_ended_twice")
    assert watch.writes and watch.ended_twice() == {}
    req = res.requests.set_index("rid")
    # rid 0: the decode's waiting timeout and the router's timeout, both at 300.0005 s
    assert req.t_done[0] == req.t_arrival[0] + 300.0005
    assert (req.status[0], req.reason[0], req.http_status[0]) == ("failed", "waiting_timeout",
                                                                   200)
    assert {"failed", "timed_out"} <= set(req.status) <= {"failed", "timed_out", "completed"}

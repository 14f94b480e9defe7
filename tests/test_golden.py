"""Byte-identical outputs: every shipped scenario (its seed and the next) and the extra cases
of tests/golden.py hash exactly as recorded in tests/golden.json.

A failure means the model's outputs moved. If that is a bug (an optimisation changed what the
model computes), fix it. If the change is legitimate, re-record in a commit of its own whose
message says why the outputs moved:

    python tests/golden.py --update              # every case
    python tests/golden.py --update healthy@1    # only some
"""

from __future__ import annotations

import golden
import pytest

CASES = golden.cases(full=False)  # `python tests/golden.py` also checks the uncut long runs
RECORDED = golden.load()


@pytest.mark.parametrize("name", list(CASES))
def test_outputs_match_golden_hashes(name):
    assert name in RECORDED, f"no golden hashes for {name}: python tests/golden.py --update {name}"
    moved = golden.moved(name, RECORDED[name])
    assert not moved, (f"{name}: outputs moved ({', '.join(moved)}); if legitimate, "
                       f"python tests/golden.py --update {name} in its own commit")


@pytest.mark.parametrize("name", [n for n in golden.EXTRA if n.startswith("tie_")])
def test_tie_cases_with_progress_match_golden(name):
    """``pdsim run --progress`` once stepped the environment itself and changed outputs
    (issue #9); its bar is now drawn from a thread reading the clock: on the cases built on
    ties it must give the recorded outputs too."""
    seed = golden.EXTRA[name]["seed"]
    got = golden.digest(golden.pdsim.run(golden.EXTRA[name], progress=True))
    assert got == RECORDED[f"{name}@{seed}"]


def test_no_stale_golden_entries():
    stale = sorted(set(RECORDED) - set(golden.cases()))
    assert not stale, (f"recorded cases that no longer exist: {stale}; "
                       f"python tests/golden.py --update")


def test_hash_sees_a_one_ulp_change():
    """The digest is sensitive to the last bit of a float, not just the printed figures."""
    import numpy as np

    res = golden.pdsim.run(golden.EXTRA["small_pressure"])
    before = golden.digest(res)
    res.requests.loc[0, "t_done"] = np.nextafter(res.requests.loc[0, "t_done"], np.inf)
    res.summary["events"] += 1  # a performance field: not hashed
    after = golden.digest(res)
    assert [k for k in before if before[k] != after[k]] == ["requests"]


def test_the_tie_cases_still_tie():
    """tie_abort_at_submit, tie_timeout_at_crash and tie_start_at_link test SimPy's order within
    one instant only while their events really share it: a router timeout chosen to the last
    bit, a crash at a dispatch time plus the timeout, and a flush reaching the servers as a
    router timeout fires. A model change that moves any of them by an ulp would
    leave them passing (re-recorded) and testing nothing: this fails first."""
    hop = 0.5 / 1000  # the router's http_latency_ms, default and tie_timeout_at_crash's
    d = golden.EXTRA["tie_abort_at_submit"]
    req = golden.pdsim.run(d).requests
    long = req[req.client == "long"].iloc[0]
    assert long.status == "timed_out"  # the abort the transfer worker must see first
    assert (long.t_arrival + hop) + d["router"]["request_timeout_s"] == long.t_prefill_end, (
        f"the tie is gone: set request_timeout_s to {long.t_prefill_end - hop!r} "
        f"(the long prompt's dispatch to its last prefill step) and re-record the case")

    res = golden.pdsim.run(golden.EXTRA["tie_timeout_at_crash"])
    crash = res.events[res.events.event == "decode_crash"].time
    first = res.requests[res.requests.t_arrival == 0.0]
    assert len(crash) and len(first) > 1
    assert ((first.t_arrival + hop) + 2.0 == crash.iloc[0]).all()

    # the router timeout fires as the flush reaches the servers (1 + hop + 1 == 2 + hop)
    res = golden.pdsim.run(golden.EXTRA["tie_start_at_link"])
    received = res.events[res.events.event == "flush_received"].time
    timed_out = res.requests[res.requests.reason == "router_timeout"].t_done
    assert len(received) == 2 and len(timed_out) == 1
    assert (received == timed_out.iloc[0]).all()

"""reports/incidents.md cannot drift from the model: its replay at the nominal values (the
`pdsim run` table and each reported figure's verdict) is re-run here and must be in the
committed report word for word. (Round 13's review found it printing 32 failed and 64 dead
rooms for prefill_restart beside a `pdsim run` that gave 96 and 192: regenerated before a
merge that moved the decode's pre-allocation slots, with no test to notice.)"""

from __future__ import annotations

import importlib.util

import pytest
from conftest import ROOT

spec = importlib.util.spec_from_file_location("make_incidents", ROOT / "reports/make_incidents.py")
make_incidents = importlib.util.module_from_spec(spec)
spec.loader.exec_module(make_incidents)

REPORT = (ROOT / "reports/incidents.md").read_text()


@pytest.mark.parametrize("name", list(make_incidents.INCIDENTS))
def test_the_report_s_replay_at_the_nominal_values_is_what_pdsim_run_gives(name):
    lines = [x for x in make_incidents.replay_lines(name) if x.strip()]
    missing = [x for x in lines if x not in REPORT]
    assert not missing, (f"reports/incidents.md is stale for {name} (run python "
                         f"reports/make_incidents.py --explore): {missing}")

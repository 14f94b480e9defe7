"""The postmortem notebook's code runs (cells executed in order, no Jupyter needed)."""

from __future__ import annotations

import json
import os

import matplotlib
import pytest
from conftest import ROOT

matplotlib.use("Agg")


def _execute(name: str, monkeypatch) -> dict:
    """Run a notebook's code cells in order from the repository root; its namespace."""
    nb = json.loads((ROOT / "notebooks" / name).read_text())
    monkeypatch.chdir(ROOT)
    env: dict = {"__name__": "__notebook__"}
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            exec(compile("".join(cell["source"]), name, "exec"), env)
    return env


@pytest.mark.slow
def test_postmortem_notebook_runs(monkeypatch):
    import matplotlib.pyplot as plt

    env = _execute("postmortem.ipynb", monkeypatch)
    s = env["drop"].summary  # the intro: each flush-caused failure became > 50 failed requests
    assert s["failed"] > 50 * s["transfer_failures_by_reason"]["flush_freed_pages"] > 0
    assert len(env["df"]) == 30
    assert plt.get_fignums()
    plt.close("all")
    assert os.getcwd() == str(ROOT)


@pytest.mark.slow
def test_blacklist_whatif_notebook_runs(monkeypatch):
    """The what-if notebook reads the report's committed matrix and runs its small live cells
    (kept under ~30 s: the matrix is read, not re-run)."""
    import matplotlib.pyplot as plt

    env = _execute("blacklist_whatif.ipynb", monkeypatch)
    lib = env["lib"]
    assert len(lib.table) == len(lib.policies) * len(lib.faults)
    assert not lib.table.duplicated(["policy", "fault"]).any()
    assert set(lib.ranking.policy) == {p for p, _ in lib.policies}
    runs = env["runs"]
    assert runs["permanent (as shipped)"].summary["blacklisted_pairs_final"] > 0
    assert runs["ttl_s=10"].summary["blacklisted_pairs_final"] == 0
    assert len(env["mine"].table) == 2
    assert plt.get_fignums()
    plt.close("all")

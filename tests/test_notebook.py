"""The postmortem notebook's code runs (cells executed in order, no Jupyter needed)."""

from __future__ import annotations

import json
import os

import matplotlib
import pytest
from conftest import ROOT

matplotlib.use("Agg")


@pytest.mark.slow
def test_postmortem_notebook_runs(monkeypatch):
    import matplotlib.pyplot as plt

    nb = json.loads((ROOT / "notebooks" / "postmortem.ipynb").read_text())
    monkeypatch.chdir(ROOT)
    env: dict = {"__name__": "__notebook__"}
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            exec(compile("".join(cell["source"]), "postmortem.ipynb", "exec"), env)
    assert env["drop"].summary["failed"] > 0
    assert len(env["df"]) == 30
    assert plt.get_fignums()
    plt.close("all")
    assert os.getcwd() == str(ROOT)

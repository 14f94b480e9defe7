"""Figures people can read: flush notes that overprinted in the fixed postmortem, identical
what-if curves that hid each other, an accepted_pairs figure all grey when nothing was
accepted. Each test fails with its fix removed."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from conftest import ROOT, SCENARIOS

import pdsim
from pdsim.output import plots


def test_flush_notes_of_the_fixed_postmortem_do_not_overprint():
    """forward_timeout's two harmless flushes, 9 s apart, printed their notes on one row."""
    res = pdsim.run(SCENARIOS / "forward_timeout.yaml")
    fig = plots.postmortem(res)
    fig.canvas.draw()
    notes = [t for ax in fig.axes for t in getattr(ax, "_pdsim_flush_notes", [])]
    assert len(notes) == 2
    boxes = [t.get_window_extent() for t in notes]
    assert not boxes[0].overlaps(boxes[1])
    plt.close(fig)


def test_identical_what_if_curves_are_one_line_naming_every_policy():
    """Under flush_race 11 policies give 5 distinct curves: 11 lines hid 6 of them."""
    from pdsim.analysis.whatif_table import WhatIf

    w = WhatIf.read(ROOT / "reports" / "blacklist_policy" / "library")
    ax = w.timelines("flush_race")
    labels = [ln.get_label() for ln in ax.get_lines() if not ln.get_label().startswith("_")]
    policies = [lbl for lbl in labels if "healthy" not in lbl]
    assert len(policies) == 5
    assert sorted(p for lbl in policies for p in lbl.split(" = ")) == sorted(
        lbl for lbl, _ in w.policies)
    curves = [ln.get_ydata() for ln in ax.get_lines() if ln.get_label() in policies]
    assert all(not np.allclose(a, b) for i, a in enumerate(curves) for b in curves[i + 1:])
    assert "5 distinct curves among 11 policies" in ax.get_title()
    plt.close(ax.figure)


def test_accepted_pairs_says_when_no_run_is_accepted_and_shows_the_closest(tmp_path):
    from test_explore import tiny

    from pdsim.analysis import explore_plots

    d = tiny()
    d["reference"] = [  # two bands no run can both be in: none accepted, best 2 of 3
        {"label": "many", "metric": "requests", "reported": 55, "tolerance": 5},
        {"label": "few", "metric": "requests", "reported": 25, "tolerance": 5},
        {"label": "failed", "metric": "failed", "reported": 0, "tolerance": 0.5}]
    ex = pdsim.explore(d, samples=16, seeds=1, workers=1, out=tmp_path, progress=False)
    fig = explore_plots.accepted_pairs(ex)
    assert "no run reproduces every reported figure" in fig._suptitle.get_text()
    assert "best: 2 of 3" in fig._suptitle.get_text()
    fig.canvas.draw()
    scatter = fig.axes[1].collections[0]  # every run, coloured by the figures it reproduces
    assert len({tuple(c) for c in scatter.get_facecolors()}) > 1  # not all grey
    assert any("of 3" in ax.get_ylabel() for ax in fig.axes)  # the colour bar says what
    plt.close(fig)

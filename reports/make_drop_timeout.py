"""Regenerate the figures of reports/drop_timeout.md.

    python reports/make_drop_timeout.py
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

import pdsim
from pdsim import plots

matplotlib.use("Agg")
ROOT = Path(__file__).resolve().parents[1]
OUT = Path(__file__).resolve().parent


def main() -> None:
    runs = {name: pdsim.run(ROOT / f"scenarios/{name}.yaml")
            for name in ("healthy", "drop_timeout", "forward_timeout")}
    plots.postmortem(runs["drop_timeout"]).savefig(OUT / "drop_timeout_postmortem.png", dpi=80)
    plots.compare(runs).savefig(OUT / "drop_timeout_compare.png", dpi=80)
    for path in sorted(OUT.glob("*.png")):
        print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

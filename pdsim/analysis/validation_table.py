"""The validation table as Markdown, and the docs block it fills (``pdsim validate-model
--write-docs docs/validation.md``): :func:`pdsim.analysis.validation.validate`'s rows, with
:mod:`pdsim.analysis.holdout`'s columns and medians when present. Apart from both, which it
reads: validation runs the rows, holdout refits on them (and imports validation)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from pdsim.analysis import holdout
from pdsim.analysis.validation import README_BEGIN, README_END, shown_error, summary


def markdown(df: pd.DataFrame) -> str:
    """The table as Markdown; with :mod:`pdsim.analysis.holdout`'s columns (``row``; ``held_out``,
    ``held_out_error``, ``split``) when present, and its medians under it."""
    marked, held = "row" in df, "held_out" in df
    head = "| setup | case | metric | x | published | simulated | error |"
    rule = "|---|---|---|---:|---:|---:|---:|"
    if marked:
        head += " row |"
        rule += "---|"
    if held:
        head += " held out: simulated | error | refit on |"
        rule += "---:|---:|---|"
    lines = [head, rule]
    for r in df.itertuples(index=False):
        x = "" if r.x is None or pd.isna(r.x) else f"{int(r.x):,}"
        line = (f"| {r.setup} | {r.case} | {r.metric} | {x} | {r.published:,.2f} | "
                f"{r.simulated:,.2f} | {shown_error(r.error, r.metric)} |")
        if marked:
            line += f" {r.row} |"
        if held:
            if pd.isna(r.held_out):
                line += " n/a | n/a | not refittable (see validation/README.md) |"
            else:
                refit = r.split or ("nothing fitted on it; a value was chosen with it in view"
                                    if marked and r.row == holdout.IN_VIEW
                                    else "nothing fitted on it")
                line += (f" {r.held_out:,.2f} | {shown_error(r.held_out_error, r.metric)} | "
                         f"{refit} |")
        lines.append(line)
    s = summary(df)
    lines.append("")
    bounds = (f" ({s['bounds_met']} of {s['bounds']} upper bounds met, not counted)"
              if s["bounds"] else "")
    lines.append(f"{s['rows']} point predictions with the shipped parameters: median |error| "
                 f"{s['median_abs_error']:.1%}, max {s['max_abs_error']:.1%}, "
                 f"{s['within_25pct']} within ±25%{bounds}.")
    if marked:
        lines.append("")
        for ln in holdout.summary_lines(df)[1:]:
            level = max(0, (len(ln) - len(ln.lstrip())) // 2 - 1)
            lines.append(f"{'  ' * level}- {ln.strip()}")
    return "\n".join(lines)


def write_table(df: pd.DataFrame, page: Path) -> None:
    """Replace the table between the validate-model markers in ``page`` (docs/validation.md)."""
    text = page.read_text()
    if README_BEGIN not in text or README_END not in text:
        raise ValueError(f"{page}: no {README_BEGIN} ... {README_END} block to replace")
    head, rest = text.split(README_BEGIN, 1)
    _old, tail = rest.split(README_END, 1)
    page.write_text(f"{head}{README_BEGIN}\n{markdown(df)}\n{README_END}{tail}")

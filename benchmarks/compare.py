"""Before/after table of two ``benchmarks/speed.py --json`` outputs, as Markdown.

    git worktree add /tmp/before <commit>
    (cd /tmp/before && python benchmarks/speed.py --json) > before.jsonl
    python benchmarks/speed.py --json > after.jsonl
    python benchmarks/compare.py before.jsonl after.jsonl
    python benchmarks/compare.py --before b1.jsonl b2.jsonl --after a1.jsonl a2.jsonl

Run both measurements back to back on an otherwise idle machine, best alternating several
times: wall and CPU times move with load and with whatever else the host runs (seen here: the
same run 0.15-0.27 s from one minute to the next). Given several files a side, each workload
shows its fastest measurement (by CPU time) of each side. Workloads present on one side only
are left out.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from speed import scheduled  # benchmarks/ is this script's directory

COLUMNS = (  # (heading, key, format)
    ("all/req", "sched_per_req", "{:.1f}"),
    ("wall s", "wall_s", "{:.3g}"),
    ("cpu s", "cpu_s", "{:.3g}"),
    ("cpu us/req", "cpu_us_per_req", "{:.0f}"),
    ("peak RSS MB", "peak_rss_mb", "{:.0f}"),
)


def _load(paths: list[Path]) -> dict[str, dict]:
    """Each workload's fastest measurement (CPU time) over the files."""
    rows: dict[str, dict] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            if line.strip().startswith("{"):
                m = json.loads(line)
                if "requests" not in m:  # (the startup line: no run to compare per request)
                    continue
                m["sched_per_req"] = scheduled(m) / m["requests"]
                # per request in CPU time, as the choice below (a run's wall time can carry
                # another tenant's load its CPU time does not)
                m["cpu_us_per_req"] = 1e6 * m["cpu_s"] / m["requests"]
                old = rows.get(m["workload"])
                if old is None or m["cpu_s"] < old["cpu_s"]:
                    rows[m["workload"]] = m
    return rows


def table(before: dict[str, dict], after: dict[str, dict]) -> str:
    head = ["workload", "requests"] + [f"{h} before → after" for h, _k, _f in COLUMNS]
    head.append("after / before (cpu)")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for w, a in after.items():
        b = before.get(w)
        if b is None:
            continue
        cells = [f"`{w}`", f"{a['requests']:,}"]
        cells += [f"{f.format(b[k])} → {f.format(a[k])}" for _h, k, f in COLUMNS]
        cells.append(f"{a['cpu_us_per_req'] / b['cpu_us_per_req']:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", type=Path, nargs="*", help="BEFORE AFTER (one file each)")
    ap.add_argument("--before", type=Path, nargs="+", default=[])
    ap.add_argument("--after", type=Path, nargs="+", default=[])
    args = ap.parse_args()
    before, after = list(args.before), list(args.after)
    if args.files:
        if len(args.files) != 2 or before or after:
            ap.error("give BEFORE AFTER, or --before FILE... --after FILE...")
        before, after = [args.files[0]], [args.files[1]]
    if not before or not after:
        ap.error("nothing to compare: give BEFORE AFTER, or --before and --after")
    print(table(_load(before), _load(after)))


if __name__ == "__main__":
    main()

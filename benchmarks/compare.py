"""Before/after table of two ``benchmarks/speed.py --json`` outputs, as Markdown.

    git worktree add /tmp/before <commit>
    (cd /tmp/before && python benchmarks/speed.py --json) > before.jsonl
    python benchmarks/speed.py --json > after.jsonl
    python benchmarks/compare.py before.jsonl after.jsonl

Run both measurements back to back on an otherwise idle machine: wall times move with load
(``cpu s`` less so). Workloads present in only one file are left out.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

COLUMNS = (  # (heading, key, format)
    ("all/req", "sched_per_req", "{:.1f}"),
    ("wall s", "wall_s", "{:.3g}"),
    ("cpu s", "cpu_s", "{:.3g}"),
    ("us/req", "us_per_req", "{:.0f}"),
    ("peak RSS MB", "peak_rss_mb", "{:.0f}"),
)


def _load(path: Path) -> dict[str, dict]:
    rows = {}
    for line in path.read_text().splitlines():
        if line.strip().startswith("{"):
            m = json.loads(line)
            m["sched_per_req"] = (m["events"] + m.get("step_entries", 0)
                                  + m.get("chain_entries", 0)
                                  + m.get("timer_entries", 0)) / m["requests"]
            rows[m["workload"]] = m
    return rows


def table(before: dict[str, dict], after: dict[str, dict]) -> str:
    head = ["workload", "requests"] + [f"{h} before → after" for h, _k, _f in COLUMNS]
    head.append("after / before (us/req)")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for w, a in after.items():
        b = before.get(w)
        if b is None:
            continue
        cells = [f"`{w}`", f"{a['requests']:,}"]
        cells += [f"{f.format(b[k])} → {f.format(a[k])}" for _h, k, f in COLUMNS]
        cells.append(f"{a['us_per_req'] / b['us_per_req']:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    args = ap.parse_args()
    print(table(_load(args.before), _load(args.after)))


if __name__ == "__main__":
    main()

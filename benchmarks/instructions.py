"""Instructions spent in one warm ``pdsim.run`` per workload, counted by callgrind.

    python benchmarks/instructions.py healthy drop_timeout stream:1000
    PYTHONHASHSEED=0 python benchmarks/instructions.py stream:1000   # steadier A/B
    PYTHONHASHSEED=0 python benchmarks/instructions.py --tree /tmp/before stream:1000

Wall and CPU times on a shared machine move by tens of per cent from one minute to the next;
an instruction count does not move with load, so it is what an A/B of two commits should
compare (run each commit's tree in turn, with the same PYTHONHASHSEED: string hashing moves
dict and set layouts, and the count by 1-4%). Instructions are not time (cache misses and
branch mispredictions are not counted), so confirm a large change in ``speed.py``.

Workloads are those of ``speed.py``: ``healthy``, ``drop_timeout``, ``trace_replay``, or
``stream:N``. ``--tree DIR`` measures the pdsim of another checkout (a worktree of an older
commit, say) on the same workloads: its package and scenarios, this harness. One unmeasured
run comes first (as the median of warm runs would see); only the second ``pdsim.run`` is
counted (callgrind's instrumentation is switched on around it), with the reading of its four
tables (``Result`` builds its DataFrames when first read), so that trees from before and after
that change count the same work. Needs valgrind (``apt install valgrind``); about 40 s per
workload of 1-2k requests, ~50x its normal time in general.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CHILD = """
import os, subprocess, sys, tempfile
from pathlib import Path
sys.path[:0] = [{root!r}, {bench!r}]
import pdsim, speed
assert pdsim.__file__.startswith({root!r}), pdsim.__file__
w = {workload!r}
if w.startswith("stream:"):
    src = speed.stream_scenario(int(w.split(":")[1]), Path(tempfile.mkdtemp()))
else:
    src = Path({root!r}) / "scenarios" / f"{{w}}.yaml"
def run():  # a run and every table it makes (built when first read since 2026-11-30)
    res = pdsim.run(src, allow_outside_paths=True)
    return res.requests, res.events, res.timeseries, res.answers
run()  # warm-up, not counted
ctl = ["callgrind_control", "-i"]
subprocess.run(ctl + ["on", str(os.getpid())], check=True, stdout=subprocess.DEVNULL)
run()
subprocess.run(ctl + ["off", str(os.getpid())], check=True, stdout=subprocess.DEVNULL)
"""


def count(workload: str, tree: Path = ROOT) -> int:
    """Instructions (callgrind's Ir) of one warm ``pdsim.run`` of ``workload`` with the pdsim
    of ``tree``."""
    code = _CHILD.format(root=str(tree), bench=str(ROOT / "benchmarks"), workload=workload)
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no",
             f"--callgrind-out-file={tmp}/cg.out", sys.executable, "-c", code],
            capture_output=True, text=True, env=dict(os.environ))
    m = re.search(r"Collected : (\d+)", out.stderr)
    if out.returncode != 0 or m is None:
        tail = "\n".join(out.stderr.strip().splitlines()[-5:])
        raise SystemExit(f"instructions.py: callgrind run of {workload} failed:\n{tail}")
    return int(m.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workloads", nargs="+", metavar="WORKLOAD",
                    help="healthy, drop_timeout, trace_replay or stream:N")
    ap.add_argument("--tree", type=Path, default=ROOT,
                    help="the checkout whose pdsim to measure (default: this one)")
    args = ap.parse_args()
    tree = args.tree.resolve()
    if not (tree / "pdsim" / "__init__.py").is_file():
        ap.error(f"--tree {args.tree}: no pdsim package there")
    for w in args.workloads:
        if w not in ("healthy", "drop_timeout", "trace_replay") and not re.fullmatch(
                r"stream:[1-9]\d*", w):
            ap.error(f"unknown workload {w!r}: healthy, drop_timeout, trace_replay or stream:N")
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("instructions.py: valgrind is not installed (apt install valgrind)")
    for w in args.workloads:
        print(f"{w}\t{count(w, tree):,} instructions", flush=True)


if __name__ == "__main__":
    main()

"""Simulator speed: wall time, SimPy events, cost per request and memory, per workload.

    python benchmarks/speed.py                     # every workload below
    python benchmarks/speed.py --only stream       # the 1P1D stream at 1k/8k/32k/100k
    python benchmarks/speed.py --sizes 1000 8000   # stream sizes
    python benchmarks/speed.py --profile healthy   # cProfile top of one workload
    python benchmarks/speed.py --profile stream:8000
    python benchmarks/speed.py --only startup      # what a user waits for before a run
    python benchmarks/speed.py --write-docs docs/generated/speed.md   # the docs' speed table

Workloads:

- ``healthy``, ``drop_timeout``: the shipped scenarios as they are.
- ``trace_replay``: ``scenarios/trace_replay.yaml``, the whole Mooncake conversation trace
  (12,031 requests) at its own timestamps.
- ``stream N``: a 1P1D stream of N requests, the workload issue #10 compares simulators on.
  One prefill and one decode rank (A100, TP 1), Poisson arrivals at 4 req/s (chosen), request
  lengths of the Mooncake synthetic trace in order, cycled, with inputs clipped to 1,024 tokens
  (chosen: with the conversation trace's outputs, or inputs up to OPT-13B's 2,048-token
  context, one OPT-13B decode GPU cannot keep up with 4 req/s and the stream's queues grow
  without bound, which measures the backlog rather than the simulator). Step times: DistServe's
  fitted OPT-13B profile on A100-80GB at TP 1 (LLMServe/DistServe,
  simdistserve/estimators/profile_data/profiler-a100-80g.distserve.json: prefill a, b, c and
  decoding_smallbs a, b, c), given as pdsim's fitted coefficients. KV pools of 57,000 tokens
  per rank (chosen: 80 GB * 0.9 minus OPT-13B's 26 GB of weights, at its 800 KB of KV per
  token); the llama-3.1-8b profile stands in for the model only for KV bytes on the wire.
  Prefix cache off (cycling the trace would otherwise turn repeats into cache hits).
- ``colocated``: ``scenarios/capacity/colocated_8xh100.yaml``, Llama-3.1-8B on eight
  colocated TP1 H100 servers (prefill and decode on the same GPUs, pdsim.engine.colocated),
  2,560 requests of 1k/1k at concurrency 256.
- ``colocated_stream N``: the 1P1D stream's requests, step times and pool (57,000 tokens) on
  one colocated rank instead of a prefill and a decode rank (radix cache off, as the stream's
  prefix cache is).
- ``startup``: fresh interpreters (this tree's pdsim) running ``python -m pdsim.cli run
  scenarios/drop_timeout.yaml`` (the whole command, its report printed to nowhere), ``python
  -m pdsim.cli validate scenarios/drop_timeout.yaml`` and ``python -c "import pdsim"``: the
  median wall and CPU time of 10 each, after one unmeasured run that writes the bytecode caches
  (an installed package has them). Interpreter start-up included (``python -c pass`` is shown
  beside them): this is what a user waits for. Its own line, after the table.

``events`` are SimPy events (Event objects scheduled). What pdsim schedules as plain entries of
its second heap instead (``pdsim.engine.clock.Environment``) is counted apart, per request, as
``entries/req``: batch-step ends (inner steps of a fast-forwarded decode span that end before
anything else is due take none), links of zero-delay callback chains (where a replaced
process's response/condition/resumption events were) and plain timers (hops, call latencies,
bootstrap delays, NIC wake-ups: where one-callback timeouts were). They are the ids drawn that
name no SimPy event and no unused reservation (``pdsim.engine.clock.counts``: counting them by kind
cost an increment per entry, ~1% of a run). ``sched/req`` is all of them: everything the run
put on a heap.

Each workload runs in a fresh interpreter (so peak RSS is its own), on one core. Wall time is
``pdsim.run`` in-process and the reading of its four tables, which ``Result`` builds when first
read: scenario loading, fleet building, the simulation and the DataFrames, all a run produces
(a sweep, which reads only summaries, pays less); not interpreter start-up or imports
(``cpu s``: the same span in process CPU time, less sensitive to other load on the machine).
One untimed run comes first, then the median of ``--repeat`` runs is reported (``--json`` also
gives their minimum, ``cpu_min_s``); streams of 32k requests and more run once, after a
warm-up run of a 1k stream in the same process (so the first run's one-off costs, ~0.3 s, are
not counted). Every workload's scenario is then loaded once from cold, its YAML and trace files
parsed again (``load s``, timed apart); the timed runs reuse that parse, as a notebook's or a
sweep's next run does, so the cost per request is the simulation's at every stream size (until
2026-11-30 the 32k+ streams parsed their trace inside the timed run, ~3-5 us a request, and
the 8k stream did not).
On a shared host the same run's time moves by tens of per cent from one minute to the next:
compare commits by alternating runs (``compare.py``) and by instruction counts
(``instructions.py``). Peak RSS is the process's maximum resident set (Python, numpy, pandas
and the run), and ``+RSS`` its growth over the state after imports.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STREAM_SIZES = (1000, 8000, 32000, 100000)

# DistServe's fitted OPT-13B step times, A100-80GB, TP 1 (ms; per-token terms per 1k tokens)
OPT13B_A100_TP1 = {
    "prefill_a_ms": 16.456860431694288, "prefill_b_ms_per_ktok": 92.64750660897617,
    "prefill_c_ms_per_mtok2": 6.474785740229194, "decode_a_ms": 19.934702624895458,
    "decode_b_ms_per_ktok": 0.6269356524350583, "decode_c_ms_per_seq": 0.03850697740828398,
}


def _read_rows(path: Path) -> list[dict]:
    import gzip

    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def stream_scenario(n: int, tmp: Path) -> dict:
    """The 1P1D stream of ``n`` requests (see the module docstring)."""
    rows = _read_rows(ROOT / "scenarios" / "traces" / "synthetic_trace.jsonl.gz")
    path = tmp / f"stream_{n}.jsonl"
    with path.open("w") as f:
        for k in range(n):
            r = rows[k % len(rows)]
            f.write(json.dumps({"timestamp": 0, "input_length": r["input_length"],
                                "output_length": r["output_length"]}) + "\n")
    return {
        "name": f"stream_{n}", "seed": 1, "horizon_s": n / 2 + 3600,
        "fleet": {"gpu": "A100", "model": "llama-3.1-8b",
                  "prefill": {"kv_pool_tokens": 57000, "prefix_cache": False},
                  "decode": {"kv_pool_tokens": 57000}},
        "predictor": {"kind": "fitted", "coefficients": OPT13B_A100_TP1},
        "clients": [{"kind": "bench", "num_prompts": n, "request_rate": 4.0,
                     "warmup_requests": 0,
                     "dataset": {"kind": "trace", "path": str(path), "max_input_len": 1024}}],
    }


def colocated_stream_scenario(n: int, tmp: Path) -> dict:
    """The stream of ``n`` requests (``stream_scenario``) on one colocated rank."""
    d = stream_scenario(n, tmp)
    d["name"] = f"colocated_stream_{n}"
    d["fleet"] = {"gpu": "A100", "model": "llama-3.1-8b", "mode": "colocated",
                  "colocated": {"kv_pool_tokens": 57000, "prefix_cache": False}}
    return d


WORKLOAD_FILES = {"colocated": "capacity/colocated_8xh100"}


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def measure(workload: str, repeat: int, profile: bool = False) -> dict:
    """Run one workload in this process; what the table shows."""
    import pdsim

    with tempfile.TemporaryDirectory() as tmp:
        if workload.startswith(("stream:", "colocated_stream:")):
            n = int(workload.split(":")[1])
            make = stream_scenario if workload.startswith("stream") else colocated_stream_scenario
            source = make(n, Path(tmp))
            repeat = 1 if n >= 32000 else repeat
        else:
            source = ROOT / "scenarios" / f"{WORKLOAD_FILES.get(workload, workload)}.yaml"
        if profile:
            return _profile(pdsim, source)
        base = _rss_mb()
        walls, cpus, res = [], [], None
        # warm: the first run in a process parses and memoises what later runs reuse (~0.3 s
        # of first-run costs); a stream of 32k+ runs once, after a 1k stream's warm-up run
        big = workload.startswith(("stream:", "colocated_stream:")) and n >= 32000
        warm = pdsim.run(stream_scenario(1000, Path(tmp)) if big else source,
                         allow_outside_paths=True)
        _ = warm.requests, warm.events, warm.timeseries, warm.answers
        # then the scenario's load from cold, its YAML and trace parsed again: timed apart
        # (``load_s``), and its parse is the one every timed run reuses, as a notebook's or a
        # sweep's next run does (so every size times the same thing: until 2026-11-30 the
        # 8k stream reused its warm-up's parse and the 32k+ streams parsed inside the run)
        load_s = _cold_load(pdsim, source)
        for _ in range(repeat):
            res = None
            t0, c0 = time.perf_counter(), time.process_time()
            res = pdsim.run(source, allow_outside_paths=True)
            _ = res.requests, res.events, res.timeseries, res.answers  # (built when read)
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
    wall = statistics.median(walls)
    n_req = len(res.requests)
    s = res.summary
    peak = _rss_mb()
    return {"workload": workload, "requests": n_req,
            "sim_s": s["simulated_s"], "events": s["events"], "wall_s": wall,
            "entries": getattr(res, "sim_entries", 0),
            "cpu_s": statistics.median(cpus), "cpu_min_s": min(cpus),
            "events_per_req": s["events"] / n_req, "us_per_req": 1e6 * wall / n_req,
            "sim_s_per_wall_s": s["simulated_s"] / wall, "events_per_s": s["events"] / wall,
            "peak_rss_mb": peak, "rss_growth_mb": peak - base, "runs": len(walls),
            "load_s": load_s}


def _cold_load(pdsim, source) -> float:
    """Seconds of ``pdsim.load`` with the YAML and trace caches emptied first (what a
    ``pdsim run`` in a fresh process parses: its scenario and trace files, then checks)."""
    from pdsim.config import trace
    from pdsim.util import safeyaml

    safeyaml._PARSED.clear()
    trace._parse.cache_clear()
    trace._count_rows.cache_clear()
    trace._WHOLE.clear()
    t0 = time.perf_counter()
    pdsim.load(source, allow_outside_paths=True)
    return time.perf_counter() - t0


def _profile(pdsim, source) -> dict:
    import cProfile
    import io
    import pstats

    pr = cProfile.Profile()
    pr.enable()
    res = pdsim.run(source, allow_outside_paths=True)
    _ = res.requests, res.events, res.timeseries, res.answers  # (built when read)
    pr.disable()
    out = io.StringIO()
    pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(18)
    lines = out.getvalue().splitlines()
    calls = next(line.strip() for line in lines if "function calls" in line)
    table = lines[next(i for i, line in enumerate(lines) if "ncalls" in line):]
    return {"profile": "\n".join([calls, *table]).rstrip()}


STARTUP = {  # what runs in a fresh interpreter (arguments after the interpreter's path)
    "run": ["-m", "pdsim.cli", "run", "scenarios/drop_timeout.yaml"],
    "validate": ["-m", "pdsim.cli", "validate", "scenarios/drop_timeout.yaml"],
    "import": ["-c", "import pdsim"],
    "python": ["-c", "pass"],
}
STARTUP_RUNS = 10


def startup(runs: int = STARTUP_RUNS) -> dict:
    """Median wall and CPU seconds of ``runs`` fresh interpreters per :data:`STARTUP` command,
    run from this tree's root with its pdsim first on the path, alternating the commands."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(ROOT)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in STARTUP}
    for i in range(runs + 1):
        for name, argv in STARTUP.items():
            r0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
            subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wall = time.perf_counter() - t0
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            if i:  # the first run writes the bytecode caches
                times[name].append((wall, r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime))
    out: dict = {"workload": "startup", "runs": runs}
    for name, t in times.items():
        out[f"{name}_wall_s"] = statistics.median(w for w, _c in t)
        out[f"{name}_cpu_s"] = statistics.median(c for _w, c in t)
    return out


def startup_line(m: dict) -> str:
    run = (f"pdsim run scenarios/drop_timeout.yaml {m['run_wall_s']:.3f} / {m['run_cpu_s']:.3f}; "
           if "run_wall_s" in m else "")
    return (f"startup (median of {m['runs']} fresh interpreters, wall / cpu s): {run}pdsim "
            f"validate scenarios/drop_timeout.yaml {m['validate_wall_s']:.3f} / "
            f"{m['validate_cpu_s']:.3f}"
            f"; import pdsim {m['import_wall_s']:.3f} / {m['import_cpu_s']:.3f}; python -c "
            f"pass {m['python_wall_s']:.3f} / {m['python_cpu_s']:.3f}")


def _in_child(workload: str, repeat: int, profile: bool) -> dict:
    cmd = [sys.executable, __file__, "--child", workload, "--repeat", str(repeat)]
    if profile:
        cmd.append("--profile-child")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def scheduled(m: dict) -> int:
    """SimPy events plus plain heap entries: everything the run scheduled (also read by
    compare.py)."""
    return m["events"] + _entries(m)


def _entries(m: dict) -> int:
    """Plain heap entries (older outputs count them by kind)."""
    return m.get("entries", m.get("step_entries", 0) + m.get("chain_entries", 0)
                 + m.get("timer_entries", 0))


COLUMNS = (  # (header, width, format of the row's value)
    ("workload", 16, lambda m: f"{m['workload']:<16}"),
    ("requests", 9, lambda m: f"{m['requests']:>9}"),
    ("sim s", 9, lambda m: f"{m['sim_s']:>9.0f}"),
    ("events", 11, lambda m: f"{m['events']:>11}"),
    ("ev/req", 8, lambda m: f"{m['events_per_req']:>8.1f}"),
    ("entries/req", 12, lambda m: f"{_entries(m) / m['requests']:>12.1f}"),
    ("sched/req", 10, lambda m: f"{scheduled(m) / m['requests']:>10.1f}"),
    ("wall s", 9, lambda m: f"{m['wall_s']:>9.3f}"),
    ("cpu s", 8, lambda m: f"{m['cpu_s']:>8.3f}"),
    ("us/req", 8, lambda m: f"{m['us_per_req']:>8.0f}"),
    ("load s", 8, lambda m: f"{m['load_s']:>8.3f}" if "load_s" in m else f"{'-':>8}"),
    ("sim s/wall s", 13, lambda m: f"{m['sim_s_per_wall_s']:>13.0f}"),
    ("events/s", 10, lambda m: f"{m['events_per_s'] / 1e3:>9.0f}k"),
    ("peak RSS MB", 12, lambda m: f"{m['peak_rss_mb']:>12.0f}"),
    ("+RSS MB", 9, lambda m: f"{m['rss_growth_mb']:>9.0f}"),
)
HEADER = "".join(f"{h:<{w}}" if i == 0 else f"{h:>{w}}" for i, (h, w, _f) in enumerate(COLUMNS))


def row(m: dict) -> str:
    return "".join(f(m) for _h, _w, f in COLUMNS)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", nargs="*", choices=["healthy", "drop_timeout", "trace_replay",
                                                   "stream", "colocated", "colocated_stream",
                                                   "startup"])
    ap.add_argument("--sizes", type=int, nargs="*", default=list(STREAM_SIZES))
    ap.add_argument("--profile", metavar="WORKLOAD",
                    help="print the cProfile top (by own time) of one workload, e.g. healthy "
                    "or stream:8000")
    ap.add_argument("--json", action="store_true", help="one JSON object per workload")
    ap.add_argument("--write-docs", metavar="FILE",
                    help="also write the table as the docs' include (docs/generated/speed.md), "
                    "with this command, the commit, the date and the machine")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--profile-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.repeat, args.profile_child)))
        return
    if args.profile:
        print(_in_child(args.profile, 1, True)["profile"])
        return
    only = args.only or ["healthy", "drop_timeout", "trace_replay", "stream", "colocated",
                         "colocated_stream", "startup"]
    workloads = [w for w in ("healthy", "drop_timeout", "trace_replay") if w in only]
    if "stream" in only:
        workloads += [f"stream:{n}" for n in args.sizes]
    if "colocated" in only:
        workloads.append("colocated")
    if "colocated_stream" in only:
        workloads += [f"colocated_stream:{n}" for n in args.sizes]
    head = (f"python {platform.python_version()} on {platform.machine()}, one core; "
            f"median of {args.repeat} warm runs (streams of 32k+: 1 run after a "
            f"1k stream's warm-up); load s: the scenario and trace parsed from cold, apart")
    lines = [head, HEADER] if workloads else []
    if not args.json and workloads:
        print(head)
        print(HEADER)
    for w in workloads:
        m = _in_child(w, args.repeat, False)
        lines.append(row(m))
        print(json.dumps(m) if args.json else row(m), flush=True)
    if "startup" in only:
        m = startup()
        lines.append(startup_line(m))
        print(json.dumps(m) if args.json else startup_line(m), flush=True)
    if args.write_docs:
        write_docs(Path(args.write_docs), lines)


def write_docs(path: Path, lines: list[str]) -> None:
    """The docs' speed include: the table as printed, with what produced it and where. A
    measurement of one machine at one time: rerun the command to refresh it."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip() or "unknown"
    cmd = " ".join(["python", "benchmarks/speed.py", *sys.argv[1:]])
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    path.write_text(f"<!-- generated by: {cmd} -->\n\n"
                    f"`{cmd}` at commit `{commit}`, {when}, on a {os.cpu_count()}-core "
                    f"{platform.system()} host:\n\n```text\n"
                    + "\n".join(lines) + "\n```\n")
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()

"""Runs side by side: the table ``pdsim compare`` prints (and its JSON), and the GPUs a run
used, so that a layout's figures can be read per GPU.

    from pdsim.output import compare
    print(compare.render({"PD 3P2D": pd_run, "colocated": co_run}))

Every figure is the run's own summary's (pdsim.engine.summary, pdsim.engine.steady,
pdsim.engine.slo): nothing is recomputed here, so a run directory read back
(:meth:`pdsim.output.result.Result.read`) compares as the run it came from.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from pdsim.output.result import Result


def gpus_used(res: Result) -> int:
    """GPUs the run's fleet holds: the summary's own count when the run reports one, else
    each role's servers x GPUs per server (``tp`` with DP attention, whose ranks share the
    server's GPUs; ``dp x tp`` without, SGLang's --dp N --tp M taking N*M GPUs)."""
    for key in ("gpus", "gpus_used"):
        v = res.summary.get(key)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    f = res.scenario.fleet
    return sum(r.servers * (r.tp if r.dp_attention else r.dp * r.tp)
               for r in (f.prefill, f.decode))


def _per_gpu(res: Result, value: float | None) -> float | None:
    n = gpus_used(res)
    return None if value is None or not n else value / n


def goodput(res: Result) -> tuple[float | None, str]:
    """(requests per second that met the scenario's SLO, or completed ones without an SLO;
    which it is)."""
    slo = res.summary.get("slo")
    if slo:
        return slo.get("goodput_req_s"), "goodput under the SLO"
    s = res.summary
    done, dur = s.get("completed_requests", 0), s.get("duration_s") or 0
    return (round(done / dur, 3) if dur else None), "completed (no slo: set)"


def slo_text(res: Result) -> str:
    """The scenario's SLO thresholds in a few characters ("-" without one)."""
    slo = res.summary.get("slo")
    if not slo:
        return "-"
    return ", ".join(f"{n}<={slo[k]:g}ms" for k, n in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"),
                                                      ("e2e_ms", "E2E"))
                     if slo.get(k) is not None)


def _verdict(res: Result) -> str:
    from pdsim.engine.steady import verdict_line

    st = res.summary.get("steady") or {}
    if st.get("keeps_up") is None:
        return "n/a"
    return verdict_line(st, rates=False).replace("falling behind: queue grows", "behind: +")


LATENCIES = (("TTFT", "ttft"), ("TPOT", "tpot"), ("ITL", "itl"), ("E2E", "e2e"))
STATS = (("Mean", "mean"), ("P50", "median"), ("P90", "p90"), ("P95", "p95"), ("P99", "p99"))


def rows(results: dict[str, Result]) -> list[tuple[str, str, Callable[[Result], object]]]:
    """The table's rows: (section, label, the value of a run)."""
    out: list[tuple[str, str, Callable[[Result], object]]] = [
        ("", "GPUs used", gpus_used),
        ("", "Request throughput (req/s)", lambda r: r.summary["request_throughput_req_s"]),
        ("", "Output token throughput (tok/s)", lambda r: r.summary["output_throughput_tok_s"]),
        ("", "Output tokens per GPU (tok/s)",
         lambda r: _per_gpu(r, r.summary["output_throughput_tok_s"])),
        ("", "Keeps up (steady window)", _verdict),
        ("", "Offered / completed (req/s, steady)", _rates),
        ("", "SLO (scenario slo:)", slo_text),
        ("", "SLO attainment", lambda r: r.summary.get("slo") or {}),
        ("", "Goodput (req/s)", lambda r: goodput(r)[0]),
        ("", "Goodput per GPU (req/s)", lambda r: _per_gpu(r, goodput(r)[0])),
    ]
    for name, key in LATENCIES:
        for label, stat in STATS:
            out.append((f"{name} (ms)", f"{label} {name} (ms)",
                        lambda r, k=f"{stat}_{key}_ms": r.summary.get(k)))
    return out


def _rates(res: Result) -> str:
    st = res.summary.get("steady") or {}
    if st.get("keeps_up") is None:
        return "n/a"
    return f"{st['offered_req_s']:.2f} / {st['completed_req_s']:.2f}"


def _fmt(label: str, v: object) -> str:
    if v is None or isinstance(v, float) and math.isnan(v):
        return "n/a"
    if label == "SLO attainment":  # (and whether it meets the target: 88.8% beside a 90%
        att = v.get("attainment")  # target read as a pass)
        if att is None:
            return "n/a"
        target = v.get("attainment_target")
        return (f"{100 * att:.1f}%" if target is None else
                f"{100 * att:.1f}% ({'meets' if v.get('meets_slo') else 'misses'} "
                f"{100 * target:g}%)")
    if isinstance(v, bool) or isinstance(v, str):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    return f"{v:,.2f}"


def table(results: dict[str, Result]) -> list[tuple[str, str, list[str]]]:
    """(section, label, one formatted value per run) for each row."""
    return [(sec, label, [_fmt(label, get(r)) for r in results.values()])
            for sec, label, get in rows(results)]


def render(results: dict[str, Result]) -> str:
    """The comparison as ``pdsim compare`` prints it: a column per run, bench_serving's
    wording, a section per latency, and notes on what differs between the runs' setups."""
    names = list(results)
    rows_ = table(results)
    width = min(40, max(14, *(len(n) + 2 for n in names),
                        *(len(v) + 2 for _, _, vs in rows_ for v in vs)))
    label_w = 38
    total = label_w + width * len(names)
    out = [" Comparison ".center(total, "="),
           f"{'':<{label_w}}" + "".join(f"{n:>{width}}" for n in names)]
    section = ""
    for sec, label, values in rows_:
        if sec != section:
            out.append(f" {sec} ".center(total, "-"))
            section = sec
        shown = [v if len(v) < width else v[: width - 2] + "…" for v in values]
        out.append(f"{label:<{label_w}}" + "".join(f"{v:>{width}}" for v in shown))
    out.append("=" * total)
    out += notes(results)
    return "\n".join(out)


def notes(results: dict[str, Result]) -> list[str]:
    """What makes the runs' figures not like for like: different SLOs, offered loads, or a
    run without a steady-window verdict."""
    out = []
    slos = {slo_text(r) for r in results.values()}
    if len(slos) > 1:
        out.append("note: the runs have different SLOs (slo:); goodput is each under its own.")
    offered = [(r.summary.get("steady") or {}).get("offered_req_s") for r in results.values()]
    known = [o for o in offered if o]
    if len(known) > 1 and max(known) > 1.1 * min(known):
        out.append("note: the offered loads differ by more than 10% "
                   f"({' vs '.join(f'{o:.2f}' for o in known)} req/s).")
    if any(not r.summary.get("slo") for r in results.values()):
        out.append("Goodput without an slo: counts every completed request over the run.")
    return out


def as_json(results: dict[str, Result]) -> dict:
    """The comparison as JSON: per run, its GPUs, goodput (and per GPU), verdict and the
    summary's figures the table shows."""
    out = {}
    for name, r in results.items():
        g, what = goodput(r)
        out[name] = {"gpus_used": gpus_used(r), "goodput_req_s": g, "goodput_is": what,
                     "goodput_per_gpu_req_s": _per_gpu(r, g),
                     "output_tok_s_per_gpu": _per_gpu(r, r.summary["output_throughput_tok_s"]),
                     "steady": r.summary.get("steady"), "slo": r.summary.get("slo"),
                     **{k: r.summary.get(k) for k in r.summary
                        if k.endswith("_ms") or k.endswith("_per_s") or k.endswith("_tok_s")
                        or k == "request_throughput_req_s"}}
    return out

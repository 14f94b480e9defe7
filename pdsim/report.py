"""Human-readable output: bench_serving's layout, the fleet, the incident timeline."""

from __future__ import annotations

import math

import pandas as pd

from pdsim.scenario import BenchClientConfig, EvalClientConfig, ReferenceFigure
from pdsim.sim import Result
from pdsim.transfer import DEAD_MSG
from pdsim.unknowns import block as unknowns_lines

W = 50


def _line(label: str, value: object) -> str:
    if isinstance(value, float):
        value = "n/a" if math.isnan(value) else f"{value:.2f}"
    elif value is None:
        value = "n/a"
    return f"{label:<41}{value}"


def _head(title: str, ch: str = "-") -> str:
    return f" {title} ".center(W, ch)


def _trace_rows(m: dict, cfg: BenchClientConfig | EvalClientConfig) -> str:
    done, rows = m["trace_rows_replayed"], m["trace_rows"]
    if done >= rows:
        return f"all {rows:,}"
    by = "num_prompts" if cfg.num_prompts == done else "dataset.limit"
    return f"{done:,} of {rows:,} (cut by {by}={done})"


def bench_block(name: str, m: dict, cfg: BenchClientConfig | EvalClientConfig) -> list[str]:
    """One client's numbers as bench_serving prints them, plus what it hides."""
    out = [_head(f"Serving Benchmark Result: {name}", "=")]
    if cfg.kind == "bench":
        out += [_line("Backend:", "sglang (simulated)"),
                _line("Traffic request rate:", str(cfg.request_rate)),
                _line("Max request concurrency:", cfg.max_concurrency or "not set")]
    else:
        out += [_line("Client:", f"gsm8k-style eval, {cfg.threads} threads"),
                _line("Questions:", m.get("questions")),
                _line("Empty answers (retries exhausted):", m.get("empty_answers"))]
    if m.get("trace_rows") is not None:
        out.append(_line("Trace rows replayed:", _trace_rows(m, cfg)))
    if m.get("aborted"):
        out.append(_line("Aborted:", m["aborted"]))
    out += [
        _line("Successful requests:", m["completed"]),
        _line("Benchmark duration (s):", m["duration_s"]),
        _line("Total input tokens:", m["total_input_tokens"]),
        _line("Total generated tokens:", m["total_generated_tokens"]),
        _line("Total generated tokens (retokenized):", m["total_generated_tokens_true"]),
        _line("Request throughput (req/s):", m["request_throughput_req_s"]),
        _line("Output token throughput (tok/s):", m["output_throughput_tok_s"]),
        _line("Total token throughput (tok/s):", m["total_throughput_tok_s"]),
        _line("Concurrency:", m["concurrency"]),
        _head("What bench_serving hides"),
        _line("Failed requests (5xx or abort):", m["failed"]),
        _line("Empty responses:", f"{m['empty_responses']} ({100 * m['empty_share']:.1f}%)"),
        _line("Generated-token throughput (tok/s):", m["true_output_throughput_tok_s"]),
        _line("Prefix cache hit rate (prompt tokens):", f"{100 * m['prefix_cache_hit_rate']:.1f}%"),
        _head("End-to-End Latency"),
        _line("Mean E2E Latency (ms):", m["mean_e2e_ms"]),
        _line("Median E2E Latency (ms):", m["median_e2e_ms"]),
        _head("Time to First Token"),
        _line("Mean TTFT (ms):", m["mean_ttft_ms"]),
        _line("Median TTFT (ms):", m["median_ttft_ms"]),
        _line("P99 TTFT (ms):", m["p99_ttft_ms"]),
        _head("Time per Output Token (excl. 1st token)"),
        _line("Mean TPOT (ms):", m["mean_tpot_ms"]),
        _line("Median TPOT (ms):", m["median_tpot_ms"]),
        _line("P99 TPOT (ms):", m["p99_tpot_ms"]),
        _head("Inter-Token Latency"),
        _line("Mean ITL (ms):", m["mean_itl_ms"]),
    ]
    return out


def fleet_block(s: dict) -> list[str]:
    out = [_head("Fleet", "=")]
    reasons = ", ".join(f"{k} {v}" for k, v in s["transfer_failures_by_reason"].items())
    out += [
        _line("Transfer failures:", f"{s['transfer_failures']} ({reasons})"),
        _line("Transfers doomed by flushes:", s["flush_doomed_transfers"]),
        _line("Blacklisted pairs (max / final):",
              f"{s['blacklisted_pairs_max']} / {s['blacklisted_pairs_final']}"),
        _line("Wasted prefill tokens:", s["wasted_prefill_tokens"]),
        _line("Requests on pages freed by a flush:", s["stale_page_requests"]),
        _line("Retractions:", s["retractions"]),
    ]
    fl = s["flushes"]
    if any(sum(v.values()) for v in fl.values()):
        ex = sum(v["executed"] for v in fl.values())
        rj = sum(v["rejected"] for v in fl.values())
        to = sum(v["timed_out"] for v in fl.values())
        out.append(_line("Rank flushes (exec / rejected / t-out):", f"{ex} / {rj} / {to}"))
    if s["failed_by_reason"]:
        out.append(_line("Failed requests by reason:",
                         ", ".join(f"{k} {v}" for k, v in s["failed_by_reason"].items())))
    out.append(_line("Simulated s / SimPy events:", f"{s['simulated_s']} / {s['events']}"))
    return out


def _flush_line(t: str, group: list) -> str:
    """One line for the ranks of one server flushing at one instant."""
    server = group[0].component
    how = group[0].detail.split(";")[0]
    doomed = ", ".join(f"r{e.rank} {int(e.value)}" for e in group if e.value)
    busy = any(e.detail.split("; ")[1].startswith("busy") for e in group)
    state = "busy" if busy else "idle"
    ranks = f"r{group[0].rank}" if len(group) == 1 else f"{len(group)} ranks"
    lost = f"; transfers on freed pages: {doomed}" if doomed else "; nothing in flight"
    return f"{t}{server}: {ranks} flushed ({how}) while {state}{lost}"


def timeline(ev: pd.DataFrame, pairs_total: int, limit: int = 40) -> list[str]:
    """The story a postmortem reader needs, in order and concise."""
    if ev.empty:
        return []
    out = [_head("Incident timeline", "=")]
    rows: list[str] = []
    first_fast = None
    fast = 0
    pairs = 0
    flush_group: list = []

    def close_group() -> None:
        if flush_group:
            rows.append(_flush_line(f"t={flush_group[0].time:9.3f}s ", flush_group))
            flush_group.clear()

    for e in ev.itertuples(index=False):
        t = f"t={e.time:9.3f}s "
        if e.event == "flush_executed":
            if flush_group and (flush_group[0].component != e.component
                                or flush_group[0].time != e.time):
                close_group()
            flush_group.append(e)
            continue
        close_group()
        if e.event == "router_flush":
            rows.append(f"{t}router: POST /flush_cache from {e.peer}; {e.detail}")
        elif e.event == "router_flush_answer":
            rows.append(f"{t}router: answered {int(e.value)} to {e.peer} ({e.detail})")
        elif e.event == "flush_rejected":
            rows.append(f"{t}{e.component}{'' if e.rank < 0 else f'.r{e.rank}'}: flush refused "
                        f"({e.detail})")
        elif e.event == "flush_timed_out":
            rows.append(f"{t}{e.component}.r{e.rank}: flush timed out waiting for idle "
                        f"({e.detail})")
        elif e.event == "blacklist_add":
            pairs += 1
        elif e.event == "transfer_failed" and e.detail != "blacklisted_session":
            grew = f" -> pair blacklisted ({pairs}/{pairs_total})" if e.value else ""
            rows.append(f"{t}{e.component}.r{e.rank} -> {e.peer}: ret != 0 ({e.detail}), "
                        f"room {e.room}{grew}")
        elif e.event == "transfer_failed":
            fast += 1
            if first_fast is None:
                first_fast = e
                rows.append(f"{t}{e.component}.r{e.rank} -> {e.peer}: first fast-fail, "
                            f"'{DEAD_MSG}' (room {e.room})")
        elif e.event == "blacklist_remove":
            pairs -= 1
            rows.append(f"{t}{e.component}: {e.peer} off the blacklist ({e.detail}); "
                        f"{pairs}/{pairs_total} pairs left")
        elif e.event == "probe":
            rows.append(f"{t}{e.component}: probe of {e.peer} failed")
        elif e.event in ("fault_start", "fault_end", "heartbeat_lost"):
            who = f"{e.component}{'' if e.rank < 0 else f'.r{e.rank}'}"
            rows.append(f"{t}{who}: {e.detail}{f' ({e.peer})' if e.peer else ''}")
        elif e.event == "client_aborted":
            rows.append(f"{t}{e.component}: {e.detail}")
    close_group()
    if len(rows) > limit:
        rows = rows[: limit - 1] + [f"... {len(rows) - limit + 1} more lines in the event log"]
    out += rows
    if fast:
        out.append(f"{fast} requests failed fast on blacklisted pairs "
                   f"(of {pairs_total} prefill-rank x decode-session pairs)")
    return out


def _get(summary: dict, path: str):
    cur = summary
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def band(r: ReferenceFigure) -> str:
    """`` ±2`` or `` ±15%``: the reference figure's band as printed."""
    if r.tolerance is not None:
        return f" ±{r.tolerance:g}"
    if r.rel_tolerance is not None:
        return f" ±{100 * r.rel_tolerance:g}%"
    return ""


def unknowns_block(res: Result) -> list[str]:
    """The chosen inputs this run took at their nominal values (pdsim explore samples them)."""
    if not res.unknowns:
        return []
    return [_head("Declared unknowns (run at nominal)", "="), *unknowns_lines(res.unknowns),
            "pdsim explore samples these ranges and shows which values fit the report"]


def reference_block(summary: dict, refs: list[ReferenceFigure]) -> list[str]:
    if not refs:
        return []
    out = [_head("Compared with the reported figures", "="),
           f"{'figure':<52}{'simulated':>10}{'reported':>10}"]
    for r in refs:
        sim = _get(summary, r.metric) if r.metric else None
        tol = band(r)
        ok = r.within(sim)
        verdict = "" if ok is None else ("within" if ok else "outside")
        shown = "" if sim is None else f"{sim:,.3f}".rstrip("0").rstrip(".")
        out.append(f"{r.label[:51]:<52}{shown:>10}{r.reported:>10,g}{tol:<7} {verdict}")
    return out


def render(res: Result) -> str:
    s = res.summary
    lines: list[str] = []
    for c in res.scenario.clients:
        lines += bench_block(c.name, s["clients"][c.name], c)
    lines += fleet_block(s)
    ev = res.events
    interesting = ev[~ev.event.isin(["retract", "flush_doomed", "probe", "flush_received",
                                     "flush_answer"])
                     | ((ev.event == "probe") & (ev.detail != "ok"))]
    sc = res.scenario
    pairs = (sc.fleet.prefill.servers * sc.fleet.prefill.dp
             * sc.fleet.decode.servers * sc.fleet.decode.dp)
    lines += timeline(interesting, pairs)
    lines += unknowns_block(res)
    lines += reference_block(s, res.scenario.reference)
    lines.append("=" * W)
    return "\n".join(lines)

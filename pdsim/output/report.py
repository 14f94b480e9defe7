"""Human-readable output: bench_serving's layout, the fleet, the incident timeline.

Lines that mirror ``bench_serving`` keep its wording, except where its wording misleads
("Successful requests" counts HTTP 200s, streamed aborts included); the block "What
bench_serving hides" says what those numbers leave out.
"""

from __future__ import annotations

import math
import textwrap
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING

from pdsim.config.clients import BenchClientConfig, EvalClientConfig
from pdsim.config.scenario import ReferenceFigure
from pdsim.config.unknowns import block as unknowns_lines
from pdsim.engine.outcome import Outcome
from pdsim.engine.transfer import DEAD_MSG
from pdsim.output import incident_report
from pdsim.output.run_warnings import (  # noqa: F401 (not_reached: API)
    horizon_warning,
    not_reached,
    not_reached_warning,
)

if TYPE_CHECKING:
    import pandas as pd

W = 60
LABEL = 50

# which transfers a flush fails is an assumption (flush.dooms): "in flight" is not true of
# all of them under source_and_unstarted, the drop-timeout replay's chosen value
DOOMED = {
    "source": "in flight on prefill pages a flush freed",
    "source_and_destination": "in flight on pages a flush freed (prefill pages, or decode "
                              "pages its started prefill writes into)",
    "source_and_unstarted": "on pages a flush freed: in flight, or into decode pages "
                            "pre-allocated for a prefill not yet started",
}
DOOMED_VS_FAILED = [
    "doomed: a KV transfer {which} (flush.dooms: {dooms}, an assumption). It fails at its next "
    "write (ret != 0, reason flush_freed_pages, which blacklists its pair) or, when its pair "
    "is already blacklisted, at the blacklist check (reason blacklisted_session).",
    "failed: a request answered with a 5xx, or (streaming) a 200 with an empty abort chunk, "
    "whatever the cause; bench_serving counts the latter as successful.",
]


def _define(text: str) -> list[str]:
    return textwrap.wrap(text, 88, subsequent_indent="  ", break_on_hyphens=False)


def _line(label: str, value: object) -> str:
    if isinstance(value, float):
        value = "n/a" if math.isnan(value) else f"{value:.2f}"
    elif value is None:
        value = "n/a"
    return f"{label:<{LABEL}}{value}"


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
    if cfg.kind == "bench" and cfg.dataset.kind == "sharegpt":
        ds = cfg.dataset
        fixed = f", output {ds.output_len}" if ds.output_len else ""
        out.append(_line("Dataset:", f"sharegpt sampling of {ds.label}{fixed}"))
    if m.get("trace_rows") is not None:
        out.append(_line("Trace rows replayed:", _trace_rows(m, cfg)))
    if m.get("aborted"):
        out.append(_line("Aborted:", f"{m['aborted']} ({m.get('unsent', 0)} prompts not sent)"))
    streamed_aborts = m["successful_requests"] - m["completed_requests"]
    out += [
        _line("Successful requests (HTTP 200, as bench_serving):", m["successful_requests"]),
        _line("Benchmark duration (s):", m["duration_s"]),
        _line("Total input tokens:", m["total_input_tokens"]),
        _line("Total generated tokens:", m["total_generated_tokens"]),
        _line("Total generated tokens (retokenized):", m["total_generated_tokens_true"]),
        _line("Request throughput (req/s):", m["request_throughput_req_s"]),
        *([_line("Request goodput (req/s):", m["slo"]["goodput_req_s"])] if "slo" in m else []),
        _line("Output token throughput (tok/s):", m["output_throughput_tok_s"]),
        _line("Total token throughput (tok/s):", m["total_throughput_tok_s"]),
        _line("Concurrency:", m["concurrency"]),
        _head("What bench_serving hides"),
        _line("Completed with all tokens generated:", m["completed_requests"]),
        _line("Failed (5xx, or 200 with an abort chunk):", m["failed"]),
    ]
    if streamed_aborts > 0:
        out.append(_line("  streamed aborts counted as successful:", streamed_aborts))
    if m["unfinished"]:
        out.append(_line("Still running when the run ended:", m["unfinished"]))
    out += [
        _line("Empty responses:", f"{m['empty_responses']} ({100 * m['empty_share']:.1f}%)"),
        _line("Generated-token throughput (tok/s):", m["true_output_throughput_tok_s"]),
        _line("Prefix cache hit rate (prompt tokens):",
              f"{100 * m['prefix_cache_hit_rate']:.1f}%"),
    ]
    if cfg.kind == "bench":  # (an eval is a closed loop: no offered rate to keep up with)
        out += steady_block(m.get("steady"))
    out += slo_block(m.get("slo"))
    slots = getattr(cfg, "max_concurrency", None)
    if m.get("slo") and slots and slots < (getattr(cfg, "num_prompts", None) or slots + 1):
        # (the SLO follows bench_serving's TTFT: from the send, after the wait for a slot)
        behind = (m.get("steady") or {}).get("keeps_up") is False
        out += _define(SLO_FROM_SEND.format(slots=slots) + (SLO_BEHIND if behind else "."))
    streamed = cfg.kind == "bench" and cfg.stream
    for title, key, name in LATENCIES:
        out.append(_head(title))
        out += [_line(f"{p} {name} (ms):", m[f"{k}_{key}_ms"]) for p, k in PERCENTILE_LINES]
        if key == "ttft" and streamed and streamed_aborts > 0:
            done = m.get("completed_mean_ttft_ms")
            out += _define(ABORT_TTFT.format(n=streamed_aborts) + (
                f"; the completed requests' mean TTFT is {done:.2f} ms "
                f"(completed_mean_ttft_ms)." if done is not None else "."))
    out += _define(ITL_NOTE if streamed else NOT_STREAMED.format(
        what="stream: false" if cfg.kind == "bench" else "an eval's requests"))
    return out


# bench_serving's sections and wording; each gets the mean, median, P90, P95 and P99
LATENCIES = (("End-to-End Latency", "e2e", "E2E Latency"), ("Time to First Token", "ttft", "TTFT"),
             ("Time per Output Token (excl. 1st token)", "tpot", "TPOT"),
             ("Inter-Token Latency", "itl", "ITL"))
PERCENTILE_LINES = (("Mean", "mean"), ("Median", "median"), ("P90", "p90"), ("P95", "p95"),
                    ("P99", "p99"))
NOT_STREAMED = ("Not streamed ({what}): a response is one chunk, so TTFT is its whole latency "
                "and there is no TPOT or ITL to measure (n/a; null in the JSON; "
                "bench_serving prints 0 for them). The server-side TPOT of completed requests "
                "is completed_mean_tpot_ms in the JSON.")
SLO_FROM_SEND = ("SLO measured from each request's send, as bench_serving measures TTFT: a "
                 "prompt's wait for one of the {slots} concurrency slots (max_concurrency) is "
                 "not in it")
SLO_BEHIND = ("; the fleet falls behind the offered rate, so the backlog waits for a slot in the "
              "client, where neither the SLO nor the latencies below see it.")
ABORT_TTFT = ("TTFT counts the {n:,} streamed aborts as bench_serving does: an abort's one chunk "
              "has no text, so its TTFT stays 0 (a median of 0.00 ms when half the responses "
              "or more are aborts)")
ITL_NOTE = ("ITL percentiles: each request's gaps at its mean gap (no per-token times are "
            "kept; the mean is exact).")


def steady_block(st: dict | None) -> list[str]:
    """Whether the load is kept up with (pdsim.engine.steady): the offered and completed rates
    over the steady window, the queue's trend, and the verdict in one line."""
    if not st:
        return []
    from pdsim.engine.steady import verdict_line

    out = [_head("Keeps up? (steady window, no drain tail)")]
    if st.get("keeps_up") is None:
        return [*out, *_define(f"Verdict: {verdict_line(st)}")]
    failed = f" (+{st['failed_req_s']:.2f} failed)" if st["failed_req_s"] else ""
    return [*out,
            _line("Steady window (s):", f"{st['from_s']:.1f} - {st['to_s']:.1f}"),
            _line("Offered / completed rate (req/s):",
                  f"{st['offered_req_s']:.2f} / {st['completed_req_s']:.2f}{failed}"),
            _line("Requests in system: mean / trend:",
                  f"{st['in_system_mean']:.0f} / {st['queue_growth_req_s']:+.2f} req/s"),
            _line("Verdict:", verdict_line(st, rates=False))]


def slo_block(slo: dict | None) -> list[str]:
    """The scenario's SLO (``slo:``) and how the requests met it (pdsim.engine.slo)."""
    if not slo:
        return []
    limits = ", ".join(f"{name} <= {slo[key]:g} ms" for key, name in
                       (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("e2e_ms", "E2E"))
                       if slo.get(key) is not None)
    att = slo["attainment"]
    shown = "n/a" if att is None else (
        f"{100 * att:.1f}% (target {100 * slo['attainment_target']:g}%): "
        f"{'meets' if slo['meets_slo'] else 'misses'} the SLO")
    return [_head("SLO (scenario slo:)"),
            _line("SLO:", limits),
            _line("SLO attainment (requests meeting it):", shown),
            _line("Goodput (req/s / generated tok/s):",
                  f"{_fmt(slo['goodput_req_s'])} / {_fmt(slo['goodput_tok_s'])}")]


def _fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}"


def fleet_block(s: dict, pairs_total: int | None = None,
                dooms: str = "source_and_destination") -> list[str]:
    """The fleet's counts, and the words they use defined (``dooms``: ``flush.dooms``)."""
    out = [_head("Fleet", "=")]
    by_role = s.get("gpus_by_role")
    if by_role:
        order = ("prefill", "decode", "colocated")  # (summary.json sorts its keys: the report
        roles = sorted(by_role, key=lambda r: (order.index(r) if r in order else 3, r))  # of a
        out.append(_line("GPUs:", f"{s['gpus']} (" + ", ".join(  # run read back reads alike)
            f"{role} {by_role[role]}" for role in roles) + ")"))
    if s.get("fleet_mode") == "colocated":
        return out + _colocated_block(s)
    by = s["transfer_failures_by_reason"]
    # a blacklisted pair's transfer fails at the engine's check, before any write: counted
    # apart from the writes that failed (ret != 0), which are what feeds the blacklist
    fast = by.get("blacklisted_session", 0)
    written = ", ".join(f"{k} {v}" for k, v in by.items() if k != "blacklisted_session" and v)
    n = s["transfer_failures"] - fast
    parts = [f"{n} write{'' if n == 1 else 's'} (ret != 0: {written})" if written else "",
             f"{fast} failed fast on a blacklisted pair (no write)" if fast else ""]
    detail = "; ".join(p for p in parts if p)
    of = f" of {pairs_total}" if pairs_total else ""
    out += [
        _line("Transfer failures:", f"{s['transfer_failures']}" + (f": {detail}" if detail
                                                                   else "")),
        _line("Transfers doomed by a flush:", s["flush_doomed_transfers"]),
        _line("Blacklisted pairs (max / final):",
              f"{s['blacklisted_pairs_max']} / {s['blacklisted_pairs_final']}{of}"),
        _line("Wasted prefill tokens (failed requests):", s["wasted_prefill_tokens"]),
        _line("Requests on pages freed by a flush:", s["stale_page_requests"]),
        _line("Retractions:", s["retractions"]),
    ]
    fl = s["flushes"]
    if any(sum(v.values()) for v in fl.values()):
        ex = sum(v["executed"] for v in fl.values())
        rj = sum(v["rejected"] for v in fl.values())
        to = sum(v["timed_out"] for v in fl.values())
        out.append(_line("Rank flushes (executed / rejected / timed out):", f"{ex} / {rj} / {to}"))
    if s["failed_by_reason"]:
        out.append(_line("Failed requests by reason:",
                         ", ".join(f"{k} {v}" for k, v in s["failed_by_reason"].items())))
    out.append(_line("Simulated s / SimPy events:", f"{s['simulated_s']} / {s['events']}"))
    if s["flush_doomed_transfers"]:  # each definition where its word is in use
        out += _define(DOOMED_VS_FAILED[0].format(which=DOOMED[dooms], dooms=dooms))
    if s["failed"]:
        out += _define(DOOMED_VS_FAILED[1])
    return out


def _colocated_block(s: dict) -> list[str]:
    """A colocated fleet's counts: no KV transfers, so none of the PD lines."""
    out = [
        _line("Requests on pages freed by a flush:", s["stale_page_requests"]),
        _line("Retractions (recomputed):", s["retractions"]),
        _line("Prefill / decode forwards:", f"{s['prefill_steps']} / {s['decode_steps']}"),
    ]
    fl = s["flushes"]
    if any(sum(v.values()) for v in fl.values()):
        ex = sum(v["executed"] for v in fl.values())
        rj = sum(v["rejected"] for v in fl.values())
        to = sum(v["timed_out"] for v in fl.values())
        out.append(_line("Rank flushes (executed / rejected / timed out):", f"{ex} / {rj} / {to}"))
    if s["failed_by_reason"]:
        out.append(_line("Failed requests by reason:",
                         ", ".join(f"{k} {v}" for k, v in s["failed_by_reason"].items())))
    out.append(_line("Simulated s / SimPy events:", f"{s['simulated_s']} / {s['events']}"))
    if s["failed"]:
        out += _define(DOOMED_VS_FAILED[1])
    return out


def _flush_line(t: str, group: list) -> str:
    """One line for the ranks of one server flushing at one instant."""
    server = group[0].component
    how = group[0].detail.split(";")[0]
    doomed = ", ".join(f"r{e.rank} {int(e.value)}" for e in group if e.value)
    busy = any(e.detail.split("; ")[1].startswith("busy") for e in group)
    state = "busy" if busy else "idle"
    ranks = f"r{group[0].rank}" if len(group) == 1 else f"{len(group)} ranks"
    lost = f"; transfers on freed pages (doomed): {doomed}" if doomed else "; nothing in flight"
    return f"{t}{server}: {ranks} flushed ({how}) while {state}{lost}"


def _ret_line(group: list, pairs: int, pairs_total: int) -> str:
    """One line for a burst of ``ret != 0`` transfer failures and the blacklist growth."""
    t0, t1 = group[0].time, group[-1].time
    span = f"t={t0:9.3f}s" if t1 == t0 else f"t={t0:9.3f}s..{t1:.3f}s"
    reasons: dict[str, int] = {}
    for e in group:
        reasons[e.detail] = reasons.get(e.detail, 0) + 1
    why = ", ".join(f"{k} {v}" for k, v in reasons.items())
    grew = sum(1 for e in group if e.value)
    n = len(group)
    return (f"{span} {n} transfer{'s' if n > 1 else ''} failed with ret != 0 ({why}); "
            f"{grew} pair{'s' if grew != 1 else ''} blacklisted, {pairs}/{pairs_total} now "
            f"(--verbose: each pair)")


ROUTINE = ("retract", "flush_doomed", "probe", "flush_received", "flush_answer", "done_lost")


def told(rows: Iterable) -> list:
    """The events the timeline tells (``Outcome.event_rows``): all but the routine ones, and
    the probes that failed (a probe logs ``value`` 1.0 when its peer answered, and a detail
    "ok after ... s" or "failed after ... s", pdsim.engine.blacklist)."""
    return [e for e in rows
            if e.event not in ROUTINE or (e.event == "probe" and not e.value)]


def timeline(ev: pd.DataFrame | Iterable, pairs_total: int, limit: int | None = 40,
             verbose: bool = False) -> list[str]:
    """The story a postmortem reader needs, in order and concise.

    ``ev``: events as ``Outcome.events`` has them, or its rows (``Outcome.event_rows``). A burst
    of ``ret != 0`` failures (and the blacklist growth it causes) is one line; with
    ``verbose`` every failure and pair gets its own line and nothing is cut.
    """
    ev = list(ev.itertuples(index=False) if hasattr(ev, "itertuples") else ev)
    if not ev:
        return []
    out = [_head("Incident timeline", "=")]
    rows: list[str] = []
    first_fast = None
    fast = 0
    pairs = 0
    flush_group: list = []
    ret_group: list = []
    held: list[str] = []  # rows that happened during a ret != 0 burst, shown after its line
    group_pairs = 0  # pairs blacklisted as of the burst's last failure
    # a failure that blacklists its pair logs the add first, then the failure (same instant);
    # an add no failure line tells (a write failed on a room already resolved) gets its own
    told_adds = Counter((e.time, f"{e.component}.r{e.rank}", e.peer) for e in ev
                        if e.event == "transfer_failed" and e.value
                        and e.detail != "blacklisted_session")

    def close_flush() -> None:
        if flush_group:
            rows.append(_flush_line(f"t={flush_group[0].time:9.3f}s ", flush_group))
            flush_group.clear()

    def close_ret() -> None:
        if ret_group:
            rows.append(_ret_line(ret_group, group_pairs, pairs_total))
            ret_group.clear()
        rows.extend(held)
        held.clear()

    def emit(row: str) -> None:
        (held if ret_group else rows).append(row)

    bursts = incident_report.Bursts()
    for e in ev:
        t = f"t={e.time:9.3f}s "
        if e.event in incident_report.EVENTS:
            close_flush()
            bursts.add(e, emit)
            continue
        bursts.close(emit)
        if e.event == "flush_executed":
            if flush_group and (flush_group[0].component != e.component
                                or flush_group[0].time != e.time):
                close_flush()
            flush_group.append(e)
            continue
        close_flush()
        is_ret = e.event == "transfer_failed" and e.detail != "blacklisted_session"
        if ret_group and not is_ret and e.event not in ("transfer_failed", "blacklist_add"):
            close_ret()
        if ret_group and is_ret and e.time - ret_group[-1].time > 1.0:
            close_ret()
        if e.event == "router_flush":
            emit(f"{t}router: POST /flush_cache from {e.peer}; {e.detail}")
        elif e.event == "router_flush_answer":
            emit(f"{t}router: answered {int(e.value)} to {e.peer} ({e.detail})")
        elif e.event == "flush_rejected":
            emit(f"{t}{e.component}{'' if e.rank < 0 else f'.r{e.rank}'}: flush refused "
                 f"({e.detail})")
        elif e.event == "flush_timed_out":
            emit(f"{t}{e.component}.r{e.rank}: flush timed out waiting for idle ({e.detail})")
        elif e.event == "blacklist_add":
            pairs += 1
            key = (e.time, e.component, e.peer)
            if told_adds[key]:
                told_adds[key] -= 1
            else:
                why = f" ({e.detail})" if e.detail else ""
                emit(f"{t}{e.component}: {e.peer} blacklisted{why} by a failed write on a "
                     f"room already resolved (no request failed with it); {pairs}/{pairs_total} "
                     f"pairs now")
        elif is_ret:
            if verbose:
                grew = f" -> pair blacklisted ({pairs}/{pairs_total})" if e.value else ""
                rows.append(f"{t}{e.component}.r{e.rank} -> {e.peer}: ret != 0 ({e.detail}), "
                            f"room {e.room}{grew}")
            else:
                ret_group.append(e)
                group_pairs = pairs
        elif e.event == "transfer_failed":
            fast += 1
            if first_fast is None:
                first_fast = e
                emit(f"{t}{e.component}.r{e.rank} -> {e.peer}: first fast-fail, "
                     f"'{DEAD_MSG}' (room {e.room})")
        elif e.event == "blacklist_remove":
            pairs -= 1
            emit(f"{t}{e.component}: {e.peer} off the blacklist ({e.detail}); "
                 f"{pairs}/{pairs_total} pairs left")
        elif e.event == "probe":
            emit(f"{t}{e.component}: probe of {e.peer} failed")
        elif e.event in ("fault_start", "fault_end", "heartbeat_lost"):
            who = f"{e.component}{'' if e.rank < 0 else f'.r{e.rank}'}"
            emit(f"{t}{who}: {e.detail}{f' ({e.peer})' if e.peer else ''}")
        elif e.event == "client_aborted":
            emit(f"{t}{e.component}: {e.detail}")
    close_flush()
    bursts.close(emit)
    close_ret()
    if not rows and not fast:  # nothing it tells (paths, breaker states, a stall): no heading
        return []
    if limit is not None and not verbose and len(rows) > limit:
        rows = rows[: limit - 1] + [f"... {len(rows) - limit + 1} more lines (--verbose shows "
                                    f"them; Result.events has every event)"]
    out += rows
    if fast:
        out.append(f"{fast} requests failed fast on blacklisted pairs "
                   f"(of {pairs_total} prefill-rank x decode-session pairs)")
    return out


_MISSING = object()
# what a null in the summary means, for the figures that have one
_NULL_WHY = {"incident.recovery_s": "not recovered within the run",
             "incident.goodput_recovery_s": "goodput not back within the run",
             "incident.final_ratio": "no goodput before the trigger, or no load after it"}


def _get(summary: dict, path: str, default: object = None) -> object:
    """The value at a dotted ``path`` of the summary, or ``default`` when there is none."""
    cur = summary
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return default
        cur = cur[part]
    return cur


def band(r: ReferenceFigure) -> str:
    """`` ±2`` or `` ±15%``: the reference figure's band as printed."""
    if r.tolerance is not None:
        return f" ±{r.tolerance:g}"
    if r.rel_tolerance is not None:
        return f" ±{100 * r.rel_tolerance:g}%"
    return ""


def unknowns_block(res: Outcome) -> list[str]:
    """The chosen inputs this run took at their nominal values (pdsim explore samples them)."""
    if not res.unknowns:
        return []
    fit = (" and shows which values fit the reported figures" if res.scenario.reference
           else " (this scenario lists no reported figures to fit)")
    return [_head("Declared unknowns (run at nominal)", "="), *unknowns_lines(res.unknowns),
            f"pdsim explore samples these ranges{fit}"]


AT_NOMINAL = ("Simulated at the declared unknowns' nominal values (above): chosen inputs, so "
              "a verdict says whether those values give the figure, not that it follows from "
              "what is known.")


def _wrap_label(label: str, width: int = 51) -> list[str]:
    """A reported figure's label in lines of at most ``width`` characters, none of them a
    stub of a word or two (``"  s)"``)."""
    best = textwrap.wrap(label, width, subsequent_indent="  ") or [""]
    for w in range(width, width - 16, -1):
        lines = textwrap.wrap(label, w, subsequent_indent="  ") or [""]
        if len(lines) == 1 or len(lines[-1]) >= 12:
            return lines
    return best


def reference_block(summary: dict, refs: list[ReferenceFigure], what_if: str = "",
                    scenario: str = "", at_nominal: bool = False,
                    declared: frozenset[str] = frozenset()) -> list[str]:
    """The scenario's reported figures beside the run's. For a what-if run (``what_if`` says
    why) they are context only: labelled so, with no within/outside verdict. ``at_nominal``:
    the run took declared unknowns at their chosen values, which the verdicts then rest on;
    a figure ``fitted_by`` unknowns still declared (``declared``: their paths) says "(fitted)"."""
    if not refs:
        return []
    if what_if:
        note = (f"This run is a what-if ({what_if}): the reported figures belong to the "
                f"scenario {scenario!r} as shipped, not to this run, so no verdicts.")
        out = [_head("Reported figures (context only)", "="),
               *textwrap.wrap(note, 92),
               f"{'figure':<52}{'this run':>10}{'reported':>10}"]
    else:
        out = [_head("Compared with the reported figures", "="),
               *(textwrap.wrap(AT_NOMINAL, 92) if at_nominal else []),
               f"{'figure':<52}{'simulated':>10}{'reported':>10}"]
    missing, fits, nulls = [], [], []
    for r in refs:
        sim = _get(summary, r.metric, _MISSING) if r.metric else None
        if isinstance(sim, bool):  # (a yes/no figure, e.g. incident.recovered: 1 or 0)
            sim = int(sim)
        if sim is _MISSING or sim is not None and not isinstance(sim, int | float):
            missing.append(r.metric)  # a misspelt path, a section or a name: not a figure
            sim = None
        elif sim is None and r.metric:  # a key of the run with no value (e.g. no recovery)
            nulls.append(r.metric)
        tol = band(r)
        ok = None if what_if else r.within(sim)
        verdict = "" if ok is None else ("within" if ok else "outside")
        if verdict and r.fitted_by and set(r.fitted_by) <= declared:
            verdict += " (fitted)"
            fits += [p for p in r.fitted_by if p not in fits]
        if r.metric in missing:
            verdict = "not a figure of the summary"
        shown = ("none" if r.metric in nulls else "" if sim is None
                 else f"{sim:,.3f}".rstrip("0").rstrip("."))
        # (a long label wraps, its first line beside the figures: cut at 51 characters,
        # "..., for context" lost the words that say the figure is not judged)
        label, *more = _wrap_label(r.label)
        out.append(f"{label:<52}{shown:>10}{r.reported:>10,g}{tol:<7} {verdict}".rstrip())
        out += more
    if fits:
        out += textwrap.wrap(f"(fitted): the nominal values of {', '.join(fits)} were chosen "
                             f"to give the figures marked so: their verdicts check that fit, "
                             f"they are not predictions.", 92)
    if nulls:
        out += textwrap.wrap("none: no value in this run's summary: " + "; ".join(
            f"{m} ({_NULL_WHY.get(m, 'null')})" for m in nulls) + ".", 92)
    if missing:
        out.append(f"not a figure of this run's summary: {', '.join(missing)} (pdsim run "
                   f"--json lists its keys; a client's are under clients.<name>.)")
    return out


def render(res: Outcome, verbose: bool = False) -> str:
    """The whole human report of a run (what ``pdsim run`` prints)."""
    s = res.summary
    lines: list[str] = []
    for c in res.scenario.clients:
        lines += bench_block(c.name, s["clients"][c.name], c)
    sc = res.scenario
    pairs = (sc.fleet.prefill.servers * sc.fleet.prefill.dp
             * sc.fleet.decode.servers * sc.fleet.decode.dp) if sc.fleet.mode == "pd" else None
    lines += fleet_block(s, pairs, sc.flush.dooms)
    if sc.fleet.mode != "colocated":  # (a colocated fleet has no PD paths)
        lines += _define(incident_report.release_line(sc))
    lines += incident_report.block(s, _line)
    lines += timeline(told(res.event_rows()), pairs, verbose=verbose)
    lines += unknowns_block(res)
    lines += reference_block(s, sc.reference, res.what_if, sc._reference_owner or sc.name,
                             bool(res.unknowns), frozenset(u.path for u in res.unknowns))
    lines.append("=" * W)
    lines += horizon_warning(res)
    lines += not_reached_warning(res)
    return "\n".join(lines)

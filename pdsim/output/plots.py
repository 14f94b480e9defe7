"""Figures for a postmortem, from a :class:`~pdsim.output.result.Result` (matplotlib).

    fig = plots.postmortem(res)                   # the incident at a glance, nine panels
    fig = plots.compare({"healthy": h, "drop": d, "forward": f})   # throughput side by side

Every panel is a small function drawing on an ``Axes`` you pass (or the current one), so a
notebook can put any of them in its own layout:

    fig, ax = plt.subplots(); plots.blacklist_timeline(res, ax)

One colour scheme throughout: outcomes blue (completed) and orange (failed); flushes dark red
when they freed pages of pending transfers (harmful: which ones a flush fails is the
scenario's ``flush.dooms``, in flight or not yet started) and grey when no transfer was
pending (harmless); clients in shades of purple; prefill teal, decode brown.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from pdsim.output import incident_plots
from pdsim.output.plots_base import (  # noqa: F401 (re-exported: plots.OK, plots.flush_table)
    CLIENTS,
    DECODE,
    FAIL,
    FLUSH,
    HARMLESS,
    OK,
    PREFILL,
    TIME,
    _fit_title,
    _legend,
    _title,
    client_color,
    flush_table,
    mark_flushes,
    spread_notes,
)
from pdsim.output.result import Result

# --- time series panels -----------------------------------------------------------------


def _tokens_over_time(req: pd.DataFrame, edges: np.ndarray, end: float) -> np.ndarray:
    """Generated tokens per bin: each request's first token at t_first_token, the rest
    spread evenly until t_done (or ``end`` if still running)."""
    got = req[req.generated > 0]
    a = got.t_first_token.to_numpy(float)
    b = got.t_done.fillna(end).to_numpy(float)
    n = got.generated.to_numpy(float)
    first = np.histogram(a, bins=edges)[0].astype(float)
    span = np.maximum(b - a, 1e-9)
    rate = np.where(n > 1, (n - 1) / span, 0.0)

    def ramp(starts: np.ndarray, r: np.ndarray) -> np.ndarray:  # sum r*max(0, e - start)
        order = np.argsort(starts)
        s, rr = starts[order], r[order]
        k = np.searchsorted(s, edges, side="right")
        cr = np.concatenate([[0.0], np.cumsum(rr)])
        crs = np.concatenate([[0.0], np.cumsum(rr * s)])
        return edges * cr[k] - crs[k]

    cum = ramp(a, rate) - ramp(b, rate)
    return first + np.diff(cum)


def throughput(res: Result, ax: Axes | None = None, smooth_s: int = 5,
               label: str | None = None, per_client: bool = False,
               annotate: bool = False) -> Axes:
    """Generated tokens/s over time (rolling mean), flushes marked; ``per_client`` adds a
    line per client: the fleet's tokens of each sample interval split between the clients in
    proportion to their decodes then (a request's tokens spread evenly over its decode), so
    the clients' lines add up to the fleet's (spread alone, a client's line overshot the
    fleet's where its decodes slowed down)."""
    ax = ax or plt.gca()
    ts = res.timeseries
    ax.plot(ts.time, ts.tokens_per_s.rolling(smooth_s, min_periods=1).mean(),
            color="black" if per_client else OK, lw=1.6,
            label=label or ("fleet" if per_client else "generated tok/s"))
    if per_client and len(ts) > 1:
        edges = ts.time.to_numpy(float)  # the samples' instants: the fleet line's intervals
        end = float(res.summary["simulated_s"])
        spread = _tokens_over_time(res.requests, edges, end)
        made = np.diff(ts.tokens_out.to_numpy(float))
        scale = np.divide(made, spread, out=np.zeros_like(spread), where=spread > 0)
        for c in res.scenario.clients:
            mine = res.requests[res.requests.client == c.name]
            tok = _tokens_over_time(mine, edges, end) * scale / np.diff(edges)
            tok = pd.Series(np.concatenate([[0.0], tok]))  # (the sample at 0: none yet)
            ax.plot(edges, tok.rolling(smooth_s, min_periods=1).mean(), lw=1.5,
                    color=client_color(res, c.name), label=c.name)
    handles = mark_flushes(res, ax, annotate=annotate)
    ax.set_ylabel("generated tokens / s")
    top = max((float(np.nanmax(np.asarray(ln.get_ydata(), float))) for ln in ax.get_lines()
               if len(ln.get_ydata())), default=1.0)
    ax._pdsim_data_top = top  # noqa: SLF001 (headroom: _make_headroom)
    ax.set_ylim(0, 1.3 * top if annotate else None)  # headroom keeps the notes off the data
    if annotate:
        _make_headroom(ax)
    _legend(ax, ax.get_legend_handles_labels()[0] + handles)
    return ax


def _make_headroom(ax: Axes) -> None:
    """Raise the axis' top so the data stays below the lowest flush note."""
    lowest = spread_notes(ax)
    top = getattr(ax, "_pdsim_data_top", None)
    if top:
        ax.set_ylim(0, top / max(0.3, min(1 / 1.3, lowest - 0.03)))


def failures(res: Result, ax: Axes | None = None) -> Axes:
    """Failed requests per second, with blacklisted pairs on a second axis."""
    ax = ax or plt.gca()
    ts = res.timeseries
    ax.bar(ts.time, ts.failed_per_s, width=float(res.scenario.timeseries_interval_s),
           color=FAIL, label="failed requests / s")
    ax.set_ylabel("failed requests / s")
    ax2 = ax.twinx()
    ax2.step(ts.time, ts.blacklisted_pairs, where="post", color=FLUSH, lw=1.6,
             label="blacklisted pairs")
    pairs = n_pairs(res)
    ax2.set_ylim(0, pairs + 0.5)
    ax2.set_ylabel(f"blacklisted pairs (of {pairs})")
    mark_flushes(res, ax)
    h1, _ = ax.get_legend_handles_labels()
    h2, _ = ax2.get_legend_handles_labels()
    _legend(ax, h1 + h2)
    return ax


def outcomes(res: Result, ax: Axes | None = None, bin_s: float = 2.0,
             client: str | None = None) -> Axes:
    """Requests finishing per time bin, completed vs failed (stacked), of one client or all."""
    ax = ax or plt.gca()
    req = res.measured[res.measured.status.isin(["completed", "failed", "timed_out"])]
    if client is not None:
        req = req[req.client == client]
    end = float(res.summary["simulated_s"])
    bins = np.arange(0, end + bin_s, bin_s)
    ax.hist([req[req.status == "completed"].t_done, req[req.status != "completed"].t_done],
            bins=bins, color=[OK, FAIL], stacked=True, label=["completed", "failed"])
    mark_flushes(res, ax)
    ax.set_xlim(0, end)
    if client is None:
        ax.set_ylabel(f"requests / {bin_s:g} s")
    else:
        ax.set_ylabel(f"{client}\nrequests / {bin_s:g} s", color=client_color(res, client))
    return ax


def kv_pool_note(res: Result) -> str:
    """How big each rank's KV pool is (tokens and GB) and the busiest rank's peak (the
    :func:`kv_use` curves are each role's ranks together, which peak lower)."""
    from pdsim.model import profiles

    kvb = profiles.model(res.scenario.fleet.model).kv_bytes_per_token
    size, peak = {}, {}
    for role, cfg in res.scenario.fleet.roles():
        pools = [v for k, v in res.kv_pools.items() if k.startswith(role)]
        if not pools:
            continue
        tokens = pools[0]["capacity"] * cfg.page_size
        size[role] = f"{tokens / 1e6:.3g}M tok ≈ {tokens * kvb / 1e9:.0f} GB"
        peak[role] = f"{role} {100 * max(v['peak'] / v['capacity'] for v in pools):.0f}%"
    sizes = (next(iter(size.values())) if len(set(size.values())) == 1
             else ", ".join(f"{r} {v}" for r, v in size.items()))
    return f"pool per rank {sizes}; busiest rank's peak: {', '.join(peak.values())}"


def kv_use(res: Result, ax: Axes | None = None) -> Axes:
    """KV pool in use, prefill and decode (share of each role's pools, all ranks, in %)."""
    ax = ax or plt.gca()
    ts = res.timeseries
    if res.scenario.fleet.mode == "colocated":  # one pool per rank for both phases
        ax.plot(ts.time, 100 * ts.decode_kv_used, color=DECODE, lw=1.4,
                label="KV (all ranks, prefill and decode)")
    else:
        ax.plot(ts.time, 100 * ts.prefill_kv_used, color=PREFILL, lw=1.4,
                label="prefill KV (all ranks)")
        ax.plot(ts.time, 100 * ts.decode_kv_used, color=DECODE, lw=1.4,
                label="decode KV (all ranks)")
    mark_flushes(res, ax)
    ax.set_ylabel("KV in use (% of pools)")
    ax.set_ylim(0, max(5.0, 105 * float(max(ts.prefill_kv_used.max(), ts.decode_kv_used.max(),
                                               0.01))))
    _legend(ax)
    return ax


QUEUES = {"prefill_queue": ("prefill waiting", PREFILL, "-"),
          "prefill_inflight": ("prefill in flight (KV sending)", PREFILL, ":"),
          "decode_transfer": ("decode awaiting KV", DECODE, ":"),
          "decode_running": ("decode running", DECODE, "-")}
# a colocated fleet's (its prefill_inflight gauge counts requests being chunked)
COLOCATED_QUEUES = {"prefill_queue": ("waiting (incl. retracted)", PREFILL, "-"),
                    "prefill_inflight": ("being chunked", PREFILL, ":"),
                    "decode_running": ("running", DECODE, "-")}


def queue_depth(res: Result, ax: Axes | None = None) -> Axes:
    """Requests waiting or running at each stage of the PD pipeline (of a colocated
    server's scheduler)."""
    ax = ax or plt.gca()
    ts = res.timeseries
    queues = COLOCATED_QUEUES if res.scenario.fleet.mode == "colocated" else QUEUES
    for col, (label, color, ls) in queues.items():
        if col in ts:
            ax.plot(ts.time, ts[col], color=color, ls=ls, lw=1.3, label=label)
    mark_flushes(res, ax)
    ax.set_ylabel("requests")
    ax.set_ylim(bottom=0)
    _legend(ax, ncol=2)
    return ax


# --- blacklist ---------------------------------------------------------------------------


def n_pairs(res: Result) -> int:
    f = res.scenario.fleet
    return f.prefill.servers * f.prefill.dp * f.decode.servers * f.decode.dp


def _short(session: str) -> str:
    return session.split(":")[0].replace("decode-", "d")


def blacklist_intervals(res: Result) -> pd.DataFrame:
    """One row per time a (prefill rank, decode session) pair spent on the blacklist: start,
    end (the run's end if never cleared), what put it there and what took it off, and how
    many requests failed fast on it meanwhile."""
    ev = res.events
    end = float(res.summary["simulated_s"])
    added = ev[ev.event == "blacklist_add"]
    removed = ev[ev.event == "blacklist_remove"]
    causes = ev[(ev.event == "transfer_failed") & (ev.value > 0)]
    fast = ev[(ev.event == "transfer_failed") & (ev.detail == "blacklisted_session")]
    rows = []
    for a in added.itertuples(index=False):
        off = removed[(removed.component == a.component) & (removed.peer == a.peer)
                      & (removed.time >= a.time)]
        t1 = off.time.iloc[0] if len(off) else end
        rank = a.component.rsplit(".r", 1)
        why = causes[(causes.component == rank[0]) & (causes["rank"] == int(rank[1]))
                     & (causes.peer == a.peer) & (causes.time == a.time)]
        hits = fast[(fast.component == rank[0]) & (fast["rank"] == int(rank[1]))
                    & (fast.peer == a.peer) & (fast.time >= a.time) & (fast.time <= t1)]
        rows.append({"prefill": a.component, "session": a.peer, "start": a.time, "end": t1,
                     "cause": why.detail.iloc[0] if len(why) else "",
                     "cleared_by": off.detail.iloc[0] if len(off) else "",
                     "fast_failed": len(hits)})
    return pd.DataFrame(rows, columns=["prefill", "session", "start", "end", "cause",
                                       "cleared_by", "fast_failed"])


def blacklist_timeline(res: Result, ax: Axes | None = None) -> Axes:
    """A bar per blacklisted pair from when it went on to when it came off (or the end),
    labelled with the requests that failed fast on it."""
    ax = ax or plt.gca()
    iv = blacklist_intervals(res)
    mark_flushes(res, ax)
    ax.set_xlabel(TIME)
    if iv.empty:
        ax.text(0.5, 0.5, "no pair was blacklisted", transform=ax.transAxes, ha="center",
                va="center", color=HARMLESS)
        ax.set_yticks([])
        return ax
    iv = iv.assign(pair=iv.prefill.str.replace("prefill-", "p") + " → " + iv.session.map(_short))
    order = list(dict.fromkeys(iv.sort_values("start").pair))
    y = {p: i for i, p in enumerate(order)}
    end = float(res.summary["simulated_s"])
    for r in iv.itertuples(index=False):
        color = FLUSH if r.cause == "flush_freed_pages" else "#5e3c99"
        ax.barh(y[r.pair], r.end - r.start, left=r.start, height=0.7, color=color, alpha=0.85)
        if r.fast_failed:
            ax.text(min(r.end, end), y[r.pair], f" {r.fast_failed} failed fast", va="center",
                    ha="right", fontsize=7, color="white")
    ax.set_yticks(range(len(order)), order, fontsize=7)
    ax.invert_yaxis()
    ax.set_ylabel(f"pairs ({len(order)} of {n_pairs(res)})")
    causes = sorted(set(iv.cause))
    _legend(ax, [Patch(color=FLUSH if c == "flush_freed_pages" else "#5e3c99",
                       label=f"blacklisted by ret != 0 ({c or 'other'})") for c in causes])
    return ax


def _no_kv_path(res: Result, ax: Axes, on_time_axis: bool = True) -> Axes:
    """A panel of the PD data path on a colocated fleet: said to be empty, and why."""
    if on_time_axis:
        mark_flushes(res, ax)
    else:
        ax.set_xticks([])
    ax.text(0.5, 0.5, "colocated fleet: no KV transfers, no pairs", transform=ax.transAxes,
            ha="center", va="center", color=HARMLESS)
    ax.set_yticks([])
    return ax


def pair_matrix(res: Result, ax: Axes | None = None) -> Axes:
    """Requests that did not complete (failed, timed out or unfinished at the run's end, as
    :func:`rank_load` counts them) per (prefill rank, decode session) pair, of those routed
    to it; blacklisted pairs outlined. (It counted status "failed" only: abort_storm's 6,946
    gateway timeouts showed 0/1931 on every pair.)"""
    ax = ax or plt.gca()
    req = res.measured
    req = req[req.p_rank >= 0]
    prefill = (req.p_server.astype(str) + ".r" + req.p_rank.astype(str)).rename("prefill")
    failed = req.status.ne("completed").groupby([prefill, req.session]).sum().unstack(
        fill_value=0)
    total = req.groupby([prefill, req.session]).size().unstack(fill_value=0)
    failed = failed.reindex(index=total.index, columns=total.columns, fill_value=0)
    share = (failed / total.replace(0, np.nan)).fillna(0)
    im = ax.imshow(share.to_numpy(), cmap="Oranges", vmin=0, vmax=1, aspect="auto")
    ax.set_xticks(range(share.shape[1]), [_short(s) for s in share.columns],
                  rotation=30, ha="right", fontsize=8)
    ax.set_yticks(range(share.shape[0]), [f"p{p}" for p in share.index], fontsize=8)
    ax.set_xlabel("decode session (outlined: blacklisted pair)")
    ax.set_ylabel("prefill rank")
    iv = blacklist_intervals(res)
    black = {(p.replace("prefill-", ""), s) for p, s in zip(iv.prefill, iv.session, strict=True)}
    for i, p in enumerate(share.index):
        for j, s in enumerate(share.columns):
            ax.text(j, i, f"{int(failed.iat[i, j])}/{int(total.iat[i, j])}", ha="center",
                    va="center", fontsize=7,
                    color="white" if share.iat[i, j] > 0.6 else "black")
            if (p, s) in black:
                ax.add_patch(Rectangle((j - 0.45, i - 0.45), 0.9, 0.9, fill=False,
                                       ec="black", lw=2.5))
    _title(ax, "not completed / routed requests per pair")
    # beside its matrix: a layout's colorbar goes to the margin of the matrix's column, which
    # the latency legends below widen (it floated at the figure's edge)
    ax.figure.colorbar(im, cax=ax.inset_axes([1.03, 0.0, 0.04, 1.0]), label="share not completed")
    return ax


# --- per rank, latency -------------------------------------------------------------------


def rank_load(res: Result, ax: Axes | None = None) -> Axes:
    """Requests each DP rank received, completed vs failed: where the load went."""
    ax = ax or plt.gca()
    req = res.measured
    bars = []
    roles = ((("s", "d_server", "d_rank", DECODE),) if res.scenario.fleet.mode == "colocated"
             else (("p", "p_server", "p_rank", PREFILL), ("d", "d_server", "d_rank", DECODE)))
    for role, srv, rk, color in roles:
        got = req[req[rk] >= 0]
        g = got.groupby([got[srv], got[rk]]).status
        for (s, r), st in g:
            bars.append((f"{role}{s}.r{r}", int((st == "completed").sum()),
                         int((st != "completed").sum()), color))
    x = np.arange(len(bars))
    ok = np.array([b[1] for b in bars])
    bad = np.array([b[2] for b in bars])
    ax.bar(x, ok, color=OK, label="completed")
    ax.bar(x, bad, bottom=ok, color=FAIL, label="not completed")
    ax.set_xticks(x, [b[0] for b in bars], fontsize=8)
    for tick, b in zip(ax.get_xticklabels(), bars, strict=True):
        tick.set_color(b[3])
    ax.set_ylabel("requests received")
    _title(ax, "load per DP rank")
    _legend(ax, ncol=2)
    return ax


def _log_ticks(ax: Axes) -> None:
    """Readable ticks on a log x axis: matplotlib labels the minor ticks of a span under about
    a decade and a half (2x10^-1, 3x10^-1, ...), which overlapped on abort_storm's TTFT CDF
    (0.13-6 s). Labels only at 1, 2, 5 x 10^k over at most two decades, at the decades
    otherwise, written as plain numbers (0.2, 5, 100)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    lo, hi = ax.get_xlim()
    decades = math.log10(hi / lo) if lo > 0 and hi > lo else 0
    subs = (1.0, 2.0, 5.0) if decades <= 2 else (1.0,)
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=subs))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())


def latency_cdf(res: Result, ax: Axes | None = None, metric: str = "ttft") -> Axes:
    """CDF per client of TTFT (requests that got a token) or E2E latency (completed solid,
    failed dashed), log time axis in seconds."""
    ax = ax or plt.gca()
    req = res.measured
    for c in res.scenario.clients:
        mine = req[req.client == c.name]
        color = client_color(res, c.name)
        if metric == "ttft":
            groups = {"": mine[mine.generated > 0].pipe(lambda d: d.t_first_token - d.t_arrival)}
        else:
            done = mine[mine.status == "completed"]
            bad = mine[mine.status.isin(["failed", "timed_out"])]
            groups = {"": done.t_done - done.t_arrival, " failed": bad.t_done - bad.t_arrival}
        for suffix, x in groups.items():
            x = np.sort(x.dropna().to_numpy())
            if not len(x):
                continue
            ls = "--" if suffix else "-"
            ax.step(x, np.arange(1, len(x) + 1) / len(x), where="post", color=color, ls=ls,
                    lw=1.4, label=f"{c.name}{suffix} (n={len(x)})")
    ax.set_xscale("log")
    _log_ticks(ax)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel(f"{'TTFT' if metric == 'ttft' else 'end-to-end latency'} (s, log)")
    ax.set_ylabel("share of requests")
    ax.grid(True, which="major", alpha=0.3)
    _title(ax, "TTFT" if metric == "ttft" else "E2E latency")
    if ax.get_lines():
        ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=7, frameon=False)
    return ax


# --- figures -----------------------------------------------------------------------------


def postmortem(res: Result, title: str | None = None) -> plt.Figure:
    """The incident at a glance. Left, on one time axis: throughput per client with the
    flushes annotated, outcomes per client, the blacklist per pair, KV use, queue depth.
    Right: failed/routed requests per pair (blacklisted outlined), load per DP rank, TTFT and
    E2E latency CDFs per client. A run with an incident block (faults, or decode slots held by
    dead rooms) gets a sixth row: the dead rooms' slots over time by cause, with the trigger
    shaded and the recovery marked (also on the throughput panel), and the incident's
    measures as text (pdsim.output.incident_plots)."""
    clients = [c.name for c in res.scenario.clients]
    # an incident run of a PD fleet (faults, dead rooms): one more row
    inc = res.summary.get("incident") if res.scenario.fleet.mode != "colocated" else None
    rows = [1.2, 0.45 + 0.45 * len(clients), 1.1, 0.8, 0.8] + ([1.0] if inc else [])
    fig = plt.figure(figsize=(16, 15 + 0.6 * len(clients) + (3 if inc else 0)),
                     constrained_layout=True)
    gs = fig.add_gridspec(len(rows), 2, width_ratios=[2.3, 1], height_ratios=rows)
    ax_tp = fig.add_subplot(gs[0, 0])
    sub = gs[1, 0].subgridspec(len(clients), 1, hspace=0.05)
    ax_out = [fig.add_subplot(sub[i, 0], sharex=ax_tp) for i in range(len(clients))]
    ax_bl = fig.add_subplot(gs[2, 0], sharex=ax_tp)
    ax_kv = fig.add_subplot(gs[3, 0], sharex=ax_tp)
    ax_q = fig.add_subplot(gs[4, 0], sharex=ax_tp)

    throughput(res, ax_tp, per_client=True, annotate=True)
    _title(ax_tp, "generated tokens / s")
    for ax, name in zip(ax_out, clients, strict=True):
        outcomes(res, ax, client=name)
        if ax is not ax_out[-1]:
            ax.tick_params(labelbottom=False)
    _title(ax_out[0], "requests finishing, by client")
    _legend(ax_out[0], [Patch(color=OK, label="completed"), Patch(color=FAIL, label="failed")])
    colocated = res.scenario.fleet.mode == "colocated"
    if colocated:
        _no_kv_path(res, ax_bl)
    else:
        blacklist_timeline(res, ax_bl)
    _title(ax_bl, "blacklisted (prefill rank → decode session) pairs")
    ax_bl.set_xlabel("")
    kv_use(res, ax_kv)
    _title(ax_kv, f"KV use ({kv_pool_note(res)})")
    queue_depth(res, ax_q)
    _title(ax_q, "queue depth")
    ax_q.set_xlabel(TIME)
    above = (ax_tp, *ax_out, ax_bl, ax_kv)
    if inc:  # decode slots held by dead rooms, the trigger and the recovery
        ax_dead = fig.add_subplot(gs[5, 0], sharex=ax_tp)
        incident_plots.dead_slots(res, ax_dead)
        _title(ax_dead, "decode slots held by dead rooms (rooms that cannot complete)")
        ax_dead.set_xlabel(TIME)
        ax_q.set_xlabel("")
        above = (*above, ax_q)
        marks = incident_plots.mark_trigger(res, ax_tp)
        if marks:
            _legend(ax_tp, ax_tp.get_legend_handles_labels()[0] + marks)
        incident_plots.incident_text(res, fig.add_subplot(gs[5, 1]))
    for ax in above:
        ax.tick_params(labelbottom=False)
    ax_tp.set_xlim(0, float(res.summary["simulated_s"]))

    if colocated:
        _no_kv_path(res, fig.add_subplot(gs[0:2, 1]), on_time_axis=False)
    else:
        pair_matrix(res, fig.add_subplot(gs[0:2, 1]))
    rank_load(res, fig.add_subplot(gs[2, 1]))
    latency_cdf(res, fig.add_subplot(gs[3, 1]), "ttft")
    latency_cdf(res, fig.add_subplot(gs[4, 1]), "e2e")

    fig.canvas.draw()  # (the layout settles the axes' sizes: the flush notes spread on it)
    _make_headroom(ax_tp)
    s = res.summary
    real = s["transfer_failures_by_reason"].get("flush_freed_pages", 0)
    if colocated and title is None:
        title = (f"{res.scenario.name}: colocated, {s['gpus']:,} GPUs: {s['failed']:,} failed "
                 f"requests, {s['retractions']:,} retractions")
    if title is None and inc and not real and not colocated:  # an incident on the paths of issue 26
        rec, back = inc["recovery_s"], inc.get("goodput_recovery_s")
        after = ("" if inc["trigger_from_s"] is None or inc["base_goodput_tok_s"] is None
                 else f", recovered {rec:g} s after the trigger" if rec is not None
                 else f", goodput back {back:g} s after the trigger but not recovered"
                 if back is not None else ", not recovered within the run")
        left = s.get("unfinished", 0)
        never = ("can never finish" if inc.get("stuck_requests") else "unanswered at the end")
        title = (f"{res.scenario.name}: {s['failed']:,} failed requests"
                 + (f", {left:,} {never}" if left else "")
                 + f", {inc['dead_rooms']:,} dead rooms ({inc['dead_rooms_max']:,} slots at "
                 f"once){after}")
    fig.suptitle(title or f"{res.scenario.name}: {real:,} flush-caused transfer failures → "
                 f"{s['failed']:,} failed requests, {s['blacklisted_pairs_max']:,} of "
                 f"{n_pairs(res):,} pairs blacklisted", fontsize=13, fontweight="bold")
    return fig


def compare(results: dict[str, Result], smooth_s: int = 5, ax: Axes | None = None
            ) -> plt.Figure:
    """Generated tokens/s of several runs on one axis, each run's flushes marked in its colour
    (solid: harmful, dotted: harmless); on ``ax`` when given (its figure is returned)."""
    if ax is None:
        fig, ax = plt.subplots(figsize=(10, 4), constrained_layout=True)
    fig = ax.figure
    for i, (name, res) in enumerate(results.items()):
        ts = res.timeseries
        color = plt.cm.tab10(i)
        ax.plot(ts.time, ts.tokens_per_s.rolling(smooth_s, min_periods=1).mean(), lw=1.6,
                label=name, color=color)
        for f in flush_table(res).itertuples(index=False):
            if not np.isnan(f.t_flush):
                ax.axvline(f.t_flush, color=color, lw=0.9, ls="-" if f.harmful else ":")
    ax.set_xlabel(TIME)
    ax.set_ylabel("generated tokens / s")
    ax.set_ylim(bottom=0)
    flushed = any(not np.isnan(f.t_flush) for res in results.values()
                  for f in flush_table(res).itertuples(index=False))
    _legend(ax, ax.get_legend_handles_labels()[0]
            + ([Line2D([], [], color="grey", ls="-", label="harmful flush"),
                Line2D([], [], color="grey", ls=":", label="harmless flush")] if flushed
               else []), ncol=5)
    return fig


def sweep_bars(df: pd.DataFrame, x: str, y: str = "empty_share", ax: Axes | None = None) -> Axes:
    """Median and range of a sweep metric per value of a varied key."""
    ax = ax or plt.gca()
    g = df.groupby(x)[y]
    med, lo, hi = g.median(), g.min(), g.max()
    ax.bar(range(len(med)), med, yerr=[med - lo, hi - med], color=OK, alpha=0.8, capsize=4)
    ax.set_xticks(range(len(med)), [str(v) for v in med.index])
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    return ax

"""Figures for capacity planning (matplotlib): one run, and runs side by side.

    fig = plots_capacity.capacity(res)                  # does the fleet keep up, and how fast
    fig = plots_capacity.comparison({"PD": a, "colocated": b})    # layouts side by side

``pdsim run S.yaml --plot FILE`` draws :func:`capacity` for a scenario without an incident
(:func:`pdsim.output.plots.postmortem` for one), ``pdsim compare A B --plot FILE``
:func:`comparison`. Each panel is a function drawing on an ``Axes`` you pass, as in
:mod:`pdsim.output.plots`, whose colours these share (runs compared take matplotlib's tab10).
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes

from pdsim.output import compare as cmp
from pdsim.output import plots
from pdsim.output.plots import FAIL, OK, TIME, _legend, _title
from pdsim.output.result import Result

WINDOW = "#fee08b"  # the steady window's shading


def _ms(x: float | None) -> str:
    if x is None or x != x:
        return "n/a"
    return f"{x / 1e3:.2f} s" if x >= 1e3 else f"{x:.0f} ms"


def request_latencies(res: Result) -> pd.DataFrame:
    """Per measured request answered with a 200: arrival, client, TTFT (s; a non-streamed
    response's is its whole latency, as bench_serving's) and TPOT (s; streamed responses of
    more than one token), as the summary's figures are computed."""
    m = res.measured
    m = m[(m.http_status == 200) & (m.generated > 0)]
    stream = m.stream.astype(bool)
    ttft = np.where(stream, m.t_first_token - m.t_arrival, m.t_done - m.t_arrival)
    many = stream & (m.generated > 1)
    tpot = np.where(many, (m.t_done - m.t_first_token) / (m.generated - 1).clip(lower=1),
                    np.nan)
    return pd.DataFrame({"t": m.t_arrival.to_numpy(float), "client": m.client.to_numpy(),
                         "ttft": np.asarray(ttft, float), "tpot": np.asarray(tpot, float),
                         "e2e": (m.t_done - m.t_arrival).to_numpy(float)})


def _shade_window(res: Result, ax: Axes) -> None:
    st = res.summary.get("steady") or {}
    if st.get("keeps_up") is not None:
        ax.axvspan(st["from_s"], st["to_s"], color=WINDOW, alpha=0.35, lw=0,
                   label="steady window", zorder=0)


def load(res: Result, ax: Axes | None = None) -> Axes:
    """Requests sent and answered per second (bins of ~1/60 of the run), the steady window
    shaded: the two curves part where the fleet stops keeping up."""
    ax = ax or plt.gca()
    m = res.measured
    end = float(res.summary["simulated_s"])
    width = next(w for w in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 3600, np.inf)
                 if end / w <= 50)
    width = float(width if np.isfinite(width) else end / 50)
    bins = np.arange(0, end + width, width)
    sent = np.histogram(m.t_arrival, bins)[0] / width
    done = np.histogram(m[m.status == "completed"].t_done.dropna(), bins)[0] / width
    bad = np.histogram(m[m.status.isin(["failed", "timed_out"])].t_done.dropna(), bins)[0]
    _shade_window(res, ax)
    ax.step(bins[:-1], sent, where="post", color="black", lw=1.3, label="sent")
    ax.step(bins[:-1], done, where="post", color=OK, lw=1.6, label="completed")
    if bad.any():
        ax.step(bins[:-1], bad / width, where="post", color=FAIL, lw=1.3, label="failed")
    ax.set_ylabel(f"requests / s ({width:g} s bins)")
    ax.set_xlabel(TIME)
    ax.set_xlim(0, end)
    ax.set_ylim(bottom=0)
    _legend(ax, ncol=4)
    return ax


def in_system(res: Result, ax: Axes | None = None) -> Axes:
    """Requests sent and not yet answered, over time, with the steady window's fitted trend
    (pdsim.engine.steady: the slope is how far the fleet falls behind, in req/s)."""
    ax = ax or plt.gca()
    m = res.measured
    end = float(res.summary["simulated_s"])
    ts = np.linspace(0, end, 600)
    ended = np.sort(m[m.status.isin(["completed", "failed", "timed_out"])].t_done.dropna())
    count = (np.searchsorted(np.sort(m.t_arrival), ts, side="right")
             - np.searchsorted(ended, ts, side="right"))
    _shade_window(res, ax)
    ax.plot(ts, count, color="black", lw=1.3, label="in the system")
    st = res.summary.get("steady") or {}
    if st.get("keeps_up") is not None:
        a, b, slope = st["from_s"], st["to_s"], st["queue_growth_req_s"]
        x = np.array([a, b])
        here = (ts >= a) & (ts <= b)
        mid = count[here].mean() if here.any() else st["in_system_mean"]
        y = mid + slope * (x - (a + b) / 2)
        ax.plot(x, y, color=plots.FLUSH if not st["keeps_up"] else OK, lw=2.2, ls="--",
                label=f"trend {slope:+.2f} req/s")
    ax.set_ylabel("requests sent, not answered")
    ax.set_xlabel(TIME)
    ax.set_xlim(0, end)
    ax.set_ylim(bottom=0)
    _legend(ax, ncol=3)
    return ax


def latency_over_time(res: Result, ax: Axes | None = None, metric: str = "ttft") -> Axes:
    """TTFT or TPOT of each request by when it arrived (dots), the median and P99 of the
    requests around it (lines: a rolling window of ~1/40 of them), and the scenario's SLO
    threshold (dashed): where the latency leaves the SLO."""
    ax = ax or plt.gca()
    lat = request_latencies(res)
    lat = lat[np.isfinite(lat[metric])]
    name = "TTFT" if metric == "ttft" else "TPOT"
    end = float(res.summary["simulated_s"])
    if lat.empty:
        ax.text(0.5, 0.5, f"no {name} to show\n({_why_none(res, metric)})",
                transform=ax.transAxes, ha="center", va="center", color=plots.HARMLESS)
        ax.set_yticks([])
        ax.set_xticks([])
        return ax
    # requests that all arrived at once (an eval's questions, an infinite rate) stand in one
    # column on the y axis when drawn by arrival: drawn by when they finished instead
    spread = float(lat.t.max() - lat.t.min())
    by_done = spread < 0.02 * end
    lat = lat.assign(t=lat.t + lat.e2e) if by_done else lat
    lat = lat.sort_values("t")
    y = lat[metric].to_numpy() * 1e3
    ax.scatter(lat.t, y, s=6 if len(lat) < 200 else 3, color=plots.HARMLESS,
               alpha=0.6 if len(lat) < 200 else 0.35, lw=0, label="a request")
    k = max(5, len(lat) // 40)
    roll = pd.Series(y).rolling(k, min_periods=max(1, k // 2), center=True)
    ax.plot(lat.t, roll.median(), color=OK, lw=1.8, label=f"median of {k}")
    ax.plot(lat.t, roll.quantile(0.99), color=plots.FLUSH, lw=1.4, label=f"P99 of {k}")
    limit = (res.summary.get("slo") or {}).get(f"{metric}_ms")
    if limit is not None:
        ax.axhline(limit, color="black", ls="--", lw=1.1, label=f"SLO {limit:g} ms")
    if np.nanmax(y) > 50 * max(np.nanmin(y[y > 0]) if (y > 0).any() else 1, 1e-3):
        ax.set_yscale("log")
    ax.set_ylabel(f"{name} (ms{', log' if ax.get_yscale() == 'log' else ''})")
    at_once = "at once" if spread == 0 else f"within {spread:.3g} s"
    ax.set_xlabel(f"finish time (s): all {len(lat):,} arrived {at_once}"
                  if by_done else "arrival time (s)")
    ax.set_xlim(0, end)
    _legend(ax, ncol=4)
    return ax


def _headline(res: Result) -> str:
    """The finding in a line: the verdict at the offered rate, P99 TTFT and TPOT, the SLO."""
    s = res.summary
    st = s.get("steady") or {}
    if st.get("keeps_up") is None:
        verdict = f"{s['request_throughput_req_s']:.2f} req/s served (no offered rate)"
    elif st["keeps_up"]:
        verdict = f"keeps up with {st['offered_req_s']:.1f} req/s"
    else:
        verdict = (f"falls behind {st['offered_req_s']:.1f} req/s (queue +"
                   f"{st['queue_growth_req_s']:.1f} req/s)")
    line = f"{verdict}; P99 TTFT {_ms(s['p99_ttft_ms'])}, P99 TPOT {_ms(s['p99_tpot_ms'])}"
    slo = s.get("slo")
    if slo and slo.get("attainment") is not None:
        line += (f"; {100 * slo['attainment']:.0f}% meet the SLO "
                 f"(target {100 * slo['attainment_target']:g}%")
        slots = [c.max_concurrency for c in res.scenario.clients if c.kind == "bench"
                 and c.max_concurrency and c.max_concurrency < (c.num_prompts or math.inf)]
        # (measured from the send, as bench_serving: a prompt's wait for a slot is not in it)
        line += f", from the send: {min(slots)} slots)" if slots else ")"
    return line


def _why_none(res: Result, metric: str) -> str:
    """Why a run has no TTFT or TPOT to draw: no response came back, or none was streamed
    (a TPOT needs the per-token times of a stream of more than one token)."""
    m = res.measured
    ok = m[(m.http_status == 200) & (m.generated > 0)]
    if ok.empty:
        return "no request was answered with a token"
    if metric == "tpot":
        quiet = sorted({c.name for c in res.scenario.clients
                        if not getattr(c, "stream", False)})
        if quiet and not ok.stream.astype(bool).any():
            return (f"{', '.join(quiet)}: responses not streamed (an eval's, or stream: "
                    f"false), so no per-token times")
        return "no streamed response of more than one token"
    return "no response to time"


def capacity(res: Result, title: str | None = None) -> plt.Figure:
    """Does the fleet keep up, and how fast does it answer. Top: requests sent vs completed per
    second, and requests in the system with the steady window's trend. Middle: TTFT and TPOT
    of each request by arrival, rolling median and P99, the SLO. Bottom: where requests wait
    (queue depth per PD stage) and KV use: the stage that saturates first."""
    fig, axes = plt.subplots(3, 2, figsize=(15, 12), constrained_layout=True)
    load(res, axes[0][0])
    _title(axes[0][0], "requests sent vs completed")
    in_system(res, axes[0][1])
    judged = (res.summary.get("steady") or {}).get("keeps_up") is not None
    _title(axes[0][1], "requests in the system" + (" (flat: keeps up)" if judged else ""))
    for ax, metric, what in ((axes[1][0], "ttft", "time to first token"),
                             (axes[1][1], "tpot", "time per output token")):
        latency_over_time(res, ax, metric)
        by = "by finish" if ax.get_xlabel().startswith("finish") else "by arrival"
        _title(ax, f"{what}, {by}")
    plots.queue_depth(res, axes[2][0])
    _title(axes[2][0], "where requests wait (queue depth)")
    axes[2][0].set_xlabel(TIME)
    plots.kv_use(res, axes[2][1])
    pd = res.summary.get("fleet_mode", "pd") == "pd"
    _title(axes[2][1], "KV cache in use" + (" (a prefill pool fills with its prefix cache, "
                                            "evicted as needed)" if pd else ""))
    axes[2][1].set_xlabel(TIME)
    fig.suptitle(title or f"{res.scenario.name}: {_headline(res)}", fontsize=13,
                 fontweight="bold")
    return fig


# --- runs side by side ---------------------------------------------------------------------


def _colors(results: dict[str, Result]) -> dict[str, tuple]:
    return {name: plt.cm.tab10(i % 10) for i, name in enumerate(results)}


def latency_cdfs(results: dict[str, Result], ax: Axes | None = None,
                 metric: str = "ttft") -> Axes:
    """CDF of TTFT or TPOT per run (log time axis, ms), each run's SLO threshold dashed in its
    colour, P99 marked."""
    ax = ax or plt.gca()
    colors = _colors(results)
    name = "TTFT" if metric == "ttft" else "TPOT"
    spans = []
    for run, res in results.items():
        x = np.sort(request_latencies(res)[metric].dropna().to_numpy() * 1e3)
        x = x[x > 0]
        if not len(x):
            continue
        spans += [x[0], x[-1]]
        ax.step(x, np.arange(1, len(x) + 1) / len(x), where="post", color=colors[run], lw=1.6,
                label=f"{run}: P99 {_ms(res.summary.get(f'p99_{metric}_ms'))}")
    limits = {run: (res.summary.get("slo") or {}).get(f"{metric}_ms")
              for run, res in results.items()}
    if len(set(limits.values())) == 1:  # one SLO for all: one black line
        limits = {"": next(iter(limits.values()))}
    for run, limit in limits.items():
        if limit is not None:
            ax.axvline(limit, color=colors.get(run, "black"), ls="--", lw=1.1,
                       label=f"SLO {limit:g} ms" + (f" ({run})" if run else ""))
    ax.axhline(0.99, color=plots.HARMLESS, lw=0.8, ls=":")
    log = bool(spans) and max(spans) > 4 * min(spans)  # (a narrow range reads better linear)
    if log:
        ax.set_xscale("log")
        _log_ticks(ax)
    ax.set_ylim(0, 1.02)
    slo = "; dashed: SLO" if any(ln.get_linestyle() == "--" for ln in ax.get_lines()) else ""
    ax.set_xlabel(f"{name} (ms{', log scale' if log else ''}{slo})")
    ax.set_ylabel("share of requests")
    ax.grid(True, which="major", alpha=0.3)
    _legend(ax, ncol=1)
    return ax


def _log_ticks(ax: Axes) -> None:
    """Label a log axis at 1-2-5 steps in plain numbers (matplotlib's minor labels such as
    "3x10^2" ran into each other on a range within a decade or two)."""
    from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator

    lo, hi = ax.get_xlim()
    steps = (1, 2, 5) if hi > 10 * lo else (1, 1.5, 2, 3, 4, 5, 7)  # (within a decade: more)
    ticks = [m * 10.0 ** e for e in range(int(np.floor(np.log10(max(lo, 1e-9)))),
                                           int(np.ceil(np.log10(max(hi, 1e-9)))) + 1)
             for m in steps if lo <= m * 10.0 ** e <= hi]
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1
                                                   else f"{v:g}"))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_minor_formatter(NullFormatter())


def per_gpu(results: dict[str, Result], ax: Axes | None = None) -> Axes:
    """Goodput per GPU of each run (under its SLO, or completed requests without one): the
    bar a layout is chosen by; each bar says the GPUs and the total behind it."""
    ax = ax or plt.gca()
    colors = _colors(results)
    names = list(results)
    vals = []
    for i, (run, res) in enumerate(results.items()):
        g, what = cmp.goodput(res)
        n = cmp.gpus_used(res)
        v = g / n if g is not None and n else 0.0
        vals.append(v)
        ax.bar(i, v, color=colors[run], width=0.6)
        ax.text(i, v, f"{v:.3f}\n{'n/a' if g is None else f'{g:.2f}'} req/s on {n} GPUs",
                ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylim(0, 1.35 * max(vals + [1e-9]))
    ax.set_ylabel(f"{_good_word(results)} per GPU (req/s)")
    return ax


def _good_word(results: dict[str, Result]) -> str:
    """"goodput" when every run has an SLO, else "completed requests" (what is counted)."""
    return ("goodput" if all(r.summary.get("slo") for r in results.values())
            else "completed requests")


def _finding(results: dict[str, Result]) -> str:
    """The comparison's headline: goodput per GPU of the best against each other, and P99s."""
    per = {}
    for run, res in results.items():
        g = cmp.goodput(res)[0]
        n = cmp.gpus_used(res)
        per[run] = g / n if g is not None and n else 0.0
    best = max(per, key=per.get)
    others = [r for r in per if r != best]
    parts = []
    for o in others:
        ratio = per[best] / per[o] if per[o] else float("inf")
        parts.append(f"{best} serves {ratio:.2f}x {o}'s {_good_word(results)} per GPU "
                     f"({per[best]:.3f} vs {per[o]:.3f} req/s/GPU)")
    p99 = " vs ".join(_ms(r.summary.get("p99_ttft_ms")) for r in results.values())
    return "; ".join(parts) + f"; P99 TTFT {p99}"


def comparison(results: dict[str, Result], title: str | None = None) -> plt.Figure:
    """Runs side by side (a layout against another, e.g. PD and colocated on the same GPUs):
    generated tokens/s over time, the TTFT and TPOT CDFs with each run's SLO, and goodput per
    GPU. The title says which serves more per GPU, by how much, and the P99 TTFTs."""
    fig, axes = plt.subplots(2, 2, figsize=(14, 9), constrained_layout=True)
    plots.compare(results, ax=axes[0][0])
    _title(axes[0][0], "generated tokens / s")
    per_gpu(results, axes[0][1])
    _title(axes[0][1], f"{_good_word(results)} per GPU"
           + ("" if _good_word(results) == "goodput" else " (no slo: set, so no goodput)"))
    latency_cdfs(results, axes[1][0], "ttft")
    _title(axes[1][0], "time to first token")
    latency_cdfs(results, axes[1][1], "tpot")
    _title(axes[1][1], "time per output token")
    fig.suptitle(title or _finding(results), fontsize=12, fontweight="bold")
    return fig

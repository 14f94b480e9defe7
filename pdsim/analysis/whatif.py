"""What-if of blacklist policy: policies (with parameter grids) x faults x seeds -> decisions.

    w = pdsim.whatif("scenarios/whatif_base.yaml",
                     policies=["permanent", "never", {"policy": "ttl", "ttl_s": [10, 60]}],
                     faults=["flush_race", "decode_crash"], seeds=range(1, 4))
    w.table        # one row per (policy, fault): medians and 10-90% intervals over seeds
    w.ranking      # policies by worst-case regret across the faults
    w.heatmap(); w.timelines("decode_crash"); w.vs_param("ttl_s")
    w.write("out/"); WhatIf.read("out/")   # the same table and plots, without re-running

Every (policy, fault, seed) is a run of the base scenario with ``blacklist`` and ``faults``
replaced; every seed also runs without faults (``healthy``), which goodput lost and recovery
are measured against. A blacklist policy cannot change a fault-free run in which no transfer
fails, so then one healthy run per seed serves all policies; when the base fails transfers
without faults (its clients or operators flush KV under load: ``drop_timeout.yaml``), each
policy gets healthy runs of its own (``healthy.policy``), and each is measured against its own.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pydantic import ValidationError

from pdsim.analysis.whatif_table import WhatIf, _short
from pdsim.config import loader, units
from pdsim.config import scenario as scenario_mod
from pdsim.config.registry import BLACKLIST_POLICIES, FAULTS
from pdsim.util.backends import MAX_RUNS, progress_bar
from pdsim.util.backends import run_all as run_tasks
from pdsim.util.safeio import echo

RECOVERY_WINDOW_S = 10.0
RECOVERED_AT = 0.9  # "back within 10% of healthy"

# --- specification ---------------------------------------------------------------------------


def expand_policies(policies: Iterable[str | dict]) -> list[tuple[str, dict]]:
    """Policy specs -> (label, blacklist section); list values in a dict are a grid."""
    out: list[tuple[str, dict]] = []
    for spec in policies:
        spec = {"policy": spec} if isinstance(spec, str) else dict(spec)
        name = spec.get("policy", BLACKLIST_POLICIES.default)
        grid = {k: v for k, v in spec.items() if isinstance(v, list | tuple)}
        if math.prod(len(v) for v in grid.values()) > MAX_RUNS:
            raise ValueError(f"policy {name}: a grid of "
                             f"{math.prod(len(v) for v in grid.values()):,} points; at most "
                             f"{MAX_RUNS:,} runs")
        fixed = {k: v for k, v in spec.items() if k not in grid}
        for values in itertools.product(*grid.values()):
            section = {**fixed, **dict(zip(grid, values, strict=True)), "policy": name}
            shown = [f"{k}={_short(v)}" for k, v in section.items() if k != "policy"]
            label = name + (f"({', '.join(shown)})" if shown else "")
            try:
                BLACKLIST_POLICIES.validate(section)  # fail before any run starts
            except ValidationError as err:
                raise ValueError(f"policy {label}: "
                                 f"{scenario_mod.section_error(err, 'blacklist')}") from None
            out.append((label, section))
    labels = [lbl for lbl, _ in out]
    if len(set(labels)) != len(labels):
        dup = sorted({x for x in labels if labels.count(x) > 1})
        raise ValueError(f"policies repeat: {', '.join(dup)}")
    return out


def _fault_set_name(key: object) -> str:
    """A fault-set name of your own: it labels rows beside the runs without faults
    (``healthy``) and names a --plots file (timeline_<name>.png), so neither may it be."""
    name = str(key)
    if name == "healthy":
        raise ValueError("fault-set name 'healthy' is taken by the runs without faults; "
                         "give another name")
    if (not name.strip() or not name.isprintable() or "/" in name or "\\" in name
            or len(name) > units.MAX_NAME_CHARS):
        raise ValueError(f"fault-set name {echo(key)}: give printable text of at most "
                         f"{units.MAX_NAME_CHARS} characters, without / or \\")
    return name


def expand_faults(faults: Iterable[str] | dict[str, list] | None) -> dict[str, list[dict]]:
    """Fault specs -> name: list of fault items. Names are library presets; a dict maps your
    names to fault lists. None: the whole library."""
    if faults is None:
        return {name: [{"preset": name}] for name in FAULTS.presets}
    if isinstance(faults, dict):
        out = {_fault_set_name(k): list(v) if isinstance(v, list) else [v]
               for k, v in faults.items()}
        if len(out) < len(faults):  # (1 and '1' from a YAML file)
            raise ValueError("fault-set names repeat once read as text; give distinct names")
        return out
    out = {}
    for name in faults:
        if name not in FAULTS.presets:
            raise ValueError(f"unknown fault {name!r}; the library has: "
                             f"{', '.join(FAULTS.presets)} (or pass a faults file)")
        out[name] = [{"preset": name}]
    return out


# --- one run and its measurements ------------------------------------------------------------


def goodput_series(requests: pd.DataFrame, t_end: float, dt: float = 1.0) -> np.ndarray:
    """Output tokens/s of requests that completed, per ``dt`` bin from 0 to ``t_end``.

    A completed request's tokens are spread evenly over [first token, done].
    """
    done = requests[(requests.status == "completed") & (requests.kind != "warmup")]
    edges = np.arange(0.0, t_end + dt, dt)
    if not len(done):
        return np.zeros(len(edges) - 1)
    a = done.t_first_token.to_numpy(float)
    b = done.t_done.to_numpy(float)
    g = done.generated.to_numpy(float)
    span = np.maximum(b - a, 1e-9)
    cum = np.zeros(len(edges))
    for lo in range(0, len(a), 2048):  # bounded memory: chunks of requests
        sl = slice(lo, lo + 2048)
        frac = np.clip((edges[None, :] - a[sl, None]) / span[sl, None], 0.0, 1.0)
        cum += (g[sl, None] * frac).sum(axis=0)
    return np.diff(cum) / dt


def _unhealthy_intervals(events: pd.DataFrame, t_end: float) -> tuple[dict, dict]:
    """Path-down intervals from the ``path`` events: per prefill server and per session."""
    by_p: dict[int, list] = {}
    by_s: dict[str, list] = {}
    open_p: dict[int, float] = {}
    open_s: dict[str, float] = {}
    for e in events[events.event == "path"].itertuples():
        if e.component:
            key = int(str(e.component).rsplit("-", 1)[1])
            opened, target = open_p, by_p
        else:
            key = e.peer
            opened, target = open_s, by_s
        if e.value != 0 and key not in opened:
            opened[key] = e.time
        elif e.value == 0 and key in opened:
            target.setdefault(key, []).append((opened.pop(key), e.time))
    for opened, target in ((open_p, by_p), (open_s, by_s)):
        for key, t0 in opened.items():
            target.setdefault(key, []).append((t0, t_end))
    return by_p, by_s


def _healthy_stretches(a: float, b: float, down: list[tuple[float, float]]) -> list[float]:
    """Lengths of the parts of [a, b] outside the ``down`` intervals."""
    cuts = sorted((max(a, x), min(b, y)) for x, y in down if y > a and x < b)
    out, t = [], a
    for x, y in cuts:
        if x > t:
            out.append(x - t)
        t = max(t, y)
    if b > t:
        out.append(b - t)
    return out


def blacklist_harm(events: pd.DataFrame, t_end: float) -> tuple[float, float]:
    """(longest stretch a healthy pair stayed blacklisted, healthy pair-seconds blacklisted)."""
    by_p, by_s = _unhealthy_intervals(events, t_end)
    bl = events[events.event.isin(["blacklist_add", "blacklist_remove"])]
    longest, total = 0.0, 0.0
    opened: dict[tuple[str, str], float] = {}
    spans = []
    for e in bl.itertuples():
        key = (e.component, e.peer)
        if e.event == "blacklist_add":
            opened.setdefault(key, e.time)
        elif key in opened:
            spans.append((key, opened.pop(key), e.time))
    spans += [(key, t0, t_end) for key, t0 in opened.items()]
    for (owner, session), a, b in spans:
        p = int(str(owner).split(".")[0].rsplit("-", 1)[1])
        parts = _healthy_stretches(a, b, by_p.get(p, []) + by_s.get(session, []))
        if parts:
            longest = max(longest, max(parts))
            total += sum(parts)
    return longest, total


def _window(items: list, horizon: float) -> tuple[float, float]:
    """(start, end) of a fault set, from the faults' own windows."""
    if not items:
        return math.nan, math.nan
    ws = [f.window(horizon) for f in items]
    return min(w[0] for w in ws), max(w[1] for w in ws)


def measure(res: Any) -> dict:
    """The scalar metrics of one run, and its goodput per second."""
    s = res.summary
    req = res.requests
    measured = req[req.kind != "warmup"]
    t_end = float(s["simulated_s"])
    start, end = _window(res.scenario.faults, t_end)
    series = goodput_series(req, math.ceil(t_end))
    first = float(measured.t_arrival.min()) if len(measured) else 0.0
    last = float(measured.t_done.max()) if measured.t_done.notna().any() else first
    done = measured[measured.status == "completed"]
    good = float(done.generated.sum())
    ttft = (done.t_first_token - done.t_arrival).to_numpy(float)
    longest, pair_s = blacklist_harm(res.events, t_end)
    ev = res.events
    counted = int(((ev.event == "transfer_failed") & (ev.detail != "blacklisted_session")).sum()
                  + (ev.event == "blacklist_add").sum()) if len(ev) else 0
    by_reason = s.get("failed_by_reason", {})
    return {
        "goodput_tok_s": good / (last - first) if last > first else 0.0,
        "failed": int(measured.status.isin(["failed", "timed_out"]).sum()),
        "wasted_prefill_tokens": int(s["wasted_prefill_tokens"]),
        "fast_fails": int(by_reason.get("blacklisted_session", 0)),
        "dead_peer_writes": int(s.get("dead_peer_writes", 0)),
        "dead_peer_write_s": float(s.get("dead_peer_write_s", 0.0)),
        "ttft_p99_s": round(float(np.percentile(ttft, 99)), 6) if len(ttft) else math.nan,
        "max_healthy_blacklisted_s": round(longest, 6),
        "healthy_blacklisted_pair_s": round(pair_s, 6),
        "ret_failures": counted,
        "fault_start_s": start,
        "fault_end_s": end,
        "simulated_s": t_end,
        "series": series.round(6).tolist(),
    }


def _one(task: tuple[dict, list[str], dict, Sequence[str]]) -> dict:
    from pdsim.config.registry import load_plugin
    from pdsim.output.result import run

    data, sets, labels, plugins = task
    for p in plugins:  # workers started by spawn need the user's registrations too
        load_plugin(p)
    res = run(data, sets=sets)
    return {**labels, **measure(res)}


def recover_s(faulty: Sequence[float], healthy: Sequence[float], end: float,
              window: float = RECOVERY_WINDOW_S, at: float = RECOVERED_AT) -> float:
    """Seconds from ``end`` until a ``window``-s mean of goodput is back to ``at`` x healthy's
    mean over the same window; inf if it never is; nan if the fault has no end in the run."""
    f = np.asarray(faulty, float)
    h = np.asarray(healthy, float)
    n = min(len(f), len(h))
    w = int(round(window))
    if not math.isfinite(end) or end >= n - w:
        return math.nan
    cf = np.concatenate([[0.0], np.cumsum(f[:n])])
    ch = np.concatenate([[0.0], np.cumsum(h[:n])])
    for t in range(int(math.ceil(end)), n - w + 1):
        hw = ch[t + w] - ch[t]
        if hw <= 0:
            return math.inf  # the load ended before the fault's effects did
        if cf[t + w] - cf[t] >= at * hw:
            return float(t - end)
    return math.inf


# --- execution -------------------------------------------------------------------------------


def whatif(base: str | Path | dict, policies: Iterable[str | dict] = ("permanent", "never"),
           faults: Iterable[str] | dict[str, list] | None = None, seeds: Iterable[int] = (1,),
           workers: int | None = None, progress: bool = True, sets: Sequence[str] = (),
           plugins: Sequence[str] = (), command: str = "", *, backend: str = "process",
           address: str | None = None, allow_outside_paths: bool = False) -> WhatIf:
    """Run every policy under every fault for every seed (plus a healthy run per seed).

    ``backend``/``address``: where the runs go (pdsim/util/backends.py: "process" or "ray");
    ``plugins``: modules or files registering policies or faults, imported in every worker.
    """
    data = loader.as_data(base, allow_outside_paths)  # keeps where its paths resolve
    if sets:
        data = loader.apply_overrides(data, list(sets))
    fleet = data.get("fleet") if isinstance(data, dict) else None
    if isinstance(fleet, dict) and fleet.get("mode") == "colocated":  # (its faults are PD's)
        raise ValueError("whatif weighs PD blacklist policies under PD faults: it needs a PD "
                         "fleet (fleet.mode: pd); this scenario's fleet is colocated (pdsim "
                         "sweep or compare weigh a colocated fleet)")
    if len(seeds := seeds if isinstance(seeds, range) else list(seeds)) > MAX_RUNS:
        raise ValueError(f"{len(seeds):,} seeds; at most {MAX_RUNS:,} runs")
    pols = expand_policies(policies)
    fset = expand_faults(faults)
    if not pols or not fset or not seeds:
        raise ValueError("give at least one policy, one fault and one seed")
    if (runs := len(seeds) * (1 + len(pols) * (1 + len(fset)))) > MAX_RUNS:  # (at most)
        raise ValueError(f"policies x faults x seeds: {runs:,} runs; at most {MAX_RUNS:,}")
    shared = [({"faults": [], "seed": seed}, {"fault": "healthy", "seed": seed})
              for seed in seeds]
    own = [({"blacklist": section, "faults": [], "seed": seed},
            {"policy": label, "fault": "healthy", "seed": seed})
           for label, section in pols for seed in seeds]
    faulty = [({"blacklist": section, "faults": items, "seed": seed},
               {"policy": label, "fault": fault, "seed": seed})
              for fault, items in fset.items() for label, section in pols for seed in seeds]

    def tasks(jobs: list[tuple[dict, dict]]) -> list[tuple]:
        out = []
        for over, labels in jobs:
            d = loader.ScenarioData({**data, **over})
            d.context = getattr(data, "context", None)
            loader.load(d)  # validate every run before any process starts
            out.append((d, [], labels, list(plugins)))
        return out

    shared_t, faulty_t = tasks(shared), tasks(faulty)  # (``own`` only if needed, below: each
    # is a faulty run's scenario without its faults, so it loads if that one did)
    # the healthy runs first: if any fails a transfer, a policy could change it (one bar,
    # its total grown by the policies' own healthy runs when they are needed)
    bar = progress_bar(len(shared_t) + len(faulty_t), enabled=progress)
    try:
        rows = run_tasks(_one, shared_t, workers, backend=backend, address=address, bar=bar)
        per_policy = any(r["ret_failures"] for r in rows)
        own_t = tasks(own) if per_policy else []
        if per_policy:
            rows = []
            bar.total += len(own_t)
            bar.refresh()
        rows += run_tasks(_one, own_t + faulty_t, workers,
                          backend=backend, address=address, bar=bar)
    finally:
        bar.close()
    healthy = pd.DataFrame([r for r in rows if r["fault"] == "healthy"])
    runs = pd.DataFrame([r for r in rows if r["fault"] != "healthy"])
    h_by = {(r.policy if per_policy else "", r.seed): r for r in healthy.itertuples()}
    lost, rec = [], []
    for r in runs.itertuples():
        h = h_by[(r.policy if per_policy else "", r.seed)]
        lost.append(100.0 * (h.goodput_tok_s - r.goodput_tok_s) / h.goodput_tok_s
                    if h.goodput_tok_s else math.nan)
        rec.append(recover_s(r.series, h.series, r.fault_end_s))
    runs.insert(runs.columns.get_loc("goodput_tok_s") + 1, "goodput_lost_pct", lost)
    runs.insert(runs.columns.get_loc("dead_peer_write_s") + 1, "recover_s", rec)
    return WhatIf(runs, healthy, pols, fset, str(base) if not isinstance(base, dict) else "",
                  command)

"""What-if of blacklist policy: policies (with parameter grids) x faults x seeds -> decisions.

    w = pdsim.whatif("scenarios/whatif_base.yaml",
                     policies=["permanent", "never", {"policy": "ttl", "ttl_s": [10, 60]}],
                     faults=["flush_race", "decode_crash"], seeds=range(1, 6))
    w.table        # one row per (policy, fault): means over seeds with 95% bootstrap intervals
    w.ranking      # policies by worst-case regret across the faults, ties as ties
    w.heatmap(); w.timelines("decode_crash"); w.vs_param("ttl_s")
    w.write("out/"); WhatIf.read("out/")   # the same table and plots, without re-running

Every (policy, fault, seed) is a run of the base scenario with ``blacklist`` and ``faults``
replaced; every seed also runs without faults (``healthy``), which goodput lost and regret are
measured against. A policy is a blacklist policy with its parameters, plus any other settings
given as dotted scenario keys (``{"policy": "never", "transfer.waiting_timeout_s": [10, 30]}``,
on the CLI ``never:transfer.waiting_timeout_s=10,30``): so a shorter waiting timeout, or a
prefill abort that notifies its decode (``disaggregation.prefill_abort_notifies_decode``), is
weighed across every fault like a blacklist TTL.

Every figure is over a fixed window of simulated time named from the fault's own timing
(:mod:`pdsim.analysis.windows`): runs last until the end of the last fault's lasting-harm window
plus a drain, and the base's open-loop load is extended to last that long, so a figure is never
divided by how long a run happened to take. A blacklist policy cannot change a fault-free run
in which no transfer fails, so then one healthy run per seed serves all policies; when a policy
sets other keys, or when the base fails transfers without faults (its clients or operators
flush KV under load: ``drop_timeout.yaml``), each policy gets healthy runs of its own.

``pdsim.analysis.study`` runs this at several loads chosen from the fleet's measured capacity.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pydantic import ValidationError

from pdsim.analysis import windows as win
from pdsim.analysis.whatif_table import WhatIf, _short
from pdsim.config import loader, units
from pdsim.config import scenario as scenario_mod
from pdsim.config.registry import BLACKLIST_POLICIES, FAULTS
from pdsim.util.backends import MAX_RUNS, progress_bar
from pdsim.util.backends import run_all as run_tasks
from pdsim.util.safeio import echo

RECOVERY_WINDOW_S = 10.0
RECOVERED_AT = 0.9  # "back within 10% of healthy"
LOAD_MARGIN = 1.25  # open-loop prompts: rate x horizon x this, so Poisson gaps never end it early

# --- specification ---------------------------------------------------------------------------


def _label(name: str, section: dict, model: Any) -> str:
    """``ttl(ttl_s=3)``: the parameters given, then the policy's ``label_keys`` at their
    defaults (a row names the parameter values it is about)."""
    given = [k for k in section if k != "policy"]
    keys = given + [k for k in getattr(model, "label_keys", ()) if k not in given]
    shown = [f"{k}={_short(section[k] if k in section else getattr(model, k))}" for k in keys]
    return name + (f"({', '.join(shown)})" if shown else "")


# sections the what-if itself sets or compares arms by: a policy's dotted keys may not touch
# them (an arm with its own load, faults or SLO is no longer paired with the others by seed)
WHATIF_SETS = ("faults", "clients", "slo", "seed", "horizon_s", "blacklist", "operator_flushes")


def split_policy(section: dict) -> tuple[dict, list[str]]:
    """A policy -> (its blacklist section, its other settings as ``--set`` overrides): a dotted
    key (``transfer.waiting_timeout_s``) is a scenario setting, any other a blacklist key."""
    black = {k: v for k, v in section.items() if "." not in k}
    sets = [f"{k}={json.dumps(v, default=str)}" for k, v in section.items() if "." in k]
    return black, sets


def sets_anything(pols: Sequence[tuple[str, dict]]) -> bool:
    """Whether a policy changes more than the blacklist (then a fault-free run may differ by
    policy, and each policy gets healthy runs of its own)."""
    return any(split_policy(section)[1] for _lbl, section in pols)


def expand_policies(policies: Iterable[str | dict]) -> list[tuple[str, dict]]:
    """Policy specs -> (label, section); list values in a dict are a grid. A section's dotted
    keys are scenario settings the policy makes beside its blacklist (:func:`split_policy`)."""
    out: list[tuple[str, dict]] = []
    for spec in policies:
        spec = {"policy": spec} if isinstance(spec, str) else dict(spec)
        name = spec.get("policy", BLACKLIST_POLICIES.default)
        for k in spec:
            if "." in str(k) and str(k).split(".")[0] in WHATIF_SETS:
                raise ValueError(f"policy {name}: {echo(k)}: the what-if sets "
                                 f"{str(k).split('.')[0]} itself (every arm meets the same "
                                 f"load, faults, seeds and SLO); a policy may set other keys")
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
            try:  # the blacklist part fails here, before any run; a setting, when prepared
                model = BLACKLIST_POLICIES.validate(split_policy(section)[0])
            except ValidationError as err:
                raise ValueError(f"policy {label}: "
                                 f"{scenario_mod.section_error(err, 'blacklist')}") from None
            out.append((_label(name, section, model), section))
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


def _library_item(name: str) -> dict:
    """A library entry as a fault item: with its declared unknowns, if it has any (they
    resolve to their nominal values like any scenario's), else by preset name."""
    from pdsim.engine.faults import DECLARED

    return dict(DECLARED[name]) if name in DECLARED else {"preset": name}


def expand_faults(faults: Iterable[str] | dict[str, list] | None) -> dict[str, list[dict]]:
    """Fault specs -> name: list of fault items. Names are library presets (any registered
    one); a dict maps your names to fault lists. None: the whole library."""
    if faults is None:
        return {name: [_library_item(name)] for name in FAULTS.presets}
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
        out[name] = [_library_item(name)]
    return out


def unknown_variants(name: str, unknowns: Sequence[Any]) -> dict[str, dict[str, Any]]:
    """The other values of a fault set's declared unknowns, one at a time: variant name ->
    {path: value}. A choice: every other choice; a range: its ends and middle (geometric for
    a loguniform), the nominal left out."""
    out: dict[str, dict[str, Any]] = {}
    for u in unknowns:
        if not u.path.startswith("faults."):
            continue
        if u.dist == "choice":
            values = [c for c in u.choices if c != u.nominal]
        else:
            mid = math.sqrt(u.low * u.high) if u.dist == "loguniform" else (u.low + u.high) / 2
            values = [v for v in (u.low, float(f"{mid:.3g}"), u.high)
                      if not math.isclose(v, u.nominal, rel_tol=1e-9)]
            if u.integer:
                values = sorted({int(round(v)) for v in values} - {u.nominal})
        key = u.path.split(".", 2)[-1]
        for v in values:
            out[f"{name}[{key}={_short(v)}]"] = {u.path: v}
    return out


# --- one run and its measurements ------------------------------------------------------------


def goodput_series(requests: pd.DataFrame, t_end: float, dt: float = 1.0) -> np.ndarray:
    """Output tokens/s of requests that completed, per ``dt`` bin from 0 to ``t_end``.

    A completed request's tokens are spread evenly over [first token, done] (for plots and
    :func:`recover_s`; the decision metrics are the windows')."""
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


def measure(res: Any, windows: dict[str, tuple[float, float] | None] | None = None) -> dict:
    """The metrics of one run: over the named ``windows`` (:func:`pdsim.analysis.windows.
    measure`; default: the whole run as ``span``) and its goodput per second."""
    t_end = float(res.summary["simulated_s"])
    return measure_all(res, {"": windows or {"span": (0.0, t_end)}})[0]


def measure_all(res: Any, by_fault: dict[str, dict]) -> list[dict]:
    """:func:`measure` through each fault set's windows (one row each; what does not depend
    on a window is computed once)."""
    from pdsim.engine.summary import columns

    s = res.summary
    req = res.requests
    measured = req[req.kind != "warmup"]
    t_end = float(s["simulated_s"])
    start, end = win.fault_span(res.scenario.faults)
    series = goodput_series(req, math.ceil(t_end)).round(6).tolist()
    longest, pair_s = blacklist_harm(res.events, t_end)
    ev = res.events
    counted = int(((ev.event == "transfer_failed") & (ev.detail != "blacklisted_session")).sum()
                  + (ev.event == "blacklist_add").sum()) if len(ev) else 0
    by_reason = s.get("failed_by_reason", {})
    col = columns(measured)
    last = float(measured.t_arrival.max()) if len(measured) else 0.0
    common = {
        "wasted_prefill_tokens": int(s["wasted_prefill_tokens"]),
        "fast_fails": int(by_reason.get("blacklisted_session", 0)),
        "dead_peer_writes": int(s.get("dead_peer_writes", 0)),
        "dead_peer_write_s": float(s.get("dead_peer_write_s", 0.0)),
        "max_healthy_blacklisted_s": round(longest, 6),
        "healthy_blacklisted_pair_s": round(pair_s, 6),
        "ret_failures": counted,
        "fault_start_s": start,
        "fault_end_s": end,
        "load_until_s": round(last, 3),
        "simulated_s": t_end,
    }
    rows = []
    for fault, windows in by_fault.items():
        a, b = windows["span"]
        arrived = measured[(measured.t_arrival >= a) & (measured.t_arrival < b)]
        done = arrived[arrived.status == "completed"]
        ttft = (done.t_first_token - done.t_arrival).to_numpy(float)
        out = win.measure(col, res.scenario.slo, windows)
        out.update({
            "fault": fault,
            "goodput_tok_s": out["span_goodput_tok_s"],
            "failed": int(arrived.status.isin(["failed", "timed_out"]).sum()),
            "ttft_p99_s": round(float(np.percentile(ttft, 99)), 6) if len(ttft) else math.nan,
            **common, "series": series})
        rows.append(out)
    return rows


def _one(task: tuple) -> list[dict]:
    """One run, measured through each fault set's windows it is compared under (a faulty run:
    its own; a healthy run: every fault set's)."""
    from pdsim.config.registry import load_plugin
    from pdsim.output.result import run

    data, labels, plugins, by_fault = task
    for p in plugins:  # workers started by spawn need the user's registrations too
        load_plugin(p)
    return [{**labels, **row} for row in measure_all(run(data), by_fault)]


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


# --- a condition: one base, its tasks, and its table ----------------------------------------


@dataclass
class Condition:
    """One load of a what-if: its scenario data, its plan (windows), and its runs' tasks."""

    label: str
    data: Any
    plan: win.Plan
    shared: list  # healthy tasks, one per seed (all policies)
    own: list  # healthy tasks per policy and seed (used only if a shared one fails transfers)
    faulty: list
    variants: dict[str, str]  # variant fault set -> the fault set it varies
    fset: dict[str, list]  # every fault set run (variants included)
    extended: list[str]  # what the what-if changed in the base (said in the table's header)


def with_policy(data: Any, over: dict) -> Any:
    """The base with top-level sections replaced, then a policy's settings applied (a blacklist
    ``section`` in ``over`` may carry dotted keys: :func:`split_policy`)."""
    over, sets = dict(over), []
    if isinstance(over.get("blacklist"), dict):
        over["blacklist"], sets = split_policy(over["blacklist"])
    d = loader.ScenarioData({**data, **over})
    d.context = getattr(data, "context", None)
    if not sets:
        return d
    try:
        return loader.apply_overrides(d, sets)
    except loader.ScenarioError as err:  # (a policy's setting: not a --set the user wrote)
        raise loader.ScenarioError(str(err).replace("--set ", "--policy setting ", 1)) \
            from None


def pd_only(data: Any) -> None:
    """The what-if weighs PD blacklist policies under PD faults: a colocated base is refused
    in one line (it said "invalid value at 'faults.0.kind'", a key the user never wrote)."""
    fleet = data.get("fleet") if isinstance(data, dict) else None
    if isinstance(fleet, dict) and fleet.get("mode") == "colocated":  # (its faults are PD's)
        raise ValueError("whatif weighs PD blacklist policies under PD faults: it needs a PD "
                         "fleet (fleet.mode: pd); this scenario's fleet is colocated (pdsim "
                         "sweep or compare weigh a colocated fleet)")


def prepare(base: str | Path | dict, pols: list[tuple[str, dict]], fset: dict[str, list],
            seeds: Sequence[int], sets: Sequence[str] = (), plugins: Sequence[str] = (),
            *, timeline: win.Timeline | None = None, label: str = "",
            across_unknowns: bool = False, allow_outside_paths: bool = False,
            t_end: float | None = None) -> Condition:
    """Validate every run of one condition and plan its windows (nothing runs yet)."""
    tl = timeline or win.Timeline()
    data = loader.as_data(base, allow_outside_paths)  # keeps where its paths resolve
    if sets:
        data = loader.apply_overrides(data, list(sets))
    pd_only(data)
    first_policy = pols[0][1]  # (its settings applied by with_policy)
    spans = {}
    fset = dict(fset)
    variants: dict[str, str] = {}
    for fault, items in list(fset.items()):
        sc = loader.load(with_policy(data, {"blacklist": first_policy, "faults": items}))
        spans[fault] = win.fault_span(sc.faults)
        if across_unknowns:
            from pdsim.config import unknowns

            resolved = unknowns.resolve({"faults": items})[0]
            for vname, values in unknown_variants(fault, sc.unknowns).items():
                vitems = unknowns.substitute(resolved, values)["faults"]
                vsc = loader.load(with_policy(data, {"blacklist": first_policy,
                                               "faults": vitems}))
                fset[vname] = vitems
                spans[vname] = win.fault_span(vsc.faults)
                variants[vname] = fault
    plan = win.plan(spans, tl, t_end)
    sc0 = loader.load(with_policy(data, {"faults": []}))
    over, extended = [f"horizon_s={plan.horizon:g}"], []
    for i, c in enumerate(sc0.clients):
        rate = getattr(c, "request_rate", None)
        if c.kind != "bench" or getattr(c.dataset, "kind", "") != "random":
            continue
        if isinstance(rate, int | float) and math.isfinite(rate):
            need = math.ceil(rate * max(plan.horizon - c.start_s, 0.0) * LOAD_MARGIN) + 20
            if (c.num_prompts or 0) < need:
                over.append(f"clients.{i}.num_prompts={need}")
                extended.append(f"{c.name}: {need:,} prompts at {rate:g} req/s")
    data = loader.apply_overrides(data, over)
    shared = [({"faults": [], "seed": seed}, {"seed": seed, "_h": True}) for seed in seeds]
    own = [({"blacklist": section, "faults": [], "seed": seed},
            {"policy": lbl, "seed": seed, "_h": True})
           for lbl, section in pols for seed in seeds]
    faulty = [({"blacklist": section, "faults": items, "seed": seed},
               {"policy": lbl, "fault": fault, "seed": seed})
              for fault, items in fset.items() for lbl, section in pols for seed in seeds]
    cond = Condition(label, data, plan, [], own, [], variants, fset,
                     [f"horizon {plan.horizon:g} s", *extended])
    cond.shared = [] if sets_anything(pols) else _tasks(cond, shared, plugins, check=True)
    cond.faulty = _tasks(cond, faulty, plugins, check=True)
    if sets_anything(pols):  # (each arm's own healthy runs: validated now, run for sure)
        _tasks(cond, own, plugins, check=True)
    return cond


def _tasks(cond: Condition, jobs: list[tuple[dict, dict]], plugins: Sequence[str],
           check: bool = False) -> list[tuple]:
    """Run tasks: the scenario data, labels, plugins, and the windows to measure through (a
    healthy run: every fault set's; a faulty run: its own)."""
    every = cond.plan.windows
    out = []
    for over, labels in jobs:
        d = with_policy(cond.data, over)
        if check:
            loader.load(d)  # validate every run before any process starts
        ws = every if labels.get("_h") else {labels["fault"]: every[labels["fault"]]}
        out.append((d, {**labels, "condition": cond.label}, list(plugins), ws))
    return out


def run_conditions(conds: list[Condition], pols: list[tuple[str, dict]],
                   workers: int | None = None,
                   progress: bool = True, plugins: Sequence[str] = (), command: str = "", *,
                   backend: str = "process", address: str | None = None, base: str = ""
                   ) -> list[WhatIf]:
    """Run every condition's tasks on one pool; one :class:`WhatIf` per condition."""
    shared = [t for c in conds for t in c.shared]
    faulty = [t for c in conds for t in c.faulty]
    bar = progress_bar(len(shared) + len(faulty), enabled=progress)
    try:
        rows = run_tasks(_one, shared, workers, backend=backend, address=address, bar=bar)
        per_policy = {c.label: sets_anything(pols) or any(
            r["ret_failures"] for rs, t in zip(rows, shared, strict=True)
            for r in rs if t[1]["condition"] == c.label) for c in conds}
        own = [t for c in conds if per_policy[c.label] for t in _tasks(c, c.own, plugins)]
        if own:
            keep = {c.label for c in conds if not per_policy[c.label]}
            rows = [rs for rs, t in zip(rows, shared, strict=True)
                    if t[1]["condition"] in keep]
            bar.total += len(own)
            bar.refresh()
        rows += run_tasks(_one, own + faulty, workers, backend=backend, address=address,
                          bar=bar)
    finally:
        bar.close()
    flat = [r for rs in rows for r in rs]
    out = []
    for c in conds:
        mine = [r for r in flat if r["condition"] == c.label]
        out.append(assemble(c, [r for r in mine if not r.get("_h")],
                            [r for r in mine if r.get("_h")], pols, per_policy[c.label], base,
                            command))
    return out


def assemble(cond: Condition, runs_rows: list[dict], healthy_rows: list[dict],
             pols: list[tuple[str, dict]], per_policy: bool, base: str,
             command: str) -> WhatIf:
    """A condition's rows as its :class:`WhatIf` (goodput lost and recovery against healthy)."""
    runs = pd.DataFrame(runs_rows).drop(columns=["condition"], errors="ignore")
    healthy = pd.DataFrame(healthy_rows).drop(columns=["_h", "condition"], errors="ignore")
    if not per_policy and "policy" in healthy:
        healthy = healthy.drop(columns="policy")
    key = ["policy", "fault", "seed"] if per_policy else ["fault", "seed"]
    h_by = {tuple(k): r for k, r in zip(healthy[key].itertuples(index=False, name=None),
                                        healthy.to_dict("records"), strict=True)}
    lost, lasting, rec = [], [], []
    for r in runs.to_dict("records"):
        h = h_by[tuple(r[k] for k in key)]
        lost.append(_pct_lost(h["goodput_tok_s"], r["goodput_tok_s"]))
        lasting.append(_pct_lost(h["lasting_goodput_tok_s"], r["lasting_goodput_tok_s"]))
        rec.append(recover_s(r["series"], h["series"], r["fault_end_s"]))
    runs.insert(runs.columns.get_loc("goodput_tok_s") + 1, "goodput_lost_pct", lost)
    runs["lasting_lost_pct"] = lasting
    runs["recover_s"] = rec
    return WhatIf(runs, healthy, pols, cond.fset, base, command, plan=cond.plan,
                  condition=cond.label, variants=cond.variants, notes=cond.extended)


def _pct_lost(healthy: float, faulty: float) -> float:
    if not (isinstance(healthy, float | int) and math.isfinite(healthy) and healthy > 0):
        return math.nan
    return 100.0 * (healthy - faulty) / healthy


# --- execution -------------------------------------------------------------------------------


def whatif(base: str | Path | dict, policies: Iterable[str | dict] = ("permanent", "never"),
           faults: Iterable[str] | dict[str, list] | None = None, seeds: Iterable[int] = (1,),
           workers: int | None = None, progress: bool = True, sets: Sequence[str] = (),
           plugins: Sequence[str] = (), command: str = "", *, backend: str = "process",
           address: str | None = None, allow_outside_paths: bool = False,
           timeline: win.Timeline | None = None, across_unknowns: bool = False,
           condition: str = "") -> WhatIf:
    """Run every policy under every fault for every seed (plus a healthy run per seed).

    ``timeline``: the chosen window lengths (:class:`pdsim.analysis.windows.Timeline`);
    ``across_unknowns``: also run each fault set at the other values of its declared unknowns
    (``decode_crash[restart_session=reused]``); ``backend``/``address``: where the runs go
    (pdsim/util/backends.py: "process" or "ray"); ``plugins``: modules or files registering
    policies or faults, imported in every worker.
    """
    if len(seeds := seeds if isinstance(seeds, range) else list(seeds)) > MAX_RUNS:
        raise ValueError(f"{len(seeds):,} seeds; at most {MAX_RUNS:,} runs")
    pols = expand_policies(policies)
    fset = expand_faults(faults)
    if not pols or not fset or not seeds:
        raise ValueError("give at least one policy, one fault and one seed")
    if (runs := len(seeds) * (1 + len(pols) * (1 + len(fset)))) > MAX_RUNS:  # (at most)
        raise ValueError(f"policies x faults x seeds: {runs:,} runs; at most {MAX_RUNS:,}")
    cond = prepare(base, pols, fset, seeds, sets, plugins, timeline=timeline, label=condition,
                   across_unknowns=across_unknowns, allow_outside_paths=allow_outside_paths)
    return run_conditions([cond], pols, workers, progress, plugins, command,
                          backend=backend, address=address,
                          base=str(base) if not isinstance(base, dict) else "")[0]

"""Regenerate reports/blacklist_policy.md, its figures and the answer paragraph of
docs/guides/blacklist-whatif.md from the committed CSVs (no simulation but the two incident
replays drawn in one figure).

    python reports/make_blacklist_policy.py                  # seconds, from the CSVs
    nice -n 10 python reports/blacklist_policy_runs.py headline   # re-run the answer's runs
    nice -n 10 python reports/make_blacklist_policy.py --run incident eval

The answer's runs are exactly ``pdsim whatif scenarios/whatif_base.yaml`` (the CLI's defaults,
pdsim.analysis.study); reports/blacklist_policy_runs.py runs them one load at a time
(resumable) into reports/blacklist_policy/headline/, and the declared unknowns' other values
into reports/blacklist_policy/unknowns/. Every number in the report is read from those files.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

ROOT = Path(__file__).resolve().parents[1]
OUT = Path(__file__).resolve().parent
DATA = OUT / "blacklist_policy"
GUIDE = ROOT / "docs" / "guides" / "blacklist-whatif.md"  # its answer paragraph is ours
BASE = "scenarios/whatif_base.yaml"
CLI = f"pdsim whatif {BASE}"
INCIDENT_TTLS = [5, 10, 30, 60, 120, 300]
INCIDENT_SEEDS = 5
EVAL_TTLS = [30, 60, 120, 300]
EVAL_CMDS = [
    f"pdsim sweep scenarios/eval_after_flush.yaml --vary blacklist.policy=permanent "
    f"--seeds {INCIDENT_SEEDS}",
    "pdsim sweep scenarios/eval_after_flush.yaml --vary blacklist.policy=ttl "
    f"--vary blacklist.ttl_s={','.join(map(str, EVAL_TTLS))} --seeds {INCIDENT_SEEDS}",
]
INCIDENT_CMDS = [
    f"pdsim sweep scenarios/drop_timeout.yaml --vary blacklist.policy=permanent,probe "
    f"--seeds {INCIDENT_SEEDS}",
    "pdsim sweep scenarios/drop_timeout.yaml --set 'blacklist={policy: never}' "
    f"--vary blacklist.policy=never --seeds {INCIDENT_SEEDS}",
    "pdsim sweep scenarios/drop_timeout.yaml --vary blacklist.policy=ttl "
    f"--vary blacklist.ttl_s={','.join(map(str, INCIDENT_TTLS))} --seeds {INCIDENT_SEEDS}",
]


# --- running the incident sweeps (the what-if matrices: blacklist_policy_runs.py) ----------------


def run_incident(workers: int | None) -> None:
    import pandas as pd

    from pdsim.analysis.sweep import sweep
    from pdsim.config import loader

    scenario = ROOT / "scenarios/drop_timeout.yaml"
    seeds = range(1, INCIDENT_SEEDS + 1)
    a = sweep(scenario, {"blacklist.policy": ["permanent", "probe"]}, seeds, workers)
    never = loader.apply_overrides(loader.as_data(scenario), ["blacklist={policy: never}"])
    b = sweep(never, {"blacklist.policy": ["never"]}, seeds, workers)
    c = sweep(scenario, {"blacklist.policy": ["ttl"], "blacklist.ttl_s": INCIDENT_TTLS}, seeds,
              workers)
    df = pd.concat([a, b, c], ignore_index=True)
    DATA.mkdir(parents=True, exist_ok=True)
    df.to_csv(DATA / "incident.csv", index=False, float_format="%.6g")


def run_eval(workers: int | None) -> None:
    import pandas as pd

    from pdsim.analysis.sweep import sweep

    seeds = range(1, INCIDENT_SEEDS + 1)
    ev = ROOT / "scenarios/eval_after_flush.yaml"
    a = sweep(ev, {"blacklist.policy": ["permanent"]}, seeds, workers)
    b = sweep(ev, {"blacklist.policy": ["ttl"], "blacklist.ttl_s": EVAL_TTLS}, seeds, workers)
    pd.concat([a, b], ignore_index=True).to_csv(DATA / "eval.csv", index=False,
                                                 float_format="%.6g")


# --- small helpers -------------------------------------------------------------------------------


def _md(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(map(str, r)) + " |" for r in rows]
    return "\n".join(out)


def _num(v: float, digits: int = 0) -> str:
    if v != v:
        return "n/a"
    if v in (math.inf, -math.inf):
        return "never"
    if round(v, digits) == 0:
        v = 0.0
    return f"{v:,.{digits}f}"


def _iv(row, m: str, digits: int = 1) -> str:
    from pdsim.analysis.verdict import fmt_iv

    return fmt_iv(row[m], row.get(f"{m}_lo", math.nan), row.get(f"{m}_hi", math.nan), digits)


def _code(p: str) -> str:
    return f"`{p}`"


def pivot(w, metric: str, digits: int = 1, faults=None) -> str:
    """Policies (rows) x faults (columns): mean [95% interval] of ``metric``."""
    t = w.table.set_index(["policy", "fault"])
    faults = faults or w.nominal_faults
    rows = [[_code(p)] + [_iv(t.loc[(p, f)], metric, digits) if (p, f) in t.index else "n/a"
                          for f in faults] for p in w.labels]
    return _md(["policy"] + [_code(f) for f in faults], rows)


def best_cell(detail) -> str:
    from pdsim.analysis.verdict import fmt_iv

    return "; ".join(f"{_code(p)} {fmt_iv(a, lo, hi)}" for p, a, lo, hi in detail)


# --- the answer ----------------------------------------------------------------------------------


def headline_table(r) -> str:
    rows = []
    for (cond, metric), g in r.groupby(["condition", "metric"], sort=False):
        cells = {x["mix"]: best_cell(x.detail) for _, x in g.iterrows()}
        rows.append([f"{cond}", metric, cells.get("worst", "n/a"), cells.get("mean", "n/a")])
    return _md(["load", "metric", "worst fault: best or tied-best, regret [95%]",
                "mean over faults: best or tied-best, regret [95%]"], rows)


def listing(s) -> list[str]:
    """The policies that keep a pair out after a failure (what `pdsim whatif` calls 'if the
    blacklist stays'): one strike, probes, 0.5.23's and the TTLs."""
    return s.keeps_out()


def counts(r, labels) -> dict:
    return {p: int(sum(p in b for b in r.best)) for p in labels}


def answer_text(s, r_all, r_list) -> str:
    labels = next(iter(s.conditions.values())).labels
    n = len(r_all)
    always, missing = s.dominant()
    lines = []
    if always:
        lines.append(f"**{', '.join(_code(p) for p in always)} "
                     f"{'is' if len(always) == 1 else 'are'} best or tied-best under every "
                     f"load, metric and fault mix run** ({n} rows).")
    else:
        lines.append("**No single policy is best or tied-best under every load, metric and "
                     "fault mix run**: " + "; ".join(f"{_code(p)} is not at {w}"
                                                     for p, w in missing.items()) + ".")
    c = counts(r_all, labels)
    lines.append("Rows in which each policy is best or tied-best: " + ", ".join(
        f"{_code(p)} {k} of {n}" for p, k in sorted(c.items(), key=lambda kv: -kv[1])) + ".")
    ttl_rows = r_all[[any(p.startswith("ttl(") for p in b) for b in r_all.best]]
    lines.append(f"A TTL ties the best in {len(ttl_rows)} of {n} rows"
                 + (f" ({', '.join(sorted(set(ttl_rows.metric)))} only)" if len(ttl_rows)
                    else "") + f"; one strike forever (`permanent`) in {c.get('permanent', 0)}.")
    ll = listing(s)
    c2 = counts(r_list, ll)
    best2 = [p for p in ll if c2[p] == len(r_list)]
    lines.append("**If the blacklist stays** (among " + ", ".join(_code(p) for p in ll) +
                 ", regret against the best of them): " + (
                     f"{', '.join(_code(p) for p in best2)} best or tied-best in every row"
                     if best2 else "no one of them is best or tied-best in every row") +
                 "; rows in which each is: " + ", ".join(
                     f"{_code(p)} {k} of {len(r_list)}"
                     for p, k in sorted(c2.items(), key=lambda kv: -kv[1])) + ".")
    closed = s.conditions.get("closed")
    if closed is not None:
        h = closed.healthy.drop_duplicates("seed")
        lines.append(f"Under the closed loop the fleet runs past its SLO capacity: healthy, "
                     f"{h.span_attainment.mean():.0%} of requests meet the SLO (mean of seeds), "
                     f"so a fault that holds clients' slots lowers queueing and can raise SLO "
                     f"goodput (negative goodput lost below); `throughput` (completed tokens, "
                     f"SLO or not) is the measure of work done there.")
    return "\n".join(f"- {x}" for x in lines)


# --- sections ------------------------------------------------------------------------------------


def stale_warning() -> list[str]:
    """A line above the answer naming the loads whose committed runs a check found moved."""
    import json

    path = DATA / "provenance.json"
    checks = json.loads(path.read_text()).get("checks", {}) if path.is_file() else {}
    moved = {k: c for k, c in checks.items() if c["result"].startswith("moved")}
    if not moved:
        part = sorted(k for k, c in checks.items() if c.get("seeds"))
        return [f"*Runs:* every chunk is either regenerated whole under the model named or "
                f"re-checked under it; {len(part)} of {len(checks)} chunks were re-checked at "
                f"seed {', '.join(sorted({str(x) for k in part for x in checks[k]['seeds']}))} "
                f"only (identical), their other seeds made under an earlier model (*Which runs, "
                f"under which model*).", ""] if part else []
    return ["**Stale:** " + "; ".join(
        f"`{k}`'s committed runs moved under the model of `{c['model']}` (a check of seed"
        f"{'s' if len(c.get('seeds', [])) > 1 else ''} "
        f"{', '.join(map(str, c.get('seeds', []))) or 'all'})" for k, c in moved.items()) +
        ": the rows below for those loads are from the runs committed before it (see *Which "
        "runs, under which model*), until regenerated.", ""]


def provenance_section(s, u) -> list[str]:
    """Which committed runs were made, and re-checked, under which model
    (blacklist_policy/provenance.json, written by blacklist_policy_runs.py check)."""
    import json

    path = DATA / "provenance.json"
    if not path.is_file():
        return []
    doc = json.loads(path.read_text())
    made, checks = doc.get("made", {}), doc.get("checks", {})
    chunks = [f"headline/{c}" for c in s.conditions]
    chunks += [f"unknowns/{c}" for c in (u.conditions if u is not None else [])]
    rows = []
    for key in ["capacity.json", *chunks]:
        matrix = key.split("/")[0]
        c = checks.get(key)
        part = (f" (seed{'s' if len(c['seeds']) > 1 else ''} "
                f"{', '.join(map(str, c['seeds']))} only: **the other seeds not re-checked**)"
                if c and c.get("seeds") else "")
        moved = bool(c) and c["result"].startswith("moved")
        rows.append([f"`{key}`", f"`{made.get(key, made.get(matrix, '?'))}`",
                     ("**STALE** (moved under the later model): " if moved else "") +
                     (f"`{c['model']}`: {c['runs']:,} runs{part}, {c['result']}" if c else
                      "**not re-checked**: made under the older model, stale until checked")])
    stale = [r[0] for r in rows if "not re-checked" in r[2] or "STALE" in r[2]]
    L = ["", "**Which runs, under which model.** The committed runs were made by the model of "
         "the commit named; a check re-runs a chunk whole under a later model and compares its "
         "runs, healthy runs and timelines with the committed ones (`nice -n 10 python "
         "reports/blacklist_policy_runs.py check MATRIX --load LOAD`, which records the "
         "result here). Main's engine changed after the first runs were made, at these "
         "merges: " + "; ".join(f"`{c}` ({what})" for c, what in
                                doc.get("engine_merges", [])) +
         "; a check or a run names the model it ran under:", "",
         _md(["runs", "made at", "re-checked"], rows), ""]
    inc = made.get("incident.csv, eval.csv")
    if inc:
        L.append(f"The incident sweeps (`incident.csv`, `eval.csv`, below) were re-run at "
                 f"`{inc}`, after the merge.")
    if stale:
        L.append(f"Not re-checked (in whole or in part): {', '.join(stale)}. Every pytest "
                 f"re-runs one cell (`tests/test_reports.py`: two policies under `flush_race` "
                 f"at 0.3x, seed 1); "
                 f"to regenerate a stale chunk instead: `rm -r reports/blacklist_policy/MATRIX/"
                 f"LOAD && nice -n 10 python reports/blacklist_policy_runs.py MATRIX --load "
                 f"LOAD`, then `python reports/make_blacklist_policy.py`.")
    return L


def method_section(s) -> list[str]:
    from pdsim.analysis import verdict as vd

    cap = s.capacity
    L = ["## How it was measured", ""]
    L.append(f"**Capacity.** {cap.describe()}. Probes (SLO attainment over the span, per seed):")
    L.append("")
    t = cap.table()
    L.append(_md(["rate, req/s", *[c for c in t.columns if c.startswith("seed")], "mean",
                  "meets"],
                 [[f"{x.rate:g}", *[f"{getattr(x, c.replace(' ', '_'), math.nan):.4f}"
                                    if False else f"{x[c]:.4f}" for c in t.columns
                                    if c.startswith("seed")], f"{x['mean']:.4f}",
                   "yes" if x["meets"] else "no"] for _, x in t.iterrows()]))
    L.append("")
    L.append("**Loads** (each a condition of the tables): " + "; ".join(
        f"`{k}` = {v}" for k, v in s.loads.items()) + ".")
    L.append("")
    w = next(iter(s.conditions.values()))
    tl = w.plan.timeline
    L.append(f"**Windows** ({tl.describe()}): every figure is over one of these, the same for "
             f"every policy and seed compared; `span` is the goodput and attainment window.")
    L.append("")
    L.append(_md(["fault", "before", "during", "recovery", "lasting", "span"],
                 [[_code(r["fault"]), r["before"], r["during"], r["recovery"], r["lasting"],
                   r["span"]] for r in w.plan.table()]))
    L.append("")
    seeds = w.seeds
    L.append(f"**Seeds and intervals.** Seeds {seeds[0]}-{seeds[-1]} for every policy, fault "
             f"and load, paired (every policy meets the same seed's arrivals and faults). "
             f"Each figure is a mean over seeds with a 95% percentile bootstrap interval "
             f"({vd.N_BOOT:,} resamples of the seeds, the same resample for every policy and "
             f"fault). With {len(seeds)} seeds there are "
             f"{math.comb(2 * len(seeds) - 1, len(seeds))} distinct resamples: the intervals "
             f"are coarse, and a tie here can be a difference more seeds would show.")
    L.append("")
    L.append(f"**Tie rule.** {vd.RULE[0].upper() + vd.RULE[1:]}.")
    L.append("")
    L.append("**Metrics.** " + "; ".join(f"`{k}`: {v[2]}" for k, v in vd.METRICS.items()) +
             ". Fault mixes: `worst` = the fault with the largest mean regret, `mean` = equal "
             "weights over the 8 faults.")
    return L


def inputs_section(s) -> list[str]:
    from pdsim.config.registry import FAULTS
    from pdsim.engine.faults import DECLARED

    w = next(iter(s.conditions.values()))
    L = ["## Inputs chosen (and their ranges)", ""]
    rows = [["base fleet", "`scenarios/whatif_base.yaml`: 2 prefill + 2 decode servers, TP 4 / "
             "DP 4 with DP attention (64 pairs), Mooncake, mini_lb 0.3.2", "the incident's "
             "servers, doubled; other fleets not run"],
            ["workload", "random 4096 in / 256 out (±50%)", "one workload"],
            ["SLO", "TTFT ≤ 2 s, TPOT ≤ 50 ms, attainment target 0.9 (bench --goodput)",
             "chosen, no source; capacity and SLO goodput move with it"],
            ["loads", ", ".join(s.loads), "0.3/0.6/0.9 of the measured capacity and the "
             "incident's closed loop (256 in flight)"],
            ["timeline", w.plan.timeline.describe(), "chosen (pdsim/analysis/windows.py)"],
            ["decode DP balancing", "`total_tokens` (the incident's)", "`round_robin` not "
             "re-run here (it moved `permanent`'s loss under `decode_nic_down` in the "
             "previous report)"]]
    L.append(_md(["input", "value", "range / note"], rows))
    L.append("")
    L.append("The fault library (`pdsim faults`; every value chosen; a declared unknown is run "
             "at its nominal value here and at its other values in the section on the "
             "unknowns):")
    L.append("")
    frows = []
    for name in w.nominal_faults:
        spec, doc = FAULTS.presets[name]
        vals = ", ".join(f"{k}: {v}" for k, v in spec.items() if k != "kind")
        dec = []
        for k, v in DECLARED.get(name, {}).items():
            if isinstance(v, dict):
                dist = next(d for d in ("choice", "uniform", "loguniform") if d in v)
                dec.append(f"`{k}`: {dist} {v[dist]}, nominal {v['nominal']} ({v['why']})")
        frows.append([_code(name), f"`{vals}`", doc + (" Declared unknown: " + "; ".join(dec)
                                                       if dec else "")])
    L.append(_md(["fault", "values", "what and why"], frows))
    return L


def per_fault_section(s) -> list[str]:
    L = ["## Per fault", "", "Best or tied-best by SLO goodput over the span, per load and "
         "fault (the rows a fault mix is made of):", ""]
    pf = s.per_fault("goodput")
    faults = list(dict.fromkeys(pf.fault))
    conds = list(s.conditions)
    rows = []
    for f in faults:
        cells = []
        for c in conds:
            x = pf[(pf.fault == f) & (pf.condition == c)]
            cells.append(", ".join(_code(p) for p in x.best.iloc[0]) if len(x) else "n/a")
        rows.append([_code(f), *cells])
    L.append(_md(["fault", *conds], rows))
    L.append("")
    pl = s.per_fault("lasting")
    rows = []
    for f in dict.fromkeys(pl.fault):
        cells = []
        for c in conds:
            x = pl[(pl.fault == f) & (pl.condition == c)]
            cells.append(", ".join(_code(p) for p in x.best.iloc[0]) if len(x) else "n/a")
        rows.append([_code(f), *cells])
    L.append("Best or tied-best by SLO goodput in the lasting-harm window (capacity still "
             "lost after the fault ended):")
    L.append("")
    L.append(_md(["fault", *conds], rows))
    return L


def load_tables(s) -> list[str]:
    L = ["## The tables, load by load", ""]
    for cond, w in s.conditions.items():
        L.append(f"### {cond}: {s.loads[cond]}")
        L.append("")
        h = w.healthy.drop_duplicates("seed")
        L.append(f"Healthy (no fault) SLO goodput over the span: "
                 f"{h.goodput_tok_s.mean():,.0f} tok/s (mean of seeds "
                 f"{', '.join(map(str, h.seed))}).")
        L.append("")
        r = w.ranking
        L.append("Ranking by worst-case goodput regret over the faults (rank by the tie rule):")
        L.append("")
        L.append(_md(["rank", "policy", "worst regret, % of healthy [95%]", "at fault",
                      "mean regret [95%]", "faults best or tied"],
                     [[_num(x["rank"]), _code(x.policy), _iv(x, "worst_regret_pct"),
                       _code(x.worst_fault) if x.worst_fault not in ("none", "n/a")
                       else x.worst_fault, _iv(x, "mean_regret_pct"),
                       int(x.faults_best_or_tied)] for _, x in r.iterrows()]))
        L.append("")
        for caption, metric, digits in [
                ("SLO goodput lost over the span, % of healthy, mean [95%]:",
                 "goodput_lost_pct", 1),
                ("SLO goodput lost in the lasting-harm window, % of healthy:",
                 "lasting_lost_pct", 1),
                ("SLO attainment over the span:", "span_attainment", 3),
                ("p99 TTFT of the requests that completed, s:", "ttft_p99_s", 1),
                ("Failed requests (arrived in the span):", "failed", 0)]:
            L.append(caption)
            L.append("")
            L.append(pivot(w, metric, digits))
            L.append("")
    return L


def unknowns_section(s, u) -> list[str]:
    L = ["## Across the declared unknowns", ""]
    if u is None:
        L.append("Not run yet: `nice -n 10 python reports/blacklist_policy_runs.py unknowns`.")
        return L
    L.append(f"`{CLI} --across-unknowns` runs each fault again at the other values of its "
             f"declared unknowns (one at a time, the others at nominal; a range at its ends "
             f"and middle). Best or tied-best by SLO goodput over the span, and in the "
             f"lasting-harm window, beside the nominal fault's (loads: "
             f"{', '.join(u.conditions)}):")
    L.append("")
    nominal = {(x.condition, x.fault): x.best for x in s.per_fault("goodput").itertuples()}
    nominal_l = {(x.condition, x.fault): x.best for x in s.per_fault("lasting").itertuples()}
    rows = []
    ug, ul = u.per_fault("goodput"), u.per_fault("lasting")
    for x in ug.itertuples():
        base = x.fault.split("[", 1)[0]
        lx = ul[(ul.condition == x.condition) & (ul.fault == x.fault)]
        t = u.conditions[x.condition].table
        lost = t[t.fault == x.fault].goodput_lost_pct
        lo, hi = round(lost.min(), 1) + 0.0, round(lost.max(), 1) + 0.0  # (no "-0.0")
        rows.append([f"`{x.fault}`", x.condition, f"{lo:.1f}–{hi:.1f}",
                     ", ".join(_code(p) for p in x.best),
                     ", ".join(_code(p) for p in nominal.get((x.condition, base), [])),
                     ", ".join(_code(p) for p in lx.best.iloc[0]) if len(lx) else "n/a",
                     ", ".join(_code(p) for p in nominal_l.get((x.condition, base), []))
                     or "n/a"])
    L.append(_md(["fault at another value", "load", "goodput lost, % (policies' range)",
                  "goodput: best or tied", "(nominal)", "lasting: best or tied", "(nominal)"],
                 rows))
    L.append("")
    always, _ = s.dominant()
    off = []
    for x in ug.itertuples():
        out = [p for p in always if p not in x.best]
        if out:
            t = u.conditions[x.condition].table
            lost = t[t.fault == x.fault].goodput_lost_pct
            off.append(f"`{x.fault}` at {x.condition} ({', '.join(_code(p) for p in out)} not "
                       f"best or tied by goodput; the policies' goodput lost spans "
                       f"{round(lost.min(), 1) + 0.0:.1f}–{round(lost.max(), 1) + 0.0:.1f}%)")
    if always:
        L.append(f"The overall answer ({', '.join(_code(p) for p in always)}) holds at every "
                 f"other value run" + ("." if not off else ", except: " + "; ".join(off) +
                                       "."))
        L.append("")
    L.append("Router health checks: the router modelled is mini_lb 0.3.2, which has none "
             "(sglang-router 0.3.2 `mini_lb.py`); sgl-model-gateway probes `/health` every 60 s "
             "and drops a worker after 3 failures (`config/types.rs` `HealthCheckConfig`), a "
             "probe a decode with a dead KV NIC, a stale descriptor or a hang of its KV path "
             "passes (its HTTP server answers). Not modelled, so not a declared unknown; it "
             "could matter only for the crash, which the router already refuses at once "
             "(HTTP 502).")
    return L


def findings_section() -> list[str]:
    """The review's findings (issue 25), each fixed or answered, with its test."""
    rows = [
        ["TTL recommendation came from the metric (goodput / run length)",
         "every figure over fixed windows named from the fault's timing; SLO goodput over the "
         "span; runs last to the last lasting window",
         "`test_decisions.py::test_goodput_is_over_a_fixed_window_not_the_runs_length`, "
         "`test_whatif.py::test_runs_last_until_every_faults_lasting_window_has_passed`"],
        ["at higher load a short TTL is worse", "loads are 0.3/0.6/0.9 of a measured capacity "
         "and a closed loop; the answer is per load", "`test_decisions.py::"
         "test_capacity_is_bracketed_and_bisected_to_its_resolution`, `::test_a_study_runs_"
         "each_load_from_capacity_and_ends_with_a_recommendation`"],
        ["runs end before lasting harm shows; session reuse; NIC rate and error rate "
         "unsourced", "runs last to each fault's lasting window; `decode_crash.restart_session`,"
         " `nic_degraded.bandwidth_fraction`, `transient_errors.probability` are declared "
         "unknowns with ranges and sources, run at their other values (section above)",
         "`test_decisions.py::test_a_decode_restarted_on_its_old_port_stays_unwritable_and_"
         "blacklisted`, `::test_across_unknowns_runs_each_declared_value_and_prints_its_"
         "verdict`"],
        ["ties are ranked", "mean regret with a paired 95% bootstrap interval; rank = 1 + "
         "policies better beyond noise; rank 1 = best or tied-best", "`test_whatif.py::"
         "test_regret_is_paired_by_seed_and_a_difference_within_noise_is_a_tie`, `test_"
         "decisions.py::test_ranks_count_the_policies_better_beyond_noise`"],
        ["CLI and README disagree; rows without parameters", "the CLI's default is this "
         "report's matrix and prints this answer; rows name their parameters (`ttl(ttl_s=3)`, "
         "`v0_5_23(...)`) and it ends with both answers (best everywhere; if the blacklist "
         "stays); the what-if guide's answer paragraph is written by this script and the README "
         "points to this report; a cell of the matrix re-runs to the committed rows at every "
         "pytest", "`test_reports.py::test_the_cli_default_is_the_reports_matrix`, "
         "`::test_the_cli_prints_the_reports_answer`, `::test_the_report_and_the_guide_are_"
         "the_tables`, `::test_a_cell_of_the_report_reruns_to_the_committed_rows`, "
         "`test_whatif.py::test_policy_grids_expand_and_validate`"],
        ["explore hides its uncertainty", "S1 ± SALib's S1_conf, seed noise with ddof=1, "
         "stories by posterior probability with matched draws and an interval "
         "(`reports/drop_timeout.md`, whose explored runs re-run to the committed rows); the "
         "resume key hashing file contents is issue 28's (on main), and the capacity search's "
         "cache key follows the same rule", "`test_explore.py::test_seed_"
         "noise_is_the_unbiased_share_left_between_seeds`, `::test_stories_are_compared_by_"
         "posterior_probability_with_matched_draws`, `::test_acceptance_region_and_"
         "sensitivity_recover_the_known_answer`, `test_regressions_28.py::test_the_resume_key_"
         "follows_the_content_of_the_files_read`, `test_decisions.py::test_the_capacity_key_"
         "follows_the_content_of_the_files_read`, `test_reports.py::test_a_point_of_each_story_"
         "reruns_to_the_committed_explore_rows`"],
        ["incident facts (flush timeout 10 s; attribution)", "the flushing bench's `?timeout=` "
         "is a declared unknown {10, 60}, nominal 60 (the write-up's `?timeout=60`; SGLang "
         "`serving.py`'s default 60 s, PR #33663); 10 s explored; the attribution correction "
         "(SGLang's own mini_lb via `PDDisaggregationServerBase.launch_lb --mini-lb`, PR "
         "#36152, consolidated into #36150) is in `reports/drop_timeout.md` and the README",
         "`test_incident_figures.py::test_the_declared_10_s_flush_timeout_matters_only_once_the_"
         "router_forwards_it`, golden (the incident scenarios' summaries list the declared "
         "value)"],
    ]
    return ["## The review's findings", "",
            _md(["finding (issue 25)", "fixed or answered", "test that fails without it"],
                rows)]


def incident_section(inc, ev) -> list[str]:
    L = ["## A TTL in the drop-timeout incident (SGLang PR #35823)", "", "```", *INCIDENT_CMDS,
         "```", "",
         f"Seeds 1–{INCIDENT_SEEDS}, median (min–max); the flushing run is the second bench "
         "(`ci_bench`); at the replay's nominal values (two chosen to fit F1 and F2):", ""]
    L.append(incident_table(inc, INCIDENT_TTLS, INCIDENT_COLS))
    L.append("")
    L.append("![incident](blacklist_policy_incident.png)")
    L.append("")
    if ev is not None:
        L += ["The eval that ran on the fleet the flush left behind "
              "(`scenarios/eval_after_flush.yaml`: gsm8k, 1,400 questions, starting at 90 s):",
              "", "```", *EVAL_CMDS, "```", "", incident_table(ev, EVAL_TTLS, EVAL_COLS), ""]
    return L


INCIDENT_COLS = [("failed", "failed requests", 0),
                 ("ci_bench.empty_share", "empty share, flushing run", 2),
                 ("ci_bench.true_output_throughput_tok_s", "generated tok/s, flushing run", 0),
                 ("blacklisted_pairs_max", "pairs blacklisted", 0),
                 ("blacklisted_pairs_final", "still blacklisted at the end", 0)]
EVAL_COLS = [("gsm8k.requests", "eval requests (1,400 questions)", 0),
             ("gsm8k.failed", "eval requests failed", 0),
             ("gsm8k.duration_s", "eval duration, s", 1),
             ("blacklisted_pairs_final", "still blacklisted at the end", 0)]


def incident_table(inc, ttls, cols) -> str:
    inc = inc.copy()
    if "blacklist.ttl_s" not in inc:
        inc["blacklist.ttl_s"] = float("nan")
    inc["label"] = [p if p != "ttl" else f"ttl(ttl_s={t:g})"
                    for p, t in zip(inc["blacklist.policy"], inc["blacklist.ttl_s"], strict=True)]
    order = ["permanent", "probe", *[f"ttl(ttl_s={t:g})" for t in ttls], "never"]
    rows = []
    for lbl in order:
        g = inc[inc.label == lbl]
        if not len(g):
            continue
        rows.append([_code(lbl)] + [f"{_num(g[c].median(), d)} ({_num(g[c].min(), d)}–"
                                    f"{_num(g[c].max(), d)})" for c, _n, d in cols])
    return _md(["policy"] + [n for _c, n, _d in cols], rows)


CAVEATS = [
    "One fleet (2P2D, 64 pairs), one workload, one SLO, `total_tokens` decode balancing: the "
    "verdict is for these; the loads are fractions of this fleet's measured capacity.",
    "SLO goodput counts completed requests within the SLO; a request that waits out a dead KV "
    "path (30 s) misses it. Goodput of completed requests regardless of the SLO is in "
    "`completed_tok_s` (per window) in the runs CSVs.",
    "The fault timings, durations and the timeline's window lengths are chosen (above); a "
    "fault longer than the 300 s waiting timeout was not run.",
    "Seeds per cell are few (see the intervals); ties can hide differences more seeds would "
    "show, and a difference outside its interval can still be small.",
    "`decode_crash` with `restart_session: reused` follows a reading of Mooncake's descriptor "
    "cache that was not observed at run time; probes are modelled as small writes (a real "
    "probe to the restarted decode might succeed and let one more write fail).",
]


def figures(s) -> list[str]:
    import matplotlib.pyplot as plt

    made = []
    hi = s.conditions.get("0.9x") or next(iter(s.conditions.values()))
    ax = hi.heatmap()
    ax.figure.savefig(OUT / "blacklist_policy_heatmap.png", dpi=80)
    made.append("blacklist_policy_heatmap.png")
    closed = s.conditions.get("closed") or hi
    fig, axes = plt.subplots(1, 2, figsize=(15, 4.2), constrained_layout=True)
    keep = [p for p in ("permanent", "v0_5_23(probe_interval_s=30, probe_max_interval_s=300)",
                        "never", "ttl(ttl_s=3)", "ttl(ttl_s=30)") if p in closed.labels]
    closed.timelines("decode_nic_down", ax=axes[0], policies=keep)
    closed.timelines("decode_crash", ax=axes[1], policies=keep)
    fig.savefig(OUT / "blacklist_policy_timelines.png", dpi=80)
    made.append("blacklist_policy_timelines.png")
    ax = hi.vs_param("ttl_s", policy="ttl")
    ax.figure.savefig(OUT / "blacklist_policy_ttl.png", dpi=80)
    made.append("blacklist_policy_ttl.png")
    plt.close("all")
    return made


def incident_figure() -> str:
    import matplotlib.pyplot as plt

    import pdsim
    from pdsim.output import plots

    path = ROOT / "scenarios/drop_timeout.yaml"
    runs = {"permanent (as shipped)": pdsim.run(path),
            "ttl_s=10": pdsim.run(path, sets=["blacklist.policy=ttl", "blacklist.ttl_s=10"])}
    fig = plt.figure(figsize=(14, 7.5), layout="constrained")
    for sub, (name, res) in zip(fig.subfigures(1, 2), runs.items(), strict=True):
        sub.suptitle(f"drop_timeout.yaml, seed 1: {name}", fontweight="bold")
        top, bottom = sub.subplots(2, 1)
        plots.blacklist_timeline(res, ax=top)
        plots.outcomes(res, ax=bottom, client="ci_bench")
        top.set_xlim(bottom.get_xlim())
    fig.savefig(OUT / "blacklist_policy_incident.png", dpi=70)
    plt.close("all")
    return "blacklist_policy_incident.png"


def guide_paragraph(s, r_list) -> str:
    always, _missing = s.dominant()
    r = s.recommendation
    labels = next(iter(s.conditions.values())).labels
    c = counts(r, labels)
    most = max(c.values())
    verdict = (f"{', '.join(_code(p) for p in always)} "
               f"{'is' if len(always) == 1 else 'are'} best or tied-best under every load, "
               f"metric and fault mix run" if always else
               "no single policy is best or tied-best under every load, metric and fault mix "
               "run; " + ", ".join(_code(p) for p in labels if c[p] == most) +
               f" {'is' if sum(v == most for v in c.values()) == 1 else 'are'} in {most} of "
               f"{len(r)} rows")
    ttl_rows = int(sum(any(p.startswith("ttl(") for p in b) for b in r.best))
    ll = listing(s)
    c2 = counts(r_list, ll)
    top = sorted(c2.items(), key=lambda kv: -kv[1])[0]
    return (f"Should the blacklist have a TTL, and what value? `{CLI}` measures the fleet's "
            f"capacity ({s.capacity.rate:.3g} req/s for `whatif_base.yaml` at its SLO), runs "
            f"every policy under every fault of the library at 0.3, 0.6 and 0.9 of it and in a "
            f"closed loop (seeds 1-{max(next(iter(s.conditions.values())).seeds)}), scores "
            f"each over fixed windows named from the fault's timing (SLO goodput, attainment, "
            f"throughput, lasting harm) with paired bootstrap intervals, and prints the best "
            f"or tied-best policy per load, metric and fault mix: {verdict} (a TTL ties in "
            f"{ttl_rows} of {len(r)} rows, `permanent` in "
            f"{int(sum('permanent' in b for b in r.best))}). If a blacklist stays, "
            f"{_code(top[0])} is best or tied-best among those that keep one in {top[1]} of "
            f"{len(r_list)} rows. The tables, how the capacity, windows and intervals were "
            f"measured, the declared fault-model unknowns and the review's findings are in "
            f"[the report](../reports/blacklist_policy.md) (regenerated by `python "
            f"reports/make_blacklist_policy.py` from its CSVs; this paragraph too).")


def write_guide(par: str) -> None:
    text = GUIDE.read_text()
    pat = re.compile(r"(<!-- begin:whatif -->\n)(?:.*?\n)?(<!-- end:whatif -->)", re.S)
    if not pat.search(text):
        sys.exit(f"{GUIDE.relative_to(ROOT)}: no <!-- begin:whatif --> ... <!-- end:whatif --> "
                 f"block")
    GUIDE.write_text(pat.sub(lambda m: m.group(1) + par + "\n" + m.group(2), text))


def render(s, u, inc, ev) -> tuple[str, str]:
    r_list = s.recommend(listing(s))
    w = next(iter(s.conditions.values()))
    n_runs = len(s.conditions) * len(w.seeds) * (1 + len(w.labels) * len(w.nominal_faults))
    L = ["# Should the blacklist have a TTL, and what value? (issue 25)", "",
         f"Generated by `python reports/make_blacklist_policy.py` from the CSVs in "
         f"`reports/blacklist_policy/`. **One command reproduces the answer:** `{CLI}` (its "
         f"defaults are this report's matrix: {len(w.labels)} policies x "
         f"{len(w.nominal_faults)} faults x {len(s.conditions)} loads x seeds "
         f"{w.seeds[0]}-{w.seeds[-1]}, {n_runs:,} runs and a capacity search: about 40 "
         f"CPU-minutes, ~20 min on 2 free cores; "
         f"`reports/blacklist_policy_runs.py` runs the same in resumable chunks). "
         f"`notebooks/blacklist_whatif.ipynb` reads the same CSVs.", "",
         "## The answer", "", *stale_warning(),
         "Best or tied-best policy (and parameters) per load, metric and fault mix; each "
         "policy's regret (how far below the best policy at the same fault and seed, mean over "
         "seeds) with its 95% bootstrap interval:", "", headline_table(s.recommendation), "",
         answer_text(s, s.recommendation, r_list), "",
         "If the blacklist stays: the same, among the policies that keep a pair out after a "
         "failure (" + ", ".join(_code(p) for p in listing(s)) + "), regret against the best "
         "of them:", "", headline_table(r_list), ""]
    L += method_section(s) + provenance_section(s, u) + [""] + per_fault_section(s) + [""]
    L += unknowns_section(s, u)
    L += [""] + load_tables(s)
    L += ["![goodput lost at 0.9 x capacity](blacklist_policy_heatmap.png)", "",
          "![closed loop timelines](blacklist_policy_timelines.png)", "",
          "![goodput against ttl_s](blacklist_policy_ttl.png)", ""]
    L += inputs_section(s) + [""]
    if inc is not None:
        L += incident_section(inc, ev)
    L += findings_section() + [""]
    L += ["## What this does not say", ""] + [f"- {c}" for c in CAVEATS] + [""]
    from pdsim.analysis.whatif_table import COLUMNS

    L += ["Columns of the CSVs (`columns.json` in each load's directory):", "",
          _md(["column", "meaning"], [[_code(k), v] for k, v in COLUMNS.items()]), ""]
    return "\n".join(L), guide_paragraph(s, r_list)


def load_study():
    import json

    from pdsim.analysis.study import Study

    head = DATA / "headline"
    if not (head / "study.json").is_file():
        sys.exit("reports/blacklist_policy/headline/ missing: nice -n 10 python "
                 "reports/blacklist_policy_runs.py headline")
    s = Study.read(head)
    u = None
    if (DATA / "unknowns" / "study.json").is_file():
        meta = json.loads((DATA / "unknowns" / "study.json").read_text())
        u = Study.read(DATA / "unknowns", meta["conditions"])
    return s, u


def main(argv: list[str] | None = None) -> None:
    import pandas as pd

    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", nargs="*", default=[], choices=["incident", "eval"],
                    help="re-run the incident sweeps first")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--no-figures", action="store_true")
    args = ap.parse_args(argv)
    for name in args.run:
        run_incident(args.workers) if name == "incident" else run_eval(args.workers)
    s, u = load_study()
    inc = pd.read_csv(DATA / "incident.csv") if (DATA / "incident.csv").is_file() else None
    ev = pd.read_csv(DATA / "eval.csv") if (DATA / "eval.csv").is_file() else None
    text, par = render(s, u, inc, ev)
    (OUT / "blacklist_policy.md").write_text(text)
    write_guide(par)
    made = [] if args.no_figures else [*figures(s), incident_figure()]
    for name in ["blacklist_policy.md", *made]:
        print(f"wrote reports/{name}")
    print(f"wrote {GUIDE.relative_to(ROOT)} (the answer paragraph)")


if __name__ == "__main__":
    main()

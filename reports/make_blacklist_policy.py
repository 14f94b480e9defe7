"""Regenerate reports/blacklist_policy.md (and its figures) from the what-if matrices.

    python reports/make_blacklist_policy.py                  # from the committed CSVs: seconds
    nice python reports/make_blacklist_policy.py --run all   # re-run every matrix first
    nice python reports/make_blacklist_policy.py --run incident --workers 2

The matrices' small outputs live in reports/blacklist_policy/<matrix>/ (what `pdsim whatif
--out` writes, timelines gzipped; the incident sweep as one CSV), so the markdown and figures
regenerate without running anything. Each matrix is also one `pdsim` command, printed in the
report next to the tables it gives.
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

ROOT = Path(__file__).resolve().parents[1]
OUT = Path(__file__).resolve().parent
DATA = OUT / "blacklist_policy"
BASE = "scenarios/whatif_base.yaml"
SEEDS = 3  # modest: a 2-core machine shared with others (the intervals say how much this hides)

TTLS = [3, 10, 30, 120, 600]
LIBRARY_POLICIES = ["permanent", "never", "probe", "v0_5_23", {"policy": "ttl", "ttl_s": TTLS},
                    "strikes_window", "circuit_breaker"]
FEW_POLICIES = ["permanent", "never", {"policy": "ttl", "ttl_s": 30}, "circuit_breaker"]
FEW_FAULTS = ["decode_crash", "decode_nic_down", "flush_race"]

MATRICES: dict[str, dict] = {
    # the whole library at the base's chosen load (18 req/s, a light load: whatif_base.yaml)
    "library": {"policies": LIBRARY_POLICIES, "faults": None, "sets": [],
                "cli": "--policy permanent --policy never --policy probe --policy v0_5_23 "
                       f"--policy ttl:ttl_s={','.join(map(str, TTLS))} --policy strikes_window "
                       "--policy circuit_breaker"},
    # chosen input 1: the decode DP balancer (round_robin does not see a rank's stuck work)
    "round_robin": {"policies": FEW_POLICIES, "faults": FEW_FAULTS,
                    "sets": ["fleet.decode.balance=round_robin"],
                    "cli": "--policy permanent --policy never --policy ttl:ttl_s=30 "
                           f"--policy circuit_breaker --faults {','.join(FEW_FAULTS)} "
                           "--set fleet.decode.balance=round_robin"},
    # chosen input 2: the load (the incident's closed-loop CI bench: rate inf, 256 in flight)
    "closed_loop": {"policies": FEW_POLICIES, "faults": FEW_FAULTS,
                    "sets": ["clients.0.request_rate=inf", "clients.0.max_concurrency=256",
                             "clients.0.num_prompts=6000"],
                    "cli": "--policy permanent --policy never --policy ttl:ttl_s=30 "
                           f"--policy circuit_breaker --faults {','.join(FEW_FAULTS)} "
                           "--set clients.0.request_rate=inf --set clients.0.max_concurrency=256 "
                           "--set clients.0.num_prompts=6000"},
    # more TTLs in the two other settings (merged with the matrices above in the report)
    "round_robin_ttl": {"policies": [{"policy": "ttl", "ttl_s": [3, 10, 120]}],
                        "faults": FEW_FAULTS, "sets": ["fleet.decode.balance=round_robin"],
                        "cli": f"--policy ttl:ttl_s=3,10,120 --faults {','.join(FEW_FAULTS)} "
                               "--set fleet.decode.balance=round_robin"},
    "closed_loop_ttl": {"policies": [{"policy": "ttl", "ttl_s": [3, 10, 120]}],
                        "faults": FEW_FAULTS,
                        "sets": ["clients.0.request_rate=inf", "clients.0.max_concurrency=256",
                                 "clients.0.num_prompts=6000"],
                        "cli": f"--policy ttl:ttl_s=3,10,120 --faults {','.join(FEW_FAULTS)} "
                               "--set clients.0.request_rate=inf "
                               "--set clients.0.max_concurrency=256 "
                               "--set clients.0.num_prompts=6000"},
    # the thresholded policies at lower thresholds (their defaults never trip in the library)
    "thresholds": {"policies": [{"policy": "strikes_window", "strikes": [1, 2]},
                                {"policy": "circuit_breaker", "failures": [1, 2]}],
                   "faults": None, "sets": [],
                   "cli": "--policy strikes_window:strikes=1,2 "
                          "--policy circuit_breaker:failures=1,2"},
}
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


def command(name: str) -> str:
    m = MATRICES[name]
    return f"pdsim whatif {BASE} {m['cli']} --seeds {SEEDS} --out reports/blacklist_policy/{name}"


# --- running ------------------------------------------------------------------------------


def run_matrix(name: str, workers: int | None) -> None:
    from pdsim.analysis.whatif import whatif

    m = MATRICES[name]
    w = whatif(ROOT / BASE, m["policies"], m["faults"], range(1, SEEDS + 1), workers,
               progress=True, sets=m["sets"], command=command(name))
    w.base = BASE  # columns.json names the base as the command does, not where this checkout is
    out = DATA / name
    if out.exists():
        shutil.rmtree(out)
    w.write(out, ["csv"])
    plain = out / "timelines.csv"
    with plain.open("rb") as src, gzip.GzipFile(out / "timelines.csv.gz", "wb", mtime=0) as dst:
        shutil.copyfileobj(src, dst)  # mtime=0: the same runs give the same bytes
    plain.unlink()
    print(f"wrote {out.relative_to(ROOT)}", file=sys.stderr)


def run_incident(workers: int | None) -> None:
    import pandas as pd

    from pdsim.analysis.sweep import sweep
    from pdsim.config import loader

    scenario = ROOT / "scenarios/drop_timeout.yaml"
    seeds = range(1, INCIDENT_SEEDS + 1)
    a = sweep(scenario, {"blacklist.policy": ["permanent", "probe"]}, seeds, workers)
    never = loader.apply_overrides(loader.as_data(scenario),
                                         ["blacklist={policy: never}"])
    b = sweep(never, {"blacklist.policy": ["never"]}, seeds, workers)
    c = sweep(scenario, {"blacklist.policy": ["ttl"], "blacklist.ttl_s": INCIDENT_TTLS}, seeds,
              workers)
    df = pd.concat([a, b, c], ignore_index=True)
    DATA.mkdir(parents=True, exist_ok=True)
    df.to_csv(DATA / "incident.csv", index=False, float_format="%.6g")
    print(f"wrote {(DATA / 'incident.csv').relative_to(ROOT)}", file=sys.stderr)


def run_eval(workers: int | None) -> None:
    import pandas as pd

    from pdsim.analysis.sweep import sweep

    seeds = range(1, INCIDENT_SEEDS + 1)
    ev = ROOT / "scenarios/eval_after_flush.yaml"
    a = sweep(ev, {"blacklist.policy": ["permanent"]}, seeds, workers)
    b = sweep(ev, {"blacklist.policy": ["ttl"], "blacklist.ttl_s": EVAL_TTLS}, seeds, workers)
    pd.concat([a, b], ignore_index=True).to_csv(DATA / "eval.csv", index=False,
                                                 float_format="%.6g")
    print(f"wrote {(DATA / 'eval.csv').relative_to(ROOT)}", file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--run", nargs="*", default=[], metavar="MATRIX",
                    help=f"re-run these first: {', '.join(MATRICES)}, incident, eval or all")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    todo = [*MATRICES, "incident", "eval"] if "all" in args.run else args.run
    for name in todo:
        if name == "incident":
            run_incident(args.workers)
        elif name == "eval":
            run_eval(args.workers)
        elif name in MATRICES:
            run_matrix(name, args.workers)
        else:
            ap.error(f"unknown matrix {name!r}: {', '.join(MATRICES)}, incident, eval or all")
    write_report()


# --- the report ------------------------------------------------------------------------------


def _num(v: float, digits: int = 0) -> str:
    if v != v:  # nan
        return "n/a"
    if v in (float("inf"), float("-inf")):
        return "not in run"
    if round(v, digits) == 0:
        v = 0.0  # no "-0.0"
    return f"{v:,.{digits}f}"


def _iv(row, m: str, digits: int = 0) -> str:
    """median [10th-90th percentile over seeds]"""
    if row[m] != row[m]:
        return "n/a"
    lo, hi = row[f"{m}_lo"], row[f"{m}_hi"]
    if lo == hi == row[m]:
        return _num(row[m], digits)
    return f"{_num(row[m], digits)} [{_num(lo, digits)}–{_num(hi, digits)}]"


def _md(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(map(str, r)) + " |" for r in rows]
    return "\n".join(out)


def pivot(w, metric: str, digits: int = 0, faults=None, policies=None) -> str:
    """Policies (rows) x faults (columns): median [10-90%] of ``metric``."""
    t = w.table.set_index(["policy", "fault"])
    faults = faults or list(w.faults)
    policies = policies or [lbl for lbl, _ in w.policies]
    rows = [[f"`{p}`"] + [_iv(t.loc[(p, f)], metric, digits) for f in faults]
            for p in policies]
    return _md(["policy"] + [f"`{f}`" for f in faults], rows)


def _fault(name: str) -> str:
    """A fault's name as code; "none" (a policy with no regret at any fault) as a word."""
    return name if name == "none" else f"`{name}`"


def _place(r, policy: str) -> str:
    """Where ``policy`` ranks, ties said (tied policies share a rank)."""
    rank = int(r.set_index("policy").overall_rank[policy])
    ties = int((r.overall_rank == rank).sum()) - 1
    where = "last" if rank + ties == len(r) else f"{rank} of {len(r)}"
    return f"{where}, tied with {ties} other{'s' if ties > 1 else ''}" if ties else where


def ranking_md(w) -> str:
    r = w.ranking
    rows = [[int(x.overall_rank), f"`{x.policy}`", _num(x.worst_regret_pct, 1),
             _fault(x.worst_fault), _num(x.mean_regret_pct, 1), _num(x.mean_goodput_lost_pct, 1),
             int(x.faults_won)] for x in r.itertuples()]
    return _md(["rank", "policy", "worst regret, % of healthy", "at fault", "mean regret %",
                "mean goodput lost %", "faults won"], rows)


def healthy_line(w) -> str:
    import numpy as np

    h = w.healthy.goodput_tok_s
    return (f"Healthy (no fault) goodput: {np.median(h):,.0f} tok/s (median of seeds "
            f"{', '.join(map(str, w.healthy.seed))}: {', '.join(f'{x:,.0f}' for x in h)}).")


INCIDENT_COLS = [("failed", "failed requests", 0),
                 ("ci_bench.empty_share", "empty share, flushing run", 2),
                 ("ci_bench.true_output_throughput_tok_s", "generated tok/s, flushing run", 0),
                 ("blacklisted_pairs_max", "pairs blacklisted", 0),
                 ("blacklisted_pairs_final", "still blacklisted at the end", 0)]
EVAL_COLS = [("gsm8k.requests", "eval requests (1,400 questions)", 0),
             ("gsm8k.failed", "eval requests failed", 0),
             ("gsm8k.duration_s", "eval duration, s", 1),
             ("blacklisted_pairs_final", "still blacklisted at the end", 0)]


def incident_table(inc, ttls=INCIDENT_TTLS, cols=INCIDENT_COLS) -> tuple[str, dict]:
    """Per policy: medians and ranges over the seeds of a sweep of the incident's scenario."""
    inc = inc.copy()
    if "blacklist.ttl_s" not in inc:
        inc["blacklist.ttl_s"] = float("nan")
    inc["label"] = [p if p != "ttl" else f"ttl(ttl_s={t:g})"
                    for p, t in zip(inc["blacklist.policy"], inc["blacklist.ttl_s"], strict=True)]
    order = ["permanent", "probe", *[f"ttl(ttl_s={t:g})" for t in ttls], "never"]
    rows, med = [], {}
    for lbl in order:
        g = inc[inc.label == lbl]
        if not len(g):
            continue
        row = [f"`{lbl}`"]
        for c, _name, d in cols:
            v = g[c]
            row.append(f"{_num(v.median(), d)} ({_num(v.min(), d)}–{_num(v.max(), d)})")
            med[(lbl, c)] = float(v.median())
        rows.append(row)
    return _md(["policy"] + [n for _c, n, _d in cols], rows), med


def figures(lib, inc_runs: dict | None) -> list[str]:
    import matplotlib.pyplot as plt

    from pdsim.output import plots

    made = []
    ax = lib.heatmap()
    ax.figure.savefig(OUT / "blacklist_policy_heatmap.png", dpi=80)
    made.append("blacklist_policy_heatmap.png")
    fig, axes = plt.subplots(1, 2, figsize=(15, 4.2), constrained_layout=True)
    keep = ["permanent", "never", "probe", "ttl(ttl_s=10)", "ttl(ttl_s=120)", "circuit_breaker"]
    keep = [p for p in keep if p in dict(lib.policies)]
    lib.timelines("decode_nic_down", ax=axes[0], policies=keep)
    lib.timelines("flush_race", ax=axes[1], policies=keep)
    fig.savefig(OUT / "blacklist_policy_timelines.png", dpi=80)
    made.append("blacklist_policy_timelines.png")
    ax = lib.vs_param("ttl_s", policy="ttl")
    ax.figure.savefig(OUT / "blacklist_policy_ttl.png", dpi=80)
    made.append("blacklist_policy_ttl.png")
    if inc_runs:
        fig = plt.figure(figsize=(7 * len(inc_runs), 7.5), layout="constrained")
        for sub, (name, res) in zip(fig.subfigures(1, len(inc_runs)), inc_runs.items(),
                                    strict=True):
            sub.suptitle(f"drop_timeout.yaml, seed 1: {name}", fontweight="bold")
            top, bottom = sub.subplots(2, 1)
            plots.blacklist_timeline(res, ax=top)
            plots.outcomes(res, ax=bottom, client="ci_bench")
            top.set_xlim(bottom.get_xlim())
        fig.savefig(OUT / "blacklist_policy_incident.png", dpi=70)
        made.append("blacklist_policy_incident.png")
    plt.close("all")
    return made


KINDS = ["never", "ttl", "permanent", "probe", "v0_5_23", "strikes_window", "circuit_breaker"]


def _order(label: str, kind: str) -> tuple:
    """never, TTLs by length, permanent, then the other policies, defaults first."""
    rank = KINDS.index(kind) if kind in KINDS else len(KINDS)
    if label.startswith("ttl(ttl_s="):
        return (rank, float(label[10:-1]), label)
    return (rank, 0.0 if label == kind else 1.0, label)


def merge(a, b):
    """Two matrices of the same base, sets, faults and seeds as one (their healthy runs are
    the same runs)."""
    import pandas as pd

    from pdsim.analysis.whatif_table import WhatIf

    cols = ["seed", "goodput_tok_s"]
    if not a.healthy[cols].equals(b.healthy[cols]) or list(a.faults) != list(b.faults):
        raise SystemExit("cannot merge matrices of different bases, faults or seeds")
    pols = sorted(a.policies + b.policies, key=lambda p: _order(p[0], p[1]["policy"]))
    return WhatIf(pd.concat([a.runs, b.runs], ignore_index=True), a.healthy, pols, a.faults,
                  a.base, a.command)


SETTING_SHORT = {"library": "at the base load", "round_robin": "with round-robin balancing",
                 "closed_loop": "under the closed loop"}
SETTINGS = {"library": "open loop 18 req/s, `total_tokens` (§1)",
            "round_robin": "open loop, `round_robin`",
            "closed_loop": "closed loop, 256 in flight"}


def robust_table(mats: dict) -> tuple[str, str, dict]:
    """Worst-case regret of the policies every setting ran, over the faults every setting ran,
    per setting and overall (regret against the best of those policies: each setting's matrix
    cut to them, so regret is the what-if's own, paired by seed)."""
    from pdsim.analysis.whatif_table import WhatIf

    ws = {k: mats[k] for k in SETTINGS if k in mats}
    common = [p for p, _ in ws["library"].policies
              if all(p in dict(w.policies) for w in ws.values())]
    faults = [f for f in FEW_FAULTS if all(f in w.faults for w in ws.values())]
    worst: dict[str, dict[str, tuple[float, str]]] = {p: {} for p in common}
    for k, w in ws.items():
        h = w.healthy
        cut = WhatIf(w.runs[w.runs.policy.isin(common) & w.runs.fault.isin(faults)],
                     h[h.policy.isin(common)] if "policy" in h else h,
                     [(p, sec) for p, sec in w.policies if p in common],
                     {f: w.faults[f] for f in faults})
        for p, g in cut.table.groupby("policy"):
            i = g.regret_pct.idxmax()
            worst[p][k] = (float(g.regret_pct.max()), g.loc[i, "fault"])
    rows = []
    for p in sorted(common, key=lambda p: max(v[0] for v in worst[p].values())):
        overall = max(worst[p].items(), key=lambda kv: kv[1][0])
        rows.append([f"`{p}`"] + [f"{worst[p][k][0]:.1f} (`{worst[p][k][1]}`)" for k in ws]
                    + [f"**{overall[1][0]:.1f}**"])
    overall = {p: max(v[0] for v in worst[p].values()) for p in common}
    return (_md(["policy"] + [SETTINGS[k] for k in ws] + ["worst of all"], rows), rows[0][0],
            overall)


def incident_runs() -> dict:
    import pdsim

    path = ROOT / "scenarios/drop_timeout.yaml"
    return {"permanent (as shipped)": pdsim.run(path),
            "ttl_s=10": pdsim.run(path, sets=["blacklist.policy=ttl", "blacklist.ttl_s=10"])}


def write_report() -> None:
    import pandas as pd

    from pdsim.analysis.whatif_table import WhatIf

    mats = {name: WhatIf.read(DATA / name) for name in MATRICES if (DATA / name).is_dir()}
    for name, extra in (("round_robin", "round_robin_ttl"), ("closed_loop", "closed_loop_ttl"),
                        ("library", "thresholds")):
        if name in mats and extra in mats:
            mats[name] = merge(mats[name], mats.pop(extra))
    inc = pd.read_csv(DATA / "incident.csv") if (DATA / "incident.csv").is_file() else None
    ev = pd.read_csv(DATA / "eval.csv") if (DATA / "eval.csv").is_file() else None
    if "library" not in mats or inc is None:
        sys.exit("reports/blacklist_policy/ lacks library/ or incident.csv: run with --run all")
    made = figures(mats["library"], incident_runs())
    text = render(mats, inc, ev)
    (OUT / "blacklist_policy.md").write_text(text)
    for name in ["blacklist_policy.md", *made]:
        print(f"wrote reports/{name}")


def _within(t, fault: str, policy: str, pp: float) -> bool:
    row = t[(t.fault == fault) & (t.policy == policy)]
    return bool(len(row)) and float(row.regret_pct.iloc[0]) <= pp


TIE_PP = 1.0  # regret within this many points of healthy goodput counts as a tie (chosen)


def render(mats: dict, inc, ev=None) -> str:
    from pdsim.config.registry import FAULTS

    lib = mats["library"]
    inc_md, inc_med = incident_table(inc)
    ans = _Missing(answers(mats, inc_med))
    rob = ""
    if all(k in mats for k in SETTINGS):
        rob, ans["robust"], worst = robust_table(mats)
        for p, v in worst.items():
            ans[f"{p.replace('(ttl_s=', '').replace(')', '')}_x_worst"] = f"{v:.1f}"
    if ev is not None:
        ev_md, ev_med = incident_table(ev, EVAL_TTLS, EVAL_COLS)
        for (lbl, c), v in ev_med.items():
            key = lbl.replace("(ttl_s=", "").replace(")", "")
            ans[f"ev_{key}_{c.split('.')[-1]}"] = f"{v:,.0f}"
    L = []
    add = L.append
    add("# Which blacklist policy? Harm across the fault library (issue #8)")
    add("")
    add("Generated by `python reports/make_blacklist_policy.py` from the CSVs in "
        "`reports/blacklist_policy/` (re-run them with `nice python "
        "reports/make_blacklist_policy.py --run all`, about 400 runs, ~40 min of CPU on 2 "
        "shared cores). Every table names the command it comes from; "
        "`notebooks/blacklist_whatif.ipynb` draws the same matrix interactively. Step-time "
        "model: the operator predictor (the default).")
    add("")
    add("## Short answers")
    add("")
    add(ANSWERS.format_map(ans))
    add("")
    add("## Inputs chosen for this study (and their ranges)")
    add("")
    add("Nothing below is fitted to an outcome; these are choices, and the sections after "
        "show how the answer moves with the two that matter most (decode balancing, load).")
    add("")
    rows = [["base fleet", "`scenarios/whatif_base.yaml`: 2 prefill + 2 decode servers, "
             "TP 4 / DP 4 with DP attention (64 pairs, two sessions per transfer queue)",
             "the incident's servers, doubled"],
            ["load", "random 4096 in / 256 out (±50%), Poisson 18 req/s, 3,600 prompts",
             "chosen light (p99 TTFT 0.38 s healthy; 45 req/s is still served): at most "
             "~0.4 of capacity, only this open-loop rate run; closed-loop rate inf / 256 in "
             "flight shown below"],
            ["decode DP balancing", "`total_tokens` (the incident's)",
             "`round_robin` shown below"],
            ["faults", "each at 60 s, durations as listed", "see each fault's range"],
            ["seeds", f"1–{SEEDS} per (policy, fault); medians with 10–90% intervals",
             "a 2-core shared machine; more seeds narrow the intervals"],
            ["tie", f"regret ≤ {TIE_PP:g} point of healthy goodput", "a reading aid only"]]
    add(_md(["input", "value", "range / note"], rows))
    add("")
    add("The fault library (`pdsim faults`; every value chosen, with its plausible range):")
    add("")
    frows = []
    for name in lib.faults:
        spec, doc = FAULTS.presets[name]
        frows.append([f"`{name}`", "`" + ", ".join(f"{k}: {v}" for k, v in spec.items()
                                                   if k != "kind") + "`", doc])
    add(_md(["fault", "values", "what and why"], frows))
    add("")
    add("## 1. Across the fault library")
    add("")
    add("```")
    add(command("library"))
    add(command("thresholds"))
    add("```")
    add("")
    add(healthy_line(lib))
    add("")
    add("Ranking by worst-case regret (regret: the goodput of the fault's best policy at the "
        "same seed minus this policy's, in % of that seed's healthy goodput; the median over "
        "seeds):")
    add("")
    add(ranking_md(lib))
    add("")
    add("Goodput lost, % of healthy: median [10–90% over seeds]:")
    add("")
    add(pivot(lib, "goodput_lost_pct", 1))
    add("")
    add("![goodput lost](blacklist_policy_heatmap.png)")
    add("")
    add("Failed requests (of 3,600):")
    add("")
    add(pivot(lib, "failed"))
    add("")
    faults_dead = [f for f in ("decode_crash", "decode_nic_down", "decode_hang", "partition",
                               "nic_flaps") if f in lib.faults]
    for caption, metric, digits, faults in [
            ("Requests sent to dead peers (`dead_peer_writes`; the faults with a dead peer):",
             "dead_peer_writes", 0, faults_dead),
            ("p99 TTFT of the requests that completed, s (healthy: about 0.4 s):",
             "ttft_p99_s", 1, list(lib.faults)),
            ("Longest stay of a healthy pair on the blacklist, s:",
             "max_healthy_blacklisted_s", 0, list(lib.faults)),
            ("Time to recover after the fault's end, s (not in run: not back within 10% of "
             "healthy before the load ended; n/a: the fault has no end):",
             "recover_s", 0, list(lib.faults))]:
        add(caption)
        add("")
        add(pivot(lib, metric, digits, faults=faults))
        add("")
    add("")
    add("![recovery](blacklist_policy_timelines.png)")
    add("")
    add(SECTION1.format_map(ans))
    add("")
    add("## 2. What a TTL (SGLang PR #35823) would have done in the drop-timeout incident")
    add("")
    add("```")
    for c in INCIDENT_CMDS:
        add(c)
    add("```")
    add("")
    add(f"Seeds 1–{INCIDENT_SEEDS}, median (min–max); the flushing run is the second bench "
        "(`ci_bench`):")
    add("")
    add(inc_md)
    add("")
    add("![incident](blacklist_policy_incident.png)")
    add("")
    if ev is not None:
        add("The eval that ran on the fleet the flush left behind "
            "(`scenarios/eval_after_flush.yaml`: gsm8k, 1,400 questions, starting at 90 s, "
            "about 80 s after the flush):")
        add("")
        add("```")
        for c in EVAL_CMDS:
            add(c)
        add("```")
        add("")
        add(ev_md)
        add("")
    add(SECTION2.format_map(ans))
    add("")
    add("## 3. Which TTLs are safe against a peer that really died")
    add("")
    add(f"From the library matrix (`{command('library')}`). `permanent` is a TTL of "
        "infinity, `never` a TTL of 0.")
    add("")
    ttl_pols = ["never", *[f"ttl(ttl_s={x:g})" for x in TTLS], "permanent"]
    dead = [f for f in ("decode_crash", "decode_nic_down", "decode_hang") if f in lib.faults]
    add("Goodput lost, % of healthy:")
    add("")
    add(pivot(lib, "goodput_lost_pct", 1, faults=dead + ["flush_race"], policies=ttl_pols))
    add("")
    add("Failed requests and requests sent to dead peers:")
    add("")
    add(pivot(lib, "failed", faults=dead + ["flush_race"], policies=ttl_pols))
    add("")
    add(pivot(lib, "dead_peer_writes", faults=dead, policies=ttl_pols))
    add("")
    add("![goodput vs ttl](blacklist_policy_ttl.png)")
    add("")
    add(SECTION3.format_map(ans))
    add("")
    add("## 4. How the answer moves with the chosen inputs")
    add("")
    for name in ("round_robin", "closed_loop"):
        if name not in mats:
            continue
        w = mats[name]
        add(f"**{SETTING[name]}**")
        add("")
        add("```")
        add(command(name))
        if f"{name}_ttl" in MATRICES:
            add(command(f"{name}_ttl"))
        add("```")
        add("")
        add(healthy_line(w))
        add("")
        add(pivot(w, "goodput_lost_pct", 1))
        add("")
        add(ranking_md(w))
        add("")
    add(SECTION4.format_map(ans))
    if rob:
        add("")
        add(f"Worst-case regret across all three settings (the policies and faults every "
            f"setting ran: {', '.join(f'`{f}`' for f in FEW_FAULTS)}; regret against the best "
            "of these policies in that setting, % of that setting's healthy goodput):")
        add("")
        add(rob)
        add("")
        add(ROBUST.format_map(ans))
    add("")
    add("## 5. When the one-strike permanent default is the right choice")
    add("")
    add(SECTION5.format_map(ans))
    add("")
    add("## What this does not say")
    add("")
    add(CAVEATS)
    add("")
    add("Columns (`pdsim whatif --help`, `columns.json` in each matrix directory):")
    add("")
    from pdsim.analysis.whatif_table import COLUMNS, STATS_NOTE

    add(_md(["column", "meaning"], [[f"`{k}`", v] for k, v in COLUMNS.items()]))
    add("")
    add(f"Statistics: {STATS_NOTE}.")
    return "\n".join(L) + "\n"


def _cell(w, policy: str, fault: str, m: str) -> float:
    t = w.table
    row = t[(t.policy == policy) & (t.fault == fault)]
    return float(row[m].iloc[0]) if len(row) else float("nan")


def _same_rows(w, a: str, b: str) -> bool:
    from pdsim.analysis.whatif_table import METRICS

    t = w.table.set_index(["policy", "fault"])
    return all(t.loc[a, m].equals(t.loc[b, m]) for m in METRICS)


class _Missing(dict):
    """A matrix not run yet reads as such in the prose, rather than failing the report."""

    def __missing__(self, key: str) -> str:
        return "(not run)"


def answers(mats: dict, inc: dict) -> dict:
    """The numbers the prose quotes, all read from the matrices."""
    lib = mats["library"]
    rk = lib.ranking.set_index("policy")
    a: dict = {"tie": f"{TIE_PP:g}", "seeds": SEEDS, "inc_seeds": INCIDENT_SEEDS,
               "lib_cmd": command("library")}
    top = lib.ranking.iloc[0]
    a["permanent_place"] = _place(lib.ranking, "permanent")
    a["best"] = top.policy
    a["best_worst"] = f"{top.worst_regret_pct:.1f}"
    same = [p for p in ("strikes_window", "circuit_breaker") if _same_rows(lib, p, "never")]
    a["same_as_never"] = " and ".join(f"`{p}` (defaults)" for p in same) or "no other policy"
    for p in ("permanent", "never", "probe", "v0_5_23", *[f"ttl(ttl_s={x:g})" for x in TTLS]):
        key = p.replace("(ttl_s=", "").replace(")", "")
        a[f"{key}_worst"] = f"{rk.loc[p, 'worst_regret_pct']:.1f}"
        a[f"{key}_worst_fault"] = rk.loc[p, "worst_fault"]
    for p in ("permanent", "never", "ttl(ttl_s=3)", "ttl(ttl_s=10)", "ttl(ttl_s=30)",
              "ttl(ttl_s=120)", "probe"):
        key = p.replace("(ttl_s=", "").replace(")", "")
        for f in lib.faults:
            a[f"{key}_{f}_lost"] = f"{_cell(lib, p, f, 'goodput_lost_pct'):.1f}"
            a[f"{key}_{f}_failed"] = f"{_cell(lib, p, f, 'failed'):,.0f}"
            a[f"{key}_{f}_ttft"] = f"{_cell(lib, p, f, 'ttft_p99_s'):.1f}"
            a[f"{key}_{f}_dead"] = f"{_cell(lib, p, f, 'dead_peer_writes'):,.0f}"
    t = lib.table
    spread = t.groupby("fault", sort=False).goodput_lost_pct.agg(lambda x: x.max() - x.min())
    flat = [f for f in lib.faults if spread[f] <= TIE_PP / 2]
    ge10 = [f"ttl(ttl_s={x:g})" for x in TTLS if x >= 10]
    a["ttl_ge10_ttft"] = f"{max(_cell(lib, p, 'decode_nic_down', 'ttft_p99_s') for p in ge10):.1f}"
    a["crash_dead_max"] = f"{t[t.fault == 'decode_crash'].dead_peer_writes_hi.max():.0f}"
    a["flat"] = ", ".join(f"`{f}`" for f in flat)
    for lbl in ("permanent", "probe", "never", *[f"ttl(ttl_s={x:g})" for x in INCIDENT_TTLS]):
        key = lbl.replace("(ttl_s=", "").replace(")", "")
        a[f"inc_{key}_failed"] = f"{inc[(lbl, 'failed')]:,.0f}"
        a[f"inc_{key}_empty"] = f"{inc[(lbl, 'ci_bench.empty_share')]:.2f}"
        a[f"inc_{key}_toks"] = f"{inc[(lbl, 'ci_bench.true_output_throughput_tok_s')]:,.0f}"
        a[f"inc_{key}_pairs"] = f"{inc[(lbl, 'blacklisted_pairs_max')]:,.0f}"
    long = [x for x in INCIDENT_TTLS
            if inc[(f"ttl(ttl_s={x:g})", "failed")] == inc[("permanent", "failed")]]
    a["inc_long"] = f"{min(long):g}" if long else "none"
    for name in ("round_robin", "closed_loop", "thresholds"):
        w = mats.get(name)
        if w is None:
            continue
        r = w.ranking
        a[f"{name}_best"] = r.iloc[0].policy
        for x in r.itertuples():
            key = x.policy.replace("(ttl_s=", "").replace(")", "")
            a[f"{name}_{key}_worst"] = f"{x.worst_regret_pct:.1f}"
            a[f"{name}_{key}_worst_fault"] = x.worst_fault
        a[f"{name}_rank"] = ", ".join(f"`{x.policy}` {x.worst_regret_pct:.1f} "
                                      f"({_fault(x.worst_fault)})" for x in r.itertuples())
        for p, _ in w.policies:
            key = p.replace("(ttl_s=", "").replace(")", "")
            for f in w.faults:
                a[f"{name}_{key}_{f}_lost"] = f"{_cell(w, p, f, 'goodput_lost_pct'):.1f}"
                a[f"{name}_{key}_{f}_failed"] = f"{_cell(w, p, f, 'failed'):,.0f}"
                a[f"{name}_{key}_{f}_ttft"] = f"{_cell(w, p, f, 'ttft_p99_s'):.1f}"
    common_ttls = [x for x in TTLS if all(f"ttl(ttl_s={x:g})" in dict(mats[k].policies)
                                          for k in SETTINGS if k in mats)]
    safe, unsafe = [], []
    for x in common_ttls:
        lbl, bad = f"ttl(ttl_s={x:g})", []
        for k in SETTINGS:
            if k not in mats:
                continue
            mine = _cell(mats[k], lbl, "decode_nic_down", "goodput_lost_pct")
            perm = _cell(mats[k], "permanent", "decode_nic_down", "goodput_lost_pct")
            if mine > perm + TIE_PP:
                bad.append(f"{mine:.1f}% against {perm:.1f}% {SETTING_SHORT[k]}")
        if bad:
            unsafe.append(f"TTL {x:g} s ({'; '.join(bad)})")
        else:
            safe.append(f"{x:g} s")
    cb1 = "circuit_breaker(failures=1)"
    if cb1 in rk.index:
        a["thr_note"] = (
            f" At the base load a circuit breaker that opens on the first failure (`{cb1}`: "
            f"5 s cooldown, one trial, backoff ×2) comes close to TTL 10 s: worst regret "
            f"{rk.loc[cb1, 'worst_regret_pct']:.1f} points, p99 TTFT "
            f"{_cell(lib, cb1, 'decode_nic_down', 'ttft_p99_s'):.1f} s under `decode_nic_down`"
            f"; `strikes_window(strikes=1)` is `permanent` (no TTL), and at two failures "
            f"within 10 s both stay within a point of `never` on every fault. These lower "
            f"thresholds ran at the base load only.")
    else:
        a["thr_note"] = ""
    a["safe_ttls"] = ", ".join(safe) or "none"
    a["unsafe_ttls"] = "; ".join(unsafe) or "none"
    wins = []
    for name, w in mats.items():
        if name == "thresholds" or "permanent" not in dict(w.policies):
            continue
        for f in w.faults:
            if _within(w.table, f, "permanent", TIE_PP):
                wins.append(f"`{f}` ({name.replace('_', ' ')})")
    a["perm_ok"] = ", ".join(wins) or "none"
    return a


SETTING = {"round_robin": "Decode DP balancing `round_robin` instead of `total_tokens`",
           "closed_loop": "The incident's closed-loop load (rate inf, 256 in flight, 6,000 "
                          "prompts) instead of Poisson 18 req/s"}


ANSWERS = """\
- **Which policy minimises worst-case harm** (§1, §4): a short TTL. Across the three settings
  run (open loop with `total_tokens` or `round_robin` decode balancing, and the incident's
  closed loop), the lowest worst-case goodput regret is {robust}'s, with TTL 3 s
  ({ttl3_x_worst} points of healthy goodput) and TTL 10 s ({ttl10_x_worst}) within a point of
  each other; then `permanent` ({permanent_x_worst}), TTL 30 s ({ttl30_x_worst}) and `never`
  ({never_x_worst}). Each extreme wins one setting and loses another: at the open-loop base
  load `never` has zero regret (tied with {same_as_never}, which never trip at this load) and
  `permanent` ranks {permanent_place} ({permanent_worst}, at `{permanent_worst_fault}`); under the
  closed loop `never` loses {closed_loop_never_decode_nic_down_lost}% of goodput under
  `decode_nic_down` (requests waiting on a dead KV path hold the client's 256 slots) and
  `permanent` {closed_loop_permanent_flush_race_lost}% under `flush_race`.
- **What the short holds cost: tail latency while a KV path is dead.** Under
  `decode_nic_down` the p99 TTFT of the requests that complete is
  {never_decode_nic_down_ttft} / {round_robin_never_decode_nic_down_ttft} /
  {closed_loop_never_decode_nic_down_ttft} s with `never` (open loop / round-robin / closed
  loop), {ttl10_decode_nic_down_ttft} / {round_robin_ttl10_decode_nic_down_ttft} /
  {closed_loop_ttl10_decode_nic_down_ttft} s with TTL 10 s and
  {permanent_decode_nic_down_ttft} / {round_robin_permanent_decode_nic_down_ttft} /
  {closed_loop_permanent_decode_nic_down_ttft} s with `permanent`: requests queue behind writes
  that wait out the 30 s transfer timeout. No policy run is best on both; choose the TTL by
  which of the two an outage should cost.
- **A TTL in the drop-timeout incident** (§2): failed requests (median of seeds 1–{inc_seeds})
  {inc_permanent_failed} as shipped; {inc_ttl5_failed} with TTL 5 s, {inc_ttl10_failed} with
  10 s, {inc_ttl30_failed} with 30 s (the same as a 30 s probe: {inc_probe_failed}); TTLs of
  {inc_long} s or more change nothing within the flushing run, which ends before its entries
  expire, but the eval that ran afterwards needed {ev_permanent_requests} requests for 1,400
  questions as shipped and {ev_ttl60_requests} with a TTL of 30 or 60 s (shorter TTLs not
  run; at the eval's chosen start, 90 s after the flush). `never`: {inc_never_failed}.
- **TTLs safe against a decode that really died** (§3): against a crash, every TTL (and
  `never`): a crashed decode fails its own requests, refuses new ones at bootstrap and comes
  back under new session ids, so no policy moves goodput (lost {permanent_decode_crash_lost}%
  for all at the base load). Against a peer that keeps taking work it cannot receive
  (`decode_nic_down`), the TTLs that lost no more goodput than `permanent` (beyond {tie}
  point) in every setting are {safe_ttls}; the others lost more: {unsafe_ttls}. A TTL
  comparable to the 30 s transfer timeout lets each expiry start another wait on the dead
  path, which under the closed loop holds a client slot. By tail latency only the long holds
  are safe (above).
- **When one-strike `permanent` is right** (§5): never the best of the policies run; it ties
  (within {tie} point) only where no policy matters ({perm_ok}). It beats `never` where waiting
  on a dead KV path holds scarce client slots, and it keeps p99 TTFT lowest while a KV path is
  dead; it loses wherever failures are transient (flush race, flaps, slow NIC, rare errors),
  because it keeps healthy pairs out for the rest of the run."""

SECTION1 = """\
Reading the tables. The policies' goodput differs by less than half a point under {flat}:
the crashed decode fails its own requests and refuses new ones at bootstrap (at most
{crash_dead_max} write per seed reaches it), the hung decode pre-allocates nothing while hung
(so almost nothing is written to it; the stall costs latency, p99 TTFT ~44 s, whatever the
policy), and the partition's heartbeat loss fails the rooms across it and re-registration
clears the entries when it heals. Where they do separate,
the harm is false positives: a pair blacklisted by a transient failure (the flush race, a 2 s
link flap, a slow NIC, a rare `ret != 0`) stays out, and every request the balancer then
routes over it runs its prefill and fails at the transfer stage ("Decode instance could be
dead"). Under `decode_nic_down` the pairs are really dead for 120 s, yet `permanent` loses
{permanent_decode_nic_down_lost}% of goodput ({permanent_decode_nic_down_failed} failed
requests) against {never_decode_nic_down_lost}% ({never_decode_nic_down_failed}) for `never`:
with `total_tokens` DP balancing the dead rank's requests stuck in transfer count as load, so
without a blacklist the balancer sends that rank less; with one, its requests fail fast, the
rank looks idle and draws more (the black hole of the incident). `round_robin` balancing (§4)
takes that away and `permanent`'s loss there falls to
{round_robin_permanent_decode_nic_down_lost}%."""

SECTION2 = """\
The flush caught {inc_permanent_pairs} pairs (median); under the shipped one-strike
blacklist every later request over them failed. A TTL shortens each stay to ttl_s: at 5 s
the flushing run's failed requests fall to {inc_ttl5_failed} (median) from
{inc_permanent_failed} and its generated throughput rises to {inc_ttl5_toks} tok/s from
{inc_permanent_toks}. TTL and a fixed probe of
the same period give the same rows here, because a pair blacklisted by the flush is healthy
at once, so the first probe succeeds. The flushing bench ends about 50 s after the flush: a
TTL of {inc_long} s or more is indistinguishable from `permanent` within it. In the
incident's CI job an eval followed the bench on the same fleet (`eval_after_flush.yaml`, the
table above): there the eval's requests over dead pairs failed and were retried,
{ev_permanent_requests} requests for 1,400 questions ({ev_permanent_failed} failed) as
shipped; a TTL of 30 or 60 s, shorter than the gap between flush and eval, brings it to
{ev_ttl30_requests} and {ev_ttl60_requests} ({ev_ttl60_failed} failed); 120 s or more does not
({ev_ttl120_requests}). `never` leaves only the transfers the flush itself doomed
({inc_never_failed} failed requests in the flushing run)."""

SECTION3 = """\
A crash (`decode_crash`) is the case a one-strike blacklist is meant for, and in this model
the policy makes no difference there, because almost nothing is written to the crashed
decode: the prefill writes only to a decode that pre-allocated KV for the request, a dead
process pre-allocates nothing, and the restarted server registers new sessions (at most
{crash_dead_max} write per seed met the dead process). So every TTL is safe against a crash at
this load. The case where the TTL's length matters is a peer that keeps accepting requests
but whose KV endpoint is gone (`decode_nic_down`): each write to it holds a transfer queue for
up to 30 s. There goodput lost grows with the TTL ({ttl3_decode_nic_down_lost},
{ttl10_decode_nic_down_lost}, {ttl30_decode_nic_down_lost}, {ttl120_decode_nic_down_lost}% for
3, 10, 30, 120 s; the black hole of §1) while p99 TTFT falls ({ttl3_decode_nic_down_ttft},
{ttl10_decode_nic_down_ttft}, {ttl30_decode_nic_down_ttft}, {ttl120_decode_nic_down_ttft} s):
after each expiry the next request meets the dead path again and holds its queue for the
timeout ({ttl3_decode_nic_down_dead} requests sent to the dead peer at 3 s,
{ttl10_decode_nic_down_dead} at 10 s, {permanent_decode_nic_down_dead} under `permanent`);
at 3 s those writes come often enough that requests queue behind them as under `never`.
Read as "no worse than `permanent` on goodput and no worse than a few hundred ms on p99 TTFT
while a KV path is dead", the safe TTLs at this load are 10–30 s; §4 shows that neither
half survives every setting (TTL 10 s and 30 s lose more goodput than `permanent` under the
closed loop, and TTL 10 s lets p99 TTFT grow with `round_robin` and under the closed
loop)."""

SECTION4 = """\
Decode balancing moves `permanent`'s loss under `decode_nic_down`
({permanent_decode_nic_down_lost}% with `total_tokens`,
{round_robin_permanent_decode_nic_down_lost}% with `round_robin`: the black hole is gone) and
`never`'s latency there (p99 TTFT {never_decode_nic_down_ttft} s and
{round_robin_never_decode_nic_down_ttft} s: requests keep being dealt to the dead rank). The
closed loop moves the most: waiting on a dead path now costs goodput, not only latency.
Worst-case regret with `round_robin`: {round_robin_rank}. Under the closed loop:
{closed_loop_rank}."""

ROBUST = """\
Across the three settings the lowest worst-case regret is {robust}'s. The open-loop winner
(`never`) loses most under the closed loop, where requests waiting on a dead KV path hold
concurrency slots; `permanent` loses most in the open loop, where the black hole draws work to
the pairs it fails fast; a TTL close to the 30 s transfer timeout (30 s) is the worst of the
TTLs under the closed loop, because each expiry starts another 30 s wait on the dead path."""

SECTION5 = """\
One strike, forever, is not the best of the policies run under any fault in any setting; it
ties (within {tie} point of the best) only on {perm_ok}, where no policy changes anything. Its
case is a failure that is real and lasting, costly to wait on, and rare to be transient: then
it spends one write per pair and keeps p99 TTFT low (`decode_nic_down` in the closed loop:
{closed_loop_permanent_decode_nic_down_lost}% goodput lost, p99 TTFT
{closed_loop_permanent_decode_nic_down_ttft} s, against `never`'s
{closed_loop_never_decode_nic_down_lost}% and {closed_loop_never_decode_nic_down_ttft} s). But
a TTL of 3–10 s loses less goodput there too ({closed_loop_ttl3_decode_nic_down_lost}% and
{closed_loop_ttl10_decode_nic_down_lost}%), and every transient fault in the library (flush
race, link flaps, a slow NIC, rare `ret != 0`) turns one strike into the largest loss of the
matrix ({permanent_worst} points at `{permanent_worst_fault}`). The crash it was meant for is
handled without it: the dead process takes no new requests and comes back under new session
ids. Keep it where the transfer engine's failures are known to be lasting and the clients
hold few slots; otherwise bound the stay.{thr_note}"""

CAVEATS = """\
- Goodput counts only completed requests; latency is in `ttft_p99_s`. Under `never` the
  requests queued behind dead writes complete because the 120 s outage is shorter than the
  decode's 300 s waiting timeout (`transfer.waiting_timeout_s`); outages longer than that
  were not run here.
- `strikes_window` and `circuit_breaker` below their defaults (3 failures within 10 s) ran
  at the base load only (`thresholds` in the script, merged into the §1 tables).
- The decode balancer and the load move the answer (§4); other fleets (more decode servers
  per prefill, fewer sessions per transfer queue) were not run.
- One fleet (2P2D, 64 pairs), one load level in §1, three seeds: the intervals in the tables
  are over those seeds only.
- The flush race and the drop-timeout replay depend on how many transfers are in flight at the
  flush; see `reports/drop_timeout.md` for how that moves with the start offset of the two
  bench runs."""


if __name__ == "__main__":
    main()

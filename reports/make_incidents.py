"""Regenerate reports/incidents.md: per incident of scenarios/incidents/, which reported figures
the model reaches and for what share of its declared unknowns ("none" included), under the
incident's own behaviour and under its _fixed twin, with the replay at the nominal values.

    python reports/make_incidents.py              # tables from the stored runs + the replays
    python reports/make_incidents.py --explore    # explore every incident and twin first
    python reports/make_incidents.py --no-replay  # tables from the stored runs only

``--explore`` runs, per scenario, exactly ``pdsim explore scenarios/incidents/<name>.yaml
--samples 32 --seeds 2`` (the full runs go to reports/explore/incidents/<name>/, git-ignored,
so a rerun resumes) and keeps a compact copy (the unknowns' values, the seed, the figures) in
reports/incidents_runs/<name>.csv, which is committed; the tables are recomputed from those
CSVs with ``pdsim.analysis.explore.analyse``, the code ``pdsim explore`` prints them with. The
whole of incidents.md is generated. On a shared 2-core host ``--explore`` takes 6-12 minutes
(768 runs, two workers; 11.4 minutes under ``nice -n 10`` beside other jobs on 2026-12-07);
the tables and replays alone about 10 s.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
OUT = Path(__file__).resolve().parent
REPORT = OUT / "incidents.md"
STORE = OUT / "explore" / "incidents"  # full explorations (git-ignored)
RUNS = OUT / "incidents_runs"          # their compact copies (committed)
SAMPLES, SEEDS = 32, 2
# incident -> (title, what its _fixed twin changes)
INCIDENTS = {
    "abort_storm": ("The abort storm (PR #28651)",
                    "PR #28651: a prefill abort notifies the decode"),
    "stuck_transferring": ("Receivers stuck in Transferring (PR #31800)",
                           "PR #31800: the waiting timeout also fires in Transferring"),
    "small_decode_window": ("Bootstrap timeouts under a small decode window (#9726, #10110; "
                            "TokenSpeed's figures)",
                            "PR #29017: the router cancels the decode leg when the prefill "
                            "leg fails"),
    "prefill_restart": ("A prefill restarted behind a stable address (PR #34289, #36029)",
                        "PR #34289: the heartbeat compares the prefill's instance id"),
    "dual_dispatch_hang": ("The router's dual-dispatch hang (PR #29482)",
                           "PR #29482's behaviour: a failed decode leg drops the prefill leg"),
    "sticky_blacklist": ("The sticky blacklist (#13054)",
                         "PR #25287's failed-session probe, as 0.5.23 runs it"),
}


def _command(name: str) -> str:
    return f"pdsim explore scenarios/incidents/{name}.yaml --samples {SAMPLES} --seeds {SEEDS}"


def _git_head() -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _fmt(x: object) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    x = float(x)
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _pct(x: float) -> str:
    return "none" if x == 0 else f"{100 * x:.0f}%" if x >= 0.1 else f"{100 * x:.1f}%"


def explore(name: str) -> None:
    """Run (or resume) one scenario's exploration and store its compact runs."""
    import pdsim
    from pdsim.analysis import explore as explore_mod

    sc = pdsim.load(ROOT / f"scenarios/incidents/{name}.yaml")
    ex = pdsim.explore(ROOT / f"scenarios/incidents/{name}.yaml", samples=SAMPLES,
                       seeds=SEEDS, out=STORE / name, workers=2)
    figs = explore_mod.judged(sc.reference)
    extra = ["failed", "unfinished", "incident.stuck_requests", "incident.dead_rooms",
             "incident.recovered", "incident.recovery_s"]
    cols = ["sample", "seed", *[u.path for u in sc.unknowns], *[f.metric for f in figs],
            *[c for c in extra if c in ex.runs]]
    RUNS.mkdir(exist_ok=True)
    ex.runs[list(dict.fromkeys(cols))].to_csv(RUNS / f"{name}.csv", index=False)
    meta_path = RUNS / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    meta[name] = {"command": _command(name), "commit": _git_head(), "design": ex.design,
                  "runs": len(ex.runs)}
    meta_path.write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")


def load(name: str):
    """The stored runs of one scenario, analysed as ``pdsim explore`` does."""
    import pdsim
    from pdsim.analysis import explore as explore_mod

    sc = pdsim.load(ROOT / f"scenarios/incidents/{name}.yaml")
    path = RUNS / f"{name}.csv"
    if not path.exists():
        raise SystemExit(f"{path.relative_to(ROOT)} missing: run with --explore")
    runs = pd.read_csv(path)
    return explore_mod.analyse(sc, runs, seeds=sorted(runs.seed.unique().tolist()),
                               design="sobol-0")


def figures_table(broken, fixed) -> list[str]:
    """Per figure: the band, the share of each scenario's runs within it, their medians."""
    lines = ["| figure | reported | within: incident | within: fixed | median: incident | "
             "median: fixed |", "|---|---|---|---|---|---|"]
    if not len(broken.acceptance):
        return [*lines, "| (no reported figure with a band and a metric) | | | | | |"]
    ab = broken.acceptance.set_index("figure")
    af = fixed.acceptance.set_index("figure")
    for fid in ab.index:
        b = ab.loc[fid]
        if fid == "all":
            lines.append(f"| all jointly | | {_pct(b.share_within)} | "
                         f"{_pct(af.loc[fid].share_within)} | | |")
            continue
        f = af.loc[fid]
        lines.append(f"| {b.label} | {_fmt(b.reported)} ± {_fmt(b.band)} | "
                     f"{_pct(b.share_within)} | {_pct(f.share_within)} | "
                     f"{_fmt(b.sim_median)} | {_fmt(f.sim_median)} |")
    return lines


def region_lines(ex) -> list[str]:
    """Where the runs reproducing every figure lie, or "none"."""
    if not len(ex.figures):
        return ["No reported figure has a band: nothing to accept or reject."]
    reg = ex.region
    n = int(reg.accepted_runs.iloc[0]) if len(reg) else 0
    if not n:
        return ["Accepted region (runs reproducing every figure): **none** of the "
                f"{len(ex.runs)} runs."]
    lines = [f"Accepted region: {n} of {len(ex.runs)} runs reproduce every figure, at:", "",
             "| unknown | declared | accepted: min / median / max (or values) |",
             "|---|---|---|"]
    for r in reg.itertuples(index=False):
        got = (f"{_fmt(r.min)} / {_fmt(r.median)} / {_fmt(r.max)}"
               if isinstance(getattr(r, "min", None), float) and not np.isnan(r.min)
               else str(getattr(r, "values", "")))
        lines.append(f"| `{r.unknown}` | {r.prior} | {got} |")
    return lines


def harm_line(broken, fixed) -> str:
    """How often each scenario's runs kept a dead room or stayed unrecovered."""
    def share(ex, col, pred):
        v = ex.runs[col] if col in ex.runs else None
        return _pct(float(pred(v).mean())) if v is not None and len(v) else "–"

    dead = share(broken, "incident.dead_rooms", lambda v: v > 0)
    dead_f = share(fixed, "incident.dead_rooms", lambda v: v > 0)
    rec = share(broken, "incident.recovered", lambda v: v.astype(str) != "True")
    rec_f = share(fixed, "incident.recovered", lambda v: v.astype(str) != "True")
    return (f"Across the unknowns' space: runs with a dead room {dead} (incident) and "
            f"{dead_f} (fixed); runs not recovered within the run {rec} (incident) and "
            f"{rec_f} (fixed; no trigger window counts as not recovered).")


def replay_lines(name: str) -> list[str]:
    """Both scenarios at their nominal values (what ``pdsim run`` prints): failed requests
    beside those left unanswered (a run that leaves requests stuck fails fewer than its fix),
    the recovery as the report says it, and each reported figure with its verdict."""
    import pdsim
    from pdsim.output import incident_report
    from pdsim.output.report import _get

    rows = ["| run (nominal) | failed | unanswered at the end | dead rooms (most at once, "
            "longest s) | recovery |", "|---|---|---|---|---|"]
    figures = []
    for n in (name, f"{name}_fixed"):
        res = pdsim.run(ROOT / f"scenarios/incidents/{n}.yaml")
        s = res.summary
        inc = s.get("incident", {})
        recovery = ("no trigger window" if inc.get("trigger_from_s") is None
                    else "no goodput before the trigger" if inc.get("base_goodput_tok_s") is None
                    else incident_report.recovery_text(s))
        rows.append(f"| `pdsim run scenarios/incidents/{n}.yaml` | {s['failed']:,} | "
                    f"{incident_report.unanswered_text(s) or 0} | "
                    f"{inc.get('dead_rooms', 0):,} ({inc.get('dead_rooms_max', 0)}, "
                    f"{_fmt(inc.get('dead_room_held_max_s', 0))}) | {recovery} |")
        said = []
        for r in res.scenario.reference:
            if r.metric and r.limit is not None:
                v = _get(s, r.metric)
                v = int(v) if isinstance(v, bool) else v
                ok = r.within(v)
                said.append(f"{r.label}: {_fmt(v)} ("
                            + ("no value" if ok is None else "within" if ok else "outside")
                            + f" {_fmt(r.reported)} ± {_fmt(r.limit)})")
        if said:
            figures.append(f"At the nominal values, `{n}`: " + "; ".join(said) + ".")
    for line in figures:
        rows += ["", line]
    return rows


def render(replay: bool) -> str:
    meta_path = RUNS / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    out = ["# The incident library: what the model reaches", "",
           "Generated by `python reports/make_incidents.py` (do not edit: rerun it). Each "
           "incident of `scenarios/incidents/` declares what its sources omit as unknowns "
           "(ranges, nominal values, why: in the scenario's header and keys); `pdsim explore` "
           f"samples them ({SAMPLES} Sobol points x seeds 1-{SEEDS}) for the incident and for "
           "its `_fixed` twin (the same unknowns, the PR's behaviour). A share is of those "
           "runs (each an equal-weight draw from the ranges): how much of what the sources "
           "leave open gives the reported figure, **none** included. Nothing was tuned to a "
           "figure; a figure marked as another engine's (TokenSpeed) is that engine's.",
           "", "Sources, mechanisms and versions: docs/pd_paths.md. Causal checks: "
           "tests/test_incidents.py.", ""]
    for name, (title, fix) in INCIDENTS.items():
        broken, fixed = load(name), load(f"{name}_fixed")
        m = meta.get(name, {})
        out += [f"## {title}", "",
                f"`scenarios/incidents/{name}.yaml`; fixed twin: {fix} "
                f"(`{name}_fixed.yaml`). Reproduce: `{_command(name)}` (and the same on "
                f"`{name}_fixed.yaml`); explored at commit {m.get('commit', '?')}.", ""]
        unk = ", ".join(f"`{u.path}` {u.describe()}" for u in broken.unknowns)
        out += [f"Unknowns: {unk}.", ""]
        out += figures_table(broken, fixed) + [""]
        out += region_lines(broken) + [""]
        out += [harm_line(broken, fixed), ""]
        if replay:
            out += replay_lines(name) + [""]
    return "\n".join(out).rstrip() + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--explore", action="store_true", help="explore every incident and twin "
                    "first (resumable; 6-12 minutes on 2 cores)")
    ap.add_argument("--no-replay", action="store_true", help="no run at the nominal values")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    if args.explore:
        for name in INCIDENTS:
            for n in (name, f"{name}_fixed"):
                print(f"exploring {n}", file=sys.stderr)
                explore(n)
    REPORT.write_text(render(not args.no_replay))
    print(f"wrote {REPORT.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

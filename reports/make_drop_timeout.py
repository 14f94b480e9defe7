"""Regenerate reports/drop_timeout.md: the stories explored, the replay, its figures.

    python reports/make_drop_timeout.py             # tables from the stored runs + the replay
    python reports/make_drop_timeout.py --explore   # explore every story first (resumable)
    python reports/make_drop_timeout.py --no-replay # story tables only (no simulation at all)

``--explore`` runs, per story, exactly ``pdsim explore scenarios/<story>.yaml --samples N
--seeds 2`` (N in SAMPLES below; the full runs go to reports/explore/<story>/, git-ignored, so a
rerun resumes) and stores a compact copy of its runs (the unknowns' values, the seed and the
figures) in reports/explore_runs/<story>.csv, which is committed: the tables are recomputed
from those CSVs with ``pdsim.analysis.explore.analyse``, the same code ``pdsim explore`` prints them
with. The tables between the ``<!-- begin:NAME -->`` / ``<!-- end:NAME -->`` markers of
drop_timeout.md are rewritten; the prose around them is not. The figures (PNG) are rewritten.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import subprocess
import sys
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd

import pdsim
from pdsim.analysis import explore as explore_mod
from pdsim.analysis.explore_stats import fmt_s1
from pdsim.output import plots, report

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = Path(__file__).resolve().parent
REPORT = OUT / "drop_timeout.md"
STORE = OUT / "explore"          # full explorations (git-ignored)
RUNS = OUT / "explore_runs"      # their compact copies (committed)
STORIES = {
    "story_bench_alone": "(i) the CI bench alone; its flush follows its own warmup",
    "story_eval_running": "(ii) the CI's gsm8k eval running when the bench flushes",
    "story_two_benches": "(iii) two overlapping CI bench runs",
    "story_outside_flush": "(iv) an outside caller's flush during the bench",
}
# samples per story (x 2 seeds): the same for every story, so that stories are compared with
# matched priors (ABC model choice: equal draws from each story's declared ranges)
SAMPLES = {"story_bench_alone": 128, "story_eval_running": 128, "story_two_benches": 128,
           "story_outside_flush": 128}
SEEDS_PER_SAMPLE = 2
TIMING = {"story_eval_running": "clients.1.start_s", "story_two_benches": "clients.1.start_s",
          "story_outside_flush": "operator_flushes.0.at_s", "story_bench_alone": "model.layers"}
EXTRA = ["blacklisted_pairs_max", "flush_doomed_transfers", "transfer_failures",
         "clients.ci_bench.output_throughput_tok_s", "clients.ci_bench.successful_requests"]
MAIN = "drop_timeout"  # the story the exploration supports best, at its stated nominal values
SEEDS = range(1, 11)


def _git_head() -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _fmt(x: float, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and not np.isfinite(x)):
        return "–"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


def _pct(x: float) -> str:
    return "none" if x == 0 else f"{100 * x:.0f}%" if x >= 0.1 else f"{100 * x:.1f}%"


def _command(name: str) -> str:
    return (f"pdsim explore scenarios/{name}.yaml --samples {SAMPLES[name]} "
            f"--seeds {SEEDS_PER_SAMPLE}")


def explore_story(name: str, from_store: bool = False, commit: str | None = None) -> None:
    """Run (or resume) the story's exploration and store its compact runs.

    ``from_store``: no new run; compact the runs already in reports/explore/<story>/ (those of
    the newest pdsim version stored there), e.g. after a refactor that moves no output."""
    sc = pdsim.load(ROOT / f"scenarios/{name}.yaml")
    if from_store:
        runs = explore_mod.read_runs(STORE / name / "runs.parquet")
        runs = runs[runs["sample"].lt(SAMPLES[name])
                    & runs["seed"].isin(range(1, SEEDS_PER_SAMPLE + 1))]
        hashes = runs.groupby("scenario_hash").size()
        runs = runs[runs.scenario_hash == hashes.idxmax()]
        if len(runs) != SAMPLES[name] * SEEDS_PER_SAMPLE:
            raise SystemExit(f"{name}: {len(runs)} stored runs, expected "
                             f"{SAMPLES[name] * SEEDS_PER_SAMPLE}: run with --explore")
        runs = runs.sort_values(["sample", "seed"]).reset_index(drop=True)
        design = str(runs.design.iloc[0])
    else:
        ex = pdsim.explore(ROOT / f"scenarios/{name}.yaml", samples=SAMPLES[name],
                           seeds=SEEDS_PER_SAMPLE, out=STORE / name)
        runs, design = ex.runs, ex.design
    figs = explore_mod.judged(sc.reference)
    cols = ["sample", "seed", *[u.path for u in sc.unknowns], *[f.metric for f in figs],
            *[c for c in EXTRA if c in runs]]
    RUNS.mkdir(exist_ok=True)
    runs[list(dict.fromkeys(cols))].to_csv(RUNS / f"{name}.csv", index=False)
    meta_path = RUNS / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    meta[name] = {"command": _command(name), "commit": commit or _git_head(),
                  "design": design, "runs": len(runs)}
    meta_path.write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")


def load_story(name: str) -> explore_mod.Exploration:
    """The story's stored runs, analysed as ``pdsim explore`` does."""
    sc = pdsim.load(ROOT / f"scenarios/{name}.yaml")
    path = RUNS / f"{name}.csv"
    if not path.exists():
        raise SystemExit(f"{path.relative_to(ROOT)} missing: run with --explore")
    runs = pd.read_csv(path)
    ex = explore_mod.analyse(sc, runs, seeds=sorted(runs.seed.unique().tolist()),
                             design="sobol-0")
    return ex


def most_jointly(ex: explore_mod.Exploration) -> str:
    """The largest sets of figures some runs reproduce together, and their share."""
    within = pd.DataFrame({f"F{i + 1}": explore_mod._within(ex.runs, f)
                           for i, f in enumerate(ex.figures)})
    for k in range(len(ex.figures), 0, -1):
        hits = []
        for combo in itertools.combinations(within.columns, k):
            share = float(within[list(combo)].all(axis=1).mean())
            if share > 0:
                hits.append(f"{'+'.join(combo)} {_pct(share)}")
        if hits:
            return ", ".join(hits)
    return "none"


FAILURE_COUNTS = ("F1", "F2")  # ret != 0 and failed requests: what the fitted nominals match


def partial_region(ex: explore_mod.Exploration, best: tuple = FAILURE_COUNTS) -> list[str]:
    """Where the runs reproducing both failure counts lie, and what the other figures are
    there (when at least a few runs do)."""
    within = pd.DataFrame({f"F{i + 1}": explore_mod._within(ex.runs, f)
                           for i, f in enumerate(ex.figures)})
    sel = ex.runs[within[list(best)].all(axis=1)]
    if len(sel) < 4:  # a region needs a few runs to describe
        return []
    lines = [f"Where {' and '.join(best)} hold together ({len(sel)} of {len(ex.runs)} runs):",
             "", "| unknown | declared | those runs: min / median / max (or counts) |",
             "|---|---|---|"]
    for u in ex.unknowns:
        v = sel[u.path]
        if u.numeric:
            got = f"{_fmt(float(v.min()))} / {_fmt(float(v.median()))} / {_fmt(float(v.max()))}"
        else:
            got = ", ".join(f"{c} {int((v == c).sum())}" for c in u.choices)
        lines.append(f"| `{u.path}` | {u.describe()} | {got} |")
    rest = [f for f in within.columns if f not in best]
    for f in rest:
        fig = ex.figures[int(f[1:]) - 1]
        x = pd.to_numeric(sel[fig.metric], errors="coerce")
        lines.append("")
        lines.append(f"There {f} ({fig.label}, reported {_fmt(fig.reported)} ± "
                     f"{_fmt(fig.limit)}) is {_fmt(float(x.min()))}–{_fmt(float(x.max()))} "
                     f"(median {_fmt(float(x.median()))}).")
    lines.append("")
    return lines


def choice_table(exs: dict[str, explore_mod.Exploration]) -> str:
    """Which story the figures favour: ABC model choice with matched priors (equal draws per
    story, equal prior weight), for all four figures and for the two failure counts."""
    from pdsim.analysis.explore_stats import model_choice

    rules = {"all four figures": None, "both failure counts (F1+F2)": FAILURE_COUNTS}
    out = ["| story | draws (x seeds) | " + " | ".join(
        f"{r}: accepted runs (points), posterior [95%]" for r in rules) + " |",
        "|---|---|" + "---|" * len(rules)]
    tables = {}
    for rule, figs in rules.items():
        acc = {}
        for name, ex in exs.items():
            within = pd.DataFrame({f"F{i + 1}": explore_mod._within(ex.runs, f)
                                   for i, f in enumerate(ex.figures)})
            cols = list(within.columns) if figs is None else list(figs)
            acc[name] = pd.DataFrame({"sample": ex.runs["sample"].to_numpy(),
                                      "accepted": within[cols].all(axis=1).to_numpy()})
        tables[rule] = model_choice(acc).set_index("story")
    for name in exs:
        first = tables[next(iter(rules))].loc[name]
        cells = [f"{STORIES[name].split(' ', 1)[0]} `{name}`",
                 f"{int(first.draws)} (x {int(first.runs / max(first.draws, 1))})"]
        for rule in rules:
            t = tables[rule].loc[name]
            post = ("undefined (no story accepts a run)" if not np.isfinite(t.posterior)
                    else f"{t.posterior:.2f} [{t.posterior_lo:.2f}, {t.posterior_hi:.2f}]")
            cells.append(f"{int(t.accepted_runs)} ({int(t.accepted_points)}): {post}")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + (
        "\n\nPosterior probability of each story given the figures, with equal prior weight "
        "per story and each story's prior its declared ranges (ABC model choice by rejection, "
        "pdsim.analysis.explore_stats.model_choice): a story's acceptance rate over the sum of "
        "all stories'. Matched priors: every story has the same number of draws (a prefix of "
        "its Sobol design) x 2 seeds. Interval: 95% bootstrap over each story's sample points "
        "(a point's seeds together), 2,000 resamples.")


def story_table(exs: dict[str, explore_mod.Exploration]) -> str:
    """One row per story: the share of its unknowns' space reproducing each figure."""
    first = next(iter(exs.values()))
    figs = first.figures
    head = ["story", "unknowns", *[f"F{i + 1}" for i in range(len(figs))],
            "F1+F2 (both failure counts)", "all jointly", "most figures jointly"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, ex in exs.items():
        acc = ex.acceptance.set_index("figure").share_within
        unk = ", ".join(f"`{u.path}`" for u in ex.unknowns)
        both = (explore_mod._within(ex.runs, figs[0]) & explore_mod._within(ex.runs, figs[1]))
        cells = [f"{STORIES[name]} (`{name}.yaml`)", unk,
                 *[_pct(acc[f"F{i + 1}"]) for i in range(len(figs))], _pct(float(both.mean())),
                 _pct(acc["all"]), most_jointly(ex)]
        lines.append("| " + " | ".join(cells) + " |")
    legend = "; ".join(f"F{i + 1} = {f.label} {_fmt(f.reported)} ± {_fmt(f.limit)}"
                       for i, f in enumerate(figs))
    return "\n".join(lines) + f"\n\nBands: {legend}."


def story_detail(name: str, ex: explore_mod.Exploration) -> str:
    """Per story: figures' spread, accepted region, where in each unknown a figure fits."""
    n = len(ex.runs)
    out = [f"`{_command(name)}` ({n} runs)", ""]
    out += ["| figure | reported | share within band | simulated p10 / median / p90 |",
            "|---|---|---|---|"]
    for r in ex.acceptance.itertuples():
        if r.figure == "all":
            out.append(f"| all jointly | | {_pct(r.share_within)} | |")
        else:
            out.append(f"| {r.figure} {r.label} | {_fmt(r.reported)} ± {_fmt(r.band)} | "
                       f"{_pct(r.share_within)} | {_fmt(r.sim_p10)} / {_fmt(r.sim_median)} / "
                       f"{_fmt(r.sim_p90)} |")
    out.append("")
    acc = int(ex.region.accepted_runs.iloc[0]) if len(ex.region) else 0
    if acc:
        out += [f"Accepted region ({acc} of {n} runs within every band):", "",
                "| unknown | declared | accepted: min / median / max (or values) |",
                "|---|---|---|"]
        for r in ex.region.itertuples():
            if "median" in ex.region and isinstance(getattr(r, "median", None), float) \
                    and np.isfinite(r.median):
                got = f"{_fmt(r.min)} / {_fmt(r.median)} / {_fmt(r.max)}"
            else:
                got = getattr(r, "values", "") or "–"
            out.append(f"| `{r.unknown}` | {r.prior} | {got} |")
        out.append("")
    else:
        out += ["Accepted region: **none** (no sampled point reproduces every figure).", ""]
        out += partial_region(ex)
    # where each figure fits, per unknown: the bins with any run within a band
    fids = [c for c in ex.bins.columns if c.startswith("F")]
    rows = []
    for path, b in ex.bins.groupby("unknown", sort=False):
        for fid in fids:
            hit = b[b[fid] > 0]
            if len(hit) and len(hit) < len(b):
                where = ", ".join(f"{r.bin} ({_pct(r[fid])})" for _, r in hit.iterrows())
                rows.append(f"| {fid} | `{path}` | {where} |")
    if rows:
        out += ["Where a figure fits (bins of each unknown with runs within the band, and "
                "their share):", "", "| figure | unknown | bins |", "|---|---|---|", *rows, ""]
    s = ex.sensitivity
    if len(s):
        top = (s.dropna(subset=["S1"]).sort_values("S1", ascending=False)
               .groupby("figure", sort=False).head(1).sort_values("figure"))
        parts = [f"{r.figure}: `{r.unknown}` (S1 {fmt_s1(r.S1, r.S1_conf)}, rho "
                 f"{r.spearman_rho:+.2f})" for r in top.itertuples() if np.isfinite(r.S1)]
        noise = s.groupby("figure").seed_noise.first()
        if parts:
            out.append("Most influential unknown per figure: " + "; ".join(parts) +
                       f". Seed noise (share of variance between seeds, unbiased): "
                       f"{', '.join(f'{k} {v:.2f}' for k, v in noise.items() if np.isfinite(v))}.")
            out.append("")
            out.append(s1_table(ex))
    return "\n".join(out)


def s1_table(ex: explore_mod.Exploration) -> str:
    """Every figure x unknown: S1 ± its 95% half-width (a half-width reaching 0: not told from
    none)."""
    s = ex.sensitivity.set_index(["figure", "unknown"])
    figs = list(dict.fromkeys(s.index.get_level_values(0)))
    head = ["unknown", *figs]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for u in ex.unknowns:
        cells = [f"`{u.path}`"]
        for f in figs:
            r = s.loc[(f, u.path)]
            cells.append(fmt_s1(r.S1, r.S1_conf))
        rows.append("| " + " | ".join(cells) + " |")
    return ("S1 ± 95% half-width (RBD-FAST with SALib's S1_conf; a choice: between-choice "
            "share, bootstrap over sample points):\n\n" + "\n".join(rows))


def nominal_table(seeds: range = SEEDS) -> str:
    """drop_timeout.yaml at its nominal values: seed 1 and the spread over seeds."""
    sc = pdsim.load(ROOT / f"scenarios/{MAIN}.yaml")
    figs = explore_mod.judged(sc.reference)
    rows = []
    for seed in seeds:
        s = pdsim.run(ROOT / f"scenarios/{MAIN}.yaml", sets=[f"seed={seed}"]).summary
        flat = explore_mod.flatten(s)
        rows.append({f.metric: flat.get(f.metric, np.nan) for f in figs}
                    | {"reported_tok_s": flat.get("clients.ci_bench.output_throughput_tok_s"),
                       "pairs": flat.get("blacklisted_pairs_max")})
    df = pd.DataFrame(rows)
    lines = ["| figure | reported | seed 1 | seeds 1–10: median (min–max) | within band |",
             "|---|---|---|---|---|"]
    for f in figs:
        v = df[f.metric]
        inside = int(((v - f.reported).abs() <= f.limit).sum())
        lines.append(f"| {f.label} | {_fmt(f.reported)} ± {_fmt(f.limit)} | {_fmt(v.iloc[0])} | "
                     f"{_fmt(v.median())} ({_fmt(v.min())}–{_fmt(v.max())}) | "
                     f"{inside} of {len(v)} seeds |")
    v = df.reported_tok_s
    lines.append(f"| the flushing bench's output throughput as bench_serving prints it | – | "
                 f"{_fmt(v.iloc[0])} | {_fmt(v.median())} ({_fmt(v.min())}–{_fmt(v.max())}) | |")
    v = df.pairs
    lines.append(f"| pairs blacklisted (of 16) | – | {_fmt(v.iloc[0])} | {_fmt(v.median())} "
                 f"({_fmt(v.min())}–{_fmt(v.max())}) | |")
    return "\n".join(lines)


def timeline() -> str:
    res = pdsim.run(ROOT / f"scenarios/{MAIN}.yaml")
    text = report.render(res)
    block = text.split("Incident timeline", 1)[1].split("\n", 1)[1]
    keep = [ln for ln in block.splitlines() if ln.startswith("t=") or "failed fast" in ln]
    plots.postmortem(res).savefig(OUT / "drop_timeout_postmortem.png", dpi=80)
    runs = {name: pdsim.run(ROOT / f"scenarios/{name}.yaml")
            for name in ("healthy", "forward_timeout")} | {MAIN: res}
    plots.compare(runs).savefig(OUT / "drop_timeout_compare.png", dpi=80)
    return "```\n" + "\n".join(keep[:12]) + "\n...\n```"


def whatif_table(seeds: range = range(1, 6)) -> str:
    """Router flush handler x scheduler flush semantics at the replay's nominal values."""
    df = pdsim.sweep(ROOT / f"scenarios/{MAIN}.yaml",
                     vary={"router.flush_handler": ["mini_lb_0.3.2", "mini_lb_fixed",
                                                    "model_gateway", "rust_router"],
                           "flush.semantics": ["skip_idle_check", "reject_if_busy"]},
                     seeds=seeds)
    keys = ["router.flush_handler", "flush.semantics"]
    cols = {"transfer_failures.flush_freed_pages": "ret != 0", "blacklisted_pairs_max": "pairs",
            "failed": "failed", "ci_bench.empty_share": "empty",
            "ci_bench.true_output_throughput_tok_s": "gen tok/s"}
    return _median_table(df, keys, ["router", "scheduler flush"], cols, seeds)


def _median_table(df, keys: list[str], heads: list[str], cols: dict, seeds: range,
                  whose: str = "; empty and gen tok/s are the flushing bench's") -> str:
    """Markdown: the median over seeds of each column, one row per combination of ``keys``."""
    med = df.groupby(keys, sort=False)[list(cols)].median().reset_index()
    lines = ["| " + " | ".join([*heads, *cols.values()]) + " |",
             "|" + "---|" * (len(heads) + len(cols))]
    for r in med.itertuples(index=False):
        vals = [str(k) for k in r[:len(keys)]] + [_fmt(float(v)) for v in r[len(keys):]]
        lines.append("| " + " | ".join(vals) + " |")
    return "\n".join(lines) + f"\n\nMedians of seeds {seeds.start}–{seeds.stop - 1}{whose}."


def timeout_table(seeds: range = range(1, 6)) -> str:
    """The flushing bench's declared ?timeout= (10 or 60 s) behind mini_lb as shipped and
    fixed: what the value changes once the balancer forwards it."""
    rows = []
    for handler, name in (("mini_lb_0.3.2", "drop_timeout"), ("mini_lb_fixed", "forward_timeout")):
        for t in (60, 10):
            for seed in seeds:
                s = pdsim.run(ROOT / f"scenarios/{name}.yaml",
                              sets=[f"clients.1.flush.timeout_s={t}", f"seed={seed}"]).summary
                c = s["clients"]
                rows.append({"router": handler, "timeout": t, "seed": seed,
                             "ret": s["transfer_failures_by_reason"]["flush_freed_pages"],
                             "failed": s["failed"],
                             "timed_out": sum(f["timed_out"] for f in s["flushes"].values()),
                             "second": c["ci_bench"]["true_output_throughput_tok_s"],
                             "first": c["ci_bench_first"]["true_output_throughput_tok_s"]})
    df = pd.DataFrame(rows)
    cols = {"ret": "ret != 0", "failed": "failed", "timed_out": "rank flushes timed out (of 16)",
            "second": "gen tok/s, flushing run", "first": "gen tok/s, first run"}
    return _median_table(df, ["router", "timeout"], ["router", "flush ?timeout=, s"], cols,
                         seeds, "")


def blacklist_table(seeds: range = range(1, 6)) -> str:
    """Blacklist policy x strikes at the replay's nominal values (reports/blacklist_policy.md
    weighs the policies against real faults)."""
    df = pdsim.sweep(ROOT / f"scenarios/{MAIN}.yaml",
                     vary={"blacklist.policy": ["permanent", "probe", "v0_5_23"],
                           "blacklist.strikes": [1, 3]}, seeds=seeds)
    keys = ["blacklist.policy", "blacklist.strikes"]
    cols = {"transfer_failures.flush_freed_pages": "ret != 0",
            "blacklisted_pairs_max": "pairs blacklisted", "failed": "failed",
            "ci_bench.empty_share": "empty", "ci_bench.true_output_throughput_tok_s":
            "gen tok/s", "blacklisted_pairs_final": "pairs at end"}
    cols = {k: v for k, v in cols.items() if k in df}
    return _median_table(df, keys, ["policy", "strikes"], cols, seeds)


def stories_figure(exs: dict[str, explore_mod.Exploration]) -> None:
    """Each reported figure (columns) against each story's timing unknown (rows), band
    shaded; green: the run reproduces both failure counts (F1 and F2)."""
    names = list(exs)
    first = exs[names[0]]
    fig, axes = plt.subplots(len(names), len(first.figures), squeeze=False,
                             figsize=(4.0 * len(first.figures), 2.5 * len(names) + 0.6))
    for i, name in enumerate(names):
        ex = exs[name]
        runs = ex.runs
        both = (explore_mod._within(runs, ex.figures[0]) & explore_mod._within(runs, ex.figures[1]))
        x = pd.to_numeric(runs[TIMING[name]], errors="coerce").to_numpy(dtype=float)
        if TIMING[name] == "model.layers":
            x = x + np.random.default_rng(0).uniform(-0.15, 0.15, len(x))  # spread only
        for j, f in enumerate(ex.figures):
            ax = axes[i][j]
            y = pd.to_numeric(runs[f.metric], errors="coerce").to_numpy(dtype=float)
            ax.axhspan(f.reported - f.limit, f.reported + f.limit, color="#a6dba0", alpha=0.6,
                       lw=0)
            ax.axhline(f.reported, color="#1b7837", lw=1)
            ax.scatter(x[~both], y[~both], s=9, color="#8c8c8c", alpha=0.6, lw=0)
            ax.scatter(x[both], y[both], s=14, color="#1b7837", lw=0)
            if i == 0:
                ax.set_title(f"F{j + 1} {f.label}", fontsize=9)
            if j == 0:
                ax.set_ylabel(name.removeprefix("story_"), fontsize=9)
            ax.set_xlabel(TIMING[name], fontsize=8)
            ax.tick_params(labelsize=7)
    fig.suptitle("Each story's runs (pdsim explore): reported value (line) and band (shaded); "
                 "green: both failure counts (F1, F2) within their bands", fontsize=10)
    fig.tight_layout()
    fig.savefig(OUT / "drop_timeout_stories.png", dpi=70)
    plt.close(fig)


def replace(text: str, name: str, body: str) -> str:
    pat = re.compile(rf"(<!-- begin:{name} -->\n)(?:.*?\n)?(<!-- end:{name} -->)", re.S)
    if not pat.search(text):
        raise SystemExit(f"{REPORT.name}: no <!-- begin:{name} --> ... <!-- end:{name} --> block")
    return pat.sub(lambda m: m.group(1) + body.rstrip("\n") + "\n" + m.group(2), text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--explore", action="store_true",
                    help="explore every story first (resumes reports/explore/<story>/)")
    ap.add_argument("--from-store", action="store_true",
                    help="compact the runs already in reports/explore/<story>/ (no new run)")
    ap.add_argument("--explored-at", metavar="COMMIT",
                    help="with --from-store: the commit whose pdsim made those runs")
    ap.add_argument("--no-replay", action="store_true",
                    help="rewrite the story tables only (no simulation)")
    ap.add_argument("--stories", nargs="*", default=list(STORIES))
    args = ap.parse_args()
    if args.explore or args.from_store:
        for name in args.stories:
            print(f"exploring {name}: {_command(name)}", file=sys.stderr)
            explore_story(name, args.from_store, args.explored_at)
    exs = {name: load_story(name) for name in STORIES}
    meta = json.loads((RUNS / "meta.json").read_text())
    commits = sorted({m["commit"] for m in meta.values()})
    text = REPORT.read_text()
    text = replace(text, "commit", "Explorations run with the model code of commit " +
                   ", ".join(f"`{c}`" for c in commits) + " and the story files in this "
                   "directory's history (reports/explore_runs/meta.json); replay figures at "
                   f"commit `{_git_head()}`. A commit named here may since have been rebased; "
                   "what guards the figures is tests/golden.json, whose hashes of every story's "
                   "outputs must stay identical unless a commit says why they moved.")
    text = replace(text, "stories", story_table(exs))
    text = replace(text, "choice", choice_table(exs))
    for name, ex in exs.items():
        text = replace(text, name, story_detail(name, ex))
    stories_figure(exs)
    if not args.no_replay:
        text = replace(text, "nominal", nominal_table())
        text = replace(text, "timeline", timeline())
        text = replace(text, "whatif", whatif_table())
        text = replace(text, "blacklist", blacklist_table())
        text = replace(text, "timeout", timeout_table())
    REPORT.write_text(text)
    print(f"wrote {REPORT.relative_to(ROOT)} and its figures", file=sys.stderr)


if __name__ == "__main__":
    main()

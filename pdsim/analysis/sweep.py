"""What-if sweeps: one scenario, a grid of overrides, several seeds, one DataFrame.

    df = pdsim.sweep("scenarios/drop_timeout.yaml",
                     vary={"blacklist.policy": ["permanent", "probe", "v0_5_23"]},
                     seeds=range(1, 6))

Runs go to a process pool (``workers``; 1 runs in-process) with a progress bar on stderr.
Each row holds the varied values, the seed and the summary's scalar metrics (per-client ones
as ``<client>.<metric>``). ``df.attrs["incident"]``: whether any run was an incident by the
run's own rule (:func:`is_incident`), which picks the table's columns.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from pathlib import Path

import pandas as pd
import yaml

from pdsim.config import loader, units
from pdsim.config.unknowns import get_path
from pdsim.util import backends
from pdsim.util.safeio import clip, echo

SKIP = {"flushes", "clients", "transfer_failures_by_reason", "failed_by_reason",
        "unknowns_at_nominal"}


def _flatten(summary: dict) -> dict:
    """A run's summary as one row: scalars by name, a block's (``steady``, ``slo``) as
    ``block.key``, a client's as ``<client>.<key>`` (``<client>.steady.keeps_up``)."""
    row = _scalars({k: v for k, v in summary.items() if k not in SKIP}, "")
    for reason, n in summary["transfer_failures_by_reason"].items():
        row[f"transfer_failures.{reason}"] = n
    for client, metrics in summary["clients"].items():
        row.update(_scalars(metrics, f"{client}."))
    return row


def _scalars(d: dict, prefix: str) -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_scalars(v, f"{prefix}{k}."))
        elif not isinstance(v, list):
            out[f"{prefix}{k}"] = v
    return out


def _one(args: tuple[dict, list[str], dict]) -> tuple[dict, bool]:
    """One run's row, and whether the run was an incident by the rule ``pdsim run`` follows
    (its scenario and its summary: dead rooms show only once it ran)."""
    from pdsim.engine.incident import is_incident as rule
    from pdsim.output.result import run

    data, sets, labels = args
    res = run(data, sets=sets)
    row = {**labels, **_flatten(res.summary)}  # (no wall time: the same rows every time)
    return row, rule(res.scenario, res.summary)


def same_value(a: object, b: object) -> bool:
    """Two values of one varied key are the same value: 1 and 1.0 are; 1 and true, or 10 and
    "10", are not (Python's == says True == 1)."""
    def kind(v: object) -> str:
        return ("bool" if isinstance(v, bool) else "number" if isinstance(v, int | float)
                else type(v).__name__)

    if kind(a) != kind(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(map(same_value, a, b))
    if isinstance(a, dict):
        return len(a) == len(b) and all(any(same_value(k, k2) and same_value(v, v2)
                                            for k2, v2 in b.items()) for k, v in a.items())
    return a == b


def _yaml_scalar(v: object) -> str:
    return yaml.safe_dump(v, default_flow_style=True).strip().removesuffix("\n...")


def grid(vary: dict[str, Iterable], seeds: Iterable[int]) -> list[tuple[list[str], dict]]:
    """Every combination of the varied values, for every seed: (``--set`` list, labels)."""
    keys = list(vary)
    out = []
    for values in itertools.product(*(list(vary[k]) for k in keys)):
        for seed in seeds:
            labels = dict(zip(keys, values, strict=True))
            sets = [f"{k}={_yaml_scalar(v)}" for k, v in labels.items()] + [f"seed={seed}"]
            out.append((sets, {**labels, "seed": seed}))
    return out


def sweep(scenario: str | Path | dict, vary: dict[str, Iterable], seeds: Iterable[int] = (0,),
          workers: int | None = None, progress: bool = True, *,
          allow_outside_paths: bool = False, backend: str = "process",
          address: str | None = None, sets: Sequence[str] = ()) -> pd.DataFrame:
    """Run ``scenario`` over the grid ``vary`` x ``seeds``; one row per run.

    ``sets``: overrides of every run, applied before the grid's in one pass (so a key they
    give stays under a policy the grid switches to, for validation to judge).
    ``backend``/``address``: where the runs go (pdsim/util/backends.py: "process" or "ray").
    """
    if not isinstance(vary, dict) or not all(
            isinstance(k, str) and isinstance(v, (list, tuple, range)) for k, v in vary.items()):
        raise units.ScenarioError(
            f"vary: a dict of dotted key -> list of values, e.g. {{'blacklist.policy': "
            f"['permanent', 'never']}} (got {echo(vary)})")
    for key, values in vary.items():  # (a value given twice ran its grid point twice)
        values = list(values)
        for i, v in enumerate(values):
            if any(same_value(v, w) for w in values[:i]):
                raise units.ScenarioError(
                    f"vary {clip(key, 80)}: {echo(v)} given twice; give each value once")
    if "seed" in vary:  # (each run's seed, from seeds, replaced it)
        raise units.ScenarioError("vary: the seeds are the seeds argument; vary "
                                         "another key")
    data = loader.as_data(scenario, allow_outside_paths)  # keeps where paths resolve
    jobs = [([*sets, *g], labels) for g, labels in grid(vary, list(seeds))]
    read: dict[tuple[str, str], object] = {}  # (key, the value as validated) -> as given
    for run_sets, labels in jobs:  # fail fast, before any process starts, on a bad override
        sc = loader.load(data, run_sets)
        for key in vary:  # two values that validate alike would run the same grid point twice
            given = read.setdefault((key, repr(get_path(sc, key))), labels[key])
            if not same_value(given, labels[key]):
                raise units.ScenarioError(
                    f"vary {clip(key, 80)}: {echo(given)} and {echo(labels[key])} are the same "
                    f"value once validated; give it once")
    tasks = [(data, run_sets, labels) for run_sets, labels in jobs]
    done = backends.run_all(_one, tasks, workers, progress, backend, address)
    df = pd.DataFrame([row for row, _ in done])
    df.attrs["incident"] = any(incident for _, incident in done)  # (not in the rows: a
    # capacity sweep's CSV and JSON stay as they were)
    return df


# --- what the table shows ---------------------------------------------------------------------

# an incident's columns: what the flush did to the KV transfers and the blacklist, and what the
# client saw ({c}: the client the table is about); the requests left unanswered beside the
# failed ones (a run that leaves requests stuck fails fewer than its fix)
INCIDENT = {"transfer_failures.flush_freed_pages": "ret!=0", "blacklisted_pairs_max": "pairs",
            "failed": "failed", "unfinished": "unanswered", "{c}.empty_share": "empty",
            "{c}.true_output_throughput_tok_s": "gen tok/s", "blacklisted_pairs_final": "pairs end"}
# a capacity sweep's: whether the client's offered load is kept up with, latency percentiles,
# then goodput under the scenario's SLO (or output throughput without one)
KEEPS_UP = {"{c}.steady.offered_req_s": "offered/s", "{c}.steady.completed_req_s": "done/s",
            "{c}.steady.keeps_up": "keeps up"}
THROUGHPUT = {"{c}.request_throughput_req_s": "req/s"}
LATENCY = {"{c}.median_ttft_ms": "TTFT p50", "{c}.p99_ttft_ms": "TTFT p99",
           "{c}.median_tpot_ms": "TPOT p50", "{c}.p99_tpot_ms": "TPOT p99",
           "{c}.p99_e2e_ms": "E2E p99"}
GOODPUT = {"{c}.slo.attainment": "SLO met", "{c}.slo.goodput_req_s": "goodput/s"}
OUTPUT = {"{c}.output_throughput_tok_s": "tok/s"}


def is_incident(sc: object, rows: pd.DataFrame | None = None) -> bool:
    """A sweep about an incident, which shows the incident's columns, rather than a capacity
    question: any of its runs was one by :func:`pdsim.engine.incident.is_incident`, the rule
    the run's figure and report follow (``rows``: :func:`sweep`'s, which records it in
    ``rows.attrs["incident"]``). Rows without that record (read back from a CSV) tell it by
    an incident block in any row, beside the scenario's own signs. Without ``rows``: the
    scenario's signs alone, before any run (a scenario whose dead rooms show only once it
    runs, such as small_decode_window without its reported figures, is not one yet)."""
    from pdsim.engine.incident import is_incident as rule

    if rows is None:
        return rule(sc)
    if "incident" in rows.attrs:
        return bool(rows.attrs["incident"])
    return rule(sc) or any(c.startswith("incident.") and rows[c].notna().any()
                           for c in rows.columns)


def default_columns(sc: object, client: str, rows: pd.DataFrame | None = None
                    ) -> dict[str, str]:
    """The columns that fit the sweep (``pdsim sweep`` without ``--metrics``), name ->
    header: :data:`INCIDENT` for an incident (:func:`is_incident`, from the sweep's ``rows``
    once it ran); for a capacity sweep,
    :data:`KEEPS_UP` (an open-loop client) or :data:`THROUGHPUT` (everything at once or a
    closed loop), :data:`LATENCY`, and :data:`GOODPUT` with an SLO, else :data:`OUTPUT`. The
    scenario's reported figures' metrics follow, each under its own name."""
    if is_incident(sc, rows):
        cols = dict(INCIDENT)
    else:
        cfg = next(c for c in sc.clients if c.name == client)
        rate = getattr(cfg, "request_rate", None)
        open_loop = rate == "trace" or isinstance(rate, float) and rate != float("inf")
        cols = {**(KEEPS_UP if open_loop else THROUGHPUT), **LATENCY,
                **(GOODPUT if sc.slo.active else OUTPUT)}
    cols = {k.format(c=client): v for k, v in cols.items()}
    for r in sc.reference:
        name = reference_column(r.metric)
        if name and name not in cols:
            cols[name] = name
    return cols


def reference_column(metric: str | None) -> str | None:
    """A reported figure's summary path as a sweep row names it (``clients.X.m`` -> ``X.m``,
    ``transfer_failures_by_reason.r`` -> ``transfer_failures.r``)."""
    if not metric:
        return None
    if metric.startswith("clients."):
        return metric.removeprefix("clients.")
    if metric.startswith("transfer_failures_by_reason."):
        return "transfer_failures." + metric.split(".", 1)[1]
    return metric


# the summary's fleet-wide keys beside the request metrics (pdsim.engine.sim._summary), and a
# client's own beside them: with the request metrics (pdsim.engine.summary.metrics) and the
# blocks' keys, the names --metrics can give before a sweep runs (tests/test_sweep_metrics.py
# checks a run's rows hold no other)
FLEET = ("transfer_failures", "flush_doomed_transfers", "blacklisted_pairs_max",
         "blacklisted_pairs_final", "dead_peer_writes", "dead_peer_write_s", "blacklist_probes",
         "wasted_prefill_tokens", "stale_page_requests", "retractions", "kv_transferred_gb",
         "prefill_tokens_computed", "chunked_prefill_size_per_rank", "tokens_generated_fleet",
         "events", "logged_events", "decode_steps", "prefill_steps", "simulated_s",
         "stopped_at_horizon", "stalled_at_s", "fleet_mode", "gpus",
         "gpus_by_role.prefill", "gpus_by_role.decode", "gpus_by_role.colocated")
CLIENT = ("kind", "aborted", "unsent", "finished", "trace_rows_replayed", "trace_rows",
          "questions", "questions_in_flight", "prompts_in_flight", "empty_answers")


def metric_names(sc: object) -> list[str]:
    """Every metric a sweep of ``sc`` can have in its rows, by the name a row gives it."""
    import numpy as np

    from pdsim.engine import slo, steady, summary

    empty = {k: np.empty(0, dtype=t or float)
             for k, t in {**summary.COLUMNS, "status": int}.items()}
    request = list(summary.metrics(empty, 0.0))
    blocks = [f"steady.{k}" for k in steady.KEYS]
    if sc.slo.active:
        blocks += [f"slo.{k}" for k in slo.summary(empty, sc.slo, 0.0, 0.0)]
    names = [*request, *FLEET, *blocks,
             *(f"transfer_failures.{r}" for r in summary.FLUSH_REASONS)]
    for c in sc.clients:
        names += [f"{c.name}.{k}" for k in (*request, *CLIENT, *blocks)]
    return names


def check_metrics(names: Sequence[str], sc: object) -> None:
    """``--metrics`` names, each a metric of the sweep's rows (:func:`metric_names`; any
    ``transfer_failures.<reason>``); raises ValueError in one line, naming close matches and
    listing the metrics, for one that is not."""
    import difflib

    have = metric_names(sc)
    clients = [c.name for c in sc.clients]
    for n in names:
        if n in have or n.startswith("transfer_failures."):
            continue
        close = difflib.get_close_matches(n, have, 3, 0.7)
        own = [k for k in have if k.split(".", 1)[0] not in clients]
        raise ValueError(
            f"--metrics {echo(n)}: not a metric of this scenario's runs"
            + (f"; did you mean {' or '.join(close)}?" if close else "")
            + f"; there are {', '.join(own)}, transfer_failures.<reason>, and a client's own "
            f"as <client>.<metric> (clients: {', '.join(clients)}; pdsim sweep --json shows "
            f"every value)")


def table(df: pd.DataFrame, keys: list[str], columns: dict[str, str]) -> pd.DataFrame:
    """One row per grid point: the median over its seeds of each numeric column, the share
    of seeds that kept up for a keeps-up column ("2/3"; n/a for runs without a verdict), the
    value itself for a column that is the same for every seed; headers from ``columns``."""
    g = df.groupby(keys, sort=False)
    out = {}
    for name, header in columns.items():
        if name not in df:
            out[header] = g[keys[0]].agg(lambda _: None)
            continue
        col = df[name]
        if name.endswith("keeps_up"):
            out[header] = g[name].agg(_kept)
        elif pd.api.types.is_numeric_dtype(col) and not pd.api.types.is_bool_dtype(col):
            out[header] = g[name].median()
        else:
            out[header] = g[name].agg(lambda v: v.iloc[0] if v.nunique(dropna=False) == 1
                                      else "/".join(map(str, v)))
    return pd.DataFrame(out)


def _kept(v: pd.Series) -> str:
    known = [x for x in v if x is not None and x == x]
    return "n/a" if not known else f"{sum(bool(x) for x in known)}/{len(known)}"

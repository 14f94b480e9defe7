"""What-if sweeps: one scenario, a grid of overrides, several seeds, one DataFrame.

    df = pdsim.sweep("scenarios/drop_timeout.yaml",
                     vary={"blacklist.policy": ["permanent", "probe", "v0_5_23"]},
                     seeds=range(1, 6))

Runs go to a process pool (``workers``; 1 runs in-process) with a progress bar on stderr.
Each row holds the varied values, the seed and the summary's scalar metrics (per-client ones
as ``<client>.<metric>``).
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
    row = {k: v for k, v in summary.items() if k not in SKIP}
    for reason, n in summary["transfer_failures_by_reason"].items():
        row[f"transfer_failures.{reason}"] = n
    for client, metrics in summary["clients"].items():
        for k, v in metrics.items():
            if not isinstance(v, dict):
                row[f"{client}.{k}"] = v
    return row


def _one(args: tuple[dict, list[str], dict]) -> dict:
    from pdsim.output.result import run

    data, sets, labels = args
    res = run(data, sets=sets)
    return {**labels, **_flatten(res.summary)}  # (no wall time: the same rows every time)


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
    return pd.DataFrame(backends.run_all(_one, tasks, workers, progress, backend, address))

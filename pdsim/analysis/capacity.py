"""The fleet's capacity: the highest open-loop request rate whose SLO attainment over a steady
window meets the scenario's target (``slo.attainment``), found by a bracketing search.

Why: a what-if at a load chosen by hand ("18 req/s, light") says nothing about the loads an
operator runs at; loads given as fractions of a measured capacity do. How it is found:

1. a probe runs the base without faults, its first client open-loop (Poisson) at rate r for
   the whole window and beyond, once per seed; r *meets* the SLO when the mean over seeds of
   the attainment of the requests arriving in the window is at least the target;
2. bracket: from the base's own rate, double until a rate fails (or halve until one meets);
3. bisect the bracket at its geometric middle until hi / lo <= 1 + ``resolution``;
4. the capacity is ``lo``, the highest rate that met the SLO (the true one lies in [lo, hi)).

Attainment is taken to fall as the rate rises (queues only grow); a probe that contradicts
that is kept in the probes table, and the search is not redone. Results are cached by content
(the scenario as simulated, the files it reads, pdsim's code and the search's settings) in
``$PDSIM_CACHE_DIR`` (default ``~/.cache/pdsim``), so a second what-if of the same base and
settings skips the search; a cached entry is used only if its stored key matches.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from pdsim.config import loader
from pdsim.util.backends import progress_bar
from pdsim.util.backends import run_all as run_tasks

RESOLUTION = 0.05  # stop when hi / lo <= 1.05
MAX_STEPS = 12  # doublings or halvings to find a bracket
LOAD_MARGIN = 1.25


@dataclass
class Capacity:
    """A measured capacity and how it was found."""

    rate: float  # req/s: the highest rate that met the SLO
    hi: float  # the lowest rate that did not (inf: none found)
    target: float
    seeds: list[int]
    resolution: float
    window: tuple[float, float]
    horizon: float
    slo: dict
    probes: list[dict] = field(default_factory=list)  # rate, seed, attainment
    key: str = ""
    cached: bool = False

    def describe(self) -> str:
        if self.key == "given":
            return f"capacity {self.rate:.3g} req/s (given, not measured here)"
        slo = ", ".join(f"{k} {v:g}" for k, v in self.slo.items() if v is not None
                        and k != "attainment")
        rates = sorted({p["rate"] for p in self.probes})
        nxt = (f"the next rate probed, {self.hi:.3g} req/s, was not" if math.isfinite(self.hi)
               else "no rate probed failed")
        return (f"capacity {self.rate:.3g} req/s: the highest open-loop (Poisson) rate whose "
                f"SLO attainment ({slo}) over {self.window[0]:g}-{self.window[1]:g} s, mean of "
                f"seeds {_seeds(self.seeds)}, was at least {self.target:g}; {nxt} (bracketing "
                f"search: doubling, then bisection to hi/lo <= {1 + self.resolution:g}; "
                f"{len(rates)} rates probed{', cached' if self.cached else ''})")

    def as_dict(self) -> dict:
        d = asdict(self)
        d["hi"] = None if not math.isfinite(self.hi) else self.hi
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Capacity:
        d = dict(d)
        d["hi"] = math.inf if d.get("hi") is None else d["hi"]
        d["window"] = tuple(d["window"])
        return cls(**d)

    def table(self) -> pd.DataFrame:
        """Per rate probed: the attainment of each seed, their mean, and whether it met."""
        p = pd.DataFrame(self.probes)
        if p.empty:
            return p
        t = p.pivot_table(index="rate", columns="seed", values="attainment").round(4)
        t.columns = [f"seed {s}" for s in t.columns]
        t["mean"] = t.mean(axis=1).round(4)
        t["meets"] = t["mean"] >= self.target
        return t.reset_index()


def _seeds(seeds: Sequence[int]) -> str:
    s = list(seeds)
    return f"{s[0]}-{s[-1]}" if len(s) > 2 and s == list(range(s[0], s[-1] + 1)) else \
        ", ".join(map(str, s))


def cache_dir() -> Path:
    """Where measured capacities are kept: ``$PDSIM_CACHE_DIR`` or ``~/.cache/pdsim``."""
    env = os.environ.get("PDSIM_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pdsim"


def cache_key(data: Any, settings: dict) -> str:
    """The content key of a capacity search (see the module docstring)."""
    from pdsim.analysis.explore_store import _by_content, _code_hash

    sc = loader.load(data)
    dump = sc.model_dump(mode="json")
    for k in ("name", "description", "reference", "seed"):
        dump.pop(k, None)
    # every file the scenario reads (profiles, traces) by its content, not its path: the
    # same rule as explore's resume key
    dump = _by_content(dump, getattr(sc, "_context", None))
    text = json.dumps({"scenario": dump, "code": _code_hash(), "settings": settings},
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _probe_task(task: tuple) -> dict:
    from pdsim.engine import slo as slo_mod
    from pdsim.engine.summary import columns
    from pdsim.output.result import run

    data, rate, seed, (a, b) = task
    res = run(data)
    req = res.requests
    measured = req[req.kind != "warmup"]
    got = slo_mod.window(columns(measured), res.scenario.slo, a, b)
    return {"rate": rate, "seed": seed, "attainment": got["attainment"]}


def measure(base: str | Path | dict, window: tuple[float, float], horizon: float,
            seeds: Sequence[int] = (1, 2), sets: Sequence[str] = (),
            resolution: float = RESOLUTION, workers: int | None = None, progress: bool = True,
            use_cache: bool = True, allow_outside_paths: bool = False) -> Capacity:
    """The capacity of ``base`` (see the module docstring); ``window`` [a, b) in simulated s,
    runs of ``horizon`` s."""
    data = loader.as_data(base, allow_outside_paths)
    if sets:
        data = loader.apply_overrides(data, list(sets))
    data = loader.apply_overrides(data, ["faults=[]"])
    sc = loader.load(data)
    slo = sc.slo
    if not slo.active:
        raise ValueError("capacity is the highest rate meeting the SLO: give the base an slo: "
                         "block with ttft_ms and/or tpot_ms (bench --goodput's thresholds)")
    c = sc.clients[0]
    if c.kind != "bench" or getattr(c.dataset, "kind", "") != "random":
        raise ValueError("capacity varies the first client's request rate: make it a bench "
                         "client with a random dataset")
    rate = c.request_rate
    start = float(rate) if isinstance(rate, int | float) and math.isfinite(rate) else 10.0
    if not 0 < resolution < 1:
        raise ValueError(f"resolution {resolution:g}: give a share in (0, 1)")
    seeds = list(seeds)
    settings = {"seeds": seeds, "window": list(window), "horizon": horizon,
                "resolution": resolution, "target": slo.attainment}
    key = cache_key(data, settings)
    path = cache_dir() / f"capacity-{key}.json"
    if use_cache and path.is_file():
        try:
            stored = json.loads(path.read_text())
            if stored.get("key") == key:
                cap = Capacity.from_dict(stored)
                cap.cached = True
                return cap
        except (OSError, ValueError, TypeError, KeyError):
            pass  # a damaged entry is measured again

    probes: list[dict] = []
    bar = progress_bar(0, enabled=progress, unit="probe")

    def meets(rate: float) -> bool:
        n = math.ceil(rate * horizon * LOAD_MARGIN) + 20
        tasks = []
        for s in seeds:
            d = loader.apply_overrides(data, [f"clients.0.request_rate={rate!r}",
                                              f"clients.0.num_prompts={n}",
                                              f"horizon_s={horizon!r}", f"seed={s}"])
            tasks.append((d, rate, s, window))
        bar.total += len(tasks)
        bar.refresh()
        got = run_tasks(_probe_task, tasks, workers, bar=bar)
        probes.extend(got)
        att = [g["attainment"] if g["attainment"] is not None else 0.0 for g in got]
        return sum(att) / len(att) >= slo.attainment

    try:
        lo, hi = math.nan, math.inf
        r = start
        if meets(r):
            lo = r
            for _ in range(MAX_STEPS):
                r = _round(r * 2)
                if not meets(r):
                    hi = r
                    break
                lo = r
        else:
            hi = r
            for _ in range(MAX_STEPS):
                r = _round(r / 2)
                if meets(r):
                    lo = r
                    break
                hi = r
            if not math.isfinite(lo):
                raise ValueError(f"no rate down to {r:.3g} req/s met the SLO over "
                                 f"{window[0]:g}-{window[1]:g} s: loosen the slo: thresholds")
        while math.isfinite(hi) and hi / lo > 1 + resolution:
            mid = _round(math.sqrt(lo * hi))
            if mid in (lo, hi):
                break
            if meets(mid):
                lo = mid
            else:
                hi = mid
    finally:
        bar.close()
    cap = Capacity(lo, hi, slo.attainment, seeds, resolution, tuple(window), horizon,
                   {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms, "e2e_ms": slo.e2e_ms,
                    "attainment": slo.attainment}, probes, key)
    if use_cache:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(cap.as_dict(), indent=1) + "\n")
            os.replace(tmp, path)
        except OSError:
            pass  # a cache that cannot be written costs a search next time, nothing more
    return cap


def _round(x: float) -> float:
    """Rates to 3 significant figures (the probes are named by them)."""
    return float(f"{x:.3g}")

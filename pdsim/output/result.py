"""The public ``run``: a scenario, loaded, simulated, and its :class:`Result`.

A Result is the engine's :class:`~pdsim.engine.outcome.Outcome` (summary and tables) that can
also write itself as a self-describing run directory, ``report.txt`` included. Both live here,
above the engine and beside the report, so that the engine never imports the report (the
circle ``sim`` <-> ``report`` this layout removed).
"""

from __future__ import annotations

from pathlib import Path

from pdsim.config import loader
from pdsim.config.scenario import Scenario
from pdsim.engine.outcome import Outcome
from pdsim.engine.recorder import Recorder
from pdsim.engine.sim import simulate
from pdsim.util.rng import seeds_of
from pdsim.util.version import __version__

# the columns of strings in a run directory's tables (read back as strings, empty ones "")
_TEXT = {"requests": ("client", "kind", "status", "reason", "session"),
         "events": ("event", "component", "peer", "detail")}

# what Result.write puts in a run directory: a table per name (csv or parquet), then files
RUN_DIR_TABLES = ("requests", "events", "timeseries", "answers")
RUN_DIR_FILES = ("summary.json", "scenario.yaml", "run.json", "report.txt")


def run_dir_names(fmt: str) -> list[str]:
    """The file names :meth:`Result.write` may write in a run directory."""
    return [f"{name}.{fmt}" for name in RUN_DIR_TABLES] + list(RUN_DIR_FILES)


class Result(Outcome):
    """What a run produced: the summary, DataFrames for notebooks and tests, and the run
    directory (:meth:`write`)."""

    def write(self, out: str | Path, fmt: str = "csv") -> list[Path]:
        """Write a self-describing run directory: records, events, time series,
        ``summary.json``, the resolved ``scenario.yaml`` (after ``extends:`` and ``--set``;
        ``pdsim run DIR/scenario.yaml`` re-runs it), ``run.json`` (pdsim version, seeds, how it
        was made) and ``report.txt`` (the human report). Nothing in it depends on the machine
        or the clock, so the same scenario and seed write the same bytes."""
        import json

        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        written = []
        tables = {"requests": self.requests, "events": self.events,
                  "timeseries": self.timeseries}
        if len(self.answers):
            tables["answers"] = self.answers
        for name, df in tables.items():
            path = out / f"{name}.{fmt}"
            if fmt == "parquet":
                df.to_parquet(path, index=False)
            else:
                df.to_csv(path, index=False, float_format="%.9g")
            written.append(path)
        path = out / "summary.json"
        path.write_text(json.dumps(self.summary, indent=2, sort_keys=True) + "\n")
        written.append(path)
        for name, text in self.describe().items():
            path = out / name
            path.write_text(text)
            written.append(path)
        return written

    @classmethod
    def read(cls, out: str | Path) -> Result:
        """A run directory (:meth:`write`) read back: its summary, its tables (CSV or
        Parquet) and its scenario (``scenario.yaml``, as it was run), for figures and
        comparisons without running it again. What the directory does not hold stays empty:
        the flush calls, the KV pools, the recorded steps. Raises ValueError (one line) for a
        directory that is not a run directory."""
        import json

        import pandas as pd

        out = Path(out)
        missing = [n for n in ("summary.json", "scenario.yaml") if not (out / n).is_file()]
        tables = {}
        for name in ("requests", "events", "timeseries", "answers"):
            for fmt in ("csv", "parquet"):
                if (out / f"{name}.{fmt}").is_file():
                    tables[name] = out / f"{name}.{fmt}"
        missing += [f"{n}.csv" for n in ("requests", "events", "timeseries") if n not in tables]
        if missing:
            raise ValueError(f"{out}: not a run directory of pdsim run --out (no "
                             f"{', '.join(missing)})")
        try:
            summary = json.loads((out / "summary.json").read_text())
            sc = loader.load(out / "scenario.yaml", allow_outside_paths=True)
        except (OSError, ValueError) as err:  # (ScenarioError is a ValueError)
            raise ValueError(f"{out}: cannot read the run directory ({err})") from None
        try:  # (why the scenario's reported figures are not this run's, as it said)
            what_if = json.loads((out / "run.json").read_text()).get("what_if") or ""
        except (OSError, ValueError, AttributeError):
            what_if = ""
        res = cls(sc, summary, what_if=what_if,
                  end_s=float(summary.get("simulated_s", float("nan"))))
        for name, path in tables.items():
            text = _TEXT.get(name, ())
            try:
                df = (pd.read_parquet(path) if path.suffix == ".parquet" else
                      pd.read_csv(path, dtype=dict.fromkeys(text, "str")))
            except (OSError, ValueError) as err:
                raise ValueError(f"{path}: cannot read the table ({err})") from None
            for col in text:  # an empty string was written as an empty CSV cell
                if col in df:
                    df[col] = df[col].fillna("")
            setattr(res, name, df)
        if "answers" not in tables:
            res.answers = pd.DataFrame()
        return res

    def describe(self) -> dict[str, str]:
        """``scenario.yaml``, ``run.json`` and ``report.txt`` of a run directory, as text
        (independent of where the directory is, so that two runs' directories compare equal)."""
        import json

        import yaml

        from pdsim.config import unknowns
        from pdsim.output import report

        sc = self.scenario
        # declared unknowns stay declared (at the nominal the run used), so a re-run matches
        data = unknowns.redeclare(sc.model_dump(mode="python"), sc.unknowns)
        # (robust) trace files as resolved at load time: the run directory holds no traces
        rerun = "pdsim run RUN_DIR/scenario.yaml"
        for c, cd in zip(sc.clients, data["clients"], strict=True):
            if c.dataset.kind in ("trace", "sharegpt") and c.dataset.path is not None:
                cd["dataset"]["path"] = str(c.dataset.resolved_path)
                rerun = "pdsim run RUN_DIR/scenario.yaml --allow-outside-paths"
        if sc.profiles and sc._context is not None:  # (steptime) profile files likewise
            data["profiles"] = [str(sc._context.resolve(rel, f"'profiles.{i}'"))
                                for i, rel in enumerate(sc.profiles)]
            rerun = "pdsim run RUN_DIR/scenario.yaml --allow-outside-paths"
        resolved = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
        head = (f"# Resolved scenario of this run (pdsim {__version__}): {sc._source or 'a dict'}"
                f" after extends: and overrides {list(sc._overrides) or 'none'}.\n"
                f"# Re-run: {rerun}\n")
        meta = {"pdsim_version": __version__, "scenario": sc.name, "source": sc._source,
                "overrides": list(sc._overrides), "seed": sc.seed,
                "seeds": seeds_of(sc.seed, sc.seeds.model_dump()),
                "streams": "numpy SeedSequence([seeds[subsystem], crc32(subsystem)]), one "
                           "per subsystem (pdsim/util/rng.py); a seed under seeds: in the "
                           "scenario replaces the root seed for its subsystem",
                "what_if": self.what_if or None,
                "rerun": rerun,
                "files": {"requests": "one row per HTTP request", "events": "one row per event",
                          "timeseries": f"gauges every {sc.timeseries_interval_s:g} simulated s "
                                        f"and at the run's end",
                          "summary.json": "the metrics (pdsim run --json)",
                          "report.txt": "the human report (pdsim run)",
                          "scenario.yaml": "the scenario exactly as run"}}
        return {"scenario.yaml": head + resolved,
                "run.json": json.dumps(meta, indent=2) + "\n",
                "report.txt": report.render(self) + "\n"}


def run(scenario: str | Path | dict | Scenario, sets: list[str] | None = None,
        progress: bool | float = False, record_steps: bool = False, *,
        allow_outside_paths: bool = False) -> Result:
    """Simulate ``scenario`` (a path, dict or :class:`Scenario`) and return its Result.

    ``progress``: a bar of requests answered (and the simulated time) on stderr, ``True`` at
    once, or a number of wall seconds after which a run still going shows one (``pdsim run``
    on a terminal: 2).

    ``record_steps``: keep every batch step and KV write for a Perfetto trace
    (:mod:`pdsim.output.perfetto`); it changes nothing that is simulated. ``allow_outside_paths``:
    let the scenario name files (``extends:``, traces) outside its directory tree (for a
    dict: outside the current directory).
    """
    sc = loader.load(scenario, sets, allow_outside_paths=allow_outside_paths)
    return simulate(sc, Recorder() if record_steps else None, progress, Result)

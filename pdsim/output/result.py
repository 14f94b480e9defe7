"""The public ``run``: a scenario, loaded, simulated, and its :class:`Result`.

A Result is the engine's :class:`~pdsim.engine.outcome.Outcome` (summary and tables) that can
also write itself as a self-describing run directory, ``report.txt`` included. Both live here,
above the engine and beside the report, so that the engine never imports the report (the
circle ``sim`` <-> ``report`` this layout removed).
"""

from __future__ import annotations

import math
from pathlib import Path

from pdsim.config import loader
from pdsim.config.scenario import Scenario
from pdsim.engine.outcome import Outcome
from pdsim.engine.recorder import Recorder
from pdsim.engine.sim import simulate
from pdsim.util.rng import seeds_of
from pdsim.util.safeio import clip, echo, show_path
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
            summary = _read_json(out / "summary.json")
            _check_summary(summary)
            sc = loader.load(out / "scenario.yaml", allow_outside_paths=True)
        except (OSError, ValueError) as err:  # (ScenarioError is a ValueError)
            raise ValueError(f"{show_path(out)}: cannot read the run directory "
                             f"({clip(str(err), 300)})") from None
        try:  # (why the scenario's reported figures are not this run's, as it said)
            meta = _read_json(out / "run.json")
        except (OSError, ValueError):
            meta = {}
        meta = meta if isinstance(meta, dict) else {}
        what_if = meta.get("what_if") if isinstance(meta.get("what_if"), str) else ""
        owner = meta.get("reference_from")
        if isinstance(owner, str) and owner != sc.name:  # (whose reported figures they are)
            sc._reference_owner = owner
        res = cls(sc, summary, what_if=what_if,
                  end_s=float(summary.get("simulated_s", float("nan"))))
        for name, path in tables.items():
            text = _TEXT.get(name, ())
            try:
                df = (pd.read_parquet(path) if path.suffix == ".parquet" else
                      pd.read_csv(path, dtype=dict.fromkeys(text, "str")))
            except (OSError, ValueError) as err:
                raise ValueError(f"{show_path(path)}: cannot read the table "
                                 f"({clip(str(err), 200)})") from None
            _check_table(name, df, path)
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
                "reference_from": sc._reference_owner or sc.name,
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


# --- reading a run directory back: each file checked before it is used -----------------------

MAX_RUN_JSON_BYTES = 64 << 20  # summary.json and run.json (a summary is a few kB per client)

# what every run's summary holds (pdsim.engine.summary), as JSON types: a run directory's
# summary.json without them is not one (the report, compare and the figures read them)
_SUMMARY_NUMBERS = ("simulated_s", "requests", "completed_requests", "failed",
                    "transfer_failures", "request_throughput_req_s", "output_throughput_tok_s",
                    "duration_s")
_SUMMARY_COUNTS = ("requests", "completed_requests", "failed", "transfer_failures")
_SUMMARY_OBJECTS = ("clients", "failed_by_reason", "transfer_failures_by_reason", "flushes")
_SUMMARY_SECTIONS = ("slo", "steady", "incident")  # objects when present
# a key named for a unit holds a number (or null), at any depth
_UNIT_SUFFIXES = ("_ms", "_s", "_share", "_tok_s", "_req_s", "_gb", "_rate")


def _read_json(path: Path) -> object:
    from pdsim.util.safeio import decode_utf8, read_user_file
    from pdsim.util.safeyaml import parse_json

    name = path.name
    return parse_json(decode_utf8(read_user_file(path, name, MAX_RUN_JSON_BYTES), name), name)


def _number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _check_summary(s: object) -> None:
    """A summary.json that the report, compare and the figures can read: a JSON object with
    the keys every run's summary has, of their types (ValueError, one line, otherwise)."""
    if not isinstance(s, dict):
        raise ValueError(f"summary.json holds {type(s).__name__ if s is not None else 'null'}"
                         f", not the run's summary (a JSON object)")
    for key in _SUMMARY_NUMBERS:
        v = s.get(key)
        count = key in _SUMMARY_COUNTS
        if not _number(v) or not math.isfinite(v) or not 0 <= v <= 1e15 or (
                count and v != int(v)):
            raise ValueError(f"summary.json: '{key}' must be "
                             f"{'a count' if count else 'a finite number'} of at least 0, got "
                             f"{echo(v) if key in s else 'nothing'}")
    for key in (*_SUMMARY_OBJECTS, *_SUMMARY_SECTIONS):
        if (key in _SUMMARY_OBJECTS or s.get(key) is not None) and not isinstance(s.get(key),
                                                                               dict):
            raise ValueError(f"summary.json: '{key}' must be an object, got "
                             f"{echo(s.get(key)) if key in s else 'nothing'}")
    for name, c in s["clients"].items():
        if not isinstance(c, dict):
            raise ValueError(f"summary.json: 'clients.{clip(str(name), 40)}' must be an "
                             f"object, got {echo(c)}")
    stack = [("", s)]
    while stack:
        where, d = stack.pop()
        for k, v in d.items():
            path = f"{where}{k}"
            if isinstance(v, dict):
                stack.append((path + ".", v))
            elif (str(k).endswith(_UNIT_SUFFIXES) and v is not None and not _number(v)):
                raise ValueError(f"summary.json: '{clip(path, 80)}' must be a number, got "
                                 f"{echo(v)}")


def _check_table(name: str, df: object, path: Path) -> None:
    """A table of a run directory with the columns :meth:`Result.write` writes, numbers where
    they are numbers (ValueError, one line, otherwise)."""
    import pandas as pd

    from pdsim.engine.log import COLUMNS as EVENT_COLUMNS
    from pdsim.engine.outcome import REQUEST_COLUMNS, SAMPLE_COLUMNS

    need = {"requests": REQUEST_COLUMNS, "events": EVENT_COLUMNS,
            "timeseries": ("time", "tokens_per_s", "failed_per_s", *SAMPLE_COLUMNS[1:])
            }.get(name, ())
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise ValueError(f"{show_path(path)}: not a run directory's {name} table (no column "
                         f"{', '.join(missing[:6])}{', ...' if len(missing) > 6 else ''})")
    for col in need:
        if col in _TEXT.get(name, ()) or (name == "events" and col != "time"):
            continue  # (the events' other columns mix numbers and text by event)
        x = df[col]
        if x.notna().any() and not (pd.api.types.is_numeric_dtype(x)
                                    or pd.api.types.is_bool_dtype(x)):
            raise ValueError(f"{show_path(path)}: column {col!r} must hold numbers")


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

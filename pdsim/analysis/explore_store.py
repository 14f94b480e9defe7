"""The store of an exploration's runs (``pdsim.analysis.explore``): the key that ties a
stored run to what was simulated, each row's digest, and the Parquet files under
``<out>/runs.parquet/``.

The key hashes the scenario as simulated (not its name, description, reference figures or
``why`` notes), the content of every file it reads (profiles and traces by content, not by
path; ``extends:`` parents are merged into it) and pdsim's own code. A stored row is used only
if it verifies (:func:`verified`): its ``row_digest`` (SHA-256 of its key, inputs and outputs)
matches, and its inputs are the values the design gives its sample. It is a check of
integrity, not of authenticity: someone who recomputes the digest with pdsim's code can
still plant outputs.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import numpy as np
import pandas as pd

from pdsim.config import loader, unknowns
from pdsim.config.units import Context

KEY = ["scenario_hash", "design", "sample", "seed"]
WALL = ["sim_wall_s"]  # the only columns that differ between identical explorations
_NOT_SIMULATED = ("name", "description", "reference")


# --- keys and digests ------------------------------------------------------------------------


def _code_hash() -> str:
    root = Path(__file__).parents[1]  # the pdsim package: every module and shipped profile
    h = hashlib.sha256()
    for p in sorted([*root.rglob("*.py"), *root.glob("model/data/*.yaml")]):
        h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def _file_digest(path: Path) -> str:
    """SHA-256 of a file's bytes (a profile or a trace the scenario reads)."""
    with open(path, "rb") as f:
        return "sha256:" + hashlib.file_digest(f, "sha256").hexdigest()


def _by_content(sim: dict, ctx: Context | None) -> dict:
    """``sim`` with each file it names (``loader.PATH_KEYS``: traces, profiles; a choice of
    them too) replaced by the digest of its content: the key follows what is read, not where
    it lies (an edited profile's hbm_tbps reused the rows of the old one)."""
    ctx = ctx or Context.cwd()
    seen: dict[str, str] = {}

    def digest(rel: object) -> object:
        if not isinstance(rel, str):
            return rel
        if rel not in seen:
            try:
                seen[rel] = _file_digest(ctx.resolve(rel, "a file"))
            except (OSError, ValueError):  # (load refused it already; keep the path)
                seen[rel] = rel
        return seen[rel]

    def visit(node: object, rest: tuple) -> object:
        if not rest:
            if unknowns.is_declaration(node) and isinstance(node.get("choice"), list):
                return {**node, "choice": [digest(c) for c in node["choice"]],
                        "nominal": digest(node.get("nominal"))}
            return digest(node)
        head, tail = rest[0], rest[1:]
        if head == "*" and isinstance(node, list):
            return [visit(v, tail) for v in node]
        if isinstance(node, dict) and head in node:
            return {**node, head: visit(node[head], tail)}
        return node

    for keys in loader.PATH_KEYS:
        sim = visit(sim, keys)
    return sim


def _strip_why(node: object) -> object:
    if isinstance(node, dict):
        return {k: _strip_why(v) for k, v in node.items() if k != "why"}
    if isinstance(node, list):
        return [_strip_why(v) for v in node]
    return node


def scenario_hash(data: dict) -> str:
    """Hash of what is simulated: the scenario with its declarations, the content of the
    files it reads (by content, not path: :func:`_by_content`), and pdsim's code."""
    sim = {k: v for k, v in data.items() if k not in _NOT_SIMULATED and k != "seed"}
    sim = _by_content(sim, getattr(data, "context", None))
    text = json.dumps({"scenario": _strip_why(sim), "code": _code_hash()}, sort_keys=True,
                      default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


DIGEST = "row_digest"  # a stored row's check (row_digest)


def _canon(v: object) -> object:
    """A cell as the digest reads it, the same after a Parquet round trip and a concat that
    turned an int column into floats (numbers as float reprs); None for a missing value."""
    if v is None:
        return None
    if isinstance(v, bool | np.bool_):
        return bool(v)
    if isinstance(v, int | float | np.integer | np.floating):
        f = float(v)
        return None if math.isnan(f) else repr(f)
    return str(v)


def row_digest(row: dict) -> str:
    """SHA-256 of a run's row: its key, inputs and outputs (every column but the wall time
    and the digest; missing values left out, as a concat of rows with other columns adds
    them as NaN)."""
    cells = {k: c for k, v in row.items()
             if k != DIGEST and k not in WALL and (c := _canon(v)) is not None}
    return hashlib.sha256(json.dumps(cells, sort_keys=True).encode()).hexdigest()


# --- the Parquet store ------------------------------------------------------------------------


def part_name(key: dict) -> str:
    return f"{key['scenario_hash']}-{key['design']}-s{key['sample']:06d}-k{key['seed']}.parquet"


def write_atomic(df: pd.DataFrame, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    df.to_parquet(tmp, index=False)
    os.replace(tmp, path)


def stored(p: Path) -> pd.DataFrame:
    """Every row of the Parquet files under ``p`` (a ``runs.parquet`` directory, an
    exploration's directory, or a file), in file order, duplicates kept; a file that is not a
    table of rows is skipped (it is no run of ours)."""
    if p.is_dir() and (p / "runs.parquet").is_dir():
        p = p / "runs.parquet"
    files = sorted(p.glob("*.parquet")) if p.is_dir() else [p] if p.is_file() else []
    frames = []
    for f in files:
        try:
            frame = pd.read_parquet(f)
        except (OSError, ValueError):  # (pyarrow's errors are both)
            continue
        if len(frame) and set(KEY) <= set(frame.columns):
            frames.append(frame)
    if not frames:
        return pd.DataFrame(columns=KEY)
    return pd.concat(frames, ignore_index=True)


def read_runs(path: str | Path) -> pd.DataFrame:
    """All rows stored under an exploration's ``runs.parquet`` directory (or a file), one per
    key, sorted by scenario hash, design, sample and seed. (As stored: ``explore`` uses only
    the rows that verify, :func:`verified`.)"""
    df = stored(Path(path))
    if not len(df):
        return df
    df = df.drop_duplicates(subset=KEY, keep="first")
    return df.sort_values(KEY, kind="stable").reset_index(drop=True)


def verified(rows: pd.DataFrame, inputs: dict[int, dict], seeds: list[int]) -> pd.Series:
    """Which of this exploration's stored ``rows`` may stand for a run: those of a sample and
    seed it uses whose digest matches and whose inputs are the design's for their sample
    (rows it does not use, of a larger exploration, are judged when one uses them)."""
    ok = pd.Series(True, index=rows.index)
    for i, row in zip(rows.index, rows.to_dict("records"), strict=True):
        sample, seed = row.get("sample"), row.get("seed")
        if sample not in inputs or seed not in seeds:
            continue
        want = inputs[sample]
        ok[i] = (row.get(DIGEST) == row_digest(row)
                 and all(_canon(row.get(k)) == _canon(v) for k, v in want.items()))
    return ok


def compact(store: Path, shash: str, design: str, rows: pd.DataFrame) -> None:
    """Fold this exploration's files into one file of its ``rows`` (the verified and the new
    ones); files of other keys stay. (A reader dedupes if cut midway.)"""
    mine = sorted(store.glob(f"{shash}-{design}-*.parquet"))
    target = store / f"{shash}-{design}-all.parquet"
    if mine == [target] or not len(rows):
        return
    write_atomic(rows.sort_values(KEY, kind="stable").reset_index(drop=True), target)
    for f in mine:
        if f != target:
            f.unlink(missing_ok=True)

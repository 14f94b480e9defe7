"""What every command shares: the one-line error and its exit code, usage errors, the flags
several commands take, and the checks of output paths and worker counts."""

from __future__ import annotations

import argparse
import fnmatch
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pdsim.util.backends import check_workers
from pdsim.util.safeio import clip, show_path, why

if TYPE_CHECKING:  # pdsim.config.scenario (pydantic) is imported after the parse: --help
    from pdsim.config.scenario import Scenario  # needs none

PROGRESS_AFTER_S = 2.0  # pdsim run on a terminal: a run still going after this shows a bar
MAX_SEEDS = 10_000  # sweep/explore/whatif --seeds


class UsageError(Exception):
    """A bad command line (not a bad scenario); ``str()`` is one line."""


RAW = argparse.RawDescriptionHelpFormatter


def die(msg: str) -> int:
    print(f"pdsim: error: {clip(msg, 2000)}", file=sys.stderr)
    return 2


def outside_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow-outside-paths", action="store_true",
                   help="let the scenario read files (extends:, traces) outside its directory "
                   "tree")


def plugin_flag(p: argparse.ArgumentParser) -> None:
    """``--plugin``: for the commands that read a scenario (run, validate, sweep, explore,
    schema, whatif, faults)."""
    p.add_argument("--plugin", dest="plugins", action="append", default=[],
                   metavar="MODULE|FILE.py", help="import a .py file, or a module or "
                   "package by name as `import MODULE` finds it (not a folder), that "
                   "registers policies or faults (pdsim.config.registry) before reading the "
                   "scenario")


def check_output_file(out: str, option: str) -> None:
    """An output file named by ``option`` (sweep --out, run --perfetto, validate-model --csv):
    checked before the work that fills it."""
    p = Path(out)
    if p.is_dir():
        raise UsageError(f"{option} {show_path(out)}: is a directory; give a file name")
    if not p.parent.is_dir():
        raise UsageError(f"{option} {show_path(out)}: directory {show_path(p.parent)} does "
                         f"not exist")


def image_formats() -> set[str]:
    """File name endings matplotlib's savefig writes (.png, .svg, .pdf, ...)."""
    from matplotlib.backend_bases import FigureCanvasBase

    return set(FigureCanvasBase.get_supported_filetypes())


def inputs(sc: Scenario | None, *files: str | None) -> dict[Path, str]:
    """The files a command reads: the scenario's (its file, extends: parents, profiles,
    traces) and ``files`` (plugin files, --faults-file, a data table, a config.json),
    resolved."""
    found = dict(sc.input_files()) if sc is not None else {}
    for f in files:
        if f:
            p = _resolved(f)
            if p is not None:
                found.setdefault(p, "input file")
    return found


def run_dir_inputs(run_dir: str | Path) -> dict[Path, str]:
    """The files of a run directory a command reads (``pdsim compare DIR``): every name
    :meth:`pdsim.output.result.Result.write` writes, in either table format."""
    from pdsim.output.result import run_dir_names

    base = _resolved(run_dir)
    if base is None:
        return {}
    return {base / name: f"file of the run directory {show_path(run_dir)}"
            for name in dict.fromkeys([*run_dir_names("csv"), *run_dir_names("parquet")])}


def _resolved(path: str | Path) -> Path | None:
    try:
        return Path(path).resolve()
    except (OSError, RuntimeError):  # (a loop: the write fails later, in one line)
        return None


@dataclass(frozen=True)
class Output:
    """Where a command writes: the file ``path`` given to ``option``, or, with ``writes``
    (glob patterns relative to it), the directory ``path`` and the files the command puts in
    it (run --out: ``run_dir_names``; explore: ``explore.WRITTEN``; whatif:
    ``WhatIf.written``). ``image``: a figure, whose name must end in a format matplotlib
    writes."""

    option: str
    path: str | None
    writes: tuple[str, ...] = ()
    image: bool = False


def check_outputs(inputs: dict[Path, str], *outputs: Output) -> None:
    """The one rule every output option follows, checked before anything is run or written:
    an output never replaces an input, nor another output of the same command.

    - a file output is none of ``inputs`` (the command's input files, resolved: symlinks
      followed; an existing output that is the same file as an input, a hard link, counts);
    - a directory output writes none of them (an input inside it with a name it writes);
    - two outputs are not the same file, and a file output is not one a directory output
      writes (``run --out DIR --perfetto DIR/requests.csv``);
    - a file output is not a directory and its directory exists (or is a directory output,
      which the command makes); a figure's name ends in an image format.

    ``pdsim run s.yaml --perfetto s.yaml`` replaced the scenario with the trace (issue #28);
    ``profiles import cfg.json --out cfg.json`` the config with the profile."""
    done: list[tuple[Output, Path]] = []
    for o in outputs:
        target = _resolved(o.path) if o.path else None
        if target is None:  # (none given; a symlink loop: the write fails later, one line)
            continue
        for p, what in inputs.items():
            if _writes(o, target, p):
                _refuse(o, p, f"{'an' if what[0] in 'aeiou' else 'a'} {what} of this command")
        for other, where in done:
            if not o.writes and not other.writes and _same(target, where):
                raise UsageError(f"{o.option} {show_path(o.path)}: is also {other.option}'s "
                                 f"output; give each its own file")
            if other.writes and not o.writes and _writes(other, where, target):
                _refuse(o, target, f"a file {other.option} writes")
            if o.writes and not other.writes and _writes(o, target, where):
                _refuse(other, where, f"a file {o.option} writes")
        done.append((o, target))
    made = [t for o, t in done if o.writes]
    for o, target in done:
        if o.writes:
            continue
        if os.path.basename(str(o.path)) in ("", ".", ".."):
            # (Path drops them: "adir/" and "adir/." wrote a file adir)
            raise UsageError(f"{o.option} {show_path(o.path)}: names a directory; give a file "
                             f"name")
        if target.parent not in made:  # (a directory output is made by the command)
            check_output_file(o.path, o.option)
        if o.image:
            kinds = image_formats()
            ext = target.suffix.lower().lstrip(".")
            if ext not in kinds:
                raise UsageError(f"{o.option} {show_path(o.path)}: "
                                 f"{('.' + ext) if ext else 'no extension'} is not an image "
                                 f"format; end the name with one of "
                                 f"{', '.join('.' + k for k in sorted(kinds))}")


def _same(a: Path, b: Path) -> bool:
    if a == b:
        return True
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def _writes(o: Output, target: Path, p: Path) -> bool:
    """Whether output ``o`` (resolved to ``target``) would write the file ``p``."""
    if not o.writes:
        return _same(target, p)
    try:
        rel = p.relative_to(target).as_posix()
    except ValueError:
        return False
    return any(fnmatch.fnmatch(rel, pattern) for pattern in o.writes)


def _refuse(o: Output, p: Path, what: str) -> None:
    raise UsageError(f"{o.option} {show_path(o.path)}: would replace {show_path(p)}, {what}; "
                     f"write it elsewhere")


def prepare_out_dir(out: str) -> None:
    """``run --out DIR``: an existing directory or one we can create, before the run."""
    p = Path(out)
    if p.exists() and not p.is_dir():
        raise UsageError(f"--out {show_path(out)}: exists and is not a directory")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"--out {show_path(out)}: cannot create the directory "
                         f"({why(err)})") from None


def check_worker_args(args: argparse.Namespace) -> None:
    try:
        check_workers(args.workers, args.backend)
    except ValueError as err:
        raise UsageError(f"--{err}") from None


def load_scenario(args: argparse.Namespace) -> Scenario:
    """The scenario of ``args`` (its file, ``--set`` and ``--seed``), checked in full."""
    from pdsim.config import loader

    sets = list(args.sets)
    if getattr(args, "seed", None) is not None:
        sets.append(f"seed={args.seed}")
    return loader.load(args.scenario, sets, allow_outside_paths=args.allow_outside_paths)

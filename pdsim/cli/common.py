"""What every command shares: the one-line error and its exit code, usage errors, the flags
several commands take, and the checks of output paths and worker counts."""

from __future__ import annotations

import argparse
import fnmatch
import os
import sys
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


def check_plot_file(out: str, inputs: list[Path], run_dirs: list[Path] = (),
                    option: str = "--plot") -> None:
    """A figure's output file: a name whose extension matplotlib writes (.png, .svg, .pdf,
    ...), in an existing directory, and none of the run's own files (``inputs``: the files it
    reads; ``run_dirs``: the run directories it reads or writes, whose files it must not
    replace)."""
    p = Path(out).resolve()
    if p.parent not in [Path(d).resolve() for d in run_dirs]:  # (--out DIR: made by the run)
        check_output_file(out, option)
    for given in [*inputs, *run_dirs]:
        src = Path(given).resolve()
        if p == src or (given in run_dirs and p.parent == src and p.name in RUN_DIR_FILES):
            raise UsageError(f"{option} {show_path(out)}: would overwrite a file the run "
                             f"reads or writes ({show_path(given)}); give another file name")
    from matplotlib.figure import Figure

    kinds = Figure().canvas.get_supported_filetypes()
    ext = p.suffix.lower().lstrip(".")
    if ext not in kinds:
        raise UsageError(f"{option} {show_path(out)}: {('.' + ext) if ext else 'no extension'}"
                         f" is not an image format; end the name with one of "
                         f"{', '.join('.' + k for k in sorted(kinds))}")


# what a run directory holds (pdsim.output.result.Result.write)
RUN_DIR_FILES = ("requests.csv", "requests.parquet", "events.csv", "events.parquet",
                 "timeseries.csv", "timeseries.parquet", "answers.csv", "answers.parquet",
                 "summary.json", "report.txt", "scenario.yaml", "run.json")


def scenario_inputs(path: str | Path, sc: Scenario | None = None) -> list[Path]:
    """The files a scenario reads: itself, the files it extends, its trace or dataset files and
    its profile files. A loaded scenario knows them (``Scenario.input_files``, the rule every
    output check uses, :func:`no_overwrite`); without one, the ``extends:`` chain is followed
    from ``path`` as far as it can be read."""
    if sc is not None:
        return [Path(path).resolve(), *sc.input_files()]
    from pdsim.config import loader
    from pdsim.util.safeio import UserFileError, decode_utf8, read_user_file

    files = []
    p: Path | None = Path(path)
    while p is not None and p.is_file() and p.resolve() not in files and len(files) < 64:
        files.append(p.resolve())
        try:
            data = loader.parse_yaml(decode_utf8(read_user_file(p, "scenario file", 1 << 24),
                                                 str(p)), str(p))
        except (UserFileError, ValueError):
            break
        parent = data.get("extends") if isinstance(data, dict) else None
        p = (p.parent / parent) if isinstance(parent, str) else None
    return files


def inputs(sc: Scenario | None, *files: str | None) -> dict[Path, str]:
    """The files a command reads: the scenario's (its file, extends: parents, profiles,
    traces) and ``files`` (plugin files, --faults-file, a data table), resolved."""
    found = dict(sc.input_files()) if sc is not None else {}
    for f in files:
        if f:
            p = _resolved(f)
            if p is not None:
                found.setdefault(p, "input file")
    return found


def _resolved(path: str | Path) -> Path | None:
    try:
        return Path(path).resolve()
    except (OSError, RuntimeError):  # (a loop: the write fails later, in one line)
        return None


def no_overwrite(option: str, out: str | None, inputs: dict[Path, str],
                 written: list[str] | tuple[str, ...] = ()) -> None:
    """Refuse an output that would replace one of the command's input files, before anything
    is written (``pdsim run s.yaml --perfetto s.yaml`` replaced the scenario with the trace):
    the file ``out``, or, given ``written`` (glob patterns relative to it), the files the
    command writes in the directory ``out``. Paths compare resolved (symlinks followed), and
    an existing output that is the same file as an input (a hard link) counts too."""
    if not out:
        return
    target = _resolved(out)
    if target is None:
        return
    for p, what in inputs.items():
        if written:
            try:
                rel = p.relative_to(target).as_posix()
            except ValueError:
                continue
            hit = any(fnmatch.fnmatch(rel, pattern) for pattern in written)
        else:
            hit = p == target
            if not hit and target.exists():
                try:
                    hit = os.path.samefile(p, target)
                except OSError:
                    hit = False
        if hit:
            raise UsageError(f"{option} {show_path(out)}: would replace {show_path(p)}, "
                             f"{'an' if what[0] in 'aeiou' else 'a'} {what} of this command; "
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

"""What every command shares: the one-line error and its exit code, usage errors, the flags
several commands take, and the checks of output paths and worker counts."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pdsim.util.backends import check_workers
from pdsim.util.safeio import clip, show_path

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


def prepare_out_dir(out: str) -> None:
    """``run --out DIR``: an existing directory or one we can create, before the run."""
    p = Path(out)
    if p.exists() and not p.is_dir():
        raise UsageError(f"--out {show_path(out)}: exists and is not a directory")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"--out {show_path(out)}: cannot create the directory "
                         f"({err.strerror or type(err).__name__})") from None


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

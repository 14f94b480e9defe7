"""pdsim command line: a thin layer over pdsim.run.

Results go to stdout; progress and notes go to stderr. Every user error exits 2 with one line;
an unexpected exception exits 70 with one line asking for a bug report (the traceback only with
``PDSIM_DEBUG=1``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from pdsim.cli import compare, model, run, sweep, whatif
from pdsim.cli.common import RAW, die, plugin_flag
from pdsim.util.safeio import clip

TOP = """\
pdsim simulates prefill/decode-disaggregated LLM serving (SGLang-style PD fleets, a
Mooncake-like KV transfer engine with its peer blacklist, mini_lb, bench_serving and gsm8k
clients), one event per batch step. Replay an incident, ask what-if of a policy, draw a
postmortem's plots.

Results go to stdout, notes and progress bars to stderr. Run `pdsim COMMAND --help` for a
command's options and examples."""

TOP_EPILOG = """\
examples:
  pdsim run scenarios/drop_timeout.yaml               the incident, bench_serving-style report
  pdsim run scenarios/drop_timeout.yaml --set blacklist.policy=probe
  pdsim run scenarios/drop_timeout.yaml --plot postmortem.png    the postmortem figure
  pdsim compare runs/a runs/b --plot a_vs_b.png      two runs side by side (pdsim run --out)
  pdsim sweep scenarios/drop_timeout.yaml --vary blacklist.policy=permanent,probe,v0_5_23
  pdsim whatif scenarios/whatif_base.yaml --seeds 3   blacklist policies x fault library
  pdsim validate my.yaml                              check a scenario before running it
  pdsim profiles dsv3-ci-test                         a model profile, every value's source"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pdsim", description=TOP, epilog=TOP_EPILOG,
                                formatter_class=RAW)
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    reading = [run.add_run(sub), run.add_validate(sub), compare.add_compare(sub),
               sweep.add_sweep(sub), sweep.add_explore(sub), run.add_schema(sub),
               whatif.add_whatif(sub), whatif.add_faults(sub)]
    for sp in reading:
        plugin_flag(sp)
    model.add_profiles(sub)
    model.add_calibrate(sub)
    model.add_validate_model(sub)
    return p


def parser() -> argparse.ArgumentParser:
    """The parser ``pdsim`` parses with (the docs' command reference is generated from it:
    docs/gen/reference.py)."""
    return _parser()


def main(argv: list[str] | None = None) -> int:
    """Entry point; user errors exit 2, an unexpected exception 70 (one line each)."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("pdsim: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `pdsim run ... | head`
        try:
            sys.stdout = open(os.devnull, "w")  # no second error when Python flushes at exit
        except OSError:
            pass
        return 0
    except MemoryError:
        return die("out of memory; shorten the run (num_prompts, horizon_s) or the sweep")
    except Exception as err:  # last resort: a bug, not a user error
        if isinstance(err, ImportError) and err.name == "simpy":  # not a bug: SimPy missing, or
            return die(str(err))  # a release pdsim.engine.clock does not support
        if _interrupted(err):
            print("pdsim: interrupted", file=sys.stderr)
            return 130
        if os.environ.get("PDSIM_DEBUG"):
            raise
        print(f"pdsim: internal error: {type(err).__name__}: {clip(str(err), 200)}; this is a "
              f"bug in pdsim; please report it (PDSIM_DEBUG=1 shows the traceback)",
              file=sys.stderr)
        return 70


def _interrupted(err: BaseException) -> bool:
    """Ctrl-C wrapped in another exception: Python reports one that lands while a class is
    being built (an import) as RuntimeError('Error calling __set_name__ ...') from it."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, KeyboardInterrupt):
            return True
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return False


_NOT_EMPTY = ("out", "perfetto", "csv", "plot", "write_docs", "faults_file", "scenario",
              "timeline", "param", "format", "address", "fit")

def _main(argv: list[str] | None) -> int:
    args = _parser().parse_args(argv)
    for opt in _NOT_EMPTY:
        if getattr(args, opt, None) == "" and (opt != "scenario" or args.cmd == "profiles"):
            return die(f"--{opt.replace('_', '-')}: an empty value; give one, or leave the "
                       f"option out")
    from pdsim.config import loader
    from pdsim.config.registry import load_plugin

    try:
        for plugin in getattr(args, "plugins", []):
            load_plugin(plugin)
    except ValueError as err:
        return die(str(err))
    if args.cmd == "schema":
        print(json.dumps(loader.json_schema(), indent=2))
        return 0
    handlers = {"compare": compare.compare_cmd, "sweep": sweep.sweep_cmd,
                "explore": sweep.explore_cmd,
                "whatif": whatif.whatif_cmd, "faults": whatif.faults_cmd,
                "profiles": model.profiles_cmd, "calibrate": model.calibrate_cmd,
                "validate-model": model.validate_model_cmd}
    if args.cmd in handlers:
        return handlers[args.cmd](args)
    return run.run_or_validate(args)


if __name__ == "__main__":
    sys.exit(main())

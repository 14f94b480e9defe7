"""pdsim: discrete-event simulation of prefill/decode-disaggregated LLM serving.

    >>> import pdsim
    >>> res = pdsim.run("scenarios/healthy.yaml")
    >>> res.summary["output_throughput_tok_s"], res.requests.head()
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING, Any

from pdsim.util.version import __version__ as __version__  # (re-exported)

if TYPE_CHECKING:
    from pdsim.analysis.explore import Exploration, explore
    from pdsim.analysis.sweep import sweep
    from pdsim.analysis.whatif import whatif
    from pdsim.analysis.whatif_table import WhatIf
    from pdsim.config.loader import load
    from pdsim.config.scenario import Scenario
    from pdsim.config.units import ScenarioError
    from pdsim.output.result import Result, run

# Public names, each imported from its module on first use (PEP 562), so that `import pdsim`,
# `pdsim.load` and `pdsim validate` do not load pandas, pyarrow and numpy (~0.5 s) for nothing.
_HOME = {"Exploration": "analysis.explore", "explore": "analysis.explore",
         "Scenario": "config.scenario", "ScenarioError": "config.units",
         "load": "config.loader", "Result": "output.result", "run": "output.result",
         "sweep": "analysis.sweep", "WhatIf": "analysis.whatif_table", "whatif": "analysis.whatif"}

__all__ = ["Exploration", "Result", "Scenario", "ScenarioError", "WhatIf", "explore", "load",
           "run", "sweep", "whatif"]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is not None:
        value = getattr(importlib.import_module(f"pdsim.{home}"), name)
        globals()[name] = value
        return value
    if name in _submodules():  # ``pdsim.model.profiles`` etc. after a bare ``import pdsim``
        return importlib.import_module(f"pdsim.{name}")  # (the import sets the attribute)
    raise AttributeError(f"module 'pdsim' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public names, the layers' packages and the module's dunders (not this file's
    helpers)."""
    dunders = {n for n in globals() if n.startswith("__")}
    return sorted(dunders | set(__all__) | set(_submodules()))


def _submodules() -> frozenset:
    global _SUBMODULES
    if _SUBMODULES is None:
        _SUBMODULES = frozenset(m.name for m in pkgutil.iter_modules(__path__))
    return _SUBMODULES


_SUBMODULES = None  # (frozenset of names, on first use)

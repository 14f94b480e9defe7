"""pdsim: discrete-event simulation of prefill/decode-disaggregated LLM serving.

    >>> import pdsim
    >>> res = pdsim.run("scenarios/healthy.yaml")
    >>> res.summary["output_throughput_tok_s"], res.requests.head()
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pdsim.explore import Exploration, explore
    from pdsim.scenario import Scenario, ScenarioError, load
    from pdsim.sim import Result, run
    from pdsim.sweep import sweep
    from pdsim.whatif import WhatIf, whatif

# Public names, each imported from its module on first use (PEP 562), so that `import pdsim`,
# `pdsim.load` and `pdsim validate` do not load pandas, pyarrow and numpy (~0.5 s) for nothing.
_HOME = {"Exploration": "explore", "explore": "explore", "Scenario": "scenario",
         "ScenarioError": "scenario", "load": "scenario", "Result": "sim", "run": "sim",
         "sweep": "sweep", "WhatIf": "whatif", "whatif": "whatif"}
# Functions named like the submodule that defines them: the package attribute is the function.
_SHADOWED = ("explore", "sweep", "whatif")

__all__ = ["Exploration", "Result", "Scenario", "ScenarioError", "WhatIf", "explore", "load",
           "run", "sweep", "whatif"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is not None:
        value = getattr(importlib.import_module(f"pdsim.{home}"), name)
        globals()[name] = value
        return value
    if name in _submodules():  # ``pdsim.profiles`` etc. after a bare ``import pdsim``
        return importlib.import_module(f"pdsim.{name}")  # (the import sets the attribute)
    raise AttributeError(f"module 'pdsim' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public names, the submodules and the module's dunders (not this file's helpers)."""
    dunders = {n for n in globals() if n.startswith("__")}
    return sorted(dunders | set(__all__) | set(_submodules()))


def _submodules() -> frozenset:
    global _SUBMODULES
    if _SUBMODULES is None:
        _SUBMODULES = frozenset(m.name for m in pkgutil.iter_modules(__path__))
    return _SUBMODULES


_SUBMODULES = None  # (frozenset of names, on first use)


class _Package(types.ModuleType):
    """Keeps ``pdsim.sweep`` (and explore, whatif) the function: importing a submodule sets the
    package's attribute of its name to the module, which would shadow the function."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _SHADOWED and isinstance(value, types.ModuleType):
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

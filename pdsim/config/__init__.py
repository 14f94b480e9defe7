"""Layer 2, config: what a user writes. The scenario schema (units and errors, the fleet and its
policies, clients and datasets, faults and reference figures, the top-level Scenario), reading
it safely (``extends:``, ``--set``), the registries of pluggable behaviour that drive its JSON
Schema, declared unknowns, traces, and the schema of profile files. Imports only util.

Checks that need the model (a KV pool that must fit, a predictor that must build) are registered
by the model layer with :func:`pdsim.config.scenario.load_check`; the loader imports the
built-in ones by name on first use (``pdsim.config.scenario._BUILTIN_CHECKS``), the one lazy
upward import in pdsim, so that ``pdsim validate`` catches everything ``pdsim run`` would.
"""

from pdsim.util.lazy import submodules

__getattr__, __dir__ = submodules(__name__, __path__)

"""Layer 2, config: what a user writes. The scenario schema (units and errors, the fleet and its
policies, clients and datasets, faults and reference figures, the top-level Scenario), reading
it safely (``extends:``, ``--set``), the registries of pluggable behaviour that drive its JSON
Schema, declared unknowns, traces, and the schema of profile files. Imports only util.

What is pluggable is registered from above, into registries that live here: blacklist policies
and fault kinds (engine code) into :mod:`pdsim.config.registry`'s ``BLACKLIST_POLICIES`` and
``FAULTS``, load-time checks that need the model (the KV pool must fit) through
:func:`pdsim.config.scenario.load_check`. A registry imports the module of its built-in entries
by name the first time it is read (``Registry.builtins``, ``scenario._BUILTIN_CHECKS``), so
that the schema lists every policy and ``pdsim validate`` catches everything ``pdsim run``
would, whoever imported what. These three by-name imports are pdsim's only upward ones
(``tests/test_structure.py``, ``BY_NAME``); the code of this layer never calls into the layers
above except through what they registered.
"""

from pdsim.util.lazy import submodules

__getattr__, __dir__ = submodules(__name__, __path__)

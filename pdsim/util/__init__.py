"""Layer 1, util: pure helpers that know nothing of serving (bounded file reading, safe YAML,
random streams, fanning runs out to processes or Ray, lazy submodules, the version). Imports
nothing from pdsim above it.

``backends`` lives here rather than with the analyses that use it most: the scenario's limits
(``pdsim.config.loader.limits``) name its ``MAX_RUNS`` and a run's progress bar is its
``progress_bar``; it imports no other pdsim module.
"""

from pdsim.util.lazy import submodules

__getattr__, __dir__ = submodules(__name__, __path__)

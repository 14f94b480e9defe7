"""Layer 6, analysis: many runs. Grids of overrides (``sweep``), explorations of declared
unknowns, the blacklist what-if matrix and its scoring, model validation against published
rows and its held-out refits. Imports output and below.
"""

from pdsim.util.lazy import submodules

__getattr__, __dir__ = submodules(__name__, __path__)

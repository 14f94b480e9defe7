"""Layer 6, analysis: many runs. Grids of overrides (``sweep``), explorations of declared
unknowns and their statistics, the blacklist what-if (capacity, loads from it, windows named
from each fault's timing, regret with bootstrap intervals and a tie rule, the recommendation),
model validation against published rows and its held-out refits. Imports output and below.
"""

from pdsim.util.lazy import submodules

__getattr__, __dir__ = submodules(__name__, __path__)

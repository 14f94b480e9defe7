"""Layer 3, model: how fast and how big. GPU, model and engine profiles (the shipped catalog in
``data/`` and user profile files), the step-time predictors, the KV memory budget and
calibration against measured rows. Imports config (the scenario's and profiles' types) and util.
"""

from pdsim.util.lazy import submodules

__getattr__, __dir__ = submodules(__name__, __path__)

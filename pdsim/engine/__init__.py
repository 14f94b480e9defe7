"""Layer 4, engine: the simulated fleet and its data path. The event-order clock on SimPy, the
requests, KV pools, NICs and transfers, the blacklist and faults, the prefill and decode ranks
and their lockstep, servers, router and clients, the fleet that wires them, the event log and
the run loop (:func:`pdsim.engine.run.simulate`). Imports model, config and util.

The run's summary metrics (``summary``) live here, not in output: they are computed while the
fleet still exists, just before it is released.
"""

from pdsim.util.lazy import submodules

__getattr__, __dir__ = submodules(__name__, __path__)

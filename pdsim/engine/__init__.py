"""Layer 4, engine: the simulated fleet and its data path. The event-order clock on SimPy, the
requests, KV pools, NICs and transfers, the blacklist and faults, the prefill and decode ranks
and their lockstep, servers, router and clients, the fleet that wires them, the event log and
the run loop (:func:`pdsim.engine.sim.simulate`, which makes an
:class:`~pdsim.engine.outcome.Outcome`). Imports model, config and util.

``summary`` (the metrics as bench_serving reports them) and ``stats`` (run-wide counters) live
here, not in output or util: the summary is computed while the fleet still exists, just before
it is released, and the counters are bumped on the engine's hot path.
"""

from pdsim.util.lazy import submodules

__getattr__, __dir__ = submodules(__name__, __path__)

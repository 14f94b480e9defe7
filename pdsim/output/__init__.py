"""Layer 5, output: what a run gives back. :class:`pdsim.output.result.Result` (the engine's
outcome plus its self-describing run directory) and the public ``run``, the human report,
figures and the Perfetto trace. Imports engine and below.

``run`` lives here, above both the engine and the report: a Result writes ``report.txt``, and
the engine's loop must not import the report.
"""

from pdsim.util.lazy import submodules

__getattr__, __dir__ = submodules(__name__, __path__)

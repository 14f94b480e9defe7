"""Layer 7, cli: the ``pdsim`` command, a thin layer over the library: ``main`` builds the
argparse parser and dispatches to one module per command group. Imports anything below, mostly
lazily (``pdsim --help`` loads no pandas or pydantic). ``python -m pdsim.cli`` runs it; the
``pdsim`` console script is ``pdsim.cli.main:main``.
"""

from pdsim.util.lazy import submodules

__getattr__, __dir__ = submodules(__name__, __path__)

"""Layer 7, cli: the ``pdsim`` command, a thin layer over the library: ``main`` builds the
argparse parser and dispatches to one module per command group. Imports anything below, mostly
lazily (``pdsim --help`` loads no pandas or pydantic).
"""

from pdsim.util.lazy import submodules

__getattr__, __dir__ = submodules(__name__, __path__)

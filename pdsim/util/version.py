"""pdsim's version, in one place: the package re-exports it (``pdsim.__version__``) and a run
directory's ``run.json`` and ``scenario.yaml`` record it. Here, in the lowest layer, so that any
module may read it without importing the package's public API above every layer."""

__version__ = "0.1.0"

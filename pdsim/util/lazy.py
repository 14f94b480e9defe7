"""A package's submodules as attributes on first use (PEP 562), without importing them all.

``import pdsim`` then ``pdsim.model.profiles.gpu("H20")`` works as if every module had been
imported, yet a bare import loads nothing heavy (pandas, pydantic, SimPy): each package's
``__getattr__`` imports the submodule asked for, and the import sets the attribute."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import Any


def submodules(package: str, path: list[str]) -> tuple[Callable[[str], Any],
                                                          Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package`` (its ``__name__`` and ``__path__``)."""
    names: list[frozenset] = []

    def known() -> frozenset:
        if not names:
            names.append(frozenset(m.name for m in pkgutil.iter_modules(path)))
        return names[0]

    def getattr_(name: str) -> Any:
        if name in known():
            return importlib.import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def dir_() -> list[str]:
        mod = importlib.import_module(package)
        return sorted(set(vars(mod)) | known())

    return getattr_, dir_

"""House rules a reviewer would otherwise check by hand: the layers import only downward, no
import circles, no module over MAX_LINES, ruff clean, the report scripts answer --help.

The package tree is the architecture (pdsim/__init__.py's docstrings of each layer say what
lives where and why). LAYERS lists them lowest first; a module may import its own layer and the
layers below it. An import at module level (TYPE_CHECKING blocks included) must go down; an
import inside a function is a deliberate lazy import (to keep ``import pdsim`` and ``pdsim
--help`` light) and may go down too; one going up must be listed in LAZY_UP with its reason.
A module named as a string (``"pdsim.engine.faults"``, for ``importlib.import_module``) counts
as an import by name; one going up must be listed in BY_NAME.
Circles count every import: module level, lazy and by name.
"""

from __future__ import annotations

import ast
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

PKG = ROOT / "pdsim"
LAYERS = ("util", "config", "model", "engine", "output", "analysis", "cli")
# Public surfaces beside pdsim/__init__.py, above every layer: they may import any layer, and no
# module of pdsim may import them (pdsim.plugins: what plugin authors import).
PUBLIC = ("plugins",)
MAX_LINES = 600

# Imports that go up a layer on purpose: (importer, imported) -> why. Keep it short.
LAZY_UP: dict[tuple[str, str], str] = {}
# Modules named as strings and imported with importlib, (importer, imported) -> why; these are
# registration bootstraps (the imported module registers into the importer), so they are
# upward by nature and are not edges of the circle check.
BY_NAME: dict[tuple[str, str], str] = {
    ("config.registry", "engine.blacklist"):
        "BLACKLIST_POLICIES imports the module registering the built-in blacklist policies the "
        "first time it is read: the schema and validation of `blacklist:` need every policy, "
        "and the policies are engine code (Registry.builtins)",
    ("config.registry", "engine.faults_pd"):
        "FAULTS likewise imports the module registering the built-in fault kinds and presets "
        "(engine.faults_pd, which imports engine.faults: the kinds of both)",
    ("config.scenario", "model.memory"):
        "load() imports the module whose load_check registers the KV-pool check (the pool must "
        "fit; it needs the profiles and the predictor, a layer up) the first time a scenario "
        "is checked, so that `pdsim validate` and pdsim.load reject what `pdsim run` would "
        "without the caller importing the model layer (config.scenario._BUILTIN_CHECKS)",
}


def _modules(pkg: Path = PKG) -> dict[str, Path]:
    """Every module under ``pkg`` by dotted name relative to it (``engine.clock``; a package's
    ``__init__`` is the package, ``engine``), the root package itself left out: it is the
    public API above every layer."""
    out = {}
    for p in sorted(pkg.rglob("*.py")):
        parts = p.relative_to(pkg).with_suffix("").parts
        if parts[-1] in ("__init__", "__main__"):
            parts = parts[:-1] if parts[-1] == "__init__" else parts
        if parts:
            out[".".join(parts)] = p
    return out


def _imports(path: Path, known: set[str], pkg: Path = PKG
             ) -> tuple[set[str], set[str], set[str]]:
    """(module-level, lazy, by-name) pdsim modules ``path`` imports, each resolved to the
    deepest known module (``from pdsim.engine import clock`` -> ``engine.clock``;
    ``from pdsim.engine.clock import X`` -> ``engine.clock``). A module-level import includes
    TYPE_CHECKING blocks, try/except and if branches; one inside a function or method is lazy.
    A relative import resolves against the module's own package; ``from pdsim import x`` of a
    name that is not a layer (``__version__``, ``run``) is an import of the root package,
    ``<root>``, which is above every layer."""
    rel = path.relative_to(pkg).with_suffix("").parts
    package = list(rel[:-1]) if rel[-1] != "__init__" else list(rel[:-1])
    top: set[str] = set()
    lazy: set[str] = set()
    by_name: set[str] = set()

    def resolve(dotted: str, names: list[str]) -> set[str]:
        found = set()
        for n in names or [""]:
            full = f"{dotted}.{n}" if dotted and n else dotted or n
            if full in known:
                found.add(full)
            elif dotted in known:
                found.add(dotted)
            elif dotted == "" and n:  # from pdsim import x: x is a layer or the root's name
                found.add("<root>")
            else:
                found.add(dotted)
        return {f for f in found if f}

    def targets(node: ast.AST) -> set[str]:
        if isinstance(node, ast.ImportFrom):
            names = [a.name for a in node.names]
            if node.level:
                base = package[: len(package) - node.level + 1]
                dotted = ".".join([*base, *(node.module.split(".") if node.module else [])])
                return resolve(dotted, names)
            if node.module == "pdsim":
                return resolve("", names)
            if node.module and node.module.startswith("pdsim."):
                return resolve(node.module[len("pdsim."):], names)
        elif isinstance(node, ast.Import):
            return {resolve(a.name[len("pdsim."):], []).pop() for a in node.names
                    if a.name.startswith("pdsim.")}
        return set()

    def visit(nodes: list[ast.AST], inner: bool) -> None:
        for node in nodes:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                (lazy if inner else top).update(targets(node))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(node.body if isinstance(node.body, list) else [node.body], True)
            else:
                for child in ast.iter_child_nodes(node):
                    visit([child], inner)

    tree = ast.parse(path.read_text())
    visit(tree.body, False)
    for node in ast.walk(tree):  # "pdsim.x.y" string constants naming a module
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and node.value.startswith("pdsim.") and node.value[len("pdsim."):] in known:
            by_name.add(node.value[len("pdsim."):])
    return top, lazy, by_name


def _graphs(pkg: Path = PKG) -> tuple[dict, dict, dict]:
    mods = _modules(pkg)
    known = set(mods)
    top, lazy, by_name = {}, {}, {}
    for m, p in mods.items():
        t, z, b = _imports(p, known, pkg)
        top[m], lazy[m], by_name[m] = t - {m}, z - t - {m}, b - {m}
    return top, lazy, by_name


def _layer(module: str) -> int:
    """The layer's index (a public surface: above them all; outside every layer: -1)."""
    head = module.split(".")[0]
    if module in PUBLIC:
        return len(LAYERS)
    return LAYERS.index(head) if head in LAYERS else -1


def _upward(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) pairs where the imported module is in a higher layer (a module
    outside every layer, or a public surface, counts as above all: no layer may import it)."""
    return sorted((m, n) for m, ns in graph.items() for n in ns
                  if _layer(n) == -1 or _layer(n) > _layer(m))


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(m):
        state[m] = 1
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state and (c := dfs(n)):
                return c
        state[m] = 2
        stack.pop()
        return None

    for m in sorted(graph):
        if m not in state and (c := dfs(m)):
            return c
    return None


def _oversized(pkg: Path = PKG, limit: int = MAX_LINES) -> list[tuple[str, int]]:
    return [(str(p.relative_to(pkg.parent)), n) for p in sorted(pkg.rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > limit]


# --- the rules, on pdsim ---------------------------------------------------------------------


def test_every_module_lives_in_a_layer():
    stray = [m for m in _modules() if _layer(m) == -1]
    assert not stray, f"modules outside the layers {LAYERS}: {stray}"


def test_module_level_imports_only_go_down():
    top, _lazy, _by_name = _graphs()
    up = _upward(top)
    assert not up, "upward imports (importer -> imported): " + ", ".join(
        f"{a} -> {b}" for a, b in up)


def test_lazy_upward_imports_are_the_listed_ones():
    _top, lazy, by_name = _graphs()
    assert set(_upward(lazy)) == set(LAZY_UP), (
        "lazy imports going up a layer (list each in LAZY_UP with why, or move the code): "
        f"{_upward(lazy)}")
    assert set(_upward(by_name)) == set(BY_NAME), (
        f"modules named as strings a layer up (list each in BY_NAME with why): "
        f"{_upward(by_name)}")


def test_the_package_has_no_import_circles():
    top, lazy, _by_name = _graphs()
    graph = {m: top[m] | lazy[m] for m in top}
    c = _cycle(graph)
    assert c is None, " -> ".join(c)


def test_no_module_is_over_the_line_limit():
    assert not _oversized(), f"over {MAX_LINES} lines (split along a seam): {_oversized()}"


# --- the checkers can fail -------------------------------------------------------------------


def _fake(tmp_path: Path, files: dict[str, str]) -> Path:
    pkg = tmp_path / "pdsim"
    for rel, text in files.items():
        f = pkg / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    for d in [pkg, *pkg.rglob("*")]:
        if d.is_dir() and not (d / "__init__.py").exists():
            (d / "__init__.py").write_text("")
    return pkg


def test_the_import_reader_sees_every_form(tmp_path):
    pkg = _fake(tmp_path, {
        "util/a.py": "", "util/b.py": "", "config/c.py": "", "config/d.py": "",
        "engine/e.py": "", "engine/f.py": "", "engine/g.py": "", "engine/h.py": "",
        "model/m.py": "",
        "output/o.py": (
            "from typing import TYPE_CHECKING\nimport pdsim.util.a\nfrom pdsim.util.b import x\n"
            "from pdsim.config import c\nfrom .p import y\nfrom ..engine import e\n"
            "if TYPE_CHECKING:\n    from pdsim.engine.f import z\n"
            "try:\n    from pdsim.config.d import w\nexcept ImportError:\n    pass\n"
            "def lazy():\n    from pdsim.engine import g\n"
            "class K:\n    def m(self):\n        import pdsim.engine.h\n"
            "NAMES = ['pdsim.model.m']\nfrom pdsim import __version__\n"),
        "output/p.py": "",
    })
    top, lazy, by_name = _imports(pkg / "output" / "o.py", set(_modules(pkg)), pkg)
    assert top == {"util.a", "util.b", "config.c", "output.p", "engine.e", "engine.f", "config.d",
                   "<root>"}
    assert lazy == {"engine.g", "engine.h"}
    assert by_name == {"model.m"}


def test_the_layer_check_finds_an_upward_import(tmp_path):
    pkg = _fake(tmp_path, {"config/low.py": "from pdsim.engine import high\n",
                           "engine/high.py": "from pdsim.config import low\n",
                           "engine/lazy.py": "def f():\n    from pdsim.output import top\n",
                           "output/top.py": ""})
    top, lazy, _ = _graphs(pkg)
    assert _upward(top) == [("config.low", "engine.high")]
    assert _upward(lazy) == [("engine.lazy", "output.top")]
    assert _upward({"util.x": {"stray"}}) == [("util.x", "stray")]
    assert _upward({"cli.x": {"plugins"}, "plugins": {"engine.y", "cli.x"}}) == [
        ("cli.x", "plugins")]


def test_the_cycle_finder_finds_a_circle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_the_cycle_check_counts_lazy_imports(tmp_path):
    """The two circles this layout removed were lazy on one side (validation's lazy import of
    holdout, which imports validation; sim's of report, which imports sim)."""
    pkg = _fake(tmp_path, {"analysis/validation.py": "def md():\n    from pdsim.analysis "
                                                     "import holdout\n",
                           "analysis/holdout.py": "from pdsim.analysis import validation\n"})
    top, lazy, _ = _graphs(pkg)
    graph = {m: top[m] | lazy[m] for m in top}
    assert _cycle(graph) == ["analysis.holdout", "analysis.validation", "analysis.holdout"]


def test_the_size_check_finds_a_long_module(tmp_path):
    pkg = _fake(tmp_path, {"engine/long.py": "x = 1\n" * 7, "engine/short.py": "x = 1\n"})
    assert _oversized(pkg, limit=6) == [("pdsim/engine/long.py", 7)]


# --- tools -----------------------------------------------------------------------------------


def test_ruff_is_clean():
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "pdsim", "tests", "benchmarks",
                          "reports", "docs/gen"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-1000:]


def _reports_state() -> dict:
    return {str(p.relative_to(ROOT)): (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes())
                                       .hexdigest())
            for p in sorted((ROOT / "reports").rglob("*")) if p.is_file()}


@pytest.mark.parametrize("script", sorted(p.name for p in (ROOT / "reports").glob("*.py")))
def test_every_report_script_answers_help_without_running(script):
    before = _reports_state()
    proc = subprocess.run([sys.executable, f"reports/{script}", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert "usage" in proc.stdout
    assert _reports_state() == before  # nothing regenerated, no file touched

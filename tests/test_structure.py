"""House rules a reviewer would otherwise check by hand: no import circles, ruff clean."""

from __future__ import annotations

import ast
import hashlib
import os
import subprocess
import sys

import pytest
from conftest import ROOT

PKG = ROOT / "pdsim"


def _module_imports(path) -> set[str]:
    """pdsim modules a module imports at module level, TYPE_CHECKING blocks included (an import
    inside a function is a deliberate lazy import and does not count)."""
    found: set[str] = set()

    def visit(stmts):
        for node in stmts:
            if isinstance(node, ast.ImportFrom) and node.level:  # relative: from .x / from .
                if node.module:
                    found.add(node.module.split(".")[0])
                else:
                    found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                if node.module == "pdsim":
                    found.update(a.name for a in node.names)
                elif node.module.startswith("pdsim."):
                    found.add(node.module.split(".")[1])
            elif isinstance(node, ast.Import):
                found.update(a.name.split(".")[1] for a in node.names
                             if a.name.startswith("pdsim."))
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(getattr(node, "orelse", []))
                for h in getattr(node, "handlers", []):
                    visit(h.body)

    visit(ast.parse(path.read_text()).body)
    return found


def _graph() -> dict[str, set[str]]:
    mods = {p.stem: p for p in PKG.glob("*.py")}
    return {m: _module_imports(p) & mods.keys() - {m} for m, p in mods.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(m):
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
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


def test_the_package_has_no_import_circles():
    assert _cycle(_graph()) is None, " -> ".join(_cycle(_graph()))


def test_the_import_reader_sees_every_form(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("from typing import TYPE_CHECKING\nimport pdsim.a\nfrom pdsim.b import x\n"
                 "from pdsim import c\nfrom .d import y\nfrom . import e\n"
                 "if TYPE_CHECKING:\n    from pdsim.f import z\n"
                 "def lazy():\n    from pdsim.g import w\n")
    assert _module_imports(f) == {"a", "b", "c", "d", "e", "f"}


def test_the_cycle_finder_finds_a_circle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_ruff_is_clean():
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "pdsim", "tests", "benchmarks",
                          "reports"], cwd=ROOT, capture_output=True, text=True)
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

"""MkDocs hook: serve the repository's generated reports and records as pages of the site.

The reports (``reports/*.md`` and their figures), the performance history
(``benchmarks/HISTORY.md``) and the validation cases (``validation/README.md``) are written by
their own scripts where they live; the site shows those very files instead of copies that could
drift. Each keeps its path (``reports/drop_timeout.md`` is the page ``reports/drop_timeout/``),
so a docs page links to it as ``../reports/drop_timeout.md`` and the reports' own relative
image links work. ``mkdocs.yml`` names this file under ``hooks:`` and watches the same paths.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
SHOWN = ("reports/*.md", "reports/*.png", "benchmarks/HISTORY.md", "validation/README.md")


def repo_files() -> list[str]:
    """The repository files the site shows, as paths relative to the repository's root."""
    return sorted({p.relative_to(ROOT).as_posix() for pattern in SHOWN
                   for p in ROOT.glob(pattern) if p.is_file()})


def on_files(files: Files, config) -> Files:
    for rel in repo_files():
        if files.get_file_from_path(rel) is None:
            files.append(File.generated(config, rel, abs_src_path=str(ROOT / rel)))
    return files

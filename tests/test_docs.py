"""The docs cannot go stale: generated pages and includes match what their scripts write now,
every figure has a script, the README stays short, and nothing in the repository points
outside it (docs/contributing.md says which script writes what).

``mkdocs build --strict`` (run by .ci/run after the tests) checks the rest: links, anchors,
includes, and that every page is in the navigation.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

import pytest
from conftest import ROOT

DOCS = ROOT / "docs"


def _script(name: str):
    """A docs/gen script as a module (they are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"docs_gen_{name}", DOCS / "gen" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_the_reference_pages_are_what_the_code_gives():
    """CLI, scenario, profiles and releases references: a new option, key or profile value must
    come with `python docs/gen/reference.py` in the same change."""
    assert _script("reference").stale() == []


def test_the_reference_check_fails_on_a_stale_page(tmp_path, monkeypatch):
    ref = _script("reference")
    monkeypatch.setattr(ref, "OUT", tmp_path)
    for name, make in ref.PAGES.items():
        (tmp_path / name).write_text(make())
    assert ref.stale() == []
    (tmp_path / "cli.md").write_text(ref.cli_markdown().replace("--seed", "--seeed", 1))
    assert ref.stale() == ["cli.md"]


def test_every_command_and_every_scenario_key_is_in_the_references():
    from pdsim.cli.main import parser
    from pdsim.config.loader import json_schema

    cli = (DOCS / "reference" / "cli.md").read_text()
    sub = next(a for a in parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    for name, sp in sub.choices.items():
        assert f"## pdsim {name}\n" in cli
        for action in sp._actions:
            for opt in action.option_strings:
                if action.help != "==SUPPRESS==":
                    assert opt in cli, (name, opt)
    scenario = (DOCS / "reference" / "scenario.md").read_text()
    schema = json_schema()
    for key in schema["properties"]:
        assert f"| `{key}` |" in scenario, key
    for name, node in schema["$defs"].items():
        if name != "DeclaredUnknown":
            assert f"### {name}\n" in scenario, name
            for key in node.get("properties", {}):
                assert f"| `{key}` |" in scenario, (name, key)


@pytest.mark.slow
def test_the_generated_includes_are_what_pdsim_prints_now():
    """Command outputs and tables of runs in docs/generated/: a change that moves a model output
    re-records tests/golden.json and reruns `python docs/gen/examples.py` (~15 s)."""
    assert _script("examples").stale() == []


def test_every_include_a_page_names_exists_and_has_a_writer():
    examples = _script("examples")
    named = set()
    for page in DOCS.rglob("*.md"):
        named |= set(re.findall(r'^--8<-- "([^"]+)"$', page.read_text(), re.M))
    assert named, "no page includes a generated fragment"
    for name in named:
        assert (DOCS / "generated" / name).is_file(), name
        assert name == "speed.md" or name[:-3] in examples.FRAGMENTS, name
    # and every fragment is used by a page
    assert {f"{n}.md" for n in examples.FRAGMENTS} <= named
    assert "speed.md" in named


def test_every_figure_in_the_docs_is_drawn_by_a_committed_script():
    """docs/img/*.png are drawn by docs/gen/examples.py (the page includes the fragment that
    names the command); a report's figure by its reports/make_*.py, which the page names."""
    examples = _script("examples")
    assert {p.name for p in (DOCS / "img").glob("*.png")} == set(examples.FIGURES)
    for page in DOCS.rglob("*.md"):
        text = page.read_text()
        for target in re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", text):
            name = target.rsplit("/", 1)[-1]
            if "img/" in target:
                assert f'--8<-- "{examples.FIGURES[name]}.md"' in text or \
                    f"--only {examples.FIGURES[name]}" in text, (page, name)
            else:
                assert target.startswith("../reports/"), (page, target)
                script = re.match(r"(blacklist_policy|drop_timeout)", name).group(1)
                assert f"reports/make_{script}.py" in text, (page, name)
                assert f'"{name}"' in (ROOT / "reports" / f"make_{script}.py").read_text()


@pytest.mark.slow
def test_the_validation_table_is_what_validate_model_gives():
    """docs/validation.md's block is `pdsim validate-model --write-docs docs/validation.md`'s."""
    from pdsim.analysis import holdout, validation, validation_table

    text = (DOCS / "validation.md").read_text()
    block = text.split(validation.README_BEGIN + "\n", 1)[1].split(validation.README_END)[0]
    assert block == validation_table.markdown(holdout.run(progress=False).table) + "\n"


def test_the_readme_is_short_and_runs_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    assert "pip install -e . && pdsim run scenarios/drop_timeout.yaml" in readme
    test_cmd = "pip install -e '.[test]' && python -m pytest -q"
    assert test_cmd in readme
    assert "mkdocs serve" in readme and "docs/" in readme
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pip install -q -e '.[test]'\npython -m pytest -q\n" in ci
    assert "mkdocs build --strict" in ci and "set -euo pipefail" in ci
    uses = re.search(r"## Use\n\n```bash\n(.*?)```", readme, re.S).group(1).splitlines()
    assert len(uses) == 5 and all(u.startswith("pdsim ") for u in uses)


def _tracked() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):  # an sdist: no git; the files on disk
        return [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file()
                and not {".git", "site", "__pycache__"} & set(p.relative_to(ROOT).parts)]
    return [f for f in out.decode().split("\0") if f]


OUTSIDE = ("../" + "shared", "/" + "work/")  # (split, so that this file does not match itself)


def _pointing_outside(files: list[str]) -> list[str]:
    hits = []
    for rel in files:
        path = ROOT / rel
        if not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data[:4096]:  # binary (PNG, gzip)
            continue
        text = data.decode("utf-8", "replace")
        for i, line in enumerate(text.splitlines(), 1):
            if any(o in line for o in OUTSIDE):
                hits.append(f"{rel}:{i}: {line.strip()[:120]}")
    return hits


def test_nothing_in_the_repository_points_outside_it():
    """A clone has only itself: facts from outside live in docs/ with their sources."""
    assert _pointing_outside(_tracked()) == []


def test_the_outside_check_finds_a_pointer(tmp_path, monkeypatch):
    (tmp_path / "a.md").write_text("see " + "../" + "shared/MODEL_REFERENCE.md\n")
    (tmp_path / "b.yaml").write_text("base: /" + "work/wt/x.yaml\n")
    (tmp_path / "c.md").write_text("fine\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert len(_pointing_outside(["a.md", "b.yaml", "c.md"])) == 2

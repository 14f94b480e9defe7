"""The malformed-scenario corpus (tests/malformed/): one line, never a traceback, bounded cost.

Each ``tests/malformed/<class>__<what>.yaml`` breaks one thing; its first line says what the
error must contain (``# expect: a | b``: every part, usually the key path and the limit or what
is allowed). One subprocess, under an address-space limit and a CPU-time limit, runs
``pdsim validate`` and ``pdsim run`` (``pdsim.cli.main``) over every file and reports JSON; the
test then checks each: exit 2, nothing on stdout, exactly one stderr line holding every expected
part, no traceback, no control character, no "internal error" (the CLI's last-resort guard must
not be what caught it), and the CPU time and memory the file cost.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CORPUS = Path(__file__).parent / "malformed"
FILES = sorted(p.name for p in CORPUS.glob("*.yaml"))
CLASSES = ("yaml", "type", "bounds", "cross", "paths", "hostile")
AS_HEADROOM = 1536 << 20  # address space a file may add on top of the imported interpreter
CPU_PER_FILE_S = 5.0  # both commands, CPU seconds (not wall: the CI machine is shared)
RSS_GROWTH_MB = 400  # peak resident memory the whole corpus may add

RUNNER = r"""
import contextlib, io, json, resource, sys, time
import pdsim.cli.main, pdsim.engine.sim, pandas  # imported before the limit: only the files are
                                                 # bounded
def vm_bytes():
    for line in open("/proc/self/status"):
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
limit = vm_bytes() + int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
report = []
for spec in json.loads(sys.argv[2]):
    for cmd in ("validate", "run"):
        out, err = io.StringIO(), io.StringIO()
        t0 = time.process_time()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = pdsim.cli.main.main([cmd, spec["path"], *spec["args"]])
            except SystemExit as exc:
                code = exc.code
            except BaseException as exc:  # noqa: BLE001 - reported, the test fails on it
                code = "raised " + type(exc).__name__
        report.append({"file": spec["name"], "cmd": cmd, "code": code, "stdout": out.getvalue(),
                       "stderr": err.getvalue(), "cpu": time.process_time() - t0})
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"report": report, "rss_growth_kb": rss - rss0}))
"""


def _header(path: Path) -> dict:
    """``# expect:``, ``# args:`` and ``# pad-to:`` lines at the top of a corpus file."""
    raw = path.read_bytes()
    text = raw.decode("utf-16") if raw[:2] in (b"\xff\xfe", b"\xfe\xff") else \
        raw.decode("utf-8", "replace")
    head = {"expect": [], "args": [], "pad": 0}
    for line in text.splitlines()[:4]:
        if line.startswith("# expect:"):
            head["expect"] = [p.strip() for p in line[len("# expect:"):].split(" | ")]
        elif line.startswith("# args:"):
            head["args"] = line[len("# args:"):].split()
        elif line.startswith("# pad-to:"):
            head["pad"] = int(line[len("# pad-to:"):])
    return head


@pytest.fixture(scope="module")
def corpus_run(tmp_path_factory) -> dict:
    """Copy the corpus (so FIFOs and symlinks can be made), run it once, index by file."""
    root = tmp_path_factory.mktemp("malformed") / "corpus"
    shutil.copytree(CORPUS, root)
    os.mkfifo(root / "data" / "fifo.yaml")
    os.symlink("/etc/passwd", root / "data" / "link.yaml")
    specs = []
    for name in FILES:
        head = _header(root / name)
        if head["pad"]:
            with open(root / name, "a") as f:
                f.write(("#" * 99 + "\n") * (head["pad"] // 100))
        specs.append({"name": name, "path": str(root / name), "args": head["args"]})
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    env.pop("PDSIM_DEBUG", None)
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER, str(AS_HEADROOM), json.dumps(specs)],
        capture_output=True, text=True, timeout=600, env=env, cwd=root,
        preexec_fn=lambda: __import__("resource").setrlimit(
            __import__("resource").RLIMIT_CPU, (300, 300)))
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(proc.stdout)
    data["by_file"] = {}
    for row in data["report"]:
        data["by_file"].setdefault(row["file"], []).append(row)
    return data


def test_the_corpus_covers_every_class():
    assert len(FILES) >= 50
    for cls in CLASSES:
        assert sum(f.startswith(cls + "__") for f in FILES) >= 3, cls
    for name in FILES:
        assert name.split("__")[0] in CLASSES, name
        assert _header(CORPUS / name)["expect"], f"{name}: no '# expect:' line"


@pytest.mark.parametrize("name", FILES)
def test_malformed_file_fails_with_one_clear_line(corpus_run, name):
    expect = _header(CORPUS / name)["expect"]
    for row in corpus_run["by_file"][name]:
        err = row["stderr"]
        where = f"{name} ({row['cmd']}): {err!r}"
        assert row["code"] == 2, where
        assert row["stdout"] == "", where
        assert err.startswith("pdsim: error: ") and err.endswith("\n"), where
        assert err.count("\n") == 1, where
        assert "Traceback" not in err and "internal error" not in err, where
        assert err[:-1].isprintable(), where  # no terminal escapes, no control characters
        assert len(err) < 500, where  # echoed values are capped
        for part in expect:
            assert part in err, f"missing {part!r} in {where}"
        assert row["cpu"] < CPU_PER_FILE_S, where
    # validate says exactly what run says: they share one loading pipeline
    lines = {row["stderr"] for row in corpus_run["by_file"][name]}
    assert len(lines) == 1, lines


def test_the_corpus_runs_in_bounded_memory(corpus_run):
    assert corpus_run["rss_growth_kb"] < RSS_GROWTH_MB * 1024

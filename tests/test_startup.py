"""Start-up: what needs no DataFrame does not import pandas, pyarrow or numpy.

`import pdsim`, `pdsim.load` and the CLI's validate, schema, faults and profiles commands load
only the scenario layer (pydantic, YAML; `pdsim --help` not even that); pandas, pyarrow and
numpy (~0.5 s of what was a ~1 s `pdsim validate`) load on first use of what needs them
(pdsim.run, sweep, explore, whatif: pdsim/__init__.py's module __getattr__). A module-level
import of one of them anywhere on those paths makes the first test fail; so does a validate
that no longer runs the fleet's check (which lives apart from the simulator for this).
`pdsim run` (its report, --verbose, --json) needs numpy but no DataFrame, so no pandas or
pyarrow (~0.6 s of a ~1.7 s run of drop_timeout): Result's tables are built when first read.
Each test runs in a fresh interpreter: this one has imported everything already.
"""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT

HEAVY = ("pandas", "pyarrow", "numpy", "scipy", "SALib", "matplotlib")

LIGHT = f"""
import contextlib, io, sys
import pdsim
from pdsim.cli.main import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
    main(["--help"])
assert "pydantic" not in sys.modules  # the help is argparse's alone
pdsim.load("scenarios/drop_timeout.yaml")
with contextlib.redirect_stdout(io.StringIO()):
    for argv in (["validate", "scenarios/drop_timeout.yaml"], ["validate",
                 "scenarios/whatif_base.yaml", "--set", "faults=[{{preset: flush_race}}]"],
                 ["schema"], ["faults"], ["profiles"], ["profiles", "H20"]):
        assert main(argv) == 0, argv
    # the fleet's load-time check (pdsim.model.memory) runs though nothing imported the simulator
    assert main(["validate", "scenarios/drop_timeout.yaml", "--set", "fleet.gpu=R100"]) == 2
print("heavy:", [m for m in {HEAVY!r} if m in sys.modules])
"""

RUN = f"""
import contextlib, io, sys
from pdsim.cli.main import main
out = io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
    for extra in ([], ["--verbose"], ["--json"]):
        assert main(["run", "scenarios/drop_timeout.yaml", *extra]) == 0, extra
    # no event logged; no request at all (a client that starts after the horizon)
    for argv in (["scenarios/healthy.yaml"], ["scenarios/healthy.yaml", "--json", "--set",
                 "clients.0.start_s=100", "--set", "horizon_s=50"]):
        assert main(["run", *argv]) == 0, argv
assert "Incident timeline" in out.getvalue() and "blacklisted pairs" in out.getvalue()
heavy = [m for m in {HEAVY!r} if m in sys.modules]
import pdsim
res = pdsim.run("scenarios/healthy.yaml")
assert "pandas" not in sys.modules
assert len(res.requests) == 1001 and "pandas" in sys.modules  # (read: built, pandas loaded)
print("heavy:", heavy)
"""

NAMES = """
import sys, types
import pdsim
assert "pandas" not in sys.modules
# submodules are attributes after a bare `import pdsim`, as when the package imported them all
# (asked before anything else imports them, which would set the attributes itself)
assert "pdsim.model.profiles" not in sys.modules and "pdsim.output.perfetto" not in sys.modules
assert pdsim.model.profiles.gpu("H20").name == "H20"
assert pdsim.output.perfetto is sys.modules["pdsim.output.perfetto"]
import pdsim.analysis.sweep  # the submodule first: the package attribute must stay the function
from pdsim.analysis.whatif_table import WhatIf
for name in ("sweep", "whatif", "explore"):
    assert isinstance(getattr(pdsim, name), types.FunctionType), (name, getattr(pdsim, name))
ns = {}
exec("from pdsim import *", ns)
assert set(pdsim.__all__) <= set(ns) and ns["WhatIf"] is WhatIf and ns["run"] is pdsim.run
assert set(pdsim.__all__) <= set(dir(pdsim))
assert {"util", "config", "model", "engine", "output", "analysis", "cli"} <= set(dir(pdsim))
assert {"profiles", "predictor"} <= set(dir(pdsim.model)) and "clock" in dir(pdsim.engine)
assert not {"TYPE_CHECKING", "importlib", "sys", "types"} & set(dir(pdsim))  # no helpers
try:
    pdsim.no_such_name
except AttributeError:
    pass
else:
    raise AssertionError("pdsim.no_such_name resolved")
print("ok")
"""


def _child(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


def test_validating_and_listing_import_no_dataframe_library():
    assert _child(LIGHT) == "heavy: []"


def test_a_run_and_its_report_import_no_dataframe_library():
    assert _child(RUN) == "heavy: ['numpy']"


def test_public_names_load_on_first_use_and_functions_keep_their_names():
    assert _child(NAMES) == "ok"

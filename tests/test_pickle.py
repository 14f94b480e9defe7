"""A Result pickles (a notebook saves one, joblib or multiprocessing hands one back) and comes
back whole in another interpreter. Its scenario holds parameter models the registries make at
registration (``StrikesParams_permanent``, the faults' models), which pickle cannot find by
module attribute; they pickle through their registry (pdsim.config.registry._registered)."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import golden

import pdsim
from pdsim.config.registry import BLACKLIST_POLICIES

ROOT = Path(__file__).resolve().parents[1]

# scenarios whose blacklist and faults are each a registered model: the shipped incident
# (permanent blacklist, a flush), and probe, 0.5.23 and circuit-breaker blacklists with faults
CASES = ("drop_timeout@1", "small_faults@7", "small_gateway@7", "small_library@7")


def _case(name: str):
    source, sets = golden.cases(full=False)[name]
    return source, sets


def test_a_result_pickles_and_another_interpreter_reads_and_reruns_it(tmp_path):
    want = {}
    for i, name in enumerate(CASES):
        source, sets = _case(name)
        res = pdsim.run(source, sets=sets, record_steps=(i == 0))
        if i % 2:  # one with its tables read first, one with them still to build
            assert len(res.requests) > 0 and res.events is not None
        (tmp_path / f"{i}.pkl").write_bytes(pickle.dumps(res))
        want[i] = golden.digest(res)
        assert want[i] == golden.load()[name], name  # (the recorded outputs, to start from)
    child = textwrap.dedent(f"""
        import json, pickle, sys
        sys.path.insert(0, {str(ROOT / 'tests')!r})
        import golden, pdsim
        from pdsim.config.registry import BLACKLIST_POLICIES
        out = {{}}
        for i in range({len(CASES)}):
            res = pickle.loads(open({str(tmp_path)!r} + f"/{{i}}.pkl", "rb").read())
            out[i] = [golden.digest(res), golden.digest(pdsim.run(res.scenario)),
                      type(res.scenario.blacklist) is
                      BLACKLIST_POLICIES.get(res.scenario.blacklist.policy).model]
        print(json.dumps(out))
    """)
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout)
    for i, name in enumerate(CASES):
        read, rerun, registered = got[str(i)]
        assert read == want[i], name  # the same tables, summary, flushes and pools
        assert rerun == want[i], name  # and its scenario runs again to the same outputs
        assert registered, name  # its blacklist's model is the registry's, not a copy


def test_a_registered_parameter_model_pickles_through_its_registry():
    params = BLACKLIST_POLICIES.validate({"policy": "probe", "probe_interval_s": 3.0})
    back = pickle.loads(pickle.dumps(params))
    assert type(back) is type(params) and back == params
    assert back.model_fields_set == params.model_fields_set

"""Scenario files are read safely: bounded YAML, confined paths, checks shared by validate/run."""

from __future__ import annotations

import copy
import gzip
import json
import os
import time

import pytest
import yaml
from conftest import SCENARIOS

import pdsim
from pdsim.cli.main import main
from pdsim.config.loader import load
from pdsim.config.scenario import from_dict
from pdsim.config.units import MAX_TICKS, ScenarioError
from pdsim.util.safeio import UserFileError, echo, read_user_file, resolve_user_path

BASE = {"fleet": {"gpu": "H20", "model": "dsv3-ci-test"},
        "clients": [{"kind": "bench", "num_prompts": 5}]}


def _with(**top) -> dict:
    d = copy.deepcopy(BASE)
    d.update(top)
    return d


def _err(data) -> str:
    with pytest.raises(ScenarioError) as err:
        from_dict(data)
    msg = str(err.value)
    assert "\n" not in msg
    return msg


# --- the path helper ---------------------------------------------------------------------------


def test_paths_stay_in_the_scenario_tree(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.yaml").write_text("x: 1\n")
    (tmp_path / "outside.yaml").write_text("x: 1\n")
    root = tmp_path / "sub"
    assert resolve_user_path(root, "a.yaml", "'f'") == (root / "a.yaml").resolve()
    assert resolve_user_path(root, str(root / "a.yaml"), "'f'") == (root / "a.yaml").resolve()
    for bad in ("../outside.yaml", str(tmp_path / "outside.yaml"), "/etc/passwd"):
        with pytest.raises(UserFileError, match="outside the scenario's directory"):
            resolve_user_path(root, bad, "'f'")
        assert resolve_user_path(root, bad, "'f'", allow_outside=True)
    os.symlink(tmp_path / "outside.yaml", root / "link.yaml")
    with pytest.raises(UserFileError, match="outside"):
        resolve_user_path(root, "link.yaml", "'f'")
    with pytest.raises(UserFileError, match="special filesystem"):
        resolve_user_path(root, "/proc/self/environ", "'f'", allow_outside=True)


def test_only_regular_files_are_read_and_a_fifo_never_blocks(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    with pytest.raises(UserFileError, match="not a regular file"):
        read_user_file(fifo, "scenario file", 1000)
    assert time.monotonic() - t0 < 5
    with pytest.raises(UserFileError, match="directory"):
        read_user_file(tmp_path, "scenario file", 1000)
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * 2000)
    with pytest.raises(UserFileError, match="limit is 1,000 bytes"):
        read_user_file(big, "scenario file", 1000)


def test_echo_caps_and_escapes():
    assert echo("\x1b[31mred\x1b[0m") == r"'\x1b[31mred\x1b[0m'"
    assert len(echo("x" * 10_000)) <= 60 and echo("x" * 10_000).endswith("…")
    assert "digits" in echo(10**5000)
    nested = [[list(range(1000))] * 1000] * 1000
    assert len(echo(nested)) <= 60


# --- extends and trace paths -------------------------------------------------------------------


def test_extends_outside_the_tree_needs_the_flag(tmp_path, capsys):
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(BASE))
    (tmp_path / "d").mkdir()
    child = tmp_path / "d" / "child.yaml"
    child.write_text("extends: ../base.yaml\nname: child\n")
    assert main(["validate", str(child)]) == 2
    err = capsys.readouterr().err
    assert "leads outside" in err and "--allow-outside-paths" in err and err.count("\n") == 1
    assert main(["validate", str(child), "--allow-outside-paths"]) == 0
    assert pdsim.load(child, allow_outside_paths=True).name == "child"


def test_extends_of_a_non_mapping_or_a_foreign_file(tmp_path):
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    child = tmp_path / "c.yaml"
    child.write_text("extends: list.yaml\n")
    with pytest.raises(ScenarioError, match="is not a scenario"):
        load(child)
    child.write_text("extends: " + "a/" * 3000 + "x.yaml\n")
    with pytest.raises(ScenarioError, match="not a usable path"):
        load(child)
    child.write_text("extends: /proc/self/environ\n")
    with pytest.raises(ScenarioError, match="special filesystem"):
        load(child, allow_outside_paths=True)


def _trace(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _trace_scenario(path, **client) -> dict:
    return _with(clients=[{"kind": "bench", "request_rate": "trace", "warmup_requests": 0,
                           "dataset": {"kind": "trace", "path": str(path)}, **client}])


ROW = json.dumps({"timestamp": 0, "input_length": 100, "output_length": 4})


@pytest.mark.parametrize("line,hint", [
    ('{"timestamp": 1, "input_length": 5', "line 2: not valid JSON"),
    ('[1, 2]', "line 2: each line must be a JSON object"),
    ('{"timestamp": "x", "input_length": 5, "output_length": 1}', "line 2: 'timestamp'"),
    ('{"timestamp": 1, "input_length": true, "output_length": 1}', "line 2: 'input_length'"),
    ('{"timestamp": 1, "input_length": 1e12, "output_length": 1}', "0..10,000,000 tokens"),
    ('{"timestamp": NaN, "input_length": 5, "output_length": 1}', "line 2: not valid JSON"),
    ('{"timestamp": 1, "input_length": ' + "9" * 5000 + ', "output_length": 1}',
     "line 2: not valid JSON"),
    ("[" * 100_000, "line 2"),
], ids=["truncated", "not-object", "timestamp", "bool", "huge", "nan", "digits", "deep"])
def test_a_bad_trace_line_is_named_at_load_time(tmp_path, monkeypatch, line, hint):
    monkeypatch.chdir(tmp_path)
    _trace(tmp_path / "t.jsonl", [ROW, line])
    msg = _err(_trace_scenario("t.jsonl"))
    assert "'clients.0.dataset.path'" in msg and hint in msg, msg
    assert len(msg) < 400


def test_trace_files_missing_empty_binary_or_gzip_bombs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert "trace file not found" in _err(_trace_scenario("nope.jsonl"))
    (tmp_path / "empty.jsonl").write_text("\n\n")
    assert "holds no requests" in _err(_trace_scenario("empty.jsonl"))
    (tmp_path / "bin.jsonl").write_bytes(b"\xff\xfe\x00\x01garbage\n")
    assert "not UTF-8" in _err(_trace_scenario("bin.jsonl"))
    (tmp_path / "trunc.jsonl.gz").write_bytes(gzip.compress(ROW.encode() * 50)[:40])
    assert "gzip" in _err(_trace_scenario("trunc.jsonl.gz"))
    assert "trace file" in _err(_trace_scenario("/etc/hostname"))  # outside the tree
    # 'trace' rate with a random dataset
    assert "needs dataset.kind: trace" in _err(_with(clients=[{"kind": "bench",
                                                              "request_rate": "trace"}]))


def test_trace_paths_of_an_extended_file_stay_relative_to_it(tmp_path):
    (tmp_path / "common").mkdir()
    _trace(tmp_path / "common" / "t.jsonl", [ROW] * 3)
    (tmp_path / "common" / "base.yaml").write_text(yaml.safe_dump(_trace_scenario("t.jsonl")))
    (tmp_path / "run.yaml").write_text("extends: common/base.yaml\nname: run\n")
    sc = load(tmp_path / "run.yaml")
    assert sc.clients[0].dataset.resolved_path == (tmp_path / "common" / "t.jsonl").resolve()


# --- types, bounds, cross-field checks -----------------------------------------------------------


def test_bools_are_not_numbers():
    c = _with(clients=[{"kind": "bench", "num_prompts": True}])
    assert "'clients.0.num_prompts': expected a number, not true" in _err(c)
    assert "'horizon_s'" in _err(_with(horizon_s=False))


def test_names_are_printable():
    msg = _err(_with(name="\x1b]0;pwned\x07x"))
    assert "'name'" in msg and "\x1b" not in msg and "escape" in msg
    assert "'clients.0.name'" in _err(_with(clients=[{"kind": "bench", "name": "a\nb"}]))


@pytest.mark.parametrize("top,path,limit", [
    ({"clients": [{"kind": "bench", "num_prompts": 10**12}]}, "clients.0.num_prompts",
     "1000000"),
    ({"fleet": {"gpu": "H20", "model": "dsv3-ci-test", "decode": {"dp": 10**12}}},
     "fleet.decode.dp", "1024"),
    ({"fleet": {"gpu": "H20", "model": "dsv3-ci-test", "prefill": {"servers": 10**8}}},
     "fleet.prefill.servers", "1024"),
    ({"timeseries_interval_s": 1e-300}, "timeseries_interval_s", "0.001"),
    ({"horizon_s": 1e15}, "horizon_s", "10000000"),
    ({"horizon_s": 1e6}, "timeseries_interval_s", f"{MAX_TICKS:,}"),
    ({"blacklist": {"policy": "probe", "probe_interval_s": 1e-300}},
     "blacklist.probe_interval_s", "0.001"),
    ({"blacklist": {"policy": "probe", "probe_interval_s": 0.01}},
     "blacklist.probe_interval_s", "at most 200,000"),
    ({"faults": [{"kind": "partition", "at_s": 1, "duration_s": 5,
                  "heartbeat_interval_s": 1e-300}]}, "faults.0.heartbeat_interval_s", "0.001"),
    ({"seed": -1}, "seed", "greater than or equal to 0"),
    ({"seeds": {"faults": -3}}, "seeds.faults", "greater than or equal to 0"),
    ({"predictor": {"coefficients": {"decode_a_ms": float("nan")}}},
     "predictor.coefficients.decode_a_ms", "finite"),
    ({"predictor": {"coefficients": {"decode_a_ms": -1}}},
     "predictor.coefficients.decode_a_ms", "greater than or equal to 0"),
    ({"predictor": {"coefficients": {"decode_z_ms": 1}}}, "predictor.coefficients",
     "allowed: prefill_a_ms"),
    ({"faults": [{"kind": "decode_unreachable", "decode_rank": 7, "at_s": 1,
                  "duration_s": 1}]}, "faults.0.decode_rank", "must be < 1"),
    ({"faults": [{"kind": "partition", "prefill_server": 3, "at_s": 1, "duration_s": 1}]},
     "faults.0.prefill_server", "must be < 1"),
    ({"faults": [{"kind": "transfer_errors", "probability": 0.5, "from_s": 5, "to_s": 2}]},
     "faults.0.to_s", "after from_s"),
    ({"clients": [{"kind": "eval", "questions": 1_000_000, "tries": 30}]}, "clients",
     "at most 4,000,000"),
])
def test_bounds_and_cross_field_checks_name_key_and_limit(top, path, limit):
    msg = _err(_with(**top))
    assert f"'{path}'" in msg and limit in msg, msg


def test_validate_catches_what_run_rejects(capsys):
    """The fuzz-found negative seed exited 2 only at run time; validate now says so."""
    assert main(["validate", "scenarios/healthy.yaml", "--set", "seeds.routing=-1"]) == 2
    assert "'seeds.routing'" in capsys.readouterr().err


# --- the YAML loader -----------------------------------------------------------------------------


def _yaml_err(tmp_path, text: str | bytes) -> str:
    f = tmp_path / "s.yaml"
    f.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ScenarioError) as err:
        load(f)
    msg = str(err.value)
    assert "\n" not in msg and len(msg) < 400, msg
    return msg


def test_billion_laughs_fails_fast(tmp_path):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 10)]
    lines.append("name: *a9")
    t0 = time.monotonic()
    assert "expands to more than 50,000 values" in _yaml_err(tmp_path, "\n".join(lines))
    assert time.monotonic() - t0 < 5


def test_deep_nesting_duplicates_huge_ints_and_encodings(tmp_path):
    assert "nested deeper than 50" in _yaml_err(tmp_path, "x: " + "[" * 10_000)
    assert "nested deeper than 50" in _yaml_err(tmp_path, "a:\n" + "".join(
        " " * i + "b:\n" for i in range(1, 200)))
    msg = _yaml_err(tmp_path, "fleet: {gpu: H20, model: x}\nclients: []\nfleet: 2\n")
    assert "duplicate key 'fleet' (first at line 1) at line 3" in msg
    msg = _yaml_err(tmp_path, "seed: " + "9" * 5000 + "\n")
    assert "'seed'" in msg and "at most 100" in msg
    assert "UTF-16" in _yaml_err(tmp_path, "fleet: 1\n".encode("utf-16"))
    assert "not UTF-8" in _yaml_err(tmp_path, bytes(range(256)))
    assert "recursive alias" in _yaml_err(tmp_path, "a: &a [*a]\n")
    assert "not valid YAML" in _yaml_err(tmp_path, "a: !!python/object/apply:os.system [ls]\n")


# --- command-line mistakes are one line too ---------------------------------------------------


@pytest.fixture
def a_file(tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    return f


@pytest.mark.parametrize("argv,hint", [
    (["validate", "scenarios/healthy.yaml", "--set", "name={a: [1"], "--set name: not valid YAML"),
    (["validate", "scenarios/healthy.yaml", "--set", "name.x=1"],
     "'name' is a str ('healthy'), not a mapping or list"),
    (["validate", "scenarios/healthy.yaml", "--set", "fleet..gpu=H20"], "no empty parts"),
    (["validate", "scenarios/healthy.yaml", "--set", "clients.9.name=x"], "not an index"),
    (["run", "scenarios/healthy.yaml", "--out", "{afile}"], "exists and is not a directory"),
    (["run", "scenarios/healthy.yaml", "--out", "{afile}/sub"], "cannot create the directory"),
    (["sweep", "scenarios/healthy.yaml", "--seeds", "0"], "--seeds 0: give 1..10,000"),
    (["sweep", "scenarios/healthy.yaml", "--seeds", "-3"], "--seeds -3: give 1..10,000"),
    (["sweep", "scenarios/healthy.yaml", "--workers", "0"], "--workers 0: give at least 1"),
    (["sweep", "scenarios/healthy.yaml", "--vary", "seed=[1,"], "--vary seed: not valid YAML"),
    (["sweep", "scenarios/healthy.yaml", "--vary", "seed"], "--vary expects KEY=V1,V2"),
    (["sweep", "scenarios/healthy.yaml", "--out", "{afile}/x.csv"], "does not exist"),
    (["sweep", "scenarios/healthy.yaml", "--vary",
      "clients.0.num_prompts=" + ",".join(map(str, range(1, 201))), "--seeds", "1000"],
     "the sweep has 200,000 runs"),
    (["run", "scenarios/healthy.yaml", "--seed", "-1"], "'seed'"),
    (["explore", "scenarios/healthy.yaml", "--samples", "100000000"],
     "--samples 100000000: give 1..100,000"),
    (["explore", "scenarios/healthy.yaml", "--samples", "1000", "--seeds", "1000"],
     "the exploration has 1,000,000 runs"),
    (["explore", "scenarios/healthy.yaml", "--seeds", "0"], "--seeds 0: give 1..10,000"),
    (["explore", "scenarios/healthy.yaml", "--workers", "0"], "--workers 0: give at least 1"),
    # (a process per queued run: --workers 100000 forked thousands of Pythons)
    (["sweep", "scenarios/healthy.yaml", "--workers", "100000000"],
     "--workers 100000000: give 1.."),
    (["explore", "scenarios/healthy.yaml", "--workers", "100000000"],
     "--workers 100000000: give 1.."),
    (["whatif", "scenarios/whatif_base.yaml", "--workers", "100000000"],
     "--workers 100000000: give 1.."),
    # (an empty output path read as not given: the run went on and wrote nothing)
    (["run", "scenarios/healthy.yaml", "--out", ""], "--out: an empty value"),
    (["run", "scenarios/healthy.yaml", "--perfetto", ""], "--perfetto: an empty value"),
    (["sweep", "scenarios/healthy.yaml", "--out", ""], "--out: an empty value"),
    (["whatif", "scenarios/whatif_base.yaml", "--out", ""], "--out: an empty value"),
    (["validate-model", "--csv", ""], "--csv: an empty value"),
    (["profiles", "--scenario", ""], "--scenario: an empty value"),
    (["explore", "scenarios/healthy.yaml", "--design-seed", "-5"],
     "--design-seed -5: give a non-negative integer"),
])
def test_command_line_mistakes_are_one_line(argv, hint, a_file, capsys):
    argv = [a.replace("{afile}", str(a_file)) for a in argv]
    assert main(argv) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.count("\n") == 1 and "Traceback" not in cap.err
    assert hint in cap.err, cap.err


def test_a_document_parsed_again_is_a_fresh_copy_of_the_first_parse():
    """loader.parse_yaml keeps documents it parsed (pickled) and hands out copies: a second
    parse of the same text is equal to the first to every float bit, with YAML aliases still
    shared (as a deep copy keeps them), and none of its objects is the first parse's or the
    cache's (a caller may edit its document)."""
    import math
    import struct

    from pdsim.config import loader
    from pdsim.util import safeyaml

    text = ("a: &x {k: [1, 2.5, .nan, -0.0, 1e308, 12345678901234567890]}\nb: *x\n"
            "c: !!set {p, q}\nd: 2026-11-30\ne: !!binary aGk=\nf: [true, null, 'z']\n"
            "g: 0.1\n")
    safeyaml._PARSED.pop(text, None)
    first = loader.parse_yaml(text, "t")
    second = loader.parse_yaml(text, "t")
    third = loader.parse_yaml(text, "t")

    def bits(v):
        return struct.pack("<d", v) if isinstance(v, float) else v

    for doc in (second, third):
        assert doc.keys() == first.keys()
        assert [bits(v) for v in doc["a"]["k"]] == [bits(v) for v in first["a"]["k"]]
        assert math.isnan(doc["a"]["k"][2]) and math.copysign(1, doc["a"]["k"][3]) == -1
        assert {k: doc[k] for k in "cdefg"} == {k: first[k] for k in "cdefg"}
        assert doc["a"] is doc["b"] and doc["a"] is not first["a"]
        assert doc["a"]["k"] is not first["a"]["k"] and doc["f"] is not first["f"]
    assert second["a"] is not third["a"]
    second["a"]["k"].append(0)
    assert len(loader.parse_yaml(text, "t")["a"]["k"]) == 6


def test_a_dict_extends_a_file_as_a_file_does_relative_to_where_its_paths_resolve(tmp_path):
    """``pdsim.run({"extends": "scenarios/drop_timeout.yaml", ...})`` (a notebook's what-if):
    the file is merged under the dict, its relative paths rebased (the trace of
    trace_replay.yaml), and its reported figures are context only (the dict is a what-if);
    a parent outside the current directory needs allow_outside_paths, as a file's does."""
    sets = ["clients.0.num_prompts=400", "clients.1.num_prompts=200"]
    base = pdsim.run("scenarios/drop_timeout.yaml", sets)
    never = pdsim.run({"extends": "scenarios/drop_timeout.yaml",
                       "blacklist": {"policy": "never"}}, sets)
    assert never.scenario.blacklist.policy == "never"
    assert never.scenario.clients == base.scenario.clients
    assert never.summary["blacklisted_pairs_max"] == 0 < base.summary["blacklisted_pairs_max"]
    from pdsim.engine.sim import what_if

    assert what_if(load({"extends": "scenarios/drop_timeout.yaml"})).startswith(
        "a dict extending scenarios/drop_timeout.yaml inherits its reported figures")
    assert what_if(load({"extends": "scenarios/drop_timeout.yaml",
                         "reference": [{"label": "own", "reported": 1}]})) == ""
    trace = pdsim.run({"extends": "scenarios/trace_replay.yaml"}, ["clients.0.num_prompts=20"])
    assert trace.summary["requests"] == 20
    outside = tmp_path / "s.yaml"
    outside.write_text((SCENARIOS / "healthy.yaml").read_text())
    with pytest.raises(ScenarioError, match="leads outside"):
        load({"extends": str(outside)})
    assert load({"extends": str(outside)}, allow_outside_paths=True).name == "healthy"
    with pytest.raises(ScenarioError, match="'extends' must be a file name"):
        load({"extends": ["x"]})


def test_limits_lists_every_reader_and_fan_out_limit():
    """``loader.limits()`` is the docs' table of limits (docs/reference/scenario.md): the
    trace, profile, path, YAML and run-count bounds too, not only the scenario module's own."""
    from pdsim.config import trace
    from pdsim.config.loader import limits
    from pdsim.model import profiles
    from pdsim.util import backends, safeio, safeyaml

    got = limits()
    for mod, name in [(trace, "MAX_TRACE_BYTES"), (trace, "MAX_TRACE_LINES"),
                      (profiles, "MAX_PROFILE_BYTES"), (safeio, "MAX_PATH_CHARS"),
                      (safeyaml, "MAX_YAML_DEPTH"), (backends, "MAX_RUNS")]:
        assert got[name] == getattr(mod, name), name
    assert got["MAX_TICKS"] == MAX_TICKS


def test_explore_default_directory_stays_where_the_user_is(tmp_path, monkeypatch, capsys):
    """The default --out is explore-<scenario name>; a name is free text, and its slashes led
    the results out of the current directory ('x/../../escaped' wrote to ../escaped)."""
    from pdsim.analysis import explore as explore_mod

    (tmp_path / "sub").mkdir()
    f = tmp_path / "sub" / "s.yaml"
    f.write_text(yaml.safe_dump(_with(name="x/../../escaped")))
    monkeypatch.chdir(tmp_path / "sub")
    seen = []

    def fake(*args, **kw):
        seen.append(args[6])
        raise ValueError("stop")
    monkeypatch.setattr(explore_mod, "explore", fake)
    assert main(["explore", str(f)]) == 2
    capsys.readouterr()
    out = (tmp_path / "sub" / seen[0]).resolve()
    assert out.parent == tmp_path / "sub" and out.name == "explore-x_.._.._escaped"


def test_library_fan_out_bounds_its_local_processes():
    from pdsim.util.backends import WORKERS_PER_CORE

    too_many = WORKERS_PER_CORE * (os.cpu_count() or 1) + 1
    with pytest.raises(ValueError, match=f"workers {too_many}: give 1.."):
        pdsim.sweep(SCENARIOS / "healthy.yaml", vary={"clients.0.num_prompts": [5]},
                    seeds=[1], workers=too_many, progress=False)

"""Declared unknowns: run at nominal and say so; one-line errors; integer samples; schema."""

from __future__ import annotations

import copy
import json

import pytest
from conftest import SCENARIOS, small_fleet

import pdsim
from pdsim.cli.main import main
from pdsim.config import unknowns
from pdsim.config.loader import json_schema, load
from pdsim.config.units import ScenarioError


def _tiny(**client) -> dict:
    d = small_fleet()
    d["clients"][0].update({"num_prompts": 30, **client})
    return d


def test_run_uses_nominal_and_says_so(capsys):
    declared = _tiny(num_prompts={"uniform": [10, 60], "nominal": 30, "why": "a test"})
    res = pdsim.run(declared)
    plain = pdsim.run(_tiny(num_prompts=30))
    assert res.scenario.clients[0].num_prompts == 30
    listed = res.summary.pop("unknowns_at_nominal")
    assert listed == [{"path": "clients.0.num_prompts", "distribution": "uniform",
                       "range": [10, 60], "integer": True, "nominal": 30, "why": "a test"}]
    assert res.summary == plain.summary  # the declaration changes nothing but the listing
    assert [u.path for u in res.unknowns] == ["clients.0.num_prompts"]
    from pdsim.output import report

    text = report.render(res)
    assert "Declared unknowns (run at nominal)" in text
    assert "clients.0.num_prompts = 30  (uniform [10, 60] (integer); why: a test)" in text
    assert "Declared unknowns" not in report.render(plain)


def test_shipped_drop_timeout_declares_the_second_runs_start():
    sc = load(SCENARIOS / "drop_timeout.yaml")
    u = next(x for x in sc.unknowns if x.path == "clients.1.start_s")
    assert (u.dist, u.low, u.high, u.nominal) == ("uniform", 0, 50, 6)
    assert sc.clients[1].start_s == 6.0 and not u.integer
    assert load(SCENARIOS / "forward_timeout.yaml").unknowns == sc.unknowns  # via extends
    # --set key=value pins it; --set key={...} declares or re-declares
    pinned = load(SCENARIOS / "drop_timeout.yaml", ["clients.1.start_s=12"])
    assert u.path not in [x.path for x in pinned.unknowns] and pinned.clients[1].start_s == 12
    re = load(SCENARIOS / "drop_timeout.yaml",
              ["clients.1.start_s={choice: [8, 12], nominal: 12}", "seed=3"])
    r = next(x for x in re.unknowns if x.path == u.path)
    assert r.choices == (8, 12) and re.clients[1].start_s == 12
    # a loaded Scenario keeps its declarations through further overrides
    again = load(sc, ["seed=4"])
    assert again.unknowns == sc.unknowns and again.seed == 4


def test_extends_replaces_a_declaration_whole(tmp_path):
    (tmp_path / "base.yaml").write_text(json.dumps(
        _tiny(start_s={"uniform": [0, 5], "nominal": 1})))
    child = tmp_path / "child.yaml"
    child.write_text("extends: base.yaml\nclients:\n- kind: bench\n  num_prompts: 30\n"
                     "  start_s: {choice: [0, 2], nominal: 2}\n")
    (u,) = load(child).unknowns
    assert u.dist == "choice" and u.choices == (0, 2)


def _err(path: str, value) -> str:
    d = _tiny()
    d.setdefault("router", {})
    unknowns.set_path(d, path, value)
    with pytest.raises(ScenarioError) as err:
        load(d)
    msg = str(err.value)
    assert "\n" not in msg
    return msg


BAD = [
    ("clients.0.start_s", {"uniform": [5, 5], "nominal": 5}, "uniform needs a < b"),
    ("clients.0.start_s", {"uniform": [1, 5], "nominal": 9}, "nominal 9 is outside"),
    ("clients.0.start_s", {"loguniform": [0, 5], "nominal": 1}, "loguniform needs 0 < a < b"),
    ("clients.0.start_s", {"uniform": [1, "x"], "nominal": 1}, "two finite numbers"),
    ("clients.0.stream", {"choice": [], "nominal": True}, "non-empty list"),
    ("clients.0.stream", {"choice": [True], "nominal": False}, "not one of the choices"),
    ("clients.0.start_s", {"normal": [1, 2], "nominal": 1}, "unknown key 'normal'"),
    ("clients.0.start_s", {"uniform": [1, 2]}, "needs a nominal value"),
    ("clients.0.start_s", {"uniform": [1, 2], "choice": [1], "nominal": 1}, "exactly one of"),
    ("clients.0.num_prompts", {"uniform": [-5, 40], "nominal": 30},
     "includes -5, which is rejected"),
    ("router.flush_handler", {"choice": ["mini_lb_fixed", "nginx"], "nominal": "mini_lb_fixed"},
     "includes nginx"),
    ("seed", {"uniform": [1, 9], "nominal": 1}, "cannot be a declared unknown"),
]


@pytest.mark.parametrize("path,value,hint", BAD, ids=[b[2] for b in BAD])
def test_bad_declarations_one_line_with_key_path(path, value, hint):
    msg = _err(path, value)
    assert f"'{path}'" in msg and hint in msg, msg


def test_cli_declares_and_pins(capsys):
    decl = "clients.0.num_prompts={uniform: [10, 60], nominal: 30}"
    assert main(["validate", "scenarios/healthy.yaml", "--set", decl]) == 0
    assert main(["validate", "scenarios/healthy.yaml", "--set",
                 "clients.0.num_prompts={uniform: [60, 10], nominal: 30}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'clients.0.num_prompts': uniform needs a < b" in err


def test_samples_map_the_unit_interval():
    u = unknowns.Unknown("x", "uniform", 3, low=1, high=4, integer=True)
    vals = [u.value(i / 400) for i in range(400)]
    assert sorted(set(vals)) == [1, 2, 3, 4] and all(isinstance(v, int) for v in vals)
    assert abs(vals.count(1) - 100) <= 1  # each integer equally likely
    lg = unknowns.Unknown("x", "loguniform", 10, low=1, high=100)
    assert lg.value(0) == pytest.approx(1) and lg.value(0.5) == pytest.approx(10)
    assert lg.value(0.999999) < 100
    ch = unknowns.Unknown("x", "choice", "b", choices=("a", "b", "c"))
    assert [ch.value(x) for x in (0, 0.34, 0.99, 1.0)] == ["a", "b", "c", "c"]


def test_schema_accepts_declarations_on_numeric_and_categorical_fields():
    import jsonschema
    import yaml

    schema = json_schema()
    v = jsonschema.Draft202012Validator(schema)
    shipped = yaml.safe_load((SCENARIOS / "drop_timeout.yaml").read_text())
    assert not list(v.iter_errors(shipped))
    ok = copy.deepcopy(shipped)
    ok.setdefault("router", {})["flush_handler"] = {"choice": ["mini_lb_0.3.2", "mini_lb_fixed"],
                                     "nominal": "mini_lb_0.3.2"}
    ok["fleet"] = {"gpu": "H20", "model": "dsv3-ci-test",
                   "prefill": {"dp": {"loguniform": [1, 8], "nominal": 4}}}
    assert not list(v.iter_errors(ok))
    for bad in ({"uniform": [5, 20]}, {"uniform": [5, 20], "nominal": 5, "sd": 1},
                {"uniform": [5], "nominal": 5}, "soon"):
        wrong = copy.deepcopy(shipped)
        wrong["clients"][1]["start_s"] = bad
        assert list(v.iter_errors(wrong)), bad
    # seeds and the reference figures cannot be declared unknown
    assert "DeclaredUnknown" not in json.dumps(schema["properties"]["seed"])
    assert "DeclaredUnknown" not in json.dumps(schema["$defs"]["ReferenceFigure"])


def test_validate_lists_the_declared_unknowns(tmp_path, capsys):
    d = small_fleet()
    d["clients"][0]["request_rate"] = {"uniform": [1, 8], "nominal": 4, "why": "not reported"}
    (tmp_path / "s.yaml").write_text(json.dumps(d))
    assert main(["validate", str(tmp_path / "s.yaml")]) == 0
    out = capsys.readouterr().out.splitlines()  # (out[1], out[2]: KV pools, running requests)
    assert out[3].startswith("1 declared unknown(s)")
    assert out[4] == "  clients.0.request_rate: uniform [1, 8], nominal 4"
    # a range end run would reject is caught by validate, named by its key
    d["clients"][0]["request_rate"] = {"uniform": [-1, 8], "nominal": 4}
    (tmp_path / "s.yaml").write_text(json.dumps(d))
    assert main(["validate", str(tmp_path / "s.yaml")]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "clients.0.request_rate" in err


def test_a_range_end_is_validated_on_a_copy_of_its_path_only():
    """unknowns.finish validates each range end on ``_replaced`` data: equal to what
    ``substitute`` makes, the original untouched, only the containers on the path copied."""
    from pdsim.config import loader

    data = loader._with_context({"a": [{"b": 1, "c": {"d": 2}}, 5], "e": {"f": 3}}, None)
    before = copy.deepcopy(data)
    for path, value in [("a.0.b", 9), ("a.1", 7), ("e.f", 4), ("a.0.c.d", 8)]:
        got = unknowns._replaced(data, [(unknowns._parts(path), value)])
        assert got == unknowns.substitute(data, {path: value})
        assert type(got) is type(data) and hasattr(got, "context")
        assert data == before
    got = unknowns._replaced(data, [(["a", 0, "b"], 9)])
    assert got["e"] is data["e"] and got["a"][0]["c"] is data["a"][0]["c"]
    assert got["a"] is not data["a"] and got["a"][0] is not data["a"][0]
    # several at once (a round of checks): each container on their paths copied once
    many = {"a.0.b": 9, "a.0.c.d": 8, "a.1": 7}
    got = unknowns._replaced(data, [(unknowns._parts(p), v) for p, v in many.items()])
    assert got == unknowns.substitute(data, many) and data == before
    assert got["e"] is data["e"]


def test_a_short_integer_range_is_validated_at_every_value(tmp_path, capsys):
    """Only the ends were validated: kv_heads 4..8 over tp 8 passed validate, then explore
    stopped part-way at a sample of 7 (32 heads are no multiple of 7), its compute spent."""
    from pdsim.config.unknowns import MAX_CHECKED_INTS

    d = {"fleet": {"gpu": "H100", "model": "llama-3.1-8b", "prefill": {"tp": 8},
                   "decode": {"tp": 8}},
         "model": {"kv_heads": {"uniform": [4, 8], "nominal": 8, "why": "not known"}},
         "clients": [{"kind": "bench", "num_prompts": 5}]}
    (tmp_path / "s.yaml").write_text(json.dumps(d))
    assert main(["validate", str(tmp_path / "s.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pdsim: error: invalid value at 'model.kv_heads': uniform [4, 8] "
                          "(integer) includes 5, which is rejected; list the allowed values "
                          "with choice: [...]: ") and err.count("\n") == 1, err
    d["model"]["kv_heads"] = {"choice": [4, 8], "nominal": 8, "why": "not known"}
    (tmp_path / "s.yaml").write_text(json.dumps(d))
    assert main(["validate", str(tmp_path / "s.yaml")]) == 0
    assert MAX_CHECKED_INTS == 64  # (docs/guides/exploring-unknowns.md says so)

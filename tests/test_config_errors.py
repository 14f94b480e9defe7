"""Bad scenarios exit non-zero with one line naming the key path; never a traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

import pdsim
from pdsim.cli.main import main
from pdsim.config.scenario import from_dict
from pdsim.config.units import ScenarioError

BASE = {"fleet": {"gpu": "H20", "model": "dsv3-ci-test"}, "clients": [{"kind": "bench"}]}


def _with(path: str, value):
    import copy

    d = copy.deepcopy(BASE)
    cur = d
    parts = path.split(".")
    for p in parts[:-1]:
        cur = cur[int(p)] if p.isdigit() else cur.setdefault(p, {})
    cur[parts[-1]] = value
    return d


CASES = [
    (_with("fleet.prefil", {}), "fleet.prefil", "allowed keys here: gpu, model, prefill"),
    (_with("fleet.prefill.dp", -1), "fleet.prefill.dp", "greater than 0"),
    (_with("fleet.prefill.dp", "four"), "fleet.prefill.dp", "valid integer"),
    (_with("fleet.gpu", "R100"), "fleet.gpu",
     "allowed: A10, A100, B200, B300, GB200, GB300, H100, H20, H20-3e, H200, H800"),
    (_with("fleet.model", "gpt-5"), "fleet.model", "allowed:"),
    (_with("clients.0.num_prompt", 3), "clients.0.num_prompt", "num_prompts"),
    (_with("clients.0.request_rate", -2.0), "clients.0.request_rate", "'inf' or 'trace'"),
    (_with("clients.0.dataset", {"kind": "random", "range_ratio": 2}),
     "clients.0.dataset.range_ratio", "less than or equal to 1"),
    (_with("clients.0.kind", "locust"), "clients.0", "'bench', 'eval'"),
    (_with("router.flush_handler", "nginx"), "router.flush_handler", "mini_lb_0.3.2"),
    (_with("blacklist.policy", "sometimes"), "blacklist.policy", "'permanent', 'probe'"),
    (_with("flush.semantics", "maybe"), "flush.semantics", "skip_idle_check"),
    (_with("horizon_s", 0), "horizon_s", "greater than 0"),
    (_with("fleet.prefill", {"dp": 3, "tp": 4, "dp_attention": True}), "fleet.prefill",
     "multiple of dp"),
    (_with("clients", []), "clients", "at least 1"),
    ({"clients": [{"kind": "bench"}]}, "fleet", "missing required key"),
    ({"fleet": {"gpu": "H20", "model": "dsv3-ci-test"},
      "clients": [{"kind": "bench"}, {"kind": "bench"}]}, "clients", "unique"),
]


@pytest.mark.parametrize("data,path,hint", CASES, ids=[c[1] for c in CASES])
def test_rejected_with_key_path(data, path, hint):
    with pytest.raises(ScenarioError) as err:
        from_dict(data)
    msg = str(err.value)
    assert f"'{path}'" in msg, msg
    assert hint in msg, msg
    assert "\n" not in msg


def test_top_level_must_be_a_mapping():
    with pytest.raises(ScenarioError, match="mapping"):
        from_dict([1, 2])


def _cli(tmp_path, text: str, *args: str) -> tuple[int, str, str]:
    f = tmp_path / "s.yaml"
    f.write_text(text)
    proc = subprocess.run([sys.executable, "-m", "pdsim.cli", "run", str(f), *args],
                          capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


def test_cli_bad_scenario_one_line_no_traceback(tmp_path):
    code, out, err = _cli(tmp_path, "fleet: {gpu: H20, model: dsv3-ci-test, prefill: {dpp: 2}}\n"
                          "clients: [{kind: bench}]\n")
    assert code == 2
    assert out == ""
    assert "Traceback" not in err
    assert err.strip().count("\n") == 0
    assert "fleet.prefill.dpp" in err and "allowed keys here" in err


def test_cli_yaml_syntax_error(tmp_path, capsys):
    f = tmp_path / "bad.yaml"
    f.write_text("fleet: {gpu: H20\nclients: [\n")
    assert main(["validate", str(f)]) == 2
    err = capsys.readouterr().err
    assert "not valid YAML at line" in err


def test_yaml_is_loaded_safely(tmp_path, capsys):
    f = tmp_path / "evil.yaml"
    f.write_text(f"fleet: !!python/object/apply:os.system ['echo pwned > {tmp_path}/pwned']\n"
                 "clients: [{kind: bench}]\n")
    assert main(["validate", str(f)]) == 2
    assert not (tmp_path / "pwned").exists()
    assert "not valid YAML" in capsys.readouterr().err


def test_cli_missing_file(capsys):
    assert main(["run", "/nonexistent/x.yaml"]) == 2
    assert "not found" in capsys.readouterr().err


def test_cli_bad_set(capsys):
    assert main(["validate", "scenarios/healthy.yaml", "--set", "router.flush_handler"]) == 2
    assert "dotted.key=value" in capsys.readouterr().err
    assert main(["validate", "scenarios/healthy.yaml", "--set", "clients.5.name=x"]) == 2
    assert "not an index" in capsys.readouterr().err


def test_cli_unknown_coefficient(capsys):
    assert main(["run", "scenarios/healthy.yaml", "--set",
                 "predictor.coefficients.decode_z_ms=1"]) == 2
    err = capsys.readouterr().err
    assert "decode_z_ms" in err and "allowed" in err


def test_scenario_extends_keeps_everything_given(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text("name: base\nfleet: {gpu: H20, model: dsv3-ci-test, decode: {dp: 2}}\n"
                    "clients: [{kind: bench, num_prompts: 5}]\n")
    child = tmp_path / "child.yaml"
    child.write_text("extends: base.yaml\nname: child\nfleet: {prefill: {dp: 3}}\n")
    sc = pdsim.load(child)
    assert sc.name == "child"
    assert sc.fleet.prefill.dp == 3 and sc.fleet.decode.dp == 2
    assert sc.clients[0].num_prompts == 5


@pytest.mark.parametrize("model, role, tp, dp, says", [
    ("llama-3.1-8b", "prefill", 3, 1, "its 32 attention heads do not split evenly over tp 3; "
     "pick a tp that divides them"),
    ("llama-3.1-8b", "decode", 64, 1, "its 32 attention heads do not split evenly over tp 64; "
     "pick a tp that divides them"),
    ("qwen2.5-7b", "prefill", 7, 1, "its 4 KV heads neither split nor replicate evenly over tp "
     "7; pick an attention tp that divides 4 or is a multiple of it"),  # (7 divides 28 heads)
    ("dsv3-ci-test", "decode", 24, 2, "its 128 attention heads do not split evenly over "
     "attention tp 12 (tp 24 / dp 2 with dp attention); pick a tp that divides them"),
])
def test_a_tp_the_attention_heads_do_not_split_over_is_refused(model, role, tp, dp, says):
    """SGLang asserts at start-up that the attention heads (and GQA KV heads, or their
    replicas) split evenly over the attention GPUs; pdsim ran tp 3 for Llama-3.1-8B."""
    d = _with("fleet.model", model)
    d["fleet"][role] = {"tp": tp, "dp": dp, "dp_attention": dp > 1}
    with pytest.raises(ScenarioError) as err:
        from_dict(d)
    msg = str(err.value)
    assert f"at 'fleet.{role}.tp': {model}: {says} (SGLang refuses it at start-up)" in msg, msg
    for ok in (1, 2, 8, 16):  # (16 > 8 KV heads: each replicated twice)
        from_dict(_with("fleet.model", "llama-3.1-8b") | {"fleet": {
            "gpu": "H100", "model": "llama-3.1-8b", "prefill": {"tp": ok}}})

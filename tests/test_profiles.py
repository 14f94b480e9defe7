"""User profile files, inline overrides, one-line errors, and where each value came from."""

from __future__ import annotations

import math

import pytest
from conftest import small_fleet

import pdsim
from pdsim.cli.main import main
from pdsim.config.units import ScenarioError
from pdsim.model import profiles

MY_PROFILES = """
gpus:
  H100-slowmem:            # an H100 with an HBM2e-class memory
    extends: H100
    hbm_tbps: {value: 2.0, source: "my lab's measurement"}
models:
  tiny-moe:
    extends: deepseek-v2-lite
    layers: 4
"""


def _scenario(tmp_path, body: str, profile_text: str = MY_PROFILES, name="my.yaml"):
    (tmp_path / "prof").mkdir(exist_ok=True)
    (tmp_path / "prof" / name).write_text(profile_text)
    f = tmp_path / "sc.yaml"
    f.write_text(body)
    return f


BODY = """profiles: [prof/my.yaml]
fleet: {gpu: H100-slowmem, model: tiny-moe, prefill: {tp: 1}, decode: {tp: 1}}
clients: [{kind: bench, num_prompts: 20, max_concurrency: 4,
           dataset: {kind: random, input_len: 512, output_len: 32}}]
"""


def test_a_user_profile_file_loads_relative_to_the_scenario(tmp_path):
    f = _scenario(tmp_path, BODY)
    res = profiles.for_scenario(pdsim.load(f))
    assert res.gpu.name == "H100-slowmem" and res.gpu.hbm_tbps == 2.0
    assert res.gpu.bf16_tflops == 989  # the rest comes from H100
    assert res.model.layers == 4 and res.model.kv_lora_rank == 512
    assert "my lab's measurement" in res.origins["gpu.hbm_tbps"][1]
    assert res.origins["gpu.bf16_tflops"][1].startswith("pdsim/model/data/gpus.yaml")
    out = pdsim.run(f)
    assert out.summary["completed_requests"] == 20


def test_overrides_apply_and_move_the_step_time(tmp_path):
    f = _scenario(tmp_path, BODY)
    base = pdsim.run(f).summary["mean_tpot_ms"]
    faster = pdsim.run(f, sets=["gpu.hbm_tbps=8"]).summary["mean_tpot_ms"]
    assert faster < base  # decode reads weights and KV: more bandwidth, shorter steps
    res = profiles.for_scenario(pdsim.load(f, ["gpu.hbm_tbps=8", "model.layers=2"]))
    assert res.gpu.hbm_tbps == 8 and res.model.layers == 2
    assert res.origins["gpu.hbm_tbps"] == (8, "scenario override")
    inline = small_fleet(engine={"bootstrap_ms": 0.0})
    assert profiles.for_scenario(pdsim.load(inline)).engine.bootstrap_ms == 0.0


def test_a_calibration_applies_to_its_gpu_and_model_only(tmp_path):
    cal = MY_PROFILES + """calibrations:
  - gpu: H100-slowmem
    model: tiny-moe
    set:
      gpu.gemm_eff: {value: 0.33, source: fitted on my table}
"""
    f = _scenario(tmp_path, BODY, cal)
    res = profiles.for_scenario(pdsim.load(f))
    assert res.calibrated and res.gpu.gemm_eff == 0.33
    other = profiles.for_scenario(pdsim.load(f, ["fleet.model=qwen2.5-7b"]))  # (no family)
    assert not other.calibrated and other.gpu.gemm_eff == 0.7
    kin = profiles.for_scenario(pdsim.load(f, ["fleet.model=deepseek-v2-lite"]))
    assert kin.gpu.gemm_eff != 0.33 and "tiny-moe" not in kin.calibration  # (its family's)


@pytest.mark.parametrize("text, needle", [
    ("gpus: {X: {extends: H100, hbm_tb: 3}}", "unknown key 'gpus.X.hbm_tb'; allowed keys here"),
    ("gpus: {X: {extends: H100, hbm_tbps: .inf}}", "gpu.hbm_tbps"),
    ("gpus: {X: {extends: H100, hbm_tbps: .nan}}", "gpu.hbm_tbps"),
    ("gpus: {X: {extends: H100, hbm_tbps: -3}}", "greater than 0"),
    ("gpus: {X: {bf16_tflops: 100}}", "missing required key 'gpus.X."),
    ("gpus: {X: {extends: H9000}}", "no gpu 'H9000'"),
    ("gpus: {X: {extends: [H100]}}", "'gpus.X.extends' must name a gpu profile (a string)"),
    ("models: {X: {extends: {a: 1}}}", "'models.X.extends' must name a model profile"),
    ("gpus: {H100: {hbm_gb: 96, hbm_gb: 1}}", "duplicate key 'gpus.H100.hbm_gb'"),
    ("gpus: {H100: &a {x: *a}}", "recursive alias at 'gpus.H100.x'"),
    ("gpus: " + "[" * 1000 + "]" * 1000, "nested deeper than 50 levels"),
    ("gpus: [1, 2]", "must be a mapping"),
    ("nodes: {}", "unknown key 'nodes'"),
    ("gpus: {X: {extends: H100\n", "not valid YAML"),
    ("gpus: {X: {extends: H100}}\ncalibrations: [{gpu: X, model: deepseek-v2-lite, "
     "set: {gpu.gemm: 1}}]", "unknown key 'calibrations.0.set.gpu.gemm'"),
])
def test_a_malformed_profile_is_one_line(tmp_path, text, needle):
    body = BODY.replace("H100-slowmem", "X").replace("tiny-moe", "deepseek-v2-lite")
    f = _scenario(tmp_path, body, text)
    with pytest.raises(ScenarioError) as err:
        pdsim.load(f)
    msg = str(err.value)
    assert needle in msg and "\n" not in msg


def test_profile_paths_stay_inside_the_scenario_directory(tmp_path):
    f = _scenario(tmp_path, BODY.replace("prof/my.yaml", "../elsewhere.yaml"))
    with pytest.raises(ScenarioError, match="outside the scenario's directory"):
        pdsim.load(f)
    f = _scenario(tmp_path, BODY.replace("prof/my.yaml", "prof/missing.yaml"))
    with pytest.raises(ScenarioError, match="not found"):
        pdsim.load(f)


def test_inline_override_errors_name_the_key():
    with pytest.raises(ScenarioError, match="unknown key 'gpu.hbm_tb'"):
        pdsim.load(small_fleet(gpu={"hbm_tb": 3}))
    with pytest.raises(ScenarioError, match="gpu.hbm_eff"):
        pdsim.load(small_fleet(gpu={"hbm_eff": 1.5}))
    with pytest.raises(ScenarioError, match="model.layers"):
        pdsim.load(small_fleet(model={"layers": "many"}))
    with pytest.raises(ScenarioError, match="fleet.gpu"):
        pdsim.load(small_fleet(), ["fleet.gpu=H9000"])


def test_cli_profiles_shows_origins(capsys, tmp_path):
    f = _scenario(tmp_path, BODY)
    assert main(["profiles", "--scenario", str(f), "--set", "engine.bootstrap_ms=5"]) == 0
    out = capsys.readouterr().out
    assert "gpu.hbm_tbps" in out and "my lab's measurement" in out
    assert "engine.bootstrap_ms" in out and "scenario override" in out
    assert main(["validate", str(f), "--set", "gpu.hbm_tbps=-1"]) == 2
    err = capsys.readouterr().err
    assert "gpu.hbm_tbps" in err and len(err.strip().splitlines()) == 1


def test_cli_profiles_says_a_declared_unknown_is_chosen(capsys):
    """drop_timeout's model.layers and model.experts are declared unknowns at their nominal:
    `profiles --scenario` called them a "scenario override", as if someone had measured them."""
    assert main(["profiles", "--scenario", "scenarios/drop_timeout.yaml"]) == 0
    out = {ln.split()[0]: ln for ln in capsys.readouterr().out.splitlines()[1:] if ln.strip()}
    assert "declared unknown at its nominal (uniform [6, 8] (integer))" in out["model.layers"]
    assert "declared unknown at its nominal" in out["model.experts"]
    assert "declared unknown" not in out["model.hidden_size"]


def test_shipped_catalog_covers_the_issue_list():
    assert {"A10", "A100", "H100", "H800", "H20", "H20-3e", "H200", "B200", "GB200", "B300",
            "GB300"} <= set(profiles.gpu_names())
    assert {"qwen3-32b", "qwen3.5-397b-a17b", "glm-5", "gpt-oss-120b", "deepseek-r1",
            "qwen3-235b-a22b-fp8", "qwen3.5-397b-a17b-fp8", "glm-5-fp8"} <= set(
        profiles.model_names())  # issue 29's corpus models
    assert {"llama-3.1-8b", "llama-3.1-70b", "qwen2.5-7b", "qwen3-8b", "qwen3-235b-a22b",
            "deepseek-v2-lite", "deepseek-v3", "dsv3-ci-test", "llama-3.1-70b-awq-int4",
            "qwen2.5-7b-gptq-int4", "llama-3.1-8b-fp8"} <= set(profiles.model_names())
    for name in profiles.model_names():  # the architectures add up to the published sizes
        m = profiles.model(name)
        if m.params_total_b:
            assert m.params_total / 1e9 == pytest.approx(m.params_total_b, rel=0.02), name


def test_a_run_directory_reruns_with_its_profile_files(tmp_path):
    f = _scenario(tmp_path, BODY)
    first = pdsim.run(f)
    first.write(tmp_path / "out")
    again = pdsim.run(tmp_path / "out" / "scenario.yaml", allow_outside_paths=True)
    assert again.summary["mean_tpot_ms"] == first.summary["mean_tpot_ms"]
    assert "--allow-outside-paths" in (tmp_path / "out" / "scenario.yaml").read_text()


def test_a_resolution_is_remembered_per_its_inputs(tmp_path):
    """profiles.resolve remembers a resolution per names, user files (as stamped: an edited
    file is read again) and overrides told apart by type and repr (1 and 1.0, 0.0 and -0.0
    are different overrides, each validated on its own)."""
    one = profiles.resolve("H100", "llama-3.1-8b", overrides={"gpu": {"hbm_tbps": 3}})
    assert profiles.resolve("H100", "llama-3.1-8b", overrides={"gpu": {"hbm_tbps": 3}}) is one
    other = profiles.resolve("H100", "llama-3.1-8b", overrides={"gpu": {"hbm_tbps": 3.0}})
    assert other is not one and other.gpu == one.gpu
    zero = profiles.resolve("H100", "llama-3.1-8b", overrides={"engine": {"bootstrap_ms": 0.0}})
    minus = profiles.resolve("H100", "llama-3.1-8b",
                             overrides={"engine": {"bootstrap_ms": -0.0}})
    assert minus is not zero and math.copysign(1, minus.engine.bootstrap_ms) == -1
    f = tmp_path / "my.yaml"
    f.write_text("gpus:\n  H100-x: {extends: H100, hbm_tbps: 2.0}\n")
    first = profiles.resolve("H100-x", "llama-3.1-8b", files=(str(f),))
    assert first.gpu.hbm_tbps == 2.0
    f.write_text("gpus:\n  H100-x: {extends: H100, hbm_tbps: 2.50}\n")  # (a new size)
    assert profiles.resolve("H100-x", "llama-3.1-8b", files=(str(f),)).gpu.hbm_tbps == 2.5


def test_a_contradictory_user_model_names_the_key_its_file_set():
    """A user profile that makes an MLA model gqa blames its own 'attention' (not kv_heads,
    which nobody set: the class default), naming the file."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        f = _scenario(Path(d), BODY.replace("tiny-moe", "tiny-gqa").replace("H100-slowmem", "H100"),
                      "models:\n  tiny-gqa: {extends: deepseek-v2-lite, attention: gqa}\n")
        with pytest.raises(pdsim.ScenarioError, match=r"invalid value at 'model\.attention' "
                           r"\(.*my\.yaml.*\): attention gqa needs kv_heads >= 1"):
            pdsim.load(f)


def test_a_gqa_model_whose_heads_are_not_a_multiple_of_its_kv_heads_is_refused(tmp_path):
    """heads 60 over kv_heads 8 (a typo for 64) loaded and ran: no Hugging Face GQA model has
    it, since each KV head serves a whole group of query heads."""
    f = tmp_path / "my.yaml"
    f.write_text("models:\n  my-llama: {extends: llama-3.1-8b, heads: 60}\n")
    with pytest.raises(profiles.ProfileError, match=r"invalid value at 'model\.heads' "
                       r"\(.*my\.yaml\): attention gqa needs heads \(60\) to be a multiple "
                       r"of kv_heads \(8\)"):
        profiles.resolve("H100", "my-llama", files=(str(f),))
    with pytest.raises(profiles.ProfileError, match=r"'model\.heads' \(scenario override\)"):
        profiles.resolve("H100", "llama-3.1-8b", overrides={"model": {"heads": 12}})
    profiles.resolve("H100", "llama-3.1-8b", overrides={"model": {"heads": 40}})  # 5 per KV head


@pytest.mark.parametrize("argv, says", [
    (["H20", "--set", "a=1"], "--set applies to a scenario's values; it needs --scenario FILE"),
    (["--set", "gpu.hbm_tbps=3"], "--set applies to a scenario's values"),
    (["H20", "--allow-outside-paths"], "--allow-outside-paths applies to a scenario's values"),
    (["H20", "--scenario", "scenarios/healthy.yaml"],
     "profiles 'H20' --scenario: give a profile NAME or --scenario FILE, not both"),
])
def test_cli_profiles_refuses_options_it_would_ignore(capsys, argv, says):
    """`profiles H20 --set a=1` printed H20 as shipped, the --set (and --allow-outside-paths)
    silently dropped; with --scenario, NAME was dropped."""
    assert main(["profiles", *argv]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.count("\n") == 1 and says in cap.err, cap.err


def test_a_family_calibration_applies_after_the_models_own_and_for_its_layout(tmp_path):
    """Resolution order: the model's own calibration before its family's; a calibration that
    says which layout it holds for applies to a role of that layout only (the next most
    specific one to the others). Checked with a profile file of one's own."""
    f = tmp_path / "cal.yaml"
    f.write_text("""calibrations:
  - {die: GH100, family: qwen3-dense, set: {gpu.gemm_eff: 0.11}}
  - {gpu: H100, model: qwen3-32b, layout: {dp_attention: true}, set: {gpu.gemm_eff: 0.22}}
  - {die: GH100, family: qwen3-dense, engine: other, set: {gpu.gemm_eff: 0.33}}
""")
    tp = (("dp_attention", False), ("moe_a2a_backend", "none"))
    dpa = (("dp_attention", True), ("moe_a2a_backend", "none"))
    res = profiles.resolve("H200", "qwen3-32b", files=(str(f),), layout=tp)
    assert res.gpu.gemm_eff == 0.11 and "family qwen3-dense" in res.calibration
    res = profiles.resolve("H200", "qwen3-32b", files=(str(f),), layout=dpa)
    assert res.gpu.gemm_eff == 0.22 and res.calibration.startswith("H100 / qwen3-32b")
    assert "for layouts with dp_attention True" in res.calibration
    res = profiles.resolve("H200", "qwen3-8b", files=(str(f),), layout=dpa)
    assert res.gpu.gemm_eff == 0.11  # the family's, for another model of it
    res = profiles.resolve("H200", "llama-3.1-8b", files=(str(f),), layout=tp)
    assert res.gpu.gemm_eff == 0.7 and res.calibration == ""  # another family: none
    res = profiles.resolve("H200", "qwen3-32b", files=(str(f),))  # no role: the most specific
    assert res.gpu.gemm_eff == 0.22

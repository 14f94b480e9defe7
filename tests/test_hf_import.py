"""Issue 29, any model from its config: ``pdsim profiles import config.json --name NAME``
(pdsim.model.hf_import) on the configs in tests/hf_configs/, the shipped profiles made from
them, and the one-line refusals of what pdsim does not model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import pdsim
from pdsim.cli.main import main
from pdsim.model import hf_import, profiles

CONFIGS = Path(__file__).parent / "hf_configs"
# fixture -> the shipped profile made from it (the shipped FP8 variants extend these)
SHIPPED = {"Qwen3-32B": "qwen3-32b", "Qwen3.5-397B-A17B": "qwen3.5-397b-a17b", "GLM-5": "glm-5",
           "gpt-oss-120b": "gpt-oss-120b", "DeepSeek-R1": "deepseek-r1",
           "Qwen3-235B-A22B-FP8": "qwen3-235b-a22b-fp8", "Llama-3.1-8B": "llama-3.1-8b"}


def _config(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


@pytest.mark.parametrize("fixture", sorted(SHIPPED))
def test_each_config_imports_to_the_shipped_profile(fixture):
    entry = hf_import.profile_from_config(_config(fixture), f"{fixture}.json")
    shipped = profiles.model(SHIPPED[fixture])
    for field, item in entry.items():
        assert getattr(shipped, field) == item["value"], (fixture, field)
        if field != "kv_dtype":  # (SGLang's default, not a config key)
            assert item["source"].startswith(f"{fixture}.json"), (field, item["source"])
    # the architecture-derived sizes match too
    model, _text = hf_import.import_config(CONFIGS / f"{fixture}.json", "x")
    assert model.kv_bytes_per_token == shipped.kv_bytes_per_token
    assert model.params_total == pytest.approx(shipped.params_total)


def test_the_importer_reads_each_layer_kind():
    q35 = hf_import.profile_from_config(_config("Qwen3.5-397B-A17B"))
    assert q35["linear_attention_layers"]["value"] == 45  # 3 of every 4 (layer_types)
    assert q35["layers"]["source"] == "config.json: text_config.num_hidden_layers"
    assert q35["attn_output_gate"]["value"] is True
    assert (q35["vision_layers"]["value"], q35["vision_hidden_size"]["value"]) == (27, 1152)
    # full_attention_interval alone gives the same layers
    cfg = _config("Qwen3.5-397B-A17B")
    del cfg["text_config"]["layer_types"]
    assert hf_import.profile_from_config(cfg)["linear_attention_layers"]["value"] == 45
    oss = hf_import.profile_from_config(_config("gpt-oss-120b"))
    assert (oss["sliding_window_layers"]["value"], oss["sliding_window"]["value"]) == (18, 128)
    assert (oss["weight_dtype"]["value"], oss["expert_dtype"]["value"]) == ("bf16", "mxfp4")
    glm = hf_import.profile_from_config(_config("GLM-5"))
    assert (glm["index_topk"]["value"], glm["dense_layers"]["value"]) == (2048, 3)
    assert hf_import.profile_from_config(_config("DeepSeek-R1"))["weight_dtype"]["value"] \
        == "fp8_block"


def test_context_len_is_sglangs_get_context_length():
    """The first context-length key, times rope_scaling's factor unless the scaling names
    original_max_position_embeddings (DeepSeek's yarn) or is llama3 (hf_transformers_utils.py
    get_context_length@0.5.9): it sizes the default max_running_requests."""
    ctx = lambda c: hf_import.profile_from_config(c)["context_len"]["value"]  # noqa: E731
    cfg = _config("Qwen3-32B")
    assert ctx(cfg) == 40960
    cfg["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0}
    assert ctx(cfg) == 4 * 40960
    cfg["rope_scaling"] = {"rope_type": "yarn", "factor": 40,  # (DeepSeek-V3's)
                           "original_max_position_embeddings": 4096}
    assert ctx(cfg) == 40960
    cfg["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0}  # (Llama-3.1's)
    assert ctx(cfg) == 40960
    cfg["seq_length"] = 8192  # (an earlier key of SGLang's list wins)
    assert ctx(cfg) == 8192
    del cfg["seq_length"], cfg["max_position_embeddings"]  # none: not known (the slots' floor)
    assert "context_len" not in hf_import.profile_from_config(cfg)


@pytest.mark.parametrize("edit, says", [
    (lambda c: c.update(architectures=["MambaForCausalLM"]),
     "architecture 'MambaForCausalLM' is not one pdsim models"),
    (lambda c: c["text_config"]["layer_types"].__setitem__(0, "chunked_attention"),
     "layer type 'chunked_attention' is not one pdsim models"),
    (lambda c: c["text_config"].update(quantization_config={"quant_method": "bitsandbytes"}),
     "quantization 'bitsandbytes' is not one pdsim models"),
    (lambda c: c["text_config"].pop("num_hidden_layers"), "no 'num_hidden_layers'"),
    (lambda c: c["text_config"].update(decoder_sparse_step=2), "decoder_sparse_step 2"),
    (lambda c: c["text_config"].update(layer_types=["full_attention"] * 3),
     "layer_types must list num_hidden_layers (60) entries"),
])
def test_what_pdsim_does_not_model_is_refused_in_one_line(edit, says):
    cfg = _config("Qwen3.5-397B-A17B")
    edit(cfg)
    with pytest.raises(hf_import.ConfigImportError) as err:
        hf_import.profile_from_config(cfg)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_shared_dsa_indexers_are_refused():
    cfg = _config("GLM-5")
    cfg["index_topk_freq"] = 4
    with pytest.raises(hf_import.ConfigImportError, match="shared DSA indexers"):
        hf_import.profile_from_config(cfg)


def test_cli_import_writes_a_profile_a_scenario_runs(tmp_path, capsys):
    out = tmp_path / "q35.yaml"
    assert main(["profiles", "import", str(CONFIGS / "Qwen3.5-397B-A17B.json"), "--name",
                 "my-q35", "--out", str(out)]) == 0
    said = capsys.readouterr()
    assert "my-q35: Qwen3_5MoeForConditionalGeneration, gqa, 60 layers, 45 linear attention" \
        in said.out and "state 183.2 MiB/request" in said.out
    assert f"wrote {out}" in said.err
    text = out.read_text()
    assert "Qwen3.5-397B-A17B.json: text_config.linear_num_value_heads" in text
    sc = tmp_path / "s.yaml"
    sc.write_text(f"profiles: [{out.name}]\nmodel: {{weight_dtype: fp8_block}}\n"
                  "fleet: {gpu: H200, model: my-q35, prefill: {tp: 8, mem_fraction_static: 0.8},"
                  " decode: {tp: 8, ep: 8, mem_fraction_static: 0.8}}\n"
                  "clients: [{kind: bench, num_prompts: 4, max_concurrency: 2,"
                  " dataset: {kind: random, input_len: 1024, output_len: 16}}]\n")
    res = pdsim.run(sc)
    assert res.summary["completed_requests"] == 4


@pytest.mark.parametrize("argv, says", [
    (["profiles", "import", "nope.json", "--name", "x"], "nope.json"),
    (["profiles", "import", "{cfg}"], "usage: pdsim profiles import config.json --name NAME"),
    (["profiles", "H20", "--name", "x"], "--name belongs to `pdsim profiles import"),
    (["profiles", "import", "{bad}", "--name", "x"], "not valid JSON"),
])
def test_cli_import_errors_are_one_line(tmp_path, capsys, argv, says):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    cfg = str(CONFIGS / "GLM-5.json")
    argv = [a.format(cfg=cfg, bad=bad) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1

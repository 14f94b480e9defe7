"""Issue 29, SGLang's defaults as each release derives them (pdsim.model.sglang,
pdsim.config.versions) and the KV pool SGLang sizes from them (pdsim.model.memory): the
values of the fact sheet's tables (section A3), the engine version as a validated scenario
choice, and the CUDA-graph cap's eager steps."""

from __future__ import annotations

import pytest

import pdsim
from pdsim.config.fleet import DecodeConfig, PrefillConfig
from pdsim.config.units import ScenarioError
from pdsim.model import memory, profiles, sglang
from pdsim.model.predictor import Layout, OperatorPredictor

ENGINE = profiles.engine()


def _free(g: profiles.GPU, tp: int) -> int:
    """What SGLang reads as free at start-up (engine.init_mib, init_mib_per_peer)."""
    return g.hbm_bytes - int((ENGINE.init_mib + ENGINE.init_mib_per_peer * (tp - 1)) * 2**20)

# mem_fraction_static SGLang derives (no DP attention; TP 1/2/4/8), fact sheet A3's table,
# computed from server_args.py of each release with nvidia-smi's MiB
MFS = {
    "H100": ((.874, .868, .856, .831), (.835, .834, .824, .818)),
    "H20": ((.869, .864, .854, .833), (.863, .861, .854, .848)),
    "H200": ((.911, .907, .900, .886), (.907, .906, .900, .897)),
    "H20-3e": ((.911, .907, .900, .886), (.907, .906, .900, .897)),
    "B200": ((.821,) * 4, (.857, .856, .855, .852)),
    "GB200": ((.827,) * 4, (.862, .861, .859, .857)),
    "B300": ((.881,) * 4, (.905, .904, .903, .901)),
    "GB300": ((.885,) * 4, (.908, .907, .906, .905)),
}
# TP8 DP8 with DP attention: (0.5.1.post1, 0.5.6.post2 to 0.5.9)
MFS_DPA = {"H100": (.780, .592), "H20": (.791, .660), "H200": (.858, .769),
           "B200": (.799, .751), "GB200": (.805, .759), "B300": (.866, .834),
           "GB300": (.870, .840)}


def _mfs(gpu: str, tp: int, version: str, dp: int = 1, dpa: bool = False) -> float:
    g = profiles.gpu(gpu)
    return sglang.mem_fraction_static(g, profiles.model("llama-3.1-8b"), tp, dp, dpa,
                                      sglang.chunked_prefill_size(g, version),
                                      sglang.cuda_graph_max_bs(g, tp, version), version)


@pytest.mark.parametrize("gpu", sorted(MFS))
def test_mem_fraction_static_defaults_per_gpu_tp_and_release(gpu):
    old, new = MFS[gpu]
    for tp, want in zip((1, 2, 4, 8), old, strict=True):
        assert _mfs(gpu, tp, "0.5.1.post1") == pytest.approx(want, abs=5e-4), (tp, "0.5.1")
    for version in ("0.5.6.post2", "0.5.8.post1", "0.5.9", "glm5-hopper"):
        for tp, want in zip((1, 2, 4, 8), new, strict=True):
            assert _mfs(gpu, tp, version) == pytest.approx(want, abs=5e-4), (tp, version)
    if gpu in MFS_DPA:
        old_dpa, new_dpa = MFS_DPA[gpu]
        assert _mfs(gpu, 8, "0.5.1.post1", 8, True) == pytest.approx(old_dpa, abs=5e-4)
        assert _mfs(gpu, 8, "0.5.9", 8, True) == pytest.approx(new_dpa, abs=5e-4)


def test_the_10_gib_reserve_floor_binds_above_60_gib():
    """>= 0.5.3 reserves at least 10 GiB on GPUs above 60 GiB (``reserved_mem = max(
    reserved_mem, 10 * 1024)``). An H100 at TP 1 with a 2,048-token chunk and 256 graph slots
    asks for 512 + 1.5 x 2,048 + 2 x 256 + 128 = 4,224 MiB: the floor makes it 10,240, so
    mem_fraction_static is round((81,559 - 10,240) / 81,559, 3) = 0.874, not 0.948. Below 60
    GiB (an A10, 24 GiB) no floor applies."""
    h100, a10 = profiles.gpu("H100"), profiles.gpu("A10")
    assert sglang.reserved_mib(h100, 1, 1, False, 2048, 256, "0.5.9") == 10 * 1024
    assert sglang.mem_fraction_static(h100, profiles.model("llama-3.1-8b"), 1, 1, False, 2048,
                                      256, "0.5.9") == pytest.approx(0.874, abs=5e-4)
    assert sglang.reserved_mib(a10, 1, 1, False, 2048, 24, "0.5.9") == pytest.approx(
        512 + 3072 + 48 + 128)


def test_max_running_requests_defaults_to_sglangs_derivation():
    """Unset, a rank's max_running_requests is SGLang's min(pool // 2, request slots), the
    slots min(max(pool / context_len x 512, 2048), 4096) (model_runner.py@0.5.9): 2,048 for
    Llama-3.1-8B on an H100 (pool 422k, context 131,072: 1,649 -> the floor), 4,096 for the CI
    DeepSeek checkpoint's 7.4M-token H20 ranks (context 163,840: 23,058 -> the ceiling), half a
    3,000-token pool; a value the scenario gives is kept, and a profile with no context length
    takes the floor."""
    from pdsim.engine.fleet import Fleet

    assert sglang.default_max_running(422286, 131072) == 2048
    assert sglang.default_max_running(7378463, 163840) == 4096
    assert sglang.default_max_running(800_000, 131072) == 3125  # (between floor and ceiling)
    assert sglang.default_max_running(3000, 131072) == 1500
    assert sglang.default_max_running(7378463, None) == 2048

    def ranks(fleet, **role):
        sc = pdsim.load({"fleet": {"gpu": fleet[0], "model": fleet[1], "prefill": role,
                                   "decode": role},
                         "clients": [{"kind": "bench", "num_prompts": 1}]})
        f = Fleet(sc)
        return [r.max_running for r in (*f.prefill_ranks, *f.decode_ranks)]

    assert ranks(("H100", "llama-3.1-8b")) == [2048, 2048]
    assert ranks(("H20", "dsv3-ci-test"), dp=2, tp=2, dp_attention=True) == [4096] * 4
    assert ranks(("H100", "llama-3.1-8b"), kv_pool_tokens=3000) == [1500, 1500]
    assert ranks(("H100", "llama-3.1-8b"), max_running_requests=256) == [256, 256]


@pytest.mark.parametrize("mode", ["colocated", "pd"])
def test_an_unset_max_running_requests_lets_a_rank_run_more_than_256(mode):
    """600 short requests at once on one Llama-3.1-8B H100 server: unset, the running batch
    passes 256 (SGLang's 2,048 slots bind nowhere); the old fixed 256 would cap it there."""
    def peak(**role):
        one = {"servers": 1, **role}
        roles = {"colocated": one} if mode == "colocated" else {"prefill": {"servers": 1},
                                                                 "decode": one}
        res = pdsim.run({"name": "mrr", "seed": 1, "horizon_s": 300,
                         "fleet": {"mode": mode, "gpu": "H100", "model": "llama-3.1-8b",
                                   **roles},
                         "clients": [{"kind": "bench", "num_prompts": 600,
                                      "max_concurrency": 600,
                                      "dataset": {"kind": "random", "input_len": 64,
                                                  "output_len": 256}}]})
        assert res.summary["completed_requests"] == 600
        return res.timeseries.decode_running.max()

    assert peak() > 400
    assert peak(max_running_requests=256) <= 256


def test_cuda_graph_cap_and_chunk_defaults_per_release():
    cap = sglang.cuda_graph_max_bs
    g = {n: profiles.gpu(n) for n in ("H100", "H20", "H200", "B200", "A10")}
    # 0.5.1.post1: H100 160, H20/H200 256, B200 512 (cuda_graph_runner.py)
    assert [cap(g[n], 8, "0.5.1.post1") for n in ("H100", "H20", "H200", "B200")] == [
        160, 256, 256, 512]
    # >= 0.5.3: 256 at tp < 4 else 512 on 60-160 GiB parts; 512 above; A10: 24 / 80
    assert [cap(g["H100"], tp, "0.5.9") for tp in (1, 2, 4, 8)] == [256, 256, 512, 512]
    assert cap(g["B200"], 1, "0.5.9") == 512
    assert (cap(g["A10"], 2, "0.5.9"), cap(g["A10"], 4, "0.5.9")) == (24, 80)
    assert (cap(g["A10"], 2, "0.5.1.post1"), cap(g["A10"], 4, "0.5.1.post1")) == (8, 80)
    chunk = sglang.chunked_prefill_size
    assert [chunk(g[n], "0.5.9") for n in ("A10", "H100", "H200", "B200")] == [
        2048, 8192, 8192, 16384]
    a100_40 = profiles.GPU(**{**vars(g["H100"]), "hbm_mib": 40_960})
    assert (chunk(a100_40, "0.5.1.post1"), chunk(a100_40, "0.5.9")) == (8192, 4096)


def test_the_engine_version_is_a_validated_scenario_choice(tmp_path):
    base = {"fleet": {"gpu": "H100", "model": "llama-3.1-8b"}, "clients": [{"kind": "bench"}]}
    with pytest.raises(ScenarioError, match="invalid value at 'engine.version': .*'0.5.1.post1'"
                       ".*'glm5-hopper'") as err:
        pdsim.load({**base, "engine": {"version": "0.4.0"}})
    assert "\n" not in str(err.value)
    assert pdsim.load(base).engine.version == "0.5.9"
    new = memory.pools(pdsim.load(base))["decode"]
    old = memory.pools(pdsim.load({**base, "engine": {"version": "0.5.1.post1"}}))["decode"]
    assert (old.mem_fraction_static, new.mem_fraction_static) == (0.874, 0.835)
    assert old.tokens > new.tokens
    assert "SGLang 0.5.1.post1's default for H100 at tp 1" in old.how
    # the image tag the corpus's GLM-5 rows ran: 0.5.9's rules
    glm = memory.pools(pdsim.load({**base, "engine": {"version": "glm5-hopper"}}))["decode"]
    assert glm.mem_fraction_static == new.mem_fraction_static


# --- the KV pool -------------------------------------------------------------------------------


def _pool(gpu: str, model: str, cfg) -> memory.Pool:
    return memory.pool(cfg, profiles.gpu(gpu), profiles.model(model), ENGINE)


def test_kv_cell_mla_whole_gqa_replicated_dsa_with_indexer():
    m = profiles.model
    # MLA: the latent whole on every GPU whatever the TP
    assert memory.cell_bytes(m("deepseek-v3"), 8) == memory.cell_bytes(m("deepseek-v3"), 1) \
        == 61 * 576 * 2
    # GQA: 4 KV heads over 8 GPUs are replicated, one per GPU (not half of one)
    assert memory.cell_bytes(m("qwen3-235b-a22b"), 8) == memory.cell_bytes(
        m("qwen3-235b-a22b"), 4) == 94 * 1 * 2 * 128 * 2
    # DSA: the indexer's FP8 key and scale ride along (GLM-5: 100,152 B BF16, 61,464 B FP8)
    assert memory.cell_bytes(m("glm-5"), 8) == 100_152
    # Qwen3.5: only the 15 full-attention layers hold KV (2 heads replicated at TP8)
    assert memory.cell_bytes(m("qwen3.5-397b-a17b"), 8) == 15 * 1 * 2 * 256 * 2


def test_pool_tokens_follow_sglangs_formula():
    cfg = DecodeConfig(tp=8, mem_fraction_static=0.85)
    g, m = profiles.gpu("H200"), profiles.model("glm-5-fp8")
    op = OperatorPredictor(g, m, ENGINE, Layout(tp=8))
    rest = _free(g, 8) * 0.85 - op.weights_per_gpu()
    assert memory.pool(cfg, g, m, ENGINE).tokens == int(rest) // 100_152



def test_pool_is_sized_from_the_memory_free_at_start_up():
    """SGLang's profile_max_num_token sizes the pool from the memory free after the CUDA context
    and distributed init, not the device's. A public start-up log (engines.yaml [llmdlog]:
    Qwen3-32B on one H100, --mem-fraction-static 0.90) logged 39,078 tokens; from the device
    memory pdsim would give ~43.7k. init_mib is read from the same log's free memory, so this
    checks the formula, the weights and the cell against its pool, not the value's transfer to
    other deployments. At tp 8 on an H200 SGLang read 137.29 GiB free ([pcg11716])."""
    g, m = profiles.gpu("H100"), profiles.model("qwen3-32b")
    p = memory.pool(DecodeConfig(tp=1, mem_fraction_static=0.90), g, m, ENGINE)
    assert p.tokens == pytest.approx(39_078, rel=0.01)
    assert _free(profiles.gpu("H200"), 8) / 2**30 == pytest.approx(137.29, abs=0.02)
    # the share of the device SGLang's default leaves the Qwen3-32B rows' server (0.835 at tp 1):
    # ~18k tokens, not the ~22.5k the device's memory gives
    dflt = memory.pool(DecodeConfig(tp=1), g, m, ENGINE, version="0.5.8.post1")
    assert dflt.mem_fraction_static == 0.835
    assert 17_500 < dflt.tokens < 19_000

def test_sliding_window_layers_split_the_pool():
    """gpt-oss: full and SWA layers share the bytes so that the SWA pool is 0.8 x the full
    pool's tokens (set_num_tokens_hybrid_swa); the engine counts the full pool's."""
    cfg = DecodeConfig(tp=1, mem_fraction_static=0.9)
    g, m = profiles.gpu("H100"), profiles.model("gpt-oss-120b")
    op = OperatorPredictor(g, m, ENGINE, Layout(tp=1))
    rest = _free(g, 1) * 0.9 - op.weights_per_gpu()
    per_layer = 2 * 8 * 64 * 2
    p = memory.pool(cfg, g, m, ENGINE)
    assert p.tokens == pytest.approx(rest / (18 * per_layer + 0.8 * 18 * per_layer), abs=2)
    assert p.swa_tokens == int(p.tokens * 0.8)


def test_recurrent_states_are_carved_first_and_cap_running_requests():
    """Qwen3.5 (SGLang handle_max_mamba_cache, init_memory_pool): radix cache off with
    --max-running-requests: that many states; on: 0.9 / 1.9 of the memory after weights, and
    running requests capped at states / 3."""
    g, m = profiles.gpu("H200"), profiles.model("qwen3.5-397b-a17b-fp8")
    per = m.state_bytes_per_request(8)
    off = _pool("H200", "qwen3.5-397b-a17b-fp8",
                DecodeConfig(tp=8, mem_fraction_static=0.8, max_running_requests=128))
    assert off.states == off.max_running == 128
    op = OperatorPredictor(g, m, ENGINE, Layout(tp=8))
    rest = _free(g, 8) * 0.8 - op.weights_per_gpu()
    assert off.tokens == int(rest - 128 * per) // (15 * 2 * 256 * 2)
    on = _pool("H200", "qwen3.5-397b-a17b-fp8",
               PrefillConfig(tp=8, mem_fraction_static=0.8, prefix_cache=True))
    assert on.states == int(rest * 0.9 / 1.9 // per) and on.max_running == on.states // 3
    # radix cache off without --max-running-requests: the ratio's states, one a request
    unset = _pool("H200", "qwen3.5-397b-a17b-fp8", DecodeConfig(tp=8, mem_fraction_static=0.8))
    assert unset.states == on.states and unset.max_running == unset.states
    # the engine applies the cap: a prefill server with the radix cache on
    sc = {"name": "q35", "seed": 1, "horizon_s": 60,
          "fleet": {"gpu": "H200", "model": "qwen3.5-397b-a17b-fp8",
                    "prefill": {"tp": 8, "prefix_cache": True, "max_running_requests": 100_000,
                                "mem_fraction_static": 0.8},
                    "decode": {"tp": 8, "ep": 8, "max_running_requests": 64}},
          "clients": [{"kind": "bench", "num_prompts": 4, "max_concurrency": 2,
                       "dataset": {"kind": "random", "input_len": 512, "output_len": 8}}]}
    from pdsim.engine.fleet import Fleet

    fleet = Fleet(pdsim.load(sc))
    assert fleet.prefill_ranks[0].max_running == on.max_running
    assert fleet.decode_ranks[0].max_running == 64
    assert pdsim.run(sc).summary["completed_requests"] == 4


def test_decode_above_the_cuda_graph_cap_runs_eagerly():
    """A decode batch above --cuda-graph-max-bs runs eagerly: the engine's eager per-layer
    cost (prefill_layer_us unless eager_layer_us) instead of decode_layer_us."""
    g, m = profiles.gpu("H100"), profiles.model("llama-3.1-8b")
    capped = OperatorPredictor(g, m, ENGINE, Layout(tp=1, graph_bs=64))
    free = OperatorPredictor(g, m, ENGINE, Layout(tp=1))
    assert capped.decode(64, 64 * 1000) == free.decode(64, 64 * 1000)
    jump = capped.decode(65, 65 * 1000) - free.decode(65, 65 * 1000)
    assert jump == pytest.approx(32 * (60 - 15) * 1e-6)
    series = capped.decode_series(65, 65, 65_000, 65)
    assert next(series) == capped.decode(65, 65_000)
    # the default cap of a scenario role: SGLang's for the GPU, tp and release
    from pdsim.config.fleet import PredictorConfig
    from pdsim.model.predictor import layout_for

    assert layout_for(DecodeConfig(tp=2), PredictorConfig(), 1, g, "0.5.9").graph_bs == 256
    assert layout_for(DecodeConfig(tp=2), PredictorConfig(), 1, g, "0.5.1.post1").graph_bs == 160
    assert layout_for(DecodeConfig(tp=2, cuda_graph_max_bs=0), PredictorConfig(), 1, g,
                      "0.5.9").graph_bs == 0


def test_a_derived_fraction_sglang_could_not_start_with_is_one_line():
    with pytest.raises(ScenarioError, match="SGLang 0.5.9's default mem_fraction_static for "
                       "H100 at tp 32, dp 32 with dp attention is -0.274") as err:
        pdsim.load({"fleet": {"gpu": "H100", "model": "deepseek-v3",
                              "prefill": {"tp": 32, "dp": 32, "dp_attention": True,
                                          "chunked_prefill_size": 16384},
                              "decode": {"tp": 8}},
                    "clients": [{"kind": "bench"}]})
    assert "\n" not in str(err.value) and "set mem_fraction_static" in str(err.value)


def test_a_vlms_default_fraction_is_lowered_as_sglang_does():
    """adjust_mem_fraction_for_vlm: Qwen3.5's 27 x 1152 vision tower, 1.42x ViT-L/14's
    complexity: x 0.95 x (1 - 0.1 x 0.42)."""
    g = profiles.gpu("H200")
    q35, text = profiles.model("qwen3.5-397b-a17b"), profiles.model("qwen3-235b-a22b")
    args = (8, 1, False, 8192, 512, "0.5.9")
    ratio = 27 * 1152**2 / (24 * 1024**2)
    assert sglang.mem_fraction_static(g, text, *args) == 0.897
    assert sglang.mem_fraction_static(g, q35, *args) == pytest.approx(
        0.897 * 0.95 * (1 - 0.1 * (ratio - 1)))

"""Issue 29, hardware and sharding: one memory unit, Blackwell profiles and NVLink domains,
formats by what the GPU's tensor cores support, EP sharded as SGLang shards it, calibrations
attached to a die (and a weaker part never faster than a stronger one of its die)."""

from __future__ import annotations

import itertools
import re

import pytest

import pdsim
from pdsim.cli.main import main
from pdsim.config.fleet import DecodeConfig, PrefillConfig
from pdsim.engine.fleet import chunk_budget, default_chunked_prefill_size
from pdsim.model import formats, memory, profiles
from pdsim.model.predictor import Layout, OperatorPredictor

ENGINE = profiles.engine()


def _op(gpu: str, model: str, **layout) -> OperatorPredictor:
    res = profiles.resolve(gpu, model)
    return OperatorPredictor(res.gpu, res.model, res.engine, Layout(**layout))


# --- memory: one unit -------------------------------------------------------------------------


def test_gpu_memory_is_nvidia_smi_mib_and_the_h20_3e_is_the_h200_stack():
    """Issue 29: H20-3e was listed with 143 GB while the H200 (the same HBM3e stack) has 141 GB;
    both report 143,771 MiB in nvidia-smi, the unit SGLang reads."""
    assert profiles.gpu("H20-3e").hbm_mib == profiles.gpu("H200").hbm_mib == 143_771
    for name, mib in (("H100", 81_559), ("H20", 97_871), ("B200", 183_359), ("GB200", 189_471),
                      ("B300", 275_040), ("GB300", 284_208), ("A100", 81_920)):
        assert profiles.gpu(name).hbm_mib == mib, name
    assert profiles.gpu("H200").hbm_bytes == 143_771 << 20


def test_the_chunk_default_and_the_kv_pool_read_the_same_memory():
    """memory.py read hbm_gb as GB (x 1e9) and the chunked-prefill default read it as GiB:
    the same profile meant two sizes. Both now read hbm_mib: a part just under SGLang's
    60 GiB tier gets the 4096-token chunk and a pool of exactly mem_fraction_static x MiB x
    2^20 less its weights."""
    h20 = profiles.gpu("H20")
    part = profiles.GPU(**{**vars(h20), "name": "59GiB", "hbm_mib": 60 * 1024 - 1})
    assert default_chunked_prefill_size(part) == 4096
    assert default_chunked_prefill_size(profiles.GPU(**{**vars(part), "hbm_mib": 60 * 1024})
                                        ) == 8192
    model = profiles.model("llama-3.1-8b")
    cfg = DecodeConfig(tp=1, mem_fraction_static=0.8)
    op = OperatorPredictor(part, model, ENGINE, Layout(tp=1))
    pool = memory.pool(cfg, part, model, ENGINE)
    free = part.hbm_bytes - int(ENGINE.init_mib * 2**20)  # (tp 1: no peers)
    rest = free * 0.8 - op.weights_per_gpu()
    assert pool.tokens == int(rest) // (32 * 2 * 8 * 128 * 2)
    assert pool.tokens > int((60 * 1e9 * 0.8 - op.weights_per_gpu()) // 131072)  # not 60e9 B
    assert chunk_budget(PrefillConfig(), part) == 4096


# --- Blackwell, NVLink domains, NICs ----------------------------------------------------------


def test_blackwell_profiles_have_their_nvlink_domain_nic_and_fp4():
    want = {"B200": ("Blackwell", 8, 400, 9000), "GB200": ("Blackwell", 72, 400, 10000),
            "B300": ("Blackwell Ultra", 8, 800, 13125),
            "GB300": ("Blackwell Ultra", 72, 800, 15000)}
    for name, (die, domain, nic, fp4) in want.items():
        g = profiles.gpu(name)
        assert (g.arch, g.domain, g.nic_gbps, g.fp4_tflops) == (die, domain, nic, fp4), name
        assert g.nvlink_gbps == 900 and g.fp8_tflops == 2 * g.bf16_tflops
    for name in ("H100", "H200", "H20", "H800", "A100", "A10"):
        assert profiles.gpu(name).fp4_tflops is None, name  # no FP4 tensor cores
        assert profiles.gpu(name).domain == 8 if name != "A10" else True


def test_tp_collectives_and_expert_all_to_all_stay_on_nvlink_inside_a_domain():
    """Issue 29: expert all-to-all always crossed the NIC, even inside one NVLink domain."""
    # EP8 on one HGX node and EP72 in one NVL72 rack: every pair on NVLink, none on the NIC
    for gpu, ep in (("H100", 8), ("GB200", 72)):
        op = _op(gpu, "deepseek-v3", tp=ep, dp=ep, dp_attention=True, ep=ep, gather=ep,
                 a2a="deepep")
        assert op.a2a_nic == 0.0 and op.a2a_nvl == pytest.approx((ep - 1) / ep)
        per = 128 * 8 * 7168 * 3 * (ep - 1) / ep
        assert op.all_to_all(128, True) == pytest.approx(2 * 10e-6 + per / op.nvl_bw)
    # EP72 over 9 HGX nodes: the pairs to other nodes cross the NIC (the busier link)
    op = _op("H100", "deepseek-v3", tp=72, dp=72, dp_attention=True, ep=72, gather=72,
             a2a="deepep")
    assert op.a2a_nic == pytest.approx(64 / 72)
    assert op.all_to_all(128, True) == pytest.approx(
        2 * 10e-6 + 128 * 8 * 7168 * 3 * 64 / 72 / op.nic_bw)
    # DeepEP before its NVLink low-latency path (PR #173): every pair over RDMA
    old = _op("H100", "deepseek-v3", tp=8, dp=8, dp_attention=True, ep=8, gather=8,
              a2a="deepep", ll_nvlink=False)
    assert old.all_to_all(128, True) > 5 * _op("H100", "deepseek-v3", tp=8, dp=8,
                                               dp_attention=True, ep=8, gather=8,
                                               a2a="deepep").all_to_all(128, True)
    # a TP all-reduce over 16 GPUs: NVLink in an NVL72 rack, the NIC across two HGX nodes
    assert _op("GB200", "llama-3.1-70b", tp=16).ar_bw == _op("GB200", "llama-3.1-70b",
                                                             tp=16).nvl_bw
    h = _op("H100", "llama-3.1-70b", tp=16)
    assert h.ar_bw == min(h.nvl_bw, h.nic_bw)


# --- formats -----------------------------------------------------------------------------------


def test_gemm_peak_follows_the_formats_the_gpu_supports():
    b200, h100 = profiles.gpu("B200"), profiles.gpu("H100")
    assert formats.peak_tflops(b200, "nvfp4") == 9000  # W4A4 on FP4 tensor cores
    assert formats.peak_tflops(h100, "nvfp4") == 989  # no FP4 cores: dequantized, BF16
    assert formats.peak_tflops(b200, "mxfp4") == 4500  # MXFP8 activations x MXFP4: FP8 rate
    assert formats.peak_tflops(h100, "mxfp4") == 989  # Hopper triton_kernel: BF16
    assert formats.peak_tflops(h100, "fp8_block") == formats.peak_tflops(h100, "fp8") == 1979
    assert formats.peak_tflops(h100, "int4") == 989  # W4A16
    # gpt-oss: MXFP4 experts, BF16 attention: two peaks and two byte widths
    for gpu, expert_peak in (("H100", 989), ("B200", 4500)):
        op = _op(gpu, "gpt-oss-120b", tp=1)
        g = profiles.gpu(gpu)
        assert op.pk_w == g.bf16_tflops * 1e12 * g.gemm_eff
        assert op.pk_e == expert_peak * 1e12 * g.gemm_eff
        assert op.wb == 2.0 and op.ewb == 0.5 + 1 / 32
    m = profiles.model("gpt-oss-120b")
    assert m.weight_bytes_total == pytest.approx(
        (m.params_total - m.embedding_params - 36 * 128 * m.expert_params) * 2
        + 36 * 128 * m.expert_params * (0.5 + 1 / 32) + m.embedding_params * 2)
    # a 4-bit NVFP4 model on Blackwell computes at the FP4 rate and reads half an FP8 weight
    nv = profiles.model("llama-3.1-70b").model_copy(update={"weight_dtype": "nvfp4"})
    op = OperatorPredictor(b200, nv, ENGINE, Layout(tp=1))
    fp8 = OperatorPredictor(b200, profiles.model("llama-3.1-70b-fp8"), ENGINE, Layout(tp=1))
    assert op.pk_w == 2 * fp8.pk_w and op.wb == pytest.approx(0.5625 * fp8.wb)
    assert op.prefill(8192, 8192**2) < fp8.prefill(8192, 8192**2)


def test_fp8_kv_halves_kv_and_transfer_bytes():
    for name in ("llama-3.1-8b", "qwen3-235b-a22b", "deepseek-v3"):
        bf = profiles.model(name)
        f8 = bf.model_copy(update={"kv_dtype": "fp8"})
        assert f8.kv_bytes_per_token * 2 == bf.kv_bytes_per_token
        assert f8.kv_bytes_per_token_sent(8, False) * 2 == bf.kv_bytes_per_token_sent(8, False)
    # DSA keeps the latent in FP8 with scales and the RoPE part in BF16 (SGLang NSA pool)
    glm = profiles.model("glm-5")
    assert glm.kv_bytes_per_token == 100_152
    assert glm.model_copy(update={"kv_dtype": "fp8"}).kv_bytes_per_token == 61_464


# --- EP sharding (issue 29 defect) ------------------------------------------------------------


def test_ep_without_deepep_keeps_dense_shared_experts_and_lm_head_tp_sharded():
    """Issue 29: with ep > 1 and no DP attention pdsim ran the dense MLP, shared experts and
    LM head unsharded on every GPU (B200 8k prefill: 265 ms at {tp: 8, ep: 8} against 183 ms
    at {tp: 8}). SGLang (no --moe-a2a-backend) keeps them TP-sharded, every GPU holds every
    token, runs its own experts over them and the TP all-reduce sums the outputs."""
    tp = _op("B200", "deepseek-v3", tp=8)
    ep = _op("B200", "deepseek-v3", tp=8, ep=8)
    assert (ep.dense_w, ep.shared_w, ep.lm_w) == (tp.dense_w, tp.shared_w, tp.lm_w)
    assert ep.local_experts == 32 and ep.expert_w == 8 * tp.expert_w
    assert ep.a2a_nic == ep.a2a_nvl == 0.0  # no all-to-all
    n = 8192
    t_tp = tp.prefill(n, n * n, n * (n + 1) / 2, 1, 0, n)
    t_ep = ep.prefill(n, n * n, n * (n + 1) / 2, 1, 0, n)
    assert t_ep == pytest.approx(t_tp, rel=0.02)
    assert ep.weights_per_gpu() == pytest.approx(tp.weights_per_gpu(), rel=1e-9)
    # DeepEP: shared experts whole on every GPU, computing its own share of tokens
    dpe = _op("B200", "deepseek-v3", tp=8, ep=8, a2a="deepep")
    assert dpe.shared_w == 8 * tp.shared_w and dpe.dense_w == tp.dense_w
    assert dpe.a2a_nvl > 0


def test_tp_may_be_a_multiple_of_ep():
    """SGLang: tp_size % ep_size == 0, moe_tp_size = tp // ep (pdsim asked ep in {1, tp})."""
    cfg = DecodeConfig(tp=64, ep=8)
    assert cfg.ep == 8
    op = _op("H200", "qwen3.5-397b-a17b-fp8", tp=64, ep=8)
    m = profiles.model("qwen3.5-397b-a17b-fp8")
    assert op.expert_w == m.expert_params / 8 and op.local_experts == 512 / 8
    with pytest.raises(ValueError, match="tp \\(8\\) must be a multiple of ep \\(3\\)"):
        DecodeConfig(tp=8, ep=3)
    with pytest.raises(ValueError, match="deepep runs with ep = tp"):
        DecodeConfig(tp=8, ep=4, moe_a2a_backend="deepep")
    with pytest.raises(ValueError, match="enable_dp_lm_head needs dp_attention"):
        DecodeConfig(tp=8, enable_dp_lm_head=True)


# --- calibrations by die ----------------------------------------------------------------------


def test_a_calibration_attaches_to_its_die():
    """Issue 29: calibrations were keyed by GPU name, so the same die (H100 -> H200 -> H800)
    fell back to the defaults. The (H100, deepseek-v3) fit now applies to every GH100 part
    through its own peaks; an exact one wins; the GPU's defaults stay where none exists."""
    h100 = profiles.resolve("H100", "deepseek-v3")
    for name in ("H200", "H800", "H20"):
        res = profiles.resolve(name, "deepseek-v3")
        assert res.calibrated and res.gpu.gemm_eff == h100.gpu.gemm_eff != \
            profiles.gpu("H100").gemm_eff, name
        assert res.engine.tbo_overlap == h100.engine.tbo_overlap
        assert f"fitted on H100; applies to {name} through their die GH100" in res.calibration
        assert res.gpu.bf16_tflops == profiles.gpu(name).bf16_tflops  # its own peaks
    assert "fitted on this GPU" in h100.calibration
    assert not profiles.resolve("B200", "deepseek-v3").calibrated  # another die
    assert not profiles.resolve("H200", "llama-3.1-8b").calibrated
    exact = profiles.resolve("H20", "dsv3-ci-test")
    assert "fitted on this GPU" in exact.calibration


def test_a_die_calibration_beats_a_siblings_and_a_gpus_own_beats_both(tmp_path):
    f = tmp_path / "cal.yaml"
    f.write_text("calibrations:\n"
                 "  - {die: GH100, model: deepseek-v3, set: {gpu.gemm_eff: 0.5}}\n"
                 "  - {gpu: H800, model: deepseek-v3, set: {gpu.gemm_eff: 0.6}}\n")
    files = (str(f),)
    assert profiles.resolve("H200", "deepseek-v3", files=files).gpu.gemm_eff == 0.5
    assert profiles.resolve("H800", "deepseek-v3", files=files).gpu.gemm_eff == 0.6
    assert profiles.resolve("H100", "deepseek-v3", files=files).gpu.gemm_eff == \
        profiles.resolve("H100", "deepseek-v3").gpu.gemm_eff  # its own (shipped) fit
    bad = tmp_path / "bad.yaml"
    bad.write_text("calibrations:\n  - {gpu: H100, die: GH100, model: m, set: {}}\n")
    with pytest.raises(profiles.ProfileError, match="one of gpu .* or die"):
        profiles.resolve("H100", "deepseek-v3", files=(str(bad),))


PEAKS = ("bf16_tflops", "fp8_tflops", "hbm_tbps", "nvlink_gbps", "nic_gbps")


def _weaker(a: profiles.GPU, b: profiles.GPU) -> bool:
    """``a`` has no peak above ``b``'s and the same node shape."""
    return (a.arch == b.arch and a.name != b.name and a.gpus_per_nic >= b.gpus_per_nic
            and a.domain <= b.domain
            and all(getattr(a, k) <= getattr(b, k) for k in PEAKS)
            and (a.fp4_tflops or 0) <= (b.fp4_tflops or 0))


@pytest.mark.parametrize("model", ["deepseek-v3", "llama-3.1-8b", "qwen3-235b-a22b",
                                   "dsv3-ci-test", "qwen3.5-397b-a17b-fp8", "glm-5-fp8"])
def test_a_weaker_part_is_never_predicted_faster_than_a_stronger_one_of_its_die(model):
    """Issue 29: with calibrations keyed by name, an H800 (H100 compute, less NVLink) took
    the defaults while the H100 took its DeepSeek fit, and came out faster. Every pair of
    one die where one part has no peak above the other's: the weaker is never faster."""
    gpus = [profiles.gpu(n) for n in profiles.gpu_names()]
    pairs = [(a, b) for a, b in itertools.permutations(gpus, 2) if _weaker(a, b)]
    names = {(a.name, b.name) for a, b in pairs}
    assert {("H800", "H100"), ("H100", "H200"), ("H20", "H20-3e"), ("B200", "GB200"),
            ("B300", "GB300"), ("H20-3e", "H200")} <= names
    layouts = [dict(tp=8), dict(tp=8, dp=8, dp_attention=True, gather=8),
               dict(tp=16, dp=16, dp_attention=True, ep=16, gather=16, a2a="deepep")]
    for a, b in pairs:
        for lay in layouts:
            wa, wb = _op(a.name, model, **lay), _op(b.name, model, **lay)
            for n in (128, 4096):
                ta = wa.prefill(n, n * n, n * (n + 1) / 2, 1, 0, n)
                tb = wb.prefill(n, n * n, n * (n + 1) / 2, 1, 0, n)
                assert ta >= tb * (1 - 1e-12), (a.name, b.name, lay, n)
            for batch in (1, 64):
                assert wa.decode(batch, batch * 2048) >= wb.decode(batch, batch * 2048) * (
                    1 - 1e-12), (a.name, b.name, lay, batch)


def test_cli_profiles_scenario_says_which_calibration_a_run_uses(capsys, tmp_path):
    """Per role: a calibration holds for the layout it was fitted on (the DeepEP fit for the
    DeepEP decode, not for the TP prefill; the corpus's TP fit of a model family for TP)."""
    sc = tmp_path / "s.yaml"
    sc.write_text("fleet: {gpu: H200, model: deepseek-v3, prefill: {tp: 8}, decode: {tp: 16, "
                  "dp: 16, dp_attention: true, ep: 16, moe_a2a_backend: deepep, "
                  "mem_fraction_static: 0.8, cuda_graph_max_bs: 64}}\n"
                  "clients: [{kind: bench, num_prompts: 2}]\n")
    assert main(["profiles", "--scenario", str(sc)]) == 0
    out = capsys.readouterr().out
    assert "(SGLang 0.5.9)" in out
    assert ("calibration (decode): H100 / deepseek-v3 / sglang (fitted on H100; applies to H200 "
            "through their die GH100") in out
    # (the TP prefill: the DeepEP fit does not hold there; the corpus's TP fit of the family,
    # written for the H200's die, does)
    assert ("calibration (prefill): die GH100 / family deepseek-mla-moe / sglang (written for "
            "the die of H200) for layouts with dp_attention False") in out
    assert "Large-scale EP deployment (LMSYS, S2)" in out  # the fit, by its source
    assert "calibrations.yaml calibration H100/deepseek-v3/sglang" in out  # per value
    # (a set fitted on H200 rows holds for the H100, the same die)
    sc.write_text("fleet: {gpu: H100, model: qwen3.5-397b-a17b-fp8, prefill: {tp: 8}, "
                  "decode: {tp: 8}}\nclients: [{kind: bench, num_prompts: 2}]\n")
    assert main(["profiles", "--scenario", str(sc)]) == 0
    assert ("calibration (prefill): die GH100 / family qwen3.5 / sglang (written for the die "
            "of H100) for layouts with dp_attention False, moe_a2a_backend none"
            ) in capsys.readouterr().out
    sc.write_text("fleet: {gpu: B200, model: llama-3.1-8b}\nclients: [{kind: bench}]\n")
    assert main(["profiles", "--scenario", str(sc)]) == 0
    assert "calibration (prefill): none" in capsys.readouterr().out  # (no Blackwell fit)


def test_a_scenario_on_blackwell_runs():
    res = pdsim.run({"name": "nvl72", "seed": 1, "horizon_s": 300,
                     "fleet": {"gpu": "GB200", "model": "deepseek-r1",
                               "prefill": {"tp": 8}, "decode": {"tp": 8}},
                     "clients": [{"kind": "bench", "num_prompts": 8, "max_concurrency": 4,
                                  "dataset": {"kind": "random", "input_len": 1024,
                                              "output_len": 32}}]})
    assert res.summary["completed_requests"] == 8
    assert res.summary["chunked_prefill_size_per_rank"] == 16384  # >= 160 GiB: 16k


def test_a_profile_still_giving_hbm_gb_is_told_what_replaced_it(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("gpus:\n  MyGPU:\n    extends: H100\n    hbm_gb: 80\n")
    with pytest.raises(profiles.ProfileError) as err:
        profiles.resolve("MyGPU", "llama-3.1-8b", files=(str(f),))
    msg = str(err.value)
    assert "unknown key 'gpus.MyGPU.hbm_gb': hbm_gb is now hbm_mib" in msg and "81559" in msg
    assert "\n" not in msg


def test_cli_profiles_scenario_lists_the_values_each_role_runs_with(capsys):
    """The listed values are each role's own (profiles.for_role, what the fleet builds), not
    a layout-blind resolution: trace_replay's TP prefill takes the corpus's deepseek-mla-moe
    set, its DP-attention decode (no DeepEP) no calibration, so neither lists the DeepEP
    decode's H100 fit (calibrations.yaml), which a layout-blind listing showed."""
    from pdsim.config import loader
    from pdsim.model import profiles

    assert main(["profiles", "--scenario", "scenarios/trace_replay.yaml"]) == 0
    out = capsys.readouterr().out
    pre, dec = out.split("values (prefill):\n")[1].split("values (decode): as (prefill) but\n")
    sc = loader.load("scenarios/trace_replay.yaml")
    want = {role: profiles.for_role(sc, cfg).gpu.gemm_eff for role, cfg in sc.fleet.roles()}
    assert want["prefill"] != want["decode"]
    assert re.search(rf"gpu\.gemm_eff\s+{want['prefill']}\s", pre)
    assert re.search(rf"gpu\.gemm_eff\s+{want['decode']}\s", dec)
    h100_fit = profiles.resolve("H100", "deepseek-v3").gpu.gemm_eff  # the DeepEP layout's
    assert not re.search(rf"gpu\.gemm_eff\s+{h100_fit}\s", out)

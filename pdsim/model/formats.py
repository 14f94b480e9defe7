"""Weight formats: the bytes a weight takes (:data:`pdsim.config.profile_schema.DTYPE_BYTES`)
and the tensor-core rate a GEMM on it runs at, which depends on what the GPU supports.

A GEMM runs at the rate of the narrowest operand format both the weights and the activations
reach on the GPU:

- ``bf16``: BF16 x BF16.
- ``fp8`` / ``fp8_block``: W8A8 (activations quantized per token, or per token per 128
  channels for block-scaled checkpoints: DeepSeek-V3 README_WEIGHTS.md); the FP8 rate
  (:attr:`GPU.fp8_tflops` is the BF16 rate on parts without FP8 tensor cores).
- ``int4``: W4A16 (GPTQ/AWQ): dequantized to BF16 in the kernel; the BF16 rate.
- ``nvfp4``: W4A4 with FP4 activations on FP4 tensor cores (Blackwell: SGLang's modelopt_fp4
  runs on SM100 only, ``cutlass_scaled_fp4_mm``); on a part without them the weights are
  dequantized (W4A16, the BF16 rate) [assume: SGLang itself refuses NVFP4 there].
- ``mxfp4`` (gpt-oss experts): on Blackwell SGLang's ``flashinfer_mxfp4`` MoE quantizes the
  activations to MXFP8 unless ``SGLANG_USE_FLASHINFER_MXFP4_BF16_MOE=1`` (SGLang discussions
  benchmarking that switch), and a mixed MXFP8 x MXFP4 MMA runs at the FP8 rate; on Hopper
  the ``triton_kernel`` MoE dequantizes to BF16 (issue 29 fact sheet B4): the BF16 rate.

The bytes read stay the format's own (FP4 weights read half an FP8 weight) either way.
"""

from __future__ import annotations

from pdsim.config.profile_schema import DTYPE_BYTES, GPU

FP8_COMPUTE = ("fp8", "fp8_block")


def weight_bytes(fmt: str) -> float:
    return DTYPE_BYTES[fmt]


def compute_format(gpu: GPU, fmt: str) -> str:
    """The operand format a GEMM on ``fmt`` weights computes in on ``gpu``: bf16, fp8 or
    fp4."""
    if fmt in FP8_COMPUTE:
        return "fp8"
    if fmt == "nvfp4":
        return "fp4" if gpu.fp4_tflops else "bf16"
    if fmt == "mxfp4":
        return "fp8" if gpu.fp4_tflops else "bf16"
    return "bf16"


def peak_tflops(gpu: GPU, fmt: str) -> float:
    """Dense tensor-core TFLOP/s of a GEMM on ``fmt`` weights on ``gpu``."""
    comp = compute_format(gpu, fmt)
    if comp == "fp4":
        return gpu.fp4_tflops or gpu.bf16_tflops
    return gpu.fp8_tflops if comp == "fp8" else gpu.bf16_tflops


def expert_rate(gpu: GPU, fmt: str, deepep: bool) -> tuple[float, float]:
    """The routed experts' GEMMs on ``fmt`` weights: (peak TFLOP/s, the fraction of it they
    reach): the format's peak and :attr:`GPU.gemm_eff`, except block-scaled FP8 experts
    outside DeepEP on a GPU with a measured :attr:`GPU.moe_fp8_block_eff`.

    Why: SGLang v0.5.6.post2 and v0.5.9 run routed experts under TP, or EP without DeepEP, in
    the Triton fused-MoE kernel (``fused_moe_kernel`` with ``use_fp8_w8a8`` and a
    ``block_shape``), which applies the per-128 activation and weight scales inside its K
    loop; the dense block-FP8 linears (and DeepEP's experts) run in DeepGEMM. No published
    figure gives the fused-MoE kernel itself at prefill sizes on Hopper, so pdsim takes the
    Triton block-FP8 GEMM of the same scaling scheme as a proxy: 305 TFLOP/s at 4,096 tokens on
    an H100 (0.154 of the FP8 peak; 0.11-0.18 over 512-16,384 tokens), where DeepGEMM reaches
    650-970 on the same shapes (gpus.yaml [tfp8]). Not modelled: per-tensor FP8 and BF16
    experts also run in ``fused_moe_kernel`` but keep ``gemm_eff`` (no measurement of their
    rate here). Where SGLang fuses DeepSeek-V3/R1's or GLM-5's shared expert into that kernel
    (:func:`fused_shared_experts`), the shared expert runs at this rate too.
    """
    if triton_block_fp8_moe(gpu, fmt, deepep):
        return gpu.fp8_tflops, gpu.moe_fp8_block_eff
    return peak_tflops(gpu, fmt), gpu.gemm_eff


def triton_block_fp8_moe(gpu: GPU, fmt: str, deepep: bool) -> bool:
    """Whether routed experts on ``fmt`` weights run at the Triton fused-MoE kernel's measured
    rate on ``gpu`` (:func:`expert_rate`)."""
    return fmt == "fp8_block" and not deepep and gpu.moe_fp8_block_eff is not None


# Architectures whose SGLang model class fuses the shared expert into the routed MoE, and the
# release that read it: DeepseekV2ForCausalLM.determine_num_fused_shared_experts checks
# ``config.architectures[0]`` against the name its class passes (models/deepseek_v2.py
# @0.5.6.post2 l.3272, @0.5.9 l.2853; the same rule in 0.5.1.post1 and 0.5.8.post1):
# DeepseekV3ForCausalLM (the default), and GlmMoeDsaForCausalLM from PR #18804 (2026-02-17,
# models/glm4_moe.py@0.5.9 l.1283; before it GLM-5's class passed no name and did not fuse).
# DeepseekV2ForCausalLM and DeepseekV32ForCausalLM keep the default name and do not fuse;
# Qwen2/3/3.5-MoE's shared expert is a separate Qwen2MoeMLP (models/qwen2_moe.py@0.5.9
# l.189-214; fused on ROCm/aiter only, PR #20736).
FUSING_ARCHITECTURES = ("DeepseekV3ForCausalLM", "GlmMoeDsaForCausalLM")


def fused_shared_experts(gpu: GPU, model, ep: int, deepep: bool) -> int:
    """How many shared experts SGLang runs as extra experts of the routed MoE kernel (0 or 1),
    where pdsim prices that kernel at its own rate (:func:`triton_block_fp8_moe`).

    Why: ``determine_num_fused_shared_experts`` (models/deepseek_v2.py@0.5.9 l.2853,
    @0.5.6.post2 l.3272) sets ``num_fused_shared_experts = n_shared_experts`` for a model of
    :data:`FUSING_ARCHITECTURES` with ``n_routed_experts == 256`` and ``n_shared_experts ==
    1`` on CUDA sm >= 80, unless ``--disable-shared-experts-fusion``, expert parallelism
    (``moe_ep_size > 1`` on NVIDIA), DeepEP (or 0.5.9's mori) all-to-all, a W4AFP8
    checkpoint (routed and shared experts in other formats: pdsim fuses only when the
    other weights are FP8 too, one ``Fp8Config``), or the flashinfer_trtllm MoE
    runner (server_args.py@0.5.9 l.2155; Blackwell's default for FP8 DeepSeek, not
    Hopper's). The shared expert is then expert 257 of ``FusedMoE`` with ``top_k = 8 + 1``
    (deepseek_v2.py@0.5.9 l.414-443): every token's row goes through the same Triton
    ``fused_moe_kernel`` as its 8 routed experts, its width split over TP like theirs.

    Only the Triton block-FP8 path is modelled (:func:`triton_block_fp8_moe`: Hopper with a
    measured rate). On the other GPUs SGLang fuses as well (A100, H20; BF16 or per-tensor FP8),
    but pdsim gives experts and dense GEMMs the same rate there, and keeps the shared expert a
    separate GEMM (pricing it as an expert would move only the max of compute and memory).
    ``--disable-shared-experts-fusion`` is not a pdsim setting.
    """
    if (model.architecture not in FUSING_ARCHITECTURES or model.experts != 256
            or model.shared_experts != 1 or model.shared_params != model.expert_params
            or model.weight_dtype not in FP8_COMPUTE or ep > 1 or deepep):
        return 0
    return 1 if triton_block_fp8_moe(gpu, model.expert_format, deepep) else 0

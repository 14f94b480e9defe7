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
    rate here), and SGLang fuses DeepSeek's shared expert into that kernel at EP 1, which pdsim
    still prices as a dense GEMM.
    """
    if triton_block_fp8_moe(gpu, fmt, deepep):
        return gpu.fp8_tflops, gpu.moe_fp8_block_eff
    return peak_tflops(gpu, fmt), gpu.gemm_eff


def triton_block_fp8_moe(gpu: GPU, fmt: str, deepep: bool) -> bool:
    """Whether routed experts on ``fmt`` weights run at the Triton fused-MoE kernel's measured
    rate on ``gpu`` (:func:`expert_rate`)."""
    return fmt == "fp8_block" and not deepep and gpu.moe_fp8_block_eff is not None

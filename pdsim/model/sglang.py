"""SGLang's server defaults that depend on the GPU, the layout and the release: the chunked
prefill budget, the CUDA-graph cap and ``mem_fraction_static``, as each release derives them
when the flag is not given.

``gpu_mem`` is the device memory in MiB as ``nvidia-smi --query-gpu=memory.total`` reports it
(SGLang's ``get_nvgpu_memory_capacity``; pdsim's :attr:`GPU.hbm_mib`). Which release's rules apply
is the scenario's ``engine.version`` (:mod:`pdsim.config.engine_version`, rule
``memory_defaults_0_5_3``); each rule below names where it was read (``server_args.py@0.5.9``
= ``python/sglang/srt/server_args.py`` of the 0.5.9 wheel).
"""

from __future__ import annotations

from pdsim.config.engine_version import DEFAULT_VERSION, has

__all__ = ["DEFAULT_VERSION", "chunked_prefill_size", "cuda_graph_max_bs", "mem_fraction_static",
           "reserved_mib", "vlm_factor"]
from pdsim.config.profile_schema import GPU, Model

GIB = 1024  # MiB

# --chunked-prefill-size default by gpu_mem (MiB upper bounds, size), before any DP division.
# 0.5.1.post1 ServerArgs.__post_init__: < 35 GiB 2048, < 160 GiB 8192, else 16384.
# >= 0.5.3 _handle_gpu_memory_settings (server_args.py@0.5.9): < 20 GiB 2048, < 35 GiB 2048,
# < 60 GiB 4096, < 90 GiB 8192, < 160 GiB 8192, else 16384.
CHUNK_TIERS = {
    "0.5.1": ((35 * GIB, 2048), (160 * GIB, 8192)),
    "0.5.3": ((20 * GIB, 2048), (35 * GIB, 2048), (60 * GIB, 4096), (90 * GIB, 8192),
              (160 * GIB, 8192)),
}
CHUNK_LARGE = 16384  # B200 and larger (>= 160 GiB)


def _rule(version: str) -> str:
    """The family of memory defaults ``version`` follows: "0.5.3" (PR #10975) or "0.5.1"."""
    return "0.5.3" if has(version, "memory_defaults_0_5_3") else "0.5.1"


def chunked_prefill_size(gpu: GPU, version: str = DEFAULT_VERSION) -> int:
    """SGLang's default ``--chunked-prefill-size`` for ``gpu`` (the whole server's budget;
    DP attention divides it by dp afterwards)."""
    for limit, size in CHUNK_TIERS[_rule(version)]:
        if gpu.hbm_mib < limit:
            return size
    return CHUNK_LARGE


def cuda_graph_max_bs(gpu: GPU, tp: int, version: str = DEFAULT_VERSION) -> int:
    """The largest decode batch SGLang captures a CUDA graph for (``--cuda-graph-max-bs``
    unset); larger decode batches run eagerly.

    0.5.1.post1 (cuda_graph_runner.py get_batch_sizes_to_capture; server_args.py): below 35 GiB
    8 (tp < 4) or 80; else 160, 256 above 90 GiB, 512 above 160,000 MiB. >= 0.5.3
    (_handle_gpu_memory_settings@0.5.9): below 20 GiB 8; below 35 GiB 24 (tp < 4) or 80; below
    60 GiB 32 or 160; below 160 GiB 256 (tp < 4) or 512; else 512.
    """
    mem = gpu.hbm_mib
    if _rule(version) == "0.5.1":
        if mem < 35 * GIB:
            return 8 if tp < 4 else 80
        if mem > 160_000:
            return 512
        return 256 if mem > 90 * GIB else 160
    if mem < 20 * GIB:
        return 8
    if mem < 35 * GIB:
        return 24 if tp < 4 else 80
    if mem < 60 * GIB:
        return 32 if tp < 4 else 160
    if mem < 160 * GIB:
        return 256 if tp < 4 else 512
    return 512


def reserved_mib(gpu: GPU, tp: int, dp: int, dp_attention: bool, chunk: int, graph_bs: int,
                 version: str = DEFAULT_VERSION) -> float:
    """Memory (MiB) SGLang keeps out of ``mem_fraction_static`` for activations and CUDA
    graphs (no speculative decoding, no pipeline parallelism, piecewise CUDA graphs off).

    0.5.1.post1 (ServerArgs.__post_init__): a table by gpu_mem of ``(a + tp/b) GiB`` (below 35
    GiB 2.8 + tp/10; below 90 GiB 9.5 + tp/2; below 160 GiB 12 + tp/2; else 32 GiB), + 4 GiB
    with DP attention. >= 0.5.3 (PR #10975; _handle_gpu_memory_settings@0.5.9): ``512 + 1.5 x
    max(chunk, 2048) + 2 x graph_bs + tp/8 GiB``, with DP attention ``+ 3 x graph_bs x dp``
    (and ``+ 1.5 x graph_bs x dp`` when graph_bs > 300), at least 10 GiB above 60 GiB.
    ``chunk`` is the undivided server budget (the heuristic runs before the DP division).
    """
    mem = gpu.hbm_mib
    if _rule(version) == "0.5.1":
        if mem < 35 * GIB:
            res = (2.8 + tp / 10) * GIB
        elif mem < 90 * GIB:
            res = (9.5 + tp / 2) * GIB
        elif mem < 160 * GIB:
            res = (12 + tp / 2) * GIB
        else:
            res = 32 * GIB
        return res + (4 * GIB if dp_attention else 0)
    res = 512 + max(chunk, 2048) * 1.5 + graph_bs * 2 + tp / 8 * GIB
    if dp_attention:
        res += graph_bs * dp * 3
        if graph_bs > 300:
            res += graph_bs * dp * 1.5
    if mem > 60 * GIB:
        res = max(res, 10 * GIB)
    return res


def vlm_factor(model: Model) -> float:
    """SGLang's ``adjust_mem_fraction_for_vlm`` (server_args.py@0.5.9 l.5483): a VLM's default
    fraction times ``0.95 x clamp(1 - 0.1 x (ratio - 1), 0.8, 1.05)``, ``ratio`` the vision
    tower's layers x width^2 over ViT-L/14's (24 x 1024^2); 1 for a text-only model."""
    if not model.vision_layers:
        return 1.0
    ratio = model.vision_layers * (model.vision_hidden_size or 1024) ** 2 / (24 * 1024 ** 2)
    return 0.95 * max(0.8, min(1.05, 1.0 - 0.1 * (ratio - 1.0)))


def mem_fraction_static(gpu: GPU, model: Model, tp: int, dp: int, dp_attention: bool,
                        chunk: int, graph_bs: int, version: str = DEFAULT_VERSION
                        ) -> float:
    """SGLang's default ``--mem-fraction-static``: ``round((gpu_mem - reserved) / gpu_mem,
    3)`` (:func:`reserved_mib`), lowered for a VLM (:func:`vlm_factor`)."""
    res = reserved_mib(gpu, tp, dp, dp_attention, chunk, graph_bs, version)
    mfs = round((gpu.hbm_mib - res) / gpu.hbm_mib, 3)
    factor = vlm_factor(model)
    return mfs * factor if factor != 1.0 else mfs


REQ_SLOTS_MIN, REQ_SLOTS_MAX = 2048, 4096  # model_runner_kv_cache_mixin.py init_memory_pool


def default_max_running(pool_tokens: int, context_len: int | None) -> int:
    """SGLang's running-request cap of a DP rank when ``--max-running-requests`` is not given:
    ``min(max_total_num_tokens // 2, req_to_token_pool.size)``, the pool's request slots
    ``min(max(int(max_total_num_tokens / context_len * 512), 2048), 4096)``
    (tp_worker.py@0.5.1.post1 l.128, model_runner.py@0.5.9 l.593 and
    model_runner_kv_cache_mixin.py ``init_memory_pool``; the same rule in 0.5.23,
    mem_cache/kv_cache_configurator.py ``resolve_max_num_reqs``), so one rule for every
    ``engine.version``. ``context_len`` None (a profile that does not give it): the slots'
    floor, 2,048. (0.5.1.post1-0.5.9 size the slots from the pool profiled before
    ``--max-total-tokens`` caps it, 0.5.23 from the capped pool (PR #20142); pdsim has one
    pool, the one it runs: ``kv_pool_tokens`` when given.)"""
    if context_len:
        slots = min(max(int(pool_tokens / context_len * 512), REQ_SLOTS_MIN), REQ_SLOTS_MAX)
    else:
        slots = REQ_SLOTS_MIN
    return max(1, min(pool_tokens // 2, slots))

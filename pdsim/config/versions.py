"""SGLang versions pdsim knows, and what each does differently: the table behind the engine
profile's ``version`` (a scenario picks one with ``engine: {version: "0.5.9"}``).

A version is a first-class, validated choice: a name outside :data:`VERSIONS` is refused in one
line listing the known ones. Each entry says which of SGLang's rules that release runs where they
changed between releases; code that depends on the version reads the entry's fields (never the
name), so a new release is one more row here. Every rule names the file it was read from, in the
released wheel of that version (``python/sglang/srt/...``; issue 29's fact sheet, section A).

Adding a version: read its ``server_args.py`` (``_handle_gpu_memory_settings`` or its
successor), ``model_executor/cuda_graph_runner.py`` and ``managers/schedule_batch.py``; if a
rule matches an existing family, reuse its name, else add the family where it is used
(:mod:`pdsim.model.sglang` for the memory and CUDA-graph defaults) and a test.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SGLangVersion:
    """What one SGLang release does where releases differ."""

    name: str
    memory_rule: str  # "0.5.1" | "0.5.3": mem_fraction_static, chunked prefill and CUDA-graph
    #                   defaults from the GPU's memory (pdsim.model.sglang)
    swa_full_tokens_ratio: float  # --swa-full-tokens-ratio default (hybrid SWA pools)
    mamba_full_memory_ratio: float  # --mamba-full-memory-ratio default (hybrid linear attention)
    source: str  # where its rules were read
    note: str = ""


VERSIONS: dict[str, SGLangVersion] = {v.name: v for v in (
    SGLangVersion(
        "0.5.1.post1", memory_rule="0.5.1", swa_full_tokens_ratio=0.8,
        mamba_full_memory_ratio=0.9,
        source="sglang 0.5.1.post1 wheel: server_args.py ServerArgs.__post_init__ (reserved_mem "
               "table, chunked_prefill_size, cuda_graph_max_bs for < 35 GiB), "
               "cuda_graph_runner.py get_batch_sizes_to_capture (160, +256 above 90 GiB, +512 "
               "above 160,000 MiB)"),
    SGLangVersion(
        "0.5.6.post2", memory_rule="0.5.3", swa_full_tokens_ratio=0.8,
        mamba_full_memory_ratio=0.9,
        source="sglang 0.5.6.post2 wheel: server_args.py _handle_gpu_memory_settings (PR #10372, "
               "#10975: reserved_mem = 512 + 1.5 x chunk + 2 x cuda_graph_max_bs + tp/8 GiB, "
               "at least 10 GiB above 60 GiB)"),
    SGLangVersion(
        "0.5.8.post1", memory_rule="0.5.3", swa_full_tokens_ratio=0.8,
        mamba_full_memory_ratio=0.9,
        source="sglang 0.5.8.post1 wheel: server_args.py _handle_gpu_memory_settings (as "
               "0.5.6.post2 but for the piecewise CUDA-graph reserve, off by default)"),
    SGLangVersion(
        "0.5.9", memory_rule="0.5.3", swa_full_tokens_ratio=0.8, mamba_full_memory_ratio=0.9,
        source="sglang 0.5.9 wheel: server_args.py _handle_gpu_memory_settings, "
               "swa_full_tokens_ratio 0.8 (l.339), mamba_full_memory_ratio 0.9 (l.523); "
               "model_executor/model_runner_kv_cache_mixin.py (cell sizes, mamba pool, SWA "
               "split)"),
    SGLangVersion(
        "glm5-hopper", memory_rule="0.5.3", swa_full_tokens_ratio=0.8,
        mamba_full_memory_ratio=0.9,
        source="the image lmsysorg/sglang:glm5-hopper (InferenceX perf-changelog PR #914); its "
               "code base is not published: taken as 0.5.9's rules",
        note="assumed to behave as 0.5.9 (GLM-5 support first appears in the 0.5.9 release)"),
)}

DEFAULT_VERSION = "0.5.9"


def known() -> str:
    return ", ".join(VERSIONS)


def get(name: str) -> SGLangVersion:
    """The entry of ``name`` (a validated profile's version is always known)."""
    try:
        return VERSIONS[name]
    except KeyError:
        raise ValueError(f"unknown SGLang version {name!r}; known: {known()}") from None


def check(name: str) -> str:
    """A pydantic validator: ``name`` if known, else a one-line error listing the known ones."""
    if name not in VERSIONS:
        raise ValueError(f"unknown SGLang version {name!r}; known: {known()} (pdsim/config/"
                         f"versions.py lists what each does differently; add a release there)")
    return name

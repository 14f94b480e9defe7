"""Which SGLang release a run's scheduler follows: ``engine.version`` and the table of releases
pdsim knows, with the behaviours that changed between them.

One field (:data:`DEFAULT_VERSION` unless a scenario says ``engine: {version: ...}``), one table
of known releases (:data:`SGLANG_VERSIONS`) and one table of the behaviours keyed off it
(:data:`RULES`: the first release that has each, and where that was read). The engine asks
:func:`has` (``has(version, "retract_until_next_step_fits")``); nothing else compares versions.

The scheduler's behaviours were read from PyPI wheels (``sglang==0.5.1.post1``, ``0.5.6.post2``,
``0.5.8.post1``, ``0.5.9``, ``0.5.23``: ``python/sglang/srt/...`` of each release), the PD
timeout and abort paths' (:mod:`pdsim.config.pd_paths`) from every wheel 0.5.2-0.5.23
(docs/pd_paths.md, which also gives each release's approximate build date); a behaviour's
"first release" is the first of those wheels that has it unless a PR dates it (then the PR's
first release), so a release between two wheels gets the older wheel's behaviour unless noted.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pdsim.config.profile_schema import EngineOverrides

SGLANG_VERSIONS: dict[str, str] = {
    "0.5.1.post1": "retraction frees 20 decode steps of headroom per remaining request; "
                   "chunks truncated to rem_chunk - page + 1",
    "0.5.2": "first release with PR #9989: retraction stops once the next decode step fits",
    "0.5.3": "as 0.5.2",
    "0.5.4": "as 0.5.2",
    "0.5.5": "as 0.5.2",
    "0.5.6": "as 0.5.2 (the chunk rules are first read in 0.5.6.post2)",
    "0.5.6.post2": "page-aligned chunks; a continuing chunk capped by free memory",
    "0.5.7": "as 0.5.6.post2",
    "0.5.8": "as 0.5.6.post2",
    "0.5.8.post1": "as 0.5.6.post2 for pdsim's purposes",
    "0.5.9": "as 0.5.6.post2 for pdsim's purposes (pdsim's default)",
    "0.5.10": "scheduler as 0.5.9",
    "0.5.11": "scheduler as 0.5.9",
    "0.5.12": "scheduler as 0.5.9; a prefill abort marks its room Failed (pdsim always did)",
    "0.5.13": "scheduler as 0.5.9; PD: a decode abort or waiting timeout sends ABORT to the "
              "prefill (PR #27372), the metadata gate, the failed-session probe's variable "
              "(off)",
    "0.5.14": "scheduler as 0.5.9; PD: a prefill drops a room the decode's ABORT failed from its "
              "waiting queue (resolve_waiting_queue_bootstrap)",
    "0.5.15": "scheduler as 0.5.9; PD paths as 0.5.14",
    "0.5.16": "scheduler as 0.5.9; PD paths as 0.5.14",
    "0.5.17": "scheduler as 0.5.9; PD: a 1 s ZMQ send timeout (PR #31144)",
    "0.5.18": "scheduler as 0.5.9; PD paths as 0.5.17",
    "0.5.19": "scheduler as 0.5.9; PD: a waiting timeout or failed send drops the cached "
              "prefill connection (PR #36029); deferred KV release's variable (off)",
    "0.5.20": "scheduler as 0.5.9; PD: SGLANG_REQ_WAITING_TIMEOUT checked by PD schedulers",
    "0.5.21": "scheduler as 0.5.9; PD: deferred decode KV release on (PR #35049), ABORT_ACK "
              "after the write drains (PR #40645)",
    "0.5.22": "scheduler as 0.5.9; PD paths as 0.5.21",
    "0.5.23": "as 0.5.9 for pdsim's purposes (--retraction-policy defaults to the legacy "
              "length order; its memory defaults (arg_groups/memory_hook.py: a prefill "
              "CUDA-graph reserve, 2 GiB for DeepEP buffers) are not modelled: 0.5.9's apply); "
              "PD: the failed-session probe on by default (blacklist v0_5_23)",
    "glm5-hopper": "the image lmsysorg/sglang:glm5-hopper (InferenceX perf-changelog PR #914), "
                   "whose code base is not published: taken as 0.5.9 (GLM-5 support first "
                   "appears in the 0.5.9 release)",
}
"""The SGLang releases ``engine.version`` accepts, each with what sets it apart here."""

DEFAULT_VERSION = "0.5.9"

ALIASES = {"glm5-hopper": "0.5.9"}
"""Releases named by an image tag, and the numbered release whose rules they follow."""

RULES: dict[str, tuple[str, str]] = {
    # behaviour: (first release with it, where it was read)
    "retract_until_next_step_fits": (
        "0.5.2", "ScheduleBatch.retract_decode: 'while first_iter or not check_decode_mem()' "
        "(PR #9989, 2025-09-07; 0.5.1.post1 retracts until available >= "
        "SGLANG_RETRACT_DECODE_STEPS (20) x remaining requests)"),
    "retract_ratio_plus_one": (
        "0.5.6.post2", "ScheduleBatch.retract_decode: new_token_ratio = (decoded + 20 x n) / "
        "(total_max_new_tokens + 1) (0.5.1.post1: no + 1)"),
    "page_aligned_chunk": (
        "0.5.6.post2", "PrefillAdder.add_one_req: trunc_len = rem_chunk_tokens // page_size * "
        "page_size (0.5.1.post1: rem_chunk_tokens - page_size + 1)"),
    "memory_defaults_0_5_3": (
        "0.5.3", "server_args.py _handle_gpu_memory_settings (PR #10372, #10975, 2025-09): "
        "mem_fraction_static = 1 - (512 MiB + 1.5 x max(chunk, 2048) + 2 x cuda_graph_max_bs + "
        "tp/8 GiB [+ DP attention's graph padding]) / memory, at least 10 GiB reserved above 60 "
        "GiB; cuda_graph_max_bs 256 at tp < 4 else 512 on 60-160 GiB parts; chunked prefill "
        "4096 on 35-60 GiB parts (0.5.1.post1 __post_init__: a reserved-memory table by GPU "
        "memory, graphs up to 160/256/512 by memory, chunk 8192 from 35 GiB; "
        "pdsim.model.sglang)"),
    "prefill_drops_failed_waiting": (
        "0.5.14", "disaggregation/prefill.py resolve_waiting_queue_bootstrap: a prefill drops a "
        "request whose room failed (the decode's ABORT, PR #27372 from 0.5.13) from its waiting "
        "queue; 0.5.13 marks the room Failed but still prefills the request, its chunks skipped "
        "by the transfer worker and its KV freed once the in-flight poll sees Failed "
        "(docs/pd_paths.md, version map)"),
    "chunk_capped_by_memory": (
        "0.5.6.post2", "PrefillAdder.add_chunked_req: the continuing chunk takes at most "
        "min(rem_chunk_tokens, rem_total_tokens) (0.5.1.post1: rem_chunk_tokens)"),
}


def parse(version: str) -> tuple[int, ...]:
    """``"0.5.6.post2"`` -> ``(0, 5, 6, 2)``; a release without a post number sorts before
    its posts (``"0.5.2"`` -> ``(0, 5, 2, 0)``)."""
    main, _, post = ALIASES.get(version, version).partition(".post")
    parts = tuple(int(p) for p in main.split("."))
    return (*parts, int(post) if post else 0)


def has(version: str, rule: str) -> bool:
    """Whether SGLang ``version`` has the behaviour ``rule`` (a key of :data:`RULES`)."""
    return parse(version) >= parse(RULES[rule][0])


def at_least(version: str, floor: str) -> bool:
    """Whether ``version`` is release ``floor`` or a later one (the PD paths' defaults,
    pdsim.config.pd_paths, key off this; their facts: docs/pd_paths.md)."""
    return parse(version) >= parse(floor)



class EngineSection(EngineOverrides):  # type: ignore[valid-type, misc]
    """``engine:`` of a scenario: overrides of the engine profile's values, and ``version``."""

    version: Literal[tuple(SGLANG_VERSIONS)] = Field(  # type: ignore[valid-type]
        DEFAULT_VERSION, description="SGLang release whose scheduler the run follows "
        "(retraction stop rule, chunk truncation; pdsim.config.engine_version lists what each "
        f"changes); one of {', '.join(SGLANG_VERSIONS)}; default {DEFAULT_VERSION}")

"""Hardware and model profiles shipped as data files (``pdsim/profiles/*.yaml``).

Each value in the files carries its source; this module strips the sources for use and keeps
them available for ``pdsim profiles`` and the docs.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import yaml


def _load(name: str) -> dict[str, dict[str, Any]]:
    text = resources.files("pdsim").joinpath("profiles", name).read_text()
    return yaml.safe_load(text)


def _values(entry: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, item in entry.items():
        if isinstance(item, dict) and "value" in item:
            out[key] = item["value"]
        elif isinstance(item, dict):
            out[key] = {k: _values(v) if isinstance(v, dict) else v for k, v in item.items()}
        else:
            out[key] = item
    return out


@cache
def raw_gpus() -> dict[str, dict[str, Any]]:
    return _load("gpus.yaml")


@cache
def raw_models() -> dict[str, dict[str, Any]]:
    return _load("models.yaml")


def gpu_names() -> list[str]:
    return sorted(raw_gpus())


def model_names() -> list[str]:
    return sorted(raw_models())


@dataclass(frozen=True)
class GPU:
    name: str
    bf16_tflops: float
    fp8_tflops: float
    hbm_gb: float
    hbm_tbps: float
    nic_gbps: float
    gpus_per_nic: int


@dataclass(frozen=True)
class Model:
    name: str
    attention: str
    layers: int
    hidden_size: int
    params_total_b: float
    params_active_b: float
    weight_bytes: float
    kv_dtype_bytes: float
    kv_heads: int = 0
    head_dim: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    fitted: dict | None = None

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes one token occupies on one GPU holding all KV heads (no TP split)."""
        if self.attention == "mla":
            per_layer = self.kv_lora_rank + self.qk_rope_head_dim
        else:
            per_layer = 2 * self.kv_heads * self.head_dim
        return int(self.layers * per_layer * self.kv_dtype_bytes)

    def kv_bytes_per_token_sent(self, tp: int, dp_attention: bool) -> int:
        """Bytes a prefill rank sends per token.

        MLA has one latent head, and DP attention keeps a request on one GPU: no replication.
        GQA under TP splits KV heads over ranks; when tp > kv_heads the heads are replicated and
        every replica is sent (reference section 6): factor ``max(1, tp / kv_heads)``.
        """
        base = self.kv_bytes_per_token
        if self.attention == "mla" or dp_attention:
            return base
        return int(base * max(1.0, tp / self.kv_heads))


def gpu(name: str) -> GPU:
    return GPU(name=name, **_values(raw_gpus()[name]))


def model(name: str) -> Model:
    return Model(name=name, **_values(raw_models()[name]))

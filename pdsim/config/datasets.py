"""Request datasets shipped with pdsim, selectable by name (``dataset: {kind: sharegpt, name:
azure_conv}`` samples one's length pairs; ``dataset: {kind: trace, name: azure_conv}`` replays
it at its own timestamps).

The files are in ``pdsim/config/data/`` (package data, so a scenario anywhere can name them),
in the Mooncake trace format :mod:`pdsim.config.trace` reads (one JSON object a line:
``timestamp`` ms, ``input_length``, ``output_length``), gzip-compressed; their README says
where each came from, under which licence, and how it was derived.

Why not ShareGPT itself: bench_serving downloads ``ShareGPT_V3_unfiltered_cleaned_split.json``
from Hugging Face, which pdsim's sources cannot reach, and its conversations are users'
scraped chats whose licence is unclear. The Azure LLM inference traces are production length
pairs (and arrival times) published by Microsoft under CC-BY-4.0, the public record of what a
chat and a code service's requests look like; bench_serving's sharegpt sampling is applied
to them as it would be to ShareGPT's (pdsim.engine.client.sharegpt_lengths).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DATA = Path(__file__).with_name("data")


@dataclass(frozen=True)
class Named:
    """A shipped dataset: its file in :data:`DATA` and what it is, in one line."""

    file: str
    what: str


DATASETS: dict[str, Named] = {
    "azure_conv": Named(
        "azure_conv_2023.jsonl.gz",
        "Azure LLM inference trace 2023, conversation service: 19,366 requests over 58 min, "
        "mean 1,155 prompt / 211 output tokens (CC-BY-4.0)"),
    "azure_code": Named(
        "azure_code_2023.jsonl.gz",
        "Azure LLM inference trace 2023, code service: 8,819 requests over 57 min, "
        "mean 2,048 prompt / 28 output tokens (CC-BY-4.0)"),
}
DEFAULT = "azure_conv"


def path(name: str) -> Path:
    """The file of the shipped dataset ``name`` (one of :data:`DATASETS`)."""
    return DATA / DATASETS[name].file


def describe() -> str:
    """Each shipped dataset in a line (for a schema description or an error)."""
    return "; ".join(f"{name}: {d.what}" for name, d in DATASETS.items())

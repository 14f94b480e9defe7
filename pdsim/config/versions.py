"""Known SGLang releases: the table ``engine.version`` is checked against, and version order.

A scenario names the SGLang release whose behaviour it runs (``engine: {version: "0.5.16"}``);
switches whose defaults changed across releases (:mod:`pdsim.config.pd_paths`) take that
release's value unless the scenario sets them. The table lists the PyPI wheels the
behaviour was read in (``pip download --no-deps sglang==X``), with the approximate build date
of each (the zip timestamp of ``sglang/srt/disaggregation/decode.py``), from which a PR's
first release was inferred: a wheel carries no git commit, so "first in release X" means the
first wheel whose code has the behaviour (docs/pd_paths.md, "Sources").

Default: 0.5.22, the newest release whose defaults the shipped scenarios' other sections
follow (the one-strike permanent blacklist with the recovery probe off, 0.5.14-0.5.22).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field

# version -> approximate build date of its wheel (docs/pd_paths.md, "Sources")
SGLANG_VERSIONS: dict[str, str] = {
    "0.5.2": "2025-09-11", "0.5.3": "2025-10-06", "0.5.4": "2025-10-24",
    "0.5.5": "2025-11-06", "0.5.6": "2025-12-03", "0.5.7": "2026-01-01",
    "0.5.8": "2026-01-23", "0.5.9": "2026-02-23", "0.5.10": "2026-04-05",
    "0.5.11": "2026-05-07", "0.5.12": "2026-05-16", "0.5.13": "2026-06-11",
    "0.5.14": "2026-06-26", "0.5.15": "2026-07-10", "0.5.16": "2026-07-25",
    "0.5.17": "2026-08-08", "0.5.18": "2026-08-21", "0.5.19": "2026-09-04",
    "0.5.20": "2026-09-18", "0.5.21": "2026-10-01", "0.5.22": "2026-10-15",
    "0.5.23": "2026-10-30",
}
DEFAULT_VERSION = "0.5.22"


def key(version: str) -> tuple[int, ...]:
    """A release as a tuple that sorts in release order (``"0.5.9" < "0.5.10"``)."""
    return tuple(int(p) for p in version.split("."))


def at_least(version: str, floor: str) -> bool:
    """Whether ``version`` is ``floor`` or a later release."""
    return key(version) >= key(floor)


def _known(v: Any) -> Any:
    if isinstance(v, str) and v.startswith("v"):
        v = v[1:]  # "v0.5.16" as SGLang's tags spell it
    if not isinstance(v, str) or v not in SGLANG_VERSIONS:
        shown = repr(v)[:40]
        raise ValueError(f"unknown SGLang version {shown}; known: "
                         f"{', '.join(SGLANG_VERSIONS)} (pdsim.config.versions)")
    return v


SGLangVersion = Annotated[str, BeforeValidator(_known),
                          Field(json_schema_extra={"enum": list(SGLANG_VERSIONS)})]
"""A release of :data:`SGLANG_VERSIONS` (a leading ``v`` is accepted and dropped)."""

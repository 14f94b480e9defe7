"""A corpus CSV's optional server-flag columns (``validation/corpus/README.md``): a user's own
benchmark knows the flags it launched SGLang with, and the generated scenario takes them.

Each column holds SGLang's flag as given at launch and sets the matching fleet setting
(:data:`FLAG_COLUMNS`), checked by the fleet section's own field validation; ``kv_cache_dtype``
sets ``model.kv_dtype``, one for the fleet. An empty cell (or no column) leaves the generator's
choice (:mod:`pdsim.analysis.corpus`: the release's defaults or the InferenceX config's flags).
A malformed value refuses the row with a named reason; each value taken is an assumption
listed by ``--explain``.
"""

from __future__ import annotations

import math
from typing import Any

from pdsim.util.safeio import echo


class Malformed(ValueError):
    """A cell pdsim cannot read (the generator refuses the row as a ``malformed row``)."""


def cell(row: dict, key: str) -> Any:
    """A row's cell, stripped; None when absent or empty (pandas reads an empty cell as NaN)."""
    v = row.get(key)
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    return v.strip() if isinstance(v, str) else v


def whole(row: dict, key: str, default: int | None = None) -> int | None:
    """A cell as a whole number >= 0 (``default`` when empty), or :class:`Malformed`."""
    v = cell(row, key)
    if v is None:
        return default
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise Malformed(f"{key} {echo(v)} is not a number") from None
    if not math.isfinite(f) or f != int(f) or f < 0:
        raise Malformed(f"{key} {echo(v)} is not a whole number")
    return int(f)

# Optional server-flag columns a CSV may carry (a user's own benchmark knows its launch flags):
# column -> (the fleet setting it sets, how the cell reads). An ``agg`` row takes the bare
# column, a ``disagg`` row the ``prefill_`` / ``decode_`` ones (as the layout columns). Each
# value is SGLang's flag as launched; an empty cell (or no column) keeps the release's default
# (or the InferenceX config's flag), which the columns override.
FLAG_COLUMNS: dict[str, tuple[str, str]] = {
    "mem_fraction_static": ("mem_fraction_static", "number"),
    "chunked_prefill_size": ("chunked_prefill_size", "whole"),
    "max_running_requests": ("max_running_requests", "whole"),
    "cuda_graph_max_bs": ("cuda_graph_max_bs", "whole"),
    "disable_radix_cache": ("prefix_cache", "bool"),
    "page_size": ("page_size", "whole"),
}
PREFILL_ONLY = ("chunked_prefill_size", "disable_radix_cache")  # pdsim's decode runs no prefill
# --kv-cache-dtype (one for the fleet: pdsim's model.kv_dtype) -> pdsim's KV dtype; "auto": the
# model's dtype, pdsim's default
KV_CACHE_DTYPES = {"auto": None, "bf16": "bf16", "bfloat16": "bf16", "fp8": "fp8",
                   "fp8_e4m3": "fp8", "fp8_e5m2": "fp8"}
_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")


def _value(row: dict, col: str, how: str) -> Any:
    """The cell ``col`` of a row read as ``how`` (None: empty), or a named refusal."""
    v = cell(row, col)
    if v is None or v == "":
        return None
    if how == "bool":
        if isinstance(v, bool):
            return v
        s = str(v).lower()
        s = s[:-2] if s.endswith(".0") else s  # (a column of 0 / 1 reads as floats)
        if s in _TRUE + _FALSE:
            return s in _TRUE
        raise Malformed(f"{col} {echo(v)} is not true or false")
    if how == "whole":
        return whole(row, col)
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise Malformed(f"{col} {echo(v)} is not a number") from None
    if not math.isfinite(f):
        raise Malformed(f"{col} {echo(v)} is not a number")
    return f


def role_flags(row: dict, roles: dict[str, dict], model: Any,
               assumptions: list[str]) -> dict[str, dict]:
    """The fleet settings the row's optional server-flag columns (:data:`FLAG_COLUMNS`) give
    each role (``roles``: role -> its layout), checked as a scenario's fleet section is
    checked; a malformed value refuses the row."""
    import pydantic

    from pdsim.config.fleet import ColocatedConfig, DecodeConfig, PrefillConfig

    classes = {"colocated": ColocatedConfig, "prefill": PrefillConfig, "decode": DecodeConfig}
    out: dict[str, dict] = {r: {} for r in roles}
    for col, (key, how) in FLAG_COLUMNS.items():
        if "colocated" in roles:
            if any(cell(row, f"{r}_{col}") not in (None, "") for r in ("prefill", "decode")):
                raise Malformed(f"prefill_{col} / decode_{col} on an agg row: "
                              f"give {col}")
        elif cell(row, col) not in (None, ""):
            raise Malformed(f"{col} on a disagg row: give prefill_{col} / "
                          f"decode_{col} (one per role, as the layout columns)")
        for r, lay in roles.items():
            name = col if r == "colocated" else f"{r}_{col}"
            v = _value(row, name, how)
            if v is None:
                continue
            if r == "decode" and col in PREFILL_ONLY:
                assumptions.append(f"{name} {v}: not used (pdsim's decode servers run no "
                                   f"prefill and keep no prefix cache)")
                continue
            setting = (not v) if key == "prefix_cache" else v
            note = ""
            if key == "max_running_requests" and lay.get("dp_attention"):
                # SGLang's model runner divides the flag by dp under DP attention
                setting = v // lay["dp"]
                note = f" ({setting} per DP rank: SGLang divides it by dp {lay['dp']})"
            try:
                classes[r].model_validate({key: setting})
            except pydantic.ValidationError as err:
                msg = err.errors()[0]["msg"]
                raise Malformed(f"{name} {echo(cell(row, name))}"
                              f"{note}: {msg[:1].lower()}{msg[1:]}") from None
            out[r][key] = setting
            shown = str(setting).lower() if how == "bool" else f"{setting:g}"
            assumptions.append(f"{name} {str(v).lower() if how == 'bool' else f'{v:g}'}: the "
                               f"row's column (fleet.{r}.{key}: {shown}){note}")
    return {r: _dsa_page(c, model, assumptions) for r, c in out.items()}


def kv_cache_dtype(row: dict, assumptions: list[str]) -> str | None:
    """pdsim's ``model.kv_dtype`` from the row's optional ``kv_cache_dtype`` column (SGLang's
    --kv-cache-dtype; one for the whole fleet, as pdsim's model section), None if empty or
    ``auto``."""
    v = cell(row, "kv_cache_dtype")
    if v is None or v == "":
        return None
    s = str(v).lower()
    if s not in KV_CACHE_DTYPES:
        raise Malformed(f"kv_cache_dtype {echo(v)}; known: "
                      f"{', '.join(KV_CACHE_DTYPES)}")
    kv = KV_CACHE_DTYPES[s]
    assumptions.append(f"kv_cache_dtype {s}: the row's column (model.kv_dtype "
                       f"{kv or 'as the profile: the model dtype'})")
    return kv


def _dsa_page(cols: dict, model: Any, assumptions: list[str]) -> dict:
    """A role's column settings, less a page size SGLang overrides (64 for DSA attention)."""
    if model.index_topk and cols.get("page_size", 64) != 64:
        assumptions.append(f"page_size {cols['page_size']} of the row's column not used: SGLang "
                           f"forces 64 for DSA (NSA) attention")
        cols = {k: v for k, v in cols.items() if k != "page_size"}
    return cols

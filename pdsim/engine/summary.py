"""Metrics as ``bench_serving`` reports them, plus what it hides, from the request records."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from itertools import compress
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

FLUSH_REASONS = ("flush_freed_pages", "blacklisted_session")
# a request's status, as the metrics read it: its index in STATUSES (-1: none of them)
STATUSES = ("completed", "failed", "timed_out", "unfinished")
COMPLETED, FAILED, TIMED_OUT, UNFINISHED = range(len(STATUSES))


def _ms(x: float) -> float:
    return round(float(x) * 1e3, 3) if np.isfinite(x) else float("nan")


# The numeric reductions below are pandas' own (pandas.core.nanops, array_algos.quantile) on
# plain arrays: the same sums in the same order, so every figure is the same to the bit, at a
# tenth of the cost of the boolean-indexed DataFrames they replace.

def _nansum(a: np.ndarray) -> np.floating:
    """``Series.sum()`` of floats: NaNs count as 0 (filled in place, so the pairwise sum runs
    over the same positions)."""
    nan = np.isnan(a)
    return np.where(nan, 0.0, a).sum() if nan.any() else a.sum()


def _mean(a: np.ndarray) -> float:
    """``Series.mean()`` of floats: the NaN-filled sum over the count of non-NaN values."""
    if not a.size:
        return float("nan")
    nan = np.isnan(a)
    count = np.float64(a.size - nan.sum())
    total = np.where(nan, 0.0, a).sum() if nan.any() else a.sum()
    return total / count if count > 0 else float("nan")


def _q(a: np.ndarray, *qs: float) -> list[float]:
    """``float(Series.quantile(q))`` (linear) for each ``q``, NaN for an empty series.

    One ``np.quantile`` for all of them: it computes each quantile's position, neighbours and
    interpolation element by element (the neighbours are order statistics, whatever else the
    partition also places), so each is the float a call of its own gives."""
    if not len(a):
        return [float("nan")] * len(qs)
    nan = np.isnan(a)
    if nan.any():
        a = a[~nan]
        return [float(x) for x in np.quantile(a, np.array(qs), method="linear")] if len(a) \
            else [float("nan")] * len(qs)
    return [float(x) for x in np.quantile(a[None, :], np.array(qs), axis=1,
                                          method="linear")[:, 0]]


def _q_weighted(values: np.ndarray, weights: np.ndarray, *qs: float) -> list[float]:
    """``np.quantile(np.repeat(values, weights), q)`` (linear) for each ``q``, without making
    the repeated array (a run's ITL list has one gap per generated token: ~10^8 of them for a
    long run). NaN when the weights sum to 0.

    The repeated array sorted is ``values`` sorted, each ``weights`` times; its element ``k``
    is the value whose cumulative weight first exceeds ``k``; the quantile interpolates
    between elements ``floor(h)`` and ``floor(h) + 1`` at ``h = q (N - 1)``, as numpy's
    linear method does."""
    keep = weights > 0
    values, weights = values[keep], weights[keep]
    total = int(weights.sum())
    if not total:
        return [float("nan")] * len(qs)
    order = np.argsort(values, kind="stable")
    v, cum = values[order], np.cumsum(weights[order])
    out = []
    for q in qs:
        h = q * (total - 1)
        lo = math.floor(h)
        a, b = np.searchsorted(cum, [lo, min(lo + 1, total - 1)], side="right")
        out.append(float(v[a] + (h - lo) * (v[b] - v[a])))
    return out


def nanmax(a: np.ndarray) -> float:
    """``Series.max()`` of floats (NaN when every value is NaN); ``a`` is not empty."""
    nan = np.isnan(a)
    return a[~nan].max() if not nan.all() else float("nan")


def codes(values: pd.Series | tuple, names: Sequence[str]) -> np.ndarray:
    """For each value of a column, the index of the one of ``names`` (distinct) it equals,
    else -1: what comparing the column with each name says, as one array of small ints.

    A column of strings as the run's records hold it (a tuple of ``str``,
    ``pdsim.engine.log.plain_columns``) is looked up in a dict, value by value. A column of pandas'
    pyarrow-backed strings is looked up by pyarrow in one pass (a missing value equals no
    name), instead of each value becoming a Python object to compare with each name (~450
    instructions a value for the object, ~135 a comparison); any other column is compared
    with each name. ``values``: a tuple of strings, a Series or its array (:func:`column`)."""
    if isinstance(values, tuple):
        index = {name: i for i, name in enumerate(names)}
        return np.fromiter(map(index.get, values, (-1,) * len(values)), np.int32, len(values))
    arr = _pandas_array(values)
    if _arrow_strings(arr):
        import pyarrow as pa
        import pyarrow.compute as pc

        chunks = arr.__arrow_array__()
        found = pc.index_in(chunks, value_set=pa.array(names, type=chunks.type))
        return pc.fill_null(found, -1).to_numpy()
    objects = np.asarray(arr)
    out = np.full(len(objects), -1, dtype=np.int32)
    for i, name in enumerate(names):
        out[objects == name] = i
    return out


def counts(values: pd.Series | tuple, mask: np.ndarray) -> dict[str, int]:
    """How many times each string occurs among ``values[mask]`` (missing values left out, as
    ``value_counts()`` leaves them), in no particular order; a tuple of strings (the run's
    records, :func:`codes`) by a Counter, pyarrow-backed strings by pyarrow, other columns by
    a Counter of their string objects. ``values``: a tuple of strings, a Series or its array
    (:func:`column`)."""
    if isinstance(values, tuple):
        return dict(Counter(compress(values, mask.tolist())))
    arr = _pandas_array(values)
    if _arrow_strings(arr):
        import pyarrow as pa
        import pyarrow.compute as pc

        found = pc.value_counts(pc.filter(arr.__arrow_array__(), pa.array(mask)))
        return {v: n for v, n in zip(found.field(0).to_pylist(), found.field(1).to_pylist(),
                                     strict=True) if v is not None}
    return dict(Counter(r for r in np.asarray(arr)[mask] if isinstance(r, str)))


def _pandas_array(values: object) -> object:
    """A Series' array, or ``values`` (a numpy array needs no pandas: none is imported)."""
    if isinstance(values, np.ndarray):
        return values
    import pandas as pd

    return values.array if isinstance(values, pd.Series) else values


def _arrow_strings(arr: object) -> bool:
    """``arr`` is pandas' pyarrow-backed string array."""
    if isinstance(arr, np.ndarray):
        return False
    import pandas as pd

    return isinstance(arr, pd.arrays.ArrowStringArray)


# the percentiles reported of TTFT, TPOT, ITL and E2E latency (with the mean): bench_serving
# prints the median and P99 (P95 too of ITL); P90 and P95 are what capacity planners set SLOs on
PERCENTILES = (0.5, 0.9, 0.95, 0.99)

# the request-table columns the metrics read, and the dtypes they have there (status: codes)
COLUMNS = {"http_status": None, "stream": bool, "t_done": None, "t_arrival": None,
           "t_first_token": None, "output_len": None, "generated": None,
           "input_len": None, "prefill_tokens": None, "cached_tokens": None}


def column(df: pd.DataFrame, name: str, arrays: dict | None = None) -> object:
    """The values of ``df[name]``, as an array: ``arrays[name]`` when the table's columns are
    given (a run's records as pdsim.engine.log.plain_columns types them, which needs no frame and no
    pandas), else the frame's."""
    return arrays[name] if arrays is not None else df[name].array


def columns(df: pd.DataFrame, arrays: dict | None = None) -> dict[str, np.ndarray]:
    """The columns :func:`metrics` reads, as arrays; ``status`` as the index of each
    request's status in :data:`STATUSES` (:func:`codes`). ``arrays``: see :func:`column`."""
    col = {c: np.asarray(column(df, c, arrays), dtype=t) for c, t in COLUMNS.items()}
    col["status"] = codes(column(df, "status", arrays), STATUSES)
    return col


def request_metrics(df: pd.DataFrame, duration: float) -> dict:
    """bench_serving's numbers over ``df`` (measured requests of one or more clients); see
    :func:`metrics`."""
    return metrics(columns(df), duration)


def metrics(col: dict[str, np.ndarray], duration: float) -> dict:
    """bench_serving's numbers over the request columns ``col`` (:func:`columns`: the status
    as its index in :data:`STATUSES`).

    As ``python/sglang/bench_serving.py`` computes them (``async_request_sglang_generate`` and
    ``calculate_metrics``, 0.5.x): an output is a success when the HTTP status is 200, so a
    streamed abort (200 with one empty-text chunk) is one. Its TTFT stays 0.0 (only a chunk
    with text sets it), its ``output_len`` stays the requested length, its latency is when the
    abort chunk arrived, so it adds a TTFT of 0 and a TPOT of latency / (output_len - 1) to the
    means, no ITL, and its requested length to the output throughput. A non-streamed response
    is one chunk: its TTFT is its latency, and it has no TPOT or ITL to measure; bench_serving
    counts a TPOT of 0 for it (latency - TTFT = 0), which here would pull the TPOT of a mix
    of clients down and print 0.00 for a non-streaming one, so TPOT is over streamed
    responses only (None when there is none). ``true_output_throughput_tok_s`` counts tokens
    generated, and ``completed_mean_ttft_ms`` / ``completed_mean_tpot_ms`` are over completed
    requests at their real first-token times: what bench_serving's means hide.
    ``successful_requests`` counts those HTTP 200s (bench_serving's JSON calls them
    ``completed``); ``completed_requests`` counts requests that generated all their tokens.
    ``requests`` = ``completed_requests + failed + unfinished``.

    Percentiles (``median_``, ``p90_``, ``p95_``, ``p99_``: :data:`PERCENTILES`) are numpy's
    linear ones over the same per-request values as the means. bench_serving's ITL list has
    one gap per streamed chunk; pdsim keeps no per-token times (a record per token would cost
    more than the rest of a request), so its ITL percentiles are over the same gaps, each at
    its request's mean gap ((last token - first token) / (tokens - 1)): they see how gaps
    differ between requests (batch size, context length, decode load) but not within one
    (a step that ran a long prefill chunk beside the decode). The mean ITL is exact.
    ``prefix_cache_hit_rate``: share of the prompt tokens of requests that reached a prefill
    forward that the prefill rank's prefix cache already held.
    """
    status, generated = col["status"], col["generated"]
    t_arrival, t_first, t_done = col["t_arrival"], col["t_first_token"], col["t_done"]
    n = len(status)
    ok = col["http_status"] == 200
    n_ok = int(ok.sum())
    streamed = col["stream"][ok]
    ok_gen, ok_arrival, ok_first = generated[ok], t_arrival[ok], t_first[ok]
    ok_in = col["input_len"][ok]
    latency = t_done[ok] - ok_arrival
    out_len = np.where(streamed, col["output_len"][ok], ok_gen)
    as_reported = int(out_len.sum())
    first = ok_first - ok_arrival
    ttft = np.where(streamed, np.where(ok_gen > 0, first, 0.0), latency)
    many = streamed & (out_len > 1)  # (a non-streamed response has no TPOT: docstring)
    tpot = (latency - ttft)[many] / (out_len[many] - 1)
    chunks = streamed & (ok_gen > 1)  # the ITL list: streamed text chunks
    itl = ((_nansum(t_done[ok][chunks] - ok_first[chunks]) / (ok_gen[chunks] - 1).sum())
           if chunks.any() else float("nan"))
    failed = int(((status == FAILED) | (status == TIMED_OUT)).sum())
    unfinished = status == UNFINISHED
    empty = int(((generated == 0) & ~unfinished).sum())
    done = status == COMPLETED
    multi = done & (generated > 1)
    dur = duration if duration and duration > 0 else float("nan")
    looked = (col["prefill_tokens"] > 0) | (col["cached_tokens"] > 0)  # reached a prefill
    looked_in = int(col["input_len"][looked].sum())
    gen_total = generated.sum()
    ttft_50, ttft_90, ttft_95, ttft_99 = _q(ttft, *PERCENTILES)
    tpot_50, tpot_90, tpot_95, tpot_99 = _q(tpot, *PERCENTILES)
    e2e_50, e2e_90, e2e_95, e2e_99 = _q(latency, *PERCENTILES)
    # the ITL list as each request's mean gap, once per gap (docstring)
    gaps = ok_gen[chunks] - 1
    per_req_itl = ((t_done[ok][chunks] - ok_first[chunks]) / np.maximum(gaps, 1)
                   if chunks.any() else np.empty(0))
    itl_50, itl_90, itl_95, itl_99 = _q_weighted(per_req_itl, gaps, *PERCENTILES)
    return {
        "requests": n,
        "successful_requests": n_ok,
        "completed_requests": int(done.sum()),
        "failed": failed,
        "unfinished": int(unfinished.sum()),
        "empty_responses": empty,
        "empty_share": round(empty / n, 4) if n else 0.0,
        "duration_s": round(float(duration), 3),
        "output_throughput_tok_s": round(as_reported / dur, 2) if n else 0.0,
        "true_output_throughput_tok_s": round(float(gen_total) / dur, 2) if n else 0.0,
        "total_throughput_tok_s": round(float(ok_in.sum() + as_reported) / dur, 2)
        if n else 0.0,
        "request_throughput_req_s": round(n_ok / dur, 3) if n else 0.0,
        "total_input_tokens": int(ok_in.sum()),
        "total_generated_tokens": int(as_reported),
        "total_generated_tokens_true": int(gen_total),
        "mean_ttft_ms": _ms(_mean(ttft)),
        "median_ttft_ms": _ms(ttft_50),
        "p90_ttft_ms": _ms(ttft_90),
        "p95_ttft_ms": _ms(ttft_95),
        "p99_ttft_ms": _ms(ttft_99),
        "mean_tpot_ms": _ms(_mean(tpot)),
        "median_tpot_ms": _ms(tpot_50),
        "p90_tpot_ms": _ms(tpot_90),
        "p95_tpot_ms": _ms(tpot_95),
        "p99_tpot_ms": _ms(tpot_99),
        "mean_itl_ms": _ms(itl),
        "median_itl_ms": _ms(itl_50),
        "p90_itl_ms": _ms(itl_90),
        "p95_itl_ms": _ms(itl_95),
        "p99_itl_ms": _ms(itl_99),
        "mean_e2e_ms": _ms(_mean(latency)),
        "median_e2e_ms": _ms(e2e_50),
        "p90_e2e_ms": _ms(e2e_90),
        "p95_e2e_ms": _ms(e2e_95),
        "p99_e2e_ms": _ms(e2e_99),
        "prefix_cache_hit_rate": round(int(col["cached_tokens"][looked].sum()) / looked_in, 4)
        if looked_in else 0.0,
        "concurrency": round(float(_nansum(latency) / dur), 2) if n_ok else 0.0,
        "completed_mean_ttft_ms": _ms(_mean(t_first[done] - t_arrival[done])),
        "completed_mean_tpot_ms": _ms(_mean((t_done[multi] - t_first[multi])
                                           / (generated[multi] - 1))),
    }


def clean(d: dict) -> dict:
    """Plain Python types, NaN -> None, so that JSON stays valid and stable."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out[k] = clean(v)
        elif isinstance(v, np.integer):
            out[k] = int(v)
        elif isinstance(v, float | np.floating):
            out[k] = None if math.isnan(v) else float(v)
        else:
            out[k] = v
    return out

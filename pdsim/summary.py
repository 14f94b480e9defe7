"""Metrics as ``bench_serving`` reports them, plus what it hides, from the request records."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

FLUSH_REASONS = ("flush_freed_pages", "blacklisted_session")


def _ms(x: float) -> float:
    return round(float(x) * 1e3, 3) if np.isfinite(x) else float("nan")


def _q(s: pd.Series, q: float) -> float:
    return float(s.quantile(q)) if len(s) else float("nan")


def request_metrics(df: pd.DataFrame, duration: float) -> dict:
    """bench_serving's numbers over ``df`` (measured requests of one or more clients).

    As ``python/sglang/bench_serving.py`` computes them (``async_request_sglang_generate`` and
    ``calculate_metrics``, 0.5.x): an output is a success when the HTTP status is 200, so a
    streamed abort (200 with one empty-text chunk) is one. Its TTFT stays 0.0 (only a chunk
    with text sets it), its ``output_len`` stays the requested length, its latency is when the
    abort chunk arrived, so it adds a TTFT of 0 and a TPOT of latency / (output_len - 1) to the
    means, no ITL, and its requested length to the output throughput. A non-streamed response
    is one chunk: its TTFT is its latency. ``true_output_throughput_tok_s`` counts tokens
    generated, and ``completed_mean_ttft_ms`` / ``completed_mean_tpot_ms`` are over completed
    requests at their real first-token times: what bench_serving's means hide.
    ``successful_requests`` counts those HTTP 200s (bench_serving's JSON calls them
    ``completed``); ``completed_requests`` counts requests that generated all their tokens.
    ``requests`` = ``completed_requests + failed + unfinished``.
    ``prefix_cache_hit_rate``: share of the prompt tokens of requests that reached a prefill
    forward that the prefill rank's prefix cache already held.
    """
    n = len(df)
    ok = df[df.http_status == 200]
    streamed = ok.stream.to_numpy(dtype=bool)
    latency = ok.t_done - ok.t_arrival
    out_len = pd.Series(np.where(streamed, ok.output_len, ok.generated), index=ok.index)
    as_reported = int(out_len.sum())
    first = ok.t_first_token - ok.t_arrival
    ttft = pd.Series(np.where(streamed, np.where(ok.generated > 0, first, 0.0), latency),
                     index=ok.index)
    many = out_len > 1
    tpot = (latency - ttft)[many] / (out_len[many] - 1)
    tokens = ok[streamed & (ok.generated > 1).to_numpy()]  # the ITL list: streamed text chunks
    itl = (((tokens.t_done - tokens.t_first_token).sum() / (tokens.generated - 1).sum())
           if len(tokens) else float("nan"))
    failed = int(df.status.isin(["failed", "timed_out"]).sum())
    empty = int(((df.generated == 0) & (df.status != "unfinished")).sum())
    done = df[df.status == "completed"]
    multi = done[done.generated > 1]
    dur = duration if duration and duration > 0 else float("nan")
    looked = df[(df.prefill_tokens > 0) | (df.cached_tokens > 0)]  # reached a prefill forward
    looked_in = int(looked.input_len.sum())
    return {
        "requests": n,
        "successful_requests": int(len(ok)),
        "completed_requests": int(len(done)),
        "failed": failed,
        "unfinished": int((df.status == "unfinished").sum()),
        "empty_responses": empty,
        "empty_share": round(empty / n, 4) if n else 0.0,
        "duration_s": round(float(duration), 3),
        "output_throughput_tok_s": round(as_reported / dur, 2) if n else 0.0,
        "true_output_throughput_tok_s": round(float(df.generated.sum()) / dur, 2) if n else 0.0,
        "total_throughput_tok_s": round(float(ok.input_len.sum() + as_reported) / dur, 2)
        if n else 0.0,
        "request_throughput_req_s": round(len(ok) / dur, 3) if n else 0.0,
        "total_input_tokens": int(ok.input_len.sum()),
        "total_generated_tokens": int(as_reported),
        "total_generated_tokens_true": int(df.generated.sum()),
        "mean_ttft_ms": _ms(ttft.mean()),
        "median_ttft_ms": _ms(_q(ttft, 0.5)),
        "p99_ttft_ms": _ms(_q(ttft, 0.99)),
        "mean_tpot_ms": _ms(tpot.mean()),
        "median_tpot_ms": _ms(_q(tpot, 0.5)),
        "p99_tpot_ms": _ms(_q(tpot, 0.99)),
        "mean_itl_ms": _ms(itl),
        "mean_e2e_ms": _ms(latency.mean()),
        "median_e2e_ms": _ms(_q(latency, 0.5)),
        "prefix_cache_hit_rate": round(int(looked.cached_tokens.sum()) / looked_in, 4)
        if looked_in else 0.0,
        "concurrency": round(float(latency.sum() / dur), 2) if len(ok) else 0.0,
        "completed_mean_ttft_ms": _ms((done.t_first_token - done.t_arrival).mean()),
        "completed_mean_tpot_ms": _ms(((multi.t_done - multi.t_first_token)
                                       / (multi.generated - 1)).mean()),
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

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

    ``successful_requests`` counts HTTP 200s as bench_serving does (its JSON calls them
    ``completed``), so a streamed abort (200 with an empty abort chunk) is a "success";
    ``completed_requests`` counts requests that generated all their tokens. ``requests`` =
    ``completed_requests + failed + unfinished``. ``output_throughput_tok_s`` uses the
    requested output length for streamed successes, as bench_serving does;
    ``true_output_throughput_tok_s`` counts tokens generated.
    ``prefix_cache_hit_rate``: share of the prompt tokens of requests that reached a prefill
    forward that the prefill rank's prefix cache already held.
    """
    n = len(df)
    ok = df[df.http_status == 200]
    as_reported = int(np.where(ok.stream, ok.output_len, ok.generated).sum())
    failed = int(df.status.isin(["failed", "timed_out"]).sum())
    empty = int(((df.generated == 0) & (df.status != "unfinished")).sum())
    gen = df[df.generated > 0]
    ttft = gen.t_first_token - gen.t_arrival
    multi = df[(df.status == "completed") & (df.generated > 1)]
    decode_time = multi.t_done - multi.t_first_token
    tpot = decode_time / (multi.generated - 1)
    done = df[df.status == "completed"]
    dur = duration if duration and duration > 0 else float("nan")
    itl = decode_time.sum() / (multi.generated - 1).sum() if len(multi) else float("nan")
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
        "mean_e2e_ms": _ms((done.t_done - done.t_arrival).mean()),
        "median_e2e_ms": _ms(_q(done.t_done - done.t_arrival, 0.5)),
        "prefix_cache_hit_rate": round(int(looked.cached_tokens.sum()) / looked_in, 4)
        if looked_in else 0.0,
        "concurrency": round(float((done.t_done - done.t_arrival).sum() / dur), 2)
        if len(done) else 0.0,
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

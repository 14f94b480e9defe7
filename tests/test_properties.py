"""Property-based tests: random valid scenarios keep the model's invariants.

Hypothesis draws small scenarios over the whole format (fleets, KV pools small enough to
retract, blacklist policies, faults, flushes, both clients, SGLang releases and the PD path
switches, router dispatches and gateway timeouts, SDK retries) and checks, for each run: one
terminal bucket per request, ended once, generated <= output_len, KV within capacity and nothing
left allocated once every request resolved, monotone time, token sums that agree between the
summary, the records and the fleet counter, every prompt and question sent and ended, in flight
or not sent, a time series whose last sample is at the run's end with the table's totals, and
that a progress bar changes nothing. The examples are
derandomized (the same ones on every machine and run), and a couple of them are re-run in other
processes with other hash seeds for byte-identical outputs.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import numpy as np
from conftest import check_accounting, watch_ends
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import pdsim

PROFILE = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
BUCKETS = {"completed", "failed", "timed_out", "unfinished"}


@st.composite
def role(draw, prefill: bool, prompt: int) -> dict:
    dp = draw(st.sampled_from([1, 2]))
    r = {"servers": draw(st.integers(1, 2)), "dp": dp, "tp": dp * draw(st.sampled_from([1, 2])),
         "dp_attention": draw(st.booleans()),
         "balance": draw(st.sampled_from(["round_robin", "total_tokens",
                                          "follow_bootstrap_room"])),
         "max_running_requests": draw(st.integers(1, 48)),
         "page_size": draw(st.sampled_from([1, 1, 16, 64]))}
    # pools just above a prompt make decode retract and prefill wait (None: the GPU's memory)
    r["kv_pool_tokens"] = draw(st.sampled_from([None, prompt + 50, prompt + 110, 2 * prompt + 64,
                                                6000]))
    if prefill:
        r["chunked_prefill_size"] = draw(st.sampled_from([256, 1024, 8192]))
        r["prefix_cache"] = draw(st.booleans())
    else:
        r["num_reserved_decode_tokens"] = draw(st.sampled_from([0, 64, 512]))
    return r


@st.composite
def bench(draw, name: str) -> dict:
    c = {"kind": "bench", "name": name, "num_prompts": draw(st.integers(1, 30)),
         "start_s": draw(st.sampled_from([0.0, 0.0, 2.0])),
         "dataset": {"kind": "random", "input_len": draw(st.integers(1, 1500)),
                     "output_len": draw(st.integers(1, 260)),
                     "range_ratio": draw(st.sampled_from([0.0, 0.5, 1.0]))},
         "request_rate": draw(st.sampled_from(["inf", 5.0, 50.0])),
         "max_concurrency": draw(st.sampled_from([None, 1, 8])),
         "warmup_requests": draw(st.integers(0, 2)),
         "stream": draw(st.booleans()),
         "sdk_retries": draw(st.sampled_from([0, 0, 1, 2])),
         "sdk_backoff_s": draw(st.sampled_from([0.0, 0.5]))}
    mode = draw(st.sampled_from(["none", "none", "bare", "timeout", "raise_for_status"]))
    c["flush"] = {"mode": mode, "timeout_s": draw(st.sampled_from([0.5, 60.0]))}
    return c


@st.composite
def evals(draw, name: str) -> dict:
    return {"kind": "eval", "name": name, "questions": draw(st.integers(1, 15)),
            "threads": draw(st.integers(1, 6)), "tries": draw(st.integers(1, 3)),
            "sdk_retries": draw(st.integers(0, 2)), "max_tokens": draw(st.integers(1, 200)),
            "dataset": {"kind": "random", "input_len": draw(st.integers(1, 800)),
                        "output_len": draw(st.integers(1, 200))}}


@st.composite
def faults(draw, decode_ranks: int, prefill_servers: int, decode_servers: int,
           spiky: bool = False) -> list:
    """``spiky``: client 0 takes a load spike (an open loop, or a closed loop with a limit)."""
    out = []
    for _ in range(draw(st.integers(0, 2))):
        kind = draw(st.sampled_from(["transfer_errors", "decode_unreachable", "partition",
                                     "decode_crash", "decode_hang", "nic_flaps",
                                     "nic_degraded", "flush_race",
                                     # the faults of PD's timeout and abort paths (issue 26)
                                     "load_spike", "gateway_timeout", "lost_done",
                                     "prefill_restart", "leg_failure"]))
        if kind == "load_spike" and not spiky:
            kind = "gateway_timeout"
        at = draw(st.sampled_from([0.0, 1.0, 5.0]))
        dur = draw(st.sampled_from([0.5, 10.0, 60.0]))
        p = draw(st.integers(0, prefill_servers - 1))
        d = draw(st.integers(0, decode_servers - 1))
        if kind == "transfer_errors":
            out.append({"kind": kind, "probability": draw(st.sampled_from([0.05, 0.5, 1.0])),
                        "from_s": at, "to_s": at + dur})
        elif kind == "decode_unreachable":
            out.append({"kind": kind, "decode_rank": draw(st.integers(0, decode_ranks - 1)),
                        "at_s": at, "duration_s": dur})
        elif kind == "partition":
            out.append({"kind": kind, "prefill_server": p, "at_s": at, "duration_s": dur,
                        "heartbeat_interval_s": draw(st.sampled_from([0.5, 5.0]))})
        elif kind == "decode_crash":
            out.append({"kind": kind, "decode_server": d, "at_s": at,
                        "restart_after_s": draw(st.sampled_from([None, 0.5, 10.0]))})
        elif kind == "decode_hang":
            out.append({"kind": kind, "decode_server": d, "at_s": at, "duration_s": dur,
                        "kv_writes": draw(st.sampled_from(["time_out", "land"]))})
        elif kind == "nic_flaps":
            out.append({"kind": kind, "prefill_server": p, "at_s": at,
                        "flaps": draw(st.integers(1, 3)), "every_s": 2.0,
                        "down_s": draw(st.sampled_from([0.2, 1.0]))})
        elif kind == "nic_degraded":
            out.append({"kind": kind, "prefill_server": p, "at_s": at, "duration_s": dur,
                        "bandwidth_fraction": draw(st.sampled_from([1e-6, 0.1]))})
        elif kind == "load_spike":
            out.append({"kind": kind, "client": 0, "at_s": at, "duration_s": dur,
                        "factor": draw(st.sampled_from([2.0, 10.0]))})
        elif kind == "gateway_timeout":
            out.append({"kind": kind, "at_s": at,
                        "ttft_timeout_s": draw(st.sampled_from([None, 0.05, 1.0])),
                        "cancels": draw(st.sampled_from([None, "both", "prefill"])),
                        "duration_s": draw(st.sampled_from([None, dur]))})
        elif kind == "lost_done":
            out.append({"kind": kind, "probability": draw(st.sampled_from([0.2, 1.0])),
                        "what": draw(st.sampled_from(["status", "aux"])), "from_s": at,
                        "to_s": at + dur})
        elif kind == "prefill_restart":
            out.append({"kind": kind, "prefill_server": p, "at_s": at,
                        "down_s": draw(st.sampled_from([0.5, 12.0]))})
        elif kind == "leg_failure":
            out.append({"kind": kind, "leg": draw(st.sampled_from(["decode", "prefill"])),
                        "probability": draw(st.sampled_from([0.3, 1.0])), "from_s": at,
                        "to_s": at + dur})
        else:
            out.append({"kind": kind, "at_s": at})
    return out


VERSIONS = ["0.5.1.post1", "0.5.2", "0.5.9", "0.5.12", "0.5.13", "0.5.16", "0.5.17", "0.5.19",
            "0.5.21", "0.5.22", "0.5.23"]


@st.composite
def pd_paths(draw) -> dict:
    """Some switches of disaggregation: set (the rest take the release's values)."""
    out: dict = {}
    for name in ("prefill_abort_notifies_decode", "decode_abort_notifies_prefill",
                 "metadata_gate", "waiting_timeout_in_transferring",
                 "waiting_timeout_invalidates_peer_cache", "deferred_decode_kv_release",
                 "ack_after_drain", "heartbeat_instance_id"):
        if draw(st.integers(0, 2)) == 0:
            out[name] = draw(st.booleans())
    if draw(st.booleans()):
        out["deferred_release_timeout_s"] = draw(st.sampled_from([0.5, 30.0]))
    if draw(st.booleans()):
        out["heartbeat_interval_s"] = draw(st.sampled_from([2.0, 5.0]))
    if draw(st.booleans()):
        out["zmq_send_timeout_s"] = draw(st.sampled_from([None, 0.2]))
    return out


@st.composite
def blacklists(draw) -> dict:
    policy = draw(st.sampled_from(["permanent", "probe", "v0_5_23", "v0_5_23", "ttl",
                                   "strikes_window", "circuit_breaker", "never"]))
    bl: dict = {"policy": policy}
    if policy in ("permanent", "probe", "v0_5_23", "ttl", "strikes_window"):
        bl["strikes"] = draw(st.integers(1, 3))
    if policy in ("probe", "v0_5_23"):
        bl["probe_interval_s"] = draw(st.sampled_from([0.5, 30.0]))
    if policy == "v0_5_23":
        bl["idle_drop_s"] = draw(st.sampled_from([0.01, 1.0, 10.0, 600.0]))
    if policy in ("ttl", "strikes_window"):
        bl["ttl_s"] = draw(st.sampled_from([0.5, 5.0, 60.0]))
    if policy == "circuit_breaker":
        bl.update(failures=draw(st.integers(1, 3)), cooldown_s=draw(st.sampled_from([0.5, 5.0])),
                  trials=draw(st.integers(1, 2)))
    return bl


@st.composite
def scenarios(draw) -> dict:
    clients = [draw(bench("b0"))]
    if draw(st.booleans()):
        clients.append(draw(st.one_of(bench("b1"), evals("e1"))))
    prompt = max(c["dataset"]["input_len"] for c in clients)
    pre, dec = draw(role(True, prompt)), draw(role(False, prompt))
    d = {
        "seed": draw(st.integers(0, 2**31)),
        "horizon_s": draw(st.sampled_from([20.0, 120.0, 400.0])),
        "fleet": {"gpu": "H20", "model": "dsv3-ci-test", "prefill": pre, "decode": dec},
        "predictor": {"kind": draw(st.sampled_from(["operator", "fitted", "roofline"]))},
        "transfer": {"queues_per_rank": draw(st.integers(1, 4)),
                     "call_latency_ms": draw(st.sampled_from([1.6, 1.6, 100.0])),
                     "nic_gbps": draw(st.sampled_from([None, None, 0.05, 1.0])),
                     "transfer_timeout_s": draw(st.sampled_from([2.0, 30.0]))},
        "blacklist": draw(blacklists()),
        "flush": {"semantics": draw(st.sampled_from(["skip_idle_check", "reject_if_busy"]))},
        "router": {"flush_handler": draw(st.sampled_from(
            ["mini_lb_0.3.2", "mini_lb_fixed", "model_gateway", "rust_router"]))},
        "clients": clients,
        "operator_flushes": [{"at_s": draw(st.sampled_from([0.5, 3.0, 8.0]))}
                             for _ in range(draw(st.integers(0, 1)))],
        "engine": {"version": draw(st.sampled_from(VERSIONS))},
        "disaggregation": draw(pd_paths()),
    }
    b0 = clients[0]
    spiky = b0["request_rate"] != "inf" or b0["max_concurrency"] is not None
    d["faults"] = draw(faults(dec["servers"] * dec["dp"], pre["servers"], dec["servers"],
                              spiky))
    d["router"]["dispatch"] = draw(st.sampled_from(
        ["mini_lb_gather", "smg_join", "smg_cancel_on_prefill_fail", "smg_cancel_both"]))
    if draw(st.booleans()):
        d["router"]["request_timeout_s"] = draw(st.sampled_from([5.0, 60.0]))
    if draw(st.integers(0, 2)) == 0:
        d["router"]["ttft_timeout_s"] = draw(st.sampled_from([0.05, 2.0]))
        d["router"]["ttft_timeout_cancels"] = draw(st.sampled_from(["both", "prefill"]))
    if (d["engine"]["version"] in ("0.5.21", "0.5.22", "0.5.23")
            and draw(st.integers(0, 3)) == 0):
        d["disaggregation"]["req_waiting_timeout_s"] = draw(st.sampled_from([0.5, 5.0]))
    if draw(st.integers(0, 3)) == 0:  # every timeout alike: a decode's and the router's tie
        t = draw(st.sampled_from([2.0, 5.0]))
        d["router"]["request_timeout_s"] = t
        d["transfer"].update(bootstrap_timeout_s=t, waiting_timeout_s=t)
    extend(draw, d)
    return d


def extend(draw, d: dict) -> None:
    """The rest of the surface (issue #28): profile files, traces, the fault library, declared
    unknowns, seeds, SLO thresholds, and (one scenario in three) keys at their schema bounds."""
    pd_fleet = d["fleet"].get("mode", "pd") == "pd"
    if draw(st.integers(0, 4)) == 0:
        d["profiles"] = [PROFILES]
        d["fleet"].update(gpu=draw(st.sampled_from(["H20", "fz-gpu"])), model="fz-model",
                          engine=draw(st.sampled_from(["sglang", "fz-engine"])))
    if draw(st.integers(0, 5)) == 0:
        d["clients"].append(draw(traces(f"t{len(d['clients'])}")))
    if pd_fleet and draw(st.integers(0, 5)) == 0:
        d["faults"].append({"preset": draw(st.sampled_from(PRESETS)),
                            "at_s": draw(st.sampled_from([0.0, 2.0, 30.0]))})
    if draw(st.integers(0, 5)) == 0:
        d["seeds"] = {draw(st.sampled_from(["arrivals", "lengths", "routing", "faults"])):
                      draw(st.integers(0, 2**64 - 1))}
    if draw(st.integers(0, 5)) == 0:
        d["slo"] = {"ttft_ms": draw(st.sampled_from([200.0, 2000.0])),
                    "tpot_ms": draw(st.sampled_from([None, 50.0]))}
    if draw(st.integers(0, 4)) == 0:
        declare(draw, d)
    if draw(st.integers(0, 2)) == 0:
        for _ in range(draw(st.integers(1, 3))):
            at_bound(draw, d, pd_fleet)


@st.composite
def colocated_scenarios(draw) -> dict:
    """A colocated fleet (pdsim.engine.colocated): the same clients, flushes and router
    timeouts; the faults that apply to it (crash, hang, flush race); the gateway's policies;
    pools just above a prompt, mixed chunk, radix cache on or off, both retraction rules."""
    clients = [draw(bench("b0"))]
    if draw(st.booleans()):
        clients.append(draw(st.one_of(bench("b1"), evals("e1"))))
    prompt = max(c["dataset"]["input_len"] for c in clients)
    c = draw(role(True, prompt))
    if c["balance"] == "follow_bootstrap_room":  # (a PD balancer: no rooms here)
        c["balance"] = "round_robin"
    c["enable_mixed_chunk"] = draw(st.booleans())
    c["schedule_conservativeness"] = draw(st.sampled_from([0.3, 1.0, 1.0, 1.5]))
    c["max_prefill_tokens"] = draw(st.sampled_from([512, 16384, 16384]))
    if c["kv_pool_tokens"] is not None:  # (room for a prompt and its growth blocks)
        c["kv_pool_tokens"] += 128
    faults = []
    for _ in range(draw(st.integers(0, 2))):
        kind = draw(st.sampled_from(["decode_crash", "decode_hang", "flush_race"]))
        at = draw(st.sampled_from([0.0, 1.0, 5.0]))
        server = draw(st.integers(0, c["servers"] - 1))
        if kind == "decode_crash":
            faults.append({"kind": kind, "decode_server": server, "at_s": at,
                           "restart_after_s": draw(st.sampled_from([None, 0.5, 10.0]))})
        elif kind == "decode_hang":
            faults.append({"kind": kind, "decode_server": server, "at_s": at,
                           "duration_s": draw(st.sampled_from([0.5, 10.0]))})
        else:
            faults.append({"kind": kind, "at_s": at})
    d = {
        "seed": draw(st.integers(0, 2**31)),
        "horizon_s": draw(st.sampled_from([20.0, 120.0, 400.0])),
        "fleet": {"gpu": "H20", "model": "dsv3-ci-test", "mode": "colocated", "colocated": c},
        "engine": {"version": draw(st.sampled_from(["0.5.1.post1", "0.5.9", "0.5.9"]))},
        "predictor": {"kind": draw(st.sampled_from(["operator", "fitted", "roofline"]))},
        "flush": {"semantics": draw(st.sampled_from(["skip_idle_check", "reject_if_busy"]))},
        "router": {"policy": draw(st.sampled_from(["round_robin", "random", "least_load"])),
                   "flush_handler": draw(st.sampled_from(
                       ["mini_lb_0.3.2", "mini_lb_fixed", "model_gateway", "rust_router"]))},
        "clients": clients,
        "operator_flushes": [{"at_s": draw(st.sampled_from([0.5, 3.0, 8.0]))}
                             for _ in range(draw(st.integers(0, 1)))],
        "faults": faults,
    }
    if draw(st.booleans()):
        d["router"]["request_timeout_s"] = draw(st.sampled_from([5.0, 60.0]))
    extend(draw, d)
    return d


PROFILES = "tests/fuzz_profiles.yaml"  # (paths of a dict resolve from the repo's root)
TRACES = ["scenarios/traces/synthetic_trace.jsonl.gz",
          "scenarios/traces/conversation_trace.jsonl.gz"]
PRESETS = ["flush_race", "decode_crash", "decode_hang", "decode_nic_down", "nic_flaps",
           "nic_degraded", "partition", "transient_errors", "load_spike", "gateway_timeout",
           "lost_done", "prefill_restart", "leg_failure"]  # the library (pdsim faults)


@st.composite
def traces(draw, name: str) -> dict:
    """A bench client replaying the first rows of a shipped Mooncake trace."""
    n = draw(st.integers(1, 30))
    ds = {"kind": "trace", "path": draw(st.sampled_from(TRACES)),
          "time_scale": draw(st.sampled_from([1.0, 0.01, 50.0]))}
    if draw(st.booleans()):
        ds["limit"] = draw(st.integers(1, 40))
    if draw(st.booleans()):
        ds["max_input_len"] = draw(st.sampled_from([1, 600, 4096]))
    return {"kind": "bench", "name": name, "num_prompts": n, "dataset": ds,
            "warmup_requests": draw(st.integers(0, 1)),
            "request_rate": draw(st.sampled_from(["trace", "inf", 3.0]))}


def declare(draw, d: dict) -> None:
    """Give a value or two as declared unknowns around it (run takes the nominal; validate
    checks the ends, every value of a short integer range and each choice)."""
    c = d["clients"][0]
    n = c["num_prompts"]
    c["num_prompts"] = {"uniform": [1, max(n, 2)], "nominal": n, "why": "fuzz"}
    if draw(st.booleans()):
        sem = d["flush"]["semantics"]
        d["flush"]["semantics"] = {"choice": ["skip_idle_check", "reject_if_busy"],
                                   "nominal": sem}
    if draw(st.booleans()):
        h = d["horizon_s"]
        d["horizon_s"] = {"loguniform": [h / 2, h * 2], "nominal": h}


# Values at (or next to) the schema's bounds, by dotted key: the smallest positive float
# (5e-324) where a bound is "> 0", 1e-300 (products of two underflow), and the largest a key
# takes. Setting one may make a scenario invalid: then validate and run must refuse it alike.
TINY = (5e-324, 1e-300)
BOUNDS: dict[str, list] = {
    "horizon_s": [1e-9, 5e-324], "timeseries_interval_s": [0.001],
    "seed": [0, 2**64 - 1],
    "router.http_latency_ms": [0.0, 1e10], "router.request_timeout_s": [*TINY, 1e7],
    "router.fanout_concurrency": [1, 1_000_000], "router.worker_timeout_s": [*TINY, 1e7],
    "transfer.queues_per_rank": [1, 64], "transfer.call_latency_ms": [0.0, 1e10],
    "transfer.nic_gbps": [1e-3, 1e6], "transfer.gpus_per_nic": [1, 1024],
    "transfer.peak_utilisation": [*TINY, 1.0], "transfer.min_utilisation": [*TINY, 1.0],
    "transfer.saturation_mb": [*TINY, 1e6], "transfer.transfer_timeout_s": [*TINY, 1e7],
    "transfer.qp_retry_s": [*TINY, 1e7], "transfer.bootstrap_timeout_s": [*TINY, 1e7],
    "transfer.waiting_timeout_s": [*TINY, 1e7], "transfer.base_port": [1, 65535],
    "predictor.expert_imbalance": [1.0, 100.0], "predictor.two_batch_overlap": [True],
    "predictor.prefill_mfu": [*TINY, 1.0], "predictor.hbm_derate": [*TINY, 1.0],
    "predictor.step_overhead_ms": [0.0, 1e10],
    "predictor.coefficients.prefill_a_ms": [0.0, 1e10],
    "predictor.coefficients.decode_b_ms_per_ktok": [0.0, 1e10],
    "gpu.bf16_tflops": [*TINY, 1e9], "gpu.fp8_tflops": [*TINY, 1e9],
    "gpu.gemm_eff": [*TINY, 1.0], "gpu.hbm_tbps": [*TINY, 1e9], "gpu.hbm_eff": [*TINY],
    "gpu.nvlink_gbps": [*TINY], "gpu.nvlink_eff": [*TINY], "gpu.nic_gbps": [*TINY, 1e9],
    "gpu.nic_eff": [*TINY], "gpu.attn_eff": [*TINY], "gpu.decode_attn_eff": [*TINY],
    "gpu.gemm_half_tokens": [*TINY, 1e9], "gpu.allreduce_us": [0.0, 1e9],
    "gpu.a2a_us": [0.0, 1e9], "gpu.hbm_gb": [*TINY, 1e9], "gpu.gpus_per_nic": [1, 10_000_000],
    "engine.prefill_step_ms": [0.0, 1e9], "engine.decode_step_ms": [0.0, 1e9],
    "engine.prefill_layer_us": [0.0, 1e9], "engine.decode_layer_us": [0.0, 1e9],
    "engine.decode_request_us": [0.0, 1e9], "engine.request_ms": [0.0, 1e9],
    "engine.bootstrap_ms": [0.0, 1e9], "engine.tokenize_us_per_token": [0.0, 1e9],
    "engine.tbo_overlap": [*TINY, 1.0],
    "model.layers": [1, 10_000_000], "model.experts": [0, 8], "model.experts_per_token": [1],
    "model.vocab_size": [1, 10_000_000], "model.hidden_size": [1],
    "fleet.prefill.page_size": [65536], "fleet.decode.page_size": [65536],
    "fleet.prefill.kv_pool_tokens": [1, 10**10], "fleet.decode.kv_pool_tokens": [1, 10**10],
    "fleet.prefill.max_running_requests": [1, 100_000],
    "fleet.decode.max_running_requests": [1, 100_000],
    "fleet.prefill.mem_fraction_static": [*TINY, 1.0],
    "fleet.decode.mem_fraction_static": [*TINY, 1.0],
    "fleet.prefill.chunked_prefill_size": [1, 10_000_000],
    "fleet.prefill.prefix_block_tokens": [1, 65536],
    "fleet.decode.num_reserved_decode_tokens": [0, 10_000_000],
    "slo.ttft_ms": [0.0, 1e10], "slo.tpot_ms": [0.0], "slo.e2e_ms": [1e10],
    "slo.attainment": [0.0, 1.0], "engine.version": ["0.5.1.post1", "0.5.9"],
    "fleet.prefill.ep": [2], "fleet.decode.ep": [2],
    "clients.0.start_s": [1e7], "clients.0.request_rate": [*TINY, 1e300],
    "clients.0.max_concurrency": [1, 1_000_000], "clients.0.warmup_requests": [0, 200],
    "clients.0.warmup_output_len": [1, 10_000_000],
    "clients.0.dataset.input_len": [1, 10_000_000],
    "clients.0.dataset.output_len": [1, 10_000_000],
    "clients.0.dataset.range_ratio": [0.0, 1.0],
    "clients.0.flush.timeout_s": [*TINY, 1e7],
    "operator_flushes": [[{"at_s": 0.0, "timeout_s": 5e-324}], [{"at_s": 1e7}]],
    "blacklist": [{"policy": "v0_5_23", "probe_interval_s": 0.001, "probe_max_interval_s": 0.001,
                   "idle_drop_s": 5e-324},
                  {"policy": "ttl", "ttl_s": 5e-324, "strikes": 1_000_000},
                  {"policy": "circuit_breaker", "failures": 1, "window_s": 5e-324,
                   "cooldown_s": 5e-324, "trials": 1_000_000, "backoff": 1000.0,
                   "max_cooldown_s": 1e7},
                  {"policy": "strikes_window", "strikes": 1, "window_s": 1e7, "ttl_s": 5e-324}],
    "faults": [[{"kind": "nic_flaps", "at_s": 0.0, "flaps": 1_000_000, "every_s": 0.001,
                 "down_s": 5e-324}],
               [{"kind": "nic_degraded", "at_s": 0.0, "duration_s": 1e7,
                 "bandwidth_fraction": 1e-9}],
               [{"kind": "partition", "at_s": 0.0, "duration_s": 5e-324,
                 "heartbeat_interval_s": 0.001, "heartbeat_misses": 1}],
               [{"kind": "transfer_errors", "probability": 5e-324, "from_s": 0.0}],
               [{"kind": "decode_crash", "at_s": 0.0, "restart_after_s": 5e-324}],
               [{"kind": "decode_hang", "at_s": 0.0, "duration_s": 1e7}]],
}
EVAL_BOUNDS = {"sdk_backoff_s": [0.0, 1e7], "tries": [30], "sdk_retries": [30],
               "max_tokens": [1, 10_000_000], "threads": [1, 100_000]}


GROUPS: dict[str, list[str]] = {}  # BOUNDS' keys by section (their products underflow together)
for _key in BOUNDS:
    GROUPS.setdefault(_key.rpartition(".")[0] or _key, []).append(_key)


def _colocated_key(key: str) -> str | None:
    """A BOUNDS key as it applies to a colocated fleet: a decode server's keys on the
    colocated servers; none of the transfer or PD-only ones."""
    if key.startswith(("transfer.", "fleet.prefill.", "faults", "blacklist")):
        return None
    if key.startswith("fleet.decode."):
        return "fleet.colocated." + key.removeprefix("fleet.decode.")
    return key


def at_bound(draw, d: dict, pd_fleet: bool = True) -> None:
    """Set keys of one section of ``d`` (or of its eval client) to values at schema bounds:
    each of the section's keys with probability 1/2, at least one (values of one section
    combine: gemm_eff and bf16_tflops of 1e-300 each make a peak of 0 FLOP/s)."""
    evals_ = [c for c in d["clients"] if c["kind"] == "eval"]
    if evals_ and draw(st.integers(0, 5)) == 0:
        for key in draw(st.lists(st.sampled_from(sorted(EVAL_BOUNDS)), min_size=1,
                                 max_size=3)):
            evals_[0][key] = draw(st.sampled_from(EVAL_BOUNDS[key]))
        return
    keys = GROUPS[draw(st.sampled_from(sorted(GROUPS)))]
    chosen = [k for k in keys if draw(st.booleans())] or [keys[0]]
    for key in chosen:
        value = draw(st.sampled_from(BOUNDS[key]))
        if not pd_fleet and (key := _colocated_key(key)) is None:
            continue
        node = d
        parts = key.split(".")
        for part in parts[:-1]:
            node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
        if isinstance(node, dict) and isinstance(node.get(parts[-1]), dict) and \
                "nominal" in node[parts[-1]]:
            continue  # (a declared unknown stays declared)
        node[parts[-1]] = copy.deepcopy(value)


def check_invariants(res: pdsim.Result) -> None:
    req, s = res.requests, res.summary
    # one terminal bucket per request, and what each bucket implies
    assert set(req.status) <= BUCKETS
    assert req.rid.is_unique
    assert (req.generated >= 0).all() and (req.generated <= req.output_len).all(), \
        req[req.generated > req.output_len][["rid", "output_len", "generated"]].to_dict("records")
    done = req[req.status == "completed"]
    assert (done.generated == done.output_len).all() and (done.http_status == 200).all()
    failed = req[req.status == "failed"]
    # (a request decoding when its decode server crashed, or that ran out of memory alone in
    # its batch, streamed tokens before the break)
    assert (failed.reason != "").all()
    assert (failed[~failed.reason.isin(["decode_crashed", "decode_out_of_memory"])]
            .generated == 0).all()
    m = res.measured
    assert s["requests"] == len(m)
    assert s["failed"] + s["unfinished"] + int((m.status == "completed").sum()) == len(m)
    # KV pages within capacity; nothing held once every request has resolved
    for name, pool in res.kv_pools.items():
        assert 0 <= pool["used"] <= pool["capacity"] and pool["peak"] <= pool["capacity"], name
    # dead rooms (decode slots held by rooms that cannot complete, issue 26): each freed at
    # most once, never more at once than the decode slots, and what is held at the end is
    # what the summary says is held
    ev = res.events
    dead, freed = ev[ev.event == "dead_room"], ev[ev.event == "dead_room_freed"]
    assert not dead.duplicated(["component", "rank", "rid"]).any()
    assert not freed.duplicated(["component", "rank", "rid"]).any()
    assert set(zip(freed.component, freed["rank"], freed.rid, strict=True)) <= set(
        zip(dead.component, dead["rank"], dead.rid, strict=True))
    inc = s.get("incident")
    held_at_end = inc["dead_rooms_at_end"] if inc else 0
    dc = res.scenario.fleet.decode
    if inc and res.scenario.fleet.mode != "colocated":  # (no dead rooms there)
        from pdsim.model.memory import running_limits

        n = running_limits(res.scenario)["decode"]
        assert inc["dead_rooms_max"] <= dc.servers * dc.dp * (n + dc.extra_slots(n))
    assert held_at_end == len(dead) - len(freed)
    if req.status.isin(["completed", "failed"]).all():
        # a failed room's prefill runs to its last chunk (SGLang does not stop it): one cut
        # by the end of the run still holds its pages; prefix-cache blocks may stay too. A
        # crashed decode answers its clients at once while the prefill keeps their rooms until
        # its write to the dead session (or the bootstrap timeout) fails them: the run ends
        # when the clients are done, so prefill pages may still be held then
        # (started: its first chunk may be in the forward still, nothing committed yet)
        cut = (req.t_prefill_start.notna()
               & (req.prefill_tokens < req.input_len - req.cached_tokens)).any()
        crashed = any(f.kind == "decode_crash" for f in res.scenario.faults)
        fleet = res.scenario.fleet
        # (a room's prefill and decode sides conclude apart: a prefill may still be writing
        # the KV of a request its decode already failed, before 0.5.13 without hearing of it,
        # when the run ends; a dead room still held keeps its decode pages)
        failed_any = (req.status != "completed").any()
        quiet = (not cut and not crashed and not fleet.prefill.prefix_cache
                 and not failed_any and not held_at_end)
        # a colocated rank holds nothing but its radix cache's blocks
        held = fleet.mode == "colocated" and not fleet.colocated.prefix_cache
        for name, pool in res.kv_pools.items():
            # (a dead room still held at the end, a deferred release waiting for its
            # ABORT_ACK, keeps its pages)
            if (name.startswith("decode") and not held_at_end) or quiet or held:
                assert pool["used"] == 0, (name, pool)
    # a prompt is cut between two forwards only as its rank's chunked request, one a rank:
    # when the run ends (faults aside: a crash drops the chunked slot), at most one unfinished
    # request a prefilling rank is part-prefilled (one in no queue would never finish;
    # ColocatedRank.abort and Fleet.check_held assert it in the engine). (A colocated
    # request retracted and prefilled again counts its tokens twice: left out.)
    if not res.scenario.faults:
        again = ev[ev.event == "retract"].rid.unique()
        part = req[(req.status == "unfinished") & (req.prefill_tokens > 0)
                   & (req.prefill_tokens < req.input_len - req.cached_tokens)
                   & ~req.rid.isin(again)]
        colocated = res.scenario.fleet.mode == "colocated"
        by_rank = part.groupby(["d_server", "d_rank"] if colocated else ["p_server", "p_rank"])
        assert (by_rank.size() <= 1).all(), part[["rid", "prefill_tokens", "input_len"]]
    ts = res.timeseries
    for col in ("prefill_kv_used", "decode_kv_used"):
        assert ((ts[col] >= 0) & (ts[col] <= 1)).all()
    # time only moves forward
    assert np.all(np.diff(res.events.time.to_numpy()) >= 0)
    assert np.all(np.diff(ts.time.to_numpy()) > 0)
    # every prompt accounted for; the time series' totals are the table's, closed at the end
    check_accounting(res)
    fin = req[req.status.isin(["completed", "failed"])]
    assert (fin.t_done >= fin.t_arrival).all()
    first = fin[fin.generated > 0]
    assert (first.t_first_token >= first.t_arrival).all()
    assert (first.t_done >= first.t_first_token).all()
    # token sums: summary = records = the fleet's counter
    assert s["total_generated_tokens_true"] == int(m.generated.sum())
    assert s["tokens_generated_fleet"] == int(req.generated.sum())


def _tables(res: pdsim.Result) -> dict:
    out = {k: v for k, v in res.summary.items() if k != "sim_wall_s"}
    return {"summary": json.dumps(out, sort_keys=True, default=str),
            "requests": res.requests.to_csv(index=False),
            "events": res.events.to_csv(index=False),
            "timeseries": res.timeseries.to_csv(index=False)}


@PROFILE
@given(scenarios())
def test_random_scenarios_keep_the_invariants(d):
    if not _valid(d):  # (a field at a bound may make it invalid: run refuses it alike)
        return
    with watch_ends() as watch:
        res = pdsim.run(d)
    assert watch.ended_twice() == {}  # one request, one end
    check_invariants(res)
    # a progress bar never changes what is simulated
    assert _tables(pdsim.run(d, progress=True)) == _tables(res)
    # nor does recording the steps, which turns the shortcuts off: lockstep groups commit
    # every rank at each span end (no owed steps) and a write's end always takes its own link
    assert _tables(pdsim.run(d, record_steps=True)) == _tables(res)
    # nor does the run-now rule (pdsim.engine.clock: a zero-delay link that is the last act of its
    # step, with nothing else due this instant, runs at once): with it off, every such link is
    # queued and processed as the event it stands for would have been
    assert _tables(_without_run_now(d)) == _tables(res)


@settings(PROFILE, max_examples=30)
@given(colocated_scenarios())
def test_random_colocated_scenarios_keep_the_invariants(d):
    test_random_scenarios_keep_the_invariants.hypothesis.inner_test(d)


def _valid(d: dict) -> bool:
    """Whether validate accepts ``d``; if not, run refuses it with the same one line."""
    try:
        pdsim.load(d)
    except pdsim.ScenarioError as err:
        try:
            pdsim.run(d)
        except pdsim.ScenarioError as again:
            assert str(again) == str(err) and "\n" not in str(err), (str(err), str(again))
        else:
            raise AssertionError(f"validate refused ({err}) and run ran") from None
        return False
    return True


def _without_run_now(d: dict) -> pdsim.Result:
    """Run ``d`` as if something else were always due this instant (pdsim.engine.clock's run-now
    rule never applies: every caller of ``Environment.due_now`` takes its link path)."""
    from pdsim.engine import clock

    due_now = clock.Environment.due_now
    clock.Environment.due_now = lambda self: True
    try:
        return pdsim.run(d)
    finally:
        clock.Environment.due_now = due_now


@settings(max_examples=1, deadline=None, derandomize=True, database=None)
@given(st.tuples(scenarios(), colocated_scenarios()))
def test_random_scenarios_are_byte_identical_across_processes(tmp_path_factory, pair):
    """Two random scenarios (a PD fleet, a colocated one), each run in two processes with
    different hash seeds."""
    from conftest import ROOT

    assume(all(_valid(d) for d in pair))
    tmp = tmp_path_factory.mktemp("det")
    (tmp / "s.json").write_text(json.dumps(pair))
    code = ("import json, sys, pdsim\n"
            "for i, d in enumerate(json.load(open(sys.argv[1]))):\n"
            "    pdsim.run(d).write(f'{sys.argv[2]}/{i}')")
    outs = []
    for hashseed in ("0", "9876"):
        out = tmp / hashseed
        env = dict(os.environ, PYTHONHASHSEED=hashseed)
        subprocess.run([sys.executable, "-c", code, str(tmp / "s.json"), str(out)], check=True,
                       env=env, cwd=ROOT, timeout=300, capture_output=True)  # (its paths)
        outs.append({str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*"))
                     if p.is_file()})
    assert outs[0] == outs[1] and "0/requests.csv" in outs[0] and "1/requests.csv" in outs[0]

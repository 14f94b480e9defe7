"""Golden output hashes: every shipped scenario (at its seed and one more) and a few small cases
that reach the mechanisms the shipped scenarios do not (faults, probes, router timeouts,
retraction, other flush handlers), hashed table by table.

Why: optimising the hot path must not move a single output byte. The test
(tests/test_golden.py) reruns every case and compares its hashes with tests/golden.json.

    python tests/golden.py              # check (also the uncut long runs pytest skips)
    python tests/golden.py --update     # re-record every case (after a legitimate model change)
    python tests/golden.py --update healthy@1 small_faults@7   # re-record only these

A commit that legitimately changes outputs re-records the hashes in its own commit and says in
its message why the outputs moved. Hashed: the requests, events, time-series and answers
tables (CSV at full float precision), the flush calls, the KV pools and the summary. Not
hashed: performance metrics (the summary's SimPy ``events`` count, wall time), which an
optimisation is meant to change.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import sys
from pathlib import Path

import pdsim

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "scenarios"
GOLDEN = Path(__file__).with_name("golden.json")
PERFORMANCE_FIELDS = ("events",)  # summary keys that measure the simulator, not the model
# shipped scenarios too long for the test suite run cut short there (as tests/test_invariants.py
# does); their full runs are extra cases that `python tests/golden.py` checks but pytest does not
SHORTEN = {"trace_replay": ["clients.0.num_prompts=600"],
           "whatif_base": ["clients.0.num_prompts=400"]}


def _small(**over) -> dict:
    """A small fleet (2 DP ranks per role, DP attention) the extra cases vary."""
    d = {
        "name": "golden_small", "seed": 7, "horizon_s": 900,
        "fleet": {
            "gpu": "H20", "model": "dsv3-ci-test",
            "prefill": {"dp": 2, "tp": 2, "dp_attention": True, "balance": "total_tokens",
                        "chunked_prefill_size": 4096},
            "decode": {"dp": 2, "tp": 2, "dp_attention": True, "balance": "total_tokens"},
        },
        "clients": [{"kind": "bench", "num_prompts": 200, "max_concurrency": 64,
                     "dataset": {"kind": "random", "input_len": 2048, "output_len": 128}}],
    }
    d.update(copy.deepcopy(over))
    return d


def _colocated(**over) -> dict:
    """A small colocated fleet (two servers of two DP ranks) the colocated cases vary."""
    d = {
        "name": "golden_colocated", "seed": 7, "horizon_s": 900,
        "fleet": {"gpu": "H20", "model": "dsv3-ci-test", "mode": "colocated",
                  "colocated": {"servers": 2, "dp": 2, "tp": 2, "balance": "total_tokens",
                                "chunked_prefill_size": 4096}},
        "router": {"policy": "round_robin"},
        "clients": [{"kind": "bench", "num_prompts": 200, "max_concurrency": 64,
                     "dataset": {"kind": "random", "input_len": 2048, "output_len": 128}}],
    }
    d.update(copy.deepcopy(over))
    return d


# Mechanisms the shipped scenarios leave unexercised. Keep each case well under a second.
EXTRA: dict[str, dict] = {
    # colocated: DP attention in lockstep with mixed chunk, prefill-first steps, an eval
    "colocated_dp_attention": _colocated(
        fleet={"gpu": "H20", "model": "dsv3-ci-test", "mode": "colocated",
               "colocated": {"servers": 1, "dp": 2, "tp": 2, "dp_attention": True,
                             "enable_mixed_chunk": True, "chunked_prefill_size": 2048}},
        clients=[{"kind": "bench", "num_prompts": 200, "request_rate": 15.0,
                  "dataset": {"kind": "random", "input_len": 3000, "output_len": 200,
                              "range_ratio": 0.2}},
                 {"kind": "eval", "questions": 30, "threads": 4,
                  "dataset": {"kind": "random", "input_len": 300, "output_len": 64}}]),
    # colocated under KV pressure: admission by the new-token ratio, retraction and
    # recompute, pages of 16 tokens; the 0.5.1 retraction rule; least-load routing
    "colocated_pressure": _colocated(
        engine={"version": "0.5.1.post1"}, router={"policy": "least_load"},
        fleet={"gpu": "H20", "model": "dsv3-ci-test", "mode": "colocated",
               "colocated": {"servers": 2, "dp": 1, "tp": 2, "kv_pool_tokens": 20000,
                             "page_size": 16, "schedule_conservativeness": 0.3}},
        clients=[{"kind": "bench", "num_prompts": 200, "max_concurrency": 96,
                  "dataset": {"kind": "random", "input_len": 256, "output_len": 1024}}]),
    # colocated faults and timeouts: a crash and restart, a hang, a flush race, router
    # timeouts aborting requests; radix cache off (exact admission), random routing
    "colocated_faults": _colocated(
        router={"policy": "random", "request_timeout_s": 3.0},
        fleet={"gpu": "H20", "model": "dsv3-ci-test", "mode": "colocated",
               "colocated": {"servers": 2, "dp": 2, "tp": 2, "prefix_cache": False,
                             "kv_pool_tokens": 30000}},
        faults=[{"preset": "decode_crash", "at_s": 2.0, "restart_after_s": 3.0},
                {"preset": "decode_hang", "decode_server": 1, "at_s": 6.0, "duration_s": 2.0},
                {"preset": "flush_race", "at_s": 9.0}],
        clients=[{"kind": "bench", "num_prompts": 300, "request_rate": 20.0,
                  "dataset": {"kind": "random", "input_len": 2048, "output_len": 128}}]),
    # open-loop Poisson stream, prefix blocks shared by nothing, two servers per role
    "small_poisson": _small(
        fleet={"gpu": "H20", "model": "dsv3-ci-test",
               "prefill": {"servers": 2, "dp": 2, "tp": 2, "dp_attention": True,
                           "balance": "round_robin", "chunked_prefill_size": 2048},
               "decode": {"servers": 2, "dp": 2, "tp": 2, "dp_attention": True,
                          "balance": "follow_bootstrap_room"}},
        clients=[{"kind": "bench", "num_prompts": 300, "request_rate": 12.0,
                  "dataset": {"kind": "random", "input_len": 3000, "output_len": 200,
                              "range_ratio": 0.2, "output_distribution": "geometric"}}]),
    # faults: a decode down, a partition with heartbeats, random write errors; probing blacklist
    "small_faults": _small(
        blacklist={"strikes": 2, "policy": "probe", "probe_interval_s": 3.0},
        transfer={"transfer_timeout_s": 2.0},
        faults=[{"kind": "decode_unreachable", "decode_rank": 1, "at_s": 3.0, "duration_s": 6.0},
                {"kind": "partition", "prefill_server": 0, "at_s": 14.0, "duration_s": 8.0,
                 "heartbeat_interval_s": 2.0},
                {"kind": "transfer_errors", "probability": 0.05, "from_s": 1.0, "to_s": 30.0}],
        clients=[{"kind": "bench", "num_prompts": 400, "request_rate": 15.0,
                  "max_concurrency": 64,
                  "dataset": {"kind": "random", "input_len": 2048, "output_len": 128}}]),
    # 0.5.23 blacklist, sgl-model-gateway fan-out, reject_if_busy, operator flushes under load
    "small_gateway": _small(
        blacklist={"policy": "v0_5_23", "probe_interval_s": 2.0, "idle_drop_s": 20.0},
        router={"flush_handler": "model_gateway", "worker_timeout_s": 0.5},
        flush={"semantics": "reject_if_busy"},
        operator_flushes=[{"at_s": 2.0}, {"at_s": 4.0, "timeout_s": 1.0}, {"at_s": 9.0}],
        clients=[{"kind": "bench", "num_prompts": 300, "max_concurrency": 48,
                  "flush": {"mode": "timeout", "timeout_s": 5.0},
                  "dataset": {"kind": "random", "input_len": 2048, "output_len": 128}},
                 {"kind": "bench", "name": "second", "start_s": 3.0, "num_prompts": 100,
                  "request_rate": 30.0, "flush": {"mode": "bare"},
                  "dataset": {"kind": "random", "input_len": 1024, "output_len": 64}}]),
    # the experimental rust router (a ?timeout= it does not forward), raise_for_status,
    # skip_idle_check
    "small_rust_router": _small(
        router={"flush_handler": "rust_router", "fanout_concurrency": 2},
        # (both within the run, which ends near 4.9 s: a flush at 5 s never happened)
        operator_flushes=[{"at_s": 3.0}, {"at_s": 3.5, "timeout_s": 0.2}],
        clients=[{"kind": "bench", "num_prompts": 200, "max_concurrency": 64,
                  "dataset": {"kind": "random", "input_len": 2048, "output_len": 128}},
                 {"kind": "bench", "name": "strict", "start_s": 2.0, "num_prompts": 50,
                  "flush": {"mode": "raise_for_status"},
                  "dataset": {"kind": "random", "input_len": 512, "output_len": 32}}]),
    # memory pressure: decode retraction and re-admission, pages of 16 tokens, no lockstep
    "small_pressure": _small(
        fleet={"gpu": "H20", "model": "dsv3-ci-test",
               "prefill": {"dp": 2, "tp": 2, "dp_attention": True, "lockstep": False,
                           "balance": "total_tokens", "chunked_prefill_size": 4096,
                           "page_size": 16},
               "decode": {"dp": 2, "tp": 2, "dp_attention": True, "lockstep": False,
                          "balance": "round_robin", "page_size": 16,
                          "kv_pool_tokens": 30000, "num_reserved_decode_tokens": 32}},
        clients=[{"kind": "bench", "num_prompts": 200, "max_concurrency": 96,
                  "dataset": {"kind": "random", "input_len": 1024, "output_len": 512}}]),
    # the fault library on two decode servers: crash and restart, hang, NIC flaps, degraded
    # NIC, flush race; a circuit breaker with half-open trials
    "small_library": _small(
        blacklist={"policy": "circuit_breaker", "failures": 2, "cooldown_s": 1.0},
        transfer={"transfer_timeout_s": 2.0},
        fleet={"gpu": "H20", "model": "dsv3-ci-test",
               "prefill": {"dp": 2, "tp": 2, "dp_attention": True, "balance": "total_tokens",
                           "chunked_prefill_size": 4096},
               "decode": {"servers": 2, "dp": 2, "tp": 2, "dp_attention": True,
                          "balance": "total_tokens"}},
        faults=[{"preset": "decode_crash", "at_s": 2.0, "restart_after_s": 3.0},
                {"preset": "decode_hang", "decode_server": 1, "at_s": 7.0, "duration_s": 3.0},
                {"preset": "nic_flaps", "at_s": 11.0, "flaps": 2, "every_s": 2.0,
                 "down_s": 1.0},
                {"preset": "nic_degraded", "at_s": 15.0, "duration_s": 2.0},
                {"preset": "flush_race", "at_s": 18.0}],
        clients=[{"kind": "bench", "num_prompts": 300, "request_rate": 15.0,
                  "dataset": {"kind": "random", "input_len": 2048, "output_len": 64}}]),
    # timeouts everywhere: router, bootstrap, waiting; a decode that stays down; roofline
    "small_timeouts": _small(
        router={"request_timeout_s": 2.0},
        blacklist={"policy": "probe", "probe_interval_s": 1.0},
        transfer={"bootstrap_timeout_s": 0.45, "waiting_timeout_s": 0.9,
                  "transfer_timeout_s": 3.0},
        predictor={"kind": "roofline"},
        faults=[{"kind": "decode_unreachable", "decode_rank": 0, "at_s": 1.0,
                 "duration_s": 2.0}],
        fleet={"gpu": "H20", "model": "dsv3-ci-test",
               "prefill": {"dp": 2, "tp": 2, "dp_attention": True, "balance": "total_tokens",
                           "chunked_prefill_size": 4096, "kv_pool_tokens": 40000},
               "decode": {"dp": 2, "tp": 2, "dp_attention": True, "balance": "total_tokens",
                          "max_running_requests": 24}},
        clients=[{"kind": "bench", "num_prompts": 200, "request_rate": 40.0,
                  "dataset": {"kind": "random", "input_len": 2048, "output_len": 256}},
                 {"kind": "eval", "questions": 60, "threads": 8, "start_s": 0.5,
                  "dataset": {"kind": "random", "input_len": 400, "output_len": 64}}]),
    # no hop latency, no call latency: clients, flushes and ranks meet in the same instants
    # (a warmup finishing as a waiting flush finds its rank idle; dispatches beside fan-outs)
    "small_no_hops": _small(
        router={"http_latency_ms": 0.0, "flush_handler": "mini_lb_fixed"},
        transfer={"call_latency_ms": 0.0, "bootstrap_timeout_s": 2.0, "waiting_timeout_s": 2.0},
        operator_flushes=[{"at_s": 1.5, "timeout_s": 0.5}, {"at_s": 4.0}],
        clients=[{"kind": "bench", "name": "warm", "start_s": 1.0, "num_prompts": 120,
                  "warmup_requests": 2, "max_concurrency": 16,
                  "flush": {"mode": "raise_for_status"},
                  "dataset": {"kind": "random", "input_len": 1024, "output_len": 64}},
                 {"kind": "eval", "questions": 40, "threads": 4,
                  "dataset": {"kind": "random", "input_len": 300, "output_len": 32}},
                 {"kind": "bench", "name": "open", "num_prompts": 80, "request_rate": 20.0,
                  "warmup_requests": 0,
                  "dataset": {"kind": "random", "input_len": 2048, "output_len": 128}}]),
    # Ties across components, built on purpose (review of speed round 4): SimPy's order at
    # one instant decides. A long prompt's router timeout falls exactly when its last prefill
    # chunk goes to the transfer queue: the abort comes first and the woken worker skips the
    # chunk (taking it at the submit wrote it, holding the queue for 196 requests behind it).
    "tie_abort_at_submit": {
        "name": "tie_abort_at_submit", "seed": 7, "horizon_s": 900,
        "router": {"request_timeout_s": 0.24702289134102706},  # dispatch -> last chunk
        "transfer": {"queues_per_rank": 1},
        "fleet": {"gpu": "H20", "model": "dsv3-ci-test",
                  "prefill": {"dp": 1, "tp": 2, "chunked_prefill_size": 2048},
                  "decode": {"dp": 1, "tp": 2}},
        "clients": [{"kind": "bench", "name": "long", "num_prompts": 1, "request_rate": "inf",
                     "warmup_requests": 0,
                     "dataset": {"kind": "random", "input_len": 8000, "output_len": 8}},
                    {"kind": "bench", "name": "short", "num_prompts": 200, "request_rate": 400.0,
                     "warmup_requests": 0,
                     "dataset": {"kind": "random", "input_len": 64, "output_len": 4}}]},
    # a decode crash exactly at the router timeout of requests dispatched together: the
    # timeouts fire before the crash's answers are heard, so the hops back (and the eval
    # threads' retries) go in router-deadline order (starting each hop back in the answering
    # step put them in the crashed ranks' order)
    "tie_timeout_at_crash": _small(
        router={"request_timeout_s": 2.0, "http_latency_ms": 0.5},
        faults=[{"preset": "decode_crash", "at_s": 2.0005, "restart_after_s": 0.5}],
        clients=[{"kind": "eval", "questions": 24, "threads": 8,
                  "dataset": {"kind": "random", "input_len": 300, "output_len": 512}}]),
    # a process started at the instant a zero-delay link is pending (review of speed round 9,
    # minimised from a fuzz case): the operator flush at t=2 starts URGENT processes while the
    # hung decode's router-timeout path has a link queued, and SimPy runs urgent events first.
    # pdsim.engine.clock keeps this instant's links in a FIFO beside the heaps; with its front check
    # ignoring the SimPy queue's URGENT entries, this case's events and requests move
    "tie_start_at_link": {
        "name": "tie_start_at_link", "seed": 1, "horizon_s": 3,
        "fleet": {"gpu": "H20", "model": "dsv3-ci-test",
                  "prefill": {"dp": 1, "tp": 2, "chunked_prefill_size": 1024},
                  "decode": {"dp": 1, "tp": 2, "balance": "total_tokens"}},
        "clients": [{"kind": "eval", "questions": 1, "threads": 1, "start_s": 1,
                     "dataset": {"kind": "random", "input_len": 100, "output_len": 2}}],
        "faults": [{"preset": "decode_hang", "at_s": 1, "duration_s": 1000,
                    "kv_writes": "land"}],
        "operator_flushes": [{"at_s": 2}],
        "router": {"http_latency_ms": 1, "request_timeout_s": 1}},
}


def shipped() -> list[Path]:
    return sorted(SCENARIOS.rglob("*.yaml"))


def cases(full: bool = True) -> dict[str, tuple]:
    """name@seed -> (scenario source, --set overrides): shipped scenarios at their own seed
    and the next one, then the extra cases at their seed; with ``full``, also the uncut runs
    of the shortened scenarios (``name:full@seed``), which pytest leaves to this script."""
    out: dict[str, tuple] = {}
    for path in shipped():
        seed = pdsim.load(path).seed
        rel = path.relative_to(SCENARIOS).with_suffix("").as_posix()
        cut = SHORTEN.get(rel, [])
        for s in (seed, seed + 1):
            sets = [] if s == seed else [f"seed={s}"]
            out[f"{rel}@{s}"] = (path, cut + sets)
            if cut and full:
                out[f"{rel}:full@{s}"] = (path, sets)
    for name, d in EXTRA.items():
        out[f"{name}@{d['seed']}"] = (d, [])
    return out


def _sha(data: str) -> str:
    return hashlib.sha256(data.encode()).hexdigest()[:20]


def digest(res: pdsim.Result) -> dict[str, str]:
    """One hash per output table of a run (performance fields left out)."""
    summary = {k: v for k, v in res.summary.items() if k not in PERFORMANCE_FIELDS}
    return {
        "requests": _sha(res.requests.to_csv(index=False)),
        "events": _sha(res.events.to_csv(index=False)),
        "timeseries": _sha(res.timeseries.to_csv(index=False)),
        "answers": _sha(res.answers.to_csv(index=False)),
        "flush_calls": _sha(json.dumps(res.flush_calls, sort_keys=True, default=str)),
        "kv_pools": _sha(json.dumps(res.kv_pools, sort_keys=True)),
        "summary": _sha(json.dumps(summary, sort_keys=True)),
    }


def compute(name: str) -> dict[str, str]:
    source, sets = cases()[name]
    return digest(pdsim.run(source, sets=sets))


def load() -> dict[str, dict[str, str]]:
    return json.loads(GOLDEN.read_text())["cases"] if GOLDEN.exists() else {}


def save(recorded: dict[str, dict[str, str]]) -> None:
    doc = {"how": "python tests/golden.py --update  (see tests/golden.py)",
           "cases": dict(sorted(recorded.items()))}
    GOLDEN.write_text(json.dumps(doc, indent=1) + "\n")


def moved(name: str, want: dict[str, str]) -> list[str]:
    """Tables of case ``name`` whose hash differs from ``want``."""
    got = compute(name)
    return sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--update", action="store_true", help="re-record the hashes")
    ap.add_argument("names", nargs="*", help="only these cases (default: all)")
    args = ap.parse_args()
    every = cases()
    names = args.names or list(every)
    unknown = [n for n in names if n not in every]
    if unknown:
        print(f"unknown case(s): {', '.join(unknown)}; known: {', '.join(every)}")
        return 2
    recorded = load()
    if args.update:
        keep = {k: v for k, v in recorded.items() if k in every}
        for n in names:
            keep[n] = compute(n)
            print(f"recorded {n}", file=sys.stderr)
        save(keep)
        return 0
    bad = 0
    for n in names:
        if n not in recorded:
            print(f"{n}: no recorded hashes (run python tests/golden.py --update {n})")
            bad += 1
            continue
        tables = moved(n, recorded[n])
        print(f"{n}: {'moved: ' + ', '.join(tables) if tables else 'identical'}")
        bad += bool(tables)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

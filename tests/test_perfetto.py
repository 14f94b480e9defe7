"""Perfetto (Chrome trace-event JSON) export: valid, the expected tracks, instants where and
when the events happened, and recording changes nothing that is simulated."""

from __future__ import annotations

import json

import pytest
from conftest import run_cached

import pdsim
from pdsim.cli.main import main
from pdsim.output import perfetto


@pytest.fixture(scope="module")
def recorded():
    return pdsim.run("scenarios/drop_timeout.yaml", record_steps=True)


@pytest.fixture(scope="module")
def doc(recorded):
    return json.loads(json.dumps(perfetto.trace_events(recorded)))


def _names(doc):
    procs = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): f"{procs[e['pid']]}/{e['args']['name']}"
               for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    return procs, threads


def test_recording_changes_nothing_simulated(recorded):
    plain = run_cached("drop_timeout")
    assert plain.recorder is None and recorded.recorder is not None
    assert recorded.summary == plain.summary  # incl. the SimPy event count: no extra events
    assert recorded.requests.equals(plain.requests)
    assert recorded.events.equals(plain.events)


def test_one_track_per_rank_and_per_nic_queue(doc, recorded):
    procs, threads = _names(doc)
    ranks = {f"{r.split('.')[0]}/{r.split('.')[1]}" for r in recorded.kv_pools}
    assert ranks <= set(threads.values())  # prefill-0/r0 ... decode-0/r3
    nics = {p for p in procs.values() if p.startswith("nic")}
    assert nics == {"nic0", "nic1"}  # H20: 2 GPUs per NIC, 1 GPU per prefill rank
    assert {"router", "fleet"} <= set(procs.values())
    # every step slice sits on a rank track, every write on a NIC queue track
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            where = threads[(e["pid"], e["tid"])]
            assert where.startswith("nic" if e["cat"] == "transfer" else ("prefill", "decode"))
            assert e["dur"] >= 0


def test_slices_account_for_the_run(doc, recorded):
    s = recorded.summary
    _procs, threads = _names(doc)
    steps = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "step"]
    decode = [e for e in steps if e["name"].split()[0] == "decode"]  # "decode x25": a span
    assert sum(e["args"].get("steps", 1) for e in decode) == s["decode_steps"]
    assert sum(e["args"]["tokens"] for e in steps if e["name"] == "prefill") == \
        s["prefill_tokens_computed"]
    # decode tokens = one per request per step, plus the first token each request got with KV
    first = int(recorded.requests.t_first_token.notna().sum())
    assert sum(e["args"]["tokens"] for e in decode) + first == s["tokens_generated_fleet"]
    # a rank runs one step at a time: its slices never overlap
    by_track: dict = {}
    for e in steps:
        by_track.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_track.values():
        spans.sort()
        ends, starts = [b for _a, b in spans[:-1]], [a for a, _b in spans[1:]]
        assert all(s >= e - 1e-3 for e, s in zip(ends, starts, strict=True))


def test_flush_failure_and_blacklist_instants_where_and_when_they_happened(doc, recorded):
    _procs, threads = _names(doc)
    ev = recorded.events
    first = ev[(ev.event == "transfer_failed") & (ev.detail == "flush_freed_pages")].iloc[0]
    hits = [e for e in doc["traceEvents"] if e["ph"] == "i" and e["cat"] == "transfer_failed"
            and e["args"].get("rid") == first.rid]
    assert len(hits) == 1
    assert hits[0]["ts"] == pytest.approx(first.time * 1e6, abs=1e-3)
    assert threads[(hits[0]["pid"], hits[0]["tid"])] == f"{first.component}/r{first['rank']}"
    # the KV write that failed ends at that instant on the NIC track of that rank's queue
    writes = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "transfer"
              and e["args"]["rid"] == first.rid]
    assert writes and writes[-1]["args"]["outcome"] == "flush_freed_pages"
    assert writes[-1]["ts"] + writes[-1]["dur"] == pytest.approx(first.time * 1e6, abs=1e-3)
    cats = {e["cat"] for e in doc["traceEvents"] if e["ph"] == "i"}
    assert {"flush_executed", "blacklist_add", "router_flush"} <= cats
    flushes = [e for e in doc["traceEvents"] if e["ph"] == "i" and e["cat"] == "flush_executed"]
    assert len(flushes) == int((ev.event == "flush_executed").sum())
    kv = [e for e in doc["traceEvents"] if e["ph"] == "C" and e["name"].startswith("KV use r")]
    assert kv and all(0 <= e["args"]["share"] <= 1 for e in kv)


def test_cli_writes_a_trace_perfetto_can_open(tmp_path, capsys):
    path = tmp_path / "t.json"
    assert main(["run", "scenarios/healthy.yaml", "--set", "clients.0.num_prompts=40",
                 "--perfetto", str(path), "--json"]) == 0
    d = json.loads(path.read_text())
    assert isinstance(d["traceEvents"], list) and d["displayTimeUnit"] == "ms"
    for e in d["traceEvents"]:
        assert e["ph"] in {"M", "X", "i", "C"} and isinstance(e["pid"], int)
        if e["ph"] != "M":
            assert isinstance(e["ts"], int | float) and e["ts"] >= 0
    assert "ui.perfetto.dev" in capsys.readouterr().err


def test_a_span_of_steps_is_one_slice_with_its_count():
    """The recorder takes fast-forwarded spans of k identical steps as one slice."""
    from types import SimpleNamespace

    rec = perfetto.Recorder()
    rank = SimpleNamespace(name="decode-0", index=1, role="decode",
                           alloc=SimpleNamespace(used=10, capacity=100))
    rec.step(rank, 1.0, 1.5, (32, 64000, 0), steps=25)
    tracks = perfetto._Tracks()
    (sl,) = perfetto.step_slices(rec, tracks)
    assert sl["name"] == "decode x25" and sl["args"] == {"tokens": 800, "batch": 32, "steps": 25}
    assert (sl["ts"], sl["dur"]) == (1e6, 5e5)

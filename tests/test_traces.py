"""Trace replay in the box: shipped gzip traces, whole-trace default, cut notes, hit rate."""

from __future__ import annotations

import gzip
import json
import re

import pytest
from conftest import SCENARIOS, TRACES, small_fleet

import pdsim
from pdsim.config import trace
from pdsim.engine.client import count_rows, read_trace
from pdsim.output.report import render


def test_gzip_and_plain_traces_read_the_same(tmp_path):
    plain = tmp_path / "synthetic_trace.jsonl"
    plain.write_bytes(gzip.decompress((TRACES / "synthetic_trace.jsonl.gz").read_bytes()))
    gz = read_trace(str(TRACES / "synthetic_trace.jsonl.gz"), None, 1.0, None)
    assert gz == read_trace(str(plain), None, 1.0, None)
    assert len(gz) == count_rows(plain) == 3993  # scenarios/traces/README.md
    assert count_rows(TRACES / "conversation_trace.jsonl.gz") == 12031


def _tiny_trace(path, n=25):
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"timestamp": 200 * i, "input_length": 600, "output_length": 8,
                                "hash_ids": [1, 2 + i % 3]}) + "\n")
    return path


def _trace_fleet(path, **client):
    d = small_fleet()
    d["clients"] = [{"kind": "bench", "request_rate": "trace", "warmup_requests": 0,
                     "dataset": {"kind": "trace", "path": str(path)}, **client}]
    return d


def test_a_trace_replays_every_row_unless_cut_and_says_when_cut(tmp_path, monkeypatch):
    path = _tiny_trace(tmp_path / "t.jsonl")
    whole = pdsim.run(_trace_fleet(path), allow_outside_paths=True)  # a tmp_path trace
    m = whole.summary["clients"]["bench"]
    assert m["requests"] == 25 and (m["trace_rows_replayed"], m["trace_rows"]) == (25, 25)
    assert "Trace rows replayed:" in render(whole) and "all 25" in render(whole)
    cut = pdsim.run(_trace_fleet(path, num_prompts=10), allow_outside_paths=True)
    m = cut.summary["clients"]["bench"]
    assert m["requests"] == 10 and (m["trace_rows_replayed"], m["trace_rows"]) == (10, 25)
    assert "10 of 25 (cut by num_prompts=10)" in render(cut)
    # a cut at one row fewer than the file's, and at exactly its rows (blank lines among them)
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:10]) + "\n  \n" + "".join(lines[10:]))
    real = trace._count_rows
    for n, counted in ((24, True), (25, False)):
        calls = []
        monkeypatch.setattr(trace, "_count_rows",
                            lambda key, calls=calls: calls.append(key) or real(key))
        res = pdsim.run(_trace_fleet(path, num_prompts=n), allow_outside_paths=True)
        m = res.summary["clients"]["bench"]
        assert (m["trace_rows_replayed"], m["trace_rows"]) == (n, 25)
        # a parse cut short has the file counted; one that reached its end counted its rows
        assert bool(calls) is counted
    # a random dataset keeps bench_serving's default of 1000 prompts
    assert pdsim.load(small_fleet(clients=[{"kind": "bench"}])).clients[0].num_prompts == 1000


def test_prefix_cache_hit_rate_is_reported_and_needs_the_cache(tmp_path):
    path = _tiny_trace(tmp_path / "t.jsonl")
    on = pdsim.run(_trace_fleet(path), allow_outside_paths=True)
    rate = on.summary["prefix_cache_hit_rate"]
    # every prompt starts with block 1 (512 tokens of 600); later ones also repeat block 2+i%3
    assert 0.5 < rate < 1.0
    assert on.summary["clients"]["bench"]["prefix_cache_hit_rate"] == rate
    assert "Prefix cache hit rate (prompt tokens):" in render(on)
    d = _trace_fleet(path)
    d["fleet"]["prefill"]["prefix_cache"] = False
    assert pdsim.run(d, allow_outside_paths=True).summary["prefix_cache_hit_rate"] == 0.0


def test_trace_path_is_relative_to_the_scenario_file(tmp_path, monkeypatch):
    import yaml

    (tmp_path / "sub").mkdir()
    _tiny_trace(tmp_path / "sub" / "t.jsonl", n=5)
    d = _trace_fleet("t.jsonl")
    (tmp_path / "sub" / "s.yaml").write_text(yaml.safe_dump(d))
    monkeypatch.chdir(tmp_path)  # not where the trace is
    assert pdsim.run(tmp_path / "sub" / "s.yaml").summary["requests"] == 5


def test_shipped_trace_replay_scenario_replays_the_conversation_trace():
    sc = pdsim.load(SCENARIOS / "trace_replay.yaml")
    c = sc.clients[0]
    assert c.dataset.kind == "trace" and c.num_prompts is None  # the whole trace by default
    assert c.dataset.path.endswith("conversation_trace.jsonl.gz")
    res = pdsim.run(sc, sets=["clients.0.num_prompts=200"])
    m = res.summary["clients"]["conversation"]
    assert (m["trace_rows_replayed"], m["trace_rows"]) == (200, 12031)
    assert m["failed"] == 0 and m["unfinished"] == 0
    assert res.measured.t_arrival.max() == pytest.approx(
        read_trace(c.dataset.resolved_path, 200, 1.0, None)[-1]["t"], abs=1e-6)


def test_trace_lines_scanned_directly_read_as_decoded_line_by_line(tmp_path):
    """trace._parse scans a plain line without json's per-line decode; any line it cannot
    take that way goes through trace._row. Either way a line's row, or its error, is what
    decoding that line alone gives (leading/trailing whitespace, a BOM, two values, non-JSON
    whitespace, floats and bools as counts, blank lines)."""
    from pdsim.config import trace

    ok = '{"timestamp": 5, "input_length": 7, "output_length": 2, "hash_ids": [1, 2]}'
    lines = [ok, "  " + ok, ok + " \t\r", "", "   ", '{"timestamp": 1.5, "input_length": 3.9,'
             ' "output_length": 1}', '{"timestamp": 0, "input_length": 10000001, '
             '"output_length": 1}', '{"timestamp": 0, "input_length": true, "output_length": 1}',
             ok + " " + ok, ok + "\x0c", "\ufeff" + ok, "[1, 2]", ok + "]", '{"timestamp": NaN}']
    for line in lines:
        path = tmp_path / "t.jsonl"
        path.write_bytes((line + "\n" + ok + "\n").encode())
        trace._parse.cache_clear()
        try:
            want = ([trace._row(line.encode())] if line.strip() else []) + [trace._row(ok.encode())]
        except trace._Bad as err:
            with pytest.raises(trace.TraceError, match=f"line 1: {re.escape(str(err))}$"):
                trace._parse(trace._key(path), 10)
            continue
        assert list(trace._parse(trace._key(path), 10)) == want, line


def _one_arrival_a_step(self):
    """BenchClient.tick as it was before same-instant arrivals shared a step: each prompt's
    arrival is a heap entry of its own (the reference)."""
    k = self._later[self._next_timer]
    self._next_timer += 1
    self._arm_next()
    if not self._limited or self._take_slot(k):
        if self.env.due_now():
            self._sender(k)
        else:
            self._send(k)


@pytest.mark.parametrize("client", [{}, {"max_concurrency": 3}])
def test_prompts_arriving_at_one_instant_arrive_in_one_step(tmp_path, monkeypatch, client):
    """Trace rows sharing a timestamp arrive in the first one's step (BenchClient.tick): the
    same outputs as one heap entry per arrival, with one entry per instant instead."""
    from golden import digest

    from pdsim.engine.client import BenchClient

    path = tmp_path / "t.jsonl"
    stamps = [0, 0, 150, 150, 150, 151, 400, 400, 400, 400, 401, 900, 900]
    with open(path, "w") as f:
        for i, ts in enumerate(stamps):
            f.write(json.dumps({"timestamp": ts, "input_length": 700 + 50 * i,
                                "output_length": 6, "hash_ids": [1, 2 + i % 4]}) + "\n")
    shared = pdsim.run(_trace_fleet(path, **client), allow_outside_paths=True)
    monkeypatch.setattr(BenchClient, "tick", _one_arrival_a_step)
    apart = pdsim.run(_trace_fleet(path, **client), allow_outside_paths=True)
    assert digest(shared) == digest(apart)
    assert shared.summary["completed_requests"] == len(stamps)
    # arrivals after the first instant's (those go out at the start): 11 timers before,
    # one per later instant now (150, 151, 400, 401, 900)
    assert apart.sim_entries - shared.sim_entries == 11 - 5


@pytest.mark.parametrize("client", [{}, {"max_concurrency": 2}])
def test_rows_out_of_time_order_arrive_in_time_order(tmp_path, client):
    """A trace whose rows are not in time order replays as the same rows sorted by time (a
    stable sort: rows of one timestamp keep their order), with times from the earliest row
    (not the first: SGLang's bench_serving sorts a Mooncake trace and starts at its earliest
    timestamp), as one timeout per prompt made at the start did: BenchClient arms its one
    arrival timer at a time in that order. (Armed in row order, the clock went back: a row
    due before one that arrived already came after it.)"""
    from golden import digest

    stamps = [150, 5500, 3300, 3300, 0, 5500, 400, 150, 0, 3300]
    rows = [{"timestamp": ts, "input_length": 700 + 50 * i, "output_length": 4 + i % 3,
             "hash_ids": [1, 2 + i % 4]} for i, ts in enumerate(stamps)]
    paths = []
    for name, order in (("rows", rows), ("sorted", sorted(rows, key=lambda r: r["timestamp"]))):
        paths.append(tmp_path / f"{name}.jsonl")
        paths[-1].write_text("".join(json.dumps(r) + "\n" for r in order))
    shuffled, by_time = (pdsim.run(_trace_fleet(p, **client), allow_outside_paths=True)
                         for p in paths)
    assert digest(shuffled) == digest(by_time)
    arrived = shuffled.requests.sort_values("rid")
    assert arrived.t_arrival.is_monotonic_increasing
    assert arrived.input_len.tolist() == [r["input_length"] for r in
                                          sorted(rows, key=lambda r: r["timestamp"])]
    assert arrived.t_arrival.tolist()[-1] - arrived.t_arrival.tolist()[0] == pytest.approx(5.5)


def test_trace_block_ids_stay_below_the_random_prompts_ids():
    """A trace's prefix block ids must be 0..HASH_ID_LIMIT - 1: pdsim.engine.client numbers random
    prompts' blocks from HASH_ID_LIMIT up, and the prefix cache keeps those as private runs,
    so a trace block with one of their ids would be counted twice (review 7)."""
    from pdsim.config import trace

    def row(ids):
        return trace._check({"timestamp": 0, "input_length": 9, "output_length": 1,
                             "hash_ids": ids})

    assert row([0, trace.HASH_ID_LIMIT - 1])[3] == (0, trace.HASH_ID_LIMIT - 1)
    for ids in ([trace.HASH_ID_LIMIT], [3, -1], [1 << 80]):
        with pytest.raises(trace._Bad, match="'hash_ids' must be integers 0..1,099,511,627,775"):
            row(ids)


def test_a_trace_of_blank_lines_is_refused_by_its_line_count_in_bounded_time(tmp_path):
    """The byte limits bound a trace's bytes, not its lines: gzip packs 256 MB of newlines
    into ~250 KB, and reading them one by one took minutes (validate spun > 600 s; found by
    the hostile-input hunt). A file of more than MAX_TRACE_LINES lines, blank ones included,
    is refused in about a second, also when num_prompts cuts it (the client counts it to its
    end, so load does); blank lines below the limit are skipped as before."""
    import time

    row = b'{"timestamp": 0, "input_length": 5, "output_length": 5}\n'
    for blank in (b"\n", b" \t\r\n"):
        path = tmp_path / "bomb.jsonl.gz"
        path.write_bytes(gzip.compress(row + blank * trace.MAX_TRACE_LINES, 1))
        for client in ({}, {"num_prompts": 1}):
            trace._parse.cache_clear()
            trace._count_rows.cache_clear()
            t0 = time.process_time()
            with pytest.raises(pdsim.ScenarioError) as err:
                pdsim.load(_trace_fleet(path, **client), allow_outside_paths=True)
            assert time.process_time() - t0 < 10
            assert str(err.value) == (
                f"invalid value at 'clients.0.dataset.path': trace file {path} holds more than "
                f"4,000,000 lines (blank ones included); the limit is 4,000,000"), client
    path.write_bytes(row + b"\n" * (trace.MAX_TRACE_LINES - 3) + row + b"  \n")  # at the limit
    trace._parse.cache_clear()
    sc = pdsim.load(_trace_fleet(path), allow_outside_paths=True)
    assert sc.clients[0].dataset._rows == 2 == count_rows(path)


def test_a_cut_trace_whose_tail_cannot_be_read_fails_validate_not_the_run(tmp_path):
    """A trace cut by num_prompts is counted to its end when the run starts (the report says
    how much of it ran): load counts it too, so a truncated gzip past the cut is refused by
    validate (validate passed it and the run failed)."""
    rows = "".join(json.dumps({"timestamp": i, "input_length": i * 7919 % 99991 + 2,
                               "output_length": i % 997 + 1, "hash_ids": [i, i * 31 % 9973]})
                   + "\n" for i in range(30_000))
    full = gzip.compress(rows.encode(), 1)
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(full[: len(full) // 2])  # past what the first rows' reads decompress
    trace._parse.cache_clear()
    trace._count_rows.cache_clear()
    with pytest.raises(pdsim.ScenarioError, match="not a readable gzip file"):
        pdsim.load(_trace_fleet(path, num_prompts=2), allow_outside_paths=True)


def test_a_row_holds_at_most_input_length_block_ids():
    """A block holds at least one token, so a row of more hash_ids than input_length tokens is
    no trace (the Mooncake traces' blocks hold 512: ceil(input_length / 512) ids a row). A line
    of more than MAX_TRACE_TOKENS commas is refused before JSON decoding builds its list: one
    row of ~36M ids (a 382 KB gzip) took 2.5 GB and 97 s (found by the hostile-input hunt)."""
    def row(n_ids, inp):
        return trace._check({"timestamp": 0, "input_length": inp, "output_length": 1,
                             "hash_ids": list(range(n_ids))})

    assert len(row(9, 9)[3]) == 9 and row(0, 0)[3] == ()
    with pytest.raises(trace._Bad, match=r"^'hash_ids' holds 10 block ids for an input_length "
                       r"of 9 tokens; a block holds at least one token \(512 in the Mooncake "
                       r"traces\), so at most 9$"):
        row(10, 9)
    with pytest.raises(trace._Bad, match="holds 1 block id for an input_length of 0 tokens"):
        row(1, 0)
    with pytest.raises(trace._Bad, match="holds 2 block ids for an input_length of 1 token;"):
        row(2, 1)
    with pytest.raises(trace._Bad, match="holds 10 block ids for an input_length of 9"):
        trace._check({"timestamp": 0, "input_length": 9.9, "output_length": 1,
                      "hash_ids": list(range(10))})


def test_a_line_of_too_many_values_is_refused_before_it_is_decoded(tmp_path, monkeypatch):
    """More commas than a row's most ids and its fields: no decoder sees the line (it would
    build the list); a row of input_length ids at the token limit still reads."""
    def line(n_ids, inp):
        return (b'{"timestamp": 0, "input_length": %d, "output_length": 1, "hash_ids": [' % inp
                + b"7," * (n_ids - 1) + b"7]}\n")

    path = tmp_path / "bomb.jsonl.gz"
    path.write_bytes(gzip.compress(line(trace.MAX_TRACE_TOKENS + 63, trace.MAX_TRACE_TOKENS), 1))
    decoded = []
    spy = type("Spy", (), {"scan_once": lambda s, text, i: decoded.append(i) or 1 / 0})()
    with monkeypatch.context() as m:
        m.setattr(trace, "_DECODER", spy)
        m.setattr(trace, "_row", lambda line: decoded.append(line) or 1 / 0)
        trace._parse.cache_clear()
        with pytest.raises(trace.TraceError, match=r"bomb\.jsonl\.gz, line 1: 10,000,065 commas, "
                           r"more than a row holds: at most 10,000,000 'hash_ids' \(at most "
                           r"input_length, <= 10,000,000: a block holds at least one token\) "
                           r"and its fields$"):
            trace._parse(trace._key(path), 10)
    assert decoded == []
    # the boundary, at a token limit of 1,000: 1,000 ids read; up to 1,064 commas are decoded
    # (and the ids counted), more are not
    monkeypatch.setattr(trace, "MAX_TRACE_TOKENS", 1000)
    for n_ids, inp, error in ((1000, 1000, None), (1000, 999, "'hash_ids' holds 1,000 block"),
                              (1062, 1000, "'hash_ids' holds 1,062 block ids"),
                              (1063, 1000, "1,065 commas, more than a row holds")):
        path = tmp_path / f"t{n_ids}_{inp}.jsonl"
        path.write_bytes(line(n_ids, inp))
        trace._parse.cache_clear()
        if error is None:
            assert len(trace._parse(trace._key(path), 10)[0][3]) == n_ids
        else:
            with pytest.raises(trace.TraceError, match=re.escape(error)):
                trace._parse(trace._key(path), 10)


def test_a_trace_without_request_rate_is_replayed_by_its_timestamps(tmp_path):
    """bench_serving replays a Mooncake trace by its timestamps whatever --request-rate says;
    pdsim's default (inf) sent every row at once, so a trace written without request_rate
    lost its arrival pattern. The default is now 'trace' for a trace dataset (inf for random),
    and an explicit rate still applies."""
    path = _tiny_trace(tmp_path / "t.jsonl")
    d = _trace_fleet(path)
    del d["clients"][0]["request_rate"]
    res = pdsim.run(d, allow_outside_paths=True)
    assert res.scenario.clients[0].request_rate == "trace"
    arrivals = res.requests.sort_values("rid").t_arrival
    assert arrivals.max() - arrivals.min() == pytest.approx(200 * 24 / 1000)
    burst = pdsim.run(_trace_fleet(path, request_rate="inf"), allow_outside_paths=True)
    assert burst.requests.t_arrival.max() == burst.requests.t_arrival.min()
    assert pdsim.load(small_fleet()).clients[0].request_rate == "inf"

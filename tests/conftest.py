from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

import matplotlib
import pytest

import pdsim

matplotlib.use("Agg")  # tests draw figures without a display

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "scenarios"
TRACES = SCENARIOS / "traces"  # the Mooncake traces ship in the repo (gzip)


@pytest.fixture(autouse=True, scope="session")
def _at_the_repo_root():
    """Tests name shipped files as a user at the repo's root types them
    (``pdsim run scenarios/healthy.yaml``): run them from there, wherever pytest started."""
    before = os.getcwd()
    os.chdir(ROOT)
    yield
    os.chdir(before)


@cache
def run_cached(name: str, *sets: str) -> pdsim.Result:
    """Run a shipped scenario once per test session (results are deterministic)."""
    return pdsim.run(SCENARIOS / f"{name}.yaml", sets=list(sets))


@pytest.fixture
def run_scenario():
    return run_cached


def small_fleet(**over) -> dict:
    """A small, fast scenario dict for unit-level mechanism tests."""
    d = {
        "name": "small",
        "seed": 7,
        "horizon_s": 600,
        "fleet": {
            "gpu": "H20", "model": "dsv3-ci-test",
            "prefill": {"dp": 2, "tp": 2, "dp_attention": True, "balance": "total_tokens",
                        "chunked_prefill_size": 8192},
            "decode": {"dp": 2, "tp": 2, "dp_attention": True, "balance": "total_tokens"},
        },
        "clients": [{"kind": "bench", "num_prompts": 200, "max_concurrency": 64,
                     "dataset": {"kind": "random", "input_len": 2048, "output_len": 128}}],
    }
    for k, v in over.items():
        d[k] = v
    return d


class EndWatch:
    """Every write of each request's ``status`` while installed (:func:`watch_ends`), by rid,
    to check that a request ends once: ``unfinished`` then at most one terminal status."""

    def __init__(self) -> None:
        from pdsim.engine.request import Request

        self._slot = Request.__dict__["status"]  # the slot's own descriptor
        self.writes: dict[int, list[str]] = {}

    def __get__(self, obj: object, owner: type | None = None) -> object:
        return self if obj is None else self._slot.__get__(obj, owner)

    def __set__(self, obj: object, value: str) -> None:
        self.writes.setdefault(obj.rid, []).append(value)
        self._slot.__set__(obj, value)

    def ended_twice(self) -> dict[int, list[str]]:
        """The requests whose status was written after their first end."""
        return {rid: w for rid, w in self.writes.items()
                if w[0] != "unfinished" or len(w) > 2}


@contextmanager
def watch_ends() -> Iterator[EndWatch]:
    """Record every status write of the requests of the runs inside (one run per watch:
    rids restart at 0)."""
    from pdsim.engine.request import Request

    watch = EndWatch()
    Request.status = watch
    try:
        yield watch
    finally:
        Request.status = watch._slot


def check_accounting(res: pdsim.Result) -> None:
    """Every prompt and every failure is accounted for (docs/invariants.md, "Accounting"):

    - each prompt of a bench client, and each question of an eval client, is exactly one of
      sent and ended, in flight, or not sent, in the summary (``requests``/``unfinished``/
      ``unsent``; with SDK retries, where a prompt is several requests, ``prompts_in_flight``;
      an eval's ``questions``/``questions_in_flight``/``unsent``) and in the report's warning;
    - the time series' last sample is at the run's end, and its counters are the run's
      totals: ``failed`` counts every request the table says failed or timed out,
      ``tokens_out`` every token the fleet generated.
    (One end per request: :func:`watch_ends`.)"""
    from pdsim.output.report import horizon_warning

    s, req = res.summary, res.requests
    m = res.measured
    unsent = 0
    for c in res.scenario.clients:
        cm = s["clients"][c.name]
        mine = m[m.client == c.name]
        running = int((mine.status == "unfinished").sum())
        assert cm["requests"] == len(mine) and cm["unfinished"] == running, c.name
        assert cm["unsent"] >= 0, (c.name, cm)
        if c.kind == "bench":  # (an SDK retry of a prompt is a request of attempt > 0)
            sent = int((mine.attempt == 0).sum())
            assert sent + cm["unsent"] == c.prompts(), (c.name, cm, sent)
            if c.sdk_retries:  # prompts in flight: a request each at most, or a backoff
                assert running <= cm["prompts_in_flight"] <= sent, (c.name, cm)
                assert not (cm["finished"] and cm["prompts_in_flight"]), (c.name, cm)
            else:
                assert "prompts_in_flight" not in cm
        else:
            answers = res.answers
            answered = int((answers.client == c.name).sum()) if len(answers) else 0
            assert cm["questions"] == answered, (c.name, cm)
            assert answered + cm["questions_in_flight"] + cm["unsent"] == c.questions, cm
            assert running <= cm["questions_in_flight"], (c.name, cm)  # one request each
            assert int((mine.question >= 0).sum()) == len(mine)
            asked = mine.question.nunique() if len(mine) else 0  # (a request each at once)
            assert asked == answered + cm["questions_in_flight"], (c.name, cm, asked)
        if (cm["unsent"] and not cm.get("aborted")) or running:
            assert not cm["finished"], (c.name, cm)
        unsent += cm["unsent"]
    warning = " ".join(horizon_warning(res))
    if warning:
        assert not unsent or f"{unsent} prompt" in warning, warning
    elif unsent:  # the run was not cut: only a client that aborted leaves prompts unsent
        assert all(cm.get("aborted") for cm in s["clients"].values() if cm["unsent"]), s
    ts = res.timeseries
    assert ts.time.iloc[-1] == res.end_s, (ts.time.iloc[-1], res.end_s)
    assert ts.failed.iloc[-1] == int(req.status.isin(["failed", "timed_out"]).sum())
    assert ts.tokens_out.iloc[-1] == s["tokens_generated_fleet"]

"""The capacity planner's walk, from the command line alone (issue 27), on the shipped
scenarios/capacity/llama70b_h100.yaml cut to a short load: validate it, run it (does the fleet
keep up, within the SLO?), sweep the rate (where does it stop?), draw it, compare two layouts.
The scenario's header lists the same commands."""

from __future__ import annotations

import json

import pytest
from conftest import SCENARIOS

from pdsim.cli.main import main

S = str(SCENARIOS / "capacity" / "llama70b_h100.yaml")
SHORT = ["--set", "clients.0.num_prompts=600"]  # 30 s of arrivals at 20 req/s


def test_the_walk_its_header_lists(capsys, tmp_path):
    text = (SCENARIOS / "capacity" / "llama70b_h100.yaml").read_text()
    for cmd in ("pdsim validate", "pdsim run", "pdsim sweep", "pdsim compare"):
        assert f"#   {cmd} scenarios/capacity/llama70b_h100.yaml" in text, cmd

    assert main(["validate", S]) == 0
    assert "ok (llama70b_h100, 1 client(s)" in capsys.readouterr().out

    # run: the report answers "does it keep up" and "within the SLO" in bench_serving's words
    assert main(["run", S, *SHORT, "--plot", str(tmp_path / "capacity.png")]) == 0
    out = capsys.readouterr().out
    verdict = next(x for x in out.splitlines() if x.startswith("Verdict:"))
    assert verdict.split()[-2:] == ["keeps", "up"]
    assert "SLO attainment (requests meeting it):" in out and "Request goodput (req/s):" in out
    for p in ("P50", "P90", "P95", "P99"):
        assert f"{p} TTFT (ms):" in out or (p == "P50" and "Median TTFT (ms):" in out)
    assert (tmp_path / "capacity.png").stat().st_size > 10_000
    assert main(["run", S, *SHORT, "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["steady"]["keeps_up"] is True
    assert s["slo"]["attainment"] > 0.85  # (the whole scenario's 1,200 prompts: 94.7%)

    # sweep the rate: the capacity sweep's columns; at 3x the rate the fleet falls behind
    assert main(["sweep", S, *SHORT, "--vary", "clients.0.request_rate=20,60", "--seeds", "1",
                 "--workers", "1"]) == 0
    table = capsys.readouterr().out.split("\n\n")[0].splitlines()
    assert "keeps up" in table[1] and "TTFT p99" in table[1] and "SLO met" in table[1]
    rows = {line.split()[0]: line.split() for line in table[3:]}
    kept = table[1].split().index("keeps") + 1  # (after the row label; "keeps up": 2 words)
    assert rows["20"][kept] == "1/1" and rows["60"][kept] == "0/1"

    # compare two layouts: one more decode server, per GPU
    assert main(["compare", S, S, *SHORT, "--set-run", "2:fleet.decode.servers=2", "--names",
                 "2P1D,2P2D", "--plot", str(tmp_path / "layouts.png")]) == 0
    out = capsys.readouterr().out
    gpus = next(x for x in out.splitlines() if x.startswith("GPUs used")).split()[-2:]
    assert gpus == ["12", "16"]
    assert "Goodput per GPU (req/s)" in out
    assert (tmp_path / "layouts.png").stat().st_size > 10_000


@pytest.mark.parametrize("servers", [1])
def test_too_small_a_fleet_is_told_it_falls_behind(capsys, servers):
    """The walk's first answer: one prefill server cannot take 20 req/s of these prompts."""
    assert main(["run", S, *SHORT, "--set", f"fleet.prefill.servers={servers}", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["steady"]["keeps_up"] is False and s["steady"]["queue_growth_req_s"] > 1
    assert s["slo"]["meets_slo"] is False

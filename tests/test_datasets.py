"""The shipped request datasets (pdsim/config/data: the Azure LLM inference traces 2023) and
``dataset: {kind: sharegpt}``, which samples length pairs as bench_serving samples ShareGPT."""

from __future__ import annotations

import gzip
import hashlib
import json
from collections import Counter

import numpy as np
import pytest
from conftest import ROOT, small_fleet

import pdsim
from pdsim.config import datasets
from pdsim.config.scenario import ScenarioError
from pdsim.engine.client import sharegpt_lengths

# (rows, mean prompt, mean output, sha256 of the uncompressed file): the README's table
SHIPPED = {
    "azure_conv": (19_366, 1154.7, 211.1,
                   "6d2154a4da3095954befb252ebe58ca474769e13449c69f62e561b3831a880f9"),
    "azure_code": (8_819, 2047.8, 27.9,
                   "d5d853f98d39bf933ebac6102360e99ea113023192ecc82e101431f576c32dbb"),
}
README = (ROOT / "pdsim" / "config" / "data" / "README.md").read_text()


@pytest.mark.parametrize("name", list(SHIPPED))
def test_a_shipped_dataset_is_what_its_readme_says(name):
    rows, mean_in, mean_out, sha = SHIPPED[name]
    raw = gzip.decompress(datasets.path(name).read_bytes())
    assert hashlib.sha256(raw).hexdigest() == sha
    assert sha in README and datasets.DATASETS[name].file in README
    lines = [json.loads(x) for x in raw.decode().splitlines()]
    assert len(lines) == rows
    assert round(np.mean([x["input_length"] for x in lines]), 1) == mean_in
    assert round(np.mean([x["output_length"] for x in lines]), 1) == mean_out
    t = [x["timestamp"] for x in lines]
    assert t[0] == 0 and t == sorted(t)


def test_the_licence_and_source_ship_beside_the_data():
    licence = (ROOT / "pdsim" / "config" / "data" / "LICENSE").read_text(encoding="utf-8-sig")
    assert licence.startswith("Attribution 4.0 International")
    for fact in ("github.com/Azure/AzurePublicDataset", "CC-BY-4.0",
                 "b469a113cedca53ddc3bdea71a143dc4b7d8700c", "Splitwise",
                 "sample_sharegpt_requests"):
        assert fact in README, fact


def _pairs(tmp_path, pairs):
    """A length-pair file of the user's, beside a scenario that samples it."""
    (tmp_path / "pairs.jsonl").write_text("".join(
        json.dumps({"timestamp": 0, "input_length": i, "output_length": o}) + "\n"
        for i, o in pairs))


def _scenario(tmp_path, n, **ds):
    d = small_fleet(clients=[{"kind": "bench", "num_prompts": n, "request_rate": 50,
                              "warmup_requests": 0, "dataset": {"kind": "sharegpt", **ds}}])
    (tmp_path / "s.yaml").write_text(json.dumps(d))
    return tmp_path / "s.yaml"


def _sent(res):
    m = res.measured
    return Counter(zip(m.input_len.tolist(), m.output_len.tolist(), strict=True))


def test_sharegpt_sampling_filters_as_bench_serving_and_samples_each_pair_once(tmp_path):
    pairs = [(1, 50), (300, 1), (5000, 200)] + [(100 + k, 10 + k) for k in range(40)]
    _pairs(tmp_path, pairs)
    res = pdsim.run(_scenario(tmp_path, 40, path="pairs.jsonl", context_len=4000))
    sent = _sent(res)
    # the 40 usable pairs, each once: the short ones and the one past context_len left out
    assert sent == Counter((100 + k, 10 + k) for k in range(40))
    order = res.measured.sort_values("t_arrival").input_len.tolist()
    assert order != sorted(order)  # shuffled
    again = pdsim.run(_scenario(tmp_path, 40, path="pairs.jsonl", context_len=4000))
    assert again.measured.sort_values("t_arrival").input_len.tolist() == order


def test_sharegpt_output_len_fixes_every_output(tmp_path):
    _pairs(tmp_path, [(100 + k, 1 + k) for k in range(30)])
    res = pdsim.run(_scenario(tmp_path, 30, path="pairs.jsonl", output_len=16))
    assert set(res.measured.output_len) == {16}
    assert len(res.measured) == 30  # an output of 1 is replaced before the filter, as there


def test_more_prompts_than_usable_pairs_is_one_line_naming_both(tmp_path):
    _pairs(tmp_path, [(1, 5)] + [(100, 10)] * 9)
    with pytest.raises(ScenarioError, match=r"num_prompts.*10 prompts.*9 usable pairs \(of 10"):
        pdsim.load(_scenario(tmp_path, 10, path="pairs.jsonl"))


def test_sharegpt_lengths_is_a_seeded_permutation():
    rows = tuple((0, 100 + k, 20 + k, ()) for k in range(100))
    a = sharegpt_lengths(np.random.default_rng(1), rows, 10, None, None)
    b = sharegpt_lengths(np.random.default_rng(1), rows, 10, None, None)
    c = sharegpt_lengths(np.random.default_rng(2), rows, 10, None, None)
    assert a == b and a != c
    assert all(o == i - 80 for i, o in zip(*a, strict=True))  # pairs stay pairs


def test_the_default_sharegpt_dataset_is_azure_conv_by_name():
    d = small_fleet(clients=[{"kind": "bench", "num_prompts": 60, "request_rate": 20,
                              "dataset": {"kind": "sharegpt"}}])
    res = pdsim.run(d)
    rows = gzip.decompress(datasets.path("azure_conv").read_bytes()).decode().splitlines()
    held = Counter((x["input_length"], x["output_length"]) for x in map(json.loads, rows))
    sent = _sent(res)
    assert sum(sent.values()) == 60 and all(held[p] >= k for p, k in sent.items())
    from pdsim.output import report

    assert "sharegpt sampling of azure_conv" in report.render(res)


def test_a_shipped_trace_replays_at_its_own_timestamps_by_name():
    d = small_fleet(clients=[{"kind": "bench", "num_prompts": 50, "warmup_requests": 0,
                              "dataset": {"kind": "trace", "name": "azure_code"}}])
    res = pdsim.run(d)
    rows = [json.loads(x) for x in gzip.decompress(
        datasets.path("azure_code").read_bytes()).decode().splitlines()[:50]]
    arrivals = np.sort(res.measured.t_arrival.to_numpy())
    want = np.array([r["timestamp"] for r in rows]) / 1e3
    assert np.allclose(arrivals - arrivals[0], want - want[0], atol=1e-6)


@pytest.mark.parametrize(("ds", "msg"), [
    ({"kind": "sharegpt", "name": "sharegpt_v3"}, "azure_conv"),
    ({"kind": "sharegpt", "name": "azure_code", "path": "x.jsonl"}, "not both"),
    ({"kind": "trace"}, "give path"),
    ({"kind": "sharegpt", "output_len": 3}, "greater than or equal to 4"),
])
def test_bad_dataset_choices_are_one_line(ds, msg):
    with pytest.raises(ScenarioError, match=msg):
        pdsim.load(small_fleet(clients=[{"kind": "bench", "num_prompts": 5, "dataset": ds}]))

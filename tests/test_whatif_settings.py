"""whatif weighs any remedy, not only blacklist policies (issue 26: "a policy, e.g. a shorter
waiting timeout or abort notification on or off, can be weighed across all of them"): a policy's
dotted keys are scenario settings applied to its runs, healthy runs included."""

from __future__ import annotations

import pytest
from conftest import small_fleet

from pdsim.analysis import whatif as whatif_mod
from pdsim.analysis.whatif import expand_policies, split_policy
from pdsim.analysis.windows import Timeline
from pdsim.cli.main import main

TL = Timeline(steady_s=1.0, recovery_s=5.0, lasting_s=10.0, drain_s=5.0)
ERRS = [{"kind": "transfer_errors", "probability": 0.3, "from_s": 3.0, "to_s": 3.5}]


def _base() -> dict:
    d = small_fleet()
    d["horizon_s"] = 60
    c = d["clients"][0]
    c.update(num_prompts=120, max_concurrency=None, request_rate=10.0)
    c["dataset"] = {"kind": "random", "input_len": 1024, "output_len": 128}
    return d


def test_dotted_keys_are_settings_and_name_the_row():
    pols = expand_policies([{"policy": "never", "transfer.waiting_timeout_s": [10, 30]},
                            {"policy": "ttl", "ttl_s": 3}])
    assert [lbl for lbl, _ in pols] == ["never(transfer.waiting_timeout_s=10)",
                                        "never(transfer.waiting_timeout_s=30)",
                                        "ttl(ttl_s=3)"]
    black, sets = split_policy(pols[1][1])
    assert black == {"policy": "never"} and sets == ["transfer.waiting_timeout_s=30"]
    with pytest.raises(ValueError, match="ttl_z"):  # a blacklist key is still checked
        expand_policies([{"policy": "ttl", "ttl_z": 3, "transfer.waiting_timeout_s": 10}])


def test_a_setting_reaches_every_run_of_its_policy_and_its_healthy_runs():
    """Two arms that differ only in a setting the fleet's throughput depends on (the decode's
    max_running_requests): their healthy runs must differ (each policy its own: a shared
    healthy run would measure one arm against the other's fleet), and each arm's faulty run
    is measured against its own healthy run. Without the settings applied, or with one shared
    healthy run, the healthy goodputs are equal / there is no policy column."""
    w = whatif_mod.whatif(
        _base(), [{"policy": "never", "fleet.decode.max_running_requests": [1, 64]}],
        {"errs": ERRS}, seeds=[1], workers=1, progress=False, timeline=TL)
    h = w.healthy.set_index("policy").goodput_tok_s
    few, many = ("never(fleet.decode.max_running_requests=1)",
                 "never(fleet.decode.max_running_requests=64)")
    assert h[few] < 0.8 * h[many]
    for r in w.runs.itertuples():
        assert r.goodput_lost_pct == pytest.approx(
            100 * (h[r.policy] - r.goodput_tok_s) / h[r.policy])


def test_cli_policy_with_a_setting_and_a_bad_setting_in_one_line(tmp_path, capsys):
    import yaml

    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump(_base()))
    assert main(["whatif", str(base), "--loads", "base", "--seeds", "1", "--faults",
                 "transient_errors", "--policy", "never:transfer.nonesuch_s=3",
                 "--workers", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nonesuch_s" in err[0], err


@pytest.mark.parametrize("key", ["faults.0.at_s", "clients.0.request_rate", "slo.ttft_ms",
                                 "blacklist.ttl_s", "operator_flushes.0.at_s"])
def test_a_policy_may_not_set_what_the_what_if_sets_itself(key):
    """An arm with its own load, faults, SLO or blacklist section would no longer meet the
    same seed's arrivals and faults as the others: its regret would compare unlike runs."""
    with pytest.raises(ValueError, match="the what-if sets"):
        expand_policies([{"policy": "never", key: 1}])


@pytest.mark.parametrize("setting, says", [
    ("transfer.waiting_timeout_s=2020-01-01", "waiting_timeout_s"),  # a YAML date: was exit 70
    ("transfer.nonesuch_s=3", "nonesuch_s"),
    ("fleet.gpu.x=1", "--policy setting fleet.gpu.x"),  # (a string, not a mapping)
])
def test_a_bad_setting_is_one_line_before_any_run(tmp_path, capsys, monkeypatch, setting, says):
    """Refused before the first run (an arm's own healthy runs were validated only after the
    shared ones had run), naming the policy's setting, not a --set the user never wrote."""
    import yaml

    ran = []
    monkeypatch.setattr(whatif_mod, "run_tasks", lambda *a, **k: ran.append(a) or [])
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump(_base()))
    assert main(["whatif", str(base), "--loads", "base", "--seeds", "1", "--faults",
                 "transient_errors", "--policy", f"never:{setting}", "--workers", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0] and "--set" not in err[0], err
    assert not ran

"""Findings of round 13's independent review of the merged engine and user-journey fixes, each
with a test that fails without its fix."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml
from conftest import ROOT

import pdsim
from pdsim.cli.main import main


def _colocated_section(**over) -> dict:
    return {"servers": 1, "dp": 1, "tp": 1, "max_running_requests": 256, **over}


@pytest.mark.parametrize("section, ok", [
    (_colocated_section(), True),  # an earlier pdsim's dump: 256 was the default
    (_colocated_section(max_running_requests=128), False),  # an edit
    (_colocated_section(tp=2), False),
])
def test_a_scenario_written_by_an_earlier_pdsim_still_loads(section, ok, capsys, tmp_path):
    """A run directory written before SGLang's max_running_requests derivation became the
    default holds 256 in the inactive fleet.colocated: compare and re-running it said
    "fleet.colocated describes a colocated fleet", about a key the user never wrote."""
    d = yaml.safe_load((ROOT / "scenarios/healthy.yaml").read_text())
    d["fleet"]["colocated"] = section
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(d))
    rc = main(["validate", str(tmp_path / "s.yaml")])
    err = capsys.readouterr().err
    assert (rc == 0) == ok, err
    if not ok:
        assert err.count("\n") == 1 and "fleet.colocated describes a colocated fleet" in err


@pytest.mark.parametrize("over, says", [
    ({"rope_scaling": {"type": "linear", "factor": "2"}}, "rope_scaling.factor is '2'"),
    ({"rope_scaling": {"type": "linear", "factor": 1e308}}, "rope_scaling.factor is 1e+308"),
    ({"rope_scaling": {"type": "linear", "factor": [2]}}, "rope_scaling.factor is [2]"),
    ({"rope_scaling": {"type": "linear", "factor": float("nan")}}, "rope_scaling.factor is nan"),
    ({"max_position_embeddings": 4096.5}, "'max_position_embeddings' must be an integer"),
    ({"seq_length": 0}, "seq_length is 0"),  # SGLang takes the first key that is set
])
def test_profiles_import_refuses_a_context_length_it_cannot_read(tmp_path, capsys, over, says):
    """A string factor multiplied the string 131,072 times (ValueError, exit 70); 1e308 an
    OverflowError; a float max_position_embeddings was skipped for the next key."""
    cfg = {**json.loads((ROOT / "tests/hf_configs/Llama-3.1-8B.json").read_text()), **over}
    cfg.pop("rope_scaling", None) if "rope_scaling" not in over else None
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    assert main(["profiles", "import", str(tmp_path / "cfg.json"), "--name", "t_x", "--out",
                 str(tmp_path / "p.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err
    assert not (tmp_path / "p.yaml").exists()


@pytest.mark.parametrize("out", ["adir/", "adir/.", "adir/.."])
def test_an_output_file_named_like_a_directory_is_refused(tmp_path, capsys, monkeypatch, out):
    """``profiles import --out adir/`` (or ``adir/.``) wrote a file named adir."""
    monkeypatch.chdir(tmp_path)
    assert main(["profiles", "import", str(ROOT / "tests/hf_configs/Llama-3.1-8B.json"),
                 "--name", "t_x", "--out", out]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--out {out}: names a directory" in err, err
    assert not (tmp_path / "adir").exists()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = yaml.safe_load((ROOT / "scenarios/healthy.yaml").read_text())
    d["clients"][0]["num_prompts"] = 40
    out = tmp_path_factory.mktemp("rd") / "good"
    pdsim.run(d).write(out)
    return out


@pytest.mark.parametrize("value", ["nan", "-5", "1e90", "2.5"])
def test_compare_refuses_a_summary_whose_counts_are_no_counts(run_dir, tmp_path, capsys, value):
    """A tampered summary.json ("completed_requests": NaN, -5, 1e90) was read and compared,
    exit 0."""
    bad = tmp_path / "bad"
    shutil.copytree(run_dir, bad)
    s = json.loads((bad / "summary.json").read_text())
    s["completed_requests"] = float(value)  # (the run's, not a client's)
    text = json.dumps(s)
    (bad / "summary.json").write_text(text)
    assert main(["compare", str(run_dir), str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'completed_requests' must be a count" in err, err


def test_recovery_waits_for_the_last_dead_room_to_be_freed():
    """stuck_transferring_fixed: goodput is back within seconds of the trigger's end, but its
    dead rooms are freed only when their waiting timeout fires: recovery is the later of the
    two (with ``recovery = max(recovery, cleared - end)`` removed, both read the same)."""
    inc = pdsim.run(ROOT / "scenarios/incidents/stuck_transferring_fixed.yaml").summary["incident"]
    assert inc["recovered"] and inc["dead_rooms"] > 0 and inc["dead_rooms_at_end"] == 0
    assert inc["recovery_s"] > inc["goodput_recovery_s"] + 60, inc

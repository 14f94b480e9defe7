"""pdsim calibrate: recovers known parameters, reproduces the shipped calibration from its
published table, and writes a profile a scenario loads."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pandas as pd
import pytest
from conftest import ROOT

import pdsim
from pdsim.cli.main import main
from pdsim.model import calibrate, profiles

TRUTH = {"gpu.gemm_eff": 0.55, "gpu.attn_eff": 0.45, "engine.prefill_step_ms": 3.0,
         "gpu.hbm_eff": 0.72, "engine.decode_step_ms": 2.2}


def _synthetic() -> pd.DataFrame:
    rows = [dict(phase="prefill", batch_size=b, input_len=n, tp=tp)
            for b, n, tp in itertools.product((1, 4, 16), (128, 512, 2048, 8192), (1, 2))]
    rows += [dict(phase="decode", batch_size=b, input_len=c, tp=tp)
             for b, c, tp in itertools.product((1, 8, 32, 128, 256), (512, 4096), (1, 2))]
    df = pd.DataFrame(rows)
    res = profiles.resolve("H100", "llama-3.1-8b")
    df["step_ms"] = calibrate.predict_steps(df, res, TRUTH)
    return df


def test_calibrate_recovers_synthetic_parameters():
    fit = calibrate.fit(_synthetic(), "H100", "llama-3.1-8b")
    assert set(fit.params) == set(TRUTH)
    for key, value in TRUTH.items():
        assert fit.start[key] != pytest.approx(value, rel=0.02)  # it had to move
        assert fit.params[key] == pytest.approx(value, rel=0.02), key
    assert fit.rows.error.abs().max() < 1e-3


def test_calibrate_reproduces_the_shipped_h100_deepseek_calibration_from_its_table():
    """The real table: LMSYS's per-node throughputs as step times (validation/)."""
    rows = calibrate.read_table(ROOT / "validation" / "lmsys_dsv3_h100_steps.csv")
    fit = calibrate.fit(rows, "H100", "deepseek-v3",
                        keys=["gpu.gemm_eff", "engine.tbo_overlap"],
                        start={"gpu.gemm_eff": 0.7, "engine.tbo_overlap": 0.3})
    shipped = profiles.resolve("H100", "deepseek-v3")
    assert fit.params["gpu.gemm_eff"] == pytest.approx(shipped.gpu.gemm_eff, rel=0.02)
    assert fit.params["engine.tbo_overlap"] == pytest.approx(shipped.engine.tbo_overlap,
                                                             rel=0.02)
    assert fit.rows.error.abs().max() < 0.05


def test_cli_writes_a_profile_a_scenario_loads(tmp_path, capsys):
    data = tmp_path / "pr5624.csv"
    data.write_text((ROOT / "validation" / "pr5624_bench_one_batch.csv").read_text())
    code = main(["calibrate", str(data), "--gpu", "H20", "--model", "dsv3-ci-test", "--fit",
                 "engine.decode_step_ms,engine.prefill_step_ms"])
    assert code == 0
    out = capsys.readouterr().out
    assert "decode_step_ms" in out and "median |error|" in out
    prof = tmp_path / "pr5624.profile.yaml"
    assert prof.is_file() and (tmp_path / "pr5624.residuals.png").stat().st_size > 1000
    sc = tmp_path / "sc.yaml"
    sc.write_text("profiles: [pr5624.profile.yaml]\n"
                  "fleet: {gpu: H20, model: dsv3-ci-test}\nclients: [{kind: bench}]\n")
    res = profiles.for_scenario(pdsim.load(sc))
    assert "pdsim calibrate" in res.origins["engine.decode_step_ms"][1]
    assert str(prof) in res.origins["engine.decode_step_ms"][1]


def test_a_value_fitted_to_the_end_of_its_range_is_flagged(tmp_path, capsys):
    """Prefill rows faster than the GPU's peak allows drove gemm_eff to 1 (100% of peak)
    and the CLI printed '0.7 -> 1' as if it were a measurement; it now says the value sits
    on its bound and what to check. A fit inside its ranges says nothing."""
    data = _synthetic()
    data = data[data.phase == "prefill"].assign(step_ms=lambda d: d.step_ms * 0.2)
    fit = calibrate.fit(data, "H100", "llama-3.1-8b", keys=["gpu.gemm_eff"])
    assert fit.params["gpu.gemm_eff"] == pytest.approx(1.0)
    assert fit.at_bounds() == {"gpu.gemm_eff": "upper bound 1"}
    assert calibrate.fit(_synthetic(), "H100", "llama-3.1-8b").at_bounds() == {}
    path = tmp_path / "fast.csv"
    data.to_csv(path, index=False)
    assert main(["calibrate", str(path), "--gpu", "H100", "--model", "llama-3.1-8b",
                 "--fit", "gpu.gemm_eff"]) == 0
    out = capsys.readouterr().out
    assert "-> 1   at its upper bound 1" in out, out
    assert "note: the fit pushed gpu.gemm_eff to the end of the allowed range" in out, out


def test_an_unknown_gpu_points_to_profiles_for_ones_own(tmp_path, capsys):
    """'unknown GPU profile H100-lab; allowed: ...' did not say how to fit a GPU of one's
    own, which is what calibrate is for: --profiles FILE."""
    f = tmp_path / "t.csv"
    f.write_text("phase,batch_size,input_len,step_ms\nprefill,1,1024,30\n")
    assert main(["calibrate", str(f), "--gpu", "H100-lab", "--model", "llama-3.1-8b"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("pdsim: error: invalid value at '--gpu': unknown GPU profile "
                          "'H100-lab'; allowed: ") and len(err.splitlines()) == 1, err
    assert err.endswith("; one of your own: --profiles FILE that defines it"), err


@pytest.mark.parametrize("text, needle", [
    ("a,b\n1,2\n", "needs step columns"),
    ("phase,batch_size,input_len,step_ms\nverify,1,1,1\n", "prefill or decode"),
    ("phase,batch_size,input_len,step_ms\n", "no rows"),
])
def test_calibrate_bad_tables_are_one_line(tmp_path, capsys, text, needle):
    f = tmp_path / "t.csv"
    f.write_text(text)
    assert main(["calibrate", str(f), "--gpu", "H100", "--model", "llama-3.1-8b"]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1
    assert main(["calibrate", str(Path(tmp_path, "none.csv")), "--gpu", "H100", "--model",
                 "llama-3.1-8b"]) == 2
    assert "not found" in capsys.readouterr().err


@pytest.mark.parametrize("name, make, says", [
    ("/dev/zero", None, "calibration table: /dev/zero is on the special filesystem /dev; only "
     "regular files are read"),
    ("adir", lambda p: p.mkdir(), "calibration table: {tmp}/adir is a directory, not a file"),
    ("fifo.csv", lambda p: os.mkfifo(p), "calibration table: {tmp}/fifo.csv is not a regular "
     "file (a device, FIFO or socket)"),
    ("big.csv", lambda p: p.write_text("a" * 2000), "calibration table: {tmp}/big.csv is "
     "2,000 bytes; the limit is 1,000 bytes"),
    ("long.csv", lambda p: p.write_text("phase,batch_size,input_len,step_ms\n"
                                        + "prefill,1,128,5\n" * 6),
     "calibration table {tmp}/long.csv: more than 5 rows; give at most 5"),
    ("bin.csv", lambda p: p.write_bytes(b"\x00\xff" * 50), "calibration table {tmp}/bin.csv: "
     "not UTF-8 text (looks binary"),
    ("quote.csv", lambda p: p.write_text('a,b\n"x\n'), "calibration table {tmp}/quote.csv: "
     "not a CSV table (Error tokenizing data"),
    ("empty.csv", lambda p: p.write_text(""), "calibration table {tmp}/empty.csv: empty; give "
     "a CSV table with a header row"),
    ("cols.csv", lambda p: p.write_text("phase,batch_size\nprefill,1\n"),
     "calibration table {tmp}/cols.csv: needs step columns"),
])
def test_calibrate_reads_its_table_as_a_bounded_regular_file(tmp_path, monkeypatch, capsys,
                                                             name, make, says):
    """The table was read by pandas from whatever the path named: a folder, /dev/zero or a
    FIFO said 'calibration table not found', and nothing bounded its size or rows."""
    monkeypatch.chdir(tmp_path)  # (DATA.profile.yaml and the plot default to beside DATA)
    monkeypatch.setattr(calibrate, "MAX_TABLE_BYTES", 1000, raising=False)
    monkeypatch.setattr(calibrate, "MAX_TABLE_ROWS", 5, raising=False)
    path = Path(name) if name.startswith("/") else tmp_path / name
    if make:
        make(path)
    assert main(["calibrate", str(path), "--gpu", "H100", "--model", "llama-3.1-8b",
                 "--out", str(tmp_path / "o.yaml"), "--plot", str(tmp_path / "o.png")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says.format(tmp=tmp_path) in err, err


@pytest.mark.parametrize("opt, value, needle", [
    ("--out", "nodir/x.yaml", "--out {tmp}/nodir/x.yaml: directory {tmp}/nodir does not exist"),
    ("--out", "adir", "--out {tmp}/adir: is a directory"),
    ("--plot", "nodir/x.png", "--plot {tmp}/nodir/x.png: directory {tmp}/nodir does not exist"),
    ("--plot", "x.pdfx",
     "--plot {tmp}/x.pdfx: .pdfx is not an image format; end the name with one of .avif"),
    ("--plot", "noext", "--plot {tmp}/noext: no extension is not an image format"),
])
def test_calibrate_output_paths_are_checked_before_the_fit(tmp_path, capsys, opt, value,
                                                          needle):
    """They were written after the fit: an internal error (FileNotFoundError, a format
    matplotlib lacks), or a plot saved as noext.png and reported as noext."""
    data = tmp_path / "steps.csv"
    data.write_text((ROOT / "validation" / "pr5624_bench_one_batch.csv").read_text())
    (tmp_path / "adir").mkdir()
    other = "--plot" if opt == "--out" else "--out"
    other_file = tmp_path / ("ok.png" if other == "--plot" else "ok.yaml")
    assert main(["calibrate", str(data), "--gpu", "H20", "--model", "dsv3-ci-test", "--fit",
                 "engine.decode_step_ms", opt, str(tmp_path / value),
                 other, str(other_file)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle.format(tmp=tmp_path) in err, err
    assert not other_file.exists() and sorted(p.name for p in tmp_path.iterdir()) == [
        "adir", "steps.csv"]


def test_calibrate_table_limits_are_the_documented_ones(capsys):
    """--help and the calibrating guide state them; the CLI does not import calibrate (pandas)
    to say so."""
    said = f"{calibrate.MAX_TABLE_BYTES >> 20} MB and {calibrate.MAX_TABLE_ROWS:,} rows"
    assert said in " ".join((ROOT / "docs" / "guides" / "calibrating.md").read_text().split())
    with pytest.raises(SystemExit):
        main(["calibrate", "--help"])
    assert said in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("data, says", [
    ("", "calibration table: an empty path; give a CSV file"),
    ("/", "calibration table: / is a directory, not a file"),
    (".", "calibration table: . is a directory, not a file")])
def test_calibrate_a_table_path_without_a_file_name_is_one_line(capsys, data, says):
    """The outputs are named after the table's stem: '', '.' and '/' have none, and taking
    it before reading the table was an internal error (exit 70)."""
    assert main(["calibrate", data, "--gpu", "H100", "--model", "deepseek-v3"]) == 2
    err = capsys.readouterr().err
    assert err == f"pdsim: error: {says}\n" or (err.count("\n") == 1 and says in err), err


def test_the_load_hint_names_the_profile_files_the_fit_needs(tmp_path, capsys):
    """Fitting one's own GPU: the hint said `profiles: [h.profile.yaml]`, a scenario with which
    fails on the unknown GPU; the files that define it come first."""
    data = tmp_path / "h.csv"
    data.write_text((ROOT / "validation" / "pr5624_bench_one_batch.csv").read_text())
    (tmp_path / "lab.yaml").write_text("gpus: {H20-lab: {extends: H20}}\n")
    assert main(["calibrate", str(data), "--gpu", "H20-lab", "--model", "dsv3-ci-test",
                 "--fit", "engine.decode_step_ms", "--profiles", str(tmp_path / "lab.yaml")]) == 0
    err = capsys.readouterr().err
    assert (f"(load it from a scenario in {tmp_path} with `profiles: [lab.yaml, "
            f"h.profile.yaml]`)") in err, err

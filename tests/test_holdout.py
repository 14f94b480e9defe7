"""validate-model --holdout: each split's refit sees only its training rows, every published
row is marked in-sample or out-of-sample, and the held-out columns reach the CLI and the docs'
validation page (``--write-docs``)."""

from __future__ import annotations

import pandas as pd
import pytest

from pdsim.analysis import holdout, validation
from pdsim.cli.main import main
from pdsim.model import calibrate

H100 = "H100 / deepseek-v3"
H20 = "H20-3e / qwen3-235b-a22b"


def _set(name: str) -> dict:
    return next(ps for ps in holdout.load_spec()["parameter_sets"] if ps["name"] == name)


def _split(pub: pd.DataFrame, name: str, setup: str) -> holdout.Split:
    """The split of parameter set ``name`` that trains on ``setup``'s rows."""
    ps = _set(name)
    return next(sp for sp in holdout.splits(pub, ps) if set(sp.train.setup) == {setup})


def _refit(pub: pd.DataFrame, train_setup: str) -> dict[str, float]:
    return holdout.refit(_split(pub, H100, train_setup), _set(H100)).params


def _scaled(pub: pd.DataFrame, mask: pd.Series, factor: float) -> pd.DataFrame:
    out = pub.copy()
    idx = out.index[mask][0]
    out.loc[idx, "value"] = out.loc[idx, "value"] * factor
    return out


@pytest.mark.parametrize("train, held", [("B", "C"), ("C", "B")])
def test_perturbing_a_held_out_row_leaves_the_refit_unchanged(train, held):
    """The real fit (pdsim calibrate's least squares) on the H100 / DeepSeek-V3 splits: a
    held-out row's published value cannot move the fitted values; a training row's does
    (the control: the test fails if the split fitted on every row)."""
    pub = validation.published()
    base = _refit(pub, train)
    moved_held = _refit(_scaled(pub, pub.setup == held, 1.5), train)
    assert moved_held == base
    moved_train = _refit(_scaled(pub, pub.setup == train, 1.5), train)
    assert any(abs(moved_train[k] / base[k] - 1) > 0.01 for k in base), (base, moved_train)


def test_held_out_rows_are_predicted_with_their_splits_refit_not_the_shipped_values():
    """C's decode row is predicted by the split fitted on B alone, with that split's values:
    the held-out figure is what validate-model gives under those values and differs from the
    shipped prediction (the test fails if run() reused the shipped fit)."""
    h = holdout.run(["lmsys_dsv3_h100_decode"])
    (sp,) = h.splits
    assert set(sp.train.setup) == {"B"} and set(sp.held_out.setup) == {"C"}
    (row,) = h.table.itertuples(index=False)
    assert row.row == holdout.IN_SAMPLE and row.split == sp.name
    sets = [f"{k}={v!r}" for k, v in sp.params.items()]
    again = validation.validate(["lmsys_dsv3_h100_decode"], extra_sets=sets)
    assert row.held_out == pytest.approx(again.simulated.iloc[0], rel=1e-9)
    assert abs(row.held_out / row.simulated - 1) > 0.01, (row.held_out, row.simulated)


def test_case_a_refits_see_only_their_prompt_lengths(monkeypatch):
    """Case A's splits (a full simulation per row, too slow to fit here): the table handed to
    pdsim calibrate's fit holds the training prompt lengths only, with the case's scenario as
    base and the documented cap and start."""
    pub = validation.published()
    ps = _set(H20)
    seen = []

    def spy(rows, gpu, model, engine="sglang", keys=None, files=(), base=None, source="",
            start=None, bounds=None):
        seen.append((rows.copy(), base, keys, start, bounds))
        return calibrate.Fit(gpu, model, engine, dict.fromkeys(keys, 0.5), {}, pd.DataFrame(),
                             0.0)

    monkeypatch.setattr(calibrate, "fit", spy)
    for sp in holdout.splits(pub, ps):
        holdout.refit(sp, ps)
    assert len(seen) == 2
    ttft = pub[(pub.case == "sglang_mooncake_h20_qwen3_235b") & (pub.metric == "mean_ttft_ms")]
    for (rows, base, keys, start, bounds), sp in zip(seen, holdout.splits(pub, ps),
                                                      strict=True):
        assert set(rows.input_len) == set(sp.train.x.astype(int))
        assert not set(rows.input_len) & set(sp.held_out.x.astype(int))
        assert set(rows.input_len) | set(sp.held_out.x.astype(int)) == set(ttft.x.astype(int))
        assert rows.set_index("input_len").ttft_ms.to_dict() == dict(
            zip(sp.train.x.astype(int), sp.train.value, strict=True))
        assert base["fleet"]["gpu"] == "H20-3e" and set(rows.max_concurrency) == {1}
        assert keys == ["gpu.gemm_eff", "gpu.attn_eff", "engine.bootstrap_ms"]
        assert bounds["gpu.gemm_eff"] == (0.02, 0.9) and start["engine.bootstrap_ms"] == 20


def test_derived_step_rows_are_the_table_the_shipped_calibration_was_fitted_on():
    pub = validation.published()
    rows = pub[holdout.select(pub, _set(H100)["rows"])]
    table, base = holdout.training_table(rows)
    shipped = calibrate.read_table(validation.ROOT / "lmsys_dsv3_h100_steps.csv")
    assert base is None
    assert list(table.phase) == list(shipped.phase)
    assert list(table.batch_size) == list(shipped.batch_size)
    assert list(table.tbo) == list(shipped.tbo)
    assert table.step_ms.to_numpy() == pytest.approx(shipped.step_ms.to_numpy(), abs=0.01)


def test_every_published_row_is_marked_and_every_fitted_row_held_out_once():
    pub = validation.published()
    spec = holdout.load_spec()
    kinds = holdout.classify(pub, spec)
    assert len(kinds) == len(pub)
    by_setup = {}
    for r in pub.itertuples(index=False):
        by_setup.setdefault(r.setup, set()).add(kinds[holdout._key(r.case, r.metric, r.x)][0])
    # what validation/README.md says was fitted: A's TTFT (and, upstream, its transfer rows),
    # all of B and C; D was not fitted on, but the CI model's depth was chosen with its
    # figure in view (issue 29: labelled so, not "nothing fitted on it"); F likewise (the rule
    # that calibrations hold for their layout was made with F's figure in view); E is out of
    # sample
    assert by_setup["A"] == {holdout.IN_SAMPLE, holdout.REFERENCE}
    assert by_setup["B"] == by_setup["C"] == {holdout.IN_SAMPLE}
    assert by_setup["D"] == by_setup["F"] == {holdout.IN_VIEW}
    assert by_setup["E"] == {holdout.OUT_OF_SAMPLE}
    for ps in spec["parameter_sets"]:
        held = pd.concat([sp.held_out for sp in holdout.splits(pub, ps)])
        assert len(held) == len(pub[holdout.select(pub, ps["rows"])])


def test_a_bad_holdout_spec_is_one_line(tmp_path):
    (tmp_path / "holdout.yaml").write_text(
        "parameter_sets:\n  - {name: x, gpu: H100, model: deepseek-v3, fit: [gpu.gemm_eff],\n"
        "     rows: {setup: [B]}, splits: [{name: s, train: {prompt: [1]}}]}\n")
    with pytest.raises(holdout.HoldoutError, match="unknown selector 'prompt'") as err:
        holdout.load_spec(tmp_path)
    assert "\n" not in str(err.value)
    pub = validation.published()
    ps = {**_set(H100), "splits": [{"name": "all", "train": {"setup": ["B", "C"]}}]}
    with pytest.raises(holdout.HoldoutError, match="no held-out rows"):
        holdout.splits(pub, ps)


def test_cli_holdout_prints_both_errors_and_writes_the_docs_page(capsys, tmp_path):
    cases = ["--case", "lmsys_dsv3_h100_decode", "--case", "lmsys_dsv3_h100_decode_no_tbo"]
    readme = tmp_path / "validation.md"
    readme.write_text(f"intro\n{validation.README_BEGIN}\nold\n{validation.README_END}\nend\n")
    assert main(["validate-model", *cases, "--write-docs", str(readme)]) == 0
    out = capsys.readouterr().out
    assert "held_out_error" in out and "in-sample" in out
    assert "the same rows held out of the refit (held-out)" in out
    assert "fit prefill (B), predict decode" in out  # the split that held C out, and only it
    assert "fit decode (C), predict prefill" not in out
    text = readme.read_text()
    assert "old" not in text and text.startswith("intro\n") and text.endswith("end\n")
    assert "| row | held out: simulated | error | refit on |" in text
    assert text.count("| in-sample |") == 2
    assert main(["validate-model", "--holdout", "--set", "predictor.kind=roofline"]) == 2
    err = capsys.readouterr().err.strip()
    assert "do not take --set" in err and len(err.splitlines()) == 1


def test_calibrate_fit_keeps_to_narrower_bounds():
    """The cap a shipped value documents (holdout.yaml's bounds) binds the refit."""
    pub = validation.published()
    table, _ = holdout.training_table(pub[holdout.select(pub, _set(H100)["rows"])])
    fit = calibrate.fit(table, "H100", "deepseek-v3", keys=["gpu.gemm_eff", "engine.tbo_overlap"],
                        start={"gpu.gemm_eff": 0.2, "engine.tbo_overlap": 0.5},
                        bounds={"gpu.gemm_eff": (0.02, 0.3)})
    assert fit.params["gpu.gemm_eff"] == pytest.approx(0.3, rel=1e-3)  # the free fit: 0.413
    with pytest.raises(calibrate.CalibrationError, match="leave nothing"):
        calibrate.fit(table, "H100", "deepseek-v3", keys=["gpu.gemm_eff"],
                      bounds={"gpu.gemm_eff": (2.0, 3.0)})


def test_medians_count_point_predictions_only():
    """Issue 29: the out-of-sample median counted a met upper bound (D's TPOT < 20 ms) as a
    0% row (14.9% over 11 rows, where the 10 point predictions give 20.9%)."""
    table = pd.DataFrame({
        "metric": ["a", "b", "c", "mean_tpot_ms_upper_bound"],
        "error": [0.10, -0.20, 0.30, 0.0], "row": [holdout.OUT_OF_SAMPLE] * 4})
    s = holdout.summary(table)
    assert s["out_of_sample"] == (3, pytest.approx(0.20))  # not (4, 0.15)
    assert s["all_shipped"] == (3, pytest.approx(0.20))
    v = validation.summary(table)
    assert v["rows"] == 3 and v["median_abs_error"] == pytest.approx(0.20)
    assert v["bounds"] == v["bounds_met"] == 1
    in_view = table.assign(row=[holdout.IN_VIEW] + [holdout.OUT_OF_SAMPLE] * 3)
    s = holdout.summary(in_view)
    assert s["out_of_sample"] == (2, pytest.approx(0.25)) and s["in_view"] == (1, 0.10)
    lines = "\n".join(holdout.summary_lines(in_view))
    assert "chosen in view" in lines and "point predictions only" in lines

"""The in-view record (validation/corpus/in_view.yaml): the training rows a shipped value was
chosen with in view are labelled "a value chosen in view" and left out of the out-of-sample
figures, by row id; a malformed record is one line naming the file.

The labelling tests edit a temporary copy of the shipped file, never the file itself. Checked
to fail with the loader ignoring the file (``load_in_view`` returning ``[]``, or reading the
shipped file whatever path it is given)."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest

from pdsim.analysis import corpus, corpus_table, validation
from pdsim.analysis.corpus_table import InViewError, load_in_view
from pdsim.cli.main import main


@pytest.fixture(scope="module")
def cases() -> dict[str, corpus.Case]:
    return {c.id: c for c in corpus.cases(corpus.read())}


def _frame(cases: dict[str, corpus.Case], ids: list[str]) -> pd.DataFrame:
    """Corpus-run-shaped rows for ``ids``, with made-up errors (the labelling does not look at
    them)."""
    cs = [cases[i] for i in ids]
    return pd.DataFrame({"id": ids, "gpu": [c.gpu for c in cs], "model": [c.model for c in cs],
                         "mode": [c.mode for c in cs], "family": [c.family for c in cs],
                         "measured_ttft_ms": [c.measured_ttft_ms for c in cs],
                         "measured_tpot_ms": [c.measured_tpot_ms for c in cs],
                         "ttft_error": [0.3 + 0.01 * k for k in range(len(cs))],
                         "tpot_error": [0.05] * len(cs), "skipped": [None] * len(cs)})


def _unlist(path, rid: str) -> None:
    text = path.read_text()
    assert f"    - {rid}\n" in text
    path.write_text(text.replace(f"    - {rid}\n", "", 1))


def test_a_listed_row_is_left_out_of_sample_and_unlisting_it_puts_it_back(
        tmp_path, monkeypatch, cases):
    """A row the record lists is labelled and has no out-of-sample error; the same record
    without it counts the row out of sample as it ran, and the tables say so."""
    copy = tmp_path / "in_view.yaml"
    shutil.copy(corpus_table.IN_VIEW, copy)
    monkeypatch.setattr(corpus_table, "IN_VIEW", copy)  # what markdown() reads by default
    listed = load_in_view(copy)[0].rows[0]
    other = next(i for i, c in cases.items() if c.family == "llama-3" and c.skip is None)
    df = _frame(cases, [listed, other])
    fits = {"sets": []}

    out = corpus_table.with_cv(df, fits).set_index("id")
    assert out.loc[listed, "in_view"] and pd.isna(out.loc[listed, "oos_ttft_error"])
    assert not out.loc[other, "in_view"] and out.loc[other, "oos_ttft_error"] == 0.31
    md = corpus_table.markdown(df, fits)
    assert "a value chosen in view" in md and "over 1 rows" in md
    assert "- **Chosen in view**" in md and "qwen3-moe: `gpu.moe_fp8_block_eff` 0.154" in md

    _unlist(copy, listed)
    out = corpus_table.with_cv(df, fits).set_index("id")
    assert not out.loc[listed, "in_view"] and out.loc[listed, "oos_ttft_error"] == 0.3
    md = corpus_table.markdown(df, fits)
    assert "chosen in view" not in md and "Chosen in view" not in md
    assert "over 2 rows." in md  # both out of sample now


def test_a_row_is_labelled_by_its_id_not_its_family(tmp_path, cases):
    """Listing one Llama row labels that row only, not the other rows of its family; a row a
    shipped set was fitted on and listed is labelled too and leaves the out-of-sample figures
    (its cross-validated refit did not undo a choice made with it in view)."""
    from pdsim.analysis import corpus_ship

    fits = corpus_table.load_fits()
    llama = [i for i, c in cases.items() if c.family == "llama-3" and c.skip is None][:2]
    fitted = next(i for s in fits["sets"] if corpus_ship.ships(s, cases)[0]
                  for i in s["rows"])
    copy = tmp_path / "in_view.yaml"
    copy.write_text(f"- keys: {{engine.decode_request_us: 0}}\n  note: a test note\n"
                    f"  rows: [{llama[0]}, {fitted}]\n")
    out = corpus_table.with_cv(_frame(cases, [*llama, fitted]), fits,
                               load_in_view(copy)).set_index("id")
    assert out.in_view.tolist() == [True, False, True]
    assert pd.isna(out.loc[llama[0], "oos_ttft_error"])
    assert out.loc[llama[1], "oos_ttft_error"] == 0.31
    assert out.loc[fitted, "set_shipped"] and pd.isna(out.loc[fitted, "oos_ttft_error"])
    assert pd.notna(out.loc[fitted, "cv_ttft_error"])
    fams = ", ".join(sorted({"llama-3", cases[fitted].family}))
    assert corpus_table._in_view_values(out[out.in_view]) == f"{fams}: a test note"


def test_the_record_names_the_values_its_rows_run_with(cases):
    """Each entry's keys are the values its listed rows run with (the shipped profiles as the
    generated scenario resolves them) and its note names them: a changed profile value with a
    stale record fails here."""
    from pdsim.config import loader
    from pdsim.model import profiles

    record = load_in_view()
    assert record
    for e in record:
        ran = [cases[i] for i in e.rows if cases[i].skip is None]
        assert ran
        for c in ran:
            res = profiles.for_scenario(loader.load(c.scenario, list(c.sets)))
            for k, v in e.keys.items():
                section, name = k.split(".")
                assert getattr(getattr(res, section), name) == v, (c.id, k)
        for k, v in e.keys.items():
            assert f"`{k}` {v:g}" in e.note


def test_the_shipped_record_lists_the_two_models_every_row(cases):
    """As recorded: the Qwen3-235B-A22B-FP8 and Qwen3.5-397B-A17B rows of the split, the
    refused ones included (their measurements repeat run rows'), and the six Qwen3-32B TP1 rows
    the start-up memory was looked for with."""
    train = corpus.read()
    listed = {r for e in load_in_view() for r in e.rows}
    want = set(train.id[train.model_path.isin(["Qwen/Qwen3-235B-A22B-FP8",
                                               "Qwen/Qwen3.5-397B-A17B"])])
    want |= set(train.id[(train.model_path == "Qwen/Qwen3-32B") & (train["mode"] == "agg")
                         & (train.tp_size.astype(float) == 1)])
    assert listed == want and len(want) == 64
    assert sum(cases[i].skip is not None for i in listed) == 10


GOOD_ROW = ("qwen_qwen3_235b_a22b_fp8_qwen_qwen3_235b_a22b_fp8_h200_sxm_sglang_agg_1000x100_c8_tp4_"
            "epnone_1")


@pytest.mark.parametrize("text, says", [
    ("- keys: {gpu.moe_fp8_block_eff: 0.154\n", "not valid YAML at line"),
    ("keys: {gpu.moe_fp8_block_eff: 0.154}\n", "give a list of entries"),
    ("", "give a list of entries"),
    ("- just a note\n", "entry 1: give a mapping with keys, note, rows"),
    (f"- {{keys: {{gpu.gemm_eff: 0.5}}, note: n, rows: [{GOOD_ROW}], why: x}}\n",
     "entry 1: unknown field 'why'"),
    (f"- {{keys: {{gpu.gemm_eff: 0.5}}, rows: [{GOOD_ROW}]}}\n", "entry 1: missing note"),
    (f"- {{keys: {{gpu.gemm_eff: 0.5}}, note: n, rows: [{GOOD_ROW}]}}\n"
     f"- {{keys: {{gpu.gemm_efficiency: 0.5}}, note: n, rows: [{GOOD_ROW}]}}\n",
     "entry 2: unknown key 'gpu.gemm_efficiency'"),
    (f"- {{keys: {{predictor.kind: 1}}, note: n, rows: [{GOOD_ROW}]}}\n",
     "entry 1: unknown key 'predictor.kind'"),
    (f"- {{keys: {{gpu.gemm_eff: high}}, note: n, rows: [{GOOD_ROW}]}}\n",
     "entry 1: gpu.gemm_eff: 'high' is not a number"),
    (f"- {{keys: {{}}, note: n, rows: [{GOOD_ROW}]}}\n", "entry 1: keys: give the value"),
    (f"- {{keys: {{gpu.gemm_eff: 0.5}}, note: '', rows: [{GOOD_ROW}]}}\n", "entry 1: note:"),
    ("- {keys: {gpu.gemm_eff: 0.5}, note: n, rows: [no_such_row]}\n",
     "entry 1: row 'no_such_row' is not a row id of aic_sglang_hopper_train.csv"),
    ("- {keys: {gpu.gemm_eff: 0.5}, note: n, rows: []}\n", "entry 1: rows: give a list"),
    (f"- {{keys: {{gpu.gemm_eff: 0.5}}, note: n, rows: [{GOOD_ROW}, {GOOD_ROW}]}}\n",
     "is listed twice"),
    (f"- {{keys: {{gpu.gemm_eff: 0.5}}, keys: {{gpu.hbm_eff: 0.5}}, note: n, rows: [{GOOD_ROW}]}}"
     "\n", "duplicate key"),
])
def test_a_malformed_record_is_one_line_naming_the_file(tmp_path, text, says):
    path = tmp_path / "in_view.yaml"
    path.write_text(text)
    with pytest.raises(InViewError) as err:
        load_in_view(path)
    msg = str(err.value)
    assert says in msg, msg
    assert "in_view.yaml" in msg and len(msg.splitlines()) == 1


def test_a_missing_record_is_one_line(tmp_path):
    with pytest.raises(InViewError, match=r"^in-view record not found: .*in_view\.yaml$"):
        load_in_view(tmp_path / "in_view.yaml")


def test_validate_model_refuses_a_bad_record_in_one_line_before_the_rows_run(
        tmp_path, monkeypatch, capsys):
    """`pdsim validate-model` (its training-split part) stops on a bad record with one error
    line, not a traceback, and before simulating any corpus row."""
    from pdsim.analysis import corpus_run

    bad = tmp_path / "in_view.yaml"
    bad.write_text("- {keys: {gpu.gemm_eff: 0.5}, note: n, rows: [no_such_row]}\n")
    monkeypatch.setattr(corpus_table, "IN_VIEW", bad)
    real = validation.validate
    monkeypatch.setattr(validation, "validate",  # the published part: one case, for speed
                        lambda cases=None, **kw: real(["lmsys_dsv3_h100_decode"], **kw))

    def no_rows(*a, **k):
        raise AssertionError("the corpus rows ran before the record was checked")

    monkeypatch.setattr(corpus_run, "run", no_rows)
    assert main(["validate-model"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("pdsim: error: ") and len(err.splitlines()) == 1
    assert "in_view.yaml: entry 1: row 'no_such_row' is not a row id" in err

"""The corpus's tables: per (GPU, model, mode) medians and shares, every skipped row with its
reason, the fitted parameter sets, and the README block ``pdsim validate-model
--write-readme`` fills (between ``<!-- validate-corpus:begin -->`` and ``end``).

In-sample figures are the shipped (fitted) values' errors on the rows they were fitted on;
the cross-validated ones (``validation/corpus/fits.yaml``, written by ``pdsim validate-model
--fit``) are each row predicted by a refit that did not see its group. The out-of-sample
figures leave out the rows a value was chosen with in view (``validation/corpus/in_view.yaml``).
Only point predictions (mean TTFT, mean TPOT) are counted.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from pdsim.analysis import corpus
from pdsim.util.safeio import UserFileError, decode_utf8, echo, read_user_file, show_path
from pdsim.util.safeyaml import YamlError, parse_yaml

FITS = corpus.ROOT / "fits.yaml"
BEGIN = "<!-- validate-corpus:begin -->"
END = "<!-- validate-corpus:end -->"


def load_fits(path: Path = FITS) -> dict[str, Any]:
    """The committed fit record (empty when there is none)."""
    if not path.is_file():
        return {}
    return yaml.safe_load(path.read_text()) or {}


IN_VIEW = corpus.ROOT / "in_view.yaml"
MAX_IN_VIEW_BYTES = 1 << 20  # two entries are ~6 kB
IN_VIEW_FIELDS = ("keys", "note", "rows")


class InViewError(corpus.CorpusError):
    """An in-view record that cannot be used; ``str()`` is one line naming the file."""


@dataclass(frozen=True)
class InView:
    """One entry of ``validation/corpus/in_view.yaml``: the value(s) chosen (``keys``), what
    the tables print of it (``note``) and the rows of the training split whose errors were in
    view when it was chosen (``rows``)."""

    keys: dict[str, float]
    note: str
    rows: tuple[str, ...]


def _profile_fields() -> dict[str, set[str]]:
    """A profile section's fields (``gpu``, ``engine``, ``model``: profile_schema's registry)."""
    from pdsim.config.profile_schema import KINDS, SECTION

    return {sec: set(KINDS[kind].model_fields) - {"name"} for sec, kind in SECTION.items()}


def _shown(path: Path) -> str:
    """``path`` relative to the repository when it is inside it (as the docs name it)."""
    try:
        return Path(path).resolve().relative_to(corpus.ROOT.parents[1]).as_posix()
    except ValueError:
        return show_path(path)


def load_in_view(path: Path | None = None, train: Path = corpus.TRAIN) -> list[InView]:
    """The rows a value was chosen with in view (``validation/corpus/in_view.yaml``, its fields
    documented at its top), checked: every entry has exactly ``keys`` (profile fields,
    ``gpu.``/``engine.``/``model.``, with numbers), ``note`` (text) and ``rows`` (ids of the
    training split ``train``). Anything else is one :class:`InViewError` line naming the file.
    Why it matters: a row listed here is left out of the out-of-sample figures, so a typo in an
    id would silently count a row chosen in view as a prediction."""
    path = IN_VIEW if path is None else path
    where = _shown(path)
    try:
        text = decode_utf8(read_user_file(path, "in-view record", MAX_IN_VIEW_BYTES),
                           f"in-view record {where}")
        doc = parse_yaml(text, where)
    except (UserFileError, YamlError) as err:
        raise InViewError(str(err)) from None
    if not isinstance(doc, list):
        raise InViewError(f"{where}: give a list of entries (each with "
                          f"{', '.join(IN_VIEW_FIELDS)}; [] for none), not "
                          f"{'nothing' if doc is None else type(doc).__name__}")
    ids = set(corpus.read(train).id)
    fields = _profile_fields()
    out = []
    for n, e in enumerate(doc, 1):
        at = f"{where}: entry {n}"
        if not isinstance(e, dict):
            raise InViewError(f"{at}: give a mapping with {', '.join(IN_VIEW_FIELDS)}")
        unknown = [k for k in e if k not in IN_VIEW_FIELDS]
        if unknown:
            raise InViewError(f"{at}: unknown field {echo(unknown[0])}; allowed: "
                              f"{', '.join(IN_VIEW_FIELDS)}")
        missing = [k for k in IN_VIEW_FIELDS if k not in e]
        if missing:
            raise InViewError(f"{at}: missing {', '.join(missing)}")
        keys, note, rows = e["keys"], e["note"], e["rows"]
        if not isinstance(keys, dict) or not keys:
            raise InViewError(f"{at}: keys: give the value(s) chosen, e.g. "
                              f"{{gpu.moe_fp8_block_eff: 0.154}}")
        for k, v in keys.items():
            section, _, name = str(k).partition(".")
            if name not in fields.get(section, ()):
                raise InViewError(f"{at}: unknown key {echo(k)} (give a field of a gpu, "
                                  f"engine or model profile, e.g. gpu.moe_fp8_block_eff)")
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise InViewError(f"{at}: {k}: {echo(v)} is not a number")
        if not isinstance(note, str) or not note.strip():
            raise InViewError(f"{at}: note: give the text the tables print")
        if not isinstance(rows, list) or not rows:
            raise InViewError(f"{at}: rows: give a list of row ids of {train.name}")
        for rid in rows:
            if not isinstance(rid, str) or rid not in ids:
                raise InViewError(f"{at}: row {echo(rid)} is not a row id of {train.name}")
        if len(set(rows)) < len(rows):
            dup = next(r for r in rows if rows.count(r) > 1)
            raise InViewError(f"{at}: row {echo(dup)} is listed twice")
        out.append(InView(dict(keys), note, tuple(rows)))
    return out


def with_cv(df: pd.DataFrame, fits: dict[str, Any],
            in_view: list[InView] | None = None) -> pd.DataFrame:
    """``df`` with the cross-validated predictions of the fit record (``cv_ttft_error``,
    ``cv_tpot_error``; a repeated row takes the prediction of the row it repeats), which
    parameter set each row was fitted in (``fitted_in``) and whether a value was chosen with it
    in view (``in_view``, ``in_view_notes``: ``in_view`` or, by default,
    :func:`load_in_view`). Called only with the training split's fit record: a user's own
    corpus is never labelled."""
    from pdsim.analysis.corpus_ship import ships

    pred: dict[str, list[float]] = {}
    fitted_in: dict[str, str] = {}
    shipped: dict[str, bool] = {}
    cases = _cases()
    for s in fits.get("sets", []):
        ok = ships(s, cases)[0]
        for rid in [*s.get("rows", []), *(s.get("duplicates") or {})]:
            shipped[rid] = ok
        for rid in s.get("rows", []):
            fitted_in[rid] = s["name"]
        for rid, p in (s.get("cv") or {}).get("predictions", {}).items():
            pred[rid] = p
        for rid, orig in (s.get("duplicates") or {}).items():
            fitted_in[rid] = s["name"]
            if orig in (s.get("cv") or {}).get("predictions", {}):
                pred[rid] = s["cv"]["predictions"][orig]
    out = df.copy()
    cv_t, cv_p = [], []
    for r in out.itertuples(index=False):
        p = pred.get(r.id)
        cv_t.append(p[0] / r.measured_ttft_ms - 1 if p else float("nan"))
        cv_p.append(p[1] / r.measured_tpot_ms - 1 if p else float("nan"))
    out["cv_ttft_error"], out["cv_tpot_error"] = cv_t, cv_p
    out["fitted_in"] = [fitted_in.get(i, "") for i in out.id]
    out["set_shipped"] = [shipped.get(i, False) for i in out.id]
    # out of sample: a row its shipped set was fitted on counts its cross-validated prediction
    # (a refit that did not see its group); a row no shipped set was fitted on runs with the
    # profiles as shipped, not fitted to it, and counts as it ran; either way, unless a value
    # was chosen with it in view (in_view.yaml lists it): then it is not counted out of sample
    # (a cross-validated refit does not undo a choice made with the held-out rows in view)
    notes: dict[str, tuple[str, ...]] = {}
    for e in load_in_view() if in_view is None else in_view:
        for rid in e.rows:
            notes[rid] = (*notes.get(rid, ()), e.note)
    out["in_view_notes"] = [notes.get(i, ()) for i in out.id]
    out["in_view"] = [bool(n) for n in out.in_view_notes]
    for m in ("ttft", "tpot"):
        out[f"oos_{m}_error"] = [float("nan") if iv else (c if sh else e)
                                 for c, e, sh, iv in zip(
            out[f"cv_{m}_error"], out[f"{m}_error"], out.set_shipped, out.in_view,
            strict=True)]
    return out


def _pct(x: float) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.1%}"


def _median_abs(errs: Any) -> float:
    e = [abs(x) for x in errs if isinstance(x, float) and math.isfinite(x)]
    return statistics.median(e) if e else float("nan")


def _cell(errs: Any) -> str:
    """median |error| (share within 10%, within 25%) of the finite errors."""
    e = [abs(x) for x in errs if isinstance(x, float) and math.isfinite(x)]
    if not e:
        return "—"
    return (f"{statistics.median(e):.1%} ({sum(x <= 0.10 for x in e) / len(e):.0%}, "
            f"{sum(x <= 0.25 for x in e) / len(e):.0%})")


def _fit_of(sel: pd.DataFrame) -> str:
    if "set_shipped" not in sel or not len(sel):
        return ""
    shipped = sel.set_shipped.astype(bool)
    seen = "; a value chosen in view" if "in_view" in sel and sel.in_view.astype(bool).all() \
        else ""
    if shipped.all():
        return "fitted: in-sample" + seen
    if not shipped.any():
        return "none: profiles as shipped" + seen
    return "mixed"


def group_table(df: pd.DataFrame) -> str:
    """The per-(GPU, model, mode) Markdown table: rows run, then each of mean TTFT and mean
    TPOT as its median |error| (share within ±10%, ±25%), as run and, with the fit record,
    out of sample (a fitted row's cross-validated prediction; an unfitted row as run)."""
    cv = "oos_ttft_error" in df
    ran = df[df.skipped.isna()] if "skipped" in df else df
    head = "| GPU | model | mode | rows | ran |"
    rule = "|---|---|---|---:|---:|"
    if cv:
        head += " calibration |"
        rule += "---|"
    head += " TTFT as run | TPOT as run |"
    rule += "---:|---:|"
    if cv:
        head += " TTFT out of sample | TPOT out of sample |"
        rule += "---:|---:|"
    lines = [head, rule]
    keys = list(dict.fromkeys(zip(df.gpu, df.model, df["mode"], strict=True)))
    for key in [*keys, None]:
        sel = df if key is None else df[(df.gpu == key[0]) & (df.model == key[1])
                                         & (df["mode"] == key[2])]
        r = ran.loc[ran.index.intersection(sel.index)]
        name = "**all** | | " if key is None else " | ".join(key)
        line = f"| {name} | {len(sel)} | {len(r)} |"
        if cv:
            line += f" {_fit_of(r)} |"
        line += f" {_cell(r.ttft_error)} | {_cell(r.tpot_error)} |"
        if cv:
            line += f" {_cell(r.oos_ttft_error)} | {_cell(r.oos_tpot_error)} |"
        lines.append(line)
    return "\n".join(lines)


def skipped_lines(df: pd.DataFrame) -> list[str]:
    """Every skipped row with its reason, grouped by reason."""
    if "skipped" not in df:
        return []
    sk = df[df.skipped.notna()]
    out = []
    for reason, rows in sk.groupby("skipped", sort=True):
        out.append(f"- {reason} ({len(rows)} rows): " + ", ".join(f"`{i}`" for i in rows.id))
    return out


def _cases() -> dict[str, corpus.Case]:
    return {c.id: c for c in corpus.cases(corpus.read())}


def sets_table(fits: dict[str, Any], cases: dict[str, corpus.Case] | None = None) -> str:
    """The fitted parameter sets: value, start (the profiles as shipped), bound, rows, their
    in-sample and cross-validated errors, and whether the set ships."""
    from pdsim.analysis.corpus_fit import BOUNDS, PHYSICAL
    from pdsim.analysis.corpus_ship import cv_errors, ships

    cases = cases if cases is not None else _cases()
    lines = ["| parameter set | rows | in-sample TTFT / TPOT | cross-validated TTFT / TPOT | "
             "shipped |", "|---|---:|---:|---:|---|"]
    for s in fits.get("sets", []):
        ins = [(abs(v[0] / cases[k].measured_ttft_ms - 1), abs(v[1] / cases[k].measured_tpot_ms
                                                              - 1))
               for k, v in s.get("in_sample", {}).items() if k in cases]
        it, ip = (statistics.median(x[0] for x in ins), statistics.median(x[1] for x in ins)) \
            if ins else (float("nan"), float("nan"))
        ct, cp = cv_errors(s, cases)
        ok, why = ships(s, cases)
        lines.append(f"| {s['name']} | {len(s['rows'])} (+{len(s.get('duplicates') or {})} "
                     f"repeats) | {_pct(it)} / {_pct(ip)} | {_pct(ct)} / {_pct(cp)} | "
                     f"{'yes' if ok else why} |")
    lines += ["", "| parameter set | value | fitted | ± (relative s.e.) | start (shipped profile) "
              "| fit bound | physical range |", "|---|---|---:|---:|---:|---|---|"]
    tied = []
    for s in fits.get("sets", []):
        ident = s.get("identifiability") or {}
        for k, v in s["values"].items():
            lo, hi = (fits.get("bounds") or {}).get(k, BOUNDS[k])
            plo, phi = PHYSICAL[k]
            at = s.get("at_bound", {}).get(k, "")
            out = "" if plo <= v <= phi else " **outside**"
            se = (ident.get("rel_se") or {}).get(k)
            sec = "held at its bound" if at else ("— (at an end: not estimated)"
                                                  if se is None and ident else
                                                  "—" if se is None else _se(se))
            lines.append(f"| {s['family']} | `{k}` | {v:g} | {sec} | {s['start'][k]:g} | "
                         f"[{lo:g}, {hi:g}]{' (at its ' + at + ')' if at else ''} | "
                         f"[{plo:g}, {phi:g}]{out} |")
        pairs = ident.get("correlated") or []
        if pairs:
            tied.append(f"{s['family']}: " + ", ".join(f"`{a}` with `{b}` ({r:+.2f})"
                                                        for a, b, r in pairs))
    conds = [f"{s['family']} {_cond(s['identifiability']['condition'])}"
             for s in fits.get("sets", []) if (s.get("identifiability") or {}).get("condition")]
    if any(s.get("identifiability") for s in fits.get("sets", [])):
        lines += ["", "± is each value's relative standard error as the rows determine it "
                  "(Gauss-Newton at the fit, `corpus_fit.identifiability`: which values the "
                  "rows pin, not a calibrated interval). Values whose estimates correlate by "
                  "0.9 or more are not told apart by their set's rows, which fix only a "
                  "combination of them: " + ("; ".join(tied) if tied else "none") + ". A "
                  "large condition number of the fit (" + ", ".join(conds) + ") says the "
                  "same of three or more values together, tied pair or not."]
    lines += starts_table(fits)
    return "\n".join(lines)


def starts_table(fits: dict[str, Any]) -> list[str]:
    """Where each set's fit started and what it kept (``starts`` of the record: each fixed
    start's cost under the robust loss), and the relaxation test of the values it left pressed
    against an end of their range (``relaxation``): the lines under the values table (none
    for a record written before the fit had several starts)."""
    from pdsim.analysis.corpus_fit import kept_start
    from pdsim.analysis.corpus_ship import RELAX_GAIN, not_pulling

    rows = [s for s in fits.get("sets", []) if s.get("starts")]
    if not rows:
        return []
    labels = list(dict.fromkeys(t["from"] for s in rows for t in s["starts"]))
    out = ["", "| parameter set | " + " | ".join(f"cost from {lab}" for lab in labels)
           + " | relaxation test |", "|---|" + "---:|" * len(labels) + "---|"]
    for s in rows:
        won = kept_start(s)
        costs = {t["from"]: t["cost"] for t in s["starts"]}
        cells = [("**" + f"{costs[lab]:.6g}" + "**" if lab == won else
                  f"{costs[lab]:.6g}") if lab in costs else "—" for lab in labels]
        r = s.get("relaxation") or {}
        held = not_pulling(s)
        tests = [f"`{k}` in [{a:g}, {b:g}]: {r['values'][k]:g}, "
                 + ("held at its end" if k in held else "pulling")
                 for k, (a, b) in (r.get("widened") or {}).items()]
        tests += [f"`{k}` at 0: cannot be tested" for k in r.get("untestable") or []]
        rel = ("; ".join(tests) + (f" (cost {-r['gain']:+.1%})" if r.get("widened") else "")
               if tests else "none pressed")
        out.append(f"| {s['family']} | " + " | ".join(cells) + f" | {rel} |")
    out += ["", "Each set is fitted from the profiles as shipped and from 1/4, 1/2 and 3/4 of "
            "every physical range (`corpus_fit.START_POINTS`, fixed: nothing fitted in them) "
            "and keeps the lowest cost (bold; soft-L1 cost of the log errors). A value left "
            "within 1% of an end of its range is refitted with that end moved out (upper "
            "doubled, lower halved): it is pulling, and the set does not ship, if it then "
            f"leaves the range while the cost falls by more than {RELAX_GAIN:.0%} "
            "(`corpus_fit.relax`)."]
    return out


def _cond(x: float) -> str:
    return "unbounded" if x == float("inf") else f"{x:,.0f}" if x < 1e6 else f"{x:.1e}"


def _se(x: float) -> str:
    return "> 100%" if x > 1 else f"{x:.0%}" if x >= 0.01 else "< 1%"


BAR = (0.90, 0.15, 0.10)
"""Issue 29's bar: at least 90% of the training rows run, median |error| of mean TTFT at most
15% and of mean TPOT at most 10%."""


def bar_lines(n: int, total: int, ran: pd.DataFrame) -> str:
    """Whether issue 29's bar is met, in-sample (the rows as run, fitted where a set ships)
    and out of sample, said plainly."""
    def verdict(t: float, p: float) -> str:
        ok = n / total >= BAR[0] and t <= BAR[1] and p <= BAR[2]
        return (f"{'met' if ok else 'NOT met'} (runs {n / total:.0%}, TTFT {_pct(t)}, "
                f"TPOT {_pct(p)})")

    ins = verdict(_median_abs(ran.ttft_error), _median_abs(ran.tpot_error))
    oos = verdict(_median_abs(ran.oos_ttft_error), _median_abs(ran.oos_tpot_error))
    n_oos = int(ran.oos_ttft_error.notna().sum())
    iv = _in_view_rows(ran)
    left = (f"; the {len(iv)} rows a value was chosen with in view are not counted (as run: "
            f"TTFT {_pct(_median_abs(iv.ttft_error))}, TPOT {_pct(_median_abs(iv.tpot_error))})"
            if len(iv) else "")
    return (f"Issue 29's bar (at least {BAR[0]:.0%} of rows run, median |error| TTFT at most "
            f"{BAR[1]:.0%}, TPOT at most {BAR[2]:.0%}): out of sample {oos} over {n_oos} "
            f"rows{left}; as run, in-sample where a set was fitted (a fit, not a prediction), "
            f"{ins}.")


def markdown(df: pd.DataFrame, fits: dict[str, Any], in_sample: bool = True) -> str:
    """The README block: the group table, the totals, the skipped rows, the parameter sets
    (``fits``: the record, for the cross-validated columns; ``in_sample``: the rows are the
    training split the shipped sets were fitted on)."""
    df, ran = _rows(df, fits)
    n, total = len(ran), len(df)
    lines = [group_table(df), ""]
    def errs(d: pd.DataFrame) -> str:
        return (f"median |error| TTFT {_pct(_median_abs(d.ttft_error))}, TPOT "
                f"{_pct(_median_abs(d.tpot_error))} over {len(d)} rows")

    lines.append(f"Each cell: median |error| of the mean (share of rows within ±10%, "
                 f"±25%); only point predictions (mean TTFT, mean TPOT) are counted. "
                 f"{n} of {total} rows run ({n / total:.1%}): {errs(ran)} as run.")
    if in_sample and "set_shipped" in ran:
        fitted, other = ran[ran.set_shipped], ran[~ran.set_shipped]
        lines.append("")
        lines.append(f"- **In-sample** (a shipped parameter set was fitted on these rows; a "
                     f"fit, not a prediction): {errs(fitted)}.")
        if len(other):
            lines.append(f"- **Not fitted** (no shipped set for "
                         f"{', '.join(sorted(set(other.family)))}: the profiles as shipped): "
                         f"{errs(other)}.")
    if fits:
        iv = _in_view_rows(ran)
        if len(iv):
            lines.append(f"- **Chosen in view** (fitted or not, a value was chosen with these "
                         f"rows' errors in view; not counted out of sample): {errs(iv)}; "
                         f"{_in_view_values(iv)}.")
        oos = ran[ran.oos_ttft_error.notna()]
        lines.append(f"- **Out of sample** (the fitted rows by cross-validation within the "
                     f"training split: {fits.get('cv_rule', '')}; the other rows as run): "
                     f"median |error| TTFT {_pct(_median_abs(oos.oos_ttft_error))}, TPOT "
                     f"{_pct(_median_abs(oos.oos_tpot_error))} over {len(oos)} rows. "
                     f"{fits.get('in_view', '')}")
        lines += ["", bar_lines(n, total, ran)]
    sk = skipped_lines(df)
    if sk:
        lines += ["", "Rows pdsim does not run, by reason:", "", *sk]
    if fits:
        lines += ["", "Parameter sets (`validation/corpus/README.md` gives their values and "
                  "bounds, `validation/corpus/fits.yaml` their rows):", "",
                  sets_table(fits).split("\n\n")[0]]
    return "\n".join(lines)


SUMMARY_BEGIN = "<!-- validate-corpus-summary:begin -->"
SUMMARY_END = "<!-- validate-corpus-summary:end -->"
SETS_BEGIN = "<!-- validate-corpus-sets:begin -->"
SETS_END = "<!-- validate-corpus-sets:end -->"


def _replace(path: Path, begin: str, end: str, body: str) -> None:
    text = path.read_text()
    if begin not in text or end not in text:
        raise ValueError(f"{path}: no {begin} ... {end} block to replace")
    head, rest = text.split(begin, 1)
    _old, tail = rest.split(end, 1)
    path.write_text(f"{head}{begin}\n{body}\n{end}{tail}")


def _rows(df: pd.DataFrame, fits: dict[str, Any]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The rows with their cross-validated columns (``fits``) and a ``skipped`` column, and
    those of them that ran."""
    df = with_cv(df, fits) if fits else df
    if "skipped" not in df:
        df = df.assign(skipped=None)
    return df, df[df.skipped.isna()]


def _in_view_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows a value was chosen with in view (``in_view.yaml``), if any."""
    return rows[rows.in_view.astype(bool)] if "in_view" in rows else rows.iloc[:0]


def _in_view_values(rows: pd.DataFrame) -> str:
    """Each note of ``rows`` (in view) after the model families of the rows it lists, in the
    families' order: ``family: note; ...``."""
    if "in_view_notes" not in rows:
        return ""
    fams: dict[str, set[str]] = {}
    fam = rows["family"] if "family" in rows else pd.Series("", index=rows.index)
    for f, notes in zip(fam, rows.in_view_notes, strict=True):
        for n in notes:
            fams.setdefault(n, set()).add(f)
    said = sorted((", ".join(sorted(fs)), n) for n, fs in fams.items())
    return "; ".join(f"{label}: {n}" if label else n for label, n in said)


def summary(df: pd.DataFrame, fits: dict[str, Any]) -> str:
    """The project README's block: the per-(GPU, model, mode) table and issue 29's bar."""
    df, ran = _rows(df, fits)
    out = [group_table(df), "",
           "Each cell: median |error| of the mean (share of rows within ±10%, ±25%). "
           "\"fitted: in-sample\" rows ran with a parameter set fitted on them (a fit, not a "
           "prediction); the out-of-sample columns predict them by cross-validation. "
           "\"a value chosen in view\" rows, fitted or not, ran with a value chosen with "
           "their errors in view, so they are not counted out of sample (a cross-validated "
           "refit does not undo that choice)"
           + (f" ({_in_view_values(_in_view_rows(ran))})." if len(_in_view_rows(ran))
              else ".")]
    if fits:
        out += ["", bar_lines(len(ran), len(df), ran)]
    return "\n".join(out)


def write_readme(df: pd.DataFrame, fits: dict[str, Any], readme: Path,
                 corpus_readme: Path | None = None, project_readme: Path | None = None
                 ) -> None:
    """The corpus block of ``readme``, (``corpus_readme``) the parameter sets' block of
    validation/corpus/README.md and (``project_readme``) the summary block of the project's
    README."""
    _replace(readme, BEGIN, END, markdown(df, fits))
    if corpus_readme is not None and fits:
        _replace(corpus_readme, SETS_BEGIN, SETS_END, sets_table(fits))
    if project_readme is not None:
        _replace(project_readme, SUMMARY_BEGIN, SUMMARY_END, summary(df, fits))

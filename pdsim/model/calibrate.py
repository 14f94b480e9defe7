"""``pdsim calibrate``: fit the operator predictor's efficiency and overhead values to a table.

Two kinds of rows (one CSV may mix them):

- **step rows**, as SGLang's ``bench_one_batch`` prints them: ``phase`` (prefill or decode),
  ``batch_size``, ``input_len`` (prefill: prompt tokens per request; decode: context tokens per
  sequence), ``step_ms``; optional layout columns ``tp``, ``dp``, ``dp_attention``, ``ep``,
  ``tbo``, ``expert_imbalance``, ``moe_a2a_backend`` (none or deepep), ``moe_dense_tp_size``
  (1 or empty), ``enable_dp_lm_head``, ``deepep_ll_nvlink`` (defaults: one GPU, SGLang's
  defaults).
- **serving rows**, as ``bench_serving`` prints them: ``input_len``, ``output_len``,
  ``max_concurrency``, optional ``request_rate`` (default inf) and ``num_prompts`` (default 50),
  and the measured ``ttft_ms`` and/or ``tpot_ms``. Each is simulated on a 1P1D fleet (the
  ``tp`` column, default 1), or on ``--scenario``'s fleet.

The fit (``scipy.optimize.least_squares`` on log ratios, so every row weighs by its relative
error) adjusts GPU (``gpu.*``) and engine (``engine.*``) values of the chosen (GPU, model); the
result is a profile file with one ``calibrations:`` entry that a scenario loads with
``profiles: [that.yaml]``.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pdsim.model import predictor, profiles
from pdsim.util.safeio import UserFileError, clip, decode_utf8, echo, read_user_file, show_path

# what can be fitted, with bounds (fractions stay in (0, 1])
BOUNDS = {
    "gpu.gemm_eff": (0.02, 1.0), "gpu.attn_eff": (0.02, 1.0), "gpu.decode_attn_eff": (0.02, 1.0),
    "gpu.hbm_eff": (0.05, 1.0), "gpu.nvlink_eff": (0.05, 1.0), "gpu.nic_eff": (0.05, 1.0),
    "gpu.gemm_half_tokens": (1.0, 4096.0), "gpu.allreduce_us": (0.0, 500.0),
    "gpu.a2a_us": (0.0, 2000.0),
    "engine.prefill_step_ms": (0.0, 100.0), "engine.decode_step_ms": (0.0, 100.0),
    "engine.prefill_layer_us": (0.0, 1000.0), "engine.decode_layer_us": (0.0, 1000.0),
    "engine.decode_request_us": (0.0, 1000.0), "engine.request_ms": (0.0, 1000.0),
    "engine.bootstrap_ms": (0.0, 1000.0), "engine.tokenize_us_per_token": (0.0, 50.0),
    "engine.tbo_overlap": (0.01, 1.0),
}
STEP_COLS = {"phase", "batch_size", "input_len", "step_ms"}
SERVING_COLS = {"input_len", "output_len", "max_concurrency"}


MAX_TABLE_BYTES = 4 << 20  # a calibration table is a few kB
MAX_TABLE_ROWS = 10_000  # step rows: ~2 s of fitting per 1,000; serving rows simulate each


class CalibrationError(ValueError):
    """A table that cannot be fitted; ``str()`` is one line."""


@dataclass
class Fit:
    gpu: str
    model: str
    engine: str
    params: dict[str, float]
    start: dict[str, float]
    rows: pd.DataFrame  # one row per measurement: measured, fitted, error
    cost: float
    source: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def at_bounds(self) -> dict[str, str]:
        """Fitted values that ended on a bound of their range ("upper bound 1"): the fit
        wanted to go further, so the model cannot reach the rows with that value alone."""
        out = {}
        for k, v in self.params.items():
            lo, hi = self.extra.get("bounds", {}).get(k, BOUNDS.get(k, (-math.inf, math.inf)))
            for side, b in (("upper", hi), ("lower", lo)):
                if abs(v - b) <= 1e-6 * max(1.0, abs(b)):
                    out[k] = f"{side} bound {b:g}"
        return out

    @property
    def median_abs_error(self) -> float:
        return float(self.rows.error.abs().median())

    def profile_yaml(self) -> str:
        """A profile file with this fit as the (GPU, model, engine) calibration."""
        import yaml

        rms = float(np.sqrt((self.rows.error ** 2).mean()))
        note = (f"fitted by pdsim calibrate on {self.source or 'a table'} ({len(self.rows)} "
                f"rows; median |error| {self.median_abs_error:.1%}, RMS {rms:.1%})")
        entry = {"gpu": self.gpu, "model": self.model, "engine": self.engine,
                 "set": {k: {"value": float(f"{v:.6g}"), "source": note}
                         for k, v in self.params.items()}}
        head = (f"# Written by `pdsim calibrate`: a calibration of the operator predictor for\n"
                f"# {self.gpu} / {self.model} / {self.engine}. Load it from a scenario with\n"
                f"#   profiles: [{Path(self.source).stem if self.source else 'this'}"
                f".profile.yaml]\n# after the profile files that define the GPU or model, if "
                f"they are your own.\n")
        return head + yaml.safe_dump({"calibrations": [entry]}, sort_keys=False)


def read_table(path: str | Path) -> pd.DataFrame:
    """The CSV at ``path``, read as a scenario file is (pdsim.util.safeio: a regular file, at most
    :data:`MAX_TABLE_BYTES`, UTF-8), so that a folder, a device, a huge or a binary file is
    refused in one line that says which, before pandas sees a byte."""
    what = "calibration table"
    if not str(path):
        raise CalibrationError(f"{what}: an empty path; give a CSV file (pdsim calibrate "
                               f"--help shows its columns)")
    try:
        text = decode_utf8(read_user_file(path, what, MAX_TABLE_BYTES),
                           f"{what} {show_path(path)}")
    except UserFileError as err:
        raise CalibrationError(str(err)) from None
    try:
        df = pd.read_csv(io.StringIO(text), nrows=MAX_TABLE_ROWS + 1)
    except pd.errors.EmptyDataError:
        raise CalibrationError(f"{what} {show_path(path)}: empty; give a CSV table with a "
                               f"header row") from None
    except (pd.errors.ParserError, ValueError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise CalibrationError(f"{what} {show_path(path)}: not a CSV table ({clip(first, 120)})"
                               ) from None
    if len(df) > MAX_TABLE_ROWS:  # (each row is predicted at every step of the fit)
        raise CalibrationError(f"{what} {show_path(path)}: more than {MAX_TABLE_ROWS:,} rows; "
                               f"give at most {MAX_TABLE_ROWS:,}")
    return check_table(df, f"{what} {show_path(path)}")


def check_table(df: pd.DataFrame, where: str = "table") -> pd.DataFrame:
    cols = set(df.columns)
    step = STEP_COLS <= cols
    serving = SERVING_COLS <= cols and bool({"ttft_ms", "tpot_ms"} & cols)
    if not (step or serving):
        raise CalibrationError(
            f"{where}: needs step columns ({', '.join(sorted(STEP_COLS))}) or serving columns "
            f"({', '.join(sorted(SERVING_COLS))}, and ttft_ms and/or tpot_ms); got "
            f"{clip(', '.join(map(str, df.columns)), 200)}")
    if df.empty:
        raise CalibrationError(f"{where}: no rows")
    num = df.select_dtypes("number")
    if not np.isfinite(num.to_numpy(dtype=float, na_value=0.0)).all():
        raise CalibrationError(f"{where}: non-finite numbers in the table")
    if step and "phase" in df and not df.phase.dropna().isin(["prefill", "decode"]).all():
        bad = df.phase[~df.phase.isin(["prefill", "decode"])].iloc[0]
        raise CalibrationError(f"{where}: phase must be prefill or decode, got {echo(bad)}")
    return df


def _get(row: Any, key: str, default: Any) -> Any:
    v = getattr(row, key, default)
    return default if v is None or (isinstance(v, float) and math.isnan(v)) else v


def _true(v: Any) -> bool:
    """A CSV boolean: true/false (any case), 1/0, or a bool."""
    return v is True or str(v).strip().lower() in ("true", "1", "1.0", "yes")


def _with(base: profiles.Resolved, params: dict[str, float]) -> tuple:
    g = {k[4:]: v for k, v in params.items() if k.startswith("gpu.")}
    e = {k[7:]: v for k, v in params.items() if k.startswith("engine.")}
    return base.gpu.model_copy(update=g), base.engine.model_copy(update=e)


def predict_steps(rows: pd.DataFrame, res: profiles.Resolved, params: dict[str, float]
                  ) -> np.ndarray:
    """Step time (ms) the operator predictor gives each step row."""
    gpu, eng = _with(res, params)
    out = []
    cache: dict[tuple, predictor.OperatorPredictor] = {}
    for r in rows.itertuples(index=False):
        tp, dp = int(_get(r, "tp", 1)), int(_get(r, "dp", 1))
        dpa = bool(_get(r, "dp_attention", dp > 1))
        lay = predictor.Layout(tp=tp, dp=dp, dp_attention=dpa, ep=int(_get(r, "ep", 1)),
                               gather=dp if dpa else 1, tbo=bool(_get(r, "tbo", False)),
                               imbalance=float(_get(r, "expert_imbalance", 1.0)),
                               a2a=str(_get(r, "moe_a2a_backend", "none")),
                               dense_tp1=_get(r, "moe_dense_tp_size", None) in (1, 1.0, "1"),
                               dp_lm_head=_true(_get(r, "enable_dp_lm_head", False)),
                               ll_nvlink=_true(_get(r, "deepep_ll_nvlink", True)))
        pred = cache.get(lay)
        if pred is None:
            pred = cache[lay] = predictor.OperatorPredictor(gpu, res.model, eng, lay)
        bs, n = float(r.batch_size), float(r.input_len)
        if r.phase == "prefill":
            t = pred.prefill(bs * n, bs * n * n, bs * n * (n + 1) / 2, bs, 0, bs * n)
        else:
            t = pred.decode(bs, bs * n, bs)
        out.append(t * 1e3)
    return np.array(out)


def _serving_scenario(row: Any, gpu: str, model: str, base: dict | None) -> dict:
    tp = int(_get(row, "tp", 1))
    sc = dict(base) if base else {
        "name": "calibrate", "seed": 1, "horizon_s": 36000,
        "fleet": {"gpu": gpu, "model": model,
                  "prefill": {"tp": tp, "prefix_cache": False, "chunked_prefill_size": 65536},
                  "decode": {"tp": tp}}}
    rate = _get(row, "request_rate", "inf")
    sc["clients"] = [{"kind": "bench", "name": "bench", "num_prompts": int(_get(row,
                      "num_prompts", 50)),
                      "max_concurrency": int(row.max_concurrency),
                      "request_rate": "inf" if str(rate) == "inf" else float(rate),
                      "dataset": {"kind": "random", "input_len": int(row.input_len),
                                  "output_len": int(row.output_len), "range_ratio": 1.0}}]
    return sc


def predict_serving(rows: pd.DataFrame, res: profiles.Resolved, params: dict[str, float],
                    base: dict | None = None, files: tuple[str, ...] = ()
                    ) -> tuple[np.ndarray, list[str]]:
    """(simulated values, their metric names) for the serving rows' ttft_ms / tpot_ms."""
    import pdsim

    vals, names = [], []
    gover = {k[4:]: v for k, v in params.items() if k.startswith("gpu.")}
    eover = {k[7:]: v for k, v in params.items() if k.startswith("engine.")}
    for r in rows.itertuples(index=False):
        sc = _serving_scenario(r, res.gpu.name, res.model.name, base)
        sc["profiles"] = [*sc.get("profiles", []), *files]
        sc["gpu"] = {**sc.get("gpu", {}), **gover}
        sc["engine"] = {**sc.get("engine", {}), **eover}
        m = pdsim.run(sc, allow_outside_paths=True).measured  # files the user named on the CLI
        m = m[m.generated > 0]
        sim = {"ttft_ms": float((m.t_first_token - m.t_arrival).mean()) * 1e3}
        multi = m[(m.status == "completed") & (m.generated > 1)]
        sim["tpot_ms"] = float(((multi.t_done - multi.t_first_token)
                                / (multi.generated - 1)).mean()) * 1e3
        for metric in ("ttft_ms", "tpot_ms"):
            if not math.isnan(float(_get(r, metric, float("nan")))):
                vals.append(sim[metric])
                names.append(metric)
    return np.array(vals), names


def _measured(rows: pd.DataFrame) -> tuple[np.ndarray, list[str], list[int]]:
    vals, names, idx = [], [], []
    for i, r in enumerate(rows.itertuples(index=False)):
        if "phase" in rows.columns and isinstance(_get(r, "phase", None), str):
            vals.append(float(r.step_ms))
            names.append(f"{r.phase}_step_ms")
            idx.append(i)
            continue
        for metric in ("ttft_ms", "tpot_ms"):
            v = float(_get(r, metric, float("nan")))
            if not math.isnan(v):
                vals.append(v)
                names.append(metric)
                idx.append(i)
    return np.array(vals), names, idx


def _narrowed(key: str, within: tuple[float, float] | None) -> tuple[float, float]:
    lo, hi = BOUNDS[key]
    if within is None:
        return lo, hi
    a, b = max(lo, float(within[0])), min(hi, float(within[1]))
    if not a < b:
        raise CalibrationError(f"bounds for {key} ({within[0]:g}, {within[1]:g}) leave nothing "
                               f"within ({lo:g}, {hi:g})")
    return a, b


def default_params(rows: pd.DataFrame) -> list[str]:
    """What the table can pin down: prefill rows the GEMM/attention efficiencies and the
    prefill overhead, decode rows the HBM efficiency and the decode overhead, TTFT rows the
    per-request bootstrap cost."""
    keys: list[str] = []
    phases = set(rows.phase.dropna()) if "phase" in rows else set()
    if "prefill" in phases:
        keys += ["gpu.gemm_eff", "gpu.attn_eff", "engine.prefill_step_ms"]
    if "decode" in phases:
        keys += ["gpu.hbm_eff", "engine.decode_step_ms"]
    if "ttft_ms" in rows:
        keys += ["gpu.gemm_eff", "gpu.attn_eff", "engine.bootstrap_ms"]
    if "tpot_ms" in rows:
        keys += ["gpu.hbm_eff", "engine.decode_step_ms"]
    return list(dict.fromkeys(keys))


def fit(rows: pd.DataFrame, gpu: str, model: str, engine: str = "sglang",
        keys: list[str] | None = None, files: tuple[str, ...] = (), base: dict | None = None,
        source: str = "", start: dict[str, float] | None = None,
        bounds: dict[str, tuple[float, float]] | None = None) -> Fit:
    """Least-squares fit of ``keys`` (default: :func:`default_params`) to the table, starting
    from the profile's current values (or ``start``), within :data:`BOUNDS` (or narrower
    ``bounds`` per key, e.g. a cap a shipped profile value documents)."""
    from scipy.optimize import least_squares

    rows = check_table(rows.reset_index(drop=True))
    try:
        res = profiles.resolve(gpu, model, engine, files)
    except profiles.ProfileError as err:
        msg = str(err).replace("fleet.", "--")
        if not files and ": unknown " in msg:  # (the CLI's users pass their own with a flag)
            msg += "; one of your own: --profiles FILE that defines it"
        raise CalibrationError(msg) from None
    keys = keys or default_params(rows)
    unknown = [k for k in keys if k not in BOUNDS]
    if unknown:
        raise CalibrationError(f"cannot fit {unknown[0]!r}; fittable: {', '.join(BOUNDS)}")
    start = {k: float((start or {}).get(k, getattr(res.gpu if k.startswith("gpu.")
                                                   else res.engine, k.split(".", 1)[1])))
             for k in keys}
    measured, names, idx = _measured(rows)
    if len(measured) < len(keys):
        raise CalibrationError(f"{len(measured)} measurements cannot fit {len(keys)} values "
                               f"({', '.join(keys)}); give more rows or --fit fewer")
    step_mask = np.array([n.endswith("_step_ms") for n in names])
    step_rows = rows.iloc[sorted({i for i, n in zip(idx, names, strict=True)
                                  if n.endswith("_step_ms")})]
    serve_rows = rows.iloc[sorted({i for i, n in zip(idx, names, strict=True)
                                   if not n.endswith("_step_ms")})]

    def simulate(params: dict[str, float]) -> np.ndarray:
        out = np.empty(len(measured))
        if step_mask.any():
            out[step_mask] = predict_steps(step_rows, res, params)
        if (~step_mask).any():
            out[~step_mask] = predict_serving(serve_rows, res, params, base, files)[0]
        return out

    lim = {k: _narrowed(k, (bounds or {}).get(k)) for k in keys}
    lo = np.array([max(lim[k][0], 1e-9) for k in keys])
    hi = np.array([lim[k][1] for k in keys])
    x0 = np.clip(np.array([start[k] for k in keys]), lo * 1.0001, hi * 0.9999)
    scale = np.maximum(np.abs(x0), 1e-3)

    def resid(x: np.ndarray) -> np.ndarray:
        sim = simulate(dict(zip(keys, x * scale, strict=True)))
        return np.log(np.maximum(sim, 1e-12) / measured)

    # simulated rows are smooth but noisier than the closed-form steps: larger FD steps
    diff_step = 1e-3 if (~step_mask).any() else None
    sol = least_squares(resid, x0 / scale, bounds=(lo / scale, hi / scale), x_scale="jac",
                        xtol=1e-10, ftol=1e-10, gtol=1e-10, max_nfev=200, diff_step=diff_step)
    params = dict(zip(keys, (sol.x * scale).tolist(), strict=True))
    sim = simulate(params)
    table = pd.DataFrame({"row": idx, "metric": names, "measured": measured,
                          "fitted": sim, "error": sim / measured - 1})
    return Fit(gpu, model, engine, params, start, table, float(sol.cost), source,
               {"bounds": lim})


def residual_plot(f: Fit, path: str | Path) -> Path:
    """Measured vs fitted and the relative error per row (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = f.rows
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for metric, grp in rows.groupby("metric"):
        a.scatter(grp.measured, grp.fitted, label=metric, s=18)
    lim = [rows[["measured", "fitted"]].min().min() * 0.8,
           rows[["measured", "fitted"]].max().max() * 1.25]
    a.plot(lim, lim, color="grey", lw=0.8)
    a.set(xscale="log", yscale="log", xlabel="measured (ms)", ylabel="fitted (ms)",
          title=f"{f.gpu} / {f.model}")
    a.legend(fontsize=8)
    b.axhline(0, color="grey", lw=0.8)
    b.bar(range(len(rows)), rows.error * 100,
          color=["tab:red" if abs(e) > 0.1 else "tab:blue" for e in rows.error])
    b.set(xlabel="row", ylabel="fitted / measured - 1 (%)", title="residuals")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_formats() -> set[str]:
    """File name endings :func:`residual_plot` can write (matplotlib's savefig formats)."""
    from matplotlib.backend_bases import FigureCanvasBase

    return set(FigureCanvasBase.get_supported_filetypes())


def text_residuals(f: Fit, width: int = 30) -> str:
    """The per-row errors as a text bar chart (what the terminal shows)."""
    lines = [f"{'row':>4} {'metric':<16}{'measured':>11}{'fitted':>11}{'error':>9}  "]
    for r in f.rows.itertuples(index=False):
        n = min(width, round(abs(r.error) * width / 0.5))
        bar = ("-" * n).rjust(width) + "|" if r.error < 0 else " " * width + "|" + "+" * n
        lines.append(f"{r.row:>4} {r.metric:<16}{r.measured:>11.2f}{r.fitted:>11.2f}"
                     f"{r.error:>+9.1%}  {bar}")
    return "\n".join(lines)

"""``pdsim profiles``, ``pdsim calibrate`` and ``pdsim validate-model``: the hardware and model
profiles, fitting them to measurements, and the published rows they are checked against."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from pdsim.cli.common import (
    RAW,
    Output,
    UsageError,
    check_outputs,
    die,
    inputs,
    load_scenario,
    outside_flag,
)
from pdsim.util.safeio import UserFileError, echo, read_user_file, show_path, why

PROFILES_EPILOG = """\
examples:
  pdsim profiles                 every GPU and model, one line each
  pdsim profiles H20             one profile, each value with its source
  pdsim profiles --scenario S.yaml    what a scenario runs with, and which calibration
  pdsim profiles import config.json --name my-model [--out my-model.profile.yaml]
                                 a model profile from a Hugging Face config.json"""


def add_profiles(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """``pdsim profiles``."""
    pr = sub.add_parser(
        "profiles", help="list the GPU, model and engine profiles and their sources",
        description="Without arguments: the shipped profiles. NAME: one profile, every value "
        "with its source. --scenario: the values a scenario runs with (its profile files, "
        "calibration and overrides applied) and where each came from.",
        epilog=PROFILES_EPILOG, formatter_class=RAW)
    pr.add_argument("name", nargs="?", help="show one profile with every value's source; "
                    "'import' makes a model profile from a config.json")
    pr.add_argument("config", nargs="?", help="with import: the model's config.json")
    pr.add_argument("--name", dest="import_name", metavar="NAME",
                    help="with import: the new model profile's name")
    pr.add_argument("--out", help="with import: the profile file to write (default: "
                    "NAME.profile.yaml)")
    pr.add_argument("--scenario", help="show what this scenario's fleet runs with")
    pr.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="with --scenario: overrides, e.g. gpu.hbm_tbps=3.0")
    outside_flag(pr)
    return pr


def add_calibrate(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """``pdsim calibrate``."""
    ca = sub.add_parser(
        "calibrate", help="fit the step-time model's efficiency and overhead values to "
        "measurements and write a profile file",
        description="DATA.csv: bench_one_batch-style step rows (phase, batch_size, input_len, "
        "step_ms; optional tp, dp, dp_attention, ep, tbo, expert_imbalance) and/or "
        "bench_serving rows (input_len, output_len, max_concurrency, ttft_ms and/or tpot_ms; "
        "optional request_rate, num_prompts, tp). Example: pdsim calibrate steps.csv --gpu H100 "
        "--model llama-3.1-8b --out h100_llama.yaml, then `profiles: [h100_llama.yaml]` in a "
        "scenario.")
    ca.add_argument("data", help="CSV table of measurements (a regular, uncompressed UTF-8 "
                    "file; at most 4 MB and 10,000 rows)")
    ca.add_argument("--gpu", required=True, help="GPU profile name")
    ca.add_argument("--model", required=True, help="model profile name")
    ca.add_argument("--engine", default="sglang", help="engine profile name (default sglang)")
    ca.add_argument("--fit", help="comma-separated keys to fit, e.g. gpu.gemm_eff,"
                    "engine.decode_step_ms (default: what the table's rows can pin down)")
    ca.add_argument("--profiles", action="append", default=[], metavar="FILE",
                    help="extra profile files (a GPU or model of your own)")
    ca.add_argument("--out", help="profile file to write (default: DATA.profile.yaml)")
    ca.add_argument("--plot", help="residual plot image, .png, .svg, .pdf, ... (default: "
                    "DATA.residuals.png)")
    return ca


def add_validate_model(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """``pdsim validate-model``."""
    from pdsim.cli import corpus

    vm = sub.add_parser(
        "validate-model", help="published and measured-corpus figures vs pdsim, per row "
        "(validation/)",
        description="Without corpus flags: every case in validation/cases.yaml against "
        "validation/published.csv (published vs simulated vs error), then every row of the "
        "training corpus validation/corpus/aic_sglang_hopper_train.csv as a generated scenario "
        "(per GPU, model and mode: median |error| of mean TTFT and TPOT, the share within "
        "+-10% and +-25%, and every row pdsim cannot express with its reason). --case and "
        "--holdout run the published cases only; --corpus, --quick, --json, --explain and "
        "--fit the corpus only.", epilog=corpus.CORPUS_EPILOG, formatter_class=RAW)
    vm.add_argument("--case", action="append", default=[], help="only this case (repeatable)")
    vm.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="override applied to every case's scenario")
    vm.add_argument("--csv", help="also write the rows to this CSV")
    vm.add_argument("--holdout", action="store_true", help="also refit each shipped parameter "
                    "set without some of its rows (validation/holdout.yaml, pdsim calibrate's "
                    "fit) and print every row's held-out error next to its in-sample one")
    vm.add_argument("--write-docs", dest="write_docs", metavar="PAGE", help="replace the tables "
                    "between the validate-model and validate-corpus markers in this page, e.g. "
                    "docs/validation.md (implies --holdout; the corpus's cross-validation comes "
                    "from validation/corpus/fits.yaml)")
    vm.add_argument("--write-readme", dest="write_docs", help=argparse.SUPPRESS)  # (old name)
    corpus.add_args(vm)
    return vm


def profiles_cmd(args: argparse.Namespace) -> int:
    from pdsim.config import units
    from pdsim.model import profiles

    if args.name == "import":
        return _import_cmd(args)
    for opt, given in (("--name", args.import_name), ("--out", args.out),
                       ("a second argument", args.config)):
        if given:
            return die(f"{opt} belongs to `pdsim profiles import config.json --name NAME`")
    if not args.scenario:  # (these change what a scenario reads; a shipped profile has none)
        for opt, given in (("--set", args.sets),
                           ("--allow-outside-paths", args.allow_outside_paths)):
            if given:
                return die(f"{opt} applies to a scenario's values; it needs --scenario FILE "
                           f"(pdsim profiles NAME shows a profile as shipped)")
    elif args.name:
        return die(f"profiles {echo(args.name)} --scenario: give a profile NAME or --scenario "
                   f"FILE, not both")
    if args.scenario:
        try:
            sc = load_scenario(args)
            res = profiles.for_scenario(sc)
        except (units.ScenarioError, profiles.ProfileError) as err:
            return die(str(err))
        print(f"{args.scenario}: {res.gpu.name} / {res.model.name} / {res.engine.name} "
              f"(SGLang {sc.engine.version})")
        roles = [(role, profiles.for_role(sc, cfg)) for role, cfg in sc.fleet.roles()]
        for role, r in roles:  # (a calibration may hold for one layout only)
            print(f"calibration ({role}): "
                  f"{r.calibration or 'none: the GPU and engine profiles as shipped'}")
        declared = {u.path: u for u in sc.unknowns}
        first = roles[0][1].origins
        for i, (role, r) in enumerate(roles):  # each role's own values (the first's in full)
            keys = [k for k, vo in r.origins.items() if k != "model.fitted"
                    and (i == 0 or first.get(k) != vo)]
            if len(roles) > 1:
                print(f"values ({role}):" if i == 0 else
                      f"values ({role}): as ({roles[0][0]}) but" + ("" if keys else " none"))
            for key in keys:
                value, origin = r.origins[key]
                if key in declared:  # chosen, not known: its range and why are in the scenario
                    origin = f"declared unknown at its nominal ({declared[key].describe()})"
                print(f"  {key:<30}{value!s:<11} {origin}" if len(key) < 30 else
                      f"  {key} {value!s:<11} {origin}")
        return 0
    gpus, models = profiles.raw_gpus(), profiles.raw_models()
    engines = profiles.raw_engines()
    if args.name:
        entry = gpus.get(args.name) or models.get(args.name) or engines.get(args.name)
        if entry is None:
            return die(f"no profile {echo(args.name)}; GPUs: {', '.join(sorted(gpus))}; models: "
                       f"{', '.join(sorted(models))}; engines: {', '.join(sorted(engines))}")
        for k, v in entry.items():
            if k == "fitted" and isinstance(v["value"], dict):
                print(f"{k}:")
                for g, coeffs in v["value"].items():
                    print(f"  {g}: " + ", ".join(f"{c}={x:g}" for c, x in coeffs.items()))
                continue
            print(f"{k:<24}{v['value']!s:<11} {v['source']}")
        return 0
    print(f"{'GPU':<8}{'die':<17}{'BF16 TF':>8}{'FP8 TF':>8}{'FP4 TF':>8}{'HBM MiB':>9}"
          f"{'HBM TB/s':>9}{'NVLink GB/s':>12}{'domain':>7}{'NIC Gb/s':>9}")
    for g in profiles.gpu_names():
        x = profiles.gpu(g)
        fp4 = f"{x.fp4_tflops:g}" if x.fp4_tflops else "-"
        print(f"{g:<8}{x.arch:<17}{x.bf16_tflops:>8g}{x.fp8_tflops:>8g}{fp4:>8}"
              f"{x.hbm_mib:>9,}{x.hbm_tbps:>9g}{x.nvlink_gbps:>12g}{x.domain:>7}"
              f"{x.nic_gbps:>9g}")
    print(f"\n{'model':<24}{'attn':>8}{'layers':>7}{'experts':>8}{'active B':>9}{'total B':>8}"
          f"{'weights':>11}{'KV B/token':>11}")
    for m in profiles.model_names():
        x = profiles.model(m)
        experts = f"{x.experts_per_token}/{x.experts}" if x.is_moe else "-"
        attn = x.attention + ("+dsa" if x.index_topk else "+gdn" if x.linear_attention_layers
                              else "+swa" if x.sliding_window_layers else "")
        print(f"{m:<24}{attn:>8}{x.layers:>7}{experts:>8}{x.params_active / 1e9:>9.1f}"
              f"{x.params_total / 1e9:>8.1f}{x.weight_dtype:>11}{x.kv_bytes_per_token:>11,}")
    print("\nengines: " + ", ".join(profiles.engine_names())
          + "; calibrated (GPU or die / model / engine; a GPU's applies to its die's other "
          "parts): " + ", ".join("/".join(k) for k in profiles.calibrated()))
    print("pdsim profiles NAME shows every value with its source; --scenario FILE shows what a "
          "scenario runs with and where each value came from.")
    return 0


def _import_cmd(args: argparse.Namespace) -> int:
    """``pdsim profiles import config.json --name NAME [--out FILE]``."""
    from pdsim.model import hf_import

    if not args.config or not args.import_name:
        return die("usage: pdsim profiles import config.json --name NAME [--out FILE]")
    if args.scenario or args.sets:
        return die("profiles import takes a config.json, not --scenario or --set")
    out = args.out or f"{args.import_name}.profile.yaml"
    try:
        check_outputs(inputs(None, args.config), Output("--out", out))
        model, text = hf_import.import_config(args.config, args.import_name)
    except (hf_import.ConfigImportError, UsageError) as err:
        return die(str(err))
    try:
        Path(out).write_text(text)
    except OSError as err:
        return die(f"cannot write ({why(err)}): {show_path(out)}")
    kinds = [f"{model.layers} layers"]
    if model.linear_attention_layers:
        kinds.append(f"{model.linear_attention_layers} linear attention")
    if model.sliding_window_layers:
        kinds.append(f"{model.sliding_window_layers} sliding window ({model.sliding_window})")
    if model.index_topk:
        kinds.append(f"sparse attention top-{model.index_topk}")
    experts = (f", {model.experts_per_token}/{model.experts} experts" if model.is_moe else "")
    print(f"{model.name}: {model.architecture}, {model.attention}, {', '.join(kinds)}{experts}; "
          f"{model.params_total / 1e9:.1f}B parameters ({model.params_active / 1e9:.1f}B "
          f"active), weights {model.weight_dtype}"
          + (f" (experts {model.expert_dtype})" if model.expert_dtype else "")
          + f"; KV {model.kv_bytes_per_token:,} B/token"
          + (f", state {model.state_bytes_per_request() / 2**20:.1f} MiB/request"
             if model.linear_attention_layers else ""))
    print(f"wrote {show_path(out)} (load it with `profiles: [{Path(out).name}]` and "
          f"`fleet: {{model: {model.name}}}`)", file=sys.stderr)
    return 0


def calibrate_cmd(args: argparse.Namespace) -> int:
    from pathlib import Path

    from pdsim.model import calibrate

    try:  # the table first (a path with no file name, '', '.', '/', has no stem to name
        # the outputs after), then the output paths, all before the fit
        rows = calibrate.read_table(args.data)
        stem = Path(args.data).with_suffix("")
        out = Path(args.out or f"{stem}.profile.yaml")
        plot = Path(args.plot or f"{stem}.residuals.png")
        check_outputs(inputs(None, args.data, *args.profiles), Output("--out", str(out)),
                      Output("--plot", str(plot), image=True))
        keys = [k.strip() for k in args.fit.split(",")] if args.fit else None
        fit = calibrate.fit(rows, args.gpu, args.model, args.engine, keys,
                            tuple(args.profiles), source=args.data)
    except (calibrate.CalibrationError, ValueError, UsageError) as err:
        return die(str(err))
    try:
        out.write_text(fit.profile_yaml())
        calibrate.residual_plot(fit, plot)
    except OSError as err:
        return die(f"cannot write ({why(err)}): "
                   f"{show_path(err.filename or out)}")
    print(f"fitted {len(fit.params)} value(s) of {args.gpu} / {args.model} / {args.engine} to "
          f"{len(fit.rows)} measurement(s):")
    ends = fit.at_bounds()
    for k, v in fit.params.items():
        note = f"   at its {ends[k]}" if k in ends else ""
        print(f"  {k:<28}{fit.start[k]:>10.4g} -> {v:.4g}{note}")
    if ends:
        print(f"note: the fit pushed {', '.join(ends)} to the end of the allowed range, and "
              f"other values made up the rest: the model cannot reach these rows through "
              f"{'it' if len(ends) == 1 else 'them'}. Check the rows' layout columns (tp, dp, "
              f"ep, ...) and the GPU and model profile values, or --fit other values.")
    print()
    print(calibrate.text_residuals(fit))
    print(f"\nmedian |error| {fit.median_abs_error:.1%}")

    # (its GPU or model may be defined in --profiles' files; a scenario names files relative
    # to itself: say it for a scenario beside the written profile)
    rel = [os.path.relpath(f, out.parent or ".") for f in args.profiles]
    outside = ("; a file outside that folder needs --allow-outside-paths, or a copy inside"
               if any(r.startswith("..") for r in rel) else "")
    print(f"wrote {out} (load it from a scenario in {show_path(out.parent)} with `profiles: "
          f"[{', '.join([*rel, out.name])}]`{outside})", file=sys.stderr)
    print(f"wrote {plot}", file=sys.stderr)
    return 0


def validate_model_cmd(args: argparse.Namespace) -> int:
    from pathlib import Path

    import pandas as pd

    from pdsim.analysis import holdout, validation, validation_table
    from pdsim.analysis.corpus import CorpusError
    from pdsim.cli import corpus
    from pdsim.config import units

    if corpus.wanted(args):
        bad = [o for o, v in (("--case", args.case), ("--holdout", args.holdout),
                              ("--write-docs", args.write_docs)) if v]
        if bad:
            return die(f"{bad[0]} belongs to the published cases; the corpus flags (--corpus, "
                       f"--quick, --json, --explain, --fit) run the corpus only")
        if args.workers is not None and args.workers < 1:
            return die(f"--workers {args.workers}: give at least 1")
        if args.family and not args.fit:
            return die("--family says which sets --fit refits; give --fit too")
        try:
            if args.csv:  # (the corpus and validation files are its inputs)
                check_outputs({p.resolve(): "validation file" for p in
                               validation.ROOT.rglob("*") if p.is_file()},
                              Output("--csv", args.csv))
            if args.explain:
                return corpus.explain(args)
            if args.fit:
                return corpus.fit(args)
            code, cdf = corpus.run(args)
            if args.csv:
                cdf.to_csv(args.csv, index=False)
                print(f"wrote {show_path(args.csv)}", file=sys.stderr)
            return code
        except (CorpusError, UsageError, units.ScenarioError, ValueError) as err:
            return die(str(err))
    do_holdout = args.holdout or bool(args.write_docs)
    if do_holdout and args.sets:
        return die("--holdout (and --write-docs) refit the shipped parameter sets; they do "
                   "not take --set")
    try:  # the output paths are checked before the refit, not after it
        if args.csv:  # (the validation data and cases are its inputs)
            check_outputs({p.resolve(): "validation file" for p in
                           validation.ROOT.rglob("*") if p.is_file()},
                          Output("--csv", args.csv))
        if args.write_docs:
            _check_page(args.write_docs)
    except UsageError as err:
        return die(str(err))
    try:
        if do_holdout:
            if args.write_docs and not args.holdout:
                print("--write-docs: refitting for the held-out columns (--holdout)",
                      file=sys.stderr)
            ho = holdout.run(args.case or None, progress=sys.stderr.isatty())
            df = ho.table
        else:
            df = validation.validate(args.case or None, extra_sets=args.sets,
                                     progress=sys.stderr.isatty())
            if not args.sets:
                df = holdout.mark(df)
    except (units.ScenarioError, ValueError) as err:
        return die(str(err))
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        shown = df.assign(error=[validation.shown_error(e, m)
                                 for e, m in zip(df.error, df.metric, strict=True)])
        drop = ["unit", "source", "fitted_in"]
        if do_holdout:
            shown = shown.assign(held_out_error=[
                "" if pd.isna(e) else validation.shown_error(e, m)
                for e, m in zip(df.held_out_error, df.metric, strict=True)])
        print(shown.drop(columns=[c for c in drop if c in shown]).to_string(index=False))
    s = validation.summary(df)
    bounds = (f"; {s['bounds_met']} of {s['bounds']} upper bounds met" if s["bounds"]
              else "")
    print(f"\n{s['rows']} point predictions: median |error| {s['median_abs_error']:.1%}, max "
          f"{s['max_abs_error']:.1%}, {s['within_25pct']} within +-25%{bounds}")
    if "row" in df:
        print("\n".join(holdout.summary_lines(df)))
    if do_holdout:
        print("\nrefitted with pdsim calibrate on each split's rows (shipped -> refitted):")
        print(holdout.fits_text(ho.splits))
    cdf = None
    if not args.case and (not args.holdout or args.write_docs):  # then the training corpus
        print("\nmeasured corpus (validation/corpus/aic_sglang_hopper_train.csv), one "
              "generated scenario per row:\n")
        try:
            _code, cdf = corpus.run(args)
        except (CorpusError, units.ScenarioError, ValueError) as err:
            return die(str(err))
    try:
        if args.csv:
            df.to_csv(args.csv, index=False)
            print(f"wrote {show_path(args.csv)}", file=sys.stderr)
        if args.write_docs:
            validation_table.write_table(df, Path(args.write_docs))
            from pdsim.analysis import corpus_table

            if cdf is not None and corpus_table.BEGIN not in Path(args.write_docs).read_text():
                print(f"--write-docs: {show_path(args.write_docs)} has no "
                      f"{corpus_table.BEGIN} block: the corpus table is not written",
                      file=sys.stderr)
            elif cdf is not None:
                from pdsim.analysis.corpus import ROOT

                ours = Path(args.write_docs).resolve() == ROOT.parents[1] / "docs" / \
                    "validation.md"
                corpus_table.write_readme(cdf, corpus_table.load_fits(), Path(args.write_docs),
                                          ROOT / "README.md" if ours else None,
                                          ROOT.parents[1] / "README.md" if ours else None)
            print(f"wrote the tables into {show_path(args.write_docs)}", file=sys.stderr)
    except OSError as err:
        return die(f"cannot write ({why(err)}): "
                   f"{show_path(err.filename or args.csv or args.write_docs)}")
    return 0


def _check_page(path: str) -> None:
    """``validate-model --write-docs FILE``: a file holding the validate-model markers."""
    from pdsim.analysis import validation

    p = Path(path)
    if not p.is_file():
        raise UsageError(f"--write-docs {show_path(path)}: not a file; give the page whose "
                         f"table to refresh (docs/validation.md)")
    try:
        text = read_user_file(p, "--write-docs", max_bytes=4 << 20).decode("utf-8", "replace")
    except UserFileError as err:
        raise UsageError(str(err)) from None
    if validation.README_BEGIN not in text or validation.README_END not in text:
        raise UsageError(f"--write-docs {show_path(path)}: no {validation.README_BEGIN} ... "
                         f"{validation.README_END} block to replace (add the two markers "
                         f"where the table goes)")

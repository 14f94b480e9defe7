"""The measured corpus (``validation/corpus/``): every row a scenario generated from its columns.

A corpus row is one measured SGLang serving benchmark (aiconfigurator's ``silicon_sample.csv``
format; ``validation/corpus/README.md`` says what each column means). :func:`generate` turns a
row into a pdsim scenario by one set of rules, the same for every row (never edited per row):

- the GPU from ``system`` (:func:`gpu_of`), the model from ``model_path`` (:data:`MODELS`), the
  weight formats from ``gemm_quant_mode`` / ``moe_quant_mode``, the SGLang release from
  ``backend_version`` (``engine.version``; an image tag such as ``glm5-hopper`` through
  :data:`pdsim.config.engine_version.ALIASES`);
- the layout: ``agg`` rows one colocated server of ``tp_size`` GPUs (``attention_dp_size > 1``:
  DP attention over them, ``moe_ep_size``: expert parallelism), ``disagg`` rows a PD fleet of
  ``prefill_num_workers`` / ``decode_num_workers`` servers with the ``prefill_*`` /
  ``decode_*`` layouts;
- the server flags: the InferenceX launch flags (:data:`INFERENCEX`, issue 29 fact sheet D2)
  for the rows measured by that harness, else the release's defaults (:func:`defaults_flags`);
  a CSV's optional flag columns (:mod:`pdsim.analysis.corpus_flags`) override either;
- the client: bench_serving's random dataset with lengths uniform in [0.8 L, L], ignore-eos,
  request rate inf, ``--max-concurrency`` the row's concurrency, 10 x concurrency prompts and
  2 x concurrency warmup requests that finish before timing (:func:`client`).

Each choice a row's columns do not settle is an assumption, written here and listed per row by
``pdsim validate-model --explain ROW_ID``. A row pdsim cannot express is refused with a named
reason (:class:`Skip`): an unknown GPU, model, format, release, engine or mode, or a layout
SGLang or pdsim cannot run.

:mod:`pdsim.analysis.corpus_run` runs the generated scenarios and tabulates the errors.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from pdsim.analysis import corpus_flags
from pdsim.util.safeio import UserFileError, clip, decode_utf8, echo, read_user_file, show_path

ROOT = Path(__file__).resolve().parents[2] / "validation" / "corpus"
TRAIN = ROOT / "aic_sglang_hopper_train.csv"
MAX_CORPUS_BYTES = 16 << 20  # the public file is ~1 MB for ~1,500 rows
MAX_CORPUS_ROWS = 20_000

REQUIRED = ("id", "silicon_data_source", "backend", "backend_version", "model_path", "system",
            "mode", "isl", "osl", "gemm_quant_mode", "moe_quant_mode", "tp_size",
            "attention_dp_size", "moe_tp_size", "moe_ep_size", "pp_size", "silicon_ttft_ms",
            "silicon_tpot_ms")
ROLE_COLUMNS = ("batch_size", "num_workers", "tp_size", "pp_size", "attention_dp_size",
                "moe_tp_size", "moe_ep_size")
DISAGG_REQUIRED = tuple(f"{r}_{c}" for r in ("prefill", "decode") for c in ROLE_COLUMNS)

HORIZON_S = 86_400.0  # a day of simulated time: no corpus row comes near it
SEED = 1  # every generated scenario's seed (the lengths bench_serving draws are a sample)
RANGE_RATIO = 0.8  # InferenceX RANDOM_RANGE_RATIO (benchmark-tmpl.yml l.72)
FIXED_SOURCE = "aic-auto-gap-analysis"  # silicon_data_source of the rows measured at fixed lengths
FIXED_LENGTHS = (
    "lengths fixed at isl and osl (range ratio 1.0), not the InferenceX protocol the corpus "
    "README states: the row comes from NVIDIA's aic-auto-gap-analysis collection, whose client "
    "is not published (fact sheet F1). CHOSEN IN VIEW of these rows' figures: their mean TTFT is "
    "45-85 decode steps while their mean TPOT leaves the GPU no time for prefills that long, "
    "which only synchronized waves (every request of a closed loop finishing in the same step, "
    "as fixed output lengths make them) explain; with the profiles as shipped, range ratio 0.8 "
    "gives Qwen3-32B (TP2-8) a median TTFT error of -85%, 1.0 gives 11% (TPOT 31% -> 5%). "
    "A corpus column random_range_ratio, if present, says it instead")
PROMPTS_PER_CONCURRENCY = 10  # --num-prompts $((CONC*10))
WARMUPS_PER_CONCURRENCY = 2  # --num-warmups $((2*max_concurrency))

# model_path (lower case) -> pdsim model profile (its family: the profile's ``family``)
MODELS: dict[str, str] = {
    "qwen/qwen3-32b": "qwen3-32b",
    "qwen/qwen3-32b-fp8": "qwen3-32b",
    "qwen/qwen3-235b-a22b": "qwen3-235b-a22b",
    "qwen/qwen3-235b-a22b-fp8": "qwen3-235b-a22b",
    "qwen/qwen3.5-397b-a17b": "qwen3.5-397b-a17b",
    "qwen/qwen3.5-397b-a17b-fp8": "qwen3.5-397b-a17b",
    "meta-llama/llama-3.1-8b-instruct": "llama-3.1-8b",
    "meta-llama/llama-3.1-8b": "llama-3.1-8b",
    "meta-llama/llama-3.1-70b-instruct": "llama-3.1-70b",
    "meta-llama/llama-3.1-70b": "llama-3.1-70b",
    "deepseek-ai/deepseek-r1": "deepseek-r1",
    "deepseek-ai/deepseek-r1-0528": "deepseek-r1",
    "deepseek-ai/deepseek-v3": "deepseek-v3",
    # the corpus's "zhipuai/GLM-5" is no Hugging Face repo (the org is zai-org): the checkpoint
    # InferenceX serves, zai-org/GLM-5-FP8 (fact sheet B3)
    "zhipuai/glm-5": "glm-5",
    "zai-org/glm-5": "glm-5",
    "zai-org/glm-5-fp8": "glm-5",
    "openai/gpt-oss-120b": "gpt-oss-120b",
}
# weight-format columns -> pdsim weight dtypes (an empty cell: the checkpoint's BF16)
FORMATS = {"": "bf16", "bf16": "bf16", "float16": "bf16", "fp16": "bf16", "fp8": "fp8",
           "fp8_block": "fp8_block", "nvfp4": "nvfp4", "mxfp4": "mxfp4", "w4a16": "int4",
           "int4": "int4"}

# InferenceX launch flags (github:SemiAnalysisAI/InferenceX @626932a11,
# .github/configs/nvidia-master.yaml and benchmarks/*; issue 29 fact sheet D2), keyed by
# (model profile, GPU, SGLang release): a row of that model on that GPU with that release is
# taken as measured by that config. ``{conc}`` / ``{osl}`` are the row's.
INFERENCEX: dict[tuple[str, str, str], dict[str, Any]] = {
    ("qwen3.5-397b-a17b", "H200", "0.5.9"): {
        "config": "qwen3.5-fp8-h200-sglang (image lmsysorg/sglang:v0.5.9-cu129-amd64)",
        "flags": "--tp 8 --expert-parallel-size 8 --max-running-requests 128 "
                 "--chunked-prefill-size 16384 --mem-fraction-static 0.8 --cuda-graph-max-bs "
                 "$CONC --kv-cache-dtype fp8_e4m3 --quantization fp8 --attention-backend "
                 "flashinfer --mamba-ssm-dtype bfloat16 --disable-radix-cache",
        "role": {"max_running_requests": 128, "chunked_prefill_size": 16384,
                 "mem_fraction_static": 0.8, "cuda_graph_max_bs": "{conc}",
                 "prefix_cache": False},
        "model": {"kv_dtype": "fp8", "mamba_ssm_dtype": "bf16"},
        "ep": 8,
    },
    ("deepseek-r1", "H200", "0.5.9"): {
        "config": "dsr1-fp8-h200-sglang (image lmsysorg/sglang:v0.5.9-cu130)",
        "flags": "--tensor-parallel-size 8 --data-parallel-size 1 --disable-radix-cache "
                 "--max-running-requests 512 (1k/1k; else 256) --cuda-graph-max-bs 512 (1k/1k; "
                 "else 256) --chunked-prefill-size 32768 --max-prefill-tokens 32768 "
                 "--mem-fraction-static 0.82 --attention-backend flashinfer",
        "role": {"max_running_requests": "{r1_running}", "cuda_graph_max_bs": "{r1_running}",
                 "chunked_prefill_size": 32768, "max_prefill_tokens": 32768,
                 "mem_fraction_static": 0.82, "prefix_cache": False},
        "model": {},
    },
    ("glm-5", "H200", "glm5-hopper"): {
        "config": "glm5-fp8-h200-sglang (image lmsysorg/sglang:glm5-hopper)",
        "flags": "--tp-size 8 --mem-fraction-static 0.85 (everything else SGLang's default: "
                 "radix cache on, chunked prefill 8192, CUDA graphs to 512)",
        "role": {"mem_fraction_static": 0.85},
        "model": {},
    },
}

QUICK = (
    # ``validate-model --quick`` (and the test suite): per (GPU, model, mode) of the training
    # split, its row with the least work (concurrency x (isl + osl)), and one refused row
    "qwen_qwen3_32b_qwen_qwen3_32b_h100_sxm_sglang_agg_1024x128_c16_tp2_epnone_1",
    "qwen3_32b_qwen3_32b_h100_sxm_sglang_disagg_4000x1000_c_tpnone_epnone_3",
    "qwen_qwen3_235b_a22b_fp8_qwen_qwen3_235b_a22b_fp8_h200_sxm_sglang_agg_1000x100_c3_tp2_"
    "epnone_2",
    "meta_llama_llama_3_1_8b_instruct_meta_llama_llama_3_1_8b_instruct_h200_sxm_sglang_agg_"
    "8000x100_c20_tp1_epnone_38",
    "2026_03_25_deepseek_r1_h200_sxm_sglang_fp8_agg_1024x8192_c4_tp8_0_ep1_0_309",
    "2026_03_25_glm_5_h200_sxm_sglang_fp8_agg_1024x1024_c4_tp8_0_ep1_0_500",
    "2026_03_25_qwen3_5_397b_h200_sxm_sglang_fp8_agg_1024x1024_c4_tp8_0_ep8_0_591",
    "2026_04_06_qwen3_5_397b_h200_sxm_sglang_fp8_agg_8192x1024_c64_tp8_ep8_1499",
)

# The assumptions every generated scenario makes (``--explain`` lists them with the row's own)
COMMON_ASSUMPTIONS = (
    "client: bench_serving's random dataset, input and output lengths uniform integers in "
    "[r L, L] (r: InferenceX's --random-range-ratio 0.8 unless said below), "
    "--ignore-eos (each request generates exactly its drawn output length), "
    "--request-rate inf, --max-concurrency = the row's concurrency, 10 x concurrency timed "
    "prompts; lengths drawn with seed 1",
    "warmup: 2 x concurrency copies of the first prompt that finish before timing starts; "
    "pdsim's client sends them at once with outputs cut to 32 tokens (InferenceX sends them "
    "under the concurrency limit with the first prompt's full output): what they leave for "
    "the timed run is the same (the first prompt in the radix cache, an idle scheduler whose "
    "new-token ratio is reset)",
    "one SGLang server per worker; a colocated (agg) row's server receives every request "
    "(one worker: the corpus's agg rows give no worker count)",
    "tokenization, the HTTP hop and streaming: pdsim's engine profile (sglang) values; "
    "--stream-interval does not delay the first token (fact sheet A5)",
)


class CorpusError(ValueError):
    """A corpus file that cannot be used; ``str()`` is one line."""


@dataclass(frozen=True)
class Skip:
    """A row pdsim cannot express: ``kind`` (the reason's name) and what exactly."""

    kind: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}"


@dataclass
class Case:
    """One corpus row and what was generated from it."""

    id: str
    gpu: str  # the row's system, as the table groups it
    model: str  # the row's model_path
    mode: str  # agg / disagg
    measured_ttft_ms: float
    measured_tpot_ms: float
    concurrency: int | None = None
    family: str = ""
    profile: str = ""  # pdsim model profile
    scenario: dict | None = None
    skip: Skip | None = None
    assumptions: list[str] = field(default_factory=list)
    isl: int = 0
    osl: int = 0
    sets: tuple[str, ...] = ()  # --set overrides to apply when it runs


# --- reading --------------------------------------------------------------------------------


def read(path: str | Path = TRAIN) -> pd.DataFrame:
    """The corpus CSV at ``path``, read as a user file (a regular file under
    :data:`MAX_CORPUS_BYTES`, UTF-8) and checked for the columns :data:`REQUIRED` (one-line
    :class:`CorpusError` otherwise)."""
    what = "corpus"
    try:
        text = decode_utf8(read_user_file(path, what, MAX_CORPUS_BYTES),
                           f"{what} {show_path(path)}")
    except UserFileError as err:
        raise CorpusError(str(err)) from None
    try:
        df = pd.read_csv(io.StringIO(text), nrows=MAX_CORPUS_ROWS + 1, dtype={"id": str},
                         keep_default_na=True)
    except pd.errors.EmptyDataError:
        raise CorpusError(f"{what} {show_path(path)}: empty; give a CSV with a header row "
                          f"(validation/corpus/README.md lists the columns)") from None
    except (pd.errors.ParserError, ValueError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise CorpusError(f"{what} {show_path(path)}: not a CSV table ({clip(first, 120)})"
                          ) from None
    if len(df) > MAX_CORPUS_ROWS:
        raise CorpusError(f"{what} {show_path(path)}: more than {MAX_CORPUS_ROWS:,} rows")
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise CorpusError(f"{what} {show_path(path)}: missing column(s) {', '.join(missing)} "
                          f"(validation/corpus/README.md lists the columns)")
    if df.empty:
        raise CorpusError(f"{what} {show_path(path)}: no rows")
    if df["id"].isna().any() or df["id"].duplicated().any():
        bad = df["id"][df["id"].isna() | df["id"].duplicated()].iloc[0]
        raise CorpusError(f"{what} {show_path(path)}: every row needs a unique id (got "
                          f"{echo(bad)} twice or empty)")
    return df


# --- the rules ------------------------------------------------------------------------------


_cell = corpus_flags.cell


def _int(row: dict, key: str, default: int | None = None) -> int | None:
    try:
        return corpus_flags.whole(row, key, default)
    except corpus_flags.Malformed as err:
        raise _Refuse("malformed row", str(err)) from None


class _Refuse(Exception):
    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(kind, detail)
        self.skip = Skip(kind, detail)


def concurrency(row: dict) -> int:
    """The benchmark's ``--max-concurrency``: ``silicon_concurrency=N`` in the data source;
    else (rows that do not state it: the PD rows of older exports) the decode batch times the
    decode workers and DP ranks, which the corpus README defines the batch from."""
    src = str(_cell(row, "silicon_data_source") or "")
    m = re.search(r"silicon_concurrency=(\d+)", src)
    if m:
        return int(m.group(1))
    bs = _int(row, "decode_batch_size") if _cell(row, "mode") == "disagg" else None
    if bs:
        return bs * (_int(row, "decode_num_workers", 1) or 1) * \
            (_int(row, "decode_attention_dp_size", 1) or 1)
    raise _Refuse("no concurrency", "neither silicon_concurrency=N in silicon_data_source nor "
                  "a decode batch size to derive it from")


def gpu_of(system: str) -> str | None:
    """A ``system`` name to a pdsim GPU profile: the name without its form factor suffix
    (``_sxm``, ``_pcie``, ``_nvl``), upper case (``h100_sxm`` -> ``H100``, ``gb200`` ->
    ``GB200``), if pdsim has that profile."""
    from pdsim.model import profiles

    name = re.sub(r"_(sxm\d*|pcie|nvl\d*)$", "", system.strip().lower()).upper()
    return name if name in profiles.gpu_names() else None


def _format(row: dict, key: str) -> str:
    v = str(_cell(row, key) or "").lower()
    if v not in FORMATS:
        raise _Refuse("unknown format", f"{key} {echo(v)}; known: "
                      f"{', '.join(k for k in FORMATS if k)}")
    return FORMATS[v]


def _layout(row: dict, prefix: str, model: Any) -> dict:
    """One role's sharding from the row's ``{prefix}tp_size`` ... columns (a colocated row's
    bare columns, a PD row's ``prefill_`` / ``decode_`` ones)."""
    tp = _int(row, f"{prefix}tp_size")
    if not tp:
        raise _Refuse("unknown layout", f"{prefix}tp_size is empty")
    pp = _int(row, f"{prefix}pp_size", 1) or 1
    if pp != 1:
        raise _Refuse("unknown layout", f"{prefix}pp_size {pp}: pdsim has no pipeline "
                      f"parallelism")
    dp = _int(row, f"{prefix}attention_dp_size", 1) or 1
    ep = _int(row, f"{prefix}moe_ep_size", 1) or 1
    moe_tp = _int(row, f"{prefix}moe_tp_size")
    if dp > 1 and tp % dp:
        raise _Refuse("unknown layout", f"{prefix}tp_size {tp} is not a multiple of "
                      f"{prefix}attention_dp_size {dp}")
    if not model.is_moe:
        ep = 1  # (a dense model: the MoE columns say nothing)
    elif moe_tp is not None and moe_tp * ep != tp:
        raise _Refuse("unknown layout", f"{prefix}moe_tp_size {moe_tp} x {prefix}moe_ep_size "
                      f"{ep} != {prefix}tp_size {tp} (SGLang: moe_tp_size = tp_size / "
                      f"ep_size)")
    out: dict[str, Any] = {"tp": tp, "ep": ep}
    if dp > 1:
        out.update(dp=dp, dp_attention=True)
    return out


def defaults_flags(version: str) -> str:
    """The declared assumption of a row not measured by an InferenceX config."""
    return (f"server flags unknown (not an InferenceX config): SGLang {version}'s defaults "
            f"(radix cache on, chunked prefill, mem_fraction_static and CUDA-graph cap as the "
            f"release derives them for the GPU and tp, page size 1, --max-running-requests "
            f"unset: min(KV pool / 2, 2048..4096 request slots), which binds no corpus "
            f"concurrency unless the pool is small)")


def _fill(value: Any, conc: int, osl: int, isl: int) -> Any:
    if value == "{conc}":
        return conc
    if value == "{r1_running}":  # dsr1 scripts: 512 for 1k/1k, else 256
        return 512 if (isl, osl) == (1024, 1024) else 256
    return value


def generate(row: dict) -> Case:
    """The case of one corpus row (its columns as a dict): a scenario, or the reason why none."""
    from pdsim.config.engine_version import ALIASES, SGLANG_VERSIONS
    from pdsim.model import profiles

    def num(key: str) -> float:
        v = _cell(row, key)
        try:
            return float(v)
        except (TypeError, ValueError):
            return float("nan")

    case = Case(id=str(row.get("id")), gpu=str(_cell(row, "system") or ""),
                model=str(_cell(row, "model_path") or ""), mode=str(_cell(row, "mode") or ""),
                measured_ttft_ms=num("silicon_ttft_ms"), measured_tpot_ms=num("silicon_tpot_ms"))
    try:
        try:
            _generate(row, case, profiles, SGLANG_VERSIONS, ALIASES)
        except corpus_flags.Malformed as err:
            raise _Refuse("malformed row", str(err)) from None
    except _Refuse as r:
        case.skip = r.skip
        case.scenario = None
    return case


def _generate(row: dict, case: Case, profiles: Any, versions: dict, aliases: dict) -> None:
    backend = str(_cell(row, "backend") or "").lower()
    if backend != "sglang":
        raise _Refuse("unknown engine", f"backend {echo(backend)}: pdsim models SGLang only")
    version = str(_cell(row, "backend_version") or "")
    if version not in versions:
        raise _Refuse("unknown release", f"backend_version {echo(version)}; known: "
                      f"{', '.join(versions)}")
    gpu = gpu_of(case.gpu)
    if gpu is None:
        raise _Refuse("unknown GPU", f"system {echo(case.gpu)}; pdsim GPUs: "
                      f"{', '.join(profiles.gpu_names())}")
    profile = MODELS.get(case.model.lower())
    if profile is None:
        raise _Refuse("unknown model", f"model_path {echo(case.model)}; known: "
                      f"{', '.join(sorted(MODELS))}")
    model = profiles.model(profile)
    family = model.family
    case.profile, case.family = profile, family
    if case.mode not in ("agg", "disagg"):
        raise _Refuse("unknown mode", f"mode {echo(case.mode)}; known: agg (colocated), "
                      f"disagg (PD)")
    isl, osl = _int(row, "isl"), _int(row, "osl")
    if not isl or not osl:
        raise _Refuse("malformed row", "isl and osl must be positive whole numbers")
    case.isl, case.osl = isl, osl
    conc = concurrency(row)
    if conc < 1:
        raise _Refuse("no concurrency", "concurrency 0")
    case.concurrency = conc
    gemm, moe = _format(row, "gemm_quant_mode"), _format(row, "moe_quant_mode")
    if gemm in ("nvfp4",) and not profiles.gpu(gpu).fp4_tflops:
        raise _Refuse("unknown format", f"gemm_quant_mode {gemm} on {gpu} (no FP4 tensor "
                      f"cores; SGLang refuses it)")
    model_over: dict[str, Any] = {"weight_dtype": gemm}
    if model.is_moe:
        model_over["expert_dtype"] = moe
    assumptions = [*COMMON_ASSUMPTIONS]
    assumptions.append(f"model {case.model} -> pdsim profile {profile} (family {family}); "
                       f"weights {gemm}" + (f", experts {moe}" if model.is_moe else "")
                       + " from gemm_quant_mode / moe_quant_mode (empty: BF16)")
    if version in aliases:
        assumptions.append(f"backend_version {version} is an image tag, taken as SGLang "
                           f"{aliases[version]} ({versions[version]})")
    ix = INFERENCEX.get((profile, gpu, version))
    if ix is not None:
        assumptions.append(f"server flags: InferenceX config {ix['config']}: {ix['flags']}")
        model_over.update(ix["model"])
        flags = {k: _fill(v, conc, osl, isl) for k, v in ix["role"].items()}
    else:
        assumptions.append(defaults_flags(version))
        flags = {}
    if model.index_topk:
        flags["page_size"] = 64
        assumptions.append("page size 64: SGLang forces it for DSA (NSA) attention on CUDA "
                           "(server_args.py _handle_page_size)")
    if _cell(row, "kv_cache_dtype") not in (None, ""):
        kv = corpus_flags.kv_cache_dtype(row, assumptions)
        if kv is None:
            model_over.pop("kv_dtype", None)
        else:
            model_over["kv_dtype"] = kv
    ratio = _range_ratio(row, ix is not None, assumptions)
    client = {"kind": "bench", "name": "bench", "num_prompts": PROMPTS_PER_CONCURRENCY * conc,
              "max_concurrency": conc, "request_rate": "inf",
              "warmup_requests": WARMUPS_PER_CONCURRENCY * conc,
              "dataset": {"kind": "random", "input_len": isl, "output_len": osl,
                          "range_ratio": ratio}}
    sc: dict[str, Any] = {"name": f"corpus {case.id}"[:100], "seed": SEED,
                          "horizon_s": HORIZON_S, "timeseries_interval_s": HORIZON_S / 1000,
                          "engine": {"version": version}, "model": model_over,
                          "clients": [client]}
    if case.mode == "agg":
        lay = _layout(row, "", model)
        if ix is not None and "ep" in ix and lay["ep"] != ix["ep"]:
            raise _Refuse("unknown layout", f"moe_ep_size {lay['ep']} differs from the "
                          f"InferenceX config's --expert-parallel-size {ix['ep']}")
        cols = corpus_flags.role_flags(row, {"colocated": lay}, model, assumptions)
        role = {"servers": 1, **lay, "prefix_cache": True, **flags, **cols["colocated"]}
        sc["fleet"] = {"gpu": gpu, "model": profile, "mode": "colocated", "colocated": role}
    else:
        roles = {}
        for r in ("prefill", "decode"):
            lay = _layout(row, f"{r}_", model)
            workers = _int(row, f"{r}_num_workers")
            if not workers:
                raise _Refuse("unknown layout", f"{r}_num_workers is empty")
            roles[r] = {"servers": workers, **lay, **{k: v for k, v in flags.items()
                                                      if r == "prefill" or k != "prefix_cache"
                                                      and k != "chunked_prefill_size"
                                                      and k != "max_prefill_tokens"}}
        cols = corpus_flags.role_flags(row, roles, model, assumptions)
        for r in roles:
            roles[r].update(cols[r])
        sc["fleet"] = {"gpu": gpu, "model": profile, **roles}
        assumptions.append("PD (disagg): pdsim's PD fleet (the router pairs a prefill and a "
                           "decode server at random, mini_lb; KV over the Mooncake transfer "
                           "model); the row's harness (Dynamo with its own router and NIXL "
                           "transfers) is not modelled")
    case.assumptions = assumptions
    case.scenario = sc
    _server_defaults(case, ix is not None,
                     {r for r, c in cols.items() if "max_running_requests" in c})


def _range_ratio(row: dict, inferencex: bool, assumptions: list[str]) -> float:
    """bench_serving's ``--random-range-ratio`` of a row: the row's ``random_range_ratio``
    column if it has one; else the InferenceX harness's 0.8 for its rows, 1.0 (fixed lengths)
    for the aic-auto-gap-analysis rows (:data:`FIXED_LENGTHS`), 0.8 (the corpus README's
    protocol) for any other."""
    given = _cell(row, "random_range_ratio")
    if given is not None:
        try:
            r = float(given)
        except (TypeError, ValueError):
            r = float("nan")
        if not 0 <= r <= 1:
            raise _Refuse("malformed row", f"random_range_ratio {echo(given)} is not in [0, 1]")
        assumptions.append(f"range ratio {r:g}: the row's random_range_ratio column")
        return r
    if not inferencex and FIXED_SOURCE in str(_cell(row, "silicon_data_source") or ""):
        assumptions.append(FIXED_LENGTHS)
        return 1.0
    return RANGE_RATIO


def _server_defaults(case: Case, inferencex: bool, given: set[str]) -> None:
    """Complete the release-default flags that depend on the KV pool (``max_running_requests``:
    SGLang's ``min(max_total_num_tokens // 2, req_to_token_pool size)``, the pool size being
    2,048-4,096 slots: :func:`running_cap`) of the roles whose column did not give it
    (``given``), and refuse what the scenario check refuses (a
    layout SGLang would not start: heads that do not split, weights that do not fit)."""
    from pdsim.config import loader
    from pdsim.config.units import ScenarioError
    from pdsim.model import memory

    sc = case.scenario
    assert sc is not None
    roles = ["colocated"] if sc["fleet"].get("mode") == "colocated" else ["prefill", "decode"]
    derive = [] if inferencex else [r for r in roles if r not in given]
    for r in derive:
        sc["fleet"][r]["max_running_requests"] = 4096
    try:
        loaded = loader.load(sc)
        if derive:
            pools = memory.kv_pools(loaded)
            for r in derive:
                sc["fleet"][r]["max_running_requests"] = running_cap(pools[r])
            loaded = loader.load(sc)
    except ScenarioError as err:
        msg = str(err)
        kind = ("layout SGLang refuses" if "SGLang refuses" in msg
                else "unknown layout" if "fleet." in msg else "scenario refused")
        raise _Refuse(kind, f"the generated scenario is refused: {msg}") from None


def running_cap(pool_tokens: int) -> int:
    """SGLang's ``--max-running-requests`` when unset (tp_worker.py@0.5.1.post1 l.128,
    model_runner.py@0.5.9 l.593): ``min(max_total_num_tokens // 2, req_to_token_pool.size)``,
    the latter ``min(max(pool / context_len x 512, 2048), 4096)``; taken as 2,048 (it is at
    least that, and no corpus row runs more than 512 requests)."""
    return max(1, min(pool_tokens // 2, 2048))


def cases(df: pd.DataFrame) -> list[Case]:
    """:func:`generate` of every row of a corpus table."""
    return [generate(r) for r in df.to_dict("records")]

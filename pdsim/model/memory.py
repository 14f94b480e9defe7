"""GPU memory: what a rank's weights leave for its KV pool (and a hybrid model's recurrent-state
pool), and the load-time check that a scenario's fleet builds (profiles resolve, weights fit,
the predictors build).

SGLang sizes the pool once at start-up (``ModelRunner.profile_max_num_token``,
model_runner_kv_cache_mixin.py@0.5.9): ``rest = free x mem_fraction_static - weights`` (bytes of
one GPU), a linear-attention model's state pool carved out of ``rest`` first, then
``max_total_num_tokens = rest // cell``, ``cell`` the KV bytes one token takes on one GPU:

- GQA/MHA: ``max(1, kv_heads // attn_tp) x 2 x head_dim`` per full-attention layer (KV heads
  replicated when attention TP exceeds them);
- MLA: the latent ``kv_lora_rank + qk_rope_head_dim`` whole on every GPU; DSA adds its indexer
  keys (and keeps an FP8 latent with scales, the RoPE part in BF16);
- sliding-window layers: the pool is split so that the SWA tokens are ``swa_full_tokens_ratio``
  (0.8) of the full-attention tokens (``set_num_tokens_hybrid_swa``); pdsim's engine counts the
  full-attention tokens (a request holds at most its window in the SWA pool);
- linear attention (Gated DeltaNet): only full-attention layers hold KV; the state pool holds
  ``max_running_requests`` states when the radix cache is off, else ``0.9 / 1.9`` of ``rest``
  (``mamba_full_memory_ratio``), and caps running requests at states / 3 (``init_memory_pool``).

``free`` is the device memory (``hbm_mib`` x 2^20) less what is no longer free when SGLang reads
it right after distributed init (``min_per_gpu_memory``): the CUDA context, allocator and NCCL
buffers, ``engine.init_mib`` + ``engine.init_mib_per_peer`` x (tp - 1) (measured in public
start-up logs: 1.2 GiB at tp 1 on an H100, 3.1 GiB at tp 8 on an H200; engines.yaml).
``mem_fraction_static`` unset: SGLang's default for the GPU, layout and release
(:mod:`pdsim.model.sglang`).

Apart from pdsim.engine.fleet (which imports the whole simulator), so that ``pdsim validate`` and
``pdsim.load`` run this check without loading the simulator: pdsim.config.scenario imports this
module when a scenario is first checked (``_BUILTIN_CHECKS``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pdsim.config.engine_version import DEFAULT_VERSION
from pdsim.config.fleet import RoleConfig
from pdsim.config.scenario import Scenario, load_check
from pdsim.config.units import (
    MAX_TOKENS,
    MIN_BANDWIDTH_FRACTION,
    Context,
    Invalid,
    ScenarioError,
)
from pdsim.model import predictor, profiles, rates, sglang

GIB = 1 << 30
# server_args.py@0.5.9 (the same defaults in every release pdsim knows): --swa-full-tokens-ratio
# (l.339) and --mamba-full-memory-ratio (l.523)
SWA_FULL_TOKENS_RATIO = 0.8
MAMBA_FULL_MEMORY_RATIO = 0.9


@dataclass(frozen=True)
class Pool:
    """One DP rank's memory budget, as SGLang logs it at start-up."""

    tokens: int  # max_total_num_tokens: the (full-attention) KV pool, whole pages
    pages: int
    how: str  # what set it, for `pdsim validate`
    mem_fraction_static: float | None = None  # the fraction used (None: kv_pool_tokens given)
    states: int = 0  # recurrent-state slots (linear attention), 0: none
    max_running: int | None = None  # the cap the state pool sets on running requests
    swa_tokens: int = 0  # the sliding-window layers' pool


def radix_cache(role_cfg: RoleConfig) -> bool:
    """Whether the role's servers keep a radix cache (a PD decode server never does: SGLang
    forces the chunk cache there, server_args.py@0.5.9 ``_handle_disaggregation``)."""
    return bool(getattr(role_cfg, "prefix_cache", False))


def layout_defaults(role_cfg: RoleConfig, gpu: profiles.GPU, version: str) -> tuple[int, int]:
    """(server chunked-prefill budget, CUDA-graph cap) of a role: given, or SGLang's
    defaults for the GPU, tp and release."""
    chunk = getattr(role_cfg, "chunked_prefill_size", None) or \
        sglang.chunked_prefill_size(gpu, version)
    graph = role_cfg.cuda_graph_max_bs
    if graph is None:
        graph = sglang.cuda_graph_max_bs(gpu, role_cfg.tp, version)
    return chunk, graph


def default_mem_fraction(role_cfg: RoleConfig, gpu: profiles.GPU, model: profiles.Model,
                         version: str) -> float:
    chunk, graph = layout_defaults(role_cfg, gpu, version)
    return sglang.mem_fraction_static(gpu, model, role_cfg.tp, role_cfg.dp,
                                      role_cfg.dp_attention, chunk, graph, version)


def cell_bytes(model: profiles.Model, attn_tp: int) -> float:
    """KV bytes one token takes on one attention GPU over the layers sized together (full
    attention; plus sliding-window layers, split afterwards: :func:`pool`)."""
    if model.attention == "mla":
        per_layer = model.kv_layer_token_bytes
    else:
        per_layer = max(1, model.kv_heads // attn_tp) * 2 * model.head_dim * \
            model.kv_dtype_bytes
    return (model.full_attention_layers + model.sliding_window_layers) * per_layer


def pool(role_cfg: RoleConfig, gpu: profiles.GPU, model: profiles.Model,
         engine: profiles.Engine | None = None,
         role_predictor: predictor.Predictor | None = None,
         version: str = DEFAULT_VERSION) -> Pool:
    """One DP rank's KV pool (and state pool): given, or what ``mem_fraction_static`` of the
    device leaves after the weights (module docstring).

    Weights per GPU follow the role's layout (attention replicated under DP attention, experts
    split under EP); a rank's KV lives on its attention GPUs, each holding its KV heads. The
    role's predictor, if an operator one, is that layout's (its weights do not depend on the
    gather, two-batch overlap or imbalance it also has): none is built here.
    """
    page = role_cfg.page_size
    if role_cfg.kv_pool_tokens is not None:
        tokens = role_cfg.kv_pool_tokens
        pages = max(1, tokens // page)
        return Pool(pages * page, pages, "kv_pool_tokens")
    engine = engine or profiles.engine()
    op = role_predictor
    if not isinstance(op, predictor.OperatorPredictor):
        op = predictor.OperatorPredictor(gpu, model, engine, predictor.role_layout(role_cfg))
    weights = op.weights_per_gpu()
    given = role_cfg.mem_fraction_static
    mfs = given if given is not None else default_mem_fraction(role_cfg, gpu, model, version)
    if mfs <= 0:  # (SGLang's formula on a large DP-attention server: it would not start)
        cfg = role_cfg
        res = sglang.reserved_mib(gpu, cfg.tp, cfg.dp, cfg.dp_attention,
                                  *layout_defaults(cfg, gpu, version), version)
        dpa = f", dp {cfg.dp} with dp attention" if cfg.dp_attention else ""
        raise ValueError(f"SGLang {version}'s default mem_fraction_static for {gpu.name} at tp "
                         f"{cfg.tp}{dpa} is {mfs:.3g} (it reserves {res / 1024:.0f} GiB for "
                         f"activations and CUDA graphs): set mem_fraction_static (and "
                         f"cuda_graph_max_bs) as the deployment does")
    how = f"mem_fraction_static {mfs:.4g} after weights" + (
        "" if given is not None else
        f" (SGLang {version}'s default for {gpu.name} at tp {role_cfg.tp}"
        + (f", dp {role_cfg.dp} with dp attention" if role_cfg.dp_attention else "") + ")")
    # SGLang reads the free memory after the CUDA context and distributed init (engine.init_mib
    # and init_mib_per_peer), not the device's, and keeps mem_fraction_static of that
    free = gpu.hbm_bytes - int((engine.init_mib + engine.init_mib_per_peer * (role_cfg.tp - 1))
                               * 2**20)
    rest = free * mfs - weights
    attn_tp = op.layout.attn_tp
    if rest <= 0:  # (say what the budget was and what moves it: SGLang would OOM)
        static = free * mfs / GIB
        layout = " with dp attention" if role_cfg.dp_attention else ""
        whose = "" if given is not None else f" (SGLang {version}'s default)"
        raise ValueError(f"{model.name} weights ({weights / GIB:.0f} GiB per GPU at tp "
                         f"{role_cfg.tp}{layout}) do not fit in {gpu.name} memory: "
                         f"mem_fraction_static {mfs:.3g}{whose} of the {free / GIB:.1f} GiB free "
                         f"at start-up is "
                         f"{static:.0f} GiB and leaves no KV pool; spread them over more GPUs "
                         f"(a larger tp), pick a GPU with more memory or raise "
                         f"mem_fraction_static")
    states, cap = 0, None
    if model.linear_attention_layers:
        per_req = model.state_bytes_per_request(attn_tp)
        if not radix_cache(role_cfg) and role_cfg.max_running_requests is not None:
            # (--disable-radix-cache with --max-running-requests: a state per request)
            states = role_cfg.max_running_requests
            cap = states
        else:
            r = MAMBA_FULL_MEMORY_RATIO
            states = int(rest * r / (1 + r) // per_req)
            # states a running request takes: 1 with the radix cache off, else
            # MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO, 3 (init_memory_pool@0.5.9)
            cap = states // (3 if radix_cache(role_cfg) else 1)
        rest -= states * per_req
        how += f"; {states:,} recurrent states of {per_req / 2**20:.1f} MiB carved first"
        if rest <= 0 or cap < 1:
            raise ValueError(f"{model.name}: {states:,} recurrent states of {per_req / 2**20:.1f}"
                             f" MiB per GPU leave no KV pool in {gpu.name} memory; lower "
                             f"max_running_requests or use more GPUs")
    cell = cell_bytes(model, attn_tp)
    tokens = int(rest) // int(cell) if cell == int(cell) else int(rest / cell)
    swa = 0
    if model.sliding_window_layers and model.full_attention_layers:
        per = cell / (model.full_attention_layers + model.sliding_window_layers)
        ratio = SWA_FULL_TOKENS_RATIO
        total = tokens * cell
        tokens = int(total / (per * (model.full_attention_layers
                                     + ratio * model.sliding_window_layers)))
        swa = int(tokens * ratio)
        how += f"; sliding-window layers' pool {ratio:g} x the full layers'"
    pages = max(1, tokens // page)
    return Pool(pages * page, pages, how, mfs, states, cap, swa // page * page)


def max_running(role_cfg: RoleConfig, rank_pool: Pool, model: profiles.Model) -> int:
    """Requests a DP rank runs at once: ``max_running_requests`` when given, else SGLang's
    derived default for its pool (:func:`pdsim.model.sglang.default_max_running`), capped by
    a hybrid model's state pool."""
    n = role_cfg.max_running_requests
    if n is None:
        n = sglang.default_max_running(rank_pool.tokens, model.context_len)
    if rank_pool.max_running is not None:
        n = min(n, rank_pool.max_running)
    return n


def running_limits(sc: Scenario) -> dict[str, int]:
    """:func:`max_running` of one DP rank of each role, as the fleet builds them."""
    model = profiles.for_scenario(sc).model
    roles = dict(sc.fleet.roles())
    return {role: max_running(roles[role], p, model) for role, p in pools(sc).items()}


def pool_pages(role_cfg: RoleConfig, gpu: profiles.GPU, model: profiles.Model,
               engine: profiles.Engine | None = None,
               role_predictor: predictor.Predictor | None = None,
               version: str = DEFAULT_VERSION) -> int:
    """KV pages per rank (:func:`pool`'s pages)."""
    return pool(role_cfg, gpu, model, engine, role_predictor, version).pages


@load_check
def _fleet_builds(sc: Scenario, ctx: Context) -> None:
    """What building the fleet would reject, checked at load time (so ``validate`` sees it):
    the profiles resolve (files, names, overrides), the weights fit, the predictor builds."""
    pools(sc, ctx)


def kv_pools(sc: Scenario, ctx: Context | None = None) -> dict[str, int]:
    """KV pool tokens of one DP rank of each role (SGLang's ``max_total_num_tokens``), as the
    fleet builds them, raising what building the fleet would reject."""
    return {role: p.tokens for role, p in pools(sc, ctx).items()}


def pools(sc: Scenario, ctx: Context | None = None) -> dict[str, Pool]:
    """:func:`pool` of one DP rank of each role, raising what building the fleet would
    reject."""
    try:
        prof = profiles.for_scenario(sc, ctx)
    except profiles.ProfileError as err:
        raise ScenarioError(str(err)) from None
    out = {}
    for role, cfg in sc.fleet.roles():  # (prefill and decode, or colocated)
        _heads_split(role, cfg, prof.model)
        gather = cfg.dp if cfg.dp_attention else 1
        try:  # (built first, for pool to reuse; its error is reported second)
            rp = profiles.for_role(sc, cfg, ctx)  # (the calibration of the role's layout)
            lay = predictor.layout_for(cfg, sc.predictor, gather, rp.gpu, sc.engine.version)
            pred, bad = predictor.build(sc.predictor, rp.gpu, rp.model, cfg.tp, gather,
                                        rp.engine, lay), None
            rates.check_step_times(pred, "gpu" if sc.predictor.kind == "operator"
                                   else "predictor")
        except rates.RateError as err:
            raise Invalid(err.key, str(err)) from None
        except ValueError as err:
            pred, bad = None, err
        try:
            out[role] = pool(cfg, prof.gpu, prof.model, prof.engine, pred, sc.engine.version)
        except rates.RateError as err:
            raise Invalid(err.key, str(err)) from None
        except ValueError as err:
            raise Invalid(f"fleet.{role}", str(err)) from None
        if bad is not None:
            raise Invalid("predictor", str(bad)) from None
    if sc.fleet.mode == "pd":  # (colocated servers send no KV)
        _write_times(sc, prof)
    return out


def nic_layout(sc: Scenario, gpu: profiles.GPU) -> tuple[float, int]:
    """The prefill side's NICs as the fleet builds them: one NIC's line rate in bytes/s (the
    NICs of a rank that spans several, as one) and how many prefill ranks share it."""
    pc, tc = sc.fleet.prefill, sc.transfer
    gpus_per_rank = pc.tp // pc.dp if pc.dp_attention else pc.tp
    gpus_per_nic = tc.gpus_per_nic or gpu.gpus_per_nic
    nics_per_rank = max(1, gpus_per_rank // gpus_per_nic)
    return ((tc.nic_gbps or gpu.nic_gbps) * 1e9 / 8 * nics_per_rank,
            max(1, gpus_per_nic // gpus_per_rank))


def _write_times(sc: Scenario, prof: profiles.Resolved) -> None:
    """A KV write takes a finite, positive time (``bytes / rate``): the slowest rate a write
    can have (line rate x the lower of peak_utilisation and min_utilisation x the lowest
    bandwidth_fraction a nic_degraded fault may leave) is positive, and the largest chunk
    (a forward's budget plus a prompt's cached prefix) over it, shared with every other
    writer of its NIC (each transfer queue's worker and a probe per decode session, of each
    rank on it), is finite. Valid fields whose product underflows (gpu.nic_gbps and
    transfer.peak_utilisation of 1e-300) divided by zero in the run."""
    floor = MIN_BANDWIDTH_FRACTION  # (a nic_degraded fault's lower bound)
    tc, pc, dc = sc.transfer, sc.fleet.prefill, sc.fleet.decode
    line, ranks_per_nic = nic_layout(sc, prof.gpu)
    slowest = line * min(tc.peak_utilisation, tc.min_utilisation) * floor
    kvb = prof.model.kv_bytes_per_token_sent(pc.tp, pc.dp_attention)
    largest = 2.0 * MAX_TOKENS * kvb
    writers = ranks_per_nic * (tc.queues_per_rank + dc.servers * dc.dp)
    if slowest > 0 and math.isfinite(largest * writers / slowest):
        return
    key = "transfer.nic_gbps" if tc.nic_gbps else "gpu.nic_gbps"
    raise Invalid(key, f"a KV write's slowest rate ({key} x the lower of "
                       f"transfer.peak_utilisation and transfer.min_utilisation x a degraded "
                       f"NIC's {floor:g}) is {slowest:.3g} bytes/s: a write of "
                       f"{largest:.3g} bytes would take no finite time; raise them")


def _heads_split(role: str, cfg: RoleConfig, model: profiles.Model) -> None:
    """The attention heads split evenly over a rank's attention GPUs, as SGLang asserts at
    start-up (num_attention_heads % attention tp == 0; GQA KV heads split evenly, or are
    replicated a whole number of times when there are fewer than GPUs)."""
    attn_tp = cfg.tp // cfg.dp if cfg.dp_attention else cfg.tp
    over = (f"attention tp {attn_tp} (tp {cfg.tp} / dp {cfg.dp} with dp attention)"
            if cfg.dp_attention else f"tp {cfg.tp}")
    kv = model.kv_heads if model.attention == "gqa" else 0
    if model.heads % attn_tp:
        why = (f"its {model.heads} attention heads do not split evenly over {over}; pick a "
               f"tp that divides them")
    elif kv and (kv % attn_tp if kv >= attn_tp else attn_tp % kv):
        why = (f"its {kv} KV heads neither split nor replicate evenly over {over}; pick an "
               f"attention tp that divides {kv} or is a multiple of it")
    else:
        return
    raise Invalid(f"fleet.{role}.tp", f"{model.name}: {why} (SGLang refuses it at start-up)",
                  cfg.tp)

"""GPU memory: what a rank's weights leave for its KV pool, and the load-time check that a
scenario's fleet builds (profiles resolve, weights fit, the predictors build).

Apart from pdsim.engine.fleet (which imports the whole simulator), so that ``pdsim validate`` and
``pdsim.load`` run this check without loading the simulator: pdsim.config.scenario imports this
module when a scenario is first checked (``_BUILTIN_CHECKS``).
"""

from __future__ import annotations

from pdsim.config.fleet import RoleConfig
from pdsim.config.scenario import Scenario, load_check
from pdsim.config.units import Context, Invalid, ScenarioError
from pdsim.model import predictor, profiles


def pool_pages(role_cfg: RoleConfig, gpu: profiles.GPU, model: profiles.Model,
               engine: profiles.Engine | None = None,
               role_predictor: predictor.Predictor | None = None) -> int:
    """KV pages per rank: given, or what ``mem_fraction_static`` of HBM leaves after weights.

    Weights per GPU follow the role's layout (attention replicated under DP attention, experts
    split under EP); a rank's KV lives on its attention GPUs, each holding its KV heads. The
    role's predictor, if an operator one, is that layout's (its weights and KV per layer do not
    depend on the gather, two-batch overlap or imbalance it also has): none is built here.
    """
    if role_cfg.kv_pool_tokens is not None:
        tokens = role_cfg.kv_pool_tokens
    else:
        op = role_predictor
        if not isinstance(op, predictor.OperatorPredictor):
            lay = predictor.Layout(tp=role_cfg.tp, dp=role_cfg.dp,
                                   dp_attention=role_cfg.dp_attention, ep=role_cfg.ep)
            op = predictor.OperatorPredictor(gpu, model, engine or profiles.engine(), lay)
        weights = op.weights_per_gpu()
        free = gpu.hbm_gb * 1e9 * role_cfg.mem_fraction_static - weights
        if free <= 0:  # (say what the budget was and what moves it: SGLang would OOM)
            static = gpu.hbm_gb * role_cfg.mem_fraction_static
            layout = " with dp attention" if role_cfg.dp_attention else ""
            raise ValueError(f"{model.name} weights ({weights / 1e9:.0f} GB per GPU at tp "
                             f"{role_cfg.tp}{layout}) do not fit in {gpu.name} memory: "
                             f"mem_fraction_static {role_cfg.mem_fraction_static:g} of "
                             f"{gpu.hbm_gb:g} GB is {static:.0f} GB and leaves no KV pool; "
                             f"spread them over more GPUs (a larger tp), pick a GPU with "
                             f"more memory or raise mem_fraction_static")
        tokens = int(free / (model.layers * op.kv_layer_bytes))
    return max(1, tokens // role_cfg.page_size)


@load_check
def _fleet_builds(sc: Scenario, ctx: Context) -> None:
    """What building the fleet would reject, checked at load time (so ``validate`` sees it):
    the profiles resolve (files, names, overrides), the weights fit, the predictor builds."""
    kv_pools(sc, ctx)


def kv_pools(sc: Scenario, ctx: Context | None = None) -> dict[str, int]:
    """KV pool tokens of one DP rank of each role (SGLang's ``max_total_num_tokens``), as the
    fleet builds them (``pool_pages``), raising what building the fleet would reject."""
    try:
        prof = profiles.for_scenario(sc, ctx)
    except profiles.ProfileError as err:
        raise ScenarioError(str(err)) from None
    pools = {}
    for role, cfg in sc.fleet.roles():  # (prefill and decode, or colocated)
        _heads_split(role, cfg, prof.model)
        gather = cfg.dp if cfg.dp_attention else 1
        try:  # (built first, for pool_pages to reuse; its error is reported second)
            pred, bad = predictor.build(sc.predictor, prof.gpu, prof.model, cfg.tp, gather,
                                        prof.engine, predictor.layout_for(cfg, sc.predictor,
                                                                          gather)), None
        except ValueError as err:
            pred, bad = None, err
        try:
            pools[role] = pool_pages(cfg, prof.gpu, prof.model, prof.engine, pred) * cfg.page_size
        except ValueError as err:
            raise Invalid(f"fleet.{role}", str(err)) from None
        if bad is not None:
            raise Invalid("predictor", str(bad)) from None
    return pools


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

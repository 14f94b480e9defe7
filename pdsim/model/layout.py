"""How one rank's forward is spread over GPUs (:class:`Layout`), and the layout of a scenario's
role: the operator predictor's (pdsim.model.predictor, which re-exports these) sharding input."""

from __future__ import annotations

from dataclasses import dataclass

from pdsim.config.fleet import PredictorConfig
from pdsim.config.profile_schema import GPU


@dataclass(frozen=True)
class Layout:
    """How one rank's forward is spread over GPUs, as SGLang shards it (issue 29 fact sheet A4:
    layers/communicator.py ``LayerScatterModes``, models/deepseek_v2.py and qwen2_moe.py).

    ``tp`` GPUs per server; with ``dp_attention`` the server's ``dp`` ranks each run attention
    on their own requests over ``tp // dp`` GPUs, and the MLP/MoE sees the tokens of the
    ``gather`` ranks stepping together. ``ep > 1``: routed experts are split over ``ep`` GPUs,
    each expert's width over ``tp // ep``. With ``a2a`` none (SGLang's default) every GPU still
    holds every token: it runs its own experts over them and the TP all-reduce sums the
    outputs (no all-to-all); dense MLP, shared experts and LM head stay TP-sharded. With
    ``a2a`` deepep tokens are scattered over the GPUs and reach their experts by all-to-all
    (normal kernels when the forward has prefill tokens, low-latency ones for pure decode),
    over NVLink inside an NVLink domain and the NIC between domains; shared experts keep whole
    weights and compute each GPU's own tokens. ``dense_tp1`` (``--moe-dense-tp-size 1``): dense
    layers run data-parallel with whole weights; ``dp_lm_head`` (``--enable-dp-lm-head``): the
    LM head is sharded over the attention-TP group and samples its own rank's tokens.
    ``tbo``: two-batch overlap (each forward in two micro-batches, communication of one under
    computation of the other). ``imbalance``: busiest expert-GPU load over the mean (1:
    balanced). ``graph_bs``: the largest decode batch run as a CUDA graph (None: every one;
    larger batches run eagerly, :attr:`Engine.eager_layer_us` per layer). ``ll_nvlink``:
    DeepEP's low-latency kernels send intra-domain pairs over NVLink (its
    ``allow_nvlink_for_low_latency_mode``, default since DeepEP PR #173, May 2025); false: over
    RDMA like every other pair, as before it (DeepEP issue #164: "the local node transfer will
    also use RDMA").
    """

    tp: int = 1
    dp: int = 1
    dp_attention: bool = False
    ep: int = 1
    gather: int = 1
    tbo: bool = False
    imbalance: float = 1.0
    a2a: str = "none"
    dense_tp1: bool = False
    dp_lm_head: bool = False
    graph_bs: int | None = None
    ll_nvlink: bool = True

    @property
    def attn_tp(self) -> int:
        return max(1, self.tp // self.dp) if self.dp_attention else self.tp


def role_layout(role: object, gather: int = 1, graph_bs: int | None = None,
                tbo: bool = False, imbalance: float = 1.0) -> Layout:
    """The :class:`Layout` of a scenario role's sharding (``fleet.prefill`` / ``.decode``)."""
    return Layout(tp=role.tp, dp=role.dp, dp_attention=role.dp_attention,
                  ep=getattr(role, "ep", 1), gather=gather, tbo=tbo, imbalance=imbalance,
                  a2a=getattr(role, "moe_a2a_backend", "none"),
                  dense_tp1=getattr(role, "moe_dense_tp_size", None) == 1,
                  dp_lm_head=getattr(role, "enable_dp_lm_head", False), graph_bs=graph_bs,
                  ll_nvlink=getattr(role, "deepep_ll_nvlink", True))


def layout_for(role: object, cfg: PredictorConfig, gather: int, gpu: GPU | None = None,
               version: str | None = None) -> Layout:
    """The :class:`Layout` of a scenario role (``fleet.prefill`` / ``fleet.decode``) under the
    scenario's predictor settings. The CUDA-graph cap: the role's ``cuda_graph_max_bs``, else
    SGLang's default for ``gpu``, its tp and the release ``version`` (the scenario's
    ``engine.version``; none known without a GPU)."""
    graph = getattr(role, "cuda_graph_max_bs", None)
    if graph is None and gpu is not None:
        from pdsim.model import sglang

        graph = sglang.cuda_graph_max_bs(gpu, role.tp, version or sglang.DEFAULT_VERSION)
    return role_layout(role, gather, graph, cfg.two_batch_overlap, cfg.expert_imbalance)

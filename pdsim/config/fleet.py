"""The scenario's fleet and the policies of its data path: the prefill and decode roles
(``fleet:``), the router, the KV transfer engine, the peer blacklist (one registered policy,
:data:`pdsim.config.registry.BLACKLIST_POLICIES`), what a flush does, and the step-time
predictor (``predictor:``)."""


from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    Field,
    model_validator,
)

from pdsim.config import profile_schema, registry
from pdsim.config.registry import BLACKLIST_POLICIES
from pdsim.config.units import (
    _NUM,
    MAX_COUNT,
    MAX_DP,
    MAX_KV_TOKENS,
    MAX_MS,
    MAX_NAME_CHARS,
    MAX_PAGE_TOKENS,
    MAX_QUEUES,
    MAX_RANKS,
    MAX_RUNNING,
    MAX_SERVERS,
    MAX_TOKENS,
    MAX_TP,
    Context,
    Fraction,
    Invalid,
    Millis,
    NonNegInt,
    PosFloat,
    PosInt,
    Seconds,
    Strict,
    Tokens,
)
from pdsim.util.safeio import (
    echo,
)

# --- fleet ---------------------------------------------------------------------------------


class RoleConfig(Strict):
    servers: PosInt = Field(1, le=MAX_SERVERS,
                            description="Servers of this role, each one SGLang server (its own "
                            "DP ranks, KV pools and prefix caches); default 1")
    dp: PosInt = Field(1, le=MAX_DP, description="DP ranks per server (--dp-size), each with its "
                       "own scheduler, KV pool and prefix cache; with dp_attention they share "
                       "the server's tp GPUs, without it each rank has tp GPUs of its own; "
                       "default 1")
    tp: PosInt = Field(1, le=MAX_TP, description="Tensor-parallel size (--tp-size). With "
                       "dp_attention: the server's GPUs, attention running over tp/dp of them "
                       "per DP rank and MLP/MoE over all tp. Without: each DP rank's GPUs, so a "
                       "server has dp x tp (SGLang's --dp N --tp M takes N*M GPUs); default 1")
    dp_attention: bool = Field(False, description="DP attention (--enable-dp-attention): the "
                               "server's dp ranks share its tp GPUs, each running attention on "
                               "its own requests over tp/dp of them; tp must be a multiple of "
                               "dp; default false")
    lockstep: bool | None = Field(
        None, description="DP ranks run each forward together (idle ranks run idle batches); "
        "default: on with dp_attention, off without")
    balance: Literal["round_robin", "total_tokens", "follow_bootstrap_room"] = Field(
        "round_robin", description="How a server spreads requests over its DP ranks "
        "(--load-balance-method); default round_robin"
    )
    max_running_requests: PosInt | None = Field(
        None, le=MAX_RUNNING, description="Requests running at once on each DP rank. SGLang's "
        "--max-running-requests is this without DP attention, and dp times this with it (its "
        "model runner divides the flag by dp). Default: SGLang's when the flag is not given, "
        "min(KV pool // 2, request slots), the slots min(max(pool / the model's context_len x "
        "512, 2048), 4096) (model_runner.py): 2,048-4,096 on most pools")
    kv_pool_tokens: PosInt | None = Field(
        None, le=MAX_KV_TOKENS,
        description="KV pool of each DP rank in tokens (SGLang logs it as max_total_num_tokens); "
        "default: what mem_fraction_static of the GPU memory free at start-up leaves after the "
        "weights"
    )
    mem_fraction_static: Fraction | None = Field(
        None, description="Share of each GPU's memory for weights plus KV pool "
        "(--mem-fraction-static), used when kv_pool_tokens is unset; default: SGLang's for the "
        "GPU's memory, the layout and engine.version (0.5.3+: 1 - (512 MiB + 1.5 x chunked "
        "prefill + 2 x cuda_graph_max_bs + tp/8 GiB) / memory, e.g. 0.818 on an H100 at tp 8)")
    cuda_graph_max_bs: NonNegInt | None = Field(
        None, le=MAX_RUNNING, description="Largest decode batch run as a captured CUDA graph "
        "(--cuda-graph-max-bs); larger batches run eagerly (a higher per-layer cost); 0: no "
        "CUDA graphs (--disable-cuda-graph). Default: SGLang's for the GPU's memory, tp and "
        "engine.version (256 at tp < 4 else 512 on 60-160 GiB parts, 512 above, since 0.5.3)")
    page_size: PosInt = Field(1, le=MAX_PAGE_TOKENS,
                              description="Tokens per KV page (--page-size); default 1")
    ep: PosInt = Field(1, le=MAX_TP, description="Expert-parallel size (--ep-size): routed "
                       "experts split over ep GPUs (each expert's width over tp/ep of them); "
                       "tp must be a multiple of ep. Without moe_a2a_backend every GPU still "
                       "sees every token and the MoE ends in the TP all-reduce (no all-to-all); "
                       "default 1: MoE weights tensor-parallel")
    moe_a2a_backend: Literal["none", "deepep"] = Field(
        "none", description="--moe-a2a-backend: deepep sends each token to its experts' GPUs by "
        "all-to-all (DeepEP normal kernels when a forward has prefill tokens, low-latency ones "
        "for pure decode), over NVLink inside an NVLink domain and the NIC between domains; "
        "shared experts then keep whole weights and compute each GPU's own tokens. SGLang runs "
        "it with ep = tp. Default none")
    deepep_ll_nvlink: bool = Field(
        True, description="DeepEP's low-latency (decode) kernels send the pairs between GPUs of "
        "one NVLink domain over NVLink (DeepEP allow_nvlink_for_low_latency_mode, its default "
        "since DeepEP PR #173, May 2025); false: over RDMA like every other pair, as DeepEP did "
        "before; default true")
    moe_dense_tp_size: Literal[1] | None = Field(
        None, description="--moe-dense-tp-size 1: dense MLP layers (DeepSeek's first_k_dense_"
        "replace) run data-parallel with whole weights on each GPU's own tokens; default null: "
        "tensor-parallel over tp")
    enable_dp_lm_head: bool = Field(
        False, description="--enable-dp-lm-head (with dp_attention): the LM head is "
        "vocab-parallel over the attention-TP group only and samples each rank's own tokens; "
        "default false: vocab-parallel over all tp GPUs")

    @model_validator(mode="after")
    def _dp_fits_tp(self) -> RoleConfig:
        if self.dp_attention and self.tp % self.dp:
            raise ValueError(f"with dp_attention, tp ({self.tp}) must be a multiple of dp "
                             f"({self.dp})")
        if self.servers * self.dp > MAX_RANKS:
            raise ValueError(f"servers x dp = {self.servers * self.dp:,} DP ranks; at most "
                             f"{MAX_RANKS:,} per role")
        if self.tp % self.ep:
            raise ValueError(f"tp ({self.tp}) must be a multiple of ep ({self.ep}): SGLang splits "
                             f"the routed experts ep ways and each expert's width tp/ep ways "
                             f"(moe_tp_size = tp // ep)")
        if self.moe_a2a_backend == "deepep" and self.ep != self.tp:
            raise ValueError(f"moe_a2a_backend deepep runs with ep = tp (SGLang sets --ep-size "
                             f"to --tp-size); set ep: {self.tp} (ep is {self.ep})")
        if self.enable_dp_lm_head and not self.dp_attention:
            raise ValueError("enable_dp_lm_head needs dp_attention (SGLang refuses it "
                             "without --enable-dp-attention)")
        return self


class PrefillConfig(RoleConfig):
    chunked_prefill_size: Tokens | None = Field(
        None, description="--chunked-prefill-size of the server (SGLang semantics: under DP "
        "attention each rank gets size // dp). Unset: SGLang's default from GPU memory (8192 "
        "for 60-160 GB parts such as H20/H100/H200)"
    )
    prefix_cache: bool = Field(True, description="Radix (prefix) cache on each prefill rank "
                               "(false: SGLang's --disable-radix-cache); default true")
    prefix_block_tokens: PosInt = Field(512, le=MAX_PAGE_TOKENS,
                                        description="Tokens per prefix-cache block, what one "
                                        "trace hash_id stands for (512 in the Mooncake traces); "
                                        "default 512")
    max_prefill_tokens: PosInt = Field(
        16384, le=MAX_TOKENS, description="--max-prefill-tokens: new input tokens one prefill "
        "forward of a rank takes at most beside the chunk budget (the first request of a "
        "forward is admitted whatever its size; PrefillAdder.add_one_req); default 16384, as "
        "SGLang's")


class DecodeConfig(RoleConfig):
    num_reserved_decode_tokens: NonNegInt = Field(
        512, le=MAX_TOKENS, description="--num-reserved-decode-tokens: decode headroom SGLang's "
        "admission keeps per request running, transferring or waiting (a bookkeeping reserve: "
        "pre-allocation takes the prompt's pages only, and admits a request only while the "
        "free tokens beyond every such reserve cover its prompt and its own reserve; "
        "DecodePreallocQueue._allocatable_tokens); default 512, as SGLang's")
    disaggregation_decode_extra_slots: NonNegInt | None = Field(
        None, le=MAX_RUNNING, description="Request slots each DP rank has beyond "
        "max_running_requests for pre-allocated and transferring requests (SGLang's "
        "DecodeReqToTokenPool pre_alloc_size; 0.5.23's --disaggregation-decode-extra-slots): "
        "pre-allocation, transfers, waiting and running requests share max_running_requests + "
        "these, the running batch alone is capped at max_running_requests. Default: SGLang's "
        "rule in every release 0.5.1.post1-0.5.23, 2 x max_running_requests when that is at "
        "most 32, else 0 (model_runner.py / model_runner_kv_cache_mixin.py)")

    def extra_slots(self, max_running: int) -> int:  # (max_running: the rank's, resolved)
        """The pre-allocation slots a DP rank running at most ``max_running`` requests has
        beyond them (``disaggregation_decode_extra_slots``, or SGLang's rule)."""
        if self.disaggregation_decode_extra_slots is not None:
            return self.disaggregation_decode_extra_slots
        return 2 * max_running if max_running <= 32 else 0

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: object) -> object:
        if isinstance(data, dict) and "retract_reserve_tokens" in data:
            raise ValueError("retract_reserve_tokens is now num_reserved_decode_tokens "
                             "(SGLang's --num-reserved-decode-tokens, default 512), a reserve "
                             "per request in SGLang's admission rather than pages taken")
        return data


Ratio = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False), _NUM]


class ColocatedConfig(PrefillConfig):
    """SGLang servers that prefill and decode on the same GPUs (no --disaggregation-mode): the
    scheduler of python/sglang/srt/managers/scheduler.py (``get_next_batch_to_run``) and
    schedule_policy.py (``PrefillAdder``), 0.5.x."""

    balance: Literal["round_robin", "total_tokens"] = Field(  # type: ignore[assignment]
        "round_robin", description="How a server spreads requests over its DP ranks "
        "(--load-balance-method); default round_robin")
    enable_mixed_chunk: bool = Field(
        False, description="--enable-mixed-chunk: running requests decode a token inside each "
        "prefill forward (the prefill budgets shrink by their number) instead of pausing for "
        "it; default false, as SGLang's")
    schedule_conservativeness: Annotated[float, Field(gt=0, le=100, allow_inf_nan=False),
                                         _NUM] = Field(
        1.0, description="--schedule-conservativeness: scales the initial new-token ratio "
        "(how much of their remaining output running requests are assumed to still need when "
        "new ones are admitted); SGLang multiplies it by 0.3 under DP attention; default 1")
    init_new_token_ratio: Ratio = Field(
        0.7, description="SGLANG_INIT_NEW_TOKEN_RATIO (times schedule_conservativeness, at most "
        "1): the new-token ratio when the scheduler starts or goes idle; default 0.7")
    min_new_token_ratio_factor: Ratio = Field(
        0.14, description="SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR: the ratio's floor as a share of "
        "its initial value; default 0.14")
    new_token_ratio_decay_steps: PosInt = Field(
        600, le=MAX_COUNT, description="SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS: decode steps over "
        "which the ratio falls linearly from its initial value to its floor; default 600")
    stream_interval: PosInt = Field(
        1, le=MAX_COUNT, description="--stream-interval: a running request's output is streamed "
        "every this many tokens (the first token never waits; the scheduler sends when "
        "len(output_ids) % interval == 1); it divides the front end's per-step work "
        "(engine.frontend_chunk_us); default 1, as SGLang's")


# Defaults a scenario written out by an earlier pdsim holds in every section (a run
# directory's scenario.yaml has all three): max_running_requests was 256 until SGLang's own
# derivation became the default. In the section of the mode not in use they are no edit.
EARLIER_DEFAULTS = {"max_running_requests": 256}


def _changed(fleet: Strict, key: str) -> bool:
    """Whether the fleet's section ``key`` was given with a value other than its defaults (or
    an earlier pdsim's: :data:`EARLIER_DEFAULTS`)."""
    if key not in fleet.model_fields_set:
        return False
    given = getattr(fleet, key).model_dump(exclude_defaults=True)
    return any(EARLIER_DEFAULTS.get(k, object()) != v for k, v in given.items())


class FleetConfig(Strict):
    gpu: str = Field(description="GPU profile name (pdsim profiles; or one a profile file adds)")
    model: str = Field(description="Model profile name")
    prefill: PrefillConfig = Field(PrefillConfig(), description="PD: the prefill servers "
                                   "(--disaggregation-mode prefill); default: one, dp 1, tp 1")
    decode: DecodeConfig = Field(DecodeConfig(), description="PD: the decode servers "
                                 "(--disaggregation-mode decode); default: one, dp 1, tp 1")
    mode: Literal["pd", "colocated"] = Field(
        "pd", description="pd: prefill and decode servers apart (prefill, decode), KV sent "
        "between them; colocated: servers that prefill and decode on the same GPUs "
        "(colocated), SGLang without --disaggregation-mode; default pd")
    colocated: ColocatedConfig = Field(
        ColocatedConfig(), description="mode colocated: the servers, each prefilling and "
        "decoding on its own GPUs; default: one, dp 1, tp 1")
    engine: str = Field("sglang", max_length=MAX_NAME_CHARS,
                        description="Engine profile name (CPU-side and per-request costs); "
                        "default sglang")

    @model_validator(mode="after")
    def _sections_of_the_mode(self) -> FleetConfig:
        # (a section left at its defaults is no mistake: a scenario as run, written out with
        # every field, has all three)
        if self.mode == "colocated":
            other = [k for k in ("prefill", "decode") if _changed(self, k)]
            if other:
                raise ValueError(f"fleet.{other[0]} describes a PD fleet; a colocated fleet's "
                                 f"servers are fleet.colocated (or set fleet.mode: pd)")
        elif _changed(self, "colocated"):
            raise ValueError("fleet.colocated describes a colocated fleet: set fleet.mode: "
                             "colocated (and drop fleet.prefill and fleet.decode)")
        return self

    def roles(self) -> list[tuple[str, RoleConfig]]:
        """The fleet's roles as (name, section): prefill and decode, or colocated."""
        if self.mode == "colocated":
            return [("colocated", self.colocated)]
        return [("prefill", self.prefill), ("decode", self.decode)]

    def gpus(self) -> dict[str, int]:
        """GPUs of each role: servers x GPUs a server (tp with DP attention, else dp x tp)."""
        return {name: r.servers * (r.tp if r.dp_attention else r.dp * r.tp)
                for name, r in self.roles()}


# --- router, transfer, blacklist, flush, predictor -------------------------------------------


class RouterConfig(Strict):
    kind: Literal["mini_lb"] = Field("mini_lb", description="PD request routing: random PD "
                                     "pairing (a colocated fleet's router: policy)")
    policy: Literal["round_robin", "random", "least_load"] | None = Field(
        None, description="Colocated fleets: how the router (sgl-model-gateway in regular "
        "mode, --policy) picks a server: round_robin, random, or least_load (the server with "
        "the fewest prompt tokens routed and not yet answered; the gateway counts request text "
        "length); default round_robin. PD fleets: unset (mini_lb pairs at random)")
    flush_handler: Literal["mini_lb_0.3.2", "mini_lb_fixed", "model_gateway", "rust_router"] = (
        Field("mini_lb_0.3.2", description="What the router's POST /flush_cache does")
    )
    request_timeout_s: Seconds = Field(
        1800.0, description="How long the router waits for a request's response before "
        "failing it; default 1800 s")
    dispatch: Literal["mini_lb_gather", "smg_join", "smg_cancel_on_prefill_fail",
                      "smg_cancel_both"] = Field(
        "mini_lb_gather", description="How the router waits on a request's two legs (POSTs to "
        "the prefill and the decode) and what it does when one fails (docs/pd_paths.md, "
        "'Router'). mini_lb_gather: sglang-router 0.3.2's mini_lb (asyncio.gather): the "
        "decode's answer goes back at once, the prefill leg's outcome is ignored, neither leg "
        "is cancelled. smg_join: sgl-model-gateway's old tokio::join! (pd_router.rs @004dcda): "
        "the answer waits for both legs; a decode leg that failed at transport level waits for "
        "the prefill leg's bootstrap timeout (PR #29482's hang). smg_cancel_on_prefill_fail: "
        "PR #29017: a failed prefill leg drops the decode leg (the decode aborts its copy) and "
        "answers 502 at once; a decode failing first still waits for the prefill. "
        "smg_cancel_both: dispatch.rs @03744db (what PR #29482 asked for): either leg failing "
        "first drops the other and answers 502 at once; default mini_lb_gather")
    ttft_timeout_s: Seconds | None = Field(
        None, description="A gateway in front of the router gives up on a request without a "
        "first token after this many seconds (HTTP 504; an external gateway's first-byte "
        "timeout: neither mini_lb nor sgl-model-gateway has one); the gateway_timeout fault "
        "changes it during a run; default null: none")
    ttft_timeout_cancels: Literal["both", "prefill"] = Field(
        "both", description="What a TTFT timeout cancels: both (the gateway closes its "
        "connection, the router drops both legs, each server aborts its own copy) or prefill "
        "(only the prefill leg is aborted: PR #28651's route, where the decode is not told "
        "unless disaggregation.prefill_abort_notifies_decode); default both")
    fanout_concurrency: PosInt = Field(32, le=MAX_COUNT,
                                       description="Rust routers: concurrent flush fan-out")
    worker_timeout_s: Seconds = Field(5.0, description="sgl-model-gateway per-worker timeout")
    http_latency_ms: Millis = Field(0.5, description="One router<->server hop")

    def check(self, ctx: Context) -> None:
        if self.policy is not None and ctx.scenario.fleet.mode != "colocated":
            raise Invalid("policy", "picks a server of a colocated fleet; a PD fleet's mini_lb "
                          "pairs a prefill and a decode server at random (unset it, or set "
                          "fleet.mode: colocated)", self.policy)


class TransferConfig(Strict):
    queues_per_rank: PosInt = Field(4, le=MAX_QUEUES,
                                    description="Mooncake transfer queues per prefill rank")
    call_latency_ms: Millis = Field(1.6, description="Fixed cost per batch write (fitted upstream "
                                    "on Mooncake + SGLang transfer measurements: "
                                    "docs/model/transfer.md)")
    nic_gbps: PosFloat | None = Field(None, ge=1e-3, le=1e6,
                                      description="NIC line rate; default from GPU profile")
    gpus_per_nic: PosInt | None = Field(None, le=MAX_TP, description="Default from GPU profile")
    peak_utilisation: Fraction = Field(0.84, description="168 GB/s over 4x400 GbE (the same "
                                       "fit: docs/model/transfer.md)")
    min_utilisation: Fraction = Field(0.12, description="Utilisation floor for small writes")
    saturation_mb: PosFloat = Field(100.0, le=1e6,
                                    description="Write size reaching peak utilisation")
    transfer_timeout_s: Seconds = Field(
        30.0, description="MC_TRANSFER_TIMEOUT: a synchronous batch write gives up (ret != 0) "
        "after this plus 1 ns per byte (Mooncake transfer_engine_py.cpp); what a write to a "
        "peer that does not answer costs")
    qp_retry_s: Seconds = Field(
        0.537, description="How long an RDMA write to a peer that does not acknowledge retries "
        "before the QP errors: IB local ACK timeout 4.096 us x 2^14 x (retry_cnt 7 + 1) "
        "(Mooncake rdma_endpoint.cpp TIMEOUT=14, RETRY_CNT=7). A crashed peer's writes fail "
        "after this (its reconnect is refused); shorter outages cost nothing")
    bootstrap_timeout_s: Seconds = Field(
        300.0, description="SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT: a prefill fails a request "
        "whose decode has not bootstrapped its room by then; default 300 s")
    waiting_timeout_s: Seconds = Field(
        300.0, description="SGLANG_DISAGGREGATION_WAITING_TIMEOUT: a decode fails a request "
        "whose KV has not arrived by then; default 300 s")
    base_port: PosInt = Field(17000, le=65535, description="First decode session rpc port")


BLACKLIST_POLICIES.renamed["recovery"] = (
    "blacklist.recovery is now blacklist.policy (none -> permanent; probe; v0_5_23; also ttl, "
    "strikes_window, circuit_breaker, never)")
BlacklistConfig = Annotated[registry.Params, BLACKLIST_POLICIES.field()]
"""``blacklist:``: ``policy`` names a registered policy (pdsim.engine.blacklist); its parameters sit
beside it and are checked by the policy's own model (with a ``check(ctx)`` like any section)."""


class FlushConfig(Strict):
    semantics: Literal["skip_idle_check", "reject_if_busy"] = Field(
        "skip_idle_check",
        description="Immediate path (timeout<=0): flush regardless (incident report) or 400 when "
        "busy (released 0.5.10-0.5.23)",
    )
    dooms: Literal["source", "source_and_destination", "source_and_unstarted"] = Field(
        "source_and_destination",
        description="Which transfers a flush fails (an assumption: the write-up only says the "
        "engine 'reads a freshly freed buffer'). source: those reading prefill pages the flush "
        "freed (forward, chunked, in-flight); source_and_destination: also those writing into "
        "decode pages it freed, once their prefill has started; source_and_unstarted: also "
        "rooms pre-allocated on the decode whose prefill has not started",
    )


# the same coefficients and bounds as a model profile's fitted.<GPU> (MAX_MS)
Coefficient, FITTED_KEYS = profile_schema.Coefficient, profile_schema.FITTED_KEYS


class PredictorConfig(Strict):
    kind: Literal["operator", "fitted", "roofline"] = Field(
        "operator", description="operator: per-layer GEMM/attention/MoE/communication model "
        "from the GPU, model and engine profiles; fitted: a + b*... coefficients from the model "
        "profile; roofline: one MFU and one HBM derate")
    two_batch_overlap: bool = Field(
        False, description="operator: --enable-two-batch-overlap (communication hidden under "
        "the other micro-batch's computation)")
    expert_imbalance: Annotated[float, Field(ge=1, le=100, allow_inf_nan=False), _NUM] = Field(
        1.0, description="operator, EP: busiest expert-GPU load over the mean (1: balanced; "
        "a measured value from SGLang's expert distribution recorder)")
    coefficients: dict[str, Coefficient] = Field(
        default_factory=dict, description="fitted: override coefficients by name (ms terms, "
        f"finite, 0..{MAX_MS:g})"
    )
    prefill_mfu: Fraction = Field(0.35, description="Roofline: achieved fraction of peak FLOP/s")
    hbm_derate: Fraction = Field(0.8, description="Roofline: achieved fraction of HBM bandwidth")
    step_overhead_ms: Millis = Field(5.0, description="Roofline: per-step launch overhead")

    def check(self, ctx: Context) -> None:
        unknown = sorted(set(self.coefficients) - set(FITTED_KEYS))
        if unknown:
            raise Invalid("coefficients", f"unknown {echo(unknown)}; allowed: "
                          f"{', '.join(FITTED_KEYS)}")
        if self.coefficients and self.kind != "fitted":
            raise Invalid("coefficients", f"belong to the fitted predictor; set "
                          f"predictor.kind: fitted (kind is {self.kind!r})")

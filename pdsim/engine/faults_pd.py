"""Faults that reach SGLang's PD timeout and abort paths (issue 26), registered beside the
fault kinds of :mod:`pdsim.engine.faults` in the same registry and library.

- ``load_spike``: a bench client's arrival rate is multiplied by ``factor`` for a while: the
  slowness that TTFT timeouts turn into aborts (PR #28651's trigger, with ``gateway_timeout``).
- ``gateway_timeout``: the gateway in front of the router starts (or stops) giving up on
  requests without a first token (``router.ttft_timeout_s``), cancelling both legs or only the
  prefill's (``router.ttft_timeout_cancels``).
- ``lost_done``: a transfer's done signal is lost with probability ``probability``: either the
  Success message never reaches the decode (the receiver stays WaitingForInput, bounded by its
  waiting timeout) or the metadata (aux) write never lands (the decode's metadata gate, 0.5.13+,
  holds the room in Transferring for ever unless PR #31800's fix): PR #31800's trigger.
- ``prefill_restart``: a prefill server's process dies and a new one serves after ``down_s``
  behind the same address (a restarted pod behind a k8s Service): PR #34289 / issue #33789,
  and PR #36029 for Mooncake. The decodes' cached connections go stale (:mod:`peers`).
- ``leg_failure``: one leg of a request (the POST to the prefill or to the decode) fails at
  transport level (``error sending request``) with probability ``probability``: PR #29482's
  trigger, a decode HTTP server stalled by a burst.

Each draws its randomness, if any, from the run's ``faults`` stream (arrivals never move).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Annotated, Literal

from pydantic import Field

from pdsim.config.registry import FAULTS
from pdsim.config.units import (
    _NUM,
    MAX_TIME_S,
    Context,
    Fraction,
    Instant,
    Invalid,
    NonNegInt,
    Seconds,
)
from pdsim.engine.faults import (  # noqa: F401 (the kinds of faults.py register with it)
    LIBRARY,
    FaultParams,
    Faults,
    _kv_path,
    _prefill_server,
)
from pdsim.engine.request import Room

Factor = Annotated[float, Field(gt=0, le=1e4, allow_inf_nan=False), _NUM]


def _in(now: float, start: float, end: float | None) -> bool:
    return start <= now and (end is None or now < end)


class LoadSpikeParams(FaultParams):
    """A bench client's offered load is ``factor`` times its own for ``duration_s`` from
    ``at_s``, as a burst of traffic: an open loop's arrivals come ``factor`` times as fast
    (the same prompts and draws: the arrival times inside the window are compressed and the
    later ones move up); a closed loop gets ``factor`` times its ``max_concurrency``."""

    client: NonNegInt = Field(0, description="Index of the bench client in clients; default 0")
    at_s: Instant = Field(description="When the spike starts (simulated s)")
    duration_s: Seconds = Field(description="How long it lasts")
    factor: Factor = Field(3.0, description="Arrival rate during the spike over the client's "
                           "own; default 3")

    def check(self, ctx: Context) -> None:
        clients = ctx.scenario.clients
        if self.client >= len(clients):
            raise Invalid("client", f"must be < {len(clients)}, the clients of the scenario",
                          self.client)
        c = clients[self.client]
        closed = c.kind == "bench" and c.request_rate in ("inf", float("inf"))
        if c.kind != "bench" or (closed and not c.max_concurrency):
            raise Invalid("client", f"client {self.client} ({c.name!r}) must be a bench client "
                          f"with a finite request_rate, a trace's timestamps or a "
                          f"max_concurrency: a spike speeds up arrivals, or raises the "
                          f"concurrency of a closed loop", self.client)


class GatewayTimeoutParams(FaultParams):
    """The gateway's TTFT timeout changes at ``at_s`` (a config push), for ``duration_s`` or
    for good: requests arriving afterwards without a first token after ``ttft_timeout_s`` get
    504, and the legs ``cancels`` names are aborted."""

    at_s: Instant = Field(description="When the new timeout applies (simulated s)")
    ttft_timeout_s: Seconds | None = Field(description="The new TTFT timeout; null: none")
    cancels: Literal["both", "prefill"] | None = Field(
        None, description="What a timeout cancels from then on (router.ttft_timeout_cancels); "
        "default: as before")
    duration_s: Seconds | None = Field(None, description="How long the change lasts; null: "
                                       "to the end of the run")

    def check(self, ctx: Context) -> None:
        if ctx.scenario.fleet.mode == "colocated":
            raise Invalid("kind", "gateway_timeout changes the TTFT timeout of a PD fleet's "
                          "router (a prefill and a decode leg per request); a colocated "
                          "fleet's gateway has none in pdsim", "gateway_timeout")

    def window(self, horizon: float) -> tuple[float, float]:
        """A change for good is a trigger at its instant (recovery counts from it); one that
        is undone later lasts until then."""
        return self.at_s, self.at_s if self.duration_s is None else self.at_s + self.duration_s


class LostDoneParams(FaultParams):
    """Each transfer that ends in ``[from_s, to_s)`` loses its done signal with probability
    ``probability``: ``what: status``, the prefill's Success message never reaches the decode;
    ``aux``, its metadata row never lands (the KV does)."""

    probability: Fraction = Field(description="Chance that a transfer's done signal is lost")
    what: Literal["status", "aux"] = Field("aux", description="status: the Success message is "
                                           "lost; aux: the metadata write is; default aux")
    from_s: Instant = Field(0.0, description="Start of the window (simulated s); default 0")
    to_s: Seconds | None = Field(None, description="End of the window; null: the run's end")
    prefill_server: NonNegInt | None = Field(None, description="Only this prefill server's "
                                             "transfers; null: all")

    def check(self, ctx: Context) -> None:
        _kv_path(ctx, "lost_done")
        if self.prefill_server is not None:
            _prefill_server(ctx, self.prefill_server)
        if self.to_s is not None and not self.to_s > self.from_s:
            raise Invalid("to_s", f"must be after from_s ({self.from_s:g})", self.to_s)

    def window(self, horizon: float) -> tuple[float, float]:
        return self.from_s, self.to_s if self.to_s is not None else horizon


class PrefillRestartParams(FaultParams):
    """A prefill server's process dies at ``at_s``; a new one serves ``down_s`` later behind
    the same address. Everything the old one held ends on the prefill side ("prefill_restarted";
    the decodes are not told); the decodes' cached connections point at the old process."""

    prefill_server: NonNegInt = Field(0, description="The prefill server that restarts; "
                                      "default 0")
    at_s: Instant = Field(description="When the old process dies (simulated s)")
    down_s: Seconds = Field(3.0, description="Seconds the address answers nothing before the "
                            "new process serves (a heartbeat needs heartbeat_interval_s x "
                            "heartbeat_max_failure of it to notice); default 3")

    def check(self, ctx: Context) -> None:
        _kv_path(ctx, "prefill_restart")
        _prefill_server(ctx, self.prefill_server)
        if self.at_s + self.down_s > MAX_TIME_S:
            raise Invalid("down_s", f"at_s + down_s passes {MAX_TIME_S:g} s", self.down_s)

    def window(self, horizon: float) -> tuple[float, float]:
        return self.at_s, self.at_s + self.down_s


class LegFailureParams(FaultParams):
    """In ``[from_s, to_s)``, each request's POST to the ``leg`` server fails at transport
    level with probability ``probability`` (``error sending request``: that server never hears
    of it); what the router does then is ``router.dispatch``'s."""

    leg: Literal["decode", "prefill"] = Field("decode", description="Which leg fails; default "
                                              "decode")
    probability: Fraction = Field(description="Chance that a request's leg fails")
    from_s: Instant = Field(0.0, description="Start of the window (simulated s); default 0")
    to_s: Seconds | None = Field(None, description="End of the window; null: the run's end")

    def check(self, ctx: Context) -> None:
        _kv_path(ctx, "leg_failure")
        if self.to_s is not None and not self.to_s > self.from_s:
            raise Invalid("to_s", f"must be after from_s ({self.from_s:g})", self.to_s)

    def window(self, horizon: float) -> tuple[float, float]:
        return self.from_s, self.to_s if self.to_s is not None else horizon


# --- install functions ---------------------------------------------------------------------


@FAULTS.register("load_spike", params=LoadSpikeParams)
def _load_spike(f: LoadSpikeParams, faults: Faults) -> Generator:
    client = faults.fleet.clients[f.client]  # (its arrivals are drawn when it starts)
    client.spikes = (*client.spikes, (f.at_s, f.at_s + f.duration_s, f.factor))
    yield from _window(faults, f.at_s, f.at_s + f.duration_s,
                       f"{client.name}: load x{f.factor:g} for {f.duration_s:g} s",
                       f"{client.name}: load back to its own")


@FAULTS.register("gateway_timeout", params=GatewayTimeoutParams)
def _gateway_timeout(f: GatewayTimeoutParams, faults: Faults) -> Generator:
    router = faults.fleet.router
    yield faults.env.timeout(f.at_s)
    before = (router.ttft_timeout, router.ttft_cancels)
    cancels = f.cancels or router.ttft_cancels
    router.set_ttft(f.ttft_timeout_s, cancels)
    shown = "none" if f.ttft_timeout_s is None else f"{f.ttft_timeout_s:g} s"
    faults.log("fault_start", "router", value=f.ttft_timeout_s or 0.0,
               detail=f"gateway TTFT timeout now {shown} (cancels {cancels})")
    if f.duration_s is None:
        return
    yield faults.env.timeout(f.duration_s)
    router.set_ttft(*before)
    faults.log("fault_end", "router", detail="gateway TTFT timeout restored")


@FAULTS.register("lost_done", params=LostDoneParams)
def _lost_done(f: LostDoneParams, faults: Faults) -> Generator:
    env, rng = faults.env, faults.rng

    def lose(_room: Room) -> str:
        if _in(env.now, f.from_s, f.to_s) and rng.random() < f.probability:
            return f.what
        return ""

    for rank in faults.fleet.prefill_ranks:
        if f.prefill_server is None or rank.server == f.prefill_server:
            rank.engine.lost_done = lose
    where = "all prefills" if f.prefill_server is None else f"prefill-{f.prefill_server}"
    yield from _window(faults, f.from_s, f.to_s, f"{where}: done signals lost ({f.what}, "
                       f"p={f.probability:g})", "done signals delivered again")


@FAULTS.register("prefill_restart", params=PrefillRestartParams)
def _prefill_restart(f: PrefillRestartParams, faults: Faults) -> Generator:
    env, fleet, p = faults.env, faults.fleet, f.prefill_server
    server = fleet.prefill_servers[p]
    yield env.timeout(f.at_s)
    fleet.peers.crashed(p)
    server.down = True
    lost = sum(len(rank.crash()) for rank in server.ranks)
    faults.log("fault_start", server.name, value=lost,
               detail=f"prefill process died ({lost} requests lost); same address")
    yield env.timeout(f.down_s)
    for rank in server.ranks:
        rank.restart()
    server.down = False
    fleet.peers.restarted(p)
    faults.log("fault_end", server.name, detail="new prefill process serving behind the same "
               "address")


@FAULTS.register("leg_failure", params=LegFailureParams)
def _leg_failure(f: LegFailureParams, faults: Faults) -> Generator:
    env, rng = faults.env, faults.rng
    router = faults.fleet.router
    before = router.leg_fault

    def broken(req: object) -> str:
        if before is not None and (leg := before(req)):
            return leg
        if _in(env.now, f.from_s, f.to_s) and rng.random() < f.probability:
            return f.leg
        return ""

    router.leg_fault = broken
    yield from _window(faults, f.from_s, f.to_s, f"{f.leg} legs fail at transport level "
                       f"(p={f.probability:g})", f"{f.leg} legs reach their server again")


def _window(faults: Faults, start: float, end: float | None, begins: str,
            ends: str) -> Generator:
    """Log a fault's window (the timeline's lines): its start, and its end if it has one."""
    env = faults.env
    yield env.timeout(start)
    faults.log("fault_start", "fleet", detail=begins)
    if end is not None:
        yield env.timeout(end - start)
        faults.log("fault_end", "fleet", detail=ends)


RESTART_KINDS = {"prefill_restart"}
"""Kinds that change a prefill process behind its address (the fleet then keeps the decodes'
connection caches and runs their heartbeat: pdsim.engine.peers)."""

# --- the library: what each models, with its chosen values ------------------------------------

PD_LIBRARY: dict[str, tuple[dict, str]] = {
    "load_spike": (
        {"kind": "load_spike", "client": 0, "at_s": 60.0, "duration_s": 30.0, "factor": 3.0},
        "Client 0's arrival rate triples for 30 s from 60 s (chosen: a burst that outruns the "
        "fleet for a while; plausible x1.5-x10 for 10 s-10 min). Needs an open-loop client. "
        "Alone it costs latency; with a TTFT timeout it becomes aborts."),
    "gateway_timeout": (
        {"kind": "gateway_timeout", "at_s": 60.0, "ttft_timeout_s": 2.0, "cancels": "prefill",
         "duration_s": 60.0},
        "From 60 s for 60 s a gateway gives up on requests without a first token after 2 s, "
        "aborting only the prefill leg (chosen: PR #28651's 'gateway timeout change'; its "
        "values were not reported). Every decode copy of a timed-out request holds its slot "
        "until its own 300 s waiting timeout unless prefill_abort_notifies_decode."),
    "lost_done": (
        {"kind": "lost_done", "probability": 0.05, "what": "aux", "from_s": 60.0, "to_s": 120.0},
        "From 60 s to 120 s, 5% of transfers' metadata writes never land (chosen; PR #31800 "
        "reports no rate). On 0.5.13+ each holds a decode slot in Transferring for ever unless "
        "waiting_timeout_in_transferring; slots leak until admission stops."),
    "prefill_restart": (
        {"kind": "prefill_restart", "prefill_server": 0, "at_s": 60.0, "down_s": 3.0},
        "Prefill server 0's process is replaced at 60 s behind the same address, answering "
        "nothing for 3 s (chosen: shorter than 2 x 5 s, so the stock heartbeat never notices). "
        "Before 0.5.19 every later request to it fails until the decode restarts; from 0.5.19 "
        "the first ones fail and the cache refreshes; PR #34289's instance id notices at the "
        "next heartbeat."),
    "leg_failure": (
        {"kind": "leg_failure", "leg": "decode", "probability": 0.2, "from_s": 60.0,
         "to_s": 90.0},
        "From 60 s to 90 s a fifth of requests' decode legs fail at transport level (chosen: "
        "PR #29482's 'subset of decode legs' during a decode HTTP stall). Under a joining "
        "router each waits for its prefill leg's bootstrap timeout (300 s), wedged."),
}
for _name, (_spec, _doc) in PD_LIBRARY.items():
    FAULTS.add_preset(_name, _spec, _doc)
    LIBRARY[_name] = (_spec, _doc)

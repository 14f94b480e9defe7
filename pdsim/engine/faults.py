"""Faults other than the flush race's own, and the state of every KV path they break.

Each fault kind is registered in :data:`pdsim.config.registry.FAULTS` with its parameter model (the
``faults:`` items of a scenario; ``kind`` selects one) and an install function. A fault breaks
KV paths (prefill server -> decode session), stalls or kills decode servers, slows NICs, injects
``ret != 0`` or flushes; the transfer engine asks :class:`Paths` what a write on a path meets:

- ``UP``: the write proceeds.
- ``GONE``: the peer process is gone but its host answers (a crashed decode): the RDMA QP
  exhausts its retries (``transfer.qp_retry_s``) and the reconnect is refused at once.
- ``SILENT``: nothing answers (hung decode, partition, a NIC link down): after the QP's retries
  the engine's reconnects wait; the write returns ``ret != 0`` when the path comes back (its
  other slices were already flushed as failed) or at the transfer timeout, whichever is first.
  An outage shorter than ``qp_retry_s`` costs nothing: RDMA retransmits.

Presets (``faults: [{preset: decode_crash}]``, overridable: ``{preset: decode_crash, at_s:
90}``) form the fault library that ``pdsim whatif`` runs; their chosen values are documented
with each one (``pdsim faults``).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal, Protocol

from pydantic import Field

from pdsim.config.registry import FAULTS
from pdsim.config.units import (
    _NUM,
    MAX_COUNT,
    MAX_TICKS,
    MAX_TIME_S,
    MIN_BANDWIDTH_FRACTION,
    Context,
    Fraction,
    Instant,
    Interval,
    Invalid,
    NonNegInt,
    PosInt,
    Seconds,
    Strict,
)

if TYPE_CHECKING:  # annotations only: validating a scenario needs neither
    import numpy as np
    import simpy


class DecodeRankView(Protocol):
    """What a fault does to a decode rank (pdsim.engine.decode.DecodeRank)."""

    name: str
    index: int
    session: str
    transfer: dict
    prealloc: Sequence

    def halt(self) -> None: ...
    def resume(self) -> bool: ...
    def crash(self) -> None: ...
    def restart(self) -> None: ...


class ServerView(Protocol):
    """A decode server as faults see it (pdsim.engine.server.Server)."""

    name: str
    ranks: Sequence[DecodeRankView]
    down: bool


class NicView(Protocol):
    def scale(self, factor: float) -> None: ...


class FaultHost(Protocol):
    """What faults need from the fleet they break (pdsim.engine.fleet.Fleet provides it)."""

    env: simpy.Environment
    decode_ranks: Sequence[DecodeRankView]
    decode_servers: Sequence[ServerView]

    def log(self, event: str, component: str = "", rank: int = -1, rid: int = -1,
            room: int = -1, peer: str = "", value: float = 0.0, detail: str = "") -> None: ...

    def prefill_nics(self, prefill_server: int) -> list[NicView]:
        """The NICs a prefill server's transfer engines write through."""
        ...

    def bare_flush(self, caller: str) -> simpy.Event:
        """``POST /flush_cache`` through the router without a timeout."""
        ...

    def new_session(self, rank: DecodeRankView) -> None:
        """A restarted decode rank's new session id."""
        ...

    def reregister(self, session: str, prefill_server: int) -> None:
        """The decode re-registers with a prefill server (clears its blacklist entries)."""
        ...

UP, GONE, SILENT, SLOW = 0, 1, 2, 3
STATE_NAMES = {UP: "up", GONE: "gone", SILENT: "silent", SLOW: "slow"}


class Paths:
    """Which (prefill server, decode session) KV paths are down, why, and who waits on them."""

    def __init__(self, env: simpy.Environment, log: Callable[..., None] | None = None) -> None:
        self.env = env
        self.log = log or (lambda *a, **k: None)
        self.active = False  # set when a scenario has a fault that breaks paths
        self.session_down: dict[str, tuple[int, str]] = {}
        self.prefill_down: dict[int, tuple[int, str]] = {}
        self._watch: dict[int, tuple[int, str, simpy.Event, bool]] = {}
        self._n = 0

    def state(self, prefill_server: int, session: str) -> tuple[int, str]:
        """(UP/GONE/SILENT, cause). A local link down hides whatever the peer is."""
        st = self.prefill_down.get(prefill_server)
        if st is not None:
            return st
        return self.session_down.get(session, (UP, ""))

    def set_session(self, session: str, state: int, cause: str = "") -> None:
        if state == UP:
            self.session_down.pop(session, None)
        else:
            self.session_down[session] = (state, cause)
        self.log("path", "", peer=session, value=state, detail=cause or "up")
        self._notify()

    def set_prefill(self, prefill_server: int, state: int, cause: str = "") -> None:
        if state == UP:
            self.prefill_down.pop(prefill_server, None)
        else:
            self.prefill_down[prefill_server] = (state, cause)
        self.log("path", f"prefill-{prefill_server}", value=state, detail=cause or "up")
        self._notify()

    def watch(self, prefill_server: int, session: str, down: bool) -> tuple[int, simpy.Event]:
        """An event that fires (value: the new state) when the path goes down (``down``) or
        comes back up; ``unwatch`` the key when no longer waiting."""
        self._n += 1
        ev = self.env.event()
        self._watch[self._n] = (prefill_server, session, ev, down)
        return self._n, ev

    def unwatch(self, key: int) -> None:
        self._watch.pop(key, None)

    def _notify(self) -> None:
        for key, (p, s, ev, want_down) in list(self._watch.items()):
            st = self.state(p, s)
            if (st[0] != UP) == want_down:
                del self._watch[key]
                ev.succeed(st)


# --- parameter models (scenario sections: check(ctx) runs at load, so validate catches it) -----


class FaultParams(Strict):
    """Base of every fault's parameters."""

    def window(self, horizon: float) -> tuple[float, float]:
        """When the fault is active: (start, end) in seconds; recovery counts from the end."""
        at = getattr(self, "at_s", 0.0)
        return at, at + getattr(self, "duration_s", 0.0)


def _index(key: str, value: int, n: int, what: str) -> None:
    if value >= n:
        raise Invalid(key, f"must be < {n}, the {what} of the fleet (indices 0..{n - 1})", value)


def _prefill_server(ctx: Context, value: int) -> None:
    _index("prefill_server", value, ctx.scenario.fleet.prefill.servers, "prefill servers")


def _decode_server(ctx: Context, value: int) -> None:
    fleet = ctx.scenario.fleet
    if fleet.mode == "colocated":  # (the servers that decode: a colocated fleet's own)
        _index("decode_server", value, fleet.colocated.servers, "colocated servers")
        return
    _index("decode_server", value, fleet.decode.servers, "decode servers")


def _kv_path(ctx: Context, kind: str) -> None:
    """Refuse a fault that needs a KV path between prefill and decode servers on a colocated
    fleet (its servers keep their KV on their own GPUs)."""
    if ctx.scenario.fleet.mode == "colocated":
        raise Invalid("kind", f"{kind} breaks KV transfers between prefill and decode servers, "
                      f"which a colocated fleet does not have (its faults: decode_crash, "
                      f"decode_hang, flush_race)", kind)


class DecodeUnreachableParams(FaultParams):
    """A decode rank's KV endpoint stops answering (its NIC or RDMA path): writes and probes to
    its session meet a silent peer; its scheduler keeps running and pre-allocating."""

    decode_rank: NonNegInt = Field(description="Global decode rank index (server*dp + rank)")
    at_s: Instant = Field(description="When the endpoint stops answering (simulated s)")
    duration_s: Seconds = Field(description="How long it stays silent")

    def check(self, ctx: Context) -> None:
        _kv_path(ctx, "decode_unreachable")
        d = ctx.scenario.fleet.decode
        n = d.servers * d.dp
        if self.decode_rank >= n:
            raise Invalid("decode_rank", f"must be < {n}, the decode ranks of the fleet "
                          f"(servers {d.servers} x dp {d.dp}; index = server*dp + rank)",
                          self.decode_rank)


class PartitionParams(FaultParams):
    """A prefill server cut off from the decode servers (KV, bootstrap and heartbeats).

    Writes across it meet a silent path and rooms cannot bootstrap across it; decode heartbeats
    to the prefill miss, and after ``heartbeat_misses`` the decode fails its rooms from that
    prefill (and new ones at once) and re-registers when the partition heals (which clears
    its sessions from that prefill's blacklists).
    """

    prefill_server: NonNegInt = Field(0, description="The prefill server cut off; default 0")
    at_s: Instant = Field(description="When the partition starts (simulated s)")
    duration_s: Seconds = Field(description="How long it lasts")
    heartbeat_interval_s: Interval = Field(5.0, description="SGLANG_DISAGGREGATION_HEARTBEAT_"
                                           "INTERVAL")
    heartbeat_misses: PosInt = Field(2, le=MAX_COUNT, description="SGLANG_DISAGGREGATION_"
                                     "HEARTBEAT_MAX_FAILURE")

    def check(self, ctx: Context) -> None:
        _kv_path(ctx, "partition")
        _prefill_server(ctx, self.prefill_server)
        span = self.at_s + self.duration_s + self.heartbeat_interval_s * (
            self.heartbeat_misses + 1)
        beats = span / self.heartbeat_interval_s * ctx.scenario.fleet.decode.servers
        if beats > MAX_TICKS:
            raise Invalid("heartbeat_interval_s", f"implies {beats:,.0f} heartbeats (decode "
                          f"servers x (at_s + duration_s) / heartbeat_interval_s); at most "
                          f"{MAX_TICKS:,}: raise the interval", self.heartbeat_interval_s)


class TransferErrorsParams(FaultParams):
    """Random ``ret != 0`` on KV writes in a window, drawn from the ``faults`` random stream."""

    probability: Fraction = Field(description="Chance that one write returns ret != 0")
    from_s: Instant = Field(0.0, description="Start of the window (simulated s); default 0")
    to_s: Seconds | None = Field(None, description="End of the window; null: until the run "
                                 "ends")

    def check(self, ctx: Context) -> None:
        _kv_path(ctx, "transfer_errors")
        if self.to_s is not None and not self.to_s > self.from_s:
            raise Invalid("to_s", f"must be after from_s ({self.from_s:g})", self.to_s)

    def window(self, horizon: float) -> tuple[float, float]:
        return self.from_s, self.to_s if self.to_s is not None else horizon


class DecodeCrashParams(FaultParams):
    """A decode server's processes die (all its DP ranks; with DP attention one rank's death
    takes the server down) and restart after ``restart_after_s`` under new session ids.

    Its requests get a broken connection (HTTP 502); new ones are refused by it at once (the
    router answers 502) while the prefill's copy waits out the bootstrap timeout. The prefill
    learns of the crash only when a write to an old session fails (``GONE``). A restarted
    Mooncake engine binds a new RPC port, so the session id (``host:rpc_port``) is new.
    """

    decode_server: NonNegInt = Field(0, description="The decode server that dies (on a "
                                     "colocated fleet: the server); default 0")
    at_s: Instant = Field(description="When it dies (simulated s)")
    restart_after_s: Seconds | None = Field(
        60.0, description="Seconds until the server serves again (new sessions); null: never")

    def window(self, horizon: float) -> tuple[float, float]:
        end = horizon if self.restart_after_s is None else self.at_s + self.restart_after_s
        return self.at_s, end

    def check(self, ctx: Context) -> None:
        _decode_server(ctx, self.decode_server)


class DecodeHangParams(FaultParams):
    """A decode server stalls for ``duration_s`` (a long GC pause, an NCCL or host stall), then
    carries on with the same sessions: no steps and no pre-allocation meanwhile.

    ``kv_writes``: ``time_out`` (the stall reaches its KV endpoint: writes and probes meet a
    silent peer) or ``land`` (one-sided RDMA writes still land while the scheduler is stuck;
    the blacklist sees nothing).
    """

    decode_server: NonNegInt = Field(0, description="The decode server that stalls (on a "
                                     "colocated fleet: the server); default 0")
    at_s: Instant = Field(description="When the stall starts (simulated s)")
    duration_s: Seconds = Field(description="How long it lasts")
    kv_writes: Literal["time_out", "land"] = Field(
        "time_out", description="time_out: KV writes and probes meet a silent peer; land: "
        "one-sided RDMA writes still land; default time_out")

    def check(self, ctx: Context) -> None:
        _decode_server(ctx, self.decode_server)


class NicFlapsParams(FaultParams):
    """A prefill server's RDMA link goes down ``flaps`` times for ``down_s``, every
    ``every_s``: writes in flight meet a silent path (``ret != 0`` when an outage outlasts the
    QP's retries); heartbeats (on the management network) are unaffected."""

    prefill_server: NonNegInt = Field(0, description="The prefill server whose link flaps; "
                                      "default 0")
    at_s: Instant = Field(description="When the first flap starts (simulated s)")
    flaps: PosInt = Field(5, le=MAX_COUNT, description="Times the link goes down; default 5")
    every_s: Interval = Field(10.0, description="Seconds from one flap's start to the next's; "
                              "default 10")
    down_s: Seconds = Field(2.0, description="Seconds the link stays down each time; default 2")

    def check(self, ctx: Context) -> None:
        _kv_path(ctx, "nic_flaps")
        _prefill_server(ctx, self.prefill_server)
        if self.down_s >= self.every_s:
            raise Invalid("down_s", f"must be shorter than every_s ({self.every_s:g})",
                          self.down_s)
        if self.at_s + self.flaps * self.every_s > MAX_TIME_S:
            raise Invalid("flaps", f"at_s + flaps x every_s passes {MAX_TIME_S:g} s",
                          self.flaps)

    def window(self, horizon: float) -> tuple[float, float]:
        return self.at_s, self.at_s + (self.flaps - 1) * self.every_s + self.down_s


class NicDegradedParams(FaultParams):
    """A prefill server's NICs drop to ``bandwidth_fraction`` of their rate (a PFC pause storm,
    a link renegotiated down), so writes outlast the transfer timeout (``transfer_timeout``)."""

    prefill_server: NonNegInt = Field(0, description="The prefill server whose NICs degrade; "
                                      "default 0")
    at_s: Instant = Field(description="When the NICs degrade (simulated s)")
    duration_s: Seconds = Field(description="How long they stay degraded")
    bandwidth_fraction: Annotated[float, Field(ge=MIN_BANDWIDTH_FRACTION, le=1,
                                               allow_inf_nan=False), _NUM] = Field(
        1e-5, description="Share of the line rate left; default 1e-5")

    def check(self, ctx: Context) -> None:
        _kv_path(ctx, "nic_degraded")
        _prefill_server(ctx, self.prefill_server)


class FlushRaceParams(FaultParams):
    """The incident's trigger on any fleet: a bare ``POST /flush_cache`` (its ``?timeout=``
    dropped by mini_lb 0.3.2) under load; with ``flush.semantics: skip_idle_check`` every rank
    frees KV under its in-flight transfers."""

    at_s: Instant = Field(description="When the bare flush reaches the router (simulated s)")


# --- install functions ---------------------------------------------------------------------


@FAULTS.register("decode_unreachable", params=DecodeUnreachableParams)
def _decode_unreachable(f: DecodeUnreachableParams, faults: Faults) -> Generator:
    rank = faults.fleet.decode_ranks[f.decode_rank]
    yield faults.env.timeout(f.at_s)
    session = rank.session
    faults.paths.set_session(session, SILENT, "decode_unreachable")
    faults.log("fault_start", rank.name, rank.index, peer=session, detail="decode unreachable")
    yield faults.env.timeout(f.duration_s)
    faults.paths.set_session(session, UP)
    faults.log("fault_end", rank.name, rank.index, peer=session, detail="decode reachable")


@FAULTS.register("partition", params=PartitionParams)
def _partition(f: PartitionParams, faults: Faults) -> Generator:
    for d in faults.fleet.decode_servers:
        faults.env.process(faults.heartbeat(d, f))
    yield faults.env.timeout(f.at_s)
    faults.cut.add(f.prefill_server)
    faults.paths.set_prefill(f.prefill_server, SILENT, "partition")
    faults.log("fault_start", f"prefill-{f.prefill_server}", detail="partition")
    yield faults.env.timeout(f.duration_s)
    faults.cut.discard(f.prefill_server)
    faults.paths.set_prefill(f.prefill_server, UP)
    faults.log("fault_end", f"prefill-{f.prefill_server}", detail="partition healed")


@FAULTS.register("transfer_errors", params=TransferErrorsParams)
def _transfer_errors(f: TransferErrorsParams, faults: Faults) -> Generator:
    faults.errors.append(f)
    return
    yield  # a generator, like every install function


@FAULTS.register("decode_crash", params=DecodeCrashParams)
def _decode_crash(f: DecodeCrashParams, faults: Faults) -> Generator:
    env, fleet = faults.env, faults.fleet
    server = fleet.decode_servers[f.decode_server]
    yield env.timeout(f.at_s)
    server.down = True
    for rank in server.ranks:
        faults.paths.set_session(rank.session, GONE, "decode_crashed")
        rank.crash()
    faults.log("fault_start", server.name, detail="decode crashed",
               peer=",".join(r.session for r in server.ranks))
    if f.restart_after_s is None:
        return
    yield env.timeout(f.restart_after_s)
    for rank in server.ranks:
        fleet.new_session(rank)
        rank.restart()
    server.down = False
    faults.log("fault_end", server.name, detail="decode restarted",
               peer=",".join(r.session for r in server.ranks))


@FAULTS.register("decode_hang", params=DecodeHangParams)
def _decode_hang(f: DecodeHangParams, faults: Faults) -> Generator:
    env = faults.env
    server = faults.fleet.decode_servers[f.decode_server]
    yield env.timeout(f.at_s)
    sessions = [r.session for r in server.ranks]
    for rank in server.ranks:
        rank.halt()
    if f.kv_writes == "time_out":
        for s in sessions:
            faults.paths.set_session(s, SILENT, "decode_hung")
    faults.log("fault_start", server.name, detail=f"decode hung (kv writes {f.kv_writes})",
               peer=",".join(sessions))
    yield env.timeout(f.duration_s)
    for s in sessions:
        faults.paths.set_session(s, UP)
    for rank in server.ranks:
        rank.resume()
    faults.log("fault_end", server.name, detail="decode resumed", peer=",".join(sessions))


@FAULTS.register("nic_flaps", params=NicFlapsParams)
def _nic_flaps(f: NicFlapsParams, faults: Faults) -> Generator:
    env, p = faults.env, f.prefill_server
    yield env.timeout(f.at_s)
    for k in range(f.flaps):
        if k:
            yield env.timeout(f.every_s - f.down_s)
        faults.paths.set_prefill(p, SILENT, "nic_flap")
        faults.log("fault_start", f"prefill-{p}", value=k, detail="nic link down")
        yield env.timeout(f.down_s)
        faults.paths.set_prefill(p, UP)
        faults.log("fault_end", f"prefill-{p}", value=k, detail="nic link up")


@FAULTS.register("nic_degraded", params=NicDegradedParams)
def _nic_degraded(f: NicDegradedParams, faults: Faults) -> Generator:
    env = faults.env
    nics = faults.fleet.prefill_nics(f.prefill_server)
    yield env.timeout(f.at_s)
    for nic in nics:
        nic.scale(f.bandwidth_fraction)
    faults.paths.log("path", f"prefill-{f.prefill_server}", value=SLOW, detail="nic_degraded")
    faults.log("fault_start", f"prefill-{f.prefill_server}", value=f.bandwidth_fraction,
               detail="nic degraded")
    yield env.timeout(f.duration_s)
    for nic in nics:
        nic.scale(1.0)
    faults.paths.log("path", f"prefill-{f.prefill_server}", value=UP, detail="up")
    faults.log("fault_end", f"prefill-{f.prefill_server}", detail="nic restored")


@FAULTS.register("flush_race", params=FlushRaceParams)
def _flush_race(f: FlushRaceParams, faults: Faults) -> Generator:
    yield faults.env.timeout(f.at_s)
    faults.log("fault_start", "router", detail="flush race: bare POST /flush_cache")
    yield faults.fleet.bare_flush("flush_race")
    faults.log("fault_end", "router", detail="flush race answered")


PATH_FAULTS = {"decode_unreachable", "partition", "decode_crash", "decode_hang", "nic_flaps"}
"""Kinds that break KV paths (the engine then watches path state on every write)."""


# --- the library -------------------------------------------------------------------------------

LIBRARY: dict[str, tuple[dict[str, Any], str]] = {
    "flush_race": (
        {"kind": "flush_race", "at_s": 60.0},
        "The incident's trigger: a bare flush under load at 60 s (chosen: the load is steady "
        "from ~5 s). Every pair with a write in flight fails once; the pair is healthy after."),
    "decode_crash": (
        {"kind": "decode_crash", "decode_server": 0, "at_s": 60.0, "restart_after_s": 60.0},
        "Decode server 0 dies at 60 s and restarts 60 s later under new session ids (chosen; a "
        "real restart reloads weights and captures CUDA graphs: 1-10 min). Blacklisting the "
        "old sessions is right and costs nothing afterwards."),
    "decode_hang": (
        {"kind": "decode_hang", "decode_server": 0, "at_s": 60.0, "duration_s": 45.0,
         "kv_writes": "time_out"},
        "Decode server 0 stalls for 45 s (chosen: longer than the 30 s transfer timeout; a GC "
        "or NCCL stall lasts 1-120 s), then serves under the same sessions. Writes in flight "
        "at the stall meet a silent peer; new requests wait for it to pre-allocate, so few "
        "writes reach it. A pair blacklisted during the stall is healthy after it."),
    "decode_nic_down": (
        {"kind": "decode_unreachable", "decode_rank": 0, "at_s": 60.0, "duration_s": 120.0},
        "Decode rank 0's RDMA endpoint goes silent for 120 s while its scheduler keeps "
        "serving and pre-allocating (chosen: a NIC or switch-port failure on the KV network "
        "only, 10 s to the rest of the run). The one fault where the peer keeps accepting "
        "work it cannot receive: every write to it waits out the 30 s transfer timeout."),
    "nic_flaps": (
        {"kind": "nic_flaps", "prefill_server": 0, "at_s": 60.0, "flaps": 5, "every_s": 10.0,
         "down_s": 2.0},
        "Prefill server 0's RDMA link drops 5 times for 2 s, every 10 s (chosen; each outage "
        "outlasts the 0.54 s QP retry budget, so writes in flight fail)."),
    "nic_degraded": (
        {"kind": "nic_degraded", "prefill_server": 0, "at_s": 60.0, "duration_s": 60.0,
         "bandwidth_fraction": 1e-5},
        "Prefill server 0's NICs run at 1e-5 of line rate for 60 s (chosen so that a KV chunk "
        "of the base workload outlasts the 30 s transfer timeout)."),
    "partition": (
        {"kind": "partition", "prefill_server": 0, "at_s": 60.0, "duration_s": 40.0},
        "Prefill server 0 cut off for 40 s (chosen: longer than the 2 x 5 s heartbeat loss "
        "and the 30 s transfer timeout); decodes re-register when it heals."),
    "transient_errors": (
        {"kind": "transfer_errors", "probability": 0.002, "from_s": 0.0},
        "Steady rare ret != 0: 0.2% of writes for the whole run (chosen; plausible "
        "0.1-1%). Each error is transient: the pair is healthy right after."),
}
for _name, (_spec, _doc) in LIBRARY.items():
    FAULTS.add_preset(_name, _spec, _doc)


# --- runtime -------------------------------------------------------------------------------------


class Faults:
    """The faults of one run, installed into its fleet."""

    def __init__(self, fleet: FaultHost, specs: list, rng: np.random.Generator) -> None:
        self.fleet = fleet
        self.env = fleet.env
        self.log = fleet.log
        self.rng = rng
        self.paths = Paths(self.env, self.log)
        self.paths.active = any(f.kind in PATH_FAULTS for f in specs)
        self.cut: set[int] = set()  # prefill servers partitioned (heartbeats miss)
        self.lost: set[int] = set()  # partitioned prefill servers the decodes declared lost
        self.errors: list[TransferErrorsParams] = []  # filled when the run starts
        # whether writes can hit an injected error at all (else the engines never ask)
        self.injects_errors = any(f.kind == "transfer_errors" for f in specs)
        for f in specs:
            gen = FAULTS.get(f.kind).impl(f, self)
            if gen is not None:
                self.env.process(gen)

    def cut_state(self, prefill_server: int) -> int:
        """0: reachable; 1: partitioned; 2: partitioned and declared lost by the decodes."""
        if prefill_server not in self.cut:
            return 0
        return 2 if prefill_server in self.lost else 1

    def write_error(self) -> bool:
        """Whether this write hits an injected ``ret != 0`` (draws only inside a window)."""
        if not self.errors:  # (the usual case: no call of env.now per write)
            return False
        now = self.env.now
        for f in self.errors:
            if f.from_s <= now and (f.to_s is None or now < f.to_s):
                return bool(self.rng.random() < f.probability)
        return False

    def heartbeat(self, decode_server: ServerView, f: PartitionParams) -> Generator:
        """Decode polls the prefill's /health; ``misses`` in a row invalidate the connection."""
        env, p = self.env, f.prefill_server
        misses = 0
        invalidated = False
        end = f.at_s + f.duration_s + f.heartbeat_interval_s * (f.heartbeat_misses + 1)
        while env.now <= end or invalidated:
            yield env.timeout(f.heartbeat_interval_s)
            if p in self.cut:
                misses += 1
                if misses == f.heartbeat_misses and not invalidated:
                    invalidated = True
                    self.lost.add(p)
                    self._lost_prefill(decode_server, p)
            else:
                misses = 0
                if invalidated:
                    invalidated = False
                    self.lost.discard(p)
                    for rank in decode_server.ranks:
                        self.fleet.reregister(rank.session, p)

    def _lost_prefill(self, decode_server: ServerView, p: int) -> None:
        self.log("heartbeat_lost", decode_server.name, peer=f"prefill-{p}",
                 detail="Lost connection with prefill instance")
        for rank in decode_server.ranks:
            for req in list(rank.transfer.values()) + list(rank.prealloc):
                if req.p_server == p and not req.room.resolved:
                    req.room.fail("prefill_heartbeat_lost")

"""Build the fleet a scenario describes: servers, ranks, transfer engines, router, clients."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import simpy

from pdsim.config.engine_version import RULES, has
from pdsim.config.fleet import PrefillConfig, RoleConfig
from pdsim.config.scenario import Scenario
from pdsim.engine import balance, blacklist, clock, lockstep
from pdsim.engine.client import CLIENTS
from pdsim.engine.colocated import ColocatedRank
from pdsim.engine.decode import DecodeRank
from pdsim.engine.faults import Faults
from pdsim.engine.faults_pd import RESTART_KINDS
from pdsim.engine.frontend import FrontEnd
from pdsim.engine.gateway import Gateway
from pdsim.engine.log import EventLog
from pdsim.engine.nic import NIC
from pdsim.engine.peers import Peers
from pdsim.engine.prefill import PrefillRank
from pdsim.engine.recorder import Recorder
from pdsim.engine.request import BY_PEER, DECODE, PREFILL, Request, new_request
from pdsim.engine.router import MiniLB
from pdsim.engine.server import Server
from pdsim.engine.stats import Stats
from pdsim.engine.transfer import TransferEngine
from pdsim.model import predictor, profiles, sglang
from pdsim.model.memory import max_running, nic_layout, pool
from pdsim.util.rng import Streams


def default_chunked_prefill_size(gpu: profiles.GPU, version: str = sglang.DEFAULT_VERSION
                                 ) -> int:
    """SGLang's default ``--chunked-prefill-size`` for ``gpu`` (before any DP division), from
    the device memory in MiB as nvidia-smi reports it (:func:`pdsim.model.sglang.
    chunked_prefill_size`; the KV pool is sized from the same ``hbm_mib``, less the memory not
    free at start-up: pdsim.model.memory.init_mib)."""
    return sglang.chunked_prefill_size(gpu, version)


def chunk_budget(role_cfg: PrefillConfig, gpu: profiles.GPU,
                 version: str = sglang.DEFAULT_VERSION) -> int:
    """Tokens one prefill forward of one rank may take.

    The server's ``--chunked-prefill-size`` (given, or SGLang's GPU-memory default) is a budget
    for the whole server: with ``--enable-dp-attention`` SGLang divides it by ``dp_size``
    (``ServerArgs._handle_data_parallelism``), so 8192 on a DP-4 H20 server is 2048 per rank.
    """
    size = role_cfg.chunked_prefill_size or default_chunked_prefill_size(gpu, version)
    if role_cfg.dp_attention:
        size //= role_cfg.dp
    return max(1, size)


class Fleet:
    def __init__(self, scenario: Scenario, recorder: Recorder | None = None) -> None:
        """``recorder``: a :class:`pdsim.engine.recorder.Recorder` to give every rank and transfer
        engine (their loops read it once, when the run starts)."""
        sc = self.scenario = scenario
        env = self.env = clock.Environment()
        self.log = EventLog(env)
        self.stats = Stats()
        self.rngs = Streams(sc.seed, sc.seeds.model_dump())
        self.requests: list[Request] = []
        prof = self.profiles = profiles.for_scenario(sc)
        self.gpu, self.model, self.engine = prof.gpu, prof.model, prof.engine
        self.colocated = sc.fleet.mode == "colocated"
        self.peers: Peers | None = None  # (a PD fleet with a prefill_restart fault: _build_pd)
        if self.colocated:
            self._build_colocated(recorder)
        else:
            self._build_pd(recorder)
        front = self.frontend()
        self.clients = [CLIENTS[c.kind](env, c, i, front, self.rngs)
                        for i, c in enumerate(sc.clients)]
        for op in sc.operator_flushes:
            env.process(self._operator_flush(op.at_s, op.timeout_s))

    def _build_pd(self, recorder: Recorder | None) -> None:
        """Prefill servers, decode servers, transfer engines and NICs, mini_lb."""
        sc, env = self.scenario, self.env
        gpu, model, engine = self.gpu, self.model, self.engine
        pc, dc, tc = sc.fleet.prefill, sc.fleet.decode, sc.transfer

        # decode side first: prefill engines need the sessions' liveness
        self.decode_ranks: list[DecodeRank] = []
        self.decode_servers: list[Server] = []
        d_pred = self._predictor(dc)
        d_pool = pool(dc, gpu, model, engine, d_pred, sc.engine.version)
        d_engine = self._engine(dc)
        d_pages = d_pool.pages
        for s in range(dc.servers):
            ranks = []
            for r in range(dc.dp):
                port = tc.base_port + len(self.decode_ranks)
                rank = DecodeRank(env, s, r, dc, d_pred, d_pages, tc.waiting_timeout_s, port,
                                  sc.flush.semantics, self.log, self.stats, sc.flush.dooms)
                rank.bootstrap_s = d_engine.bootstrap_ms / 1e3
                rank.retract_20_steps = not has(sc.engine.version, "retract_until_next_step_fits")
                rank.tokenize_s_per_token = d_engine.tokenize_us_per_token * 1e-6
                rank.max_running = max_running(dc, d_pool, model)  # (given, or SGLang's)
                rank.slots = rank.max_running + dc.extra_slots(rank.max_running)
                ranks.append(rank)
                self.decode_ranks.append(rank)
            self.decode_servers.append(Server(env, "decode", s, ranks, balance.build(dc.balance),
                                              self.log))
        self.sessions = {r.session: r for r in self.decode_ranks}
        self.faults = Faults(self, sc.faults, self.rngs["faults"])

        # prefill side: each rank has its own transfer engine, NICs shared per gpus_per_nic
        self.prefill_ranks: list[PrefillRank] = []
        self.prefill_servers: list[Server] = []
        self.engines: list[TransferEngine] = []
        p_pred = self._predictor(pc)
        p_pool = pool(pc, gpu, model, engine, p_pred, sc.engine.version)
        p_pages = p_pool.pages
        chunk = self.chunked_prefill_per_rank = chunk_budget(pc, gpu, sc.engine.version)
        kvb = model.kv_bytes_per_token_sent(pc.tp, pc.dp_attention)
        nic_bps, ranks_per_nic = nic_layout(sc, gpu)  # (writes checked at load: memory.py)
        self.nics: list[NIC] = []
        for s in range(pc.servers):
            ranks = []
            for r in range(pc.dp):
                g = len(self.prefill_ranks)
                if g % ranks_per_nic == 0:
                    self.nics.append(NIC(env, f"nic{len(self.nics)}", nic_bps,
                                         tc.peak_utilisation, tc.min_utilisation,
                                         tc.saturation_mb * 1e6))
                rank = PrefillRank(env, s, r, pc, p_pred, kvb, p_pages, tc.bootstrap_timeout_s,
                                   sc.flush.semantics, self.log, self.stats, chunk)
                rank.page_aligned_chunk = has(sc.engine.version, "page_aligned_chunk")
                rank.chunk_capped_by_memory = has(sc.engine.version, "chunk_capped_by_memory")
                rank.drops_failed_waiting = has(sc.engine.version, "prefill_drops_failed_waiting")
                bl = blacklist.build(sc.blacklist, env, f"{rank.name}.r{r}", self.log)
                bl.on_change = self._blacklist_changed
                rank.engine = TransferEngine(env, rank.name, r, self.nics[-1], bl,
                                             tc.call_latency_ms / 1e3, tc.transfer_timeout_s,
                                             tc.queues_per_rank, self.log, self.stats,
                                             self.faults.paths, s, tc.qp_retry_s,
                                             self.faults.write_error
                                             if self.faults.injects_errors else None)
                bl.probe = rank.engine.probe  # probes cost what a small write on the path costs
                rank.max_running = max_running(pc, p_pool, model)
                ranks.append(rank)
                self.prefill_ranks.append(rank)
                self.engines.append(rank.engine)
            self.prefill_servers.append(Server(env, "prefill", s, ranks,
                                               balance.build(pc.balance), self.log))
        for d in self.decode_ranks:
            d.on_waiting_timeout = self._on_waiting_timeout
        # SGLang's PD paths as the scenario's release runs them (pdsim.config.pd_paths)
        pd = self.pd = sc.pd
        for rank in (*self.decode_ranks, *self.prefill_ranks):
            rank.set_paths(pd)
        restarts = [f for f in sc.faults if f.kind in RESTART_KINDS]
        if restarts:  # a prefill may change behind its address: the decodes' caches matter
            until = max(f.at_s + f.down_s for f in restarts) + pd["heartbeat_interval_s"] * (
                pd["heartbeat_max_failure"] + 1)
            self.peers = Peers(self, pd, until)
            for d in self.decode_ranks:
                d.peers = self.peers
        if any(f.kind == "partition" for f in sc.faults):
            for rank in self.prefill_ranks:
                rank.cut_state = lambda s=rank.server: self.faults.cut_state(s)

        if recorder is not None:
            for obj in (*self.prefill_ranks, *self.decode_ranks, *self.engines):
                obj.recorder = recorder
        self.steppers: list[lockstep.Stepper] = []
        for servers, role in ((self.prefill_servers, pc), (self.decode_servers, dc)):
            together = role.dp_attention if role.lockstep is None else role.lockstep
            for server in servers:
                if together and len(server.ranks) > 1:
                    self.steppers.append(lockstep.Stepper(env, server.ranks, True))
                else:
                    self.steppers += [lockstep.Stepper(env, [r], False) for r in server.ranks]
        # the decode ranks' steppers, each once (the time series catches them up per sample)
        self._decode_steppers = [s for s in self.steppers if s.ranks[0] in self.decode_ranks]

        self.router = MiniLB(env, self.prefill_servers, self.decode_servers, sc.router,
                             self.rngs["routing"], self.log, self.stats)
        self.router.notify_decode = DECODE if pd["prefill_abort_notifies_decode"] else 0
        self.router.notify_prefill = (PREFILL | BY_PEER if pd["decode_abort_notifies_prefill"]
                                     else 0)

    def _build_colocated(self, recorder: Recorder | None) -> None:
        """Colocated servers (each rank prefilling and decoding, pdsim.engine.colocated) behind
        sgl-model-gateway in regular mode. They are the fleet's decode servers and ranks (the
        ones that decode: faults that stop a decode server stop them); there are no prefill
        servers, transfer engines or NICs."""
        sc, env = self.scenario, self.env
        cc = sc.fleet.colocated
        rules = {k: has(sc.engine.version, k) for k in RULES}
        pred = self._predictor(cc)
        c_pool = pool(cc, self.gpu, self.model, self.engine, pred, sc.engine.version)
        c_engine = self._engine(cc)
        pages = c_pool.pages
        chunk = self.chunked_prefill_per_rank = chunk_budget(cc, self.gpu, sc.engine.version)
        self.prefill_ranks, self.prefill_servers, self.engines, self.nics = [], [], [], []
        self.decode_ranks, self.decode_servers = [], []
        together = cc.dp_attention if cc.lockstep is None else cc.lockstep
        on = c_engine.frontend_chunk_us > 0 or c_engine.frontend_copy_ns_per_token > 0
        for s in range(cc.servers):
            ranks = []
            # one TokenizerManager per server, whatever its DP ranks (pdsim.engine.frontend)
            front = FrontEnd(c_engine.frontend_chunk_us, c_engine.frontend_copy_ns_per_token,
                             cc.stream_interval) if on else None
            for r in range(cc.dp):
                rank = ColocatedRank(env, s, r, cc, pred, pages, sc.flush.semantics, self.log,
                                     self.stats, chunk, rules)
                rank.tokenize_s_per_token = c_engine.tokenize_us_per_token * 1e-6
                rank.request_s = c_engine.request_ms / 1e3
                rank.front = front
                rank.max_running = max_running(cc, c_pool, self.model)
                if together and cc.dp > 1:  # a lockstep group plans every step (no spans)
                    rank.spans = False
                rank.recorder = recorder
                ranks.append(rank)
                self.decode_ranks.append(rank)
            self.decode_servers.append(Server(env, "colocated", s, ranks,
                                              balance.build(cc.balance), self.log))
        self.sessions = {r.session: r for r in self.decode_ranks}
        self.faults = Faults(self, sc.faults, self.rngs["faults"])
        self.steppers = []
        for server in self.decode_servers:
            if together and len(server.ranks) > 1:
                self.steppers.append(lockstep.Stepper(env, server.ranks, True))
            else:
                self.steppers += [lockstep.Stepper(env, [r], False) for r in server.ranks]
        self._decode_steppers = self.steppers
        self.router = Gateway(env, self.decode_servers, sc.router, self.rngs["routing"],
                              self.log, self.stats)

    def _predictor(self, role: RoleConfig) -> predictor.Predictor:
        """One predictor per role: the ranks of a role share its (pure) step-time function,
        made with the calibration that holds for the role's layout (profiles.for_role)."""
        res = profiles.for_role(self.scenario, role)
        gather = role.dp if role.dp_attention else 1
        lay = predictor.layout_for(role, self.scenario.predictor, gather, res.gpu,
                                   self.scenario.engine.version)
        return predictor.build(self.scenario.predictor, res.gpu, res.model, role.tp, gather,
                               res.engine, lay)

    def _engine(self, role: RoleConfig) -> profiles.Engine:
        """The engine profile of a role (its calibration may set the per-request costs)."""
        return profiles.for_role(self.scenario, role).engine

    def frontend(self) -> _Frontend:
        """The fleet as its clients see it (pdsim.engine.client.Frontend)."""
        return _Frontend(self.new_request, self.router.generate, self.router.flush, self.log)

    def new_request(self, client: str, kind: str, input_len: int, output_len: int,
                    stream: bool, blocks: tuple[int, ...] | range | None, question: int,
                    attempt: int) -> Request:
        req = new_request(self.env, len(self.requests), client, kind, input_len, output_len,
                          stream, blocks, question, attempt)
        self.requests.append(req)
        return req

    def _operator_flush(self, at: float, timeout: float | None):
        yield self.env.timeout(at)
        yield self.router.flush(timeout, "operator")

    def _blacklist_changed(self) -> None:
        n = sum(len(e.blacklist) for e in self.engines)
        self.stats.blacklisted_pairs = n
        self.stats.blacklisted_pairs_max = max(self.stats.blacklisted_pairs_max, n)

    def _on_waiting_timeout(self, session: str, req: Request) -> None:
        """A waiting timeout invalidates the decode's connection to that prefill (0.5.19+,
        PR #36029: pdsim.config.pd_paths): its next request re-registers."""
        self.reregister(session, req.p_server)
        if self.peers is not None and req.p_server >= 0:
            self.peers.invalidate(self.sessions[session], req.p_server, "waiting timeout")

    def prefill_nics(self, prefill_server: int) -> list[NIC]:
        """The NICs a prefill server's transfer engines write through (faults degrade them)."""
        nics = {id(r.engine.nic): r.engine.nic for r in self.prefill_servers[prefill_server].ranks}
        return list(nics.values())

    def bare_flush(self, caller: str) -> simpy.Process:
        """``POST /flush_cache`` through the router, no timeout (the flush_race fault)."""
        return self.router.flush(None, caller)

    def new_session(self, rank: DecodeRank) -> None:
        """A restarted decode rank's Mooncake engine binds a new RPC port: a new session id."""
        rank.port += len(self.decode_ranks)
        rank.session = f"decode-{rank.server}.r{rank.index}:{rank.port}"
        self.sessions[rank.session] = rank

    def reregister(self, session: str, prefill_server: int) -> None:
        """The decode re-registers its buffers with a prefill server: its pairs there leave
        the blacklists (when the policy lets re-registration clear them)."""
        if not self.scenario.blacklist.reregister_on_invalidate:
            return
        for rank in self.prefill_servers[prefill_server].ranks:
            rank.engine.blacklist.clear(session, "decode re-registered")

    @property
    def ranks(self) -> list:
        return self.prefill_ranks + self.decode_ranks

    def gauges(self) -> tuple:
        """The :data:`GAUGES` now, in order (one pass over the ranks: a long run samples
        thousands of times, and a fleet is a few ranks, so per-gauge generators cost more than
        the sums)."""
        for stepper in self._decode_steppers:  # (Rank._catch_up of every decode rank)
            stepper.catch_up()  # KV grown and tokens made by steps of a span that ended by now
        d = self.decode_ranks
        if self.colocated:  # one pool per rank, both roles': prefill_inflight is the
            used = cap = queue = chunked = running = 0  # requests being chunked
            for r in d:
                used += r.alloc.used
                cap += r.alloc.capacity
                queue += r.queued()
                chunked += r.chunked is not None
                running += len(r.running)
            return (used / cap, used / cap, queue, chunked, 0, 0, 0, running, 0)
        p_used = p_cap = p_queue = p_inflight = 0
        for r in self.prefill_ranks:
            alloc = r.alloc
            p_used += alloc.used
            p_cap += alloc.capacity
            p_queue += r.queued()
            p_inflight += len(r.inflight)
        d_used = d_cap = prealloc = transfer = running = 0
        for r in d:
            alloc = r.alloc
            d_used += alloc.used
            d_cap += alloc.capacity
            prealloc += len(r.prealloc)
            transfer += len(r.transfer)
            running += len(r.running)
        return (p_used / p_cap, d_used / d_cap, p_queue, p_inflight,
                sum([e.queued() for e in self.engines]), prealloc, transfer, running,
                self.stats.blacklisted_pairs)

    def check_held(self) -> None:
        """Invariant, checked as a run ends: an unfinished request holding KV on a colocated
        rank is in one of that rank's queues (one in none would never finish and its pages
        would leak; ``ColocatedRank.abort`` checks the same of an aborted request)."""
        if self.scenario.fleet.mode != "colocated":
            return
        ranks = {(r.server, r.index): r for r in self.decode_ranks}
        for req in self.requests:
            if req.status == "unfinished" and req.d_pages is not None:
                rank = ranks[req.d_server, req.d_rank]
                if not rank.holds(req):
                    raise AssertionError(f"{rank.name}/r{rank.index}: request {req.rid} "
                                         f"holds KV but is in no queue at the end of the run")

    def release(self) -> None:
        """Let reference counting free the run's requests, once its outputs are made.

        Each request and its room point at each other: a cycle per request that only
        CPython's cyclic collector can free, and it pays for that by tracing everything the run
        left alive and reachable from those cycles, the fleet included. Measured 2026-11-30
        (this release plus the young collection after a run, process CPU time, min to median
        of alternating runs; commit a8c4b32): stream of 8,000 requests 35-48 -> 10-11 ms,
        healthy 10-11 -> 5.5-6 ms, drop_timeout 14-16 -> 6-7.5 ms. So once the records
        are made (nothing reads a request after that) this cuts the requests' side of those
        cycles and drops what holds every request to the end: the request list, the log's
        rows and the pending deadlines (the router's request timeout outlasts most runs, so
        its FIFO holds every request ever routed), and the step-time predictors' memos (tens of
        thousands of tuples on the conversation trace). The run's requests, rooms, pages and
        callbacks then go through reference counting; what the components still hold
        (requests in flight at the end) goes with the fleet at the next collection. The fleet
        cannot run on afterwards.
        """
        for r in self.requests:
            r.room = None
        self.requests = []
        self.log.rows = []
        self.router.forget_deadlines()
        for r in self.ranks:
            r.forget_deadlines()
            forget = getattr(r.predictor, "forget", None)  # (memos: see OperatorPredictor)
            if forget is not None:
                forget()


# the time series' gauges, in the order of Fleet.gauges
GAUGES = ("prefill_kv_used", "decode_kv_used", "prefill_queue", "prefill_inflight",
          "transfer_queue", "decode_prealloc", "decode_transfer", "decode_running",
          "blacklisted_pairs")


@dataclass(frozen=True, slots=True)
class _Frontend:
    """pdsim.engine.client.Frontend: the four calls a client makes, bound to this fleet."""

    new_request: Callable[..., Request]
    generate: Callable[[Request, Callable[[Request], None]], None]
    flush: Callable[[float | None, str], object]
    log: Callable[..., None]

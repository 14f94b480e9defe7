"""What a decode knows of the prefill processes it talks to, and the heartbeat that checks it.

SGLang's decode keeps, per prefill bootstrap address, the prefill ranks' ZMQ ports it fetched
from that address's ``/route`` and registered its KV buffers with (``connection_pool``,
``prefill_info_table``); it sends each room's metadata (destination pages) to those ports
(docs/pd_paths.md, sections 2, 3 and 6). A prefill process replaced behind the same address
(a restarted pod behind a k8s Service) listens on new ports, so until the decode drops its
cached entry every metadata send goes to the old process and is lost:

- the new prefill never hears of the room: its bootstrap timeout (300 s) fails it;
- the decode's send fails after ``zmq_send_timeout_s`` (1 s, 0.5.17+, PR #31144) and the room
  fails at once; without it the send is queued and lost, and the decode waits out its waiting
  timeout (300 s from the send);
- the cached entry is dropped, so the next request re-fetches and re-registers, only by: a
  waiting timeout or a failed send from 0.5.19 (PR #36029,
  ``waiting_timeout_invalidates_peer_cache``), or the heartbeat declaring the prefill lost.

The heartbeat (``_start_heartbeat_checker_thread``): every ``heartbeat_interval_s`` (5 s) the
decode GETs ``/health`` on each prefill address; ``heartbeat_max_failure`` (2) misses in a row
declare it lost (``_handle_node_failure``: every room of that prefill not yet Success fails,
"Lost connection with prefill instance", and the cached entry is dropped). A replacement that
answers within that window is never noticed, unless the probe compares the process's instance
id (PR #34289, ``heartbeat_instance_id``): then the first probe after the swap drops the entry.
The probe's own (2, 3) s connect and read timeouts are not modelled (a probe of an address that
answers nothing is a miss at its tick).

Kept per decode rank (each DP rank's scheduler has its own ``connection_pool``), made only for
a scenario with a ``prefill_restart`` fault (otherwise no prefill ever changes behind its
address, and a decode rank's cache is always right).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from pdsim.engine.clock import call_later
from pdsim.engine.request import DECODE, Request

if TYPE_CHECKING:
    from pdsim.engine.decode import DecodeRank


class Peers:
    """The decode ranks' cached prefill connections and the heartbeat over them."""

    def __init__(self, fleet: Any, pd: dict, until: float) -> None:
        """``fleet``: pdsim.engine.fleet.Fleet (its ranks, servers and log)."""
        self.fleet = fleet
        self.env = fleet.env
        n = len(fleet.prefill_servers)
        self.gen = [0] * n  # the process generation behind each prefill address
        self.down = [False] * n  # the address answers nothing (its process is dead)
        # (decode server, decode rank, prefill server) -> the generation it registered with
        self.known: dict[tuple[int, int, int], int] = {}
        self.seen = [0] * n  # the generation the heartbeat last saw answer (instance id)
        self.misses = [0] * n
        self.send_timeout = pd["zmq_send_timeout_s"]
        self.invalidate_on_failure = pd["waiting_timeout_invalidates_peer_cache"]
        self.instance_id = pd["heartbeat_instance_id"]
        self.interval = pd["heartbeat_interval_s"]
        self.max_misses = pd["heartbeat_max_failure"]
        self.env.process(self._heartbeat(until))

    # --- the prefill side's process (the prefill_restart fault) ------------------------------

    def crashed(self, p: int) -> None:
        self.gen[p] += 1  # whatever comes back behind the address is another process
        self.down[p] = True

    def restarted(self, p: int) -> None:
        self.down[p] = False

    # --- the decode side ---------------------------------------------------------------------

    def send_metadata(self, drank: DecodeRank, req: Request) -> None:
        """The decode sends ``req``'s metadata to its prefill (``send_metadata``, at
        pre-allocation): through its cached connection, registering first if it has none. A
        stale connection loses the send (``room.stale``)."""
        p = req.p_server
        key = (drank.server, drank.index, p)
        registered = self.known.get(key)
        if registered is None:
            if self.down[p]:  # /route unreachable: the registration fails, the room with it
                req.room.stale = f"prefill-{p} unreachable at registration"
                self._send_failure(drank, req, p)
                return
            self.known[key] = self.gen[p]
            return
        if registered != self.gen[p] or self.down[p]:
            req.room.stale = f"metadata sent to prefill-{p}'s old process (stale connection)"
            self._send_failure(drank, req, p)

    def _send_failure(self, drank: DecodeRank, req: Request, p: int) -> None:
        """A send that fails after the ZMQ send timeout (0.5.17+) fails the room then, and
        from 0.5.19 drops the stale entry; without the timeout nothing is noticed."""
        if self.send_timeout is None:
            return

        def failed() -> None:
            room = req.room
            if drank.transfer.get(req.rid) is req and not room.d_resolved:
                room.fail("metadata_send_failed", DECODE)  # (an ABORT would be lost too)
            if self.invalidate_on_failure:
                self.invalidate(drank, p, "metadata send failed")

        call_later(self.env, self.send_timeout, failed)

    def invalidate(self, drank: DecodeRank, p: int, why: str) -> None:
        """Drop ``drank``'s cached connection to prefill ``p``: its next request there
        re-fetches /route and re-registers (which also clears its session from that prefill's
        blacklists: ``Fleet.reregister``)."""
        if self.known.pop((drank.server, drank.index, p), None) is not None:
            self.fleet.log("peer_invalidated", drank.name, drank.index, peer=f"prefill-{p}",
                           detail=why)

    # --- the heartbeat -----------------------------------------------------------------------

    def _heartbeat(self, until: float) -> Generator:
        """Probe every prefill address each interval, until ``until`` (after the last restart
        and the probes that could notice it: nothing changes afterwards)."""
        env = self.env
        while env.now + self.interval <= until:
            yield env.timeout(self.interval)
            for p in range(len(self.gen)):
                if self.down[p]:
                    self.misses[p] += 1
                    if self.misses[p] >= self.max_misses:
                        self.misses[p] = 0
                        self._lost(p, "Lost connection with prefill instance")
                    continue
                self.misses[p] = 0
                if self.instance_id and self.seen[p] != self.gen[p]:
                    self._lost(p, "prefill instance id changed behind its address")
                self.seen[p] = self.gen[p]

    def _lost(self, p: int, why: str) -> None:
        """``_handle_node_failure``: every decode rank drops its entry for ``p`` and fails
        that prefill's rooms not yet Success (decode side: the prefill is not told)."""
        self.fleet.log("heartbeat_lost", "decode", detail=f"{why}: prefill-{p}")
        for drank in self.fleet.decode_ranks:
            self.invalidate(drank, p, why)
            for req in [*drank.transfer.values(), *drank.prealloc]:
                room = req.room
                if req.p_server == p and not room.d_resolved:
                    room.fail("prefill_heartbeat_lost", DECODE)

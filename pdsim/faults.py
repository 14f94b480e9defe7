"""Faults other than flushes: unreachable decodes, partitions (with heartbeats), random errors.

Reachability is a question the transfer engine and the blacklist probe ask per
(prefill server, decode session); this module answers it and runs the decode-side heartbeats
that turn a partition into "Lost connection with prefill instance" and, once healed, into a
re-registration.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING

import numpy as np

from pdsim.scenario import DecodeDown, Partition

if TYPE_CHECKING:
    from pdsim.fleet import Fleet
    from pdsim.server import Server


class Faults:
    def __init__(self, fleet: Fleet, specs: list, rng: np.random.Generator) -> None:
        self.fleet = fleet
        self.env = fleet.env
        self.rng = rng
        self.cut: set[int] = set()  # prefill servers partitioned from the decodes
        self.errors = [f for f in specs if f.kind == "transfer_errors"]
        for f in specs:
            if f.kind == "decode_unreachable":
                self.env.process(self._decode_down(f))
            elif f.kind == "partition":
                self.env.process(self._partition(f))
                for d in fleet.decode_servers:
                    self.env.process(self._heartbeat(d, f))

    def reachable(self, prefill_server: int, session: str) -> bool:
        return (prefill_server not in self.cut
                and self.fleet.sessions[session].alive)

    def write_error(self) -> bool:
        """Whether this write hits an injected ``ret != 0`` (draws only inside a window)."""
        now = self.env.now
        for f in self.errors:
            if f.from_s <= now < f.to_s:
                return bool(self.rng.random() < f.probability)
        return False

    def _decode_down(self, f: DecodeDown) -> Generator:
        rank = self.fleet.decode_ranks[f.decode_rank]
        yield self.env.timeout(f.at_s)
        rank.alive = False
        self.fleet.log("fault_start", rank.name, rank.index, peer=rank.session,
                       detail="decode unreachable")
        yield self.env.timeout(f.duration_s)
        rank.alive = True
        self.fleet.log("fault_end", rank.name, rank.index, peer=rank.session,
                       detail="decode reachable")

    def _partition(self, f: Partition) -> Generator:
        yield self.env.timeout(f.at_s)
        self.cut.add(f.prefill_server)
        self.fleet.log("fault_start", f"prefill-{f.prefill_server}", detail="partition")
        yield self.env.timeout(f.duration_s)
        self.cut.discard(f.prefill_server)
        self.fleet.log("fault_end", f"prefill-{f.prefill_server}", detail="partition healed")

    def _heartbeat(self, decode_server: Server, f: Partition) -> Generator:
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
                    self._lost_prefill(decode_server, p)
            else:
                misses = 0
                if invalidated:
                    invalidated = False
                    for rank in decode_server.ranks:
                        self.fleet.reregister(rank.session, p)

    def _lost_prefill(self, decode_server: Server, p: int) -> None:
        self.fleet.log("heartbeat_lost", decode_server.name, peer=f"prefill-{p}",
                       detail="Lost connection with prefill instance")
        for rank in decode_server.ranks:
            for req in list(rank.transfer.values()) + list(rank.prealloc):
                if req.p_server == p and not req.room.resolved:
                    req.room.fail("prefill_heartbeat_lost")

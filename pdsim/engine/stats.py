"""Run-wide counters the ranks and engines bump on the hot path."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Stats:
    tokens_out: int = 0
    prefill_tokens: int = 0
    prefill_steps: int = 0
    decode_steps: int = 0
    retractions: int = 0
    bytes_transferred: float = 0.0
    flushes_executed: int = 0
    transfer_failures: dict[str, int] = field(default_factory=dict)
    # requests that ended failed or timed out, by reason, as they ended (pdsim.request.end):
    # the time series' failed column
    request_failures: dict[str, int] = field(default_factory=dict)
    blacklisted_pairs: int = 0
    blacklisted_pairs_max: int = 0
    dead_peer_writes: int = 0  # writes that met a gone or silent path
    dead_peer_write_s: float = 0.0  # transfer-worker time those writes held
    probes: int = 0
    probe_s: float = 0.0
    dead_rooms: int = 0  # decode slots that began holding a room that cannot complete

    def count_request_failure(self, reason: str) -> None:
        self.request_failures[reason] = self.request_failures.get(reason, 0) + 1

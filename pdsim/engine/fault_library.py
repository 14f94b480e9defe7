"""The fault library: named presets of the registered fault kinds (pdsim.engine.faults), with
every chosen value documented, that ``pdsim whatif`` runs (``pdsim faults`` lists them).

A value written as a declared unknown ({choice: [...], nominal: x, why: ...}, as in scenario
files: pdsim/config/unknowns.py) is a fault-model choice the sources leave open. The preset
(``faults: [{preset: name}]``) takes its nominal value; ``pdsim whatif --across-unknowns`` runs
the other values too and prints the verdict under each (:data:`DECLARED`).
"""

from __future__ import annotations

from typing import Any

from pdsim.config import unknowns
from pdsim.config.registry import FAULTS

LIBRARY: dict[str, tuple[dict[str, Any], str]] = {
    "flush_race": (
        {"kind": "flush_race", "at_s": 60.0},
        "The incident's trigger: a bare flush under load at 60 s (chosen: the load is steady "
        "from ~5 s). Every pair with a write in flight fails once; the pair is healthy after."),
    "decode_crash": (
        {"kind": "decode_crash", "decode_server": 0, "at_s": 60.0, "restart_after_s": 60.0,
         "restart_session": {
             "choice": ["new", "reused"], "nominal": "new",
             "why": "no source says which port a restarted decode's Mooncake engine binds. "
                    "new: another port, a new session id. reused (a fixed port): SGLang clears "
                    "the blacklist entry when the decode re-registers, but Mooncake's cached "
                    "segment descriptor of the dead process makes its writes fail (code "
                    "reading, MC metacache on by default; not observed)"}},
        "Decode server 0 dies at 60 s and restarts 60 s later (chosen; a real restart reloads "
        "weights and captures CUDA graphs: 1-10 min), under new session ids at nominal "
        "(restart_session). Blacklisting the old sessions is right and costs nothing "
        "afterwards; with the port reused, the restarted decode cannot be written to."),
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
         "bandwidth_fraction": {
             "loguniform": [1e-5, 0.25], "nominal": 1e-5,
             "why": "no source: chosen. 1e-5 of line rate makes a KV chunk of the base "
                    "workload outlast the 30 s transfer timeout (a PFC pause storm); 0.25 is a "
                    "400 Gb/s link renegotiated to 100 Gb/s: writes slow down but do not fail"}},
        "Prefill server 0's NICs run at a fraction of line rate for 60 s (nominal 1e-5, "
        "chosen so that a KV chunk of the base workload outlasts the 30 s transfer timeout)."),
    "partition": (
        {"kind": "partition", "prefill_server": 0, "at_s": 60.0, "duration_s": 40.0},
        "Prefill server 0 cut off for 40 s (chosen: longer than the 2 x 5 s heartbeat loss "
        "and the 30 s transfer timeout); decodes re-register when it heals."),
    "transient_errors": (
        {"kind": "transfer_errors", "from_s": 0.0, "probability": {
            "loguniform": [0.001, 0.01], "nominal": 0.002,
            "why": "no source: chosen (no published rate of transient Mooncake write errors); "
                   "0.1-1% of writes taken as plausible"}},
        "Steady rare ret != 0: a share of writes for the whole run (nominal 0.2%, chosen; "
        "plausible 0.1-1%). Each error is transient: the pair is healthy right after."),
}
DECLARED: dict[str, dict[str, Any]] = {}
"""Library entries with declared unknowns: name -> the spec with its declarations."""
for _name, (_spec, _doc) in LIBRARY.items():
    _nominal, _found = unknowns.resolve(_spec)
    FAULTS.add_preset(_name, _nominal, _doc)
    if _found:
        DECLARED[_name] = _spec



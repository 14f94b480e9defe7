"""The switches of ``disaggregation:``: SGLang's PD timeout, abort and heartbeat paths, each
named after the PR (or environment variable) it stands for, each defaulting to its value in the
release of ``engine.version`` (:data:`pdsim.config.registry.PD_PATHS`).

What each does in the simulator is in :mod:`pdsim.engine.request` (the two sides of a room and
the messages between them) and docs/pd_paths.md (every fact with its source: the SGLang wheel
and file, the PR thread). In short, prefill and decode each keep their own state of a room and
learn of each other only through messages; these switches say which messages a release sends.

    engine: {version: "0.5.16"}                      # every switch at 0.5.16's value
    disaggregation: {prefill_abort_notifies_decode: true}   # ... but with PR #28651's change

Defaults by release (docs/pd_paths.md, "Version map"; "—" = absent, so off):

=====================================  ==========================================
switch                                 on in
=====================================  ==========================================
prefill_abort_notifies_decode          no release (PR #28651 closed; #36612 is transfer
                                       failures only)
decode_abort_notifies_prefill          0.5.13+ (PR #27372)
metadata_gate                          0.5.13+ (``utils.py`` ``_apply_metadata_gate``)
waiting_timeout_in_transferring        no release (PR #31800 open)
waiting_timeout_invalidates_peer_cache 0.5.19+ (PR #36029)
deferred_decode_kv_release             0.5.21+ (PR #35049; env off by default in 0.5.19-0.5.20)
ack_after_drain                        0.5.21+ (PR #40645)
heartbeat_instance_id                  no release (PR #34289 open)
zmq_send_timeout_s                     1 s from 0.5.17 (PR #31144); none before
=====================================  ==========================================
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from pdsim.config.engine_version import at_least
from pdsim.config.registry import PD_PATHS
from pdsim.config.units import _NUM, MAX_COUNT, MAX_TIME_S, PosInt, Seconds


def _since(floor: str):
    return lambda version: at_least(version, floor)


def _never(_version: str) -> bool:
    return False


def _const(value: object):
    return lambda _version: value


HeartbeatInterval = Annotated[float, Field(ge=2.0, le=MAX_TIME_S, allow_inf_nan=False), _NUM]

PD_PATHS.register(
    "prefill_abort_notifies_decode", bool, _never,
    "A prefill-side end of a request other than a failed transfer (its bootstrap timeout, an "
    "abort of the prefill leg, the prefill waiting timeout) is sent to the decode peer, which "
    "frees its slot at once. Off: the decode learns nothing and holds the request's slot and "
    "KV pages until its own waiting timeout, 300 s after it sent its metadata (and without a "
    "clock while still waiting to pre-allocate).",
    "PR #28651 (MooncakeKVSender.abort notifies decode; closed) and the #36160 follow-up; "
    "PR #36612 shares only transfer-failure notification",
    "off in every release 0.5.2-0.5.23")
PD_PATHS.register(
    "decode_abort_notifies_prefill", bool, _since("0.5.13"),
    "A decode abort or waiting timeout sends ABORT to the room's prefill ranks, which fail "
    "the room unless it already succeeded (and answer ABORT_ACK). Off: the prefill carries on: "
    "it runs the prefill and writes the KV into pages the decode has freed.",
    "PR #27372, CommonKVReceiver._send_abort_notification",
    "on from 0.5.13")
PD_PATHS.register(
    "metadata_gate", bool, _since("0.5.13"),
    "The decode keeps a room whose KV arrived in Transferring until its metadata (aux) row has "
    "landed; a lost aux write then holds the request's slot (see "
    "waiting_timeout_in_transferring). Off: a room is done when the prefill says Success.",
    "utils.py _apply_metadata_gate (bootstrap_room sentinel, PR #17430)",
    "on from 0.5.13")
PD_PATHS.register(
    "waiting_timeout_in_transferring", bool, _never,
    "The decode waiting timeout is also checked while a room is held in Transferring, so a "
    "transfer whose done never arrives fails 300 s after its metadata instead of holding its "
    "slot for ever.",
    "PR #31800 (open: time out KV receivers stuck in Transferring)",
    "off in every release 0.5.2-0.5.23")
PD_PATHS.register(
    "waiting_timeout_invalidates_peer_cache", bool, _since("0.5.19"),
    "A decode waiting timeout (and a failed metadata send) drops the decode's cached "
    "connection to that prefill: its next request re-fetches /route and re-registers, which "
    "takes its session off that prefill's blacklists and reaches a restarted prefill's new "
    "ports. Off: only a heartbeat loss does.",
    "PR #36029 (refresh stale prefill bootstrap metadata), invalidate_cached_bootstrap_infos",
    "on from 0.5.19")
PD_PATHS.register(
    "deferred_decode_kv_release", bool, _since("0.5.21"),
    "After a decode-initiated abort or waiting timeout the decode holds the request's KV pages "
    "and slot until the prefill answers ABORT_ACK, or deferred_release_timeout_s passes.",
    "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE (PR #35049)",
    "on from 0.5.21 (the variable exists from 0.5.19, off)")
PD_PATHS.register(
    "deferred_release_timeout_s", Seconds, _const(30.0),
    "How long a deferred release waits for ABORT_ACK before freeing anyway.",
    "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT", "30 s")
PD_PATHS.register(
    "ack_after_drain", bool, _since("0.5.21"),
    "A prefill that gets ABORT while writing the room's KV answers ABORT_ACK once the write "
    "ends. Off: it drops the ACK, and the decode waits out deferred_release_timeout_s.",
    "PR #40645 (preserve abort ACKs until in-flight KV transfers drain)", "on from 0.5.21")
PD_PATHS.register(
    "req_waiting_timeout_s", Seconds, _const(None),
    "A prefill request that waits longer than this in the waiting queue (bootstrapped, not yet "
    "prefilled) is aborted with 503 'Request waiting timeout reached.'; the abort does not "
    "reach the decode unless prefill_abort_notifies_decode. Needs 0.5.20 or later: before, PD "
    "schedulers never check it.",
    "SGLANG_REQ_WAITING_TIMEOUT (-1: off), checked on the PD input path from 0.5.20",
    "off (-1) in every release")
PD_PATHS.register(
    "heartbeat_interval_s", HeartbeatInterval, _const(5.0),
    "Seconds between a decode's /health probes of each prefill it knows (at least 2: SGLang "
    "clamps the variable to max(v, 2.0)); used by the prefill_restart fault.",
    "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "5 s")
PD_PATHS.register(
    "heartbeat_max_failure", Annotated[PosInt, Field(le=MAX_COUNT)], _const(2),
    "Missed probes in a row after which the decode declares the prefill lost: it fails that "
    "prefill's rooms ('Lost connection with prefill instance') and drops its cached "
    "connection.", "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE", "2")
PD_PATHS.register(
    "heartbeat_instance_id", bool, _never,
    "The heartbeat compares the prefill's per-process instance id, so a prefill replaced "
    "behind the same address is noticed at the next probe and the stale connection dropped.",
    "PR #34289 (X-SGLang-Disaggregation-Instance-ID; open, NIXL)",
    "off in every release 0.5.2-0.5.23")
PD_PATHS.register(
    "zmq_send_timeout_s", Seconds, lambda v: 1.0 if at_least(v, "0.5.17") else None,
    "A decode's metadata send to a prefill port nobody reads fails after this (the room fails "
    "at once); null: the send is queued and lost, and the decode waits out its waiting "
    "timeout.", "SGLANG_DISAGGREGATION_ZMQ_SEND_TIMEOUT (PR #31144)",
    "1 s from 0.5.17; none before")

ARMED_REASONS = frozenset({"waiting_timeout", "aborted", "decode_aborted",
                           "waiting_timeout_transferring"})
"""Decode-side failures that send ABORT (and so may wait for ABORT_ACK before freeing)."""

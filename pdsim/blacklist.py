"""Peer blacklist of a prefill rank's transfer engine, and the ways off it.

A policy object answers three questions: does this failure blacklist the session, is the session
blocked now, and what un-blacklists it. ``Blacklist`` holds the state and runs recovery probes.
Policies here: one-strike permanent (0.5.14-0.5.22 default), fixed-interval probe, 0.5.23
(probe with backoff, idle drop). New policies (TTL, N-strikes, breaker) subclass ``Blacklist``.
"""

from __future__ import annotations

from collections.abc import Callable

import simpy

from pdsim.log import EventLog
from pdsim.scenario import BlacklistConfig


class Blacklist:
    """``failed_sessions`` of one prefill rank (SGLang ``MooncakeKVManager``)."""

    probe = False
    backoff = False
    idle_drop_s: float | None = None

    def __init__(self, env: simpy.Environment, owner: str, strikes: int,
                 probe_interval_s: float, probe_max_interval_s: float,
                 is_alive: Callable[[str], bool], log: EventLog) -> None:
        self.env = env
        self.owner = owner
        self.strikes = strikes
        self.interval = probe_interval_s
        self.max_interval = probe_max_interval_s
        self.is_alive = is_alive
        self.log = log
        self.failures: dict[str, int] = {}
        self.entries: dict[str, float] = {}  # session -> time blacklisted
        self.last_traffic: dict[str, float] = {}
        self.on_change: Callable[[], None] = lambda: None

    def __len__(self) -> int:
        return len(self.entries)

    def blocked(self, session: str) -> bool:
        if session not in self.entries:
            return False
        if self.idle_drop_s is not None:
            last = self.last_traffic.get(session, self.entries[session])
            if self.env.now - last >= self.idle_drop_s:
                self.clear(session, "idle_drop")
                return False
        return True

    def touch(self, session: str) -> None:
        self.last_traffic[session] = self.env.now

    def record_failure(self, session: str) -> bool:
        """Count a ``ret != 0``; True when this failure blacklists the session."""
        n = self.failures.get(session, 0) + 1
        self.failures[session] = n
        if n >= self.strikes and session not in self.entries:
            self.entries[session] = self.env.now
            self.log("blacklist_add", self.owner, peer=session, value=len(self.entries))
            self.on_change()
            if self.probe:
                self.env.process(self._probe(session))
            return True
        return False

    def clear(self, session: str, why: str) -> None:
        if self.entries.pop(session, None) is not None:
            self.failures.pop(session, None)
            self.log("blacklist_remove", self.owner, peer=session, value=len(self.entries),
                     detail=why)
            self.on_change()

    def _probe(self, session: str):
        interval = self.interval
        added = self.entries.get(session)
        if added is None:  # dropped (0.5.23 idle drop) before this process first ran
            return
        while self.entries.get(session) == added:
            yield self.env.timeout(interval)
            if self.entries.get(session) != added:
                return
            ok = self.is_alive(session)
            self.log("probe", self.owner, peer=session, value=float(ok),
                     detail="ok" if ok else "failed")
            if ok:
                self.clear(session, "probe")
                return
            if self.backoff:
                interval = min(2 * interval, self.max_interval)


class PermanentBlacklist(Blacklist):
    """0.5.14-0.5.22 default: recovery probe off; only decode re-registration clears."""


class ProbeBlacklist(Blacklist):
    """Recovery probe on at a fixed interval (``--...-recovery-probe``, 30 s)."""

    probe = True


class V0523Blacklist(Blacklist):
    """0.5.23: probe on, interval doubling to 300 s after failed probes, idle entries dropped."""

    probe = True
    backoff = True

    def __init__(self, *args, idle_drop_s: float = 600.0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.idle_drop_s = idle_drop_s


POLICIES: dict[str, type[Blacklist]] = {
    "none": PermanentBlacklist,
    "probe": ProbeBlacklist,
    "v0_5_23": V0523Blacklist,
}


def build(cfg: BlacklistConfig, env: simpy.Environment, owner: str,
          is_alive: Callable[[str], bool], log: EventLog) -> Blacklist:
    cls = POLICIES[cfg.recovery]
    kwargs = {"idle_drop_s": cfg.idle_drop_s} if cls is V0523Blacklist else {}
    return cls(env, owner, cfg.strikes, cfg.probe_interval_s, cfg.probe_max_interval_s,
               is_alive, log, **kwargs)

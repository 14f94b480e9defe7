"""Peer blacklist policies of a prefill rank's transfer engine (``failed_sessions``).

A policy is a small state machine per decode session, asked three things by the transfer
engine: may this chunk be written (``admit``), a write failed with ``ret != 0``
(``record_failure``, True when that blacklists the session), a write succeeded
(``record_success``). Decode re-registration clears an entry (``clear``). A chunk that is not
admitted fails at once: "Decode instance could be dead" (reason ``blacklisted_session``).

Registered policies (``blacklist.policy``), each with its own parameters:

- ``permanent``: one strike (``strikes``), no way off but re-registration. 0.5.14-0.5.22
  default (docs/model/blacklist.md).
- ``probe``: plus a recovery probe every ``probe_interval_s`` (SGLang PR #25287, 30 s).
- ``v0_5_23``: probe whose interval doubles after each failed probe up to
  ``probe_max_interval_s``; an entry no request targeted for ``idle_drop_s`` is dropped.
- ``ttl``: an entry expires ``ttl_s`` after it was added (SGLang PR #35823, open).
- ``strikes_window``: ``strikes`` failures within ``window_s`` blacklist; a success resets the
  count; entries last ``ttl_s`` (none: until re-registration).
- ``circuit_breaker``: closed -> open after ``failures`` within ``window_s``; after
  ``cooldown_s`` half-open lets ``trials`` real transfers through; a success closes it, a
  failure re-opens it with the cooldown multiplied by ``backoff`` (up to ``max_cooldown_s``).
- ``never``: no blacklist; every request tries the write.

Probes are real: the engine supplies ``probe(session)``, a SimPy generator that costs what a
small write on that path costs (a probe to a dead peer waits out the engine's failure time and
fails). Trials are the requests' own writes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field

from pdsim.config.registry import BLACKLIST_POLICIES
from pdsim.config.units import (
    _NUM,
    MAX_COUNT,
    MAX_PROBES,
    Context,
    Interval,
    Invalid,
    PosInt,
    Seconds,
    Strict,
    _ticks,
)

if TYPE_CHECKING:  # annotations only: validating a scenario needs neither (pdsim.engine.log:
                   # pandas)
    import simpy

    from pdsim.engine.log import EventLog

Prober = Callable[[str], Generator[Any, Any, bool]]


class Params(Strict):
    """Keys every blacklist policy takes (a scenario section: ``check(ctx)`` runs at load)."""

    reregister_on_invalidate: bool = Field(
        True, description="Decode re-registration (after a waiting timeout or a heartbeat loss) "
        "clears its sessions from the prefill's blacklist")


class Policy:
    """Base policy: holds the entries (session -> time added) and logs changes."""

    Params = Params

    def __init__(self, params: Params, env: simpy.Environment, owner: str, log: EventLog,
                 probe: Prober | None = None) -> None:
        self.p = params
        self.env = env
        self.owner = owner
        self.log = log
        self.probe = probe
        self.entries: dict[str, float] = {}
        self.on_change: Callable[[], None] = lambda: None

    def __len__(self) -> int:
        return len(self.entries)

    # --- what the transfer engine calls ------------------------------------------------------

    def admit(self, session: str) -> bool:
        """May a chunk to ``session`` be written now? (False: fail it fast.)"""
        return session not in self.entries

    def record_failure(self, session: str) -> bool:
        """A write to ``session`` returned ``ret != 0``; True when this blacklists it."""
        return False

    def record_success(self, session: str) -> None:
        """A write to ``session`` succeeded."""

    def clear(self, session: str, why: str) -> None:
        """Take ``session`` off the list (re-registration, probe, expiry)."""
        if self.entries.pop(session, None) is not None:
            self._forget(session)
            self.log("blacklist_remove", self.owner, peer=session, value=len(self.entries),
                     detail=why)
            self.on_change()

    # --- helpers for subclasses --------------------------------------------------------------

    def _forget(self, session: str) -> None:
        """Drop per-session counters when the session leaves the list."""

    def _add(self, session: str, detail: str = "") -> bool:
        if session in self.entries:
            return False
        now = self.entries[session] = self.env.now
        self.log("blacklist_add", self.owner, peer=session, value=len(self.entries),
                 detail=detail)
        self.on_change()
        self._added(session, now)
        return True

    def _added(self, session: str, when: float) -> None:
        """Hook: an entry was added at ``when``."""

    def _expire_at(self, session: str, when: float, after: float, why: str) -> None:
        """Clear the entry added at ``when`` after ``after`` s, if it is still that entry."""
        def fire(_e: simpy.Event) -> None:
            if self.entries.get(session) == when:
                self.clear(session, why)

        self.env.timeout(after).callbacks.append(fire)

    def _probe_loop(self, session: str, added: float, interval: float,
                    backoff: bool, max_interval: float) -> Generator:
        """Probe a blacklisted session until a probe succeeds or the entry goes away.

        ``added`` is passed in (not read from ``entries``): the entry may already be gone when
        this process first runs (an idle drop in the same instant), which must not crash.
        """
        while self.entries.get(session) == added:
            yield self.env.timeout(interval)
            if self.entries.get(session) != added:
                return
            t0 = self.env.now
            ok = bool((yield from self.probe(session)))
            self.log("probe", self.owner, peer=session, value=float(ok),
                     detail=f"{'ok' if ok else 'failed'} after {self.env.now - t0:.3g} s")
            if self.entries.get(session) != added:
                return
            if ok:
                self.clear(session, "probe")
                return
            if backoff:
                interval = min(2 * interval, max_interval)


class StrikesParams(Params):
    strikes: PosInt = Field(1, le=MAX_COUNT, description="ret != 0 failures of a session "
                            "before it is blacklisted (SGLang: 1); counted over its life")


@BLACKLIST_POLICIES.register("permanent")
class Permanent(Policy):
    """One strike, permanent: only decode re-registration clears (0.5.14-0.5.22 default)."""

    Params = StrikesParams

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.failures: dict[str, int] = {}

    def record_failure(self, session: str) -> bool:
        n = self.failures.get(session, 0) + 1
        self.failures[session] = n
        return n >= self.p.strikes and self._add(session)

    def _forget(self, session: str) -> None:
        self.failures.pop(session, None)


class ProbeParams(StrikesParams):
    probe_interval_s: Interval = Field(
        30.0, description="Seconds between recovery probes of a blacklisted session "
        "(SGLANG_FAILED_SESSION_PROBE_INTERVAL_S, PR #25287)")

    def check(self, ctx: Context) -> None:
        _ticks(ctx, "probe_interval_s", self.probe_interval_s, "probes per blacklisted pair")
        f = ctx.scenario.fleet
        pairs = f.prefill.servers * f.prefill.dp * f.decode.servers * f.decode.dp
        probes = pairs * ctx.scenario.horizon_s / self.probe_interval_s
        if probes > MAX_PROBES:
            raise Invalid("probe_interval_s", f"{pairs:,} (prefill rank, decode session) "
                          f"pairs x horizon_s / probe_interval_s = {probes:,.0f} probes if "
                          f"all were blacklisted; at most {MAX_PROBES:,}", self.probe_interval_s)


@BLACKLIST_POLICIES.register("probe")
class Probe(Permanent):
    """Recovery probe at a fixed interval; a successful probe un-blacklists (SGLang PR #25287)."""

    Params = ProbeParams

    def _added(self, session: str, when: float) -> None:
        p = self.p
        self.env.process(self._probe_loop(session, when, p.probe_interval_s, False,
                                          p.probe_interval_s))


class V0523Params(ProbeParams):
    probe_max_interval_s: Interval = Field(300.0, description="Cap of the doubling interval")
    idle_drop_s: Seconds = Field(600.0, description="An entry no request targeted for this "
                                 "long is dropped")

    def check(self, ctx: Context) -> None:
        if self.probe_max_interval_s < self.probe_interval_s:
            raise Invalid("probe_max_interval_s", f"must be >= probe_interval_s "
                          f"({self.probe_interval_s:g})", self.probe_max_interval_s)
        super().check(ctx)


@BLACKLIST_POLICIES.register("v0_5_23")
class V0523(Permanent):
    """0.5.23: probe on, interval doubling to 300 s after failed probes, idle entries dropped."""

    Params = V0523Params

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.last_traffic: dict[str, float] = {}

    def admit(self, session: str) -> bool:
        now = self.env.now
        added = self.entries.get(session)
        if added is not None:
            last = self.last_traffic.get(session, added)
            if now - last >= self.p.idle_drop_s:
                self.clear(session, "idle_drop")
                added = None
        self.last_traffic[session] = now
        return added is None

    def _added(self, session: str, when: float) -> None:
        p = self.p
        self.env.process(self._probe_loop(session, when, p.probe_interval_s, True,
                                          p.probe_max_interval_s))


class TTLParams(StrikesParams):
    ttl_s: Seconds = Field(30.0, description="Seconds an entry lives after it was added "
                           "(SGLang PR #35823 proposes a TTL; the value is chosen, sweep it)")


@BLACKLIST_POLICIES.register("ttl")
class TTL(Permanent):
    """An entry expires ``ttl_s`` after it was added, and its failure count with it (PR #35823)."""

    Params = TTLParams

    def _added(self, session: str, when: float) -> None:
        self._expire_at(session, when, self.p.ttl_s, "ttl")


class StrikesWindowParams(Params):
    strikes: PosInt = Field(3, le=MAX_COUNT, description="Failures within window_s that "
                            "blacklist the session")
    window_s: Seconds = Field(10.0, description="Sliding window for counting failures")
    ttl_s: Seconds | None = Field(None, description="How long an entry lasts; null: until "
                                  "re-registration, as the permanent list")


@BLACKLIST_POLICIES.register("strikes_window")
class StrikesWindow(Policy):
    """N failures within a sliding window blacklist; a success resets the count."""

    Params = StrikesWindowParams

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.recent: dict[str, deque[float]] = {}

    def record_failure(self, session: str) -> bool:
        now = self.env.now
        q = self.recent.setdefault(session, deque())
        q.append(now)
        while q and now - q[0] > self.p.window_s:
            q.popleft()
        if len(q) >= self.p.strikes and self._add(session, f"{len(q)} in {self.p.window_s:g} s"):
            return True
        return False

    def record_success(self, session: str) -> None:
        if session in self.recent:
            del self.recent[session]

    def _forget(self, session: str) -> None:
        self.recent.pop(session, None)

    def _added(self, session: str, when: float) -> None:
        if self.p.ttl_s is not None:
            self._expire_at(session, when, self.p.ttl_s, "ttl")


class BreakerParams(Params):
    failures: PosInt = Field(3, le=MAX_COUNT, description="Failures within window_s that "
                             "open the breaker")
    window_s: Seconds = Field(10.0, description="Sliding window for counting failures (closed)")
    cooldown_s: Seconds = Field(5.0, description="Open for this long before half-open")
    trials: PosInt = Field(1, le=MAX_COUNT, description="Transfers let through half-open")
    backoff: Annotated[float, Field(ge=1.0, le=1e3, allow_inf_nan=False), _NUM] = Field(
        2.0, description="Cooldown multiplier after a failed trial")
    max_cooldown_s: Seconds = Field(300.0, description="Cap of the cooldown")

    def check(self, ctx: Context) -> None:
        if self.max_cooldown_s < self.cooldown_s:
            raise Invalid("max_cooldown_s", f"must be >= cooldown_s ({self.cooldown_s:g})",
                          self.max_cooldown_s)


CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


@BLACKLIST_POLICIES.register("circuit_breaker")
class CircuitBreaker(Policy):
    """Closed -> open on failures; half-open trials after a cooldown; backoff on failed trials.

    An entry (a blacklisted pair) is an open or half-open breaker. While half-open, outcomes
    of writes that started before the breaker opened also count as trial outcomes (the engine
    does not tag writes), as in breakers that judge by the next result they see.
    """

    Params = BreakerParams

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.state: dict[str, str] = {}
        self.recent: dict[str, deque[float]] = {}
        self.cooldown: dict[str, float] = {}
        self.reopen_at: dict[str, float] = {}
        self.trials_left: dict[str, int] = {}

    def admit(self, session: str) -> bool:
        st = self.state.get(session, CLOSED)
        if st == CLOSED:
            return True
        if st == OPEN:
            if self.env.now < self.reopen_at[session]:
                return False
            self._set(session, HALF_OPEN)
            self.trials_left[session] = self.p.trials
        left = self.trials_left.get(session, 0)
        if left <= 0:
            return False  # trials outstanding: everything else still fails fast
        self.trials_left[session] = left - 1
        self.log("breaker_trial", self.owner, peer=session, value=float(left - 1))
        return True

    def record_failure(self, session: str) -> bool:
        st = self.state.get(session, CLOSED)
        now = self.env.now
        if st == HALF_OPEN:
            cd = min(self.cooldown.get(session, self.p.cooldown_s) * self.p.backoff,
                     self.p.max_cooldown_s)
            self._open(session, cd, "trial failed")
            return False
        if st == OPEN:
            return False
        q = self.recent.setdefault(session, deque())
        q.append(now)
        while q and now - q[0] > self.p.window_s:
            q.popleft()
        if len(q) >= self.p.failures:
            self._open(session, self.p.cooldown_s, f"{len(q)} in {self.p.window_s:g} s")
            return True
        return False

    def record_success(self, session: str) -> None:
        if self.state.get(session, CLOSED) == HALF_OPEN:
            self.clear(session, "trial ok")

    def clear(self, session: str, why: str) -> None:
        was_open = self.state.pop(session, CLOSED) != CLOSED
        super().clear(session, why)
        if was_open:
            self.log("breaker", self.owner, peer=session, detail=f"{CLOSED} ({why})")

    def _forget(self, session: str) -> None:
        for d in (self.recent, self.cooldown, self.reopen_at, self.trials_left):
            d.pop(session, None)

    def _open(self, session: str, cooldown: float, why: str) -> None:
        self.cooldown[session] = cooldown
        self.reopen_at[session] = self.env.now + cooldown
        self.trials_left.pop(session, None)
        self._set(session, OPEN, f"{why}; cooldown {cooldown:g} s")
        self._add(session, why)

    def _set(self, session: str, state: str, detail: str = "") -> None:
        self.state[session] = state
        self.log("breaker", self.owner, peer=session, detail=f"{state}" + (
            f" ({detail})" if detail else ""))


@BLACKLIST_POLICIES.register("never")
class Never(Policy):
    """No blacklist: every request tries the write, whatever happened before."""

    def admit(self, session: str) -> bool:
        return True


def build(params: Params, env: simpy.Environment, owner: str, log: EventLog,
          probe: Prober | None = None) -> Policy:
    """The policy object the scenario's ``blacklist:`` section names."""
    cls = BLACKLIST_POLICIES.get(params.policy).impl  # type: ignore[attr-defined]
    return cls(params, env, owner, log, probe)

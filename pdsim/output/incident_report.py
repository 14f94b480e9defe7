"""The report's lines for SGLang's PD timeout and abort paths (issue 26): the release and
switches a run used, the incident's measures (recovery, trough, dead rooms), and the timeline
lines of the events those paths log, each burst of one kind told as one line.

Events (pdsim.engine): ``dead_room`` / ``dead_room_freed`` (a decode slot held by a room that
cannot complete, and freed), ``done_lost`` (a transfer's done signal lost), ``prefill_crash``
/ ``prefill_restart`` (a prefill process replaced behind its address), ``peer_invalidated`` (a
decode dropped its cached connection to a prefill).
"""

from __future__ import annotations

from typing import Any

# (done_lost is not told: the dead room it leaves says it, "done signal lost" or "metadata never
# landed")
# (prefill_crash / prefill_restart neither: the fault's own fault_start / fault_end lines say it)
EVENTS = ("dead_room", "dead_room_freed", "peer_invalidated", "leg_failed", "wedge_ended")
BURST_S = 1.0  # events of one kind and cause this close are one line (a leg failure's: LEAK_S)
LEAK_S = 30.0  # dead rooms and their freeing this close are one line (a slow leak reads as one)


def _onoff(v: Any) -> str:
    if v is True:
        return "on"
    if v is False:
        return "off"
    return "none" if v is None else f"{v:g}" if isinstance(v, float) else str(v)


def release_line(sc: Any) -> str:
    """The release and the switches the scenario set itself (the rest are the release's)."""
    own = {k: v for k, v in sc.disaggregation.model_dump(exclude_none=True).items()}
    pd = sc.pd
    key = ("prefill_abort_notifies_decode", "decode_abort_notifies_prefill",
           "waiting_timeout_in_transferring", "deferred_decode_kv_release")
    shown = ", ".join(f"{k} {_onoff(pd[k])}{'*' if k in own else ''}" for k in key)
    extra = ", ".join(f"{k} {_onoff(v)}*" for k, v in own.items() if k not in key)
    return (f"SGLang {sc.engine.version}'s PD paths: {shown}{', ' + extra if extra else ''}"
            f"{' (*: set by the scenario, the rest its release' + chr(39) + 's)' if own else ''}")


def block(s: dict, line: Any) -> list[str]:
    """The incident's measures (the summary's ``incident``), or nothing without one."""
    inc = s.get("incident")
    if not inc:
        return []
    out = []
    a, b = inc["trigger_from_s"], inc["trigger_to_s"]
    if a is not None:
        out.append(line("Trigger (the faults' window):", f"{a:g} s to {b:g} s"))
    base = inc["base_goodput_tok_s"]
    if base is not None:
        ratio = inc["trough_ratio"]
        out.append(line("Goodput before / lowest 10-s mean (tok/s):",
                        f"{base:,.0f} / {inc['trough_goodput_tok_s']:,.0f} "
                        f"({100 * ratio:.1f}%)" if ratio is not None else f"{base:,.0f}"))
        if inc.get("final_ratio") is not None:
            out.append(line("Goodput at the load's end (last 60 s, tok/s):",
                            f"{inc['final_goodput_tok_s']:,.0f} "
                            f"({100 * inc['final_ratio']:.1f}% of before)"))
        out.append(line("Recovery (goodput back, no request stuck):", recovery_text(s)))
    elif a is not None:
        out.append(line("Recovery:", "no goodput before the trigger to measure it against"))
    left = unanswered_text(s)
    if left:
        out.append(line("Unanswered when the run ended:", left))
    if inc["peak_failure_share"] is not None:
        out.append(line("Failure share at its peak (10-s window):",
                        f"{100 * inc['peak_failure_share']:.1f}%"))
    if inc["dead_rooms"]:
        at_end = inc.get("dead_rooms_at_end", 0)
        out.append(line("Decode slots held by dead rooms:",
                        f"{inc['dead_rooms']} rooms, {inc['dead_room_slot_s']:,.0f} slot-s, "
                        f"{inc['dead_rooms_max']} at once, longest "
                        f"{inc['dead_room_held_max_s']:g} s"
                        + (f", {at_end} still held at the end" if at_end else "")))
    return out


def recovery_text(s: dict) -> str:
    """The recovery as the report and the figure say it: when goodput was back and nothing
    was stuck; or, goodput back while requests stay stuck, both (pdsim.engine.incident)."""
    inc = s["incident"]
    rec, back = inc["recovery_s"], inc.get("goodput_recovery_s")
    if rec is not None:
        more = (f" (goodput back after {back:g} s, the last dead room freed after {rec:g} s)"
                if back is not None and rec > back else "")
        return f"{rec:g} s after the trigger's end{more}"
    if back is None:
        return "not within the run"
    stuck = inc.get("stuck_requests", 0)
    held = inc.get("dead_rooms_at_end", 0)
    why = (f"{stuck:,} request{'s' if stuck != 1 else ''} can never finish"
           if stuck else f"{held:,} dead room{'s' if held != 1 else ''} still held at the end")
    return f"not recovered: goodput back {back:g} s after the trigger's end, but {why}"


def unanswered_text(s: dict) -> str:
    """Requests with no answer when the run ended, and whether they ever could have: a
    failed count alone makes a run that leaves requests stuck look better than its fix."""
    n = s.get("unfinished", 0)
    if not n:
        return ""
    stuck = (s.get("incident") or {}).get("stuck_requests", 0)
    if stuck:
        return f"{n:,} (can never finish: the run stalled with them)"
    if s.get("stopped_at_horizon"):
        return f"{n:,} (still in flight at the horizon)"
    return f"{n:,}"


class Bursts:
    """Groups the timeline's PD-path events: one line per burst of one kind and cause."""

    def __init__(self) -> None:
        self.group: list = []
        self.dead = 0  # slots held by dead rooms now

    def add(self, e: Any, emit: Any) -> None:
        g = self.group
        gap = LEAK_S if _kind(e) in ("dead", "leg_failed", "wedge_ended") else BURST_S
        if g and (_kind(g[0]) != _kind(e) or e.time - g[-1].time > gap
                  or (_kind(e) != "dead" and _cause(g[0]) != _cause(e))):
            self.close(emit)
        self.group.append(e)

    def close(self, emit: Any) -> None:
        g, self.group = self.group, []
        if not g:
            return
        n, e = len(g), g[0]
        span = f"t={e.time:9.3f}s " if g[-1].time == e.time else \
            f"t={e.time:9.3f}s..{g[-1].time:.3f}s "
        if _kind(e) == "dead":  # rooms freed and slots newly held, in one burst: one line
            freed = [x for x in g if x.event == "dead_room_freed"]
            new = [x for x in g if x.event == "dead_room"]
            self.dead += len(new) - len(freed)
            parts = []
            if freed:
                held = max(x.value for x in freed)
                parts.append(f"{len(freed)} dead room{'s' if len(freed) > 1 else ''} freed "
                             f"({_causes(freed)}) after up to {held:.1f} s")
            if new:
                parts.append(f"{len(new)} slot{'s' if len(new) > 1 else ''} newly held by "
                             f"dead rooms ({_causes(new)})")
            emit(f"{span}{_who(g)}: {'; '.join(parts)}; {self.dead} held now")
        elif e.event == "done_lost":
            emit(f"{span}{_who(g)}: {n} transfer{'s' if n > 1 else ''} lost the done signal "
                 f"({e.detail.split('; ', 1)[-1]})")
        elif e.event == "prefill_crash":
            lost = int(sum(x.value for x in g))
            emit(f"{span}{e.component}: process died, {lost} requests lost; the decodes "
                 f"are not told")
        elif e.event == "prefill_restart":
            emit(f"{span}{e.component}: a new process serves behind the same address")
        elif e.event == "leg_failed":
            emit(f"{span}router: {n} request{'s' if n > 1 else ''}' {e.detail}")
        elif e.event == "wedge_ended":
            held = max(x.value for x in g)
            emit(f"{span}router: {n} wedged request{'s' if n > 1 else ''} answered at last, "
                 f"after up to {held:.1f} s ({e.detail})")
        elif e.event == "peer_invalidated":
            emit(f"{span}{_who(g)}: cached connection to {e.peer} dropped ({e.detail}); the "
                 f"next request re-registers")


def _kind(e: Any) -> str:
    return "dead" if e.event in ("dead_room", "dead_room_freed") else e.event


def _causes(g: list) -> str:
    c: dict[str, int] = {}
    for x in g:
        c[x.detail] = c.get(x.detail, 0) + 1
    return ", ".join(k if len(c) == 1 else f"{k} {v}" for k, v in c.items())


def _cause(e: Any) -> str:
    if e.event == "peer_invalidated":
        return f"{e.peer}/{e.detail}"
    return "" if e.event == "wedge_ended" else e.detail


def _who(g: list) -> str:
    names = sorted({f"{e.component}.r{e.rank}" if e.rank >= 0 else e.component for e in g})
    return names[0] if len(names) == 1 else f"{names[0]} and {len(names) - 1} more"

"""The warnings a run's report ends with: a run cut by its horizon, or stalled, says where
every prompt is (sent and ended, in flight, or not sent) and what to change; faults, flushes
and clients timed after the run's end say they never happened. (:mod:`pdsim.output.report`
prints them; ``pdsim run --json`` prints them on stderr.)
"""

from __future__ import annotations

import math

from pdsim.config.scenario import Scenario
from pdsim.engine.outcome import Outcome


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _where_prompts_are(res: Outcome) -> tuple[int, list[str]]:
    """Prompts and questions never sent (all clients), and per client what it still had in
    flight and had not sent: each prompt (bench) or question (eval) is sent and ended, in
    flight, or not sent, and the warnings say where the last two are."""
    s = res.summary
    warm: dict[str, int] = {}  # warmups still in flight, by client
    for client, kind, status in zip(res.request_values("client"), res.request_values("kind"),
                                    res.request_values("status"), strict=True):
        if kind == "warmup" and status == "unfinished":
            warm[client] = warm.get(client, 0) + 1
    per = []
    for name, m in s["clients"].items():
        if m.get("kind") == "eval":
            q = m.get("questions_in_flight", 0)
            bits = [f"{_plural(q, 'question')} in flight"] if q else []
        elif "prompts_in_flight" in m:  # (SDK retries: a prompt is several requests)
            q = m["prompts_in_flight"]
            bits = [f"{_plural(q, 'prompt')} in flight"] if q else []
        else:
            bits = [f"{m['unfinished']} in flight"] if m["unfinished"] else []
        if warm.get(name):
            bits.append(f"{_plural(warm[name], 'warmup request')} in flight")
        if m.get("unsent"):
            bits.append(f"{m['unsent']} not sent")
        if not m.get("finished", True) and not bits:
            bits.append("not finished")
        if bits:
            per.append(f"{name}: {', '.join(bits)}")
    return sum(m.get("unsent", 0) for m in s["clients"].values()), per


def horizon_warning(res: Outcome) -> list[str]:
    """A run that hit ``horizon_s`` before its clients finished says so, with counts."""
    s = res.summary
    running = int(sum(v == "unfinished" for v in res.request_values("status")))
    if s.get("stalled_at_s") is not None:  # (robust) the run ended early: nothing could happen
        detail = next((e.detail for e in res.event_rows() if e.event == "run_stalled"), "")
        _, _, where = detail.partition(" unfinished: ")
        why = (f"; where they wait: {where}." if where else
               " (a request larger than a KV pool, or one waiting on a timeout past the "
               "horizon).")
        unsent, per = _where_prompts_are(res)
        # (no request running: a prompt waiting out an SDK retry's backoff is in flight all
        # the same, and only this says so)
        never = (f" {unsent} prompt{'' if unsent == 1 else 's'}/question"
                 f"{'' if unsent == 1 else 's'} not sent ({'; '.join(per)})." if unsent else
                 f" In flight: {'; '.join(per)}." if per and not running else "")
        if not running:  # (a client starting past the horizon: not_reached_warning says so)
            return [f"WARNING: the run stopped at {s['stalled_at_s']:g} s, before its horizon "
                    f"(horizon_s={res.scenario.horizon_s:g}): nothing was left to simulate "
                    f"before it.{never}"]
        return [f"WARNING: the run stopped at {s['stalled_at_s']:g} s, before its horizon "
                f"(horizon_s={res.scenario.horizon_s:g}): nothing was left to simulate and "
                f"{running} request{'' if running == 1 else 's'} can never finish{why}{never} "
                f"The figures above leave them out."]
    if not s.get("stopped_at_horizon"):
        return []
    unsent, per = _where_prompts_are(res)
    h = res.scenario.horizon_s
    return [f"WARNING: the run stopped at its horizon (horizon_s={h:g}) before the clients "
            f"finished: {running} request{'' if running == 1 else 's'} still in flight, "
            f"{unsent} prompt{'' if unsent == 1 else 's'}/question{'' if unsent == 1 else 's'} "
            f"not sent "
            f"({'; '.join(per)}).",
            f"  The figures above leave them out: raise the horizon (--set horizon_s={2 * h:g}) "
            f"or lower the load."]


def not_reached(sc: Scenario, end: float) -> list[str]:
    """What the scenario schedules after the run's end (``end``), so never happened: a run
    ends when its clients are done, and a fault or flush timed past that would otherwise
    leave a report that reads as "no harm done"."""
    out = [f"operator_flushes.{i} at {op.at_s:g} s" for i, op in enumerate(sc.operator_flushes)
           if op.at_s > end]
    for i, f in enumerate(sc.faults):
        start = f.window(sc.horizon_s)[0]
        if start > end:
            out.append(f"faults.{i} {f.kind} at {start:g} s")
    out += [f"clients.{i} {c.name!r} starting at {c.start_s:g} s"
            for i, c in enumerate(sc.clients) if c.start_s > end]
    return out


def not_reached_warning(res: Outcome) -> list[str]:
    """Faults, operator flushes and clients timed after the run ended say so: they never
    happened, so the figures above show nothing of them."""
    end = res.summary["simulated_s"] if math.isnan(res.end_s) else res.end_s  # (unrounded:
    # the summary's 3 decimals put a fault at 3.44025 s after a run that ended at 3.4405 s)
    missed = not_reached(res.scenario, end)
    if not missed:
        return []
    why = ("its horizon" if res.summary.get("stopped_at_horizon") else
           "nothing was left to simulate" if res.summary.get("stalled_at_s") is not None
           else "its clients were done")
    return [f"WARNING: never happened, the run ended at {end:.6g} s ({why}): "
            f"{'; '.join(missed)}.",
            "  Nothing above shows them: start them earlier, or keep the load going past them "
            "(more num_prompts, a later horizon_s)."]

"""Does the fleet keep up with its load? The verdict a capacity planner reads first.

A run's request throughput (completed requests over the benchmark's duration) cannot say: the
duration includes the drain tail after the last arrival, when the fleet finishes what it holds
and nothing new comes, so a fleet that kept up with 20 req/s reads as 19.05 served. What does
say is the *steady window*: the second half of the arrivals (the first half fills the fleet:
its queues and batches grow to their steady size), up to the last offered arrival. Over it
this module measures

- the offered rate: prompts the client meant to send in the window (its own schedule: Poisson
  gaps, or a trace's timestamps, whether or not a concurrency limit held them back), per second;
- the completed rate: requests that completed in the window, per second (failed ones apart);
- the queue trend: the requests in the system (offered and not yet answered: waiting in the
  client behind ``max_concurrency``, queued, prefilling, transferring or decoding), sampled
  across the window, and the least-squares slope of that count, in requests per second.

A fleet that keeps up holds a steady count (Little's law: rate x latency); one that falls
behind piles up the difference between what is offered and what it serves, so the slope *is*
the shortfall. The verdict is "falling behind" when the slope is at least
:data:`BEHIND_SHARE` of the offered rate *and* the growth over the window (slope x length) is
at least :data:`BEHIND_Z` times the square root of the mean count, else "keeps up".

Chosen values (declared, with why; tests/test_steady.py checks the verdicts on small fleets
below, near and above their capacity):

- :data:`RAMP_SHARE` (the first half of the arrivals is the ramp): a fleet fills in about one
  end-to-end latency; the first half leaves the second to a fleet already full as long as its
  latency is shorter than half the arrival span. A window that starts earlier catches the end
  of the fill, whose rising count reads as a growing queue.
- :data:`BEHIND_SHARE` (5%): a fleet 5% short of its load is one to report.
- :data:`BEHIND_Z` (3.5): a kept-up Poisson load's count wanders by about its square root (the
  count of an M/G/infinity queue is Poisson), and over a short window a fitted growth of ~3
  times that was seen on fleets at 70-90% of their capacity (measured 300-2000 prompts, seeds
  1-4); a queue growing more than that over the window is growing.
- :data:`MIN_ARRIVALS`: fewer offered arrivals in the window than this give no verdict; nor does
  a queue growing no faster than a fleet still filling could grow it: a fleet fills at the
  offered rate times the share of its requests still running since the start, which the
  first requests (:data:`FIRST` or :data:`FIRST_SHARE` of them, the more: they met a nearly
  empty fleet) bound when the window starts.

Only open-loop clients have an offered rate: a bench client with a finite ``request_rate`` or a
trace's timestamps. ``request_rate: inf`` offers everything at once (a throughput test: the
question is how fast, not whether it keeps up) and an eval client is a closed loop; their
verdict is ``None`` with a note saying why.
"""

from __future__ import annotations

import numpy as np

from pdsim.engine.summary import COMPLETED, FAILED, TIMED_OUT

RAMP_SHARE = 0.5
BEHIND_SHARE = 0.05
BEHIND_Z = 3.5
MIN_ARRIVALS = 20
FIRST = 20  # the first requests (at least), whose latencies bound how a fleet fills
FIRST_SHARE = 0.05
# the keys of a verdict (a verdict without one has keeps_up and note only)
KEYS = ("keeps_up", "note", "from_s", "to_s", "offered_req_s", "completed_req_s",
        "failed_req_s", "queue_growth_req_s", "in_system_mean")
SAMPLES = 201  # instants the count is sampled at across the window


def _na(note: str) -> dict:
    return {"keeps_up": None, "note": note}


def _still_running(t_arrival: np.ndarray, done_at: np.ndarray, age: float, n: int) -> float:
    """The share of the first requests (:data:`FIRST`, or :data:`FIRST_SHARE` of the ``n``
    offered, the more) still running ``age`` seconds after they arrived. A fleet that keeps up
    fills at the offered rate times the share of its requests still running since the start,
    so its count can rise at most that fast ``age`` s in; the first requests met a nearly
    empty fleet, so their share, if anything, overstates how long a kept-up request runs."""
    first = np.argsort(t_arrival, kind="stable")[:max(FIRST, int(FIRST_SHARE * n))]
    if not len(first):
        return 0.0
    return float(np.mean(done_at[first] - t_arrival[first] > age))


def closed_loop() -> dict:
    """The verdict of a closed loop (an eval client, or a fleet with no bench client)."""
    return _na("a closed loop (each thread sends its next question when the last is "
               "answered): no offered rate to keep up with")


def window(offered: np.ndarray, col: dict[str, np.ndarray], t_end: float) -> dict:
    """The steady-window verdict (module docstring) of a load whose prompts were offered at
    ``offered`` (s, one per prompt, sent or not) and whose measured requests are ``col``
    (:func:`pdsim.engine.summary.columns`: ``status``, ``t_arrival``, ``t_done``); ``t_end``:
    when the run ended (a window past it is cut there).

    Returns ``keeps_up`` (True, False, or None with a ``note``), the window ``from_s`` and
    ``to_s``, ``offered_req_s``, ``completed_req_s``, ``failed_req_s``,
    ``queue_growth_req_s`` (the slope) and ``in_system_mean``."""
    offered = np.sort(np.asarray(offered, float))
    n = len(offered)
    if n == 0:
        return _na("no prompts offered")
    first, last = float(offered[0]), float(offered[-1])
    span = last - first
    if span <= 0:
        return _na(f"all {n} prompts offered at once (request_rate inf): a throughput "
                   f"test, no arrival rate to keep up with")
    status, t_arrival, t_done = col["status"], col["t_arrival"], col["t_done"]
    ended = (status == COMPLETED) | (status == FAILED) | (status == TIMED_OUT)
    done_at = np.where(ended, t_done, np.inf)
    a = first + RAMP_SHARE * span
    b = min(last, t_end) if np.isfinite(t_end) else last
    k = int(np.searchsorted(offered, b, side="left") - np.searchsorted(offered, a, "left"))
    if b <= a or k < MIN_ARRIVALS:
        return _na(f"{k} prompt(s) offered in the steady window ({a:.1f}-{b:.1f} s, the "
                   f"second half of the arrivals); at least {MIN_ARRIVALS} give a verdict: "
                   f"send more prompts (num_prompts)")
    w = b - a
    done_sorted = np.sort(done_at[np.isfinite(done_at)])
    ts = np.linspace(a, b, SAMPLES)
    count = (np.searchsorted(offered, ts, side="right")
             - np.searchsorted(done_sorted, ts, side="right")).astype(float)
    slope = float(np.polyfit(ts - a, count, 1)[0])
    mean = float(count.mean())
    offered_rate = k / w
    behind = slope >= BEHIND_SHARE * offered_rate and slope * w >= BEHIND_Z * np.sqrt(mean + 1)
    if behind:  # a fleet still filling grows its count too: by as much as it could?
        ramp = offered_rate * _still_running(t_arrival, done_at, a - first, n)
        if slope < ramp:
            return _na(f"the queue grew {slope:.2f} req/s over the steady window "
                       f"({a:.1f}-{b:.1f} s), no more than a fleet still filling could "
                       f"({ramp:.2f} req/s: its first requests were still running {a - first:.1f}"
                       f" s in); send more prompts (num_prompts)")
    with np.errstate(invalid="ignore"):
        in_window = (t_done >= a) & (t_done < b)
    return {
        "keeps_up": not behind,
        "from_s": round(a, 3), "to_s": round(b, 3),
        "offered_req_s": round(offered_rate, 3),
        "completed_req_s": round(int((in_window & (status == COMPLETED)).sum()) / w, 3),
        "failed_req_s": round(int((in_window & ended & (status != COMPLETED)).sum()) / w, 3),
        "queue_growth_req_s": round(slope, 3),
        "in_system_mean": round(mean, 1),
    }


def verdict_line(s: dict, rates: bool = True) -> str:
    """The one-line verdict of a :func:`window` result: "keeps up", "falling behind: queue
    grows N req/s" or "n/a: why"; ``rates`` adds the completed and offered rates."""
    if s.get("keeps_up") is None:
        return f"n/a: {s.get('note', 'no verdict')}"
    line = ("keeps up" if s["keeps_up"] else
            f"falling behind: queue grows {s['queue_growth_req_s']:.2f} req/s")
    if rates:
        failed = f", {s['failed_req_s']:.2f} req/s failed" if s["failed_req_s"] else ""
        line += (f" (completed {s['completed_req_s']:.2f} of {s['offered_req_s']:.2f} req/s "
                 f"offered{failed})")
    return line

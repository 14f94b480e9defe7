"""An SGLang server's front end: the one serial process between the scheduler and the client.

SGLang's ``TokenizerManager`` (0.5.6: python/sglang/srt/managers/tokenizer_manager.py) is one
asyncio process that also runs the HTTP server (``tokenizer_worker_num`` 1 by default). It
tokenizes every arriving request before the scheduler sees it, and handles every output
message of the scheduler (one per step, through the detokenizer) request by request:
``_handle_batch_output`` loops over every request the message carries and, in the default
non-incremental streaming mode, copies the request's whole output so far
(``state.output_ids.copy()``, ``state.text += ...``), then the SSE layer serialises a chunk
(``model_dump_json``). Its ZMQ sockets have no high-water mark (``SNDHWM=0``/``RCVHWM=0``,
utils/common.py ``config_socket``): when it falls behind, nothing pushes back on the
scheduler; the backlog waits in the queue, and shows up as latency only. A token reaches the
client when the front end has worked through what came before it, and a new request reaches
the scheduler only once the front end has tokenized it behind that same backlog.

pdsim models it as one FIFO server per SGLang server with a *fluid* backlog: ``busy`` is the
time the front end will have finished everything handed to it so far. Nothing is scheduled
per token or per chunk: a step's output adds its work, ``(requests emitting x chunk_s +
copy_s x their tokens generated so far) / stream_interval``, when the step commits; a token's
delivery is the end of its step's message (``busy`` after the add: the position of one
request inside the message is not modelled); a prompt's tokenization takes its turn in the
same queue. The costs are the engine profile's ``frontend_chunk_us`` and
``frontend_copy_ns_per_token`` (their sources are in engines.yaml); both 0 builds no front
end at all (the run is the one without it).

A span of steps committed at once (``quiet_steps``: their exact end times are past) adds its
work on top of the backlog, floored at the time the rank last handed work over (a commit, a
prompt, an earlier part of the span): exact while the front end is behind (a backlog only
sums); when it catches up inside the span the work may start early by up to the span's length,
which the next commit (at its own time) bounds. A prompt arriving inside a span has the span's
steps already past handed over first (the rank is caught up), so it waits behind their output,
and what the rank hands over after it is floored at its arrival (work reaches the front end in
time order: tests/test_frontend.py).
"""

from __future__ import annotations

from typing import Any

from pdsim.engine.clock import call_later


class FrontEnd:
    """One server's TokenizerManager as a fluid FIFO: ``busy`` is when it is free again."""

    __slots__ = ("busy", "chunk_s", "copy_s", "interval")

    def __init__(self, chunk_us: float, copy_ns_per_token: float, stream_interval: int) -> None:
        self.busy = 0.0
        self.chunk_s = chunk_us * 1e-6
        self.copy_s = copy_ns_per_token * 1e-9
        self.interval = stream_interval

    def take(self, t: float, work: float) -> float:
        """Queue ``work`` seconds of work handed over at time ``t``: when it is done."""
        busy = self.busy
        self.busy = busy = (busy if busy > t else t) + work
        return busy

    def steps(self, t: float, n: int, batch: int, generated: int) -> float:
        """``n`` steps of a batch of ``batch`` requests, each a token, handed over from time
        ``t`` on, the requests having ``generated`` tokens in all before the first: their
        chunks (one in ``stream_interval`` per request: SGLang's scheduler streams a request
        when ``len(output_ids) % stream_interval == 1``) and their copies of the output so
        far. Returns when the last is delivered."""
        tokens = n * generated + batch * n * (n + 1) // 2  # (generated so far, step by step)
        return self.take(t, (n * batch * self.chunk_s + tokens * self.copy_s) / self.interval)


# --- a colocated rank's side (pdsim.engine.colocated.ColocatedRank, ``rank``) -------------

def hand_over(rank: Any, plan: tuple) -> None:
    """A committed step's output goes to the rank's front end (before its completions: they
    are delivered with it): a decode token of every running request (a mixed step's too) and a
    first token of every request whose fill this prefill ends (never held back by the stream
    interval)."""
    front, now, b = rank.front, rank.env._now, plan[0]
    if b:
        front.steps(now, 1, b, rank.ctx_sum - rank.in_sum)
    if len(plan) > 4:
        first = sum(1 for req, n, _f in rank.batch if req.fill_done + n >= req.fill_target)
        if first:
            front.take(now, first * (front.chunk_s + front.copy_s))
    rank._front_t = now


def defer(rank: Any, req: Any, refill: bool) -> bool:
    """``req`` is done on ``rank``; its last token reaches the client when the front end has
    handled this step's output (``hand_over`` ran first). If that is later, the scheduler is
    done with it now (KV freed, batch left, its prompt kept in the radix cache) and the
    client's answer ends it then: a router timeout or a crash before that ends it first (the
    first end wins). False: nothing pending, complete it now."""
    now = rank.env._now
    if req.status != "unfinished" or rank.front.busy <= now:
        return False
    rank._completed(req, refill, answer=False)
    rank._delivering[req.rid] = req
    epoch = rank._epoch

    def delivered() -> None:  # (unless the process died meanwhile: crash failed it)
        if epoch == rank._epoch:
            del rank._delivering[req.rid]
            rank._respond(req, "completed", http_status=200)

    call_later(rank.env, rank.front.busy - now, delivered)
    return True


def crash(rank: Any) -> None:
    """The server's process died: its front end's backlog and the answers it had not
    delivered die with it."""
    rank.front.busy = rank.env._now
    for req in rank._delivering.values():
        rank._fail(req, "decode_crashed", 502)
    rank._delivering.clear()

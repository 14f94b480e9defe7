"""Execution backends: run many independent simulations, locally or on a Ray cluster.

One small interface for everything that fans runs out (``sweep``, ``explore``, ``whatif``)::

    with backends.get("process", workers=2) as be:       # or get("ray", address="auto")
        for i, result in be.imap(fn, tasks):             # as each finishes, any order
            ...

``fn`` must be a module-level function (it is pickled by reference) and ``tasks`` picklable.
Results come back in completion order with the task's index, so callers can store each one as
soon as it exists (``explore`` writes it to Parquet at once) and sort afterwards. The process
pool is the default; Ray is an extra (``pip install -e '.[ray]'``) for explorations that outgrow
one machine.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

NAMES = ("process", "ray")
MAX_RUNS = 100_000  # runs one sweep, exploration or what-if matrix may fan out
WORKERS_PER_CORE = 4  # local processes at most, per core (each holds a Python with pandas)


def check_workers(workers: int | None, backend: str = "process") -> None:
    """``workers`` for ``backend``: at least 1, and for local processes at most
    WORKERS_PER_CORE per core (``--workers 100000`` forked a process per queued run)."""
    if workers is None:
        return
    if workers < 1:
        raise ValueError(f"workers {workers}: give at least 1")
    cores = os.cpu_count() or 1
    if backend == "process" and workers > WORKERS_PER_CORE * cores:
        raise ValueError(f"workers {workers}: give 1..{WORKERS_PER_CORE * cores} "
                         f"({WORKERS_PER_CORE} local processes per core, {cores} cores)")


def run_all(fn: Callable[[Any], Any], tasks: Sequence, workers: int | None = None,
            progress: bool = False, backend: str = "process", address: str | None = None,
            bar: Any = None) -> list:
    """``fn`` over every task on a backend (default: a process per core, at most one per
    task), with a progress bar on stderr; results in task order. ``bar``: a caller's bar
    (``progress_bar``) to advance instead, left open (one bar over several batches)."""
    if not tasks:
        return []
    workers = workers or min(len(tasks), os.cpu_count() or 1)
    own = bar is None
    if own:
        bar = progress_bar(len(tasks), enabled=progress)
    out: list = [None] * len(tasks)
    try:
        with get(backend, workers, address) as be:
            for i, result in be.imap(fn, tasks):
                out[i] = result
                bar.update()
    finally:
        if own:
            bar.close()
    return out


def progress_bar(total: int, initial: int = 0, enabled: bool = True, unit: str = "run",
                 desc: str | None = None) -> Any:
    """A bar on stderr, erased when done: the runs of sweep, explore and whatif, and the
    simulated seconds, rows and splits of ``run --progress``, validate-model and holdout.

    A terminal that reports no size (0x0: ``script`` run without a terminal, some container
    and CI ttys) makes tqdm read -1 rows and hide every bar, so such a terminal gets 80x24.
    """
    from tqdm import tqdm

    size: dict = {}
    if enabled:
        try:
            cols, rows = os.get_terminal_size(sys.stderr.fileno())
        except (AttributeError, OSError, ValueError):  # not a terminal: tqdm's own defaults
            pass
        else:
            if cols <= 0 or rows <= 0:
                size = {"ncols": cols if cols > 0 else 80, "nrows": rows if rows > 0 else 24}
    return tqdm(total=total, initial=initial, unit=unit, desc=desc, disable=not enabled,
                leave=False, file=sys.stderr, **size)


class Backend(Protocol):
    name: str
    workers: int

    def imap(self, fn: Callable[[Any], Any], tasks: Sequence) -> Iterator[tuple[int, Any]]:
        """Yield ``(index into tasks, fn(task))`` as each run finishes."""
        ...

    def close(self) -> None: ...

    def __enter__(self) -> Backend: ...

    def __exit__(self, *exc: object) -> None: ...


def _ignore_sigint() -> None:
    """Workers leave Ctrl-C to the parent, which stops handing out runs and shuts down."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


class _Base:
    name = "base"
    workers = 1

    def close(self) -> None:
        pass

    def __enter__(self) -> _Base:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ProcessBackend(_Base):
    """A local process pool (``workers`` processes; 1 runs in this process, in order)."""

    name = "process"

    def __init__(self, workers: int | None = None) -> None:
        if workers is not None and workers > 1:  # (the library reads 0 or less as 1)
            check_workers(workers)
        self.workers = max(1, workers or os.cpu_count() or 1)

    def imap(self, fn: Callable[[Any], Any], tasks: Sequence) -> Iterator[tuple[int, Any]]:
        if self.workers <= 1 or len(tasks) <= 1:
            for i, t in enumerate(tasks):
                yield i, fn(t)
            return
        from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

        pool = ProcessPoolExecutor(max_workers=min(self.workers, len(tasks)),
                                   initializer=_ignore_sigint)
        try:
            # at most 2 tasks queued per worker, so an interrupted run leaves little half-done
            pending: dict = {}
            it = iter(enumerate(tasks))
            for i, t in it:
                pending[pool.submit(fn, t)] = i
                if len(pending) >= 2 * self.workers:
                    break
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    i = pending.pop(fut)
                    nxt = next(it, None)
                    if nxt is not None:
                        pending[pool.submit(fn, nxt[1])] = nxt[0]
                    yield i, fut.result()
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


class RayBackend(_Base):
    """Ray tasks, one CPU each; ``address`` None starts a local Ray, "auto" joins a cluster.

    Workers import pdsim themselves: on a cluster, install it there (or pass a ``runtime_env``
    to ``ray.init`` before calling pdsim).
    """

    name = "ray"

    def __init__(self, workers: int | None = None, address: str | None = None) -> None:
        try:
            import ray
        except ImportError:
            raise ValueError("--backend ray needs Ray: pip install -e '.[ray]'") from None
        self._ray = ray
        self._started = False
        if not ray.is_initialized():
            kw: dict = {"address": address, "include_dashboard": False,
                        "log_to_driver": False}
            if address is None and workers:
                kw["num_cpus"] = workers
            ray.init(**kw)
            self._started = True
        self.workers = workers or int(ray.cluster_resources().get("CPU", 1))

    def imap(self, fn: Callable[[Any], Any], tasks: Sequence) -> Iterator[tuple[int, Any]]:
        ray = self._ray
        remote = ray.remote(num_cpus=1)(fn)
        pending: dict = {}
        it = iter(enumerate(tasks))
        try:
            for i, t in it:
                pending[remote.remote(t)] = i
                if len(pending) >= 2 * self.workers:
                    break
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                for ref in done:
                    i = pending.pop(ref)
                    nxt = next(it, None)
                    if nxt is not None:
                        pending[remote.remote(nxt[1])] = nxt[0]
                    yield i, ray.get(ref)
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)

    def close(self) -> None:
        if self._started:
            self._ray.shutdown()
            self._started = False


def get(name: str = "process", workers: int | None = None,
        address: str | None = None) -> Backend:
    """The backend called ``name`` ("process" or "ray")."""
    if name == "process":
        if address:
            raise ValueError("--address is for --backend ray")
        return ProcessBackend(workers)
    if name == "ray":
        return RayBackend(workers, address)
    raise ValueError(f"unknown backend {name!r}; allowed: {', '.join(NAMES)}")

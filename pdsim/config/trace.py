"""Mooncake FAST'25 request traces (JSONL): read once, checked line by line.

Each line is a JSON object: ``timestamp`` (ms), ``input_length``, ``output_length`` and
optionally ``hash_ids`` (prefix-block ids). Scenario loading parses the trace (so ``pdsim
validate`` catches a bad line, naming its number) and the client reads the same rows from a
small cache. Files are opened through :mod:`pdsim.util.safeio` (regular files, size limit), gzip
by its magic bytes, with the decompressed size bounded too.
"""

from __future__ import annotations

import gc
import gzip
import io
import json
import math
import os
import zlib
from functools import lru_cache
from itertools import islice
from operator import itemgetter
from pathlib import Path
from typing import BinaryIO

from pdsim.util.safeio import UserFileError, clip, open_user_file, show_path

MAX_TRACE_BYTES = 256 << 20  # a trace file, and its data after gzip decompression
MAX_TRACE_ROWS = 1_000_000  # requests replayed from one trace (units.MAX_REQUESTS)
MAX_TRACE_TOKENS = 10_000_000  # input_length / output_length of one row
# Lines of one trace file, blank ones included. The byte limits bound a file's bytes, not the
# per-line Python work: gzip packs 256 MB of newlines into ~250 KB, and reading them one by one
# took minutes. A trace has one row per line, so 4 x MAX_TRACE_ROWS leaves room for a blank line
# after every row of the longest trace replayed whole, and for a trace of up to 4 million rows
# cut by num_prompts (the 256 MB limit alone allows ~4.5 million rows of the shortest shape,
# ~57 bytes without hash_ids; the Mooncake traces' rows average ~250 bytes); a file of blank
# lines is refused after 4 million of them, in about half a second.
MAX_TRACE_LINES = 4 * MAX_TRACE_ROWS  # lines of a trace file, blank ones included
# a prefix block id is below this: pdsim.engine.client numbers random prompts' blocks from it up (a
# trace's ids are block hashes' indices, far smaller), so no trace block is one of theirs
HASH_ID_LIMIT = 1 << 40


class TraceError(ValueError):
    """A trace file that cannot be replayed; ``str()`` is one line naming the line number."""


def _constant(name: str) -> float:
    raise ValueError(f"{name} is not a number here")


class _Bad(ValueError):
    """A line's problem, before :func:`_parse` names the file and line (formatted only then)."""


def _count(v: object, key: str) -> int:
    """A row's ``key`` field ``v``: a whole number of tokens (floats are truncated)."""
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise _Bad(f"'{key}' must be a number of tokens")
    if not 0 <= v <= MAX_TRACE_TOKENS:
        raise _Bad(f"'{key}' must be 0..{MAX_TRACE_TOKENS:,} tokens")
    return int(v)


# one decoder for every line (json.loads with an argument builds a decoder per call)
_DECODER = json.JSONDecoder(parse_constant=_constant)
_INT = frozenset((int,))
_JSON_WHITESPACE = json.decoder.WHITESPACE  # what JSONDecoder.decode allows after a value


def _row(line: bytes, pairs: bool = False) -> tuple[float, int, int, tuple[int, ...]]:
    """A line's row (``_check``), or the line's problem (``_Bad``)."""
    try:
        text = line.decode("utf-8")
        # (json.loads's own check and message for a byte-order mark, then its decoding)
        row = (json.loads(text, parse_constant=_constant) if text.startswith("\ufeff")
               else _DECODER.decode(text))
    except UnicodeDecodeError:
        raise _Bad("not UTF-8 text") from None
    except RecursionError:
        raise _Bad("JSON nested too deeply") from None
    except ValueError as err:  # JSONDecodeError, or an integer past Python's digit limit
        msg = err.msg if isinstance(err, json.JSONDecodeError) else str(err)
        raise _Bad(f"not valid JSON ({clip(msg, 80)})") from None
    return _check(row, pairs)


def _check(row: object, pairs: bool = False) -> tuple[float, int, int, tuple[int, ...]]:
    """A decoded line's (timestamp ms, input length, output length, prefix blocks). ``pairs``:
    length pairs, whose timestamp is not used and may be left out (0 then)."""
    if not isinstance(row, dict):
        raise _Bad("each line must be a JSON object")
    ts = row.get("timestamp")
    if ts is None and pairs:
        ts = 0
    if type(ts) is not int and (isinstance(ts, bool) or not isinstance(ts, int | float)
                                or not math.isfinite(ts)):
        raise _Bad("'timestamp' (ms) must be a number")
    if abs(ts) > 1e15:
        raise _Bad("'timestamp' must be within ±1e15 ms")
    blocks = row.get("hash_ids", ())
    # JSON makes no int subclass but bool: type(b) is int <=> an int and not a bool
    if not isinstance(blocks, list | tuple) or not _INT.issuperset(map(type, blocks)):
        raise _Bad("'hash_ids' must be a list of integers")
    if blocks and (min(blocks) < 0 or max(blocks) >= HASH_ID_LIMIT):
        raise _Bad(f"'hash_ids' must be integers 0..{HASH_ID_LIMIT - 1:,} (2^40 - 1)")
    inp, out = row.get("input_length"), row.get("output_length")
    if not (type(inp) is int and 0 <= inp <= MAX_TRACE_TOKENS):  # (else _count checks)
        inp = _count(inp, "input_length")
    if not (type(out) is int and 0 <= out <= MAX_TRACE_TOKENS):
        out = _count(out, "output_length")
    if len(blocks) > inp:  # ids name the prompt's blocks, each of at least one token (the
        # Mooncake traces' hold 512: len(hash_ids) == ceil(input_length / 512) on every row)
        n = len(blocks)
        raise _Bad(f"'hash_ids' holds {n:,} block id{'' if n == 1 else 's'} for an "
                   f"input_length of {inp:,} token{'' if inp == 1 else 's'}; a block holds at "
                   f"least one token (512 in the Mooncake traces), so at most {inp:,}")
    return ts, inp, out, tuple(blocks)


class _Bounded(io.RawIOBase):
    """A binary stream that refuses to yield more than ``limit`` bytes (a gzip bomb stops)."""

    def __init__(self, raw: BinaryIO, limit: int, what: str) -> None:
        self.raw, self.left, self.what = raw, limit, what

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray) -> int:
        try:
            data = self.raw.read(min(len(b), self.left + 1))
        except (OSError, EOFError, zlib.error) as err:  # BadGzipFile is an OSError
            raise TraceError(f"{self.what}: not a readable gzip file "
                             f"({clip(str(err) or type(err).__name__, 60)})") from None
        if len(data) > self.left:
            raise TraceError(f"{self.what}: more than {MAX_TRACE_BYTES:,} bytes of trace data "
                             f"(decompressed); the limit is {MAX_TRACE_BYTES:,}")
        self.left -= len(data)
        b[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self.raw.close()
        super().close()


def open_trace(path: str | Path) -> BinaryIO:
    """Open a trace for reading lines (bytes); gzip data (``.jsonl.gz``, found by its magic
    bytes) is decompressed on the fly, at most ``MAX_TRACE_BYTES`` either way."""
    what = f"trace file {show_path(path)}"
    try:
        f = open_user_file(path, "trace file", MAX_TRACE_BYTES)
    except UserFileError as err:
        raise TraceError(str(err)) from None
    raw: BinaryIO = f
    if f.peek(2)[:2] == b"\x1f\x8b":
        raw = gzip.GzipFile(fileobj=f, mode="rb")
    return io.BufferedReader(_Bounded(raw, MAX_TRACE_BYTES, what))


def _too_many_lines(path: str) -> TraceError:
    return TraceError(f"trace file {show_path(path)} holds more than {MAX_TRACE_LINES:,} lines "
                      f"(blank ones included); the limit is {MAX_TRACE_LINES:,}")


def _key(path: str | Path) -> tuple:
    p = os.fspath(path)
    try:
        st = os.stat(p)
        return p, st.st_mtime_ns, st.st_size
    except (OSError, ValueError):
        return p, 0, 0


@lru_cache(maxsize=4)
def _parse(key: tuple, limit: int, pairs: bool = False) -> tuple:
    """The rows, parsed with CPython's cyclic collector paused: each row is a new tuple of
    numbers, which the collector can only untrack, and on a 100k-row trace they set off 141
    collections, one of the whole heap (60-80 ms, finding 10 objects; speed.py's 100k stream,
    2026-11-30). Paused, the next young collection untracks them all at once."""
    if not gc.isenabled():
        return _parse_rows(key, limit, pairs)
    gc.disable()
    try:
        return _parse_rows(key, limit, pairs)
    finally:
        gc.enable()


def _parse_rows(key: tuple, limit: int, pairs: bool) -> tuple:
    rows: list = []
    append = rows.append
    scan, space = _DECODER.scan_once, _JSON_WHITESPACE.match
    most = MAX_TRACE_TOKENS  # a line is read for commas past this many bytes
    commas = most + 64  # a row's most hash_ids (_check), and room for its other fields
    n = 0
    with open_trace(key[0]) as f:
        try:
            for n, line in enumerate(islice(f, MAX_TRACE_LINES), 1):  # noqa: B007 (n: a bad line)
                if len(rows) >= limit:
                    break
                if line.isspace():  # blank (as not line.strip()), skipped at once: a file of
                    continue  # blank lines costs what reading them does (MAX_TRACE_LINES)
                # A row holds at most input_length <= MAX_TRACE_TOKENS ids (_check), so a line
                # of far more commas is none: refused before decoding builds its list (one row
                # of ~36M ids, a 382 KB gzip, took 2.5 GB and 97 s). Before decoding there is
                # only the raw line to look at, bounded by MAX_TRACE_BYTES; commas count in C.
                if len(line) > most and line.count(b",") > commas:
                    raise _Bad(f"{line.count(b','):,} commas, more than a row holds: at most "
                               f"{most:,} 'hash_ids' (at most input_length, <= {most:,}: a "
                               f"block holds at least one token) and its fields")
                # A line that is one JSON value from its first character, then JSON whitespace
                # only, decodes as _DECODER.decode would (it skips leading whitespace, scans,
                # and refuses anything but whitespace after the value): scanning it directly
                # skips decode's calls. Any other line that is not blank goes through _row,
                # which decodes it as before and says what is wrong with it.
                try:
                    text = line.decode("utf-8")
                    row, end = scan(text, 0)
                except (ValueError, StopIteration, RecursionError):  # (UnicodeDecodeError too)
                    end = -1
                if end >= 0 and space(text, end).end() == len(text):
                    append(_check(row, pairs))
                    continue
                text = row = None  # (one decoded copy of a long line at a time: _row decodes)
                append(_row(line, pairs))
            else:  # read to its end: its non-blank lines are its rows (count_rows)
                if f.read(1):
                    raise _too_many_lines(key[0])
                _WHOLE[key] = len(rows)
                if len(_WHOLE) > 8:
                    del _WHOLE[next(iter(_WHOLE))]
        except _Bad as err:
            raise TraceError(f"trace file {show_path(key[0])}, line {n}: {err}") from None
    return tuple(rows)


# files parsed to their end (key -> rows): count_rows need not read them again
_WHOLE: dict[tuple, int] = {}


@lru_cache(maxsize=4)
def _count_rows(key: tuple) -> int:
    with open_trace(key[0]) as f:
        rows = sum(1 for line in islice(f, MAX_TRACE_LINES) if line.strip())
        if f.read(1):
            raise _too_many_lines(key[0])
    return rows


def count_rows(path: str | Path) -> int:
    """Non-blank lines of a trace (its requests), to say how much of it a run replayed."""
    key = _key(path)
    whole = _WHOLE.get(key)
    return whole if whole is not None else _count_rows(key)


def _rows(path: str | Path, limit: int | None, pairs: bool = False) -> tuple:
    rows = _parse(_key(path), limit if limit is not None else MAX_TRACE_ROWS + 1, pairs)
    if limit is None and len(rows) > MAX_TRACE_ROWS:
        raise TraceError(f"trace file {show_path(path)} holds more than {MAX_TRACE_ROWS:,} "
                         f"requests; replay its first rows with num_prompts")
    return rows


def read_rows(path: str | Path, pairs: bool = False) -> tuple:
    """Every row of a trace as ``(timestamp ms, input, output, blocks)`` tuples, parsed and
    checked (cached by content key, as the client's read). ``pairs``: a length-pair dataset's
    rows (``dataset: {kind: sharegpt}``), which need no timestamp (docs/reference/scenario.md:
    "timestamps are not used"; one left out reads as 0). Raises :class:`TraceError`."""
    return _rows(path, None, pairs)


def check_trace(path: str | Path, limit: int | None) -> int:
    """The rows :func:`read_trace` would return (parsed and checked, as it does; cached for
    it), without building them. Raises :class:`TraceError`.

    A trace cut by ``limit`` is counted to its end too, as the client will (to report how much
    of it ran): a tail that cannot be read (too many lines, a truncated gzip) is refused here,
    not when the run starts."""
    rows = len(_rows(path, limit))
    if rows == limit:
        count_rows(path)
    return rows


def read_trace(path: str | Path, limit: int | None, time_scale: float,
               max_input_len: int | None) -> list[dict]:
    """Rows of a Mooncake trace: arrival ``t`` (s, from the earliest row's timestamp, times
    ``time_scale``), ``input`` and ``output`` lengths (at least 1; input capped at
    ``max_input_len``) and prefix ``blocks``, in file order (BenchClient sends them by time).
    ``limit`` None reads every row (at most ``MAX_TRACE_ROWS``); a cut keeps the first rows.
    Raises :class:`TraceError` (one line, naming the line number).

    As SGLang's bench_serving replays a Mooncake trace: its first ``--num-prompts`` rows,
    sorted by timestamp, each sent at its timestamp less the earliest one's (times the
    slowdown factor; sgl-project/sglang python/sglang/benchmark/datasets/mooncake.py,
    get_mooncake_request_over_time)."""
    return [{"t": t, "input": i, "output": o, "blocks": b}
            for t, i, o, b in trace_prompts(path, limit, time_scale, max_input_len)]


def trace_prompts(path: str | Path, limit: int | None, time_scale: float,
                  max_input_len: int | None) -> list[tuple]:
    """:func:`read_trace`'s rows as tuples ``(t, input, output, blocks)``: what
    ``pdsim.engine.client.BenchClient`` keeps per prompt (a tuple costs a fraction of a dict to
    make and to read)."""
    rows = _rows(path, limit)
    t0 = min(map(itemgetter(0), rows)) if rows else 0
    cap = max_input_len
    out = []
    append = out.append
    for ts, inp, outp, blocks in rows:
        if cap and inp > cap:  # min(inp, cap)
            inp = cap
        append(((ts - t0) / 1e3 * time_scale, inp if inp > 1 else 1, outp if outp > 1 else 1,
                blocks))
    return out

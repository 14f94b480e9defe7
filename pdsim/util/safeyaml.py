"""Bounded YAML (and JSON): one document parsed safely, for every YAML or JSON file a user
names.

Scenario files, their ``extends`` parents, ``--set``/``--vary`` values, fault-set files and
user profile files all go through :func:`parse_yaml`: safe tags only, bounded nesting, size and
alias expansion, no duplicate keys, no over-long integers. A hostile file is one line, never a
RecursionError or an unbounded parse. Its own module so that :mod:`pdsim.model.profiles` reads
with the same parser as the scenario's :mod:`pdsim.config.loader`. JSON files (a Hugging Face
``config.json``, a run directory's ``summary.json`` and ``run.json``) go through
:func:`parse_json`, with the same nesting and integer limits.
"""

from __future__ import annotations

import json
import pickle
import re
from typing import Any

import yaml

from pdsim.util.safeio import clip, echo

MAX_YAML_DEPTH = 50  # nesting of mappings and lists
MAX_YAML_VALUES = 50_000  # values after expanding YAML aliases (billion laughs)
MAX_INT_DIGITS = 100  # digits of an integer literal
_CACHE_CHARS = 256 << 10  # documents up to a scenario file's size limit are cached


class YamlError(ValueError):
    """A YAML document that cannot be read; ``str()`` is one line naming the file (or flag)."""


class _YamlLimit(Exception):
    def __init__(self, msg: str, mark: Any = None) -> None:
        super().__init__(msg)
        self.mark = mark


class _BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` with nesting and node limits applied while composing."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._composed = 0

    def fetch_flow_collection_start(self, token_class: Any) -> None:
        # the scanner keeps a possible simple key per flow level: deep [[[[ is quadratic
        if self.flow_level >= MAX_YAML_DEPTH:
            raise _YamlLimit(f"nested deeper than {MAX_YAML_DEPTH} levels", self.get_mark())
        super().fetch_flow_collection_start(token_class)

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._composed += 1
        if self._composed > MAX_YAML_VALUES:
            raise _YamlLimit(f"more than {MAX_YAML_VALUES:,} values", self.peek_event().start_mark)
        if self._depth >= MAX_YAML_DEPTH:
            raise _YamlLimit(f"nested deeper than {MAX_YAML_DEPTH} levels",
                             self.peek_event().start_mark)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


_INT_TAG = "tag:yaml.org,2002:int"
_MERGE_TAG = "tag:yaml.org,2002:merge"


def _line(node: yaml.Node) -> str:
    return f"line {node.start_mark.line + 1}" if node.start_mark else "?"


def _key_text(node: yaml.Node) -> str:
    if isinstance(node, yaml.ScalarNode):
        return clip(str(node.value), 40)
    return "<complex key>"


def _inspect(root: yaml.Node) -> None:
    """Walk the composed node graph once (aliases shared, not re-walked): duplicate keys,
    over-long integers, recursive aliases, and the size of the document with aliases expanded.
    """
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def walk(node: yaml.Node, path: tuple[str, ...]) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        where = ".".join(path) or "<top>"
        if key in active:
            raise _YamlLimit(f"recursive alias at '{clip(where, 80)}'", node.start_mark)
        active.add(key)
        size = 1
        if isinstance(node, yaml.ScalarNode):
            if node.tag == _INT_TAG and len(node.value) > MAX_INT_DIGITS:
                raise _YamlLimit(f"invalid value at '{clip(where, 80)}': an integer of "
                                 f"{len(node.value):,} digits; at most {MAX_INT_DIGITS}",
                                 node.start_mark)
        elif isinstance(node, yaml.SequenceNode):
            for i, child in enumerate(node.value):
                size += walk(child, (*path, str(i)))
        elif isinstance(node, yaml.MappingNode):
            seen: dict[tuple[str, str], yaml.Node] = {}
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode) and k.tag != _MERGE_TAG:
                    ident = (k.tag, k.value)
                    if ident in seen:
                        dup = ".".join((*path, _key_text(k)))
                        raise _YamlLimit(f"duplicate key '{clip(dup, 80)}' (first at "
                                         f"{_line(seen[ident])})", k.start_mark)
                    seen[ident] = k
                size += walk(k, (*path, "<key>"))
                size += walk(v, (*path, _key_text(k)))
        active.discard(key)
        sizes[key] = size
        if size > MAX_YAML_VALUES:
            raise _YamlLimit(f"expands to more than {MAX_YAML_VALUES:,} values (YAML aliases "
                             f"at '{clip(where, 80)}')", node.start_mark)
        return size

    walk(root, ())


_FAST_LOADER = getattr(yaml, "CSafeLoader", None)  # libyaml: linear-time scanning in C
_OPEN = (yaml.SequenceStartEvent, yaml.MappingStartEvent)
_CLOSE = (yaml.SequenceEndEvent, yaml.MappingEndEvent)
_NODE = (yaml.ScalarEvent, yaml.AliasEvent, *_OPEN)


def _prescan(text: str, loader: type) -> None:
    """Stream the parser's events (no recursion, no nodes) to bound nesting and size before
    anything is composed."""
    depth = nodes = 0
    for ev in yaml.parse(text, Loader=loader):
        if isinstance(ev, _NODE):
            nodes += 1
            if nodes > MAX_YAML_VALUES:
                raise _YamlLimit(f"more than {MAX_YAML_VALUES:,} values", ev.start_mark)
        if isinstance(ev, _OPEN):
            depth += 1
            if depth > MAX_YAML_DEPTH:
                raise _YamlLimit(f"nested deeper than {MAX_YAML_DEPTH} levels", ev.start_mark)
        elif isinstance(ev, _CLOSE):
            depth -= 1


# Documents parsed before, by their text (an LRU of a few), pickled: a sweep, an exploration or
# the benchmark loads the same files again and again, and unpickling costs a fraction of a
# parse (and a quarter of a deep copy). A safe-loaded document holds only what pickle restores
# as deepcopy copies it: dicts, lists, sets, strings, bytes, numbers (every float bit for bit),
# booleans, None and dates, with shared and recursive nodes (YAML aliases) kept shared.
_PARSED: dict[str, bytes] = {}
_PARSED_MAX = 16


def parse_yaml(text: str, what: str) -> Any:
    """Parse one YAML document safely (tags of ``yaml.SafeLoader`` only) with bounded nesting,
    size and alias expansion, no duplicate keys and no over-long integers; errors are one
    line. The result is the caller's own (a copy when the text was parsed before)."""
    if text in _PARSED:
        blob = _PARSED.pop(text)
        _PARSED[text] = blob  # most recently used last
        return pickle.loads(blob)
    doc = _parse_yaml(text, what)
    if len(text) <= _CACHE_CHARS:
        if len(_PARSED) >= _PARSED_MAX:
            del _PARSED[next(iter(_PARSED))]
        _PARSED[text] = pickle.dumps(doc, pickle.HIGHEST_PROTOCOL)
    return doc


def _parse_yaml(text: str, what: str) -> Any:
    cls = _FAST_LOADER or _BoundedLoader
    loader = None
    try:
        _prescan(text, cls)
        loader = cls(text)
        node = loader.get_single_node()
        if node is None:
            return None
        _inspect(node)
        return loader.construct_document(node)
    except _YamlLimit as err:
        raise YamlError(f"{what}: {err}{_at(err.mark)}") from None
    except yaml.reader.ReaderError as err:  # a control character: no line/column mark
        raise YamlError(f"{what}: not valid YAML: {clip(err.reason, 40)} "
                            f"{echo(chr(err.character)) if isinstance(err.character, int) else ''}"
                            f" at offset {err.position}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        problem = getattr(err, "problem", None) or type(err).__name__
        if "nesting depth" in str(problem):  # libyaml >= 0.2.6 stops deep [[[[ itself
            raise YamlError(f"{what}: nested deeper than {MAX_YAML_DEPTH} levels"
                                f"{_at(mark)}") from None
        raise YamlError(f"{what}: not valid YAML{_at(mark)}: {clip(str(problem), 80)}"
                            ) from None
    except RecursionError:
        raise YamlError(f"{what}: nested too deeply") from None
    except (ValueError, TypeError, OverflowError) as err:  # e.g. a constructor's int() or date
        raise YamlError(f"{what}: a value cannot be read ({clip(str(err), 80)})") from None
    finally:
        if loader is not None:
            loader.dispose()


def _at(mark: Any) -> str:
    return f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""


# a JSON string (escapes included; one left open runs to the end, so no start is scanned
# twice) or a bracket: what the nesting scan steps over
_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*(?:"|\Z)|[\[\]{}]', re.DOTALL)


def _json_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _YamlLimit(f"an integer of {len(text.lstrip('-')):,} digits; at most "
                         f"{MAX_INT_DIGITS}")
    return int(text)


def parse_json(text: str, what: str) -> Any:
    """Parse a JSON document with YAML's limits: nesting at most ``MAX_YAML_DEPTH`` levels
    (checked by a linear scan before the recursive decoder runs: 200 KB of ``{"a":`` was a
    RecursionError), integers of at most ``MAX_INT_DIGITS`` digits (a 5,000-digit one was
    Python's ValueError past its 4,300-digit limit). Errors are one line (:class:`YamlError`)
    naming ``what``; NaN and Infinity are read as JSON's Python reader reads them."""
    depth = 0
    for m in _JSON_TOKEN.finditer(text):
        c = m.group()
        if c in "[{":
            depth += 1
            if depth > MAX_YAML_DEPTH:
                line = text.count("\n", 0, m.start()) + 1
                raise YamlError(f"{what}: nested deeper than {MAX_YAML_DEPTH} levels (line "
                                f"{line})")
        elif c in "]}":
            depth -= 1
    try:
        return json.loads(text, parse_int=_json_int)
    except _YamlLimit as err:
        raise YamlError(f"{what}: {err}") from None
    except json.JSONDecodeError as err:
        raise YamlError(f"{what}: not valid JSON (line {err.lineno}, column {err.colno}: "
                        f"{err.msg})") from None
    except (RecursionError, ValueError) as err:  # (past the scan: not expected)
        raise YamlError(f"{what}: not valid JSON ({clip(str(err), 80)})") from None

"""Declared unknowns: scenario values that were chosen, given as a range with a nominal value.

Any numeric or categorical value in a scenario may be written as

    start_s: {uniform: [5, 20], nominal: 10, why: "the report does not say when run 2 began"}
    input_len: {loguniform: [512, 8192], nominal: 4096}
    balance: {choice: [round_robin, total_tokens], nominal: total_tokens}

``pdsim run`` uses the nominal value and says so; ``pdsim explore`` samples the range. The
declarations are found and replaced by their nominal values after ``--set`` overrides and before
validation (:func:`resolve`), so the rest of pdsim only ever sees plain values. A point of the
unit cube maps to concrete values with :meth:`Unknown.value`.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pdsim.util.safeio import clip, echo

DISTRIBUTIONS = ("uniform", "loguniform", "choice")
KEYS = (*DISTRIBUTIONS, "nominal", "why")
# Inputs exploration must not sample: seeds are varied by --seeds; the reference is the report.
FORBIDDEN = ("seed", "seeds", "reference", "name", "description")
MAX_CHECKED_INTS = 64  # an integer range this short is validated at every value, not its ends
MAX_CHOICES = 64  # values of one choice (a larger numeric set is a uniform range)
# (``finish``: one whole-scenario validation per value while they fit, else in rounds, each
# validating every unknown at once, plus a bisection when one is rejected)
MAX_CHECKS = 64  # whole-scenario validations of the declared unknowns' values (rounds past it)


class UnknownError(ValueError):
    """A malformed declaration; ``str()`` is one line naming the key path."""


def is_declaration(node: Any) -> bool:
    """A mapping that uses one of the distribution keys (or ``nominal``) declares an unknown."""
    return isinstance(node, dict) and any(k in node for k in (*DISTRIBUTIONS, "nominal"))


def _num(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _fmt(x: Any) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


@dataclass(frozen=True)
class Unknown:
    """One declared unknown: where it is, its range or choices, its nominal value and why."""

    path: str
    dist: str
    nominal: Any
    low: float | None = None
    high: float | None = None
    choices: tuple = ()
    why: str = ""
    integer: bool = False

    @classmethod
    def parse(cls, path: str, node: dict) -> Unknown:
        def bad(msg: str) -> UnknownError:
            return UnknownError(f"invalid value at '{clip(path, 120)}': {msg}")

        extra = [k for k in node if k not in KEYS]
        if extra:
            raise bad(f"unknown key {echo(extra[0])} in a declared unknown; allowed: "
                      f"{', '.join(KEYS)}")
        dists = [k for k in DISTRIBUTIONS if k in node]
        if len(dists) != 1:
            raise bad(f"a declared unknown needs exactly one of {', '.join(DISTRIBUTIONS)} "
                      f"(got {', '.join(dists) or 'none'})")
        dist = dists[0]
        if "nominal" not in node:
            raise bad(f"{dist} needs a nominal value (what `pdsim run` uses), e.g. "
                      f"{{{dist}: ..., nominal: x}}")
        nominal, why = node["nominal"], node.get("why", "")
        if not isinstance(why, str):
            raise bad(f"why must be a short text (the evidence for the range), got {echo(why)}")
        spec = node[dist]
        if dist == "choice":
            if not isinstance(spec, list) or not spec:
                raise bad(f"choice needs a non-empty list of values (got {echo(spec)})")
            for c in spec:
                if isinstance(c, dict | list) or (isinstance(c, float) and not math.isfinite(c)):
                    raise bad(f"choice values must be plain scalars (got {echo(c)})")
            if len(spec) > MAX_CHOICES:
                raise bad(f"choice lists at most {MAX_CHOICES} values (got {len(spec):,}); "
                          f"give a numeric range as uniform: [a, b]")
            if len(set(map(repr, spec))) != len(spec):
                raise bad(f"choice lists a value twice (got {echo(spec)})")
            if nominal not in spec:
                raise bad(f"nominal {echo(nominal)} is not one of the choices {echo(spec)}")
            return cls(path, dist, nominal, choices=tuple(spec), why=why)
        if not (isinstance(spec, list) and len(spec) == 2 and all(map(_num, spec))):
            raise bad(f"{dist} needs [a, b], two finite numbers (got {echo(spec)})")
        a, b = spec
        if not a < b:
            raise bad(f"{dist} needs a < b (got [{_fmt(a)}, {_fmt(b)}])")
        if dist == "loguniform" and a <= 0:
            raise bad(f"loguniform needs 0 < a < b (got [{_fmt(a)}, {_fmt(b)}])")
        if not _num(nominal):
            raise bad(f"nominal must be a number in [{_fmt(a)}, {_fmt(b)}] "
                      f"(got {echo(nominal)})")
        if not a <= nominal <= b:
            raise bad(f"nominal {_fmt(nominal)} is outside the {dist} range "
                      f"[{_fmt(a)}, {_fmt(b)}]")
        return cls(path, dist, nominal, low=a, high=b, why=why)

    def value(self, u: float) -> Any:
        """The value at ``u`` in [0, 1): uniform/loguniform in the range, or a choice.

        Integer fields get integers, each integer of the range equally likely (uniform) or
        equally likely per unit of log (loguniform, rounded).
        """
        u = min(max(float(u), 0.0), math.nextafter(1.0, 0.0))
        if self.dist == "choice":
            return self.choices[int(u * len(self.choices))]
        a, b = self.low, self.high
        if self.dist == "uniform":
            if self.integer:
                lo, hi = math.ceil(a), math.floor(b)
                return int(min(lo + math.floor(u * (hi - lo + 1)), hi))
            return a + u * (b - a)
        x = math.exp(math.log(a) + u * (math.log(b) - math.log(a)))
        return int(min(max(round(x), math.ceil(a)), math.floor(b))) if self.integer else x

    def ends(self) -> list:
        """The values every sample lies between (or the choices)."""
        if self.dist == "choice":
            return list(self.choices)
        if self.integer:
            return [math.ceil(self.low), math.floor(self.high)]
        return [self.low, self.high]

    def checked(self) -> list:
        """The values validated at load time: the ends (or the choices), and every value of an
        integer range of at most :data:`MAX_CHECKED_INTS` (a rule such as heads % tp refuses
        values between two valid ends: kv_heads 4..8 over tp 8 refuses 5, 6 and 7)."""
        ends = self.ends()
        if self.integer and ends[1] - ends[0] < MAX_CHECKED_INTS:
            return list(range(ends[0], ends[1] + 1))
        return ends

    @property
    def numeric(self) -> bool:
        return self.dist != "choice"

    def describe(self) -> str:
        """``uniform [5, 20]`` / ``choice {a, b}`` (what the range is, without the nominal)."""
        if self.dist == "choice":
            return f"choice {{{', '.join(_fmt(c) for c in self.choices)}}}"
        return f"{self.dist} [{_fmt(self.low)}, {_fmt(self.high)}]" + \
            (" (integer)" if self.integer else "")

    def declaration(self) -> dict:
        """The YAML form again (for re-declaring after a model dump)."""
        d: dict = {self.dist: list(self.choices) if self.dist == "choice"
                   else [self.low, self.high], "nominal": self.nominal}
        if self.why:
            d["why"] = self.why
        return d

    def as_dict(self) -> dict:
        """For the JSON summary: path, distribution, range or choices, nominal, why."""
        d: dict = {"path": self.path, "distribution": self.dist, "nominal": self.nominal}
        if self.dist == "choice":
            d["choices"] = list(self.choices)
        else:
            d["range"] = [self.low, self.high]
            d["integer"] = self.integer
        if self.why:
            d["why"] = self.why
        return d


def _walk(node: Any, path: tuple, found: list) -> Any:
    """Replace each declaration under ``node`` by its nominal value; collect the Unknowns."""
    if is_declaration(node):
        dotted = ".".join(map(str, path))
        if path and path[0] in FORBIDDEN:
            raise UnknownError(f"invalid value at '{dotted}': '{path[0]}' cannot be a declared "
                               f"unknown (explore varies seeds with --seeds; reference figures "
                               f"are the report's)")
        u = Unknown.parse(dotted, node)
        found.append(u)
        return u.nominal
    if isinstance(node, dict):
        return {k: _walk(v, (*path, k), found) for k, v in node.items()}
    if isinstance(node, list):
        return [_walk(v, (*path, i), found) for i, v in enumerate(node)]
    return node


def resolve(data: dict) -> tuple[dict, list[Unknown]]:
    """``data`` with every declared unknown at its nominal value, and the unknowns found."""
    found: list[Unknown] = []
    out = _walk(data, (), found)
    return out, found


def _parts(path: str) -> list:
    return [int(p) if p.isdigit() else p for p in path.split(".")]


def get_path(obj: Any, path: str) -> Any:
    """Value at a dotted path in nested dicts/lists or pydantic models (None if absent)."""
    cur = obj
    for p in _parts(path):
        if isinstance(cur, list):
            cur = cur[p] if isinstance(p, int) and p < len(cur) else None
        elif isinstance(cur, dict):
            cur = cur.get(p if p in cur else str(p))
        else:
            cur = getattr(cur, str(p), None)
        if cur is None:
            return None
    return cur


def set_path(data: dict, path: str, value: Any) -> None:
    """Set a dotted path in nested dicts/lists (which must exist)."""
    parts = _parts(path)
    cur: Any = data
    for p in parts[:-1]:
        cur = cur[p] if isinstance(cur, list) else cur[p if p in cur else str(p)]
    last = parts[-1]
    if isinstance(cur, list):
        cur[last] = value
    else:
        cur[last if last in cur else str(last)] = value


def substitute(data: dict, values: dict[str, Any]) -> dict:
    """A copy of resolved ``data`` with the unknowns at ``values`` (path -> value)."""
    out = copy.deepcopy(data)
    for path, v in values.items():
        set_path(out, path, v)
    return out


def _replaced(data: Any, items: list[tuple[list, Any]]) -> Any:
    """``data`` with the value at each path ``parts`` of ``items`` replaced, for a validation
    that only reads it: the containers along the paths are copied once each (a dict keeps its
    class and attributes, e.g. a scenario's context), everything else is shared, where
    ``substitute`` copies it all. (No path is a prefix of another: a declaration is a leaf.)"""
    if len(items) == 1 and not items[0][0]:
        return items[0][1]
    out = copy.copy(data)
    below: dict[Any, list[tuple[list, Any]]] = {}
    for parts, value in items:
        below.setdefault(parts[0], []).append((parts[1:], value))
    for head, sub in below.items():
        key = head if isinstance(out, list) or head in out else str(head)
        out[key] = _replaced(out[key], sub)
    return out


def redeclare(data: dict, unknowns: list[Unknown]) -> dict:
    """Put the declarations back into a resolved dict (so that ``--set`` can pin or edit them)."""
    return substitute(data, {u.path: u.declaration() for u in unknowns})


def finish(data: dict, unknowns: list[Unknown], validated: Any,
           validate: Callable[[dict], Any]) -> list[Unknown]:
    """Type each unknown from the validated nominal scenario, then validate every range end.

    An integer field gets integer samples. Each unknown is checked at both ends of its range
    (each choice; every value of a short integer range, ``Unknown.checked``), so that a sample
    cannot fail validation at run time. While these checks number at most :data:`MAX_CHECKS`,
    each is a validation of its own, the other unknowns at nominal. Beyond that (a file of
    1,000 faults, each with a short integer range, made 64,000 validations of the whole file:
    quadratic), they go in rounds, the k-th value of every unknown in round k, at most
    max(MAX_CHECKED_INTS, MAX_CHOICES) rounds, so validation stays linear in the file; a
    rejected round is bisected to the one unknown whose value is rejected alone (about
    2 log2(unknowns) more validations). Combinations are not what is checked: a round
    rejected only as a whole passes, as a combination of ends does one at a time, and in
    rounds a value rejected alone by a rule across two unknowns may pass with the other's
    value of that round; either then fails, with the same one-line error, when a run
    samples it. Sorted by path: where a scenario declares an unknown (its own file or one it
    extends) does not change the order, so a run directory's scenario.yaml re-runs to the same
    summary.
    """
    typed = []
    for u in unknowns:
        v = get_path(validated, u.path)
        integer = isinstance(v, int) and not isinstance(v, bool) and u.numeric
        typed.append(Unknown(u.path, u.dist, u.nominal, u.low, u.high, u.choices, u.why,
                             integer))
    values = [[x for x in u.checked() if not (x == u.nominal and type(x) is type(u.nominal))]
              for u in typed]
    if sum(map(len, values)) <= MAX_CHECKS:
        rounds = [[(u, x)] for u, xs in zip(typed, values, strict=True) for x in xs]
    else:
        rounds = [[(u, xs[k]) for u, xs in zip(typed, values, strict=True) if k < len(xs)]
                  for k in range(max(map(len, values), default=0))]
    for checks in rounds:
        err = _rejected(data, checks, validate)
        if err is None:
            continue
        while len(checks) > 1:  # the one whose value is rejected alone, if one is
            half = len(checks) // 2
            for part in (checks[:half], checks[half:]):
                alone = _rejected(data, part, validate)
                if alone is not None:
                    checks, err = part, alone
                    break
            else:
                break  # rejected only together
        if len(checks) == 1:
            u, x = checks[0]
            hint = ("; list the allowed values with choice: [...]"
                    if u.integer and x not in u.ends() else "")
            raise UnknownError(f"invalid value at '{u.path}': {u.describe()} includes "
                               f"{_fmt(x)}, which is rejected{hint}: {err}")
    return sorted(typed, key=lambda u: u.path)


def _rejected(data: dict, checks: list[tuple[Unknown, Any]],
              validate: Callable[[dict], Any]) -> ValueError | None:
    """Why ``data`` with each unknown of ``checks`` at its value fails ``validate``, or None."""
    try:
        validate(_replaced(data, [(_parts(u.path), x) for u, x in checks]))  # (only reads)
    except ValueError as err:
        return err
    return None


def block(unknowns: list[Unknown]) -> list[str]:
    """Lines for the human report: each unknown at its nominal value, its range and why."""
    out = []
    for u in unknowns:
        why = f"; why: {u.why}" if u.why else ""
        out.append(f"{u.path} = {_fmt(u.nominal)}  ({u.describe()}{why})")
    return out


# --- JSON Schema ---------------------------------------------------------------------------

_RANGE = {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2}
DECLARATION_SCHEMA = {
    "title": "DeclaredUnknown",
    "description": "A chosen value with its plausible range: pdsim run uses nominal, pdsim "
                   "explore samples the range",
    "type": "object",
    "properties": {
        "uniform": {**_RANGE, "description": "[a, b], a < b"},
        "loguniform": {**_RANGE, "description": "[a, b], 0 < a < b"},
        "choice": {"type": "array", "minItems": 1, "description": "the values to choose from"},
        "nominal": {"description": "the value pdsim run uses (inside the range / a choice)"},
        "why": {"type": "string", "description": "the evidence for the range"},
    },
    "required": ["nominal"],
    "oneOf": [{"required": [d]} for d in DISTRIBUTIONS],
    "additionalProperties": False,
}
_REF = {"$ref": "#/$defs/DeclaredUnknown"}
_META = ("title", "description", "default")


def _is_leaf(node: dict) -> bool:
    if "anyOf" in node:
        opts = [o for o in node["anyOf"] if o.get("type") != "null"]
        return bool(opts) and all(_is_leaf(o) for o in opts)
    return "enum" in node or node.get("type") in ("number", "integer", "boolean")


def _wrap(node: dict) -> dict:
    if not _is_leaf(node):
        if isinstance(node.get("additionalProperties"), dict) and \
                _is_leaf(node["additionalProperties"]):
            return {**node, "additionalProperties": _wrap(node["additionalProperties"])}
        return node
    meta = {k: node[k] for k in _META if k in node}
    core = {k: v for k, v in node.items() if k not in _META}
    options = core["anyOf"] if list(core) == ["anyOf"] else [core]
    return {**meta, "anyOf": [*options, _REF]}


def schema_with_unknowns(schema: dict, skip_defs: tuple = ()) -> dict:
    """``schema`` where every numeric or categorical property also accepts a declaration."""
    schema = copy.deepcopy(schema)
    models = [schema] + [d for name, d in schema.get("$defs", {}).items()
                         if name not in skip_defs]
    for model in models:
        props = model.get("properties", {})
        for key in list(props):
            if model is schema and key in FORBIDDEN:
                continue
            props[key] = _wrap(props[key])
    schema.setdefault("$defs", {})["DeclaredUnknown"] = DECLARATION_SCHEMA
    return schema

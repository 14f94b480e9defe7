"""Scenario format: typed, validated, bounded, with one-line errors that name the key path.

A scenario is YAML or a dict. :func:`load` runs the whole pipeline, and ``pdsim validate`` runs
exactly what ``pdsim run`` runs, so a scenario that validates does not fail at run time:

1. read YAML safely (:func:`read_yaml`): a size limit, strict UTF-8, a bounded loader (no
   duplicate keys, bounded nesting and alias expansion, no over-long integers, safe tags only);
   ``extends:`` merged, every path confined to the scenario's directory tree
   (``pdsim.util.safeio``);
2. apply ``--set`` overrides (:func:`apply_overrides`), parsed with the same loader;
3. pydantic validation (:func:`pdsim.config.scenario.from_dict`): types, and documented bounds
   on every size and interval (the ``MAX_*``/``MIN_*`` constants of :mod:`pdsim.config.units`,
   shown in the JSON Schema and the docs);
4. cross-field checks: each section may define ``check(self, ctx)``, called after validation
   with the validated scenario in ``ctx.scenario``; it raises
   :class:`~pdsim.config.units.Invalid` with a key relative to the section
   (``raise Invalid("decode_rank", "must be < 4 ...", got=7)``) and the message names the full
   path (``faults.1.decode_rank``). Add a ``check`` to a new fault kind or config section to
   get the same treatment;
5. load-time checks owned by other modules (the predictor builds, the KV pool fits, ...):
   register ``fn(scenario, ctx)`` with :func:`pdsim.config.scenario.load_check`; it raises
   ``Invalid`` with a full key path. File checks read through ``pdsim.util.safeio``
   (``ctx.resolve(rel, what)``).

Every user error is a :class:`~pdsim.config.units.ScenarioError` whose ``str()`` is one line;
echoed values are capped and escaped (:func:`pdsim.util.safeio.echo`). Numeric fields use the
aliases of :mod:`pdsim.config.units` (``PosInt``, ``PosFloat``, ...), which reject
``true``/``false`` where a number is expected.
"""


from __future__ import annotations

import copy
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pdsim.config import registry, trace, unknowns
from pdsim.config.registry import BLACKLIST_POLICIES, FAULTS
from pdsim.config.scenario import Scenario, from_dict
from pdsim.config.units import MAX_EXTENDS, MAX_FILE_BYTES, Context, ScenarioError
from pdsim.util import safeyaml
from pdsim.util.safeio import (
    UserFileError,
    clip,
    decode_utf8,
    echo,
    read_user_file,
    resolve_user_path,
    show_path,
)
from pdsim.util.safeyaml import MAX_YAML_DEPTH, MAX_YAML_VALUES

# --- reading YAML safely (pdsim.util.safeyaml) -------------------------------------------------


def parse_yaml(text: str, what: str) -> Any:
    """:func:`pdsim.util.safeyaml.parse_yaml`, its errors as :class:`ScenarioError`."""
    try:
        return safeyaml.parse_yaml(text, what)
    except safeyaml.YamlError as err:
        raise ScenarioError(str(err)) from None


class ScenarioData(dict):
    """A scenario as read from a file: the raw mapping plus where it came from (its
    :class:`Context`), which survives copies and pickling (process pools)."""

    context: Context | None = None


def _with_context(data: dict, ctx: Context | None) -> ScenarioData:
    out = data if isinstance(data, ScenarioData) else ScenarioData(data)
    out.context = ctx
    return out


# Paths (dotted, '*' for any list index) that hold file names; an extends parent's relative
# paths are rewritten to stay relative to the top-level file. Add a key here when the format
# gains a file reference.
PATH_KEYS: list[tuple[str, ...]] = [("clients", "*", "dataset", "path"), ("profiles", "*")]


def _rebase_paths(data: Any, src_dir: Path, top_dir: Path) -> None:
    if src_dir == top_dir:
        return

    def visit(node: Any, keys: tuple[str, ...]) -> None:
        if not keys:
            return
        head, rest = keys[0], keys[1:]
        items = (list(enumerate(node)) if head == "*" and isinstance(node, list) else
                 [(head, node.get(head))] if isinstance(node, dict) and head in node else [])
        for k, v in items:
            if not rest:
                if isinstance(v, str) and v and not Path(v).is_absolute():
                    node[k] = os.path.relpath(src_dir / v, top_dir)
            else:
                visit(v, rest)

    for keys in PATH_KEYS:
        visit(data, keys)


def read_yaml(path: str | Path, _seen: tuple = (), *, allow_outside_paths: bool = False,
              _ctx: Context | None = None, _via: str = "scenario file") -> ScenarioData:
    """Read a scenario file safely; ``extends: other.yaml`` (relative to this file, inside the
    scenario's directory tree) is merged under it."""
    p = Path(path)
    what = show_path(p) if _ctx is None else show_path(p.name)
    try:
        if _ctx is None:
            top = p.parent.resolve()
            _ctx = Context(top, top, allow_outside_paths)
        raw = read_user_file(p, _via, MAX_FILE_BYTES)
        text = decode_utf8(raw, what)
        _ctx.files.append((p.resolve(), "scenario file" if not _seen and _via == "scenario file"
                           else "extends: parent"))
    except UserFileError as err:
        raise ScenarioError(str(err)) from None
    except (OSError, RuntimeError, ValueError):
        raise ScenarioError(f"scenario file: not a usable path: {what}") from None
    data = parse_yaml(text, what)
    data = data if data is not None else {}
    declares = isinstance(data, dict) and "reference" in data
    if isinstance(data, dict) and "extends" in data:
        parent = data.pop("extends")
        if len(_seen) >= MAX_EXTENDS:
            raise ScenarioError(f"{what}: 'extends' chain longer than {MAX_EXTENDS} files")
        try:
            ppath = resolve_user_path(p.parent, parent, f"{what}: 'extends'",
                                      _ctx.allow_outside, _ctx.root)
        except UserFileError as err:
            raise ScenarioError(str(err)) from None
        if ppath in (*_seen, p.resolve()):
            raise ScenarioError(f"{what}: 'extends' loops back to {show_path(ppath.name)}")
        base = read_yaml(ppath, (*_seen, p.resolve()), _ctx=_ctx, _via=f"{what}: 'extends'")
        if not isinstance(base, dict):
            raise ScenarioError(f"{what}: 'extends' file {show_path(parent)} is not a scenario "
                                f"(its top level is not a mapping)")
        _rebase_paths(base, ppath.parent, p.parent.resolve())
        data = _merge(base, data)
    if declares:  # (its figures: a parent's, by its name; the top file's own, "")
        _ctx.reference_owner = str(data.get("name", "scenario")) if _seen else ""
    if not isinstance(data, dict):
        return data  # from_dict says it must be a mapping
    return _with_context(data, _ctx)


def _merge(base: dict, over: dict, top: bool = True) -> dict:
    """Deep-merge ``over`` into ``base``: mappings merge, everything else (lists too) replaces.
    A ``blacklist`` that names another policy keeps only the base's keys that policy has
    (:func:`switch_entry`)."""
    out = dict(base)
    for k, v in over.items():
        leaf = unknowns.is_declaration(v) or unknowns.is_declaration(out.get(k))
        if isinstance(v, dict) and isinstance(out.get(k), dict) and not leaf:
            old = out[k]
            if top and k in _SWITCHED:
                reg = _SWITCHED[k]
                old = switch_entry(old, reg, v.get(reg.key, _entry_name(old, reg)))
            out[k] = _merge(old, v, False)
        else:
            out[k] = v
    return out


# Sections that name a registered entry (``blacklist: {policy: ...}``), by their top-level key;
# the items of ``faults:`` are one too, when a --set names another kind (``faults.0.kind=...``)
_SWITCHED = {"blacklist": BLACKLIST_POLICIES}


def _entry_name(section: dict, reg: registry.Registry) -> Any:
    """The entry a section names: its key, else its preset's, else the registry's default."""
    if reg.key in section:
        return section[reg.key]
    preset = section.get("preset")
    if isinstance(preset, str) and preset in reg.presets:
        return reg.presets[preset][0].get(reg.key)
    return reg.default


def switch_entry(section: dict, reg: registry.Registry, name: Any,
                 given: Iterable[str] = ()) -> dict:
    """``section`` (of entry ``_entry_name(section)``) made over to entry ``name``: when that is
    another entry, the keys it has no parameter for are dropped (they were the old entry's:
    ``strikes`` of a strikes policy under ``--set blacklist.policy=never``); the keys it shares
    are kept, and so are the keys in ``given`` (the user's own, for validation to judge). An
    unknown name is left for validation to report."""
    if not isinstance(name, str) or name == _entry_name(section, reg) or name not in reg:
        return section
    keep = set(reg.get(name).model.model_fields) | set(given)
    return {k: v for k, v in section.items() if k in keep}


def apply_overrides(data: dict, sets: list[str]) -> dict:
    """Apply ``dotted.key=value`` overrides; values are parsed as YAML (bounded loader)."""
    ctx = getattr(data, "context", None)
    data = copy.deepcopy(dict(data))
    given: set[tuple[str, ...]] = set()  # the keys these overrides set, in order
    for item in sets:
        if not isinstance(item, str) or "=" not in item:
            raise ScenarioError(f"--set expects dotted.key=value, got {echo(item)}")
        key, raw = item.split("=", 1)
        shown = clip(key, 80)
        parts = key.split(".")
        if not key or any(not p for p in parts):
            raise ScenarioError(f"--set {shown}: a dotted key has no empty parts, e.g. "
                                f"clients.0.num_prompts=200")
        if len(parts) > MAX_YAML_DEPTH:  # (a file's limit; the walks after this recurse)
            raise ScenarioError(f"--set {shown}: a key {len(parts)} levels deep; a scenario "
                                f"nests at most {MAX_YAML_DEPTH} levels")
        value = parse_yaml(raw, f"--set {shown}") if raw.strip() else None
        cur: Any = data
        for i, part in enumerate(parts[:-1]):
            nxt = parts[i + 1]
            here = ".".join(parts[: i + 1])
            if isinstance(cur, list):
                if not part.isdigit() or int(part) >= len(cur):
                    raise ScenarioError(f"--set {shown}: '{clip(here, 80)}' is not an index "
                                        f"into a list of {len(cur)}")
                child = cur[int(part)]
                if child is None:
                    child = cur[int(part)] = [] if nxt.isdigit() else {}
            elif isinstance(cur, dict):
                child = cur.get(part)
                if child is None:
                    child = cur[part] = [] if nxt.isdigit() else {}
            else:
                raise ScenarioError(f"--set {shown}: '{clip('.'.join(parts[:i]), 80)}' is a "
                                    f"{type(cur).__name__} ({echo(cur)}), not a mapping or list")
            cur = child
        last = parts[-1]
        if isinstance(cur, list):
            if not last.isdigit() or int(last) > len(cur):
                raise ScenarioError(f"--set {shown}: {echo(last)} is not an index into a list "
                                    f"of {len(cur)} (use {len(cur)} to append)")
            if int(last) == len(cur):
                cur.append(value)
            else:
                cur[int(last)] = value
        elif isinstance(cur, dict):
            reg = _switched_at(parts)
            if reg is not None and last == reg.key:  # another policy or fault kind: its keys,
                # and those an earlier --set gave (kept, for validation to judge)
                at = tuple(parts[:-1])
                kept = switch_entry(cur, reg, value, [k[-1] for k in given if k[:-1] == at])
                if kept is not cur:
                    cur.clear()
                    cur.update(kept)
            cur[last] = value
            given.add(tuple(parts))
        else:
            raise ScenarioError(f"--set {shown}: '{clip('.'.join(parts[:-1]), 80)}' is a "
                                f"{type(cur).__name__} ({echo(cur)}), not a mapping or list")
    _nesting(data)  # a key and its value within a file's limits together, as a file is
    return _with_context(data, ctx)


def _switched_at(parts: list[str]) -> registry.Registry | None:
    """The registry whose entry the dotted key ``parts`` lies in (``blacklist.x``,
    ``faults.N.x``), if any."""
    if len(parts) == 2 and parts[0] in _SWITCHED:
        return _SWITCHED[parts[0]]
    if len(parts) == 3 and parts[0] == "faults" and parts[1].isdigit():
        return FAULTS
    return None


def _nesting(data: Any) -> None:
    """A dict given in Python is held to a YAML file's limits on nesting (a self-referring one
    never ends) and on values (a list holding itself twice, 40 deep, is 2^40 of them),
    iteratively: walking it recursively is what would overflow."""
    stack = [(data, 1, "")]
    seen = 0  # values visited, shared ones each time (as YAML counts an alias's expansion)
    while stack:
        node, depth, path = stack.pop()
        seen += 1
        if seen > MAX_YAML_VALUES:
            raise ScenarioError(f"the scenario holds more than {MAX_YAML_VALUES:,} values "
                                f"(shared ones counted each time they appear)")
        if depth > MAX_YAML_DEPTH:
            raise ScenarioError(f"the scenario is nested deeper than {MAX_YAML_DEPTH} levels "
                                f"(or refers to itself) at '{clip(path, 120)}'")
        if isinstance(node, dict):
            stack.extend((v, depth + 1, f"{path}.{k}" if path else str(k))
                         for k, v in node.items())
        elif isinstance(node, list | tuple):
            stack.extend((v, depth + 1, f"{path}.{i}") for i, v in enumerate(node))


def as_data(source: str | Path | dict, allow_outside_paths: bool = False,
            _dumped: bool = False) -> Any:
    """The raw scenario mapping of a path or dict, carrying where its paths resolve (a dict:
    its own context if read from a file, else the current directory). ``_dumped``: the dict
    of a validated Scenario (its defaults filled in: not held to a file's value count)."""
    if isinstance(source, dict):
        if not _dumped:
            _nesting(source)
        ctx = getattr(source, "context", None) or Context.cwd()
        ctx = Context(ctx.base_dir, ctx.root, ctx.allow_outside or allow_outside_paths,
                      files=list(ctx.files), reference_owner=ctx.reference_owner)
        data = dict(source)
        if "extends" in data:  # as in a file, relative to where the dict's paths resolve
            parent = data.pop("extends")
            try:
                ppath = resolve_user_path(ctx.base_dir, parent, "'extends'", ctx.allow_outside,
                                          ctx.root)
            except UserFileError as err:
                raise ScenarioError(str(err)) from None
            base = read_yaml(ppath, _ctx=ctx, _via="'extends'")
            if not isinstance(base, dict):
                raise ScenarioError(f"'extends' file {show_path(parent)} is not a scenario "
                                    f"(its top level is not a mapping)")
            _rebase_paths(base, ppath.parent, Path(ctx.base_dir).resolve())
            data = _merge(dict(base), data)
            if "reference" in source:  # (its own figures)
                ctx.reference_owner = ""
        return _with_context(data, ctx)
    return read_yaml(source, allow_outside_paths=allow_outside_paths)


def load(source: str | Path | dict | Scenario, sets: list[str] | None = None, *,
         allow_outside_paths: bool = False) -> Scenario:
    """Load a scenario from a YAML path, a dict or a Scenario, applying ``--set`` overrides.

    Paths in the scenario (``extends:``, trace files) resolve relative to the scenario file
    (for a dict: the current directory) and must stay in that directory tree unless
    ``allow_outside_paths``. Declared unknowns (``{uniform: [a, b], nominal: x}``,
    pdsim/config/unknowns.py) are resolved to their nominal values after the overrides and before
    validation; ``Scenario.unknowns`` lists them.
    """
    if not isinstance(source, str | os.PathLike | dict | Scenario):
        raise ScenarioError(f"a scenario is a YAML path, a dict or a Scenario, not "
                            f"{type(source).__name__}")
    if sets is not None and (isinstance(sets, str | bytes)
                             or not all(isinstance(x, str) for x in sets)):
        raise ScenarioError(f"sets: a list of 'dotted.key=value' strings, e.g. ['seed=2'] "
                            f"(got {echo(sets)})")
    origin, before, inherits, dumped, owner = None, (), "", False, None
    if isinstance(source, Scenario):
        ctx = source._context
        if not sets and ctx is not None and (ctx.allow_outside or not allow_outside_paths):
            return source
        origin, before, inherits = source._source, source._overrides, source._inherits
        owner = source._reference_owner
        dumped = True
        ctx = ctx or Context.cwd()
        source = _with_context(unknowns.redeclare(source.model_dump(mode="json"),
                                                  source.unknowns), ctx)
    elif not isinstance(source, dict):
        origin = str(source)
    elif "extends" in source and "reference" not in source:
        inherits = clip(str(source["extends"]), 80)
    data = as_data(source, allow_outside_paths, _dumped=dumped)
    ctx = getattr(data, "context", None)
    if sets:
        data = apply_overrides(data, sets)
    try:
        resolved, declared = unknowns.resolve(data)
    except unknowns.UnknownError as err:
        raise ScenarioError(str(err)) from None
    data = _with_context(resolved, ctx) if isinstance(resolved, dict) else resolved
    sc = from_dict(data)
    if declared:
        try:
            sc._unknowns = unknowns.finish(data, declared, sc, from_dict)
        except unknowns.UnknownError as err:
            raise ScenarioError(str(err)) from None
    sc._source, sc._overrides = origin, (*before, *(sets or ()))
    sc._inherits = inherits
    sc._reference_owner = (owner if owner is not None
                           else getattr(ctx, "reference_owner", "") if ctx is not None else "")
    return sc


def limit_modules() -> tuple:
    """The modules whose ``MAX_*``/``MIN_*`` constants are the documented limits."""
    from pdsim.config import profile_schema, units, unknowns
    from pdsim.util import backends, safeio

    return units, safeyaml, trace, profile_schema, unknowns, safeio, backends


def limits() -> dict[str, float]:
    """The documented limits, by name (the docs' table, docs/reference/scenario.md, is
    generated from it): the scenario's (:mod:`pdsim.config.units`), and those of the modules
    that read files (YAML, traces, profiles, paths) or fan runs out."""
    out = {}
    for space in (vars(m) for m in limit_modules()):
        out.update((k, v) for k, v in space.items()
                   if k.startswith(("MAX_", "MIN_")) and isinstance(v, (int, float)))
    return out


def json_schema() -> dict:
    """JSON Schema of a scenario file, for editors (yaml-language-server, VS Code).

    A file may ``extends:`` another, which can supply any top-level key, so the editor schema
    allows ``extends`` and requires nothing at the top; ``pdsim validate`` checks the merged
    scenario in full. Numeric and categorical values also accept a declared unknown.
    """
    schema = unknowns.schema_with_unknowns(
        registry.hoist(Scenario.model_json_schema()), skip_defs=("ReferenceFigure", "Seeds"))
    schema["properties"]["extends"] = {
        "type": "string", "title": "Extends",
        "description": "Scenario file (relative to this one, inside its directory tree) merged "
                       "under this one"}
    schema.pop("required", None)
    return schema

"""One registry per kind of policy: a name -> (implementation, parameter model).

A registry drives three things from one place, so a policy registered by a user works everywhere
a built-in one does:

- validation of its scenario section (``blacklist: {policy: ttl, ttl_s: 60}``): the policy's
  parameter model checks the other keys, and errors keep their dotted key path
  (``blacklist.ttl_s``);
- the JSON Schema (``pdsim schema``), built from the entries registered when it is asked for;
- construction (``REGISTRY.get(name).impl``).

Kinds: ``BLACKLIST_POLICIES`` (``blacklist:``), ``FAULTS`` (items of ``faults:``), and the
switches of ``disaggregation:`` (``PD_PATHS``, a :class:`SwitchRegistry`: every switch is set
at once, each defaulting to the value of the release in ``engine.version``). Built-in entries
register when their module (``pdsim.engine.blacklist``, ``pdsim.engine.faults`` with
``pdsim.engine.faults_pd``, ``pdsim.config.pd_paths``) is imported.

    from pdsim.config.registry import BLACKLIST_POLICIES
    from pdsim.config.units import Seconds

    @BLACKLIST_POLICIES.register("my_policy")
    class MyPolicy(pdsim.engine.blacklist.Policy):
        class Params(pdsim.engine.blacklist.Params):   # a scenario section
                                                       # (pdsim.config.units.Strict)
            hold_s: Seconds = 10.0
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model
from pydantic_core import InitErrorDetails, PydanticCustomError, core_schema

from pdsim.util.safeio import clip


class Params(BaseModel):
    """Base of every registered parameter model: unknown keys are errors, defaults validated."""

    model_config = ConfigDict(extra="forbid", validate_default=True)


@dataclass(frozen=True)
class Entry:
    name: str
    impl: Any
    model: type[Params]  # the parameter model, with the registry's key as a Literal field
    doc: str


def _error(loc: tuple, kind: str, msg: str, value: Any) -> ValidationError:
    return ValidationError.from_exception_data("pdsim", [InitErrorDetails(
        type=PydanticCustomError(kind, msg), loc=loc, input=value)])


_REGISTRIES: dict[str, Registry] = {}  # kind -> its registry, for unpickling (_registered)


def _registered(kind: str, name: str) -> Params:
    """A bare instance of entry ``name``'s parameter model, filled in by pickle from the state
    it saved. The models are made at registration, so pickle cannot find them by module
    attribute: it finds them through their registry (a user's entry needs its plugin loaded)."""
    model = _REGISTRIES[kind].get(name).model
    return model.__new__(model)


def _reduce(self: Params) -> tuple:
    model = type(self)
    return _registered, (model._pdsim_kind, model._pdsim_name), self.__getstate__()


class Registry:
    """Named entries of one kind; ``key`` is the field naming the entry (``policy``, ``kind``)."""

    def __init__(self, kind: str, key: str, default: str | None = None,
                 builtins: str | None = None, owner_hint: bool = False) -> None:
        self.kind = kind
        self.key = key
        self.default = default
        # an unknown key names the entries that have it: a policy is switched by its key and
        # its new parameters (``--set blacklist.ttl_s=5`` alone meant ``policy: ttl``); a fault
        # is not (``duration_s`` on a crash wants ``restart_after_s``, not another kind)
        self.owner_hint = owner_hint
        self.builtins = builtins  # module registering the built-in entries, imported on first use
        self._entries: dict[str, Entry] = {}
        self._presets: dict[str, tuple[dict[str, Any], str]] = {}
        self.renamed: dict[str, str] = {}  # old key -> what to write instead
        _REGISTRIES[kind] = self

    def _ensure(self) -> None:
        if self.builtins is not None:
            module, self.builtins = self.builtins, None
            importlib.import_module(module)

    @property
    def presets(self) -> dict[str, tuple[dict[str, Any], str]]:
        """Named parameter sets (``{preset: name}``): name -> (spec, why these values)."""
        self._ensure()
        return self._presets

    # --- registration ------------------------------------------------------------------------

    def register(self, name: str, params: type[Params] | None = None) -> Callable[[Any], Any]:
        """Class decorator: register ``impl`` under ``name`` with ``params`` (default: its
        ``Params`` attribute). Registering a name again replaces the entry (last one wins)."""

        def deco(impl: Any) -> Any:
            base = params or getattr(impl, "Params", None)
            if base is None or not (isinstance(base, type) and issubclass(base, BaseModel)):
                raise TypeError(f"{self.kind} {name!r}: give a pydantic parameter model "
                                f"(params=... or a nested class Params)")
            doc = (impl.__doc__ or base.__doc__ or "").strip().split("\n\n")[0]
            doc = " ".join(doc.split()).replace("``", "")
            model = create_model(  # in the module of its base, where its annotations resolve
                f"{base.__name__}_{name}", __base__=base, __doc__=doc or None,
                __module__=base.__module__,
                **{self.key: (Literal[name], Field(name, description=f"{self.kind}: {name}"))})
            model._pdsim_kind, model._pdsim_name = self.kind, name
            model.__reduce__ = _reduce  # (pickle by registry, not module attribute)
            self._entries[name] = Entry(name, impl, model, doc)
            return impl

        return deco

    def unregister(self, name: str) -> None:
        self._entries.pop(name, None)

    def add_preset(self, name: str, spec: dict[str, Any], doc: str = "") -> None:
        """A named, complete set of parameters (``{preset: name}`` in a scenario; other keys
        given beside it override the preset's)."""
        if spec.get(self.key) not in self._entries:
            raise KeyError(f"preset {name!r}: unknown {self.kind} {spec.get(self.key)!r}")
        self._presets[name] = (dict(spec), doc)

    # --- lookup ------------------------------------------------------------------------------

    def names(self) -> list[str]:
        self._ensure()
        return list(self._entries)

    def __contains__(self, name: object) -> bool:
        self._ensure()
        return name in self._entries

    def get(self, name: str) -> Entry:
        self._ensure()
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(f"unknown {self.kind} {name!r}; allowed: "
                           f"{', '.join(self._entries)}") from None

    def entries(self) -> list[Entry]:
        self._ensure()
        return list(self._entries.values())

    # --- validation ----------------------------------------------------------------------------

    def validate(self, data: Any) -> Params:
        """A mapping (or an already validated model) -> the entry's parameter model instance."""
        self._ensure()
        if isinstance(data, BaseModel):
            name = getattr(data, self.key, None)
            if name in self._entries and isinstance(data, self._entries[name].model):
                return data
            data = data.model_dump()
        if not isinstance(data, dict):
            raise PydanticCustomError("mapping", f"must be a mapping with '{self.key}'")
        if "preset" in data:
            data = self._expand(data)
        for old, hint in self.renamed.items():
            if old in data:
                raise _error((old,), "renamed_key", hint, data[old])
        name = data.get(self.key, self.default)
        if name is None:
            raise _error((self.key,), "missing", f"missing required key; give one of: "
                         f"{', '.join(self._entries)}", data)
        if not isinstance(name, str) or name not in self._entries:  # (a list: unhashable)
            raise _error((self.key,), "unknown_entry", f"unknown {self.kind} {name!r}; "
                         f"allowed: {', '.join(map(repr, self._entries))}", name)
        model = self._entries[name].model
        try:
            return model.model_validate({**data, self.key: name})
        except ValidationError as err:
            raise self._explain(err, name, model) from None

    def _expand(self, data: dict) -> dict:
        preset = data["preset"]
        if not isinstance(preset, str) or preset not in self.presets:
            raise _error(("preset",), "unknown_entry", f"unknown {self.kind} preset {preset!r}; "
                         f"allowed: {', '.join(map(repr, self.presets))}", preset)
        spec = self.presets[preset][0]
        over = {k: v for k, v in data.items() if k != "preset"}
        if self.key in over and over[self.key] != spec[self.key]:
            raise _error((self.key,), "preset_kind", f"preset {preset!r} is a "
                         f"{spec[self.key]!r}; leave '{self.key}' out", over[self.key])
        return {**spec, **over}

    def _explain(self, err: ValidationError, name: str, model: type[Params]) -> ValidationError:
        """Unknown keys name the entry and its allowed keys; other errors pass through."""
        details = []
        for e in err.errors():
            if e["type"] == "extra_forbidden":
                allowed = ", ".join(k for k in model.model_fields if k != self.key)
                owners = [x.name for x in self._entries.values() if self.owner_hint
                          and e["loc"] and e["loc"][-1] in x.model.model_fields]
                hint = (f"; it belongs to {self.kind} {' or '.join(map(repr, owners))}: set "
                        f"'{self.key}' to {'it' if len(owners) == 1 else 'one of them'}"
                        if owners else "")
                kind = PydanticCustomError(
                    "unknown_key", "not a parameter of {kind} '{name}'; allowed keys here: "
                    "{allowed}{hint}", {"kind": self.kind, "name": name,
                                        "allowed": allowed or "none", "hint": hint})
                details.append(InitErrorDetails(type=kind, loc=tuple(e["loc"]),
                                                input=e["input"]))
            else:
                ctx = e.get("ctx")
                if e["type"] == "value_error":
                    kind = PydanticCustomError("value_error", e["msg"].removeprefix(
                        "Value error, "))
                    details.append(InitErrorDetails(type=kind, loc=tuple(e["loc"]),
                                                    input=e["input"]))
                else:
                    d = InitErrorDetails(type=e["type"], loc=tuple(e["loc"]), input=e["input"])
                    if ctx:
                        d["ctx"] = ctx
                    details.append(d)
        return ValidationError.from_exception_data("pdsim", details)

    # --- pydantic field and JSON Schema -------------------------------------------------------

    def field(self) -> Any:
        """An annotation marker: a pydantic field validated (and described) by this registry."""
        return _annotation(self.validate, self.json_schema, {})

    def json_schema(self, handler: Any = None) -> dict:
        """``oneOf`` the entries' parameter schemas, told apart by ``key``."""
        self._ensure()
        alts = []
        for e in self._entries.values():
            if handler is not None:
                ref = handler(e.model.__pydantic_core_schema__)
                s = handler.resolve_ref_schema(ref) if "$ref" in ref else ref
            else:
                ref = s = e.model.model_json_schema()
            s["title"] = e.name
            if e.doc:
                s["description"] = e.doc
            if e.name == self.default:  # the key may be left out for the default entry
                s["required"] = [k for k in s.get("required", []) if k != self.key]
            else:
                s["required"] = sorted({*s.get("required", []), self.key})
            alts.append(ref)
        if self.presets:
            alts.append({"type": "object", "title": "preset",
                         "description": "a named preset; other keys override its values",
                         "properties": {"preset": {
                             "enum": list(self.presets),
                             "description": f"Name of a {self.kind} preset (its keys, then "
                                            f"these, apply)"}},
                         "required": ["preset"]})
        return {"oneOf": alts, "description": f"{self.kind}: one of "
                f"{', '.join(self._entries)}; '{self.key}' selects it", HOIST: self.key}


HOIST = "x-pdsim-registry"


def hoist(schema: dict) -> dict:
    """Move the registries' inline alternatives into ``$defs`` (``<key>_<name>``), where
    editors and ``pdsim.config.unknowns.schema_with_unknowns`` treat them as any other model."""
    defs = schema.setdefault("$defs", {})

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            key = node.pop(HOIST, None)
            if key is not None:
                for i, alt in enumerate(node["oneOf"]):
                    if "$ref" not in alt and alt.get("title") and "properties" in alt and \
                            key in alt["properties"]:
                        name = f"{key}_{alt['title']}"
                        defs[name] = alt
                        node["oneOf"][i] = {"$ref": f"#/$defs/{name}"}
            for v in list(node.values()):
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk({k: v for k, v in schema.items() if k != "$defs"})
    return schema


BLACKLIST_POLICIES = Registry("blacklist policy", "policy", default="permanent",
                              builtins="pdsim.engine.blacklist", owner_hint=True)
FAULTS = Registry("fault kind", "kind", builtins="pdsim.engine.faults_pd")  # (and .faults)


# --- switches: behaviours that changed across releases, each its own key -----------------------


@dataclass(frozen=True)
class Switch:
    """One registered switch: its value type, its default per release, and where it comes from
    (``sglang``: the SGLang flag, environment variable or PR it stands for)."""

    name: str
    annotation: Any
    default: Callable[[str], Any]  # release (pdsim.config.engine_version) -> its default
    description: str
    sglang: str
    by_version: str  # the defaults across releases, as the schema and the report say them


class SwitchRegistry:
    """Switches of one section, all set at once (unlike a :class:`Registry`, whose entries are
    alternatives): each a key of the section whose default depends on the release
    (``engine.version``). A scenario sets the ones it wants; the rest take the release's value
    (:meth:`resolve`). Registering drives validation and the JSON Schema, as for the other
    registries: the section's model is built from the entries registered when it is needed.
    """

    def __init__(self, kind: str, section: str, builtins: str | None = None) -> None:
        self.kind = kind
        self.section = section
        self.builtins = builtins
        self._entries: dict[str, Switch] = {}
        self._model: tuple[tuple[str, ...], type[Params]] | None = None

    def _ensure(self) -> None:
        if self.builtins is not None:
            module, self.builtins = self.builtins, None
            importlib.import_module(module)

    def register(self, name: str, annotation: Any, default: Callable[[str], Any],
                 description: str, sglang: str, by_version: str) -> None:
        """Add (or replace) switch ``name``; ``default(version)`` gives its value in a release."""
        self._entries[name] = Switch(name, annotation, default, description, sglang,
                                     by_version)
        self._model = None

    def entries(self) -> list[Switch]:
        self._ensure()
        return list(self._entries.values())

    def model(self) -> type[Params]:
        """The section's model: every switch optional (None: the release's default)."""
        self._ensure()
        names = tuple(self._entries)
        if self._model is None or self._model[0] != names:
            fields = {s.name: (s.annotation | None, Field(
                None, description=f"{s.description} SGLang: {s.sglang}. Default by "
                f"engine.version: {s.by_version}")) for s in self._entries.values()}
            model = create_model(f"{self.section.title()}Switches", __base__=Params,
                                 __doc__=f"{self.kind}: each key unset takes the value of the "
                                 f"release in engine.version", **fields)
            model.check = lambda self, ctx: None  # (a section: pdsim.config.scenario.check)
            model._pdsim_kind = self.section
            model.__reduce__ = _reduce_switches  # (pickle by registry, not module attribute)
            self._model = (names, model)
        return self._model[1]

    def validate(self, data: Any) -> Params:
        model = self.model()
        if isinstance(data, model):
            return data
        if isinstance(data, BaseModel):
            data = data.model_dump()
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise PydanticCustomError("mapping", "must be a mapping of switches")
        return model.model_validate(data)

    def resolve(self, section: Any, version: str) -> dict[str, Any]:
        """Every switch's value in release ``version``, the section's own where it sets one."""
        out = {}
        for s in self.entries():
            v = getattr(section, s.name, None) if section is not None else None
            out[s.name] = s.default(version) if v is None else v
        return out

    def field(self) -> Any:
        """An annotation marker: a pydantic field validated and described by this registry."""
        def schema(handler: Any) -> dict:
            ref = handler(self.model().__pydantic_core_schema__)
            return handler.resolve_ref_schema(ref) if "$ref" in ref else ref

        return _annotation(self.validate, schema, {"exclude_none": True})


_SWITCHES: dict[str, SwitchRegistry] = {}  # section -> its registry, for unpickling


def _switches(section: str) -> Params:
    """A bare instance of ``section``'s switch model (as :func:`_registered`)."""
    model = _SWITCHES[section].model()
    return model.__new__(model)


def _reduce_switches(self: Params) -> tuple:
    return _switches, (type(self)._pdsim_kind,), self.__getstate__()


PD_PATHS = SwitchRegistry("PD timeout and abort paths", "disaggregation",
                          builtins="pdsim.config.pd_paths")
_SWITCHES[PD_PATHS.section] = PD_PATHS


def load_plugin(spec: str) -> None:
    """Import a module that registers entries: a ``.py`` file path (read only because the user
    named it), or a module or package name as ``import NAME`` finds it on the Python path.

    A folder is not a plugin: a name that only a folder without ``__init__.py`` matches (a
    namespace package: no code, so nothing registered) is refused, and so is a folder path
    that is no module, rather than imported as nothing or reported as a missing module."""
    if spec.endswith(".py"):
        path = Path(spec)
        if not path.is_file():
            raise ValueError(f"plugin file not found: {spec}")
        name = f"pdsim_plugin_{path.stem}"
        if name in sys.modules:
            return
        mod_spec = importlib.util.spec_from_file_location(name, path)
        if mod_spec is None or mod_spec.loader is None:
            raise ValueError(f"cannot import plugin {spec}")
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[name] = module
        try:
            mod_spec.loader.exec_module(module)
        except Exception as err:  # a user's module: report it in one line
            del sys.modules[name]
            raise ValueError(f"plugin {spec} failed to import: {type(err).__name__}: "
                             f"{err}") from None
        return
    if not spec or spec.startswith("."):  # (import_module: ValueError, TypeError)
        raise ValueError(f"plugin {spec!r}: give a module name (pkg.module) or a .py file")
    folder = ("; give a .py file or a module on the Python path, not a folder"
              if Path(spec).is_dir() else "")
    try:
        module = importlib.import_module(spec)
    except ImportError as err:
        raise ValueError(f"plugin {spec!r} not importable: {err}{folder}") from None
    except Exception as err:  # a user's module: one line, as a .py file's (not a pdsim bug)
        raise ValueError(f"plugin {spec!r} failed to import: {type(err).__name__}: "
                         f"{err}") from None
    if getattr(module, "__file__", None) is None and hasattr(module, "__path__"):
        sys.modules.pop(spec, None)  # (nothing ran: a namespace package is only its folders)
        where = clip(", ".join(map(str, module.__path__)), 160)
        raise ValueError(f"plugin {spec!r} is a folder without __init__.py ({where}): importing "
                         f"it runs no code and registers nothing; give a .py file, or a module "
                         f"or package (with __init__.py) on the Python path")


def _annotation(validate: Any, schema: Any, dump: dict) -> Any:
    """A pydantic annotation marker for a registry's field: ``validate`` checks a value (and
    makes its model), ``schema(handler)`` describes it in the JSON Schema, and the value is
    serialised by its model's ``model_dump(mode="json", **dump)``."""

    class _Field:
        @classmethod
        def __get_pydantic_core_schema__(cls, _source: Any, _handler: Any) -> Any:
            return core_schema.no_info_plain_validator_function(
                validate, serialization=core_schema.plain_serializer_function_ser_schema(
                    lambda v: v.model_dump(mode="json", **dump), when_used="always"))

        @classmethod
        def __get_pydantic_json_schema__(cls, _core: Any, handler: Any) -> dict:
            return schema(handler)

    return _Field

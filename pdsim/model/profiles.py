"""GPU, model and engine profiles: shipped data files, user profile files, overrides.

A scenario names a GPU, a model and an engine (``fleet.gpu``, ``fleet.model``,
``fleet.engine``). Their values are resolved in this order, later wins:

1. the shipped files ``pdsim/model/data/{gpus,models,engines}.yaml``;
2. user profile files (the scenario's ``profiles:`` list), in order: they add entries or change
   fields of existing ones (``gpus:``, ``models:``, ``engines:`` sections; an entry may
   ``extends: <name>`` another);
3. the calibration for (GPU, model, engine): shipped ``calibrations.yaml``, then the files'
   ``calibrations:`` (what ``pdsim calibrate`` writes); at most one per combination. A
   calibration attaches to a GPU architecture (``die``) and to a model or its family
   (``family:``, the model profile's ``family``): the most specific one applies, first one
   for the model itself (fitted on this very GPU, then one written for its die ``die: GH100``,
   then one fitted on another GPU of the same die, the first by name), then one for its family
   in the same order. Its values are achieved fractions of peak and fixed costs, so on a
   sibling part they scale with that part's own peaks. A calibration may say which layout it
   holds for (``layout: {moe_a2a_backend: deepep, dp_attention: true}``: what it was fitted
   on); it then applies to a role of that layout only (:func:`for_role`), and the next most
   specific one to the others;
4. the scenario's inline overrides ``gpu:``, ``model:``, ``engine:`` (``--set gpu.hbm_tbps=3``
   writes there).

Every value keeps where it came from (its file and source note); ``pdsim profiles`` prints it.
Values are validated with pydantic: unknown fields, wrong types and non-finite or out-of-range
numbers are one-line :class:`ProfileError` messages naming the key path.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from dataclasses import field as dc_field
from functools import cache, lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from pdsim.config.profile_schema import (
    GPU,
    KINDS,
    MAX_PROFILE_BYTES,
    RENAMED,
    SECTION,
    Engine,
    Model,
    ProfileError,
    _Profile,
)
from pdsim.util.safeio import UserFileError, decode_utf8, echo, read_user_file, show_path
from pdsim.util.safeyaml import YamlError, parse_yaml

# --- files ---------------------------------------------------------------------------------


@dataclass
class Entry:
    """One profile entry while merging: field -> (value, origin)."""

    values: dict[str, tuple[Any, str]]


@dataclass
class Catalog:
    """Every entry known to a scenario, with origins, plus calibrations (keyed by (GPU name,
    model, engine): ``"die:" + die`` for one written for a die, ``"family:" + family`` for one
    written for a model family), and the layout each holds for (none: any)."""

    entries: dict[str, dict[str, Entry]]  # section -> name -> entry
    calibrations: dict[tuple[str, str, str], dict[str, tuple[Any, str]]]
    notes: dict[tuple[str, str, str], str] = dc_field(default_factory=dict)  # calibration -> note
    layouts: dict[tuple[str, str, str], tuple] = dc_field(default_factory=dict)

    def names(self, section: str) -> list[str]:
        return sorted(self.entries[section])


def _strip(item: Any) -> Any:
    """Nested ``{value, source}`` leaves to plain values (the ``fitted`` tables)."""
    if isinstance(item, dict) and "value" in item:
        return item["value"]
    if isinstance(item, dict):
        return {k: _strip(v) for k, v in item.items()}
    return item


def _split(item: Any) -> tuple[Any, str | None]:
    if isinstance(item, dict) and "value" in item:
        extra = set(item) - {"value", "source"}
        if extra:
            raise ProfileError(f"unknown key(s) {sorted(extra)} beside 'value'; allowed: value, "
                               f"source")
        return item["value"], item.get("source")
    return item, None


def _merge_section(cat: Catalog, section: str, data: Any, where: str) -> None:
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: '{section}' must be a mapping of names to entries")
    for name, body in data.items():
        if isinstance(name, str) and name.startswith("_"):
            continue  # YAML anchors of shared values (``_hopper_eff: &hopper_eff``)
        if not isinstance(name, str) or not name:
            raise ProfileError(f"{where}: '{section}' entry names must be non-empty strings")
        if not isinstance(body, dict):
            raise ProfileError(f"{where}: '{section}.{name}' must be a mapping of fields")
        body = dict(body)
        base = body.pop("extends", None)
        if base is not None:
            if not isinstance(base, str):  # (a list or mapping is no key: TypeError below)
                raise ProfileError(f"{where}: '{section}.{name}.extends' must name a "
                                   f"{section[:-1]} profile (a string), got {echo(base)}; "
                                   f"known: {', '.join(cat.names(section))}")
            if base not in cat.entries[section]:
                raise ProfileError(f"{where}: '{section}.{name}.extends': no {section[:-1]} "
                                   f"{echo(base)}; known: {', '.join(cat.names(section))}")
            entry = Entry(dict(cat.entries[section][base].values))
        else:
            entry = cat.entries[section].get(name) or Entry({})
            entry = Entry(dict(entry.values))
        for key, item in body.items():
            try:
                value, src = _split(item)
            except ProfileError as err:
                raise ProfileError(f"{where}: '{section}.{name}.{key}': {err}") from None
            value = _strip(value)
            entry.values[key] = (value, f"{where}" + (f": {src}" if src else ""))
        cat.entries[section][name] = entry


def _merge_calibrations(cat: Catalog, data: Any, where: str) -> None:
    if not isinstance(data, list):
        raise ProfileError(f"{where}: 'calibrations' must be a list of "
                           f"{{gpu, model, engine, set}} entries")
    for i, cal in enumerate(data):
        path = f"calibrations.{i}"
        if not isinstance(cal, dict) or set(cal) - {"gpu", "die", "model", "family", "engine",
                                                   "set", "note", "layout"}:
            raise ProfileError(f"{where}: '{path}' must be a mapping with keys gpu (or die), "
                               f"model (or family), engine, set (and an optional layout and "
                               f"note)")
        if ("gpu" in cal) == ("die" in cal):
            raise ProfileError(f"{where}: '{path}' needs one of gpu (the GPU it was fitted on) "
                               f"or die (a GPU architecture, e.g. GH100), not both")
        if ("model" in cal) == ("family" in cal):
            raise ProfileError(f"{where}: '{path}' needs one of model (a model profile) or "
                               f"family (a model family, e.g. qwen3-dense), not both")
        target = cal["gpu"] if "gpu" in cal else cal["die"]
        whom = cal["model"] if "model" in cal else cal["family"]
        key = (target, whom, cal.get("engine", "sglang"))
        if not all(isinstance(k, str) and k for k in key):
            raise ProfileError(f"{where}: '{path}' needs gpu (or die) and model (or family) "
                               f"names")
        if "die" in cal:
            key = (DIE + target, key[1], key[2])
        if "family" in cal:
            key = (key[0], FAMILY + whom, key[2])
        cat.layouts[key] = _layout_condition(cal.get("layout"), f"{where}: '{path}.layout'")
        sets = cal.get("set") or {}
        if not isinstance(sets, dict):
            raise ProfileError(f"{where}: '{path}.set' must map dotted keys (gpu.gemm_eff, "
                               f"engine.decode_step_ms, ...) to values")
        vals = {}
        for dotted, item in sets.items():
            kind, _, field = str(dotted).partition(".")
            if kind not in ("gpu", "engine") or not field:
                raise ProfileError(f"{where}: '{path}.set.{dotted}': a calibration sets gpu.* "
                                   f"or engine.* values")
            cls = GPU if kind == "gpu" else Engine
            if field not in cls.model_fields or field == "name":
                allowed = ", ".join(f for f in cls.model_fields if f != "name")
                raise ProfileError(f"{where}: unknown key '{path}.set.{dotted}'; allowed "
                                   f"{kind} keys: {allowed}")
            value, src = _split(item)
            vals[dotted] = (value, f"{where} calibration {key[0]}/{key[1]}/{key[2]}"
                            + (f": {src}" if src else ""))
        cat.calibrations[key] = {**cat.calibrations.get(key, {}), **vals}
        if isinstance(cal.get("note"), str):
            cat.notes[key] = " ".join(cal["note"].split())
        cat.notes.setdefault(key, "")


LAYOUT_KEYS = {"moe_a2a_backend": ("none", "deepep"), "dp_attention": (False, True)}
"""What a calibration's ``layout`` may condition on (a role's fleet fields), and their values."""


def _layout_condition(layout: Any, where: str) -> tuple:
    """A calibration's ``layout:`` as a sorted tuple of (field, value) (empty: any layout)."""
    if layout is None:
        return ()
    if not isinstance(layout, dict) or not layout:
        raise ProfileError(f"{where} must map role fields ({', '.join(LAYOUT_KEYS)}) to the "
                           f"values the calibration was fitted with")
    for k, v in layout.items():
        if k not in LAYOUT_KEYS:
            raise ProfileError(f"{where}: unknown key {echo(k)}; allowed: "
                               f"{', '.join(LAYOUT_KEYS)}")
        if v not in LAYOUT_KEYS[k] or type(v) is not type(LAYOUT_KEYS[k][0]):
            raise ProfileError(f"{where}.{k}: {echo(v)}; one of "
                               f"{', '.join(map(str, LAYOUT_KEYS[k]))}")
    return tuple(sorted(layout.items()))


def role_layout(role: Any) -> tuple:
    """A fleet role's layout as calibrations condition on it (:data:`LAYOUT_KEYS`)."""
    return (("dp_attention", bool(getattr(role, "dp_attention", False))),
            ("moe_a2a_backend", str(getattr(role, "moe_a2a_backend", "none"))))


def _parse(text: str, where: str) -> Any:
    """A shipped profile file, parsed with libyaml (one first-run cost of every pdsim run: 60
    ms with the pure-Python parser); user files go through :func:`read_profile_file`."""
    try:
        return yaml.load(text, Loader=_FAST)  # CSafeLoader or SafeLoader: safe tags only
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ProfileError(f"{where}: not valid YAML{at}: {getattr(err, 'problem', err)}") \
            from None


_FAST = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@cache
def _shipped() -> Catalog:
    cat = Catalog({s: {} for s in KINDS}, {})
    pkg = resources.files("pdsim.model").joinpath("data")
    for section in KINDS:
        name = f"{section}.yaml"
        _merge_section(cat, section, _parse(pkg.joinpath(name).read_text(), name),
                       f"pdsim/model/data/{name}")
    cal = _parse(pkg.joinpath("calibrations.yaml").read_text(), "calibrations.yaml")
    _merge_calibrations(cat, cal.get("calibrations", []) if cal else [],
                        "pdsim/model/data/calibrations.yaml")
    return cat


def read_profile_file(path: str | os.PathLike) -> dict:
    """Parse a user profile file (sections gpus/models/engines/calibrations) safely: a regular
    file under the size limit, strict UTF-8, and the scenario files' bounded YAML parser (no
    duplicate keys, bounded nesting and aliases): a profile file is as much user input."""
    where = show_path(path)
    try:
        text = decode_utf8(read_user_file(path, "profile file", MAX_PROFILE_BYTES), where)
        data = parse_yaml(text, where)
    except (UserFileError, YamlError) as err:
        raise ProfileError(str(err)) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: a profile file is a mapping with sections gpus, models, "
                           f"engines, calibrations")
    unknown = set(data) - {*KINDS, "calibrations"}
    if unknown:
        raise ProfileError(f"{where}: unknown key '{sorted(unknown)[0]}'; allowed keys here: "
                           f"gpus, models, engines, calibrations")
    return data


def _stamp(path: str) -> tuple:
    try:
        st = os.stat(path)
        return (st.st_mtime_ns, st.st_size)
    except OSError:
        return (0, 0)


def catalog(files: tuple[str, ...] = ()) -> Catalog:
    """Shipped profiles plus the user files, in order."""
    return _catalog(tuple((f, _stamp(f)) for f in files))


@lru_cache(maxsize=32)
def _catalog(files: tuple[tuple[str, tuple], ...]) -> Catalog:
    base = _shipped()
    cat = Catalog({s: dict(v) for s, v in base.entries.items()}, dict(base.calibrations),
                  dict(base.notes), dict(base.layouts))
    for f, _mtime in files:
        data = read_profile_file(f)
        for section in KINDS:
            if section in data:
                _merge_section(cat, section, data[section], f)
        if "calibrations" in data:
            _merge_calibrations(cat, data["calibrations"], f)
    return cat


# --- resolution ----------------------------------------------------------------------------


def _fmt(err: ValidationError, prefix: str) -> str:
    e = err.errors()[0]
    path = ".".join(str(p) for p in (prefix, *e["loc"]) if p != "")
    if e["type"] == "extra_forbidden" and e["loc"] and e["loc"][-1] in RENAMED:
        return f"unknown key '{path}': {RENAMED[e['loc'][-1]]}"
    if e["type"] == "extra_forbidden":
        cls = {"gpus": GPU, "models": Model, "engines": Engine, "gpu": GPU, "model": Model,
               "engine": Engine}.get(prefix.split(".")[0], GPU)
        allowed = ", ".join(f for f in cls.model_fields if f != "name")
        return f"unknown key '{path}'; allowed keys here: {allowed}"
    if e["type"] == "missing":
        return f"missing required key '{path}'"
    got = e.get("input")
    shown = "" if isinstance(got, dict | list) else f" (got {got!r})"
    return f"invalid value at '{path}': {e['msg'].removeprefix('Value error, ')}{shown}"


def build(section: str, name: str, values: dict[str, Any],
          origins: dict[str, str] | None = None) -> _Profile:
    """Validate merged values into a GPU, Model or Engine; errors name the file of the value."""
    cls = KINDS[section]
    try:
        return cls.model_validate({**values, "name": name})
    except ValidationError as err:
        msg = _fmt(err, f"{section}.{name}")
        origins = origins or {}
        field = str(err.errors()[0]["loc"][0]) if err.errors()[0]["loc"] else ""
        origin = origins.get(field) or next(iter(origins.values()), "")
        where = origin.split(": ", 1)[0]
        raise ProfileError(f"{where}: {msg}" if where else msg) from None


@dataclass(frozen=True)
class Resolved:
    """The profiles one scenario runs with, and where each value came from."""

    gpu: GPU
    model: Model
    engine: Engine
    origins: dict[str, tuple[Any, str]]  # "gpu.hbm_tbps" -> (value, origin)
    calibrated: bool = False
    calibration: str = ""  # which calibration applied and how (empty: none)


DIE = "die:"  # the key prefix of a calibration written for a die
FAMILY = "family:"  # the key prefix of a calibration written for a model family


def _die_of(cat: Catalog, gpu: str) -> str:
    """The die of catalog GPU ``gpu`` (its ``die`` value, else its own name)."""
    entry = cat.entries["gpus"].get(gpu)
    die = entry.values.get("die", ("", ""))[0] if entry else ""
    return die if isinstance(die, str) and die else gpu


def _holds(cat: Catalog, key: tuple[str, str, str], layout: tuple | None) -> bool:
    """Whether calibration ``key`` holds for a role of ``layout`` (None: no role in view,
    any calibration holds)."""
    cond = cat.layouts.get(key, ())
    return layout is None or not cond or set(cond) <= set(layout)


def calibration_for(cat: Catalog, gpu: str, model: str, engine: str, family: str = "",
                    layout: tuple | None = None
                    ) -> tuple[tuple[str, str, str] | None, str]:
    """The calibration a (GPU, model, engine) runs with and a line saying which and why:
    for the model, one fitted on this GPU; else one written for its die; else one fitted on
    another GPU of the same die (the first by name); then the same for the model's
    ``family``. Only calibrations that hold for ``layout`` (:func:`role_layout`; None: any)
    count. None when there is none."""
    die = _die_of(cat, gpu)
    names = [(model, model)] + ([(FAMILY + family, f"family {family}")] if family else [])
    for m, shown in names:
        key = (gpu, m, engine)
        if key in cat.calibrations and _holds(cat, key, layout):
            return key, f"{gpu} / {shown} / {engine} (fitted on this GPU)" + _cond(cat, key)
        key = (DIE + die, m, engine)
        if key in cat.calibrations and _holds(cat, key, layout):
            return key, (f"die {die} / {shown} / {engine} (written for the die of {gpu})"
                         + _cond(cat, key))
        for (g, mm, e) in sorted(cat.calibrations):
            if mm == m and e == engine and not g.startswith(DIE) and g != gpu \
                    and _die_of(cat, g) == die and _holds(cat, (g, mm, e), layout):
                return (g, mm, e), (f"{g} / {shown} / {engine} (fitted on {g}; applies to "
                                    f"{gpu} through their die {die}, scaled by {gpu}'s own "
                                    f"peaks)" + _cond(cat, (g, mm, e)))
    return None, ""


def _cond(cat: Catalog, key: tuple[str, str, str]) -> str:
    cond = cat.layouts.get(key, ())
    return (" for layouts with " + ", ".join(f"{k} {v}" for k, v in cond)) if cond else ""


def resolve(gpu: str, model: str, engine: str = "sglang", files: tuple[str, ...] = (),
            overrides: dict[str, dict[str, Any]] | None = None,
            layout: tuple | None = None) -> Resolved:
    """Resolve (gpu, model, engine) through shipped files, user files, calibration, overrides;
    ``layout`` (:func:`role_layout`) picks among calibrations that say which layout they hold
    for (None: the most specific whatever its layout).

    Raises :class:`ProfileError` (one line) on unknown names or invalid values.

    Remembered per names, user files as the catalog stamps them, and
    overrides whose values are plain numbers or strings (each by type and ``repr``, so that
    1, 1.0, True, 0.0 and -0.0 are told apart): a scenario is validated once plus once per end
    of each declared unknown's range, and most of those resolve the same profiles (the run's
    fleet once more), each resolution validating three profile models (drop_timeout: 8
    resolutions, 4 of them distinct).
    """
    stamped = tuple((f, _stamp(f)) for f in files)
    frozen = _frozen(overrides)
    if frozen is None or not all(type(n) is str for n in (gpu, model, engine)):
        return _resolve(gpu, model, engine, stamped, overrides, layout)
    key = (gpu, model, engine, stamped, frozen, layout)
    res = _RESOLVED.get(key)
    if res is None:
        res = _resolve(gpu, model, engine, stamped, overrides, layout)
        if len(_RESOLVED) >= 64:
            _RESOLVED.clear()
        _RESOLVED[key] = res
    return res


_RESOLVED: dict[tuple, Resolved] = {}  # (resolve's memo; Resolved and profiles are frozen)
_PLAIN = (int, float, str, bool, type(None))


def _frozen(overrides: dict[str, dict[str, Any]] | None) -> tuple | None:
    """``overrides`` as a key (None if a value is not a plain number or string)."""
    out = []
    for kind, over in (overrides or {}).items():
        fields = []
        for field, value in (over or {}).items():
            if type(value) not in _PLAIN:
                return None
            fields.append((field, type(value), repr(value)))
        out.append((kind, tuple(fields)))
    return tuple(out)


def _resolve(gpu: str, model: str, engine: str, stamped: tuple,
             overrides: dict[str, dict[str, Any]] | None, layout: tuple | None = None
             ) -> Resolved:
    cat = _catalog(stamped)
    names = {"gpu": gpu, "model": model, "engine": engine}
    for kind, n in names.items():
        section = SECTION[kind]
        if n not in cat.entries[section]:
            label = "GPU" if kind == "gpu" else kind
            raise ProfileError(f"invalid value at 'fleet.{kind}': unknown {label} profile "
                               f"{echo(n)}; allowed: {', '.join(cat.names(section))}")
    vals = {kind: dict(cat.entries[SECTION[kind]][n].values) for kind, n in names.items()}
    family = (overrides or {}).get("model", {}).get("family") \
        or vals["model"].get("family", ("", ""))[0]
    cal_key, cal_line = calibration_for(cat, gpu, model, engine,
                                        family if isinstance(family, str) else "", layout)
    cal = cat.calibrations[cal_key] if cal_key else {}
    if cal_key and cat.notes.get(cal_key):
        cal_line += f": {cat.notes[cal_key]}"
    for dotted, vo in cal.items():
        kind, _, field = dotted.partition(".")
        vals[kind][field] = vo
    for kind, over in (overrides or {}).items():
        for field, value in (over or {}).items():
            if value is not None:
                vals[kind][field] = (value, "scenario override")
    built = {}
    for kind, n in names.items():
        plain = {k: v for k, (v, _o) in vals[kind].items()}
        for k, v in plain.items():
            if isinstance(v, float) and not math.isfinite(v):
                where = vals[kind][k][1]
                raise ProfileError(f"invalid value at '{kind}.{k}' ({where}): must be finite "
                                   f"(got {v!r})")
        built[kind] = build(SECTION[kind], n, plain, {k: o for k, (_v, o) in vals[kind].items()})
    bad = built["model"].inconsistency()
    if bad is not None:
        (fields, why), origin = bad, vals["model"]

        def rank(f: str) -> int:  # blame what the user set: an override, then a user file,
            o = origin.get(f, (0, ""))[1]  # then a shipped profile, then a default
            return (0 if o == "scenario override" else 3 if not o
                    else 2 if o.startswith("pdsim/model/data/") else 1)

        blame = min(fields, key=rank)  # (the first of equals: the order inconsistency gives)
        where = origin.get(blame, (0, f"model profile {model}, default"))[1]
        raise ProfileError(f"invalid value at 'model.{blame}' ({where}): {why}")
    origins = {f"{kind}.{k}": vo for kind in names for k, vo in sorted(vals[kind].items())}
    return Resolved(built["gpu"], built["model"], built["engine"], origins, bool(cal),
                    cal_line)


def for_role(sc: Any, role: Any, ctx: Any = None) -> Resolved:
    """:func:`for_scenario` for one fleet role (``fleet.prefill`` / ``.decode`` /
    ``.colocated``): the calibration that holds for its layout (:func:`role_layout`)."""
    return for_scenario(sc, ctx, role_layout(role))


def for_scenario(sc: Any, ctx: Any = None, layout: tuple | None = None) -> Resolved:
    """The profiles a validated :class:`~pdsim.config.scenario.Scenario` runs with (per role:
    :func:`for_role`).

    ``profiles:`` entries resolve against ``ctx`` (a :class:`pdsim.config.units.Context`;
    default: where the scenario was loaded from), confined to the scenario's directory tree.
    """
    ctx = ctx or sc._context
    files = []
    for i, rel in enumerate(sc.profiles):
        try:
            path = ctx.resolve(rel, f"'profiles.{i}'") if ctx is not None else Path(rel)
        except UserFileError as err:
            raise ProfileError(str(err)) from None
        files.append(str(path))
    # (engine.version names the scheduler's release: not a profile value)
    over = {k: getattr(sc, k).model_dump(exclude_none=True, exclude={"version"})
            for k in ("gpu", "model", "engine")}
    return resolve(sc.fleet.gpu, sc.fleet.model, sc.fleet.engine, tuple(files), over, layout)


# --- the shipped catalog, by name (what tests and the CLI listing use) ---------------------


def gpu_names() -> list[str]:
    return _shipped().names("gpus")


def model_names() -> list[str]:
    return _shipped().names("models")


def engine_names() -> list[str]:
    return _shipped().names("engines")


def _plain(section: str, name: str) -> dict:
    return {k: v for k, (v, _o) in _shipped().entries[section][name].values.items()}


@cache
def gpu(name: str) -> GPU:
    return build("gpus", name, _plain("gpus", name))  # type: ignore[return-value]


@cache
def model(name: str) -> Model:
    return build("models", name, _plain("models", name))  # type: ignore[return-value]


@cache
def engine(name: str = "sglang") -> Engine:
    return build("engines", name, _plain("engines", name))  # type: ignore[return-value]


def raw_gpus() -> dict[str, dict[str, Any]]:
    """Shipped GPU entries as ``{name: {field: {value, source}}}`` (for listings)."""
    return _raw("gpus")


def raw_models() -> dict[str, dict[str, Any]]:
    return _raw("models")


def raw_engines() -> dict[str, dict[str, Any]]:
    return _raw("engines")


def calibrated() -> list[tuple[str, str, str]]:
    """The shipped (GPU, model, engine) combinations that have a calibration."""
    return sorted(_shipped().calibrations)


def _raw(section: str) -> dict[str, dict[str, Any]]:
    return {n: {k: {"value": v, "source": o} for k, (v, o) in e.values.items()}
            for n, e in _shipped().entries[section].items()}

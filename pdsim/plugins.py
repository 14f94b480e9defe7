"""What a plugin imports: one stable surface for writing blacklist policies, fault kinds and
load-time checks, whatever module of the engine or the scenario schema they come from.

    from pydantic import Field

    from pdsim.plugins import BLACKLIST_POLICIES, BlacklistParams, BlacklistPolicy, Seconds

    @BLACKLIST_POLICIES.register("quarantine")
    class Quarantine(BlacklistPolicy):
        class Params(BlacklistParams):
            hold_s: Seconds = Field(10.0, description="Seconds a failed session stays out")
        ...

A blacklist policy subclasses :class:`BlacklistPolicy` (``admit``, ``record_failure``,
``record_success``, ``clear``) with a :class:`BlacklistParams` model of its scenario keys; a
fault kind registers an install function and a :class:`FaultParams` model in :data:`FAULTS`
(presets with ``FAULTS.add_preset``); a check that needs more than one section registers with
:func:`load_check` and raises :class:`Invalid`. Numbers use the scenario's unit types
(``Seconds``, ``Tokens``, ...), which carry its bounds and reject booleans. ``pdsim run
--plugin FILE.py`` (and validate, sweep, explore, whatif, schema, faults) imports a plugin
first; from Python, import it before loading a scenario.

Public API beside ``pdsim`` itself, above every layer: no pdsim module imports it.
"""

from __future__ import annotations

from pdsim.config.registry import BLACKLIST_POLICIES, FAULTS, Registry
from pdsim.config.scenario import load_check
from pdsim.config.units import (
    Context,
    Fraction,
    Instant,
    Interval,
    Invalid,
    Millis,
    Name,
    NonNegFloat,
    NonNegInt,
    PosFloat,
    PosInt,
    ScenarioError,
    Seconds,
    Seed,
    Strict,
    Text,
    Tokens,
)
from pdsim.engine.blacklist import Params as BlacklistParams
from pdsim.engine.blacklist import Policy as BlacklistPolicy
from pdsim.engine.faults import GONE, SILENT, SLOW, UP, FaultParams, Faults

__all__ = ["BLACKLIST_POLICIES", "FAULTS", "GONE", "SILENT", "SLOW", "UP", "BlacklistParams",
           "BlacklistPolicy", "Context", "FaultParams", "Faults", "Fraction", "Instant",
           "Interval", "Invalid", "Millis", "Name", "NonNegFloat", "NonNegInt", "PosFloat",
           "PosInt", "Registry", "ScenarioError", "Seconds", "Seed", "Strict", "Text", "Tokens",
           "load_check"]

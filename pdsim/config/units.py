"""The scenario's units, bounds and errors, and the base of every section.

The documented limits (``MAX_*``, ``MIN_*``: the docs' table is generated from them; each error
names the one it hit), the numeric aliases every field uses (``Seconds``, ``Tokens``,
``PosInt``, ... reject ``true``/``false`` where a number is expected), the one-line
:class:`ScenarioError` and the :class:`Invalid` a section's ``check`` raises, the
:class:`Context` a check gets, and :class:`Strict`, the base of every section (unknown keys are
errors).
"""


from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
)

from pdsim.util.safeio import (
    resolve_user_path,
)

# --- limits (docs/reference/scenario.md, generated; each error names the one it hit) ------

MAX_FILE_BYTES = 256 << 10  # a scenario file (each file of an extends chain)
# MAX_YAML_DEPTH, MAX_YAML_VALUES, MAX_INT_DIGITS: pdsim.util.safeyaml's, imported above (limits())
MAX_EXTENDS = 16  # files in an extends chain
MAX_TIME_S = 1e7  # any simulated time, duration or timeout (~116 days)
MIN_BANDWIDTH_FRACTION = 1e-9  # the least a degraded NIC keeps (nic_degraded; writes checked)
MIN_INTERVAL_S = 1e-3  # shortest period of a recurring event (samples, heartbeats, probes)
MAX_TICKS = 200_000  # recurring events one period implies over the horizon (horizon / period)
MAX_PROBES = 50_000_000  # blacklist probes if every (prefill rank, decode session) pair probed
MAX_REQUESTS = 1_000_000  # prompts or questions of one client
MAX_TOTAL_REQUESTS = 4_000_000  # requests all clients can send, counting every retry
MAX_TOKENS = 10_000_000  # any length or budget in tokens
MAX_PROMPT_BLOCKS = 20_000_000  # prefix-block ids held by the random prompts of a scenario
MAX_SERVERS = 1024  # servers per role
MAX_DP = 1024  # DP ranks per server
MAX_TP = 1024  # tensor-parallel size
MAX_RANKS = 4096  # DP ranks per role (servers x dp)
MAX_RUNNING = 100_000  # max_running_requests per rank, concurrency limits
MAX_KV_TOKENS = 10**10  # KV pool per rank
MAX_PAGE_TOKENS = 65_536  # tokens per KV page or prefix block
MAX_THREADS = 100_000  # eval threads
MAX_TRIES = 30  # eval tries and SDK retries
MAX_QUEUES = 64  # transfer queues per prefill rank
MAX_COUNT = 1_000_000  # other counts (strikes, fan-out, heartbeat misses)
MAX_LIST = 1000  # entries of faults, operator_flushes, reference, clients
MAX_SEED = 2**64 - 1  # seeds (numpy's SeedSequence takes any; 64 bits is plenty)
MAX_MS = MAX_TIME_S * 1e3  # latencies and predictor terms in ms
MAX_NAME_CHARS = 100  # names and labels: the scenario, clients, reference figures
MAX_TEXT_CHARS = 10_000  # free text: description, a reference figure's source


class ScenarioError(ValueError):
    """A scenario that cannot be run; ``str()`` is the one-line message for the user."""


_NOTHING = object()


class Invalid(Exception):
    """Raised by a cross-field ``check``: ``key`` (relative to the section), what is wrong and
    what is allowed, and the offending value."""

    def __init__(self, key: str, msg: str, got: Any = _NOTHING) -> None:
        super().__init__(msg)
        self.key, self.msg, self.got = key, msg, got


def _number(v: Any) -> Any:
    if isinstance(v, bool):
        raise ValueError(f"expected a number, not {str(v).lower()}")
    return v


_NUM = BeforeValidator(_number)
Int = Annotated[int, _NUM]
PosInt = Annotated[int, Field(gt=0), _NUM]
NonNegInt = Annotated[int, Field(ge=0), _NUM]
PosFloat = Annotated[float, Field(gt=0, allow_inf_nan=False), _NUM]
NonNegFloat = Annotated[float, Field(ge=0, allow_inf_nan=False), _NUM]
Fraction = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False), _NUM]
# a duration or timeout; a point in simulated time; the period of a recurring event
Seconds = Annotated[float, Field(gt=0, le=MAX_TIME_S, allow_inf_nan=False), _NUM]
Instant = Annotated[float, Field(ge=0, le=MAX_TIME_S, allow_inf_nan=False), _NUM]
Interval = Annotated[float, Field(ge=MIN_INTERVAL_S, le=MAX_TIME_S, allow_inf_nan=False),
                     _NUM]
Millis = Annotated[float, Field(ge=0, le=MAX_MS, allow_inf_nan=False), _NUM]
Tokens = Annotated[int, Field(gt=0, le=MAX_TOKENS), _NUM]
Seed = Annotated[int, Field(ge=0, le=MAX_SEED), _NUM]


def _name(v: Any) -> Any:
    if isinstance(v, str) and (not v.isprintable() or not v.strip()):
        raise ValueError("must be printable text: no control characters, escape sequences or "
                         "line breaks, not blank")
    return v


def _text(v: Any) -> Any:
    if isinstance(v, str) and not v.replace("\n", "").replace("\t", "").isprintable():
        raise ValueError("must be printable text (line breaks and tabs allowed; no control "
                         "characters or escape sequences)")
    return v


Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS), BeforeValidator(_name)]
Text = Annotated[str, Field(max_length=MAX_TEXT_CHARS), BeforeValidator(_text)]


@dataclass
class Context:
    """Where a scenario came from: relative paths resolve against ``base_dir`` and must stay
    in ``root`` (the scenario's directory tree) unless ``allow_outside``."""

    base_dir: Path
    root: Path
    allow_outside: bool = False
    # the validated Scenario (pdsim.config.scenario, which imports this module), set for checks
    scenario: Any = field(default=None, repr=False)
    path: str = ""  # key path of the section being checked
    # the scenario files read, each (resolved path, what it is): the file, its extends: parents
    files: list = field(default_factory=list, repr=False, compare=False)
    # the name of the extends: parent whose reference: figures the scenario took ("": its own)
    reference_owner: str = field(default="", repr=False, compare=False)

    @classmethod
    def cwd(cls, allow_outside: bool = False) -> Context:
        here = Path.cwd()
        return cls(here, here, allow_outside)

    def resolve(self, rel: str, what: str) -> Path:
        """A path named in the scenario, resolved and confined (``pdsim.util.safeio``)."""
        return resolve_user_path(self.base_dir, rel, what, self.allow_outside, self.root)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False, validate_default=True, defer_build=True)

    def check(self, ctx: Context) -> None:
        """Cross-field checks of this section (step 4); raise :class:`Invalid`."""


def _ticks(ctx: Context, key: str, period: float, what: str) -> None:
    """Bound the recurring events a period implies over the horizon."""
    horizon = ctx.scenario.horizon_s
    n = horizon / period
    if n > MAX_TICKS:
        raise Invalid(key, f"horizon_s / {key.rsplit('.', 1)[-1]} = {n:,.0f} {what}; at most "
                      f"{MAX_TICKS:,}: raise the period to >= {horizon / MAX_TICKS:.4g} s or "
                      f"shorten horizon_s", period)

"""Blacklist policies: each state machine in isolation, the registry, a user policy from YAML."""

from __future__ import annotations

import json
import sys

import pytest
import simpy
import yaml
from conftest import small_fleet
from pydantic import Field

import pdsim
from pdsim.cli.main import main
from pdsim.config.loader import json_schema
from pdsim.config.registry import BLACKLIST_POLICIES
from pdsim.config.scenario import from_dict
from pdsim.config.units import ScenarioError, Seconds
from pdsim.engine import blacklist

S = "decode-0.r0:17000"


def _policy(env: simpy.Environment, probe=None, **params):
    rows = []

    def log(event, component="", rank=-1, rid=-1, room=-1, peer="", value=0.0, detail=""):
        rows.append((env.now, event, peer, detail))

    bl = blacklist.build(BLACKLIST_POLICIES.validate(params), env, "prefill-0.r0", log, probe)
    return bl, rows


def _at(env: simpy.Environment, t: float) -> None:
    """Run through everything scheduled at ``t`` (``run(until=t)`` stops just before)."""
    env.run(until=t)
    while env.peek() <= t:
        env.step()


def test_permanent_counts_strikes_and_never_forgets():
    env = simpy.Environment()
    bl, _ = _policy(env, policy="permanent", strikes=2)
    assert bl.record_failure(S) is False and bl.admit(S)
    bl.record_success(S)  # SGLang's failure counter is not reset by a success
    assert bl.record_failure(S) is True and not bl.admit(S)
    _at(env, 1e6)
    assert not bl.admit(S)
    bl.clear(S, "decode re-registered")
    assert bl.admit(S) and bl.record_failure(S) is False  # counter cleared with the entry


def test_ttl_entry_expires_ttl_after_it_was_added():
    env = simpy.Environment()
    bl, rows = _policy(env, policy="ttl", ttl_s=10)
    _at(env, 3)
    assert bl.record_failure(S) is True
    _at(env, 12.999)
    assert not bl.admit(S) and len(bl) == 1
    _at(env, 13.0)
    assert bl.admit(S) and len(bl) == 0
    assert [r[1:] for r in rows] == [("blacklist_add", S, ""), ("blacklist_remove", S, "ttl")]
    assert rows[-1][0] == 13.0  # exactly ttl_s after the add
    # the next failure starts a fresh entry with its own TTL (not the first one's)
    _at(env, 20)
    assert bl.record_failure(S) is True
    _at(env, 29.9)
    assert not bl.admit(S)
    _at(env, 30)
    assert bl.admit(S)


def test_ttl_with_strikes_counts_only_since_the_last_expiry():
    env = simpy.Environment()
    bl, _ = _policy(env, policy="ttl", ttl_s=5, strikes=2)
    bl.record_failure(S)
    assert bl.record_failure(S) is True
    _at(env, 5)
    assert bl.admit(S)
    assert bl.record_failure(S) is False  # the count left with the entry


def test_strikes_window_needs_n_within_the_window_and_a_success_resets():
    env = simpy.Environment()
    bl, _ = _policy(env, policy="strikes_window", strikes=3, window_s=10)
    bl.record_failure(S)
    _at(env, 4)
    bl.record_failure(S)
    bl.record_success(S)  # a success resets the count
    _at(env, 5)
    assert bl.record_failure(S) is False and bl.record_failure(S) is False
    _at(env, 16)  # the failures at 5 s slid out of the window
    assert bl.record_failure(S) is False and bl.admit(S)
    assert bl.record_failure(S) is False  # 16, 16 (and 5, 5 gone): two in the window
    assert bl.record_failure(S) is True and not bl.admit(S)
    _at(env, 1e5)
    assert not bl.admit(S)  # ttl_s null: until re-registration


def test_strikes_window_with_ttl_expires():
    env = simpy.Environment()
    bl, _ = _policy(env, policy="strikes_window", strikes=1, window_s=1, ttl_s=7)
    assert bl.record_failure(S) is True
    _at(env, 6.9)
    assert not bl.admit(S)
    _at(env, 7)
    assert bl.admit(S)


def test_circuit_breaker_closed_open_half_open_with_backoff():
    env = simpy.Environment()
    bl, rows = _policy(env, policy="circuit_breaker", failures=2, window_s=5, cooldown_s=4,
                       trials=2, backoff=3, max_cooldown_s=30)
    bl.record_failure(S)
    _at(env, 6)  # the first failure slides out of the window: still closed
    assert bl.record_failure(S) is False and bl.admit(S)
    assert bl.record_failure(S) is True  # two within 5 s: open
    assert bl.state[S] == "open" and not bl.admit(S)
    _at(env, 9.99)
    assert not bl.admit(S)
    _at(env, 10)  # cooldown over: half-open lets `trials` transfers through
    assert bl.admit(S) and bl.admit(S) and not bl.admit(S)
    assert bl.state[S] == "half_open" and len(bl) == 1
    bl.record_failure(S)  # a failed trial re-opens with the cooldown x backoff (4 -> 12 s)
    assert bl.state[S] == "open"
    _at(env, 21.99)
    assert not bl.admit(S)
    _at(env, 22)
    assert bl.admit(S)
    bl.record_failure(S)  # 12 -> 36 s, capped at 30
    assert bl.reopen_at[S] == pytest.approx(52.0)
    _at(env, 52)
    assert bl.admit(S)
    bl.record_success(S)  # a successful trial closes it
    assert S not in bl.state and len(bl) == 0 and bl.admit(S)
    assert rows[-1][1:] == ("breaker", S, "closed (trial ok)")
    # closed again: the cooldown starts over from cooldown_s
    bl.record_failure(S)
    bl.record_failure(S)
    assert bl.reopen_at[S] == pytest.approx(env.now + 4)


def test_never_never_blacklists():
    env = simpy.Environment()
    bl, rows = _policy(env, policy="never")
    for _ in range(100):
        assert bl.record_failure(S) is False
    assert bl.admit(S) and len(bl) == 0 and rows == []


def test_probe_interval_runs_from_the_previous_probe_end():
    env = simpy.Environment()
    calls = []

    def probe(session):  # a probe that costs 2 s and fails twice, then succeeds
        calls.append(env.now)
        yield env.timeout(2)
        return len(calls) >= 3

    bl, rows = _policy(env, probe=probe, policy="probe", probe_interval_s=10)
    bl.record_failure(S)
    _at(env, 100)
    assert calls == [10, 22, 34]  # fixed interval, no backoff
    assert rows[-1][1:] == ("blacklist_remove", S, "probe") and rows[-1][0] == 36


def test_v0_5_23_probe_backs_off_and_caps():
    env = simpy.Environment()
    calls = []

    def probe(session):
        calls.append(env.now)
        yield env.timeout(0)
        return False

    bl, _ = _policy(env, probe=probe, policy="v0_5_23", probe_interval_s=10,
                    probe_max_interval_s=25, idle_drop_s=1e6)
    bl.record_failure(S)
    _at(env, 100)
    assert calls == [10, 30, 55, 80]  # 10, 20, then capped at 25


def test_an_entry_idle_dropped_before_its_probe_starts_does_not_crash():
    """Fuzz-found (tests/fuzz_found/min_blacklist_probe_keyerror*.yaml): an idle drop in the
    instant between the add and the probe process's first step raised KeyError."""
    env = simpy.Environment()

    def probe(session):
        yield env.timeout(0)
        return True

    bl, rows = _policy(env, probe=probe, policy="v0_5_23", idle_drop_s=0.01)
    bl.record_failure(S)
    env.run(until=0.02)
    assert bl.admit(S)  # idle for 0.02 s: dropped, before the probe ever ran
    env.run(until=100)  # the probe process wakes, finds its entry gone, and ends
    assert [r[1] for r in rows] == ["blacklist_add", "blacklist_remove"]


def test_fuzz_found_probe_keyerror_scenarios_run():
    for extra in ({"transfer": {"call_latency_ms": 100.0},
                   "faults": [{"kind": "transfer_errors", "probability": 1.0}]},
                  {"transfer": {"nic_gbps": 0.01}}):
        d = small_fleet(blacklist={"policy": "v0_5_23", "idle_drop_s": 0.01}, horizon_s=120,
                        **extra)
        d["clients"][0]["num_prompts"] = 40
        res = pdsim.run(d)
        assert res.summary["failed"] > 0


# --- the registry drives validation and the schema ----------------------------------------


@pytest.mark.parametrize("bl,path,hint", [
    ({"policy": "sometimes"}, "blacklist.policy", "'permanent', 'probe', 'v0_5_23', 'ttl'"),
    ({"policy": "ttl", "ttl_s": -1}, "blacklist.ttl_s", "greater than 0"),
    ({"policy": "ttl", "ttl_s": float("inf")}, "blacklist.ttl_s", "finite"),
    ({"policy": "ttl", "probe_interval_s": 3}, "blacklist.probe_interval_s",
     "allowed keys here: reregister_on_invalidate, strikes, ttl_s"),
    ({"ttl_s": 3}, "blacklist.ttl_s", "policy 'permanent'"),
    ({"recovery": "none"}, "blacklist.recovery", "blacklist.policy (none -> permanent"),
    ({"policy": "circuit_breaker", "cooldown_s": 60, "max_cooldown_s": 10},
     "blacklist.max_cooldown_s", "must be >= cooldown_s (60)"),
    ({"policy": "v0_5_23", "probe_interval_s": 100, "probe_max_interval_s": 10},
     "blacklist.probe_max_interval_s", "must be >= probe_interval_s (100)"),
    ({"policy": "probe", "probe_interval_s": 0.001}, "blacklist.probe_interval_s",
     "probes per blacklisted pair"),
    ({"policy": "circuit_breaker", "backoff": True}, "blacklist.backoff", "not true"),
])
def test_policy_parameters_are_validated_with_key_paths(bl, path, hint):
    with pytest.raises(ScenarioError) as err:
        from_dict(small_fleet(blacklist=bl))
    msg = str(err.value)
    assert f"'{path}'" in msg and hint in msg, msg
    assert "\n" not in msg


def test_a_key_of_another_policy_says_which_policy_has_it():
    """`--set blacklist.ttl_s=5` on a permanent-blacklist scenario listed permanent's keys
    only: the error now names the policies that take the key. A fault's key is not hinted
    (duration_s on a crash means restart_after_s, not another kind)."""
    with pytest.raises(ScenarioError) as err:
        from_dict(small_fleet(blacklist={"probe_interval_s": 5}))
    assert "belongs to blacklist policy 'probe' or 'v0_5_23': set 'policy'" in str(err.value)
    with pytest.raises(ScenarioError) as err:
        from_dict(small_fleet(faults=[{"kind": "decode_crash", "at_s": 1, "duration_s": 5}]))
    assert "belongs to" not in str(err.value) and "restart_after_s" in str(err.value)


def test_scenario_round_trips_through_a_dump():
    sc = from_dict(small_fleet(blacklist={"policy": "circuit_breaker", "trials": 3}))
    again = pdsim.load(sc, ["seed=3"])
    assert again.blacklist == sc.blacklist and again.blacklist.trials == 3
    assert sc.model_dump()["blacklist"]["policy"] == "circuit_breaker"


def _alternatives(schema: dict, prop: dict) -> list[dict]:
    return [schema["$defs"][a["$ref"].rsplit("/", 1)[1]] if "$ref" in a else a
            for a in prop["oneOf"]]


def test_every_policy_is_in_the_schema():
    schema = json_schema()
    alts = _alternatives(schema, schema["properties"]["blacklist"])
    assert [a["title"] for a in alts] == BLACKLIST_POLICIES.names()
    assert {"permanent", "probe", "v0_5_23", "ttl", "strikes_window", "circuit_breaker",
            "never"} <= set(BLACKLIST_POLICIES.names())
    ttl = next(a for a in alts if a["title"] == "ttl")
    assert set(ttl["properties"]) == {"policy", "ttl_s", "strikes", "reregister_on_invalidate"}
    assert ttl["required"] == ["policy"]
    # a declared unknown is accepted for a policy parameter, as for any numeric value
    assert {"$ref": "#/$defs/DeclaredUnknown"} in ttl["properties"]["ttl_s"]["anyOf"]


# --- a user policy, defined here, registered, run from YAML ------------------------------


class HoldAfterTwo(blacklist.Policy):
    """Test policy: a second failure blacklists the session for hold_s."""

    class Params(blacklist.Params):
        hold_s: Seconds = Field(5.0, description="How long the entry lasts")

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seen: dict[str, int] = {}

    def record_failure(self, session: str) -> bool:
        self.seen[session] = self.seen.get(session, 0) + 1
        return self.seen[session] >= 2 and self._add(session, "second failure")

    def _added(self, session: str, when: float) -> None:
        self._expire_at(session, when, self.p.hold_s, "hold over")

    def _forget(self, session: str) -> None:
        self.seen.pop(session, None)


@pytest.fixture
def user_policy():
    BLACKLIST_POLICIES.register("hold_after_two")(HoldAfterTwo)
    yield "hold_after_two"
    BLACKLIST_POLICIES.unregister("hold_after_two")


def test_user_policy_runs_from_yaml_and_is_in_the_schema(user_policy, tmp_path):
    d = small_fleet(blacklist={"policy": user_policy, "hold_s": 3},
                    faults=[{"kind": "transfer_errors", "probability": 0.3, "from_s": 2,
                             "to_s": 4}])
    d["clients"][0].update(num_prompts=400, request_rate=40.0)
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(d))
    res = pdsim.run(path)
    ev = res.events
    adds, removes = ev[ev.event == "blacklist_add"], ev[ev.event == "blacklist_remove"]
    assert len(adds) > 0 and set(adds.detail) == {"second failure"}
    assert set(removes.detail) == {"hold over"}
    for a in adds.itertuples():  # each entry lasted exactly hold_s
        r = removes[(removes.component == a.component) & (removes.peer == a.peer)
                    & (removes.time >= a.time)].time.iloc[0]
        assert r - a.time == pytest.approx(3.0)
    schema = json_schema()
    assert user_policy in [a["title"] for a in
                           _alternatives(schema, schema["properties"]["blacklist"])]
    with pytest.raises(ScenarioError, match="'blacklist.hold_s'.*greater than 0"):
        from_dict(small_fleet(blacklist={"policy": user_policy, "hold_s": 0}))


def test_user_policy_from_a_plugin_file_on_the_cli(tmp_path, capsys):
    plugin = tmp_path / "my_policies.py"
    plugin.write_text(
        "from pdsim.engine import blacklist\n"
        "from pdsim.config.registry import BLACKLIST_POLICIES\n\n"
        "@BLACKLIST_POLICIES.register('always_fail_fast')\n"
        "class AlwaysFailFast(blacklist.Never):\n"
        "    '''Blacklists nothing (a test plugin).'''\n")
    sc = tmp_path / "s.yaml"
    sc.write_text(yaml.safe_dump(small_fleet(blacklist={"policy": "always_fail_fast"})))
    try:
        assert main(["validate", str(sc)]) == 2
        assert "always_fail_fast" in capsys.readouterr().err
        assert main(["validate", "--plugin", str(plugin), str(sc)]) == 0
        capsys.readouterr()
        assert main(["schema", "--plugin", str(plugin)]) == 0
        schema = json.loads(capsys.readouterr().out)
        assert "always_fail_fast" in [a["title"] for a in
                                      _alternatives(schema, schema["properties"]["blacklist"])]
    finally:
        BLACKLIST_POLICIES.unregister("always_fail_fast")
    assert main(["validate", "--plugin", str(tmp_path / "nope.py"), str(sc)]) == 2


def test_the_docs_recipe_for_a_new_policy_works_as_written(tmp_path):
    """The recipe of docs/guides/plugins.md, run as the page shows it."""
    from conftest import ROOT

    text = (ROOT / "docs" / "guides" / "plugins.md").read_text()
    block = text.split("<!-- recipe: blacklist policy")[1].split("```python\n", 1)[1]
    block = block.split("```", 1)[0]
    try:
        # as a file of its own would run it: without this module's __future__ imports
        exec(compile(block, "docs/guides/plugins.md", "exec", dont_inherit=True),
             {"__name__": "readme_recipe"})
        d = small_fleet(blacklist={"policy": "quarantine", "hold_s": 5},
                        faults=[{"kind": "transfer_errors", "probability": 0.2, "from_s": 2,
                                 "to_s": 3}])
        d["clients"][0].update(num_prompts=300, request_rate=40.0)
        path = tmp_path / "q.yaml"
        path.write_text(yaml.safe_dump(d))
        ev = pdsim.run(path).events
        adds, removes = ev[ev.event == "blacklist_add"], ev[ev.event == "blacklist_remove"]
        assert len(adds) > 0 and len(removes) == len(adds)
        assert set(removes.detail) == {"hold over"}
        assert sorted((removes.time.to_numpy() - adds.time.to_numpy()).round(9)) == \
            [5.0] * len(adds)
    finally:
        BLACKLIST_POLICIES.unregister("quarantine")


def test_switching_the_policy_keeps_the_keys_it_has_and_drops_the_old_one_s(tmp_path):
    """``--set blacklist.policy=X`` on a scenario whose blacklist (inherited through
    ``extends:``) has ``strikes: 1``: a policy without strikes runs (the key was the old
    policy's), one with strikes keeps the scenario's 1 (strikes_window's own default is 3),
    and a key written beside the switch is still checked."""
    from conftest import SCENARIOS

    base = SCENARIOS / "drop_timeout.yaml"
    assert pdsim.load(base).blacklist.strikes == 1
    never = pdsim.load(base, ["blacklist.policy=never"]).blacklist
    assert never.policy == "never" and not hasattr(never, "strikes")
    breaker = pdsim.load(base, ["blacklist.policy=circuit_breaker", "blacklist.failures=2"])
    assert breaker.blacklist.failures == 2
    assert pdsim.load(base, ["blacklist.policy=strikes_window"]).blacklist.strikes == 1
    with pytest.raises(ScenarioError, match="blacklist.strikes"):  # the user's own key
        pdsim.load(base, ["blacklist.policy=never", "blacklist.strikes=2"])
    with pytest.raises(ScenarioError, match="blacklist.strikes"):  # given before the switch
        pdsim.load(base, ["blacklist.strikes=2", "blacklist.policy=never"])
    # a file that extends another and names another policy: the same rule
    child = tmp_path / "child.yaml"
    child.write_text(f"extends: {base.name}\nblacklist: {{policy: never}}\n")
    for f in SCENARIOS.glob("*.yaml"):  # (drop_timeout's own extends chain)
        (tmp_path / f.name).write_text(f.read_text())
    assert pdsim.load(child).blacklist.policy == "never"
    child.write_text(f"extends: {base.name}\nblacklist: {{policy: never, strikes: 2}}\n")
    with pytest.raises(ScenarioError, match="blacklist.strikes"):
        pdsim.load(child)
    # a fault item switched to another kind by --set: the old kind's keys go
    d = small_fleet(faults=[{"kind": "transfer_errors", "probability": 0.2, "from_s": 2,
                             "to_s": 3}])
    f = pdsim.load(d, ["faults.0.kind=decode_hang", "faults.0.at_s=2",
                       "faults.0.duration_s=1"]).faults[0]
    assert f.kind == "decode_hang" and not hasattr(f, "probability")


def test_never_blacklisting_removes_the_incident_s_fast_fails():
    """The what-if the switch above lets a user ask of the incident: with no blacklist, the
    flush's failed transfers blacklist no pair, so no later request fails fast."""
    from conftest import SCENARIOS

    sets = ["clients.0.num_prompts=400", "clients.1.num_prompts=200"]
    base = pdsim.run(SCENARIOS / "drop_timeout.yaml", sets)
    never = pdsim.run(SCENARIOS / "drop_timeout.yaml", [*sets, "blacklist.policy=never"])
    fast = "blacklisted_session"
    assert (base.events.detail == fast).sum() > 0 and base.summary["blacklisted_pairs_max"] > 0
    assert (never.events.detail == fast).sum() == 0
    assert never.summary["blacklisted_pairs_max"] == 0
    assert never.summary["failed"] < base.summary["failed"]


@pytest.mark.parametrize("spec, says", [
    (".rel", "plugin '.rel': give a module name (pkg.module) or a .py file"),
    ("", "plugin '': give a module name"),
    ("pdsim_h1_boom", "plugin 'pdsim_h1_boom' failed to import: RuntimeError: boom"),
    ("pdsim_h1_syntax", "plugin 'pdsim_h1_syntax' failed to import: SyntaxError"),
])
def test_a_plugin_module_that_fails_is_one_line(tmp_path, monkeypatch, capsys, spec, says):
    """A module name (not a .py file) that raised anything but ImportError, or a relative
    one, was an internal error ('a bug in pdsim'); '' said only 'Empty module name'."""
    (tmp_path / "pdsim_h1_boom.py").write_text("raise RuntimeError('boom')\n")
    (tmp_path / "pdsim_h1_syntax.py").write_text("def f(:\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["validate", "--plugin", spec, "scenarios/healthy.yaml"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err


def test_a_folder_is_not_a_plugin_but_a_package_is(tmp_path, monkeypatch, capsys):
    """--plugin NAME imports NAME as `import NAME` would. A folder without __init__.py on the
    path (the cwd, under python -c or PYTHONPATH=.) imported as an empty namespace package:
    nothing registered, nothing said. A folder path said only 'No module named'. A package
    (a folder with __init__.py) is a module and loads."""
    (tmp_path / "adir").mkdir()
    (tmp_path / "adir" / "notes.py").write_text("raise RuntimeError('never imported')\n")
    pkg = tmp_path / "pdsim_h1_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "from pdsim.engine import blacklist\n"
        "from pdsim.config.registry import BLACKLIST_POLICIES\n\n"
        "@BLACKLIST_POLICIES.register('pkg_never')\n"
        "class PkgNever(blacklist.Never):\n"
        "    'Blacklists nothing (a test plugin package).'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["validate", "--plugin", "adir", "scenarios/healthy.yaml"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and (
        f"plugin 'adir' is a folder without __init__.py ({tmp_path / 'adir'}): importing it "
        f"runs no code and registers nothing; give a .py file") in err, err
    assert "adir" not in sys.modules
    folder = str(tmp_path / "pdsim_h1_pkg")  # a path, not a name: not importable as given
    assert main(["validate", "--plugin", folder, "scenarios/healthy.yaml"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"plugin {folder!r} not importable: No module named" in err
    assert "; give a .py file or a module on the Python path, not a folder" in err, err
    try:
        assert main(["validate", "--plugin", "pdsim_h1_pkg", "scenarios/healthy.yaml",
                     "--set", "blacklist.policy=pkg_never"]) == 0
    finally:
        BLACKLIST_POLICIES.unregister("pkg_never")
        sys.modules.pop("pdsim_h1_pkg", None)

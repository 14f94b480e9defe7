"""The CLI is a thin layer over pdsim.run: run, --json, --out, --set, validate, schema."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT

from pdsim.cli.main import main

SMALL = ["--set", "clients.0.num_prompts=60", "--set", "clients.0.max_concurrency=32"]


def test_run_human_output(capsys):
    assert main(["run", "scenarios/healthy.yaml", *SMALL]) == 0
    out = capsys.readouterr().out
    assert "Serving Benchmark Result" in out
    assert "Output token throughput (tok/s):" in out
    assert "Mean TPOT (ms):" in out
    # --set made it a what-if: the healthy run's reported figures are context, not verdicts
    assert "Reported figures (context only)" in out and "within" not in out


def test_run_json_only_summary_on_stdout(capsys):
    assert main(["run", "scenarios/healthy.yaml", "--json", "--seed", "3", *SMALL]) == 0
    cap = capsys.readouterr()
    s = json.loads(cap.out)
    for key in ("requests", "successful_requests", "completed_requests", "failed",
                "empty_responses", "empty_share",
                "duration_s", "output_throughput_tok_s", "true_output_throughput_tok_s",
                "total_throughput_tok_s", "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
                "p99_tpot_ms", "mean_itl_ms", "mean_e2e_ms", "transfer_failures", "events",
                "transfer_failures_by_reason", "blacklisted_pairs_max",
                "blacklisted_pairs_final", "flushes", "wasted_prefill_tokens"):
        assert key in s, key
    assert {"flush_freed_pages", "blacklisted_session"} <= set(s["transfer_failures_by_reason"])
    assert s["requests"] == 60
    assert "completed" not in s  # renamed: successful_requests (HTTP 200s), completed_requests
    # stdout is the same bytes run after run (the wall time is on stderr)
    assert "sim_wall_s" not in s and " s wall " in cap.err
    assert main(["run", "scenarios/healthy.yaml", "--json", "--seed", "3", *SMALL]) == 0
    assert capsys.readouterr().out == cap.out


def test_run_out_writes_tables(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "scenarios/drop_timeout.yaml", "--out", str(out), "--json",
                 "--set", "clients.0.num_prompts=300", "--set", "clients.1.num_prompts=300"]) == 0
    names = {p.name for p in out.iterdir()}
    assert {"requests.csv", "events.csv", "timeseries.csv", "summary.json", "scenario.yaml",
            "run.json", "report.txt"} <= names
    s = json.loads((out / "summary.json").read_text())
    assert s == json.loads(capsys.readouterr().out)
    # self-describing: version, seed and overrides, and the resolved scenario re-runs as-is
    import pdsim

    meta = json.loads((out / "run.json").read_text())
    assert meta["pdsim_version"] == pdsim.__version__ and meta["seed"] == 1
    assert meta["overrides"] == ["clients.0.num_prompts=300", "clients.1.num_prompts=300"]
    # every subsystem's seed, as its stream starts from it (an override only where one is set)
    assert meta["seeds"] == {"arrivals": 1, "lengths": 1, "routing": 1, "faults": 1}
    assert "Serving Benchmark Result: ci_bench" in (out / "report.txt").read_text()
    assert main(["run", str(out / "scenario.yaml"), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again == s


def test_validate_and_schema(capsys):
    assert main(["validate", "scenarios/drop_timeout.yaml"]) == 0
    assert "ok" in capsys.readouterr().out
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["title"] == "Scenario"
    assert "fleet" in schema["properties"]


def test_shipped_editor_schema_is_current():
    from conftest import SCENARIOS

    from pdsim.config.loader import json_schema

    shipped = json.loads((SCENARIOS / "scenario.schema.json").read_text())
    assert shipped == json_schema(), "regenerate: pdsim schema > scenarios/scenario.schema.json"
    assert "extends" in shipped["properties"]
    for path in SCENARIOS.rglob("*.yaml"):
        up = "../" * (len(path.relative_to(SCENARIOS).parts) - 1) or "./"
        assert path.read_text().startswith(
            f"# yaml-language-server: $schema={up}scenario.schema.json"), path.name


def test_every_schema_field_is_described():
    """An editor shows a key's description on hover and completion: every field an editor can
    reach (top level, $defs, registry entries such as faults and blacklist policies) has one."""
    from pdsim.config.loader import json_schema

    bare = []

    def walk(node, path):
        if isinstance(node, dict):
            props = node.get("properties")
            if isinstance(props, dict):
                bare.extend(f"{path}.{key}" for key, sub in props.items()
                            if not (isinstance(sub, dict)
                                    and str(sub.get("description", "")).strip()))
            for key, sub in node.items():
                walk(sub, f"{path}/{key}")
        elif isinstance(node, list):
            for i, sub in enumerate(node):
                walk(sub, f"{path}[{i}]")

    schema = json_schema()
    walk(schema, "")
    assert "$defs" in schema and len(schema["$defs"]) > 10  # (the walk reached the models)
    assert not bare, f"{len(bare)} fields without a description: {', '.join(bare)}"


def test_profiles_listing(capsys):
    assert main(["profiles"]) == 0
    out = capsys.readouterr().out
    assert "dsv3-ci-test" in out and "H20" in out
    assert main(["profiles", "dsv3-ci-test"]) == 0
    assert "pr5624" in capsys.readouterr().out
    assert main(["profiles", "R100"]) == 2


def test_timeline_tells_an_idle_flush_from_a_busy_one():
    from conftest import run_cached

    from pdsim.output.report import render

    fixed = render(run_cached("forward_timeout"))
    flushed = [line for line in fixed.splitlines() if "flushed" in line]
    assert flushed and all("while idle" in line for line in flushed)
    dropped = render(run_cached("drop_timeout"))
    assert any("while busy" in line and "transfers on freed pages" in line
               for line in dropped.splitlines())


def _stderr_on_a_sizeless_tty(args: list[str]) -> str:
    """What `pdsim ARGS` draws on a pseudo-terminal that reports 0x0, as `script` makes one
    without a terminal (tqdm reads -1 rows there and hid every bar)."""
    pty = pytest.importorskip("pty")
    import fcntl
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 0, 0, 0, 0))
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "TQDM_MININTERVAL": "0"}  # every finished run redraws: the last state is N/N
    proc = subprocess.Popen([sys.executable, "-m", "pdsim.cli", *args], cwd=ROOT, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed its end
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(timeout=120) == 0
    return b"".join(chunks).decode(errors="replace")


@pytest.mark.parametrize("args", [
    ["sweep", "scenarios/healthy.yaml", "--vary", "clients.0.num_prompts=20,30", "--seeds", "1"],
    ["whatif", "scenarios/whatif_base.yaml", "--set", "clients.0.num_prompts=100",
     "--faults", "decode_crash", "--policy", "never", "--seeds", "1", "--loads", "base"],
], ids=["sweep", "whatif"])  # (--loads base: the base's own load, no capacity search)
def test_sweep_and_whatif_draw_a_runs_bar_on_a_terminal_of_unknown_size(args):
    drawn = _stderr_on_a_sizeless_tty([*args, "--workers", "1"])
    assert "0/2 [" in drawn and "2/2 [" in drawn and "run/s]" in drawn, drawn


def test_run_progress_draws_its_bar_on_a_terminal_of_unknown_size():
    """`run --progress` shares the runs bar's terminal handling (validate-model and holdout
    use it too): on a 0x0 terminal tqdm alone drew nothing."""
    drawn = _stderr_on_a_sizeless_tty(["run", "scenarios/healthy.yaml", "--progress", *SMALL])
    assert "/60 [" in drawn and "req/s" in drawn and "60/60 [" in drawn, drawn


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_run_format_without_out_is_a_usage_error(fmt, capsys):
    assert main(["run", "scenarios/healthy.yaml", "--format", fmt, *SMALL]) == 2
    cap = capsys.readouterr()
    assert cap.out == ""  # refused before running, not run and the flag dropped
    assert cap.err == "pdsim: error: --format picks the table format of --out DIR; add --out\n"


def test_ctrl_c_wrapped_in_another_exception_is_an_interrupt(monkeypatch, capsys):
    """Ctrl-C landing while a class is built (a lazy import) reaches main as RuntimeError
    ('Error calling __set_name__ ...') from KeyboardInterrupt: it said 'internal error: ...
    this is a bug in pdsim', exit 70."""
    from pdsim.config import loader

    def interrupted(*_a, **_k):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as err:
            raise RuntimeError("Error calling __set_name__ on 'X'") from err

    monkeypatch.setattr(loader, "load", interrupted)
    assert main(["validate", "scenarios/healthy.yaml"]) == 130
    assert capsys.readouterr().err == "pdsim: interrupted\n"


def test_transfer_failures_tell_failed_writes_from_blacklist_fast_fails():
    """A blacklisted pair's transfer fails at the engine's check, before any write: the fleet
    block counted those 1,347 with the 13 writes that failed (ret != 0) as one figure."""
    from conftest import run_cached

    from pdsim.output.report import render

    res = run_cached("drop_timeout")
    by = res.summary["transfer_failures_by_reason"]
    fast, freed = by["blacklisted_session"], by["flush_freed_pages"]
    line = next(ln for ln in render(res).splitlines() if ln.startswith("Transfer failures:"))
    assert line.endswith(f"{fast + freed}: {freed} writes (ret != 0: flush_freed_pages "
                         f"{freed}); {fast} failed fast on a blacklisted pair (no write)"), line


def test_run_json_names_the_seed_of_every_stream():
    """run.json's seeds listed only the overrides ({} for most runs) where the docs promise
    per-subsystem seeds: it now gives each stream's starting seed, an override where set."""
    import pdsim

    res = pdsim.run("scenarios/healthy.yaml", ["seeds.routing=7", *SMALL[1::2]])
    meta = json.loads(res.describe()["run.json"])
    assert meta["seed"] == 1
    assert meta["seeds"] == {"arrivals": 1, "lengths": 1, "routing": 7, "faults": 1}


def test_validate_prints_the_kv_pool_each_rank_gets(capsys):
    """SGLang logs max_total_num_tokens at start-up; pdsim derived it and showed it nowhere.
    validate prints each role's pool per DP rank, the one a run builds."""
    import pdsim

    sets = ["fleet.decode.kv_pool_tokens=123456", "fleet.prefill.page_size=64"]
    assert main(["validate", "scenarios/healthy.yaml", *[a for s in sets for a in ("--set", s)],
                 "--set", "fleet.prefill.max_running_requests=64"]) == 0
    line, running = capsys.readouterr().out.splitlines()[1:3]
    # and the running requests a rank takes: given, or SGLang's default for its pool (123,456
    # tokens / DeepSeek-V3's 163,840-token context x 512 = 385 request slots, raised to 2,048)
    assert running == ("Running requests per DP rank (max_running_requests): prefill 64 "
                       "(given), decode 2,048 (SGLang's default for the pool: min(pool // 2, "
                       "request slots))")
    res = pdsim.run("scenarios/healthy.yaml", [*sets, "clients.0.num_prompts=5"])
    pages = {r.split("-")[0]: p["capacity"] for r, p in res.kv_pools.items()}
    prefill = pages["prefill"] * 64  # (tokens, not pages)
    assert line == (f"KV pool per DP rank (SGLang's max_total_num_tokens): prefill "
                    f"{prefill:,} tokens (mem_fraction_static 0.759 after weights (SGLang "
                    f"0.5.9's default for H20 at tp 4, dp 4 with dp attention), in whole "
                    f"64-token pages), decode 123,456 tokens (kv_pool_tokens)")


def test_what_the_cli_writes_at_its_example_names_is_ignored_by_git():
    """`pdsim run --perfetto X.perfetto.json`, `--plot FILE.png` at the top, `pdsim calibrate`'s
    DATA.profile.yaml and DATA.residuals.png, run directories: left untracked by .gitignore,
    and no tracked file is ignored."""
    outputs = ["drop.perfetto.json", "x.perfetto.json.gz", "steps.profile.yaml",
               "steps.residuals.png", "postmortem.png", "runs/dt/summary.json"]
    got = subprocess.run(["git", "check-ignore", "--no-index", *outputs], cwd=ROOT,
                         capture_output=True, text=True)
    assert got.stdout.split() == outputs, got.stderr
    tracked = subprocess.run(["git", "ls-files", "-ci", "--exclude-standard"], cwd=ROOT,
                             capture_output=True, text=True, check=True)
    assert tracked.stdout == ""

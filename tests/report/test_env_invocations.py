"""compare's environment check reads every invocation's fingerprint (envs/<run_id>.json), not
only env.json: a run resumed under another driver is not comparable, and says why."""

from __future__ import annotations

import json

from moebench.cli.main import main
from moebench.report.envinfo import environment_check
from moebench.report.load import load_run
from moebench.results.synthetic import default_env, synthetic_run


def _invocation(run, run_id: str, **changes) -> None:
    env = default_env()
    env.update(changes)
    (run / "envs").mkdir(exist_ok=True)
    (run / "envs" / f"{run_id}.json").write_text(json.dumps(env))


def test_a_run_resumed_under_another_driver_is_not_comparable(tmp_path, capsys):
    base, cand = synthetic_run(tmp_path / "base"), synthetic_run(tmp_path / "cand")
    _invocation(base, "a")
    _invocation(cand, "b")
    ok, diffs = environment_check(load_run(base)[1], load_run(cand)[1])
    assert ok and diffs == []
    # the candidate resumed later under another driver and torch: env.json is still the first's
    smi = ["NVIDIA H200, 575.51.03, 1980 MHz, 1980 MHz, 3201 MHz, 700.00 W, 35"]
    _invocation(cand, "c", nvidia_smi=smi, torch="2.12.0+cu130")
    ok, diffs = environment_check(load_run(base)[1], load_run(cand)[1])
    assert not ok
    assert "driver: 580.159.04 → 575.51.03 / 580.159.04" in diffs
    assert "torch: 2.11.0+cu130 → 2.11.0+cu130 / 2.12.0+cu130" in diffs
    code = main(["compare", str(base), str(cand), "--out", str(tmp_path / "cmp"), "--fail-on", "env"])
    out = capsys.readouterr().out
    assert code == 1 and "not comparable" in out and "575.51.03" in out


def test_a_garbage_invocation_file_is_passed_over_with_a_warning(tmp_path, capsys):
    run = synthetic_run(tmp_path / "run")
    (run / "envs").mkdir()
    (run / "envs" / "x.json").write_text("{not json")
    env = load_run(run)[1]
    assert env["invocations"] == {}
    assert "x.json: not a JSON fingerprint" in capsys.readouterr().err


def test_runs_whose_cpu_thread_setting_differs_are_not_comparable(tmp_path, capsys):
    """MOEBENCH_CPU_THREADS (env.json's cpu_threads) sets every CPU rank's torch threads: two runs
    of a machine without a GPU that differ in it are not compared; GPU ranks do not read it."""
    cpu = {"gpu": "cpu", "gpu_count": 0, "torch": "2.13.0+cpu", "triton": "3.6.0", "env": {}}
    one, two = dict(cpu, cpu_threads=1), dict(cpu, cpu_threads=2)
    assert environment_check(one, dict(one)) == (True, [])
    assert environment_check(one, two) == (False, ["CPU threads: 1 → 2"])
    # fingerprints from before the record: MOEBENCH_CPU_THREADS as set, else the default of then
    assert environment_check(dict(cpu, env={"MOEBENCH_CPU_THREADS": "1"}), one) == (True, [])
    ok, diffs = environment_check(cpu, one)
    assert not ok and diffs == ["CPU threads: cores ÷ ranks (unset, before the default of 1) → 1"]
    gpu = default_env()  # a GPU machine's runs: no such setting to compare (an old one records none)
    assert environment_check(gpu, dict(gpu, cpu_threads=1)) == (True, [])
    base, cand = synthetic_run(tmp_path / "base"), synthetic_run(tmp_path / "cand")
    (base / "env.json").write_text(json.dumps(one))
    (cand / "env.json").write_text(json.dumps(two))
    code = main(["compare", str(base), str(cand), "--out", str(tmp_path / "cmp"), "--fail-on", "env"])
    out = capsys.readouterr().out
    assert code == 1 and "environments: **not comparable** — CPU threads: 1 → 2" in out

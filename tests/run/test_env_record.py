"""What every env.json records of moebench itself: its version (tests/cli/test_version.py) and the
torch threads of each CPU rank (MOEBENCH_CPU_THREADS, 1 unless set: moebench/config/device.py
cpu_threads)."""

from __future__ import annotations

import json

import pytest
import torch
from one_combination import ONE_TINY

from moebench import __version__
from moebench.config.device import cpu_threads
from moebench.run.sweep import execute
from moebench.run.worker import rank_device

TINY = [*ONE_TINY, "runner.device=cpu"]


@pytest.mark.multiprocess
def test_every_env_json_records_the_version_and_the_cpu_threads(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.delenv("MOEBENCH_CPU_THREADS", raising=False)  # the tests' own 1 (conftest.py) unset
    run_dir, counts = execute(TINY, None, str(tmp_path / "run"), quiet=True)
    assert counts.exit_code() == 0
    first = json.loads((run_dir / "env.json").read_text())
    assert (first["moebench"], first["cpu_threads"]) == (__version__, 1)
    monkeypatch.setenv("MOEBENCH_CPU_THREADS", "2")
    execute(TINY, None, str(run_dir), redo="all", quiet=True)  # a second invocation: envs/<run_id>.json
    envs = [json.loads(p.read_text()) for p in (run_dir / "envs").glob("*.json")]
    assert sorted((e["moebench"], e["cpu_threads"]) for e in envs) == [(__version__, 1), (__version__, 2)]


def test_a_cpu_rank_runs_one_torch_thread_unless_told(monkeypatch):
    before = torch.get_num_threads()
    try:
        monkeypatch.delenv("MOEBENCH_CPU_THREADS", raising=False)
        torch.set_num_threads(2)
        assert rank_device("cpu", 0) == torch.device("cpu") and torch.get_num_threads() == cpu_threads() == 1
        monkeypatch.setenv("MOEBENCH_CPU_THREADS", "2")
        rank_device("cpu", 0)
        assert torch.get_num_threads() == cpu_threads() == 2
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5"])
def test_a_cpu_thread_count_that_is_no_positive_integer_is_refused(monkeypatch, value):
    monkeypatch.setenv("MOEBENCH_CPU_THREADS", value)
    with pytest.raises(ValueError, match="positive integer"):
        cpu_threads()

"""Where `moebench tune` writes: `--results RUN` of a run committed under results/ writes under
runs/reports/<its path> as `moebench report` does (reading a committed run changes no tracked
file), elsewhere beside the run; a tune's folder holds its environment fingerprint (env.json)
from the start, so that an interrupted one has it too."""

from __future__ import annotations

import json
from pathlib import Path

from one_combination import TINY_TUNE

from moebench import cli

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "results" / "default_sweep" / "h200x1_held"  # GPU-time rows compete at each size
HOST_TIME = REPO / "results" / "triton_vs_torch" / "events"  # eager events before the hold: host time


def test_results_of_a_committed_run_go_under_runs_reports(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MOEBENCH_RUNS", str(tmp_path / "runs"))
    committed = COMMITTED / "report" / "best_per_size.json"
    before = committed.read_bytes() if committed.exists() else None
    assert cli.main(["tune", "--results", str(COMMITTED)]) == 0
    out = tmp_path / "runs" / "reports" / "default_sweep" / "h200x1_held" / "report"
    rows = json.loads((out / "best_per_size.json").read_text())["rows"]
    assert rows and (out / "best_per_size.png").stat().st_size > 0
    assert (committed.read_bytes() if committed.exists() else None) == before  # the committed tree untouched
    assert "is committed: writing to" in capsys.readouterr().err
    # a run elsewhere: beside it, as before
    mine = tmp_path / "mine"
    (mine / "rows").mkdir(parents=True)
    for f in (COMMITTED / "rows").glob("*.parquet"):
        (mine / "rows" / f.name).write_bytes(f.read_bytes())
    assert cli.main(["tune", "--results", str(mine)]) == 0
    assert (mine / "report" / "best_per_size.json").is_file()


def test_results_of_a_run_of_host_time_rank_nothing(tmp_path, monkeypatch, capsys):
    """Every ok row of this run was timed before the hold and read the host's launches: no table
    rests on them (exit 2, saying why)."""
    monkeypatch.setenv("MOEBENCH_RUNS", str(tmp_path / "runs"))
    assert cli.main(["tune", "--results", str(HOST_TIME)]) == 2
    err = capsys.readouterr().err
    assert "no ok row of this run is GPU time" in err and "host time" in err
    assert not (tmp_path / "runs").exists()


def test_a_tune_folder_holds_its_environment_even_when_interrupted(tmp_path, monkeypatch, capsys):
    from moebench.tune import search

    def interrupted(*a, **k):  # Ctrl-C at the first trial
        raise KeyboardInterrupt

    monkeypatch.setattr(search, "run_tokens", interrupted)
    out = tmp_path / "tune"
    argv = TINY_TUNE + ["--out", str(out)]  # its samples never taken: interrupted at the first trial
    assert cli.main(argv) == 130
    env = json.loads((out / "env.json").read_text())
    assert env["gpu"] == "cpu" and env["env_id"] and "git_tree" in env and "git_dirty" in env
    assert [p.name for p in (out / "envs").glob("*.json")] == [f"{env['run_id']}.json"]
    assert cli.main(argv) == 130  # a resumed tune adds its own; env.json stays the first one's
    assert len(list((out / "envs").glob("*.json"))) == 2
    assert json.loads((out / "env.json").read_text())["run_id"] == env["run_id"]

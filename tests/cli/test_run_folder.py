"""`moebench run --help` names the folder a run is written to (moebench/config/paths.py ADHOC, the
sweep name a run without a sweep file records; moebench/run/plan.py run_name)."""

from __future__ import annotations

import re

import pytest
from one_combination import ONE_TINY

from moebench import cli
from moebench.run.plan import run_name

TINY = [*ONE_TINY, "runner.device=cpu"]


@pytest.mark.multiprocess
def test_run_help_names_the_folder_a_run_writes(runs_dir, capsys, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the help where it likes
    named = re.search(r"--out OUT run directory[^(]*\(default: runs/([\w.-]+)-<hash of the overrides>\)", text)
    assert named, text
    assert cli.main(["run", *TINY]) == 0
    assert [p.name for p in runs_dir.iterdir()] == [run_name(named.group(1), TINY)]

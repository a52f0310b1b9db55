"""A write that fails after its file is in place (the folder's fsync after the rename: EIO on a
failing disk) stored its rows all the same: the sweep's line counts the rows on disk, not the
ones it had counted (issue #52 item 7)."""

from __future__ import annotations

import errno
import os

import pytest

from moebench import cli
from moebench.results import store as store_mod
from moebench.results.store import RunStore
from tests.results.test_env_errors import LOCAL


@pytest.fixture(autouse=True)
def no_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")


@pytest.mark.multiprocess
def test_a_failed_folder_fsync_counts_the_rows_stored(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    tokens = "workload.tokens_per_rank=[4,8]"
    two = [*(a if not a.startswith("workload.tokens") else tokens for a in LOCAL), "reduction=experts,finalize"]
    real, synced = store_mod._fsync, []

    def rows_fsync_fails_the_second_time(path):
        if os.path.abspath(path) == str(run / "rows"):
            synced.append(path)
            if len(synced) == 2:  # the second row file is renamed into place, then its folder's fsync fails
                raise OSError(errno.EIO, "Input/output error", str(path))
        real(path)

    monkeypatch.setattr(store_mod, "_fsync", rows_fsync_fails_the_second_time)
    assert cli.main(["sweep", *two, "--out", str(run)]) == 1
    monkeypatch.setattr(store_mod, "_fsync", real)
    err = capsys.readouterr().err
    line = next(ln for ln in err.splitlines() if "environment error" in ln)
    assert "input/output error" in line and "keeping the 4 measured rows it stored" in line, err
    assert len(RunStore(run).load()) == 4
    assert cli.main(["sweep", *two, "--out", str(run)]) == 0
    assert "nothing to do: all 4 rows that can run are already stored" in capsys.readouterr().err

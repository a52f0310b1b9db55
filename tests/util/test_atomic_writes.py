"""Every file a command writes goes through a temp name beside it and a rename
(moebench/util/safe_write.py; issue #52 item 5): a full disk mid-write leaves the old file or none,
never a truncated one, no temp file behind, and the error line names the file."""

from __future__ import annotations

import errno

import pytest

from moebench import cli
from moebench.results.synthetic import synthetic_run
from moebench.util import safe_write
from moebench.util.safe_write import open_write, write_bytes


def full_disk_after_half(monkeypatch, suffix: str = "") -> list:
    """The next write of a file named ...`suffix` stores half its bytes, then the disk is full
    (write()'s ENOSPC names no file, as pyarrow's and the kernel's do)."""
    hit = []
    real = safe_write._write_all

    def half(f, data):
        if not f.final.name.endswith(suffix):
            return real(f, data)
        hit.append(f.final)
        f.write(data[: len(data) // 2])
        f.flush()
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(safe_write, "_write_all", half)
    return hit


def test_a_full_disk_mid_write_keeps_the_old_file_and_names_the_path(tmp_path, monkeypatch):
    path = tmp_path / "latency.png"
    write_bytes(path, b"old figure")
    full_disk_after_half(monkeypatch)
    with pytest.raises(OSError) as e:
        write_bytes(path, b"x" * 100_000)
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(path)
    assert path.read_bytes() == b"old figure"
    assert [p.name for p in tmp_path.iterdir()] == ["latency.png"]  # no temp file behind
    with pytest.raises(OSError):
        write_bytes(tmp_path / "new.png", b"y" * 1000)
    assert not (tmp_path / "new.png").exists()


def test_open_write_renames_only_a_block_that_ends_well(tmp_path):
    path = tmp_path / "trace.json"
    with open_write(path) as f:
        f.write(b"{}")
        assert not path.exists()  # under its temp name until the block ends
    assert path.read_bytes() == b"{}"
    with pytest.raises(RuntimeError), open_write(path) as f:
        f.write(b"{half")
        raise RuntimeError("the writer failed")
    assert path.read_bytes() == b"{}" and [p.name for p in tmp_path.iterdir()] == ["trace.json"]


def test_report_on_a_full_disk_leaves_no_partial_plot_and_names_it(tmp_path, monkeypatch, capsys):
    run = synthetic_run(tmp_path / "run")
    out = tmp_path / "report"
    hit = full_disk_after_half(monkeypatch, "latency.png")
    assert cli.main(["report", str(run), "--out", str(out)]) == 2  # an environment error, not 1 nor 3
    assert hit == [out / "latency.png"]
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "error" in ln]
    assert lines == [f"moebench report: environment error: {out / 'latency.png'}: no space left on the device"]
    assert not (out / "latency.png").exists()
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temp file behind

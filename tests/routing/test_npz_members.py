"""A recording's members are checked before they are read (moebench/routing/npz.py, issue #52):
a member that inflates past the limit is refused with one line before anything is inflated; a
member cut short or corrupt is called that, naming the file and the member (not "an object
array"); each is exit 2 before any work."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest

from moebench import cli
from moebench.routing import file, npz


def _ids(n=10):
    rng = np.random.default_rng(1)
    return np.stack([rng.choice(128, 8, replace=False) for _ in range(n)]).astype(np.int32)


def _npy(a) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, a, allow_pickle=False)
    return buf.getvalue()


def _zip(path, members: dict[str, bytes], method=zipfile.ZIP_STORED) -> str:
    with zipfile.ZipFile(path, "w", compression=method) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return str(path)


def _sweep_error(tmp_path, capsys, path) -> str:
    rc = cli.main(
        [
            "sweep",
            "--out",
            str(tmp_path / "run"),
            "backend=local",
            "experts=torch",
            "model=qwen3_30b_a3b",
            "workload.routing=replay",
            f"workload.routing_file={path}",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and path in lines[0], err
    assert not (tmp_path / "run").exists()  # before any work
    return lines[0]


def test_a_member_over_the_limit_is_refused_before_it_is_inflated(tmp_path, capsys, monkeypatch):
    # 32 MB of ids deflate to a few KB: a small file that would inflate whole
    big = np.zeros((1 << 22, 2), np.int32)
    path = _zip(tmp_path / "bomb.npz", {"topk_ids.npy": _npy(big)}, zipfile.ZIP_DEFLATED)
    size = zipfile.ZipFile(path).getinfo("topk_ids.npy").file_size
    assert size > 32e6 > 500 * (tmp_path / "bomb.npz").stat().st_size
    monkeypatch.setenv(npz.LIMIT_ENV, "1000000")
    opened = []
    real_open = zipfile.ZipFile.open
    monkeypatch.setattr(zipfile.ZipFile, "open", lambda self, *a, **k: opened.append(a) or real_open(self, *a, **k))
    line = _sweep_error(tmp_path, capsys, path)
    assert f"member topk_ids.npy inflates to {size:,} bytes, over the limit of 1,000,000" in line, line
    assert npz.LIMIT_ENV in line and not opened  # refused from the zip directory: nothing read
    # the default limit refuses the 3.2 GB member
    assert npz.MAX_MEMBER_BYTES < 3.2e9


def test_a_truncated_member_is_named_as_such(tmp_path, capsys):
    data = _npy(_ids())
    path = _zip(tmp_path / "cut.npz", {"topk_ids.npy": data[: len(data) - 100]})
    line = _sweep_error(tmp_path, capsys, path)
    assert "member topk_ids.npy is truncated or corrupt" in line and "object array" not in line, line
    with pytest.raises(file.RoutingFileError, match="truncated or corrupt"):
        file.load(path)


def test_a_corrupt_deflated_member_is_named(tmp_path, capsys):
    path = str(tmp_path / "flip.npz")
    file.write(path, _ids(2000), source="a recording")
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo("topk_ids.npy")
    raw = bytearray(open(path, "rb").read())
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    for i in range(start + 200, start + 260):  # inside the deflated data, past the .npy header
        raw[i] ^= 0x5A
    open(path, "wb").write(bytes(raw))
    line = _sweep_error(tmp_path, capsys, path)
    assert "member topk_ids.npy is truncated or corrupt" in line, line


def test_a_file_cut_short_and_a_bad_limit_are_one_line(tmp_path, capsys, monkeypatch):
    path = str(tmp_path / "short.npz")
    file.write(path, _ids(2000))
    raw = open(path, "rb").read()
    open(path, "wb").write(raw[: len(raw) // 2])
    assert "cut short" in _sweep_error(tmp_path, capsys, path)
    ok = str(tmp_path / "ok.npz")
    file.write(ok, _ids())
    monkeypatch.setenv(npz.LIMIT_ENV, "lots")
    assert f"{npz.LIMIT_ENV}='lots' is no byte count" in _sweep_error(tmp_path, capsys, ok)
    monkeypatch.setenv(npz.LIMIT_ENV, "100000")
    assert file.load(ok).tokens == 10  # a limit the members fit

"""`moebench trace` on hostile inputs (issue #18): a gzip that inflates far past the size cap,
and JSON nested deeper than Python's recursion limit, each refused with one line and exit 2,
in bounded memory."""

from __future__ import annotations

import gzip
import resource

import pytest

from moebench import cli
from moebench.traces.torch_trace import load_json


def _gzip_bomb(path, inflated_mb: int) -> None:
    """`{"traceEvents": [0, 0, ...` of `inflated_mb` MB in a gzip of a few hundred KB, written in
    pieces (the test itself never holds it inflated)."""
    piece = b"0," * (1 << 19)  # 1 MiB
    with gzip.open(path, "wb", compresslevel=9) as f:
        f.write(b'{"traceEvents": [')
        for _ in range(inflated_mb):
            f.write(piece)
        f.write(b"0]}")


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def test_a_gzip_bomb_is_refused_while_inflating(tmp_path, capsys):
    bomb = tmp_path / "bomb.json.gz"
    _gzip_bomb(bomb, 400)
    assert bomb.stat().st_size < 2_000_000
    before = _peak_rss_mb()
    rc = cli.main(["trace", str(bomb), "--max-trace-mb", "64"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and "more than 64 MB inflated" in err[0] and "--max-trace-mb" in err[0], err
    # read in chunks and dropped at the cap: nowhere near the 400 MB (or the GBs a parse would take)
    assert _peak_rss_mb() - before < 200


def test_the_default_cap_holds_and_a_larger_cap_lets_a_trace_through(tmp_path):
    bomb = tmp_path / "bomb.json.gz"
    _gzip_bomb(bomb, 300)
    with pytest.raises(ValueError, match="more than 256 MB inflated"):
        load_json(bomb)  # the default cap
    small = tmp_path / "small.json.gz"
    _gzip_bomb(small, 2)
    assert len(load_json(small, max_mb=8)["traceEvents"]) == 2 * (1 << 19) + 1


def test_a_plain_json_over_the_cap_is_refused(tmp_path, capsys):
    big = tmp_path / "big.json"
    big.write_bytes(b'{"traceEvents": [' + b"0," * 3_000_000 + b"0]}")
    assert cli.main(["trace", str(big), "--max-trace-mb", "5"]) == 2
    assert "more than 5 MB, the limit on a trace" in capsys.readouterr().err


@pytest.mark.parametrize("depth", [10_000, 200_000])
def test_deep_nesting_is_refused_in_one_line(tmp_path, capsys, depth):
    deep = tmp_path / "deep.json"
    deep.write_text('{"traceEvents": ' + "[" * depth + "]" * depth + "}")
    rc = cli.main(["trace", str(deep)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "nested too deeply" in err[0], err


def test_a_corrupt_gzip_is_one_line_too(tmp_path, capsys):
    bad = tmp_path / "bad.json.gz"
    data = gzip.compress(b'{"traceEvents": []}' * 1000)
    bad.write_bytes(data[: len(data) // 2])
    assert cli.main(["trace", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a readable JSON trace" in err[0], err


def test_an_nsys_export_over_the_cap_is_refused(tmp_path, capsys):
    db = tmp_path / "big.sqlite"
    db.write_bytes(b"\0" * 3_000_000)
    assert cli.main(["trace", str(db), "--max-trace-mb", "1"]) == 2
    assert "over the 1 MB limit on a trace" in capsys.readouterr().err

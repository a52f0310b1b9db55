"""`moebench tune --max-regression X`: the decision on explicit figures, bad values refused
before any work, and two real runs through the interpreter on the tiny layer: a tuned table
timed against a slower installed one passes and is installed; a table slower than the one
installed is refused (exit 1, nothing installed, the file kept in --out)."""

from __future__ import annotations

import json
import math

import pytest
from one_combination import TINY_TUNE

from moebench import cli
from moebench.kernels.triton import config as tconfig
from moebench.tune.regression import Check, SizeCheck, parse_max_regression, regressed


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _entry(bm=16, bn=64, bk=128, g=1, w=4, s=3):
    return dict(BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, GROUP_SIZE_M=g, num_warps=w, num_stages=s)


# in the interpreter a tile this small runs ~3.4x the programs' work of the small space's
# 64-wide ones (measured: 7.6 s against 1.5-2.2 s a call on the tiny layer at 4 tokens)
SLOW = _entry(16, 32, 32)
ARGV = TINY_TUNE


def test_max_regression_decides_on_the_medians():
    a, b = _entry(), _entry(32, 64, 64)

    def size(tuned_us, current_us, **kw):
        current = kw.pop("current", b)
        return SizeCheck(tokens=64, tuned=a, current=current, tuned_us=tuned_us, current_us=current_us, **kw)

    assert not regressed(size(101.9, 100.0), 0.02) and regressed(size(102.1, 100.0), 0.02)
    assert not regressed(size(99.0, 100.0), 0.0) and regressed(size(100.1, 100.0), 0.0)
    assert regressed(size(float("nan"), 100.0, tuned_error="incorrect: rel_err 0.5 > 0.02"), 10.0)
    assert not regressed(size(100.0, float("nan"), current_error="OutOfResources: shared memory"), 0.0)
    same = size(500.0, 100.0, current=dict(a))  # one config: installing changes nothing there
    assert same.same and same.ratio == 1.0 and not regressed(same, 0.0)
    check = Check(
        max_regression=0.02,
        reps=30,
        timing="graph",
        sizes=[size(101.0, 100.0), size(130.0, 100.0, ci_lo=1.21, ci_hi=1.38), same],
    )
    assert not check.passed and [s.tokens for s in check.regressions] == [64]
    (line,) = check.lines()
    assert line == "64 tokens: tuned 130 µs vs current 100 µs = 1.300x [95 % CI 1.210, 1.380], above 1.02x"
    assert "1 of 3 token counts regresses; worst 1.300x at 64 tokens" in check.verdict()
    d = check.to_json()
    assert d["passed"] is False and [s["regressed"] for s in d["sizes"]] == [False, True, False]
    assert d["sizes"][2]["same"] and d["sizes"][0]["ci_lo"] is None  # NaN written as null


def test_the_check_writes_times_in_the_unit_that_reads_best():
    """A CPU tune's check times seconds a call: its table and lines read '1.02 s', not '1019265.2 µs'
    (words.latency); the ratio and its interval keep their three decimals."""
    a, b = _entry(), _entry(32, 64, 64)
    slow = SizeCheck(tokens=4, tuned=a, current=b, tuned_us=1019265.2, current_us=812345.6, ci_lo=1.2, ci_hi=1.3)
    check = Check(max_regression=0.02, reps=3, timing="host", sizes=[slow])
    table = check.table()
    assert "| tokens | tuned | current | tuned / current [95 % CI] | check |" in table
    assert "| 4 | 1.02 s | 812 ms | 1.255 [1.200, 1.300] | REGRESSED |" in table, table
    assert check.lines() == ["4 tokens: tuned 1.02 s vs current 812 ms = 1.255x [95 % CI 1.200, 1.300], above 1.02x"]
    assert "µs" not in table


@pytest.mark.parametrize("text", ["0", "0.02", "1.5"])
def test_max_regression_takes_a_fraction(text):
    assert parse_max_regression(text) == float(text)


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--max-regression", "-0.1"], "--max-regression -0.1: give a finite fraction >= 0"),
        (["--max-regression", "2%"], "--max-regression '2%': give a fraction >= 0"),
        (["--max-regression", "nan"], "give a finite fraction"),
        (["--max-regression", "inf"], "give a finite fraction"),
        (["--max-regression", "0.02", "--install-from", "somewhere"], "--install-from somewhere: no "),
        (["--max-regression", "0.02", "--check-vllm", "file.json"], "--check-vllm times nothing"),
    ],
)
def test_a_bad_max_regression_exits_2_before_any_work(extra, words, tmp_path, monkeypatch, capsys):
    from moebench.measure import layer

    def build_layer(*args):
        raise AssertionError("built a layer before refusing --max-regression")

    monkeypatch.setattr(layer, "build_layer", build_layer)
    out = tmp_path / "tune"
    assert cli.main(ARGV + ["--out", str(out)] + extra) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_max_regression_installs_a_faster_table_and_refuses_a_slower_one(tmp_path, monkeypatch, capsys):
    # kernels/configs/ of this test: the layer's current config at 4 tokens is SLOW
    top, part = tmp_path / "configs", tmp_path / "configs" / "partial"
    monkeypatch.setattr(tconfig, "CONFIG_DIR", top)
    monkeypatch.setattr(tconfig, "PARTIAL_DIR", part)
    monkeypatch.delenv(tconfig.CONFIG_DIR_ENV, raising=False)
    name = tconfig.config_file_name(8, 128, None, None)
    part.mkdir(parents=True)
    (part / name).write_text(json.dumps({"4": SLOW}))
    tconfig._load_configs.cache_clear()
    out = tmp_path / "tune"
    # the check's verdict on the median of 3 interleaved samples each: one sample of each, beside
    # a second pytest worker and other work, once timed SLOW at 0.75x the tuned table (it is ~2.5x)
    # --allow-cpu-tiles: the interpreter's tiles are host time, installed here only to test the install
    argv = ARGV + ["--out", str(out), "--install", "--allow-cpu-tiles", "--final-reps", "3"]

    # 1. the search beats SLOW (it competes as the current baseline); the check times the winner
    # against it again, interleaved, passes and the table is installed
    assert cli.main(argv + ["--max-regression", "0.5"]) == 0
    captured = capsys.readouterr()
    tuned = json.loads((out / "configs" / name).read_text())["4"]
    assert tuned != SLOW
    check = json.loads((out / "tune.json").read_text())["regression_check"]
    assert check["passed"] and check["max_regression"] == 0.5 and check["reps"] == 3 and check["timing"] == "host"
    (s,) = check["sizes"]
    assert s["tokens"] == 4 and s["tuned"] == tuned and s["current"] == SLOW and not s["same"]
    assert len(s["tuned_samples"]) == len(s["current_samples"]) == 3  # --final-reps, timed in this call
    assert 0 < s["tuned_us"] < s["current_us"] and s["ratio"] < 1 and not s["regressed"]
    assert "--max-regression 0.5 (50 %): passed at 1 token count against" in captured.out
    assert "; host time (the interpreter's), not a GPU's" in captured.out  # the verdict says what it rests on
    assert json.loads((part / name).read_text())["4"] == tuned  # installed over SLOW
    side = json.loads(
        (part / tconfig.config_file_name(8, 128, None, None).replace(".json", ".provenance.json")).read_text()
    )
    assert side["entries"]["4"]["max_regression_check"]["current"] == SLOW

    # 2. the tuned table is now the current one. A search that picks SLOW again (stored trials of
    # another day could: the same command resumes from them) is timed against it and refused
    from moebench.tune import search

    real = search.tune

    def picks_slow(*a, **k):
        info, pruned, results, stats, wall = real(*a, **k)
        results[0].best = dict(SLOW)
        return info, pruned, results, stats, wall

    monkeypatch.setattr(search, "tune", picks_slow)
    assert cli.main(argv + ["--max-regression", "0.5"]) == 1
    err = capsys.readouterr().err
    (line,) = [ln for ln in err.splitlines() if ln.startswith("moebench tune: regression: ")]
    assert line.startswith("moebench tune: regression: 4 tokens: tuned ") and "above 1.5x" in line
    assert "not installed" in err
    assert json.loads((part / name).read_text())["4"] == tuned  # nothing installed
    assert json.loads((out / "configs" / name).read_text())["4"] == SLOW  # the table is still in --out
    check = json.loads((out / "tune.json").read_text())["regression_check"]
    (s,) = check["sizes"]
    assert not check["passed"] and s["regressed"] and s["current"] == tuned and s["tuned"] == SLOW
    assert s["ratio"] > 1.5 and math.isclose(s["ratio"], s["tuned_us"] / s["current_us"])
    tconfig._load_configs.cache_clear()

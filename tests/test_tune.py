"""`moebench tune`: the Triton tile search end to end through the interpreter on
a tiny layer, the vLLM-named config it writes being picked up by the experts,
and the best combination per size of a run."""
from __future__ import annotations

import json
import os

import pytest

from moebench import cli
from moebench.kernels.triton import config as tconfig


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def test_tune_writes_a_vllm_config_the_experts_then_use(tmp_path, monkeypatch, capsys):
    out = tmp_path / "tune"
    rc = cli.main(["tune", "experts=triton", "backend=local", "model=tiny", "quant=bf16",
                   "workload.tokens_per_rank=[4]", "--space", "small", "--reps", "2", "--out", str(out)])
    assert rc == 0
    name = tconfig.config_file_name(8, 128, None, None)
    path = out / "configs" / name
    best = json.loads(path.read_text())
    assert set(best) == {"4"} and set(best["4"]) == set(tconfig.CONFIG_KEYS)
    detail = json.loads((out / "tune.json").read_text())
    (res,) = detail["results"]
    ok = [t for t in res["trials"] if not t["error"]]
    assert len(ok) >= 2 and all(t["us"] > 0 and t["rel_err"] <= 2e-2 for t in ok)
    assert res["best"]["us"] == min(t["us"] for t in ok)
    assert "speed-up" in capsys.readouterr().out
    # the harness's lookup now returns the tuned tile for that layer
    monkeypatch.setenv(tconfig.CONFIG_DIR_ENV, str(out / "configs"))
    assert tconfig.get_config(8, 128, 4) == best["4"]


@pytest.mark.parametrize("argv, words", [
    (["tune", "experts=torch", "backend=local"], "experts=triton"),
    (["tune", "experts=triton", "backend=naive"], "backend=local"),
    (["tune", "experts=triton", "backend=local", "--space", "huge"], "--space"),
])
def test_tune_refuses_what_it_cannot_search(argv, words, capsys):
    assert cli.main(argv) == 2
    assert words in capsys.readouterr().err


def test_best_combination_per_size(tmp_path, capsys):
    from moebench.report.load import load_run
    from moebench.report.synthetic import synthetic_run
    from moebench.tune.best import best_per_size

    run = synthetic_run(tmp_path / "run")
    df, _ = load_run(run)
    best = best_per_size(df)
    ok = df[df.status == "ok"]
    for _, b in best.iterrows():
        same = ok[(ok.model == b.model) & (ok.quant == b.quant) & (ok.world_size == b.world_size)
                  & (ok.tokens_per_rank == b.tokens_per_rank)]
        assert b.latency_us_median == same.latency_us_median.min()
        assert b.candidates == len(same)
    assert cli.main(["tune", "--results", str(run)]) == 0
    assert "latency_us_median" in capsys.readouterr().out

"""`moebench tune`: the Triton tile search end to end through the interpreter on
a tiny layer, the vLLM-named config it writes being picked up by the experts,
and the best combination per size of a run."""
from __future__ import annotations

import json

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
    (["tune", "experts=triton", "backend=local", "quant=fp8_block", "experts.row_layout=contiguous"], "gathered kernel"),
])
def test_tune_refuses_what_it_cannot_search(argv, words, capsys, monkeypatch):
    from moebench.tune import search

    def build_layer(*args):  # refused before any layer is built (in the interpreter: tens of seconds)
        raise AssertionError("built a layer for a search it then refused")

    monkeypatch.setattr(search, "build_layer", build_layer)
    assert cli.main(argv) == 2
    assert words in capsys.readouterr().err


def test_tune_times_the_gathered_kernel(monkeypatch):
    """bf16 and fp8_block at large token counts would take the contiguous layout under
    `auto`, which reads no tuned config: the tuner pins the gathered one for them."""
    from moebench.tune import search

    seen = {}

    def build_layer(combo, *args):
        seen[combo["quant"]] = combo["row_layout"]
        raise RuntimeError("stop")

    monkeypatch.setattr(search, "build_layer", build_layer)
    for quant in ("fp8_block", "bf16", "fp8_tensor"):
        with pytest.raises(RuntimeError, match="stop"):
            search.tune(["experts=triton", "backend=local", f"quant={quant}", "runner.device=cpu"])
    assert seen == {"fp8_block": "gathered", "bf16": "gathered", "fp8_tensor": "auto"}


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


def test_fp8_block_spaces_keep_k_tiles_inside_a_scale_group():
    """The experts clamp BLOCK_SIZE_K to the 128-wide scale group, so a wider K tile would
    re-run a config already tried (and be written out with a K tile that never ran)."""
    from moebench.tune.search import SPACES, candidates

    for space in SPACES:
        every = candidates(space, 64, 8, 64)
        block = candidates(space, 64, 8, 64, max_block_k=128)
        assert block and all(c["BLOCK_SIZE_K"] <= 128 for c in block)
        assert block == [c for c in every if c["BLOCK_SIZE_K"] <= 128]
    assert any(c["BLOCK_SIZE_K"] == 256 for c in candidates("decode", 64, 8, 64))  # bf16 keeps them
    # decode tiles as tall as the busiest expert, never far taller than the mean rows
    assert {c["BLOCK_SIZE_M"] for c in candidates("decode", 256, 8, 128)} == {16, 32}  # 16 rows per expert
    assert {c["BLOCK_SIZE_M"] for c in candidates("decode", 256, 2, 8)} == {16, 32, 64}  # 64 rows per expert


def test_no_config_ran_still_leaves_the_trials_errors(tmp_path):
    from moebench.tune.search import TokenResult, Trial, write

    bad = Trial(config={"BLOCK_SIZE_M": 16}, error="OutOfResources: shared memory")
    info = {"E": 8, "N": 128, "dtype": None, "block_shape": None}
    with pytest.raises(ValueError, match="tune.json"):
        write(info, [TokenResult(tokens=4, default=bad, trials=[bad])], tmp_path / "t")
    detail = json.loads((tmp_path / "t" / "tune.json").read_text())
    assert detail["results"][0]["trials"][0]["error"] == "OutOfResources: shared memory"
    assert not (tmp_path / "t" / "configs").exists()

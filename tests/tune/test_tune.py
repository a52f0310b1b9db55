"""`moebench tune`: the tile search end to end through the interpreter on a tiny layer
(and its resume), the files it writes and where `--install` puts them, the config
look-up reading vLLM's and SGLang's files, vLLM's naming and routing rules,
`--check-vllm`, the committed config files, and `--results` on a committed run (the
table and figure it writes: tests/report/test_best_per_size.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from one_combination import TINY_TUNE

from moebench import cli
from moebench.kernels.triton import config as tconfig

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _entry(bm=16, bn=64, bk=128, g=1, w=4, s=3):
    return dict(BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, GROUP_SIZE_M=g, num_warps=w, num_stages=s)


def test_tune_writes_a_vllm_config_the_experts_then_use_and_resumes(tmp_path, monkeypatch, capsys):
    out = tmp_path / "tune"
    argv = TINY_TUNE + ["--out", str(out)]
    assert cli.main(argv) == 0
    name = tconfig.config_file_name(8, 128, None, None)
    best = json.loads((out / "configs" / name).read_text())
    assert set(best) == {"4"} and list(best["4"]) == list(tconfig.CONFIG_KEYS)  # six fields, vLLM's order
    side = json.loads((out / "configs" / (name[:-5] + ".provenance.json")).read_text())
    assert side["entries"]["4"]["rel_err_recheck"] <= 2e-2 and "not of vLLM's" in side["kernel"]
    detail = json.loads((out / "tune.json").read_text())
    (res,) = detail["results"]
    assert res["timed"] == 3 and res["budget"] == 3  # both small configs and the heuristic (outside the space)
    trials = [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]
    screen = [t for t in trials if t["phase"] == "screen"]
    assert len(screen) == 3 and all(t["us"] > 0 and t["rel_err"] <= 2e-2 for t in screen)
    captured = capsys.readouterr()
    text = captured.out
    assert "vs heuristic" in text and "vLLM routes every batch size to the nearest entry: 4: 1 and up" in text
    # the interpreter's figures are host time: said up front and under the table
    assert "timed on the CPU, under Triton's interpreter: every time above is host time, not a GPU's" in text
    assert "or --install" not in text  # no use offered that would be refused
    assert detail["environment"]["triton_interpret"] is True
    err = captured.err
    assert "tune: timed on the CPU, under Triton's interpreter: every figure is host time" in err
    # the plan, and one bar over the whole job (its last line: stderr is no terminal here): 3 configs
    # screened (a check, a warm-up call, 2 samples each), the 3 finalists again (a check, a warm-up,
    # 1 sample each), the winner re-checked
    assert "per count up to 3 screened (baselines included) with 2 samples each" in err
    assert "about 22 layer calls in all" in err and ": 22 of 22 layer calls (100 %) in " in err  # off a terminal: lines
    assert "tune T=4: timing the 3 finalists again, 1 sample each, interleaved" in err
    assert " s a layer call over the first 3 trials: about " in err
    # the counts add up: the space's 2 and the heuristic, which is also the current config (timed once)
    assert "tune T=4: 3 configs timed: 2 of the space's 2 + 1 baseline outside it (current = heuristic)" in err
    assert "| 2 of 2 + 1 |" in text and "outside the space, timed beside it: current = heuristic" in text
    assert (res["timed_in_space"], res["baselines_outside_space"]) == (2, ["current = heuristic"])
    # resume: the same command times nothing again, picks the same tile, and says so up front
    n = len(trials)
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    assert "22 of them read back from 7 stored trials (--out's trials.jsonl): nothing to time" in err, err
    assert len((out / "trials.jsonl").read_text().splitlines()) == n
    assert json.loads((out / "configs" / name).read_text()) == best
    # several GPUs: each stores its share's trials, the parent rebuilds the results from the
    # store alone (what it does after the GPU processes end), timing nothing
    import torch

    from moebench.tune import bench, search
    from moebench.tune.trials import TrialStore, trial_env

    def no_layer(*a, **k):
        raise AssertionError("replay built a layer")

    monkeypatch.setattr(bench, "LayerBench", no_layer)
    targs = search.TuneArgs(overrides=argv[1:7], space="small", reps=2, final_reps=1)
    c, tokens = search.resolve(targs.overrides)
    _, again, _ = search.run_tokens(
        c,
        tokens,
        targs,
        TrialStore(out, trial_env(torch.device("cpu"))),
        torch.device("cpu"),
        lambda s: None,
        replay=True,
    )
    assert [(r.tokens, r.best, r.num_timed) for r in again] == [(4, best["4"], 3)]
    # the harness's lookup now returns the tuned tile for that layer
    monkeypatch.setenv(tconfig.CONFIG_DIR_ENV, str(out / "configs"))
    tconfig._load_configs.cache_clear()
    assert tconfig.get_config(8, 128, 4) == best["4"]


def test_a_tune_resumed_on_another_gpu_times_again_and_says_so(tmp_path, capsys):
    """--out holds this layer's trials, as the same command would ask for them, measured on an H200
    (the figures are made up: 1 ns each, they would win): the command on this device times every
    one again, says why in one line, and keeps the H200's in the file."""
    from dataclasses import replace

    import torch

    from moebench.tune import search
    from moebench.tune.bench import baselines_of, dims_of
    from moebench.tune.space import prune
    from moebench.tune.trials import Trial, TrialStore, trial_env

    out = tmp_path / "tune"
    argv = TINY_TUNE + ["--out", str(out)]
    targs = search.TuneArgs(overrides=argv[1:7], space="small", reps=2, final_reps=1)
    c, _ = search.resolve(targs.overrides)
    dims = dims_of(c.combo)
    cfgs = prune("small", dims).kept + list(baselines_of(dims, "bf16", 4).values())
    h200 = replace(trial_env(torch.device("cpu")), device="NVIDIA H200")
    there = TrialStore(out, h200)
    keys = [search.Measurer(None, there, c.key, 4, targs, "host")._key(cfg, "screen") for cfg in cfgs]
    for cfg in cfgs:
        there.add(Trial(config=dict(cfg), us=0.001, p20=0.001, p80=0.001, layer=c.key, tokens=4, reps=2, timing="host"))
    assert all(TrialStore(out, h200).get(k) is not None for k in keys)  # what the H200 would resume from
    stored = (out / "trials.jsonl").read_text().splitlines()
    assert cli.main(argv) == 0
    lines = (out / "trials.jsonl").read_text().splitlines()
    assert lines[: len(stored)] == stored  # kept
    here = [json.loads(x) for x in lines[len(stored) :]]
    assert {x["env"]["device"] for x in here} == {"cpu"}
    assert all(TrialStore(out, trial_env(torch.device("cpu"))).get(k).us > 0.001 for k in keys)  # timed again
    err = capsys.readouterr().err
    assert f"tune: {len(stored)} stored trials were measured on another GPU (NVIDIA H200; this is cpu)" in err


@pytest.mark.parametrize(
    "argv, words",
    [
        (["tune", "experts=torch", "backend=local"], "experts=triton"),
        (["tune", "experts=triton", "backend=naive"], "backend=local"),
        (["tune", "experts=triton", "backend=local", "--space", "huge"], "--space"),
        (["tune", "experts=triton", "backend=local", "--search", "random"], "--search"),
        (["tune", "experts=triton", "backend=local", "--budget", "1.5"], "--budget"),
        (
            ["tune", "experts=triton", "backend=local", "quant=fp8_block", "experts.row_layout=contiguous"],
            "gathered kernel",
        ),
    ],
)
def test_tune_refuses_what_it_cannot_search(argv, words, capsys, monkeypatch):
    from moebench.measure import layer

    def build_layer(*args):  # refused before any layer is built (in the interpreter: tens of seconds)
        raise AssertionError("built a layer for a search it then refused")

    monkeypatch.setattr(layer, "build_layer", build_layer)
    assert cli.main(argv) == 2
    assert words in capsys.readouterr().err


def test_tune_times_the_gathered_kernel_over_vllms_grid_by_default():
    """bf16 and fp8_block at large token counts would take the contiguous layout under
    `auto`, which reads no tuned config: the tuner pins the gathered one for them."""
    from moebench.tune.search import resolve

    for quant, layout in (("fp8_block", "gathered"), ("bf16", "gathered"), ("fp8_tensor", "auto")):
        c, tokens = resolve(["experts=triton", "backend=local", f"quant={quant}", "runner.device=cpu"])
        assert c.combo["row_layout"] == layout
        assert tokens == list(tconfig.VLLM_BATCH_SIZES)
    c, tokens = resolve(["experts=triton", "backend=local", "runner.device=cpu", "workload.tokens_per_rank=[16,4096]"])
    assert tokens == [16, 4096]


def test_no_config_ran_still_leaves_the_trials_errors(tmp_path):
    from moebench.tune.files import write
    from moebench.tune.search import TokenResult
    from moebench.tune.trials import Trial

    bad = Trial(config=_entry(), error="OutOfResources: shared memory")
    info = {"E": 8, "N": 128, "dtype": None, "block_shape": None, "space_size": 2}
    res = TokenResult(
        tokens=4, best=None, best_us=float("nan"), baselines={"heuristic": bad}, errors={"OutOfResources": 1}
    )
    assert write(info, [res], tmp_path / "t") is None
    detail = json.loads((tmp_path / "t" / "tune.json").read_text())
    assert detail["results"][0]["baselines"]["heuristic"]["error"] == "OutOfResources: shared memory"
    assert not (tmp_path / "t" / "configs").exists()


def test_install_keeps_a_partial_file_where_vllm_never_looks(tmp_path, monkeypatch, capsys):
    from moebench.tune import files

    top, part = tmp_path / "configs", tmp_path / "configs" / "partial"
    monkeypatch.setattr(tconfig, "CONFIG_DIR", top)
    monkeypatch.setattr(tconfig, "PARTIAL_DIR", part)
    name = tconfig.config_file_name(32, 2048, "fp8_w8a8", [128, 128], device="NVIDIA H200")
    src = tmp_path / "out" / name
    src.parent.mkdir()
    src.write_text(json.dumps({"16": _entry(), "4096": _entry(128, 128, 128, 16, 8, 3)}))
    assert files.install(src, print) == part / name
    assert not (top / name).exists() and "16: 1-2056, 4096: 2057 and up" in capsys.readouterr().out
    # the rest of the grid arrives: the merged file covers it and moves to kernels/configs/
    src.write_text(json.dumps({str(m): _entry() for m in tconfig.VLLM_BATCH_SIZES if m not in (16,)}))
    assert files.install(src, print) == top / name
    merged = json.loads((top / name).read_text())
    assert [int(k) for k in merged] == list(tconfig.VLLM_BATCH_SIZES) and merged["16"] == _entry()
    assert not (part / name).exists()
    # the CLI installs a finished tune's files the same way
    tune_dir = tmp_path / "tune"
    (tune_dir / "configs").mkdir(parents=True)
    other = tconfig.config_file_name(128, 768, None, None, device="NVIDIA H200")
    (tune_dir / "configs" / other).write_text(json.dumps({"256": _entry()}))
    # its sidecar as a tune on a GPU writes it: where the tiles were timed (--install-from refuses a folder
    # that does not say), and the entries' figures
    side = {"layer": {"device": "cuda"}, "environment": {"device": "NVIDIA H200"}, "entries": {"256": {"us": 1.0}}}
    (tune_dir / "configs" / (other[:-5] + ".provenance.json")).write_text(json.dumps(side))
    assert cli.main(["tune", "--install-from", str(tune_dir)]) == 0
    assert (part / other).is_file() and json.loads((part / (other[:-5] + ".provenance.json")).read_text())["entries"]
    assert cli.main(["tune", "--install-from", str(tmp_path / "nowhere")]) == 2


# -- the look-up, vLLM's rules --------------------------------------------------------


@pytest.mark.parametrize(
    "raw, field",
    [
        ("NVIDIA H200", "NVIDIA_H200"),
        ("NVIDIA H200 NVL", "NVIDIA_H200"),  # the H200 family shares vLLM's H200 files
        ("NVIDIA H200 141GB HBM3e", "NVIDIA_H200"),
        ("NVIDIA_H200_NVL", "NVIDIA_H200"),  # already formed: the rule is idempotent
        ("NVIDIA GH200 480GB", "NVIDIA_GH200_480GB"),  # "GH200" is no "H200" word
        ("NVIDIA H20", "NVIDIA_H20"),
        ("NVIDIA H20-3e", "NVIDIA_H20-3e"),
        ("NVIDIA H100 80GB HBM3", "NVIDIA_H100_80GB_HBM3"),
        ("NVIDIA A100-SXM4-80GB", "NVIDIA_A100-SXM4-80GB"),
        ("NVIDIA B200", "NVIDIA_B200"),
    ],
)
def test_file_names_follow_vllms_rule(raw, field):
    def vllm_get_config_file_name(E, N, dtype, block_shape, device_name):  # vLLM's, given its device name
        device_name = device_name.replace(" ", "_")
        if "H200" in device_name.split("_"):
            device_name = "NVIDIA_H200"
        dtype_selector = "" if not dtype else f",dtype={dtype}"
        block_shape_selector = (
            "" if not block_shape or not all(block_shape) else f",block_shape={block_shape}"
        ).replace(" ", "")
        return f"E={E},N={N},device_name={device_name}{dtype_selector}{block_shape_selector}.json"

    assert tconfig.vllm_device_name(raw) == field
    for args in ((128, 768, None, None), (32, 2048, "fp8_w8a8", [128, 128]), (8, 14336, "fp8_w8a8", None)):
        assert tconfig.config_file_name(*args, device=raw) == vllm_get_config_file_name(*args, raw)


def test_loader_reads_vllm_and_sglang_files(tmp_path, monkeypatch):
    # vLLM's own format: a "triton_version" key beside the batch sizes
    vllm = {
        "triton_version": "3.4.0",
        "1": _entry(16, 32),
        "64": _entry(32, 128),
        "4096": _entry(128, 256, 64, 16, 8, 4),
    }
    name = tconfig.config_file_name(128, 768, None, None, device="NVIDIA H200")
    (tmp_path / name).write_text(json.dumps(vllm, indent=4))
    # SGLang's: block_shape spelt with a space, in a per-Triton-version folder
    sg = tmp_path / f"triton_{tconfig.triton.__version__.replace('.', '_')}"
    sg.mkdir()
    sg_name = "E=32,N=2048,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json"
    (sg / sg_name).write_text(json.dumps({"16": dict(_entry(16, 128), USE_TMA=False)}))
    monkeypatch.setenv(tconfig.CONFIG_DIR_ENV, str(tmp_path))
    tconfig._load_configs.cache_clear()
    got = tconfig.load_configs(128, 768, None, None, device="NVIDIA H200")
    assert set(got) == {1, 64, 4096} and got[4096] == vllm["4096"]
    assert tconfig.get_config(128, 768, 40, device="NVIDIA H200") == vllm["64"]
    fp8 = tconfig.get_config(32, 2048, 16, "fp8_w8a8", [128, 128], device="NVIDIA H200 NVL")
    assert fp8 == _entry(16, 128)  # keys our kernel takes no part of are dropped
    (tmp_path / name).write_text(json.dumps({"oops": _entry()}))
    tconfig._load_configs.cache_clear()
    with pytest.raises(ValueError, match="no token count"):
        tconfig.load_configs(128, 768, None, None, device="NVIDIA H200")
    tconfig._load_configs.cache_clear()


def test_check_vllm_reports_the_routing(tmp_path, capsys):
    from moebench.tune.vllm_check import routes, vllm_pick

    one = tmp_path / tconfig.config_file_name(32, 2048, None, None, device="NVIDIA H200")
    one.write_text(json.dumps({"16384": _entry(128, 256, 64, 16, 8, 4)}))
    assert cli.main(["tune", "--check-vllm", str(one)]) == 1
    text = capsys.readouterr().out
    assert "| 16384 | 1 and up | 1, 2, 4, 8, 16" in text and "1 -> 16384 (16384x)" in text
    assert "\n  1 entry\n" in text  # (was '1 entries')
    grid = tmp_path / tconfig.config_file_name(128, 768, None, None, device="NVIDIA H200")
    grid.write_text(json.dumps({"triton_version": "3.6.0", **{str(m): _entry() for m in tconfig.VLLM_BATCH_SIZES}}))
    assert cli.main(["tune", "--check-vllm", str(grid)]) == 0
    assert f"  {len(tconfig.VLLM_BATCH_SIZES)} entries; ignored as vLLM does: triton_version" in capsys.readouterr().out
    extra = tmp_path / "E=8,N=128,device_name=NVIDIA_H200.json"
    extra.write_text(json.dumps({str(m): dict(_entry(), us=1.0) for m in tconfig.VLLM_BATCH_SIZES}))
    assert cli.main(["tune", "--check-vllm", str(extra)]) == 1
    assert "fields vLLM passes to its kernel but it takes none such: us" in capsys.readouterr().out
    # an entry lacking fields vLLM's entries hold: named, and not ok (its launch would fail)
    lacking = tmp_path / "E=8,N=256,device_name=NVIDIA_H200.json"
    lacking.write_text(json.dumps({str(m): _entry() for m in tconfig.VLLM_BATCH_SIZES} | {"16": {"BLOCK_SIZE_M": 16}}))
    assert cli.main(["tune", "--check-vllm", str(lacking)]) == 1
    out = capsys.readouterr().out
    assert (
        "PROBLEM: entry 16 lacks BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M, num_warps, num_stages" in out
        and "not ok" in out
    )
    # entries lacking the same fields: one line naming them all, its noun and verb plural
    untuned = {k: v for k, v in _entry().items() if k not in ("num_warps", "num_stages")}
    lacking.write_text(
        json.dumps({str(m): _entry() for m in tconfig.VLLM_BATCH_SIZES} | {"16": untuned, "32": untuned})
    )
    assert cli.main(["tune", "--check-vllm", str(lacking)]) == 1
    out = capsys.readouterr().out
    assert "  PROBLEM: entries 16, 32 lack num_warps, num_stages (every vLLM entry holds the six: " in out
    assert out.count("PROBLEM: ") == 1 and "not ok" in out
    # the routing is vLLM's expression, ties to the key first in the file
    for keys in ([64, 256], [256, 64], [1, 2, 4, 8], list(tconfig.VLLM_BATCH_SIZES), [3, 5, 100]):
        for k, lo, hi in routes(keys):
            for m in range(lo, (hi or 9000) + 1):
                assert vllm_pick(keys, m) == k, (keys, m)
    assert routes([64, 256])[0] == (64, 1, 160) and routes([256, 64])[0] == (64, 1, 159)


def test_committed_config_files_cover_vllms_grid():
    """A file vLLM could load from kernels/configs/ must hold every grid size (vLLM routes
    each batch size to the nearest entry with no limit); partial measurements stay in
    partial/, which neither vLLM nor a VLLM_TUNED_CONFIG_FOLDER pointed here reads."""
    from moebench.kernels.triton.decisions import SUFFIX, decisions_name
    from moebench.tune.files import SIDECARS  # provenance, and the decisions vLLM never opens
    from moebench.tune.vllm_check import check_file

    top = sorted(p for p in tconfig.CONFIG_DIR.glob("*.json") if not p.name.endswith(SIDECARS))
    # the committed files (kernels/configs/README.md's table says where each came from): a glob
    # that finds none, a moved folder say, must not pass as "every file covers the grid"
    assert len(top) >= 2, f"{tconfig.CONFIG_DIR}: expected the committed tile files, found {top}"
    readme = (tconfig.CONFIG_DIR / "README.md").read_text()
    for p in top:
        r = check_file(p)
        assert r.ok, p.name
        assert p.with_name(p.name[:-5] + ".provenance.json").is_file(), f"{p.name}: no provenance sidecar"
        assert all(list(e) == list(tconfig.CONFIG_KEYS) for e in json.loads(p.read_text()).values())
        assert f"`{p.name}`" in readme, f"{p.name}: kernels/configs/README.md does not say where it came from"
    partial = sorted(p for p in tconfig.PARTIAL_DIR.glob("*.json") if not p.name.endswith(SIDECARS))
    assert partial, f"{tconfig.PARTIAL_DIR}: expected the committed partial files"
    for p in partial:
        assert not (tconfig.CONFIG_DIR / p.name).exists(), f"{p.name} in both folders"
        # a file that covered the grid would belong in the folder above (tune --install moves it)
        assert check_file(p).far, f"partial/{p.name} covers vLLM's grid: move it up"
    # a decisions sidecar sits beside its tiles file (the layer finds it by the tiles' name)
    for d, tiles in ((tconfig.CONFIG_DIR, top), (tconfig.PARTIAL_DIR, partial)):
        names = {decisions_name(p.name) for p in tiles}
        assert all(side.name in names for side in d.glob(f"*{SUFFIX}")), sorted(d.glob(f"*{SUFFIX}"))


# -- --results -------------------------------------------------------------------------


def _committed_run() -> Path:
    """A committed run with at least one setting x size where two ok combinations compete."""
    from moebench.report.load import load_run

    for rows in sorted(ROOT.glob("results/**/rows")):
        df, _ = load_run(rows.parent)
        ok = df[df.status == "ok"]
        if len(ok) and ok.groupby(["model", "quant", "world_size", "tokens_per_rank"]).combo_key.nunique().max() >= 2:
            return rows.parent
    raise AssertionError("no committed run under results/ with two competing ok combinations")


def test_results_on_a_committed_run(tmp_path, capsys):
    from moebench.report.best_per_size import SETTING, best_per_size
    from moebench.report.load import latest_rows, load_run

    run = _committed_run()
    df, _ = load_run(run)
    best = best_per_size(df)
    ok = latest_rows(df)
    ok = ok[ok.status == "ok"]
    for _, b in best.iterrows():
        same = ok
        for col in SETTING + ["tokens_per_rank"]:
            same = same[same[col].astype(str) == str(b[col])]
        times = same.latency_us_median.sort_values().tolist()
        assert b.best_us == times[0] and b.candidates == len(same)
        if len(times) > 1:
            assert b.runner_up_us == times[1] and math.isclose(b.margin, times[1] / times[0])
            if math.isfinite(b.margin_lo):
                assert b.margin_lo <= b.margin_hi and b.clear_win == (b.margin_lo > 1)
    assert cli.main(["tune", "--results", str(run), "--out", str(tmp_path)]) == 0
    assert "margin [95 % CI]" in capsys.readouterr().out
    rows = json.loads((tmp_path / "best_per_size.json").read_text())["rows"]
    assert len(rows) == len(best) and (tmp_path / "best_per_size.png").stat().st_size > 0


def test_several_gpus_split_the_grid():
    from moebench.tune import search

    shares = search.split_tokens(list(tconfig.VLLM_BATCH_SIZES), 4)
    assert sorted(sum(shares, [])) == list(tconfig.VLLM_BATCH_SIZES) and [s[-1] for s in shares] == [
        4096,
        3072,
        2048,
        1536,
    ]
    assert search.split_tokens([16], 8) == [[16]]


TINY_QWEN3 = Path(__file__).resolve().parents[1] / "fixtures" / "hf_configs" / "tiny_qwen3_moe"


def test_a_tensor_parallel_shard_is_tuned_under_the_name_vllm_and_sglang_open(tmp_path):
    # vLLM's benchmark_moe.py --tp-size N: shard_intermediate_size = 2 * intermediate_size // tp_size,
    # saved as get_config_file_name(E, shard_intermediate_size // 2, ...); at run time fused_moe looks
    # the file up with N = w2.shape[2], the rank's intermediate_size_per_partition (vLLM's
    # fused_moe/configs/README: Mixtral's N = 14336 is 7168 under TP2, 3584 under TP4)
    out = tmp_path / "tune"
    argv = ["tune", "experts=triton", "backend=local", f"model=hf:{TINY_QWEN3}", "backend.simulate_tp=4"]
    argv += ["quant=bf16", "runner.device=cpu", "workload.tokens_per_rank=[4]", "--space", "small"]
    argv += ["--reps", "2", "--final-reps", "1", "--out", str(out)]
    assert cli.main(argv) == 0
    config = json.loads((TINY_QWEN3 / "config.json").read_text())
    E, N = config["num_experts"], config["moe_intermediate_size"] // 4
    name = f"E={E},N={N},device_name={tconfig.vllm_device_name(tconfig.device_name())}.json"
    assert name == "E=16,N=32,device_name=cpu.json"
    best = json.loads((out / "configs" / name).read_text())
    assert set(best) == {"4"}
    detail = json.loads((out / "tune.json").read_text())
    assert detail["layer"]["simulate_tp"] == 4 and detail["layer"]["N"] == 32
    # SGLang's layout of the same file: its per-Triton-version folder
    version = "triton_" + tconfig.triton.__version__.split("+")[0].replace(".", "_")
    assert json.loads((out / "configs" / "sglang" / version / name).read_text()) == best
    # the layer built for that shard looks the tuned entry up by the same (E, N)
    assert tconfig.config_file_name(E, N, None, None) == name


def test_sglang_spells_the_block_shape_with_a_space(tmp_path):
    from moebench.tune.files import sglang_path

    name = tconfig.config_file_name(128, 384, "fp8_w8a8", [128, 128], device="NVIDIA H100 80GB HBM3")
    path = sglang_path(tmp_path, name)
    assert path.name == "E=128,N=384,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8,block_shape=[128, 128].json"
    assert path.parent.name.startswith("triton_") and path.parent.parent == tmp_path / "sglang"

"""`moebench tune`'s search without a GPU: the pruned space, the halving search against
exhaustive search on synthetic cost landscapes, resuming from stored trials, and the
compile workers' round trip into Triton's cache."""

from __future__ import annotations

import gzip
import json
import math
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from moebench.tune import strategy
from moebench.tune.fingerprint import Fingerprint
from moebench.tune.space import (
    SM90_SHARED_BYTES,
    LayerDims,
    acc_registers,
    config_key,
    drop_reason,
    prune,
    shared_bytes,
)
from moebench.tune.trials import Trial, TrialStore

ROOT = Path(__file__).resolve().parents[2]
DSV3_EP8_FP8 = LayerDims(
    num_experts=32, intermediate=2048, hidden=7168, topk=8, operand_bytes=1, block_shape=(128, 128)
)
QWEN3_BF16 = LayerDims(num_experts=128, intermediate=768, hidden=2048, topk=8, operand_bytes=2)
H100 = Fingerprint("NVIDIA H100 80GB HBM3", "2.9.0", "3.5.0", "a" * 64)  # what a store's trials are measured under


def test_vllm_space_pruned_for_the_tuned_layers():
    ds, qw = prune("vllm", DSV3_EP8_FP8), prune("vllm", QWEN3_BF16)
    assert ds.total == qw.total == 1920  # vLLM's get_configs_compute_bound on CUDA
    assert len(ds.kept) == 248 and len(qw.kept) == 1200
    assert ds.dropped == {"fp8_block_divisible": 1600, "registers": 40, "shared_memory": 32}
    for c in ds.kept:  # vLLM's divisibility rule, and K tiles inside one scale group
        assert c["BLOCK_SIZE_N"] % 128 == 0 and c["BLOCK_SIZE_K"] == 128
    for c in ds.kept + qw.kept:
        assert acc_registers(c) <= 128
    assert all(shared_bytes(c, 2) <= SM90_SHARED_BYTES for c in qw.kept)
    assert len({config_key(c) for c in qw.kept}) == len(qw.kept)
    tiny = LayerDims(num_experts=8, intermediate=128, hidden=256, topk=2, operand_bytes=2)
    assert (
        drop_reason(
            dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=512, BLOCK_SIZE_K=64, GROUP_SIZE_M=1, num_warps=4, num_stages=2), tiny
        )
        == "wider_than_layer"
    )


def test_shared_memory_rule_matches_the_out_of_resources_the_gpu_reported():
    """Every OutOfResources in the committed tunes required exactly what the rule computes,
    and every config the rule keeps at that limit ran."""
    seen = 0
    for path in sorted((ROOT / "results").glob("**/tune.json")):
        d = json.loads(path.read_text())
        nbytes = 1 if str(d["layer"].get("quant", "")).startswith("fp8") else 2
        # the halving search keeps its trials beside tune.json (gzip-compressed where committed large)
        jsonl, gz = path.parent / "trials.jsonl", path.parent / "trials.jsonl.gz"
        text = (
            jsonl.read_text() if jsonl.is_file() else gzip.decompress(gz.read_bytes()).decode() if gz.is_file() else ""
        )
        trials = (
            [json.loads(line) for line in text.splitlines() if line.strip()]
            if text
            else [t for r in d["results"] for t in r["trials"]]
        )
        for t in trials:
            m = re.search(r"shared memory, Required: (\d+)", t.get("error") or "")
            if m:
                seen += 1
                assert shared_bytes(t["config"], nbytes) == int(m.group(1)), (path, t["config"])
                assert shared_bytes(t["config"], nbytes) > SM90_SHARED_BYTES
            elif not t.get("error"):
                assert shared_bytes(t["config"], nbytes) <= SM90_SHARED_BYTES, (path, t["config"])
    assert seen >= 8


# -- the search on synthetic landscapes ------------------------------------------------


class _R:
    def __init__(self, us):
        self.us = us


def _landscape(seed: int, configs):
    """A tile bowl in log2 space with per-tile noise, knob optima that follow the tile
    (stages by K tile, warps by accumulator size) with random exceptions, small G effects."""
    rng = random.Random(seed)
    opt = (rng.uniform(4, 7), rng.uniform(5, 8), rng.uniform(6, 8))
    tiles, knobs = {}, {}
    for c in configs:
        t = config_key(c)[:3]
        if t in tiles:
            continue
        d = [math.log2(v) - o for v, o in zip(t, opt, strict=True)]
        tiles[t] = (1 + 0.08 * d[0] ** 2 + 0.05 * d[1] ** 2 + 0.04 * d[2] ** 2 + 0.03 * d[0] * d[1]) * math.exp(
            rng.gauss(0, 0.06)
        )
        s_opt = {64: 4, 128: 3, 256: 2}[t[2]] if rng.random() > 0.3 else rng.choice([2, 3, 4, 5])
        w_opt = (8 if t[0] * t[1] >= 16384 else 4) if rng.random() > 0.2 else rng.choice([4, 8])
        knobs[t] = (s_opt, w_opt, {g: math.exp(rng.gauss(0, 0.015)) for g in (1, 16, 32, 64)})

    def cost(c):
        t = config_key(c)[:3]
        s_opt, w_opt, g = knobs[t]
        return (
            tiles[t]
            * (1 + 0.05 * abs(c["num_stages"] - s_opt))
            * (1.0 if c["num_warps"] == w_opt else 1.10)
            * g.get(c["GROUP_SIZE_M"], 1.0)
        )

    return cost


def _noisy(cost, seed):
    rng = random.Random(seed)
    return lambda cfgs, phase: [
        _R(cost(c) * math.exp(rng.gauss(0, 0.01 if phase == "screen" else 0.004))) for c in cfgs
    ]


@pytest.mark.parametrize("dims", [DSV3_EP8_FP8, QWEN3_BF16], ids=["dsv3_ep8_fp8", "qwen3_bf16"])
def test_halving_reaches_the_exhaustive_optimum_at_15_percent(dims):
    configs = prune("vllm", dims).kept
    budget = strategy.budget_of(0.15, len(configs))
    ratios = []
    for seed in range(20):
        cost = _landscape(seed, configs)
        ex = strategy.exhaustive(configs, _noisy(cost, seed))
        out = strategy.halving(configs, _noisy(cost, seed), budget)
        assert out.num_timed <= budget <= 0.15 * len(configs)
        assert len({config_key(c) for c in out.order}) == out.num_timed  # nothing timed twice
        assert ex.num_timed == len(configs)
        ratios.append(cost(out.best) / cost(ex.best))
    assert sorted(ratios)[-2] <= 1.03, ratios  # within 3 % on 19 of 20 landscapes
    assert sum(ratios) / len(ratios) <= 1.01


def test_halving_is_deterministic_and_keeps_the_baselines_in_the_race():
    configs = prune("vllm", DSV3_EP8_FP8).kept
    cost = _landscape(3, configs)
    exact = lambda cfgs, phase: [_R(cost(c)) for c in cfgs]
    best_possible = min(configs, key=cost)
    outside = dict(best_possible, GROUP_SIZE_M=8)  # a baseline outside the space that beats it
    cost2 = lambda c: cost(c) * (0.5 if c == outside else 1.0)
    measure = lambda cfgs, phase: [_R(cost2(c)) for c in cfgs]
    a = strategy.halving(configs, measure, 37, baselines=[outside])
    b = strategy.halving(configs, measure, 37, baselines=[outside])
    assert [config_key(c) for c in a.order] == [config_key(c) for c in b.order]
    assert a.best == outside and a.num_timed <= 37
    assert strategy.halving(configs, exact, 37).best == strategy.halving(configs, exact, 37).best


def test_failed_configs_never_win():
    configs = prune("small", QWEN3_BF16).kept + prune("prefill", QWEN3_BF16).kept
    fail = {config_key(c) for c in configs[::2]}
    measure = lambda cfgs, phase: [
        _R(float("nan") if config_key(c) in fail else 1.0 + 0.01 * i) for i, c in enumerate(cfgs)
    ]
    out = strategy.exhaustive(configs, measure)
    assert out.best is not None and config_key(out.best) not in fail
    none = strategy.exhaustive(configs, lambda cfgs, phase: [_R(float("inf")) for _ in cfgs])
    assert none.best is None


# -- resume ------------------------------------------------------------------------


class _FakeBench:
    """bench.TokenBench's interface over a cost function; counts what it times."""

    def __init__(self, cost, stop_after=None):
        self.cost, self.stop_after, self.timed, self._warm = cost, stop_after, 0, True

    def _one(self, cfg, reps, phase):
        self.timed += 1
        if self.stop_after is not None and self.timed > self.stop_after:
            raise KeyboardInterrupt
        us = self.cost(cfg)
        return Trial(config=dict(cfg), us=us, p20=us, p80=us, samples=[us] * reps, tokens=16, reps=reps, phase=phase)

    def trial(self, cfg, reps):
        return self._one(cfg, reps, "screen")

    def interleaved(self, cfgs, reps):
        return [self._one(c, reps, "final") for c in cfgs]

    def dry_run(self, cfg):
        raise AssertionError("no pool: nothing is precompiled")

    def rewarm(self):
        self._warm = True


def test_an_interrupted_tune_resumes_from_its_stored_trials(tmp_path):
    from moebench.tune.search import Measurer, TuneArgs

    configs = prune("vllm", DSV3_EP8_FP8).kept
    cost = _landscape(5, configs)
    args = TuneArgs(overrides=[], reps=5)

    def search(bench, store):
        m = Measurer(bench, store, "layerkey", 16, args, "graph")
        return strategy.halving(configs, m, 37), m

    whole, _ = search(_FakeBench(cost), TrialStore(tmp_path / "whole", H100))
    cut = _FakeBench(cost, stop_after=20)
    with pytest.raises(KeyboardInterrupt):
        search(cut, TrialStore(tmp_path / "cut", H100))
    assert len(TrialStore(tmp_path / "cut", H100)) == 20
    again = _FakeBench(cost)
    resumed, m = search(again, TrialStore(tmp_path / "cut", H100))
    assert again.timed == whole.num_timed + len(whole.finalists) - 20  # only what was not stored
    assert [config_key(c) for c in resumed.order] == [config_key(c) for c in whole.order]
    assert resumed.best == whole.best
    # a third run times nothing; a different reps count is another identity
    third = _FakeBench(cost)
    search(third, TrialStore(tmp_path / "cut", H100))
    assert third.timed == 0
    other = Measurer(
        _FakeBench(cost), TrialStore(tmp_path / "cut", H100), "layerkey", 16, TuneArgs(overrides=[], reps=7), "graph"
    )
    other(configs[:1], "screen")
    assert other.measured == 1


def test_a_line_cut_short_by_a_kill_is_timed_again(tmp_path):
    store = TrialStore(tmp_path, H100)
    t = Trial(config=prune("small", QWEN3_BF16).kept[0], us=1.0, layer="k", tokens=4, reps=2, timing="host")
    store.add(t)
    with open(store.path, "a") as f:
        f.write('{"config": {"BLOCK_SIZE_M": 3')  # the process died mid-line
    again = TrialStore(tmp_path, H100)
    assert len(again) == 1 and again.get(t.key()).us == 1.0
    assert TrialStore(tmp_path, H100, resume=False).get(t.key()) is None


def test_trials_of_another_gpu_or_code_are_kept_but_timed_again(tmp_path):
    """Only trials stamped with this process's fingerprint are reused; the others (another GPU,
    torch, Triton, moebench source; none at all, stored before fingerprints) stay in the file,
    are timed again, and one line per reason says so."""
    from dataclasses import replace

    from moebench.tune.search import Measurer, TuneArgs

    configs = prune("small", QWEN3_BF16).kept
    args = TuneArgs(overrides=[], reps=2)

    def screen(env, directory=tmp_path):
        store, bench = TrialStore(directory, env), _FakeBench(lambda c: 1.0 + config_key(c)[0])
        Measurer(bench, store, "layerkey", 16, args, "graph")(configs, "screen")
        return store, bench.timed

    n = len(configs)
    assert screen(H100)[1] == n
    again, timed = screen(H100)
    assert timed == 0 and again.foreign == [] and again.foreign_lines("layerkey") == []
    h200 = replace(H100, device="NVIDIA H200")
    store, timed = screen(h200)
    assert timed == n and len(store.foreign) == n
    (line,) = store.foreign_lines("layerkey")
    assert line == (
        f"tune: {n} stored trials were measured on another GPU (NVIDIA H100 80GB HBM3; this is NVIDIA H200) "
        f"(fingerprint {H100.key}); timing again (they stay in trials.jsonl)"
    )
    assert store.foreign_lines("another layer") == []
    stamps = [json.loads(x)["env"] for x in (tmp_path / "trials.jsonl").read_text().splitlines()]
    assert stamps == [H100.stamp()] * n + [h200.stamp()] * n  # nothing deleted; each trial says where it ran
    assert screen(H100)[1] == 0  # the first GPU's trials are still its own
    assert (
        "under torch 2.9.0 (this is 2.10.0)"
        in TrialStore(tmp_path, replace(H100, torch="2.10.0")).foreign_lines("layerkey")[0]
    )
    code, gpu = TrialStore(tmp_path, replace(H100, source="b" * 64)).foreign_lines("layerkey")
    assert code.startswith(f"tune: {n} stored trials were measured by other code (moebench's .py sources differ)")
    assert gpu.startswith(f"tune: {n} stored trials were measured on another GPU (NVIDIA H200; this is NVIDIA H100")


def test_a_tune_over_gpus_of_different_models_is_refused(tmp_path, monkeypatch):
    """Each GPU's trials carry its own name: one table from two models, whose replay would find one
    model's trials only, is refused before any trial."""
    from types import SimpleNamespace

    import torch

    from moebench.tune import search

    layer = SimpleNamespace(combo={"device": "cuda"}, key="layerkey")
    monkeypatch.setattr(search, "resolve", lambda overrides: (layer, [4, 8]))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: ["NVIDIA H100 80GB HBM3", "NVIDIA H200"][i])
    with pytest.raises(ValueError, match=r"the visible GPUs differ \(NVIDIA H100 80GB HBM3, NVIDIA H200\)"):
        search.tune(search.TuneArgs(overrides=[]), tmp_path)
    assert not (tmp_path / "trials.jsonl").exists()


def test_trials_stored_before_fingerprints_are_not_reused(tmp_path):
    """A trials.jsonl written before trials carried `env` (results/tune/... hold such files) is read
    for analysis, never resumed from."""
    from moebench.tune.search import Measurer, TuneArgs

    configs = prune("small", QWEN3_BF16).kept
    old = [
        {"config": c, "us": 1.0, "layer": "layerkey", "tokens": 16, "phase": "screen", "reps": 2, "timing": "graph"}
        for c in configs
    ]
    (tmp_path / "trials.jsonl").write_text("".join(json.dumps(t) + "\n" for t in old))
    store, bench = TrialStore(tmp_path, H100), _FakeBench(lambda c: 2.0)
    assert len(store) == 0 and len(store.foreign) == len(configs)
    assert store.foreign_lines("layerkey") == [
        f"tune: {len(configs)} stored trials predate fingerprints (no record of the GPU or code that timed them); "
        "timing again (they stay in trials.jsonl)"
    ]
    Measurer(bench, store, "layerkey", 16, TuneArgs(overrides=[], reps=2), "graph")(configs, "screen")
    assert bench.timed == len(configs)
    assert len((tmp_path / "trials.jsonl").read_text().splitlines()) == 2 * len(configs)


# -- the compile workers ---------------------------------------------------------------

# Off the GPU, with Triton's driver replaced by one that only names an sm_90 target: the
# experts run once per config under compile.Recorder (nothing compiles or launches), a
# pool compiles what was recorded, then the experts' launch path (as warm-ups: there is
# no device to launch on) must find every kernel in the disk cache; a later recording
# records only the new tile's kernels and launches none of the loaded ones.
_RECORD_COMPILE_LAUNCH = r"""
import json, os, sys
import torch
from triton.backends.compiler import GPUTarget
from triton.runtime import driver
from triton.runtime.jit import JITFunction

class SM90:  # what JITFunction.run asks of the driver before a launch
    def get_current_device(self): return 0
    def get_current_stream(self, device=None): return 0
    def get_current_target(self): return GPUTarget("cuda", 90, 32)

def main():
    driver.set_active(SM90())
    from moebench.tune import compile as tcompile, search
    from moebench.tune.bench import LayerBench
    os.environ["TRITON_INTERPRET"] = "1"  # for the plan's can-Triton-run-here check only
    c, _ = search.resolve(["experts=triton", "backend=local", "model=tiny", "quant=fp8_block", "runner.device=cpu",
                           "workload.tokens_per_rank=[16]"])
    os.environ.pop("TRITON_INTERPRET")
    tb = LayerBench(c, torch.device("cpu")).at(16)
    cfgs = [dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=128, BLOCK_SIZE_K=128, GROUP_SIZE_M=1, num_warps=4, num_stages=3),
            dict(BLOCK_SIZE_M=64, BLOCK_SIZE_N=256, BLOCK_SIZE_K=128, GROUP_SIZE_M=16, num_warps=8, num_stages=4)]
    with tcompile.Recorder() as rec:
        for cfg in cfgs:
            tb.dry_run(cfg)
    names = sorted(j[1] for j in rec.jobs.values())
    pool = tcompile.Pool(1)
    st = pool.compile(list(rec.jobs.values()), tcompile.current_target())
    pool.close()
    run = JITFunction.run
    JITFunction.run = lambda self, *a, grid, warmup, **k: run(self, *a, grid=grid, warmup=True, **k)
    launch = tcompile.Stats()
    with tcompile.HitCounter(launch):
        for cfg in cfgs:
            tb.dry_run(cfg)
    JITFunction.run = run
    # now loaded: inside the recorder they must not launch (here a launch would fail: no device)
    with tcompile.Recorder() as rec2:
        tb.dry_run(dict(cfgs[0], BLOCK_SIZE_N=256))
    print(json.dumps({"names": names, "compiled": st.kernels, "errors": st.errors, "hits": launch.hits,
                      "misses": launch.misses, "second": sorted(j[1] for j in rec2.jobs.values())}))

if __name__ == "__main__":
    main()
"""


@pytest.mark.multiprocess
def test_the_pool_compiles_what_the_launch_path_then_loads(tmp_path):
    pytest.importorskip("triton.backends.nvidia")
    script = tmp_path / "record_compile_launch.py"
    script.write_text(_RECORD_COMPILE_LAUNCH)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(ROOT))
    res = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    # both GEMMs of both configs, the alignment (per BLOCK_SIZE_M) and activation kernels
    assert out["names"].count("fused_moe_kernel") == 4 and "_silu_mul_kernel" in out["names"]
    assert out["compiled"] == len(out["names"]) and out["errors"] == []
    assert out["hits"] == len(out["names"]) and out["misses"] == 0
    assert out["second"] == ["fused_moe_kernel", "fused_moe_kernel"]  # only the new tile's two GEMMs

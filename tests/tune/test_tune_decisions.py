"""`moebench tune --decisions` (issue #51): the decisions sidecar the layer reads at build time
(row layout, contiguous GEMM kernel and Gluon variant, triton_or_deepgemm's switch-over), its
fall-back to today's constants, vLLM's reading of the tiles file beside it, and the decision
search end to end through the interpreter on the tiny layer (Gluon and DeepGEMM skipped with
their reasons on the CPU)."""

from __future__ import annotations

import json

import pytest
import torch

from moebench import cli
from moebench.kernels import registry
from moebench.kernels.cards.experts import CONTIGUOUS_MIN_PAIRS_PER_EXPERT
from moebench.kernels.interfaces import KernelContext, LayerShape, QuantSpec
from moebench.kernels.triton import config as tconfig
from moebench.kernels.triton import decisions as kdec
from moebench.measure.workload import build_expert_weights

SHAPE = LayerShape(hidden=256, intermediate=128, num_experts=8, topk=2)  # the tiny model
P = SHAPE.topk
GLUON5 = dict(WS=True, STAGES=5, SCALE_AHEAD=1, EPILOGUE_TMA=True, BLOCK_SIZE_N=128)
WIDE_EXTRAS = dict(GLUON5, STAGES=4, BLOCK_SIZE_N=192, GROUP_SIZE_N=16, SCALE_TMA=True)
WIDE_1W = dict(GLUON5, STAGES=4, BLOCK_SIZE_N=192, SCALE_TMA=True, PRODUCER_1W=True)


@pytest.fixture(autouse=True)
def interpreter(monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv(tconfig.CONFIG_DIR_ENV, str(tmp_path / "tuned"))
    kdec.clear_cache()
    yield
    kdec.clear_cache()


def _sidecar(tmp_path, entries, quant="fp8_block", hidden=256, dg=None):
    dtype, bs = tconfig.config_dtype(quant), tconfig.config_block_shape(quant)
    name = kdec.decisions_name(tconfig.config_file_name(8, 128, dtype, bs))
    d = tmp_path / "tuned"
    d.mkdir(exist_ok=True)
    body = {kdec.SCHEMA_KEY: 1, "layer": {"hidden": hidden}, "deepgemm_min_tokens": dg, "entries": entries}
    (d / name).write_text(json.dumps(body))
    kdec.clear_cache()
    return d / name


def _experts(quant="fp8_block", name="triton", **options):
    ctx = KernelContext(
        shape=SHAPE, quant=QuantSpec(quant), device=torch.device("cpu"), simulate_ep=1, options=dict(options)
    )
    return registry.get_experts(name)(build_expert_weights(ctx, 0), "experts", ctx)


def _constant_rows(quant):
    """The fewest rows from which today's constant picks the contiguous layout (tiny: all 8 experts local)."""
    return CONTIGUOUS_MIN_PAIRS_PER_EXPERT[quant] * SHAPE.num_experts // P


def test_a_tuned_sidecar_changes_the_row_layout_and_a_missing_entry_keeps_the_constants(tmp_path):
    need = _constant_rows("fp8_block")  # 512 rows
    ex = _experts()
    assert ex.decisions is None and not ex.contiguous(8, P) and ex.contiguous(need, P)  # no sidecar: constants
    _sidecar(tmp_path, {"8": {"row_layout": "contiguous"}, "4096": {"row_layout": "gathered"}})
    ex = _experts()
    assert ex.decisions is not None
    assert ex.contiguous(8, P) and ex.contiguous(12, P)  # the tuned entry at 8 serves 4 .. 16 rows
    assert not ex.contiguous(4096, P) and not ex.contiguous(10**5, P)  # the largest entry: every larger M
    assert ex.contiguous(need, P) and not ex.contiguous(need - 1, P)  # no entry within 2x: the constants
    assert not _experts(row_layout="gathered").contiguous(8, P)  # a forced layout wins over a tuned one
    # the layer builds and runs what the entry says (a forward through the interpreter)
    from moebench.kernels.modular import MoEKernel
    from moebench.measure.workload import make_inputs

    ctx = ex.ctx
    layer = MoEKernel(registry.get_backend("local")(ctx), ex, None, "none")
    x, w, ids = make_inputs(SHAPE, 8, "uniform", 1.0, 0, 0, 1, "cpu")
    assert torch.isfinite(layer(x, w, ids)).all()
    assert ex.last_layout == "contiguous" and ex.last_gemm == "triton/triton"
    # measured at another hidden size (a tiles file's name has no K): ignored
    _sidecar(tmp_path, {"8": {"row_layout": "contiguous"}}, hidden=512)
    assert _experts().decisions is None


def test_a_tuned_sidecar_picks_the_contiguous_gemm_and_its_gluon_variant(tmp_path, monkeypatch):
    """contiguous_gemm=auto on an SM90 GPU (stubbed: the CPU runs no Gluon) takes the Gluon kernel at
    GLUON_CONFIG's variant; a tuned entry replaces it by the Triton kernel or another variant, set up at
    build; where Gluon cannot run, a tuned Gluon choice is auto's answer (Triton)."""
    from moebench.kernels.experts import triton as experts_triton
    from moebench.kernels.triton import gluon_contiguous as gc

    _sidecar(
        tmp_path,
        {
            "600": {"row_layout": "contiguous", "contiguous_gemm": "triton"},
            "4096": {"row_layout": "contiguous", "contiguous_gemm": "gluon", "gluon_config": GLUON5},
            "16384": {"row_layout": "contiguous", "contiguous_gemm": "gluon", "gluon_config": WIDE_EXTRAS},
            "65536": {"row_layout": "contiguous", "contiguous_gemm": "gluon", "gluon_config": WIDE_1W},
        },
    )
    ex = _experts()  # the CPU: the tuned Gluon variant falls back
    assert [ex._run_plan(m, P)[2] for m in (600, 4096)] == ["triton/triton", "triton/triton"]
    monkeypatch.setattr(experts_triton, "contiguous_gemm_kernel", lambda mode, quant, cap, n: "gluon")
    monkeypatch.setattr(experts_triton, "gluon_runs", lambda cap, quant: True)
    monkeypatch.setattr(gc, "num_sms", lambda device: 4)
    ex = _experts()
    assert ex._run_plan(600, P)[2] == "triton/triton"  # tuned: Triton where auto runs Gluon
    assert ex._run_plan(4096, P)[2] == "gluon/gluon" and ex._run_plan(2048, P)[2] == "gluon/gluon"
    assert ex._run_plan(300, P)[2] == "triton/triton"  # 600's entry (within 2x)
    assert ex._run_plan(8, P) == (False, None, "")  # no entry, few rows: gathered (constants)
    stages = {plan: [g.constexprs["STAGES"] for g in gl] for plan, gl in ex._gluons.items() if not (gl and gl[0].wide)}
    assert sorted(s for s in stages.values() if s) == [[4, 4], [5, 5]]  # the default and the tuned variant: built once
    assert ex._run_plan(4096, P)[1] is ex._gemm_fns[next(p for p, s in stages.items() if s == [5, 5])]
    assert ex._run_plan(16384, P)[2] == "gluon_wide/gluon_wide"  # the tuned 128 x 192 tile, in bands, scales by TMA
    wide = ex._gluons[next(p for p in ex._gluons if p[0] == "gluon_wide")]
    built = [(g.wide, g.constexprs["GROUP_SIZE_M"], g.constexprs.get("SCALE_TMA")) for g in wide]
    assert built == [(True, -16, True)] * 2
    assert all("PRODUCER_1W" not in g.constexprs for g in wide)  # absent: the default kernel's launch key
    ex._run_plan(65536, P)  # the one-warp producer reaches the kernel as its constexpr
    one = [g for p, gl in ex._gluons.items() for g in gl if g.constexprs.get("PRODUCER_1W")]
    assert len(one) == 2 and all(g.wide and g.constexprs["SCALE_TMA"] and g.constexprs["GROUP_SIZE_M"] > 0 for g in one)
    forced = _experts(contiguous_gemm="gluon")  # a forced kernel: the tuned one never replaces it
    assert forced._run_plan(600, P)[2] == "gluon/gluon"


def test_a_tuned_b_tma_reaches_the_gathered_kernels_tile(tmp_path):
    """A gathered entry's b_tma (the weights' tiles by TMA, gemm.py's B_TMA) is added to the tile the
    gathered GEMMs run at the counts it serves, once per count (the tile cache); elsewhere, and with
    no sidecar, the tile is the plain one; the layer runs it through the interpreter."""
    assert "B_TMA" not in _experts()._config(8, P)  # no sidecar
    _sidecar(tmp_path, {"8": {"row_layout": "gathered", "b_tma": True}, "64": {"row_layout": "gathered"}})
    ex = _experts()
    assert ex._config(8, P)["B_TMA"] is True and ex._config(12, P)["B_TMA"] is True
    assert "B_TMA" not in ex._config(64, P)  # an entry without it: pointer loads
    assert ex._config(8, P) is ex._config(8, P)  # decided once a count
    tile = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, GROUP_SIZE_M=1, num_warps=4, num_stages=2)
    assert "B_TMA" not in _experts(triton_config=tile)._config(8, P)  # an explicit tile (the tuner's) says it all
    from moebench.kernels.modular import MoEKernel
    from moebench.measure.workload import make_inputs

    layer = MoEKernel(registry.get_backend("local")(ex.ctx), ex, None, "none")
    x, w, ids = make_inputs(SHAPE, 8, "uniform", 1.0, 0, 0, 1, "cpu")
    assert torch.isfinite(layer(x, w, ids)).all() and ex.last_layout == "gathered"


def test_triton_or_deepgemm_takes_the_tuned_switch_over_at_the_knobs_default(tmp_path):
    from moebench.kernels.cards.experts import DEFAULT_MIN_TOKENS

    plain = _experts(name="triton_or_deepgemm")  # builds without DeepGEMM's library (it imports it to run)
    assert plain.min_tokens == DEFAULT_MIN_TOKENS
    _sidecar(tmp_path, {}, dg=2048)
    assert _experts(name="triton_or_deepgemm").min_tokens == 2048
    assert _experts(name="triton_or_deepgemm", deepgemm_min_tokens=64).min_tokens == 64  # forced


def test_a_malformed_sidecar_says_what_is_wrong(tmp_path):
    with pytest.raises(ValueError, match="row_layout"):
        kdec.parse({kdec.SCHEMA_KEY: 1, "entries": {"8": {"row_layout": "sorted"}}})
    with pytest.raises(ValueError, match="gluon_config"):
        kdec.parse({kdec.SCHEMA_KEY: 1, "entries": {"8": {"contiguous_gemm": "gluon", "gluon_config": {"WS": 1}}}})
    five = dict(WS=True, STAGES=4, SCALE_AHEAD=1, EPILOGUE_TMA=True, BLOCK_SIZE_N=128)
    for bad, says in (
        (dict(five, GROUP_SIZE_N=-2), "GROUP_SIZE_N"),
        (dict(five, SCALE_TMA=True), "SCALE_TMA: the 128 x 192 tile only"),
        (dict(five, SCALE_TMA=1), "SCALE_TMA 1"),
        (dict(five, PRODUCER_1W=True), "PRODUCER_1W: the 128 x 192 tile only"),
        (dict(five, BLOCK_SIZE_N=192, PRODUCER_1W="yes"), "PRODUCER_1W 'yes'"),
        (dict(five, STAGE=4), "optionally GROUP_SIZE_N, SCALE_TMA, PRODUCER_1W"),
        (dict(five, BLOCK_SIZE_N=192, WS=False, SCALE_TMA=True), "warp-specialized"),
        (dict(five, BLOCK_SIZE_N=192, SCALE_AHEAD=2), "scales 1 ahead"),
    ):
        with pytest.raises(ValueError, match=says):
            kdec.parse({kdec.SCHEMA_KEY: 1, "entries": {"8": {"contiguous_gemm": "gluon", "gluon_config": bad}}})
    for entry in ({"row_layout": "gathered", "b_tma": 1}, {"row_layout": "contiguous", "b_tma": True}):
        with pytest.raises(ValueError, match="b_tma .*on a gathered entry only"):
            kdec.parse({kdec.SCHEMA_KEY: 1, "entries": {"8": entry}})
    old = kdec.parse({kdec.SCHEMA_KEY: 1, "entries": {"8": {"contiguous_gemm": "gluon", "gluon_config": five}}})
    assert old.at(8)["gluon_config"] == five  # a sidecar of the five fields (sessions before the extras) still reads
    with pytest.raises(ValueError, match="not a moebench decisions file"):
        kdec.parse({"8": {}})


def test_gluon_constants_match_the_kernels():
    from moebench.kernels.triton import gluon_wide
    from moebench.kernels.triton.gluon_contiguous import GLUON_CONFIG, GLUON_EXTRAS, GLUON_VARIANTS
    from moebench.tune.decision_options import variant_name

    assert kdec.GLUON_WIDE_N == gluon_wide.WIDE_N
    cfgs = [kdec.gluon_config_of(v) for v in GLUON_VARIANTS]
    assert {k: GLUON_CONFIG[k] for k in kdec.GLUON_FIELDS if k != "BLOCK_SIZE_N"} in [
        {k: c[k] for k in kdec.GLUON_FIELDS if k != "BLOCK_SIZE_N"} for c in cfgs
    ]
    extras = [kdec.gluon_config_of(v, x) for v, x in GLUON_EXTRAS]
    assert all(v in GLUON_VARIANTS and set(x) <= set(kdec.GLUON_EXTRA_FIELDS) for v, x in GLUON_EXTRAS)
    assert {k: GLUON_CONFIG[k] for k in kdec.GLUON_EXTRA_FIELDS} == kdec.GLUON_EXTRA_FIELDS  # absent = the default
    names = [variant_name(c) for c in cfgs + extras]
    assert len(set(names)) == len(names)  # every option has its own name
    assert "gluon_wide:ws4-tma-bands16-scaletma" in names and "gluon:ws4-tma-bands16" in names
    assert "gluon_wide:ws4-tma-scaletma-1w" in names
    for c in extras:  # a tuned extra is a valid sidecar entry
        kdec.parse({kdec.SCHEMA_KEY: 1, "entries": {"8": {"contiguous_gemm": "gluon", "gluon_config": c}}})


@pytest.mark.slow  # minutes through the interpreter (fp8 layers at two sizes, three times each)
def test_tune_decisions_end_to_end_through_the_interpreter(tmp_path, monkeypatch, capsys):
    """fp8_block on the tiny layer at 4 and 16 tokens: the tiles, then every decision timed as whole
    layers (gathered vs contiguous/triton; Gluon and DeepGEMM skipped with their reasons), the sidecar
    beside the tiles file, the check, the install; the layer built afterwards reads what was chosen,
    and vLLM's rule still reads the tiles file."""
    out = tmp_path / "tune"
    top, part = tmp_path / "configs", tmp_path / "configs" / "partial"
    monkeypatch.setattr(tconfig, "CONFIG_DIR", top)
    monkeypatch.setattr(tconfig, "PARTIAL_DIR", part)
    argv = [
        "tune",
        "experts=triton",
        "backend=local",
        "model=tiny",
        "quant=fp8_block",
        "runner.device=cpu",
        "workload.tokens_per_rank=[4,16]",
        "--space",
        "small_fp8",
        "--reps",
        "1",
        "--final-reps",
        "1",
        "--decisions",
        "--max-regression",
        "50",  # the interpreter's times are the host's: the check runs, its verdict is not at stake
        "--install",
        "--allow-cpu-tiles",  # the interpreter's tiles: host time, installed only to test the install
        "--out",
        str(out),
    ]
    assert cli.main([a for a in argv if a != "--install"]) == 0
    text = capsys.readouterr().out
    assert "decisions (whole layers, interleaved)" in text and "vs current" in text
    assert "| 4 | host | " in text  # each count says how it was timed (the host's clock: no CUDA)
    tiles = tconfig.config_file_name(8, 128, "fp8_w8a8", [128, 128])
    side = json.loads((out / "configs" / kdec.decisions_name(tiles)).read_text())
    assert {p["timing"] for p in side["provenance"].values()} == {"host"}
    parsed = kdec.parse(side)
    assert set(parsed.entries) == {4, 16} and parsed.deepgemm_min_tokens is None  # DeepGEMM: no CPU
    assert all(e["row_layout"] in ("gathered", "contiguous") for e in parsed.entries.values())
    detail = json.loads((out / "tune.json").read_text())
    for d in detail["decisions"]:
        assert d["timing"] == "host"
        assert d["device_peak_bytes"] is None  # no GPU: no peak (a GPU's is tests/gpu/test_tune_decisions_gpu.py's)
        names = {t["option"] for t in d["timed"]}
        assert {"current", "gathered", "gathered-btma", "contiguous/triton"} <= names
        assert all(t["error"] == "" and t["rel_err"] < 0.1 for t in d["timed"]), d["timed"]
        why = dict(d["not_run"])
        assert "interpreter" in why["contiguous/gluon (every GLUON_VARIANTS and GLUON_EXTRAS entry)"]
        assert why["deepgemm"]
    assert detail["decisions_check"]["passed"]
    # the same command with --install: the tiles' trials and the decisions' timings are read, not timed
    assert cli.main(argv) == 0
    assert "tune decisions: 8 of 8 timings reused from " in capsys.readouterr().err
    # installed beside the tiles (partial/: two sizes), the tiles file as vLLM reads it
    assert (part / kdec.decisions_name(tiles)).is_file()
    assert set(json.loads((part / tiles).read_text())) == {"4", "16"}
    assert cli.main(["tune", "--check-vllm", str(out / "configs" / tiles)]) == 1  # two sizes: far, as before
    report = capsys.readouterr().out
    assert "PROBLEM: grid sizes" in report and "moebench's decisions" in report and "lack" not in report
    assert cli.main(["tune", "--check-vllm", str(out / "configs" / kdec.decisions_name(tiles))]) == 0
    # the layer built now takes the tuned layout at each tuned size
    monkeypatch.delenv(tconfig.CONFIG_DIR_ENV)
    kdec.clear_cache()
    tconfig._load_configs.cache_clear()
    ex = _experts()
    assert ex.decisions is not None
    for m, e in parsed.entries.items():
        assert ex.contiguous(m, P) == (e["row_layout"] == "contiguous")


def test_vllm_reads_the_tiles_file_unchanged_beside_a_sidecar(tmp_path, capsys):
    name = tconfig.config_file_name(8, 128, "fp8_w8a8", [128, 128], device="NVIDIA H100 80GB HBM3")
    entry = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, GROUP_SIZE_M=1, num_warps=4, num_stages=3)
    (tmp_path / name).write_text(json.dumps({str(m): entry for m in tconfig.VLLM_BATCH_SIZES}))
    body = {kdec.SCHEMA_KEY: 1, "deepgemm_min_tokens": 1024, "entries": {"16": {"row_layout": "gathered"}}}
    (tmp_path / kdec.decisions_name(name)).write_text(json.dumps(body))
    assert cli.main(["tune", "--check-vllm", str(tmp_path / name)]) == 0
    text = capsys.readouterr().out
    assert "ok: vLLM would use an entry within 2x" in text and "decisions (1 entry, deepgemm_min_tokens 1024)" in text
    assert sorted(tconfig.read_config_file(tmp_path / name)) == sorted(tconfig.VLLM_BATCH_SIZES)


# -- resuming the decisions stage (decision_trials.py) ------------------------------------

BF16 = ["experts=triton", "backend=local", "model=tiny", "quant=bf16", "runner.device=cpu"]
# host figures ranked as a GPU's might: gathered wins at 1 token, contiguous/triton at 2 (µs)
FIXED = {"current": (10.0, 10.0), "gathered": (9.0, 12.0), "contiguous/triton": (11.0, 8.0)}


def _counting_bench(c, fail_at=None):
    """The real DecisionBench (every option checked and timed through the interpreter) that records
    which options it timed, ranks them by FIXED (the host's figures decide nothing here) and, at
    token count `fail_at`, stops as a Ctrl-C would."""
    from moebench.tune import decide

    class Counting(decide.DecisionBench):
        def run(self, T, opts, reps, salt=7):
            if T == fail_at:
                raise KeyboardInterrupt
            out = super().run(T, opts, reps, salt)
            self.calls.append((T, sorted(o.name for o in opts)))
            for t in out:
                t.us = FIXED[t.option][T - 1] if t.ok else t.us
            return out

    bench = Counting(c, torch.device("cpu"))
    bench.calls = []
    return bench


def _choices(found):
    from moebench.tune.decide import switch_over

    return [(r.tokens, r.best, r.best_overall, r.entry) for r in found], switch_over(found)


def test_an_interrupted_decisions_stage_resumes_without_timing_again(tmp_path):
    from moebench.tune import decide, decision_options
    from moebench.tune.decision_trials import FILE_NAME, DecisionStore, env_key
    from moebench.tune.search import resolve

    c, _ = resolve(BF16 + ["workload.tokens_per_rank=[1,2]"])
    cpu = torch.device("cpu")
    rows = {1: 1, 2: 2}

    def run(out, fail_at=None, log=lambda s: None):
        bench = _counting_bench(c, fail_at)
        store = DecisionStore(out, c.key, env_key(cpu))
        return decide.decide(c, [1, 2], rows, {}, 1, cpu, log, bench, store), bench.calls

    clean, calls = run(tmp_path / "clean")
    every = ["contiguous/triton", "current", "gathered"]
    assert calls == [(1, every), (2, every)]
    # interrupted at 2 tokens: the timings at 1 are stored, each option one line
    out = tmp_path / "tune"
    with pytest.raises(KeyboardInterrupt):
        run(out, fail_at=2)
    assert len((out / FILE_NAME).read_text().splitlines()) == 3
    with open(out / FILE_NAME, "a") as f:
        f.write('{"key": {"layer": "cut short by a ki')  # a kill mid-line: skipped when read
    lines = []
    resumed, calls = run(out, log=lines.append)
    assert calls == [(2, every)]  # 1 token's options were read, not timed again
    assert f"tune decisions: 3 of 6 timings reused from {out / FILE_NAME}" in lines
    assert _choices(resumed) == _choices(clean)
    assert _choices(clean) == (
        [
            (1, "gathered", "gathered", {"row_layout": "gathered"}),
            (2, "contiguous/triton", "contiguous/triton", {"row_layout": "contiguous", "contiguous_gemm": "triton"}),
        ],
        None,
    )
    stored = resumed[0].get("gathered")
    assert stored.ok and stored.rel_err < 0.1 and stored.samples and stored.ran  # the figures came back whole

    # all six stored now; none is another layer's, another machine's or code's, and --fresh forgets them
    def found(store):
        opts = decision_options.options_of(c.combo, cpu, None)[0]
        return sum(store.get(store.key(T, o, 1, "host")) is not None for T in (1, 2) for o in opts)

    other, _ = resolve(BF16 + ["workload.tokens_per_rank=[1,2]", "workload.seed=1"])
    assert other.key != c.key
    assert found(DecisionStore(out, c.key, env_key(cpu))) == 6
    assert found(DecisionStore(out, other.key, env_key(cpu))) == 0
    assert found(DecisionStore(out, c.key, "another GPU, torch, Triton or moebench source")) == 0
    _sidecar(tmp_path, {"8": {"row_layout": "contiguous"}}, quant="bf16")  # an install changes `current`
    assert found(DecisionStore(out, c.key, env_key(cpu))) == 0
    assert found(DecisionStore(out, c.key, env_key(cpu), resume=False)) == 0 and not (out / FILE_NAME).exists()


def _finished_tune(out, decisions_check=None):
    """A finished tune's folder: tiles at 4 and 16 tokens, their provenance and decisions sidecars, and tune.json whose
    figures have the chosen option 1.2x slower than the layer's current run at 16 tokens."""
    tiles = tconfig.config_file_name(8, 128, "fp8_w8a8", [128, 128])
    entry = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, GROUP_SIZE_M=1, num_warps=4, num_stages=3)
    (out / "configs").mkdir(parents=True)
    (out / "configs" / tiles).write_text(json.dumps({"4": entry, "16": entry}))
    side = {kdec.SCHEMA_KEY: 1, "deepgemm_min_tokens": None, "entries": {"16": {"row_layout": "contiguous"}}}
    (out / "configs" / kdec.decisions_name(tiles)).write_text(json.dumps(side))
    # timed on a GPU, as a table that may be installed was (test_tune_cpu.py: one from the CPU is refused)
    gpu = {"layer": {"device": "cuda"}, "environment": {"device": "NVIDIA H100 80GB HBM3", "triton_interpret": False}}
    (out / "configs" / (tiles[: -len(".json")] + ".provenance.json")).write_text(json.dumps(gpu))

    def timed(option, us):
        return {"option": option, "us": us, "p20": us, "p80": us, "rel_err": 0.0, "error": "", "samples": [us]}

    current = {"config": {**entry, "BLOCK_SIZE_N": 128}, "us": 10.0, "error": ""}
    detail = {
        **gpu,
        "results": [
            {"tokens": T, "rows": T, "best": entry, "best_us": 9.0, "baselines": {"current": current}} for T in (4, 16)
        ],
        "decisions": [
            {"tokens": 4, "best": "gathered", "timed": [timed("current", 10.0), timed("gathered", 9.0)]},
            {
                "tokens": 16,
                "best": "contiguous/triton",
                "timed": [timed("current", 10.0), timed("contiguous/triton", 12.0)],
            },
        ],
    }
    if decisions_check is not None:
        detail["decisions_check"] = decisions_check
    (out / "tune.json").write_text(json.dumps(detail))
    return tiles


def test_a_count_whose_timing_fails_says_why_and_is_timed_again_on_resume(tmp_path, monkeypatch):
    """time_interleaved raising (e.g. out of memory while capturing every option's graph) fails that
    count's options with the reason, not the tune; the failure is not stored, so a resumed tune times
    the count again."""
    from moebench.measure import timing
    from moebench.tune import decide
    from moebench.tune.decision_trials import FILE_NAME, DecisionStore, env_key
    from moebench.tune.search import resolve

    c, _ = resolve(BF16 + ["workload.tokens_per_rank=[1]"])
    cpu = torch.device("cpu")
    real = timing.time_interleaved

    def oom(*a, **k):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(timing, "time_interleaved", oom)
    store = DecisionStore(tmp_path, c.key, env_key(cpu))
    (r,) = decide.decide(c, [1], {1: 1}, {}, 1, cpu, bench=None, store=store)
    assert r.timed and all(
        t.error.startswith("timing failed (eager forwards): RuntimeError: CUDA out of") for t in r.timed
    )
    stored = tmp_path / FILE_NAME
    assert r.best == "" and (not stored.exists() or not stored.read_text().strip())  # nothing stored
    monkeypatch.setattr(timing, "time_interleaved", real)
    (r,) = decide.decide(c, [1], {1: 1}, {}, 1, cpu, bench=None, store=DecisionStore(tmp_path, c.key, env_key(cpu)))
    assert r.best and all(not t.error for t in r.timed)


def test_install_from_applies_max_regression_to_the_decisions(tmp_path, monkeypatch, capsys):
    """--install-from DIR --max-regression X decides on DIR/tune.json's figures as a fresh --install
    decides on its check: 1.2x at 16 tokens passes 0.5 and is refused at 0.1 (exit 1, one line,
    nothing installed); a tune whose own check refused is not installed without the flag either."""
    top, part = tmp_path / "configs", tmp_path / "configs" / "partial"
    monkeypatch.setattr(tconfig, "CONFIG_DIR", top)
    monkeypatch.setattr(tconfig, "PARTIAL_DIR", part)
    out = tmp_path / "tune"
    tiles = _finished_tune(out)
    assert cli.main(["tune", "--install-from", str(out), "--max-regression", "0.1"]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (
        f"moebench tune: --install-from {out}: --max-regression 0.1: not installed: decisions at 16 tokens: "
        "chosen contiguous/triton 12.0 µs vs current 10.0 µs = 1.200x, above 1.1x "
        "(tune.json decisions (chosen and current timed together))"
    )
    assert not top.exists()  # neither the tiles nor the decisions
    assert cli.main(["tune", "--install-from", str(out), "--max-regression", "0.5"]) == 0
    assert (part / tiles).is_file() and json.loads((part / kdec.decisions_name(tiles)).read_text())["entries"]
    # the tiles are held to the same threshold (here on the search's figures: no check was run)
    detail = json.loads((out / "tune.json").read_text())
    detail["results"][1]["best_us"] = 16.0
    (out / "tune.json").write_text(json.dumps(detail))
    assert cli.main(["tune", "--install-from", str(out), "--max-regression", "0.5"]) == 1
    assert "not installed: tiles at 16 tokens: tuned 16.0 µs vs current 10.0 µs = 1.600x" in capsys.readouterr().err
    # the tune ran its own check (0.02) and it refused: re-checked on its figures, flag or not
    check = {
        "max_regression": 0.02,
        "passed": False,
        "sizes": [
            {
                "tokens": 16,
                "chosen": {"option": "contiguous/triton", "us": 10.5},
                "current": {"option": "current", "us": 10.0},
            }
        ],
    }
    again = tmp_path / "again"
    _finished_tune(again, check)
    assert cli.main(["tune", "--install-from", str(again)]) == 1
    err = capsys.readouterr().err
    assert "--max-regression 0.02 (the tune's own): not installed: decisions at 16 tokens" in err
    assert "1.050x, above 1.02x (tune.json decisions_check)" in err
    assert cli.main(["tune", "--install-from", str(again), "--max-regression", "0.1"]) == 0  # a looser X: passes
    (again / "tune.json").unlink()  # tuned files and their sidecars only: nothing to decide on
    assert cli.main(["tune", "--install-from", str(again), "--max-regression", "0.1"]) == 2
    assert f"no {again / 'tune.json'}: --max-regression has no figures" in capsys.readouterr().err
    assert cli.main(["tune", "--install-from", str(again)]) == 0  # the sidecar says a GPU timed them


def test_the_decisions_check_keeps_why_it_retimed_once_not_in_each_option():
    """tune.json's decisions_check: why a pair was timed twice lives in the check's own `retimed` map;
    its options carry no `retimed` field (it was written '' for each); a file with it reads the same."""
    from moebench.tune.decide import DecisionCheck
    from moebench.tune.decision_trials import Timed
    from moebench.tune.install_check import decision_check

    chosen = Timed("contiguous/triton", us=9.0, p20=8.9, p80=9.1, rel_err=0.0, samples=[9.0], ran="contiguous")
    current = Timed("current", us=10.0, p20=9.9, p80=10.1, rel_err=0.0, samples=[10.0])
    got = DecisionCheck(0.1, [(16, chosen, current)], {16: "current: host-paced: 1 of 5 samples"}).to_json()
    assert got["retimed"] == {"16": "current: host-paced: 1 of 5 samples"}
    size = got["sizes"][0]
    assert "retimed" not in size["chosen"] and "retimed" not in size["current"]
    assert size["chosen"]["us"] == 9.0 and size["current"]["option"] == "current"
    old = json.loads(json.dumps(got))
    old["sizes"][0]["chosen"]["retimed"] = old["sizes"][0]["current"]["retimed"] = ""  # as older tunes wrote
    for stored in (got, old):
        check, where = decision_check({"decisions_check": stored}, 0.1)
        assert where == "tune.json decisions_check" and check.sizes == [(16, chosen, current)]
        assert check.passed
    # a chosen option that failed in the check: its figures null (strict JSON), NaN again when read
    failed = Timed("contiguous/triton", error="RuntimeError: out of memory")
    text = json.dumps(DecisionCheck(0.1, [(16, failed, current)]).to_json(), allow_nan=False)
    check, _ = decision_check({"decisions_check": json.loads(text)}, 0.1)
    back = check.sizes[0][1]
    assert back.error == failed.error and back.us != back.us  # NaN
    assert check.regressions() == [f"16 tokens: the chosen contiguous/triton failed in the check ({failed.error})"]


def test_the_decisions_table_and_check_write_times_in_the_unit_that_reads_best():
    """A CPU decisions tune times seconds a call: the summary, the check's lines read '1.02 s', not
    '1019265.2 µs' (words.latency); ratios keep their two or three decimals."""
    from moebench.tune import decision_files
    from moebench.tune.decide import DecisionCheck, DecisionResult
    from moebench.tune.decision_trials import Timed

    timed = [
        Timed("current", us=1019265.2, rel_err=0.0, ran="gathered"),
        Timed("gathered", us=812345.6, rel_err=0.0),
        Timed("contiguous/triton", us=1395315.0, rel_err=0.0),
    ]
    r = DecisionResult(tokens=4, rows=8, timed=timed, best="gathered", best_overall="gathered")
    table = decision_files.summary([r])
    assert "| tokens | timing | chosen | time |" in table
    row = "| 4 | – | gathered | 812 ms | 1.25x (current ran gathered: 1.02 s) | contiguous/triton 1.40 s (1.72x) |"
    assert row in table, table
    got, cur = Timed("gathered", us=1019265.2, rel_err=0.0), Timed("current", us=812345.6, rel_err=0.0)
    assert DecisionCheck(0.1, [(4, got, cur)]).regressions() == [
        "4 tokens: chosen gathered 1.02 s vs current 812 ms = 1.255x, above 1.1x"
    ]


def test_ctrl_c_in_the_decisions_stage_says_the_same_command_resumes(tmp_path, monkeypatch, capsys):
    from moebench.tune import compile as tcompile
    from moebench.tune import decide, search
    from moebench.tune.search import TokenResult

    entry = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, GROUP_SIZE_M=1, num_warps=4, num_stages=3)
    info = {"E": 8, "N": 128, "dtype": None, "block_shape": None, "space_size": 1}
    found = (info, None, [TokenResult(tokens=4, best=entry, best_us=1.0)], tcompile.Stats(), 0.0)
    monkeypatch.setattr(search, "tune", lambda *a, **k: found)

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(decide, "for_tune", interrupted)
    out = tmp_path / "tune"
    assert cli.main(["tune", *BF16, "workload.tokens_per_rank=[4]", "--decisions", "--out", str(out)]) == 130
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("moebench tune: interrupted during --decisions; the tiles are in ")
    assert (
        f"the decisions timed so far in {out / 'decisions.jsonl'}, nothing installed: the same command resumes" in line
    )


TILE = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, GROUP_SIZE_M=1, num_warps=4, num_stages=3)


def _searched(monkeypatch, found_decisions, dec_check=None):
    """`moebench tune` with its tile search stubbed (TILE won at 4 tokens) and --decisions'
    stage returning `found_decisions` and `dec_check`."""
    from types import SimpleNamespace

    from moebench.tune import compile as tcompile
    from moebench.tune import decide, search
    from moebench.tune.search import TokenResult

    info = {"E": 8, "N": 128, "dtype": None, "block_shape": None, "space_size": 1}
    pruned = SimpleNamespace(kept=[TILE], summary=lambda: "1 config")
    found = (info, pruned, [TokenResult(tokens=4, best=dict(TILE), best_us=1.0)], tcompile.Stats(), 0.0)
    monkeypatch.setattr(search, "tune", lambda *a, **k: found)
    monkeypatch.setattr(decide, "for_tune", lambda *a, **k: (found_decisions, dec_check))


def test_the_decisions_extend_tune_json_without_writing_the_tiles_again(tmp_path, monkeypatch):
    """--decisions adds its figures to tune.json alone: the tiles file, its provenance and SGLang's
    copy are written once (they were written a second time, unchanged, with tune.json's decisions)."""
    from moebench.tune import files

    _searched(monkeypatch, [])
    written = []
    real = files.replace_text

    def counting(path, text):
        written.append(path.name)
        return real(path, text)

    monkeypatch.setattr(files, "replace_text", counting)
    out = tmp_path / "tune"
    assert cli.main(["tune", *BF16, "workload.tokens_per_rank=[4]", "--decisions", "--out", str(out)]) == 0
    tiles = tconfig.config_file_name(8, 128, None, None)
    assert written.count("tune.json") == 2  # the tiles' figures, then with the decisions'
    assert sorted(n for n in written if n != "tune.json") == sorted(
        [tiles, files.sidecar_name(tiles), tconfig.name_variants(tiles)[-1]]
    )
    assert json.loads((out / "tune.json").read_text())["decisions"] == []
    assert json.loads((out / "configs" / tiles).read_text()) == {"4": TILE}


def test_a_decisions_regression_still_reports_the_tiles_check(tmp_path, monkeypatch, capsys):
    """--max-regression refusing the decisions and the tiles both: each check's lines are printed
    (the decisions' refusal returned before the tiles' table and lines), then exit 1."""
    from moebench.tune import regression
    from moebench.tune.decide import DecisionCheck
    from moebench.tune.decision_trials import Timed

    slower = Timed("contiguous/triton", us=12.0, rel_err=0.0)
    _searched(monkeypatch, [], DecisionCheck(0.1, [(4, slower, Timed("current", us=10.0, rel_err=0.0))]))
    size = regression.SizeCheck(tokens=4, tuned=dict(TILE), current={**TILE, "BLOCK_SIZE_N": 128})
    size.tuned_us, size.current_us = 20.0, 10.0
    check = regression.Check(max_regression=0.1, reps=3, timing="host", sizes=[size])
    monkeypatch.setattr(regression, "check_tune", lambda *a, **k: check)
    out = tmp_path / "tune"
    argv = ["tune", *BF16, "workload.tokens_per_rank=[4]", "--decisions", "--max-regression", "0.1"]
    assert cli.main(argv + ["--out", str(out)]) == 1
    got = capsys.readouterr()
    assert "moebench tune: decisions regression: 4 tokens: chosen contiguous/triton 12.0 µs" in got.err
    assert "moebench tune: the decisions regress\n" in got.err
    assert "moebench tune: regression: 4 tokens: tuned " in got.err and "above 1.1x" in got.err
    assert check.table() in got.out and "1 of 1 token count regresses; worst 2.000x at 4 tokens" in got.out


def test_a_partial_sidecar_moves_up_with_its_tiles(tmp_path, monkeypatch):
    """Tiles installed into partial/ (too few sizes for vLLM's grid) with their decisions, then the
    rest of the grid: the tiles move to kernels/configs/, and the decisions with them, merged (the
    new entries win), the partial sidecar gone (the layer searches partial/ too); an install of
    tiles alone moves it as well."""
    from moebench.tune import decision_files, files

    top, part = tmp_path / "configs", tmp_path / "configs" / "partial"
    monkeypatch.setattr(tconfig, "CONFIG_DIR", top)
    monkeypatch.setattr(tconfig, "PARTIAL_DIR", part)
    tile = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, GROUP_SIZE_M=1, num_warps=4, num_stages=3)
    name = tconfig.config_file_name(8, 128, None, None, device="NVIDIA H100")
    out = tmp_path / "out"
    out.mkdir()
    src, side = out / name, out / kdec.decisions_name(name)

    def install(tiles: dict, entries: dict | None, dg=None) -> None:
        src.write_text(json.dumps(tiles))
        side.unlink(missing_ok=True)
        if entries is not None:
            body = {kdec.SCHEMA_KEY: 1, "layer": {"hidden": 256}, "deepgemm_min_tokens": dg, "entries": entries}
            side.write_text(json.dumps(body))
        decision_files.install(src, files.install(src, print), print)

    install({"16": tile}, {"16": {"row_layout": "gathered"}, "256": {"row_layout": "gathered"}}, dg=512)
    assert (part / kdec.decisions_name(name)).is_file() and not (top / kdec.decisions_name(name)).exists()
    install({str(m): tile for m in tconfig.VLLM_BATCH_SIZES}, {"256": {"row_layout": "contiguous"}})
    up = json.loads((top / kdec.decisions_name(name)).read_text())
    assert up["entries"] == {"16": {"row_layout": "gathered"}, "256": {"row_layout": "contiguous"}}
    assert up["deepgemm_min_tokens"] == 512  # kept: the new sidecar set none
    assert not (part / kdec.decisions_name(name)).exists() and not (part / name).exists()
    # tiles alone (no --decisions): a partial sidecar left from before moves up all the same
    other = tconfig.config_file_name(8, 64, None, None, device="NVIDIA H100")
    (part).mkdir(exist_ok=True)
    (part / other).write_text(json.dumps({"16": tile}))
    body = {
        kdec.SCHEMA_KEY: 1,
        "layer": {"hidden": 256},
        "deepgemm_min_tokens": None,
        "entries": {"16": {"row_layout": "gathered"}},
    }
    (part / kdec.decisions_name(other)).write_text(json.dumps(body))
    src2 = out / other
    src2.write_text(json.dumps({str(m): tile for m in tconfig.VLLM_BATCH_SIZES}))
    decision_files.install(src2, files.install(src2, print), print)
    assert json.loads((top / kdec.decisions_name(other)).read_text())["entries"] == {"16": {"row_layout": "gathered"}}
    assert not (part / kdec.decisions_name(other)).exists()


def test_the_contiguous_options_are_judged_on_one_tp_ranks_shard():
    """options_of reads the shard's width through the one TP rule (registry.ep_split): backend=tp
    over two ranks halves a 384-wide expert to 192, which the contiguous layout cannot run, as
    simulate_tp=2 does on one rank; the whole 384 can."""
    from moebench.tune.decision_options import options_of

    def skipped(**split):
        combo = {"backend": "local", "world_size": 1, "simulate_ep": 1, "simulate_tp": 1, "quant": "bf16"}
        combo.update(hidden=2048, intermediate=384, **split)
        return [what for what, _ in options_of(combo, torch.device("cpu"), None)[1]]

    assert "contiguous (every GEMM kernel)" not in skipped()
    assert "contiguous (every GEMM kernel)" in skipped(simulate_tp=2)
    assert "contiguous (every GEMM kernel)" in skipped(backend="tp", world_size=2)


class _Paced:
    """Timings whose first `paced` pairs come back host-paced (the host busy for a moment: on the
    H200 one of mixtral's 30 check samples at 256 tokens), each later pair `us` (µs by name)."""

    def __init__(self, us, paced=1, side="tuned"):
        self.us, self.calls, self.paced, self.side = us, 0, paced, side

    def pair(self, names):
        from moebench.tune.trials import HOST_PACED_ERROR

        self.calls += 1
        paced = f"{HOST_PACED_ERROR}: 1 of 3 samples: host time, not ranked" if self.calls <= self.paced else ""
        return [(n, self.us[n], paced if (n == "current") == (self.side == "current") else "") for n in names]


def test_the_decisions_are_timed_as_the_runner_times_the_layer():
    """DecisionBench times each count by the runner's rule (validity.timing_mode, worker.py):
    auto, the default, replays graphs at every size wherever the layer captures (the tune's own
    combination does); graph only up to runner.graph_max_tokens; events and profiler as held
    events; off CUDA the host's clock."""
    from moebench.config import compose
    from moebench.tune.decide import DecisionBench
    from moebench.tune.decision_options import decision_timing
    from moebench.tune.search import resolve

    def combo(*overrides: str):
        base = ["model=tiny", "quant=bf16", "reduction=experts", "overlap=none", "backend=local", "experts=triton"]
        return compose.to_combo(compose.compose_config([*base, *overrides]), device="cuda")

    sizes = (16, 256, 1024, 16384)
    assert [decision_timing(combo(), T, "cuda") for T in sizes] == ["graph"] * 4
    graph = combo("runner.timing=graph", "runner.graph_max_tokens=256")
    assert [decision_timing(graph, T, "cuda") for T in sizes] == ["graph", "graph", "events", "events"]
    for mode in ("events", "profiler"):
        assert [decision_timing(combo(f"runner.timing={mode}"), T, "cuda") for T in sizes] == ["events"] * 4
    # auto's own exceptions hold too: under a memory budget it times events (no private pools)
    assert decision_timing(combo("runner.memory_budget=1GiB"), 16384, "cuda") == "events"
    assert decision_timing(combo(), 16384, "cpu") == "host"
    # the tune's combination (gathered rows pinned) as on a GPU: replays at 16384 tokens
    c, _ = resolve(BF16)
    assert c.combo["timing"] == "auto"
    assert decision_timing(c.combo.replace(device="cuda"), 16384, "cuda") == "graph"
    assert DecisionBench(c, torch.device("cpu")).timing(16384) == "host"


def _layer_bench(script):
    """regression.measure's LayerBench, answering from `script` (the tuned entry, then the current)."""
    from types import SimpleNamespace

    class At:
        timing = "host"

        def interleaved(self, configs, reps):
            return [
                SimpleNamespace(us=us, error=e, samples=[us] * reps) for _, us, e in script.pair(["tuned", "current"])
            ]

    attrs = {"__init__": lambda self, c, d: None, "shape": SHAPE, "warmup": 1, "at": lambda self, T: At()}
    return type("LayerBench", (), attrs)


@pytest.mark.parametrize(
    "paced, side, passes", [(1, "tuned", True), (2, "tuned", False), (1, "current", True), (2, "current", True)]
)
def test_a_host_paced_check_times_the_pair_again_before_it_decides(monkeypatch, paced, side, passes):
    """Both --max-regression checks: a pair whose samples the host paced is timed once more; the
    second figures decide (`retimed` says why, as the decisions' own retime: '<the paced side>: host-paced:
    …'), and only a second host-paced tuned side refuses (a current side that never gave a figure cannot
    be regressed from)."""
    from moebench.tune import bench as tbench
    from moebench.tune import regression
    from moebench.tune.decide import DecisionBench, DecisionResult, check
    from moebench.tune.decision_trials import Timed
    from moebench.tune.search import resolve

    c, _ = resolve(BF16)
    cpu = torch.device("cpu")
    tiles = _Paced({"tuned": 9.0, "current": 10.0}, paced, side)
    monkeypatch.setattr(tbench, "baselines_of", lambda dims, quant, rows: {"current": {**TILE, "BLOCK_SIZE_N": 128}})
    monkeypatch.setattr(tbench, "LayerBench", _layer_bench(tiles))
    got = regression.measure(c, {4: dict(TILE)}, 3, cpu, 0.02)
    (s,) = got.sizes
    assert tiles.calls == 2 and s.retimed.startswith(f"{side}: host-paced: 1 of 3 samples") and got.passed is passes
    assert bool(s.tuned_error) is (side == "tuned" and paced == 2)
    assert bool(s.current_error) is (side == "current" and paced == 2)

    decisions = _Paced({"gathered": 9.0, "current": 10.0}, paced, side)

    class Bench(DecisionBench):
        def run(self, T, opts, reps, salt=7):
            return [Timed(n, us=us, rel_err=0.0, error=e) for n, us, e in decisions.pair([o.name for o in opts])]

    dc = check(c, [DecisionResult(tokens=4, rows=8, best="gathered")], {}, 3, cpu, 0.02, bench=Bench(c, cpu))
    assert decisions.calls == 2 and dc.passed is passes, dc.regressions()
    paced_name = "current" if side == "current" else "gathered"
    assert dc.to_json()["retimed"]["4"].startswith(f"{paced_name}: host-paced: 1 of 3 samples"), dc.retimed


@pytest.mark.parametrize("paced", [1, 2])
def test_a_count_the_host_paced_is_timed_once_more_before_it_ranks(tmp_path, paced):
    """A count whose first timing came back host-paced for any option (on an H100 the current layer, 1 of
    5 samples at 256 tokens) is timed again, every option together, and the second timing ranks; the
    result, tune.json's record, the sidecar's provenance and the summary say why it ran twice. Paced
    twice, that option stays unranked. What is stored is the second timing, with why: a resumed tune
    reads it back and still says so, and times a count with an option stored host-paced again, whole."""
    from moebench.tune import decide, decision_files
    from moebench.tune.decide import DecisionBench
    from moebench.tune.decision_trials import DecisionStore, Timed, env_key
    from moebench.tune.search import resolve

    c, _ = resolve(BF16 + ["workload.tokens_per_rank=[4]"])
    cpu = torch.device("cpu")
    script = _Paced({"current": 10.0, "gathered": 9.0, "contiguous/triton": 11.0}, paced, side="current")
    lines: list[str] = []
    calls: list[list[str]] = []  # the options each timing took

    class Bench(DecisionBench):
        def run(self, T, opts, reps, salt=7):
            names = [o.name for o in opts]
            calls.append(names)
            us = {n: script.us.get(n, 20.0) for n in names}
            got = [(n, us[n], e) for n, _, e in script.pair(names)]
            return [Timed(n, us=u, rel_err=0.0, error=e) for n, u, e in got]

    store = DecisionStore(tmp_path, c.key, env_key(cpu))
    (r,) = decide.decide(c, [4], {4: 4}, {}, 3, cpu, lines.append, bench=Bench(c, cpu), store=store)
    assert len(calls) == 2 and calls[1] == calls[0] and len(calls[0]) > 2  # every option, both times
    assert r.retimed.startswith("current: host-paced: 1 of 3 samples"), r.retimed
    assert any(s.startswith("tune decisions T=4: current: host-paced") and "once more" in s for s in lines), lines
    cur = r.get("current")
    assert bool(cur.error) is (paced == 2) and r.best == "gathered"
    assert decision_files.to_json([r])[0]["retimed"] == r.retimed
    assert decision_files.sidecar({"E": 2}, [r])["provenance"]["4"]["retimed"] == r.retimed
    assert "Timed twice, the host having paced a sample the first time: 4 tokens (current: host-paced" in (
        decision_files.summary([r])
    )
    # resumed: the stored second timing is read back with why it was taken; a count with an option
    # stored host-paced (paced twice) is timed again, every option together
    again = DecisionStore(tmp_path, c.key, env_key(cpu))
    (back,) = decide.decide(c, [4], {4: 4}, {}, 3, cpu, bench=Bench(c, cpu), store=again)
    assert back.retimed == r.retimed and back.get("current").ok
    assert calls[2:] == ([calls[0]] if paced == 2 else [])


def test_tune_json_says_once_why_a_count_was_timed_twice_and_reads_a_file_that_said_it_twice():
    """tune.json's decision record holds `retimed` once, not again in each option's figures (each
    carried the same string); a tune.json written with both still decides --install-from alike."""
    from moebench.tune import decision_files, install_check
    from moebench.tune.decide import DecisionResult
    from moebench.tune.decision_trials import Timed

    why = "current: host-paced: 1 of 3 samples: host time, not ranked"
    timed = [Timed("current", us=10.0, rel_err=0.0, retimed=why), Timed("gathered", us=12.0, rel_err=0.0, retimed=why)]
    r = DecisionResult(tokens=4, rows=8, timed=timed, best="gathered", best_overall="gathered")
    (record,) = decision_files.to_json([r])
    assert record["retimed"] == why and all("retimed" not in t for t in record["timed"])
    old = {**record, "timed": [{**t, "retimed": why} for t in record["timed"]]}  # as written before
    for stored in (record, old):
        dc, where = install_check.decision_check(json.loads(json.dumps({"decisions": [stored]})), 0.1)
        assert where.startswith("tune.json decisions") and [(T, g.option, c.option) for T, g, c in dc.sizes] == [
            (4, "gathered", "current")
        ]
        assert dc.regressions() == ["4 tokens: chosen gathered 12.0 µs vs current 10.0 µs = 1.200x, above 1.1x"]


def test_a_resumed_count_stored_host_paced_is_timed_again_with_every_option_together(tmp_path):
    """A count read back from decisions.jsonl with one option host-paced (paced twice in a row, or
    stored by a tune from before the retime) is timed again as a fresh count's retime is
    (trials.retime_host_paced): every option together, not the paced one alone against nothing, so
    its figure is taken side by side with the others'; the new timing ranks and is stored, `retimed`
    naming the stored paced option, and a second resume times nothing."""
    from moebench.tune import decide
    from moebench.tune.decision_options import options_of
    from moebench.tune.decision_trials import DecisionStore, Timed, env_key
    from moebench.tune.search import resolve
    from moebench.tune.trials import HOST_PACED_ERROR

    c, _ = resolve(BF16 + ["workload.tokens_per_rank=[4]"])
    cpu = torch.device("cpu")
    us = {"current": 10.0, "gathered": 9.0, "contiguous/triton": 11.0}
    calls: list[list[str]] = []

    class Bench(decide.DecisionBench):
        def run(self, T, opts, reps, salt=7):
            calls.append([o.name for o in opts])
            return [Timed(o.name, us=us.get(o.name, 20.0), rel_err=0.0) for o in opts]

    opts = options_of(c.combo, cpu, None)[0]
    store = DecisionStore(tmp_path, c.key, env_key(cpu))
    paced = f"{HOST_PACED_ERROR}: 1 of 3 samples: host time, not ranked"
    for o in opts:  # stored: gathered (the fastest) host-paced, the others timed beside it
        t = Timed(o.name, us=8.0 if o.name == "gathered" else us.get(o.name, 20.0), rel_err=0.0)
        t.error = paced if o.name == "gathered" else ""
        store.add(store.key(4, o, 3, "host"), t)
    lines: list[str] = []
    every = [o.name for o in opts]
    (r,) = decide.decide(
        c, [4], {4: 4}, {}, 3, cpu, lines.append, Bench(c, cpu), DecisionStore(tmp_path, c.key, env_key(cpu))
    )
    assert calls == [every] and len(every) > 2  # was [["gathered"]]: the paced one timed alone
    assert r.best == "gathered" and r.get("gathered").us == 9.0 and all(t.ok for t in r.timed)
    assert r.retimed == f"gathered: {paced}"
    assert any(s.startswith(f"tune decisions T=4: gathered: {HOST_PACED_ERROR}") and "once more" in s for s in lines)
    (back,) = decide.decide(
        c, [4], {4: 4}, {}, 3, cpu, bench=Bench(c, cpu), store=DecisionStore(tmp_path, c.key, env_key(cpu))
    )
    assert calls == [every] and back.retimed == r.retimed and back.get("current").us == 10.0

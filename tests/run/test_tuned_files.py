"""The `tuned_files` column: which tuned files (the tiles file, the decisions sidecar of
`moebench tune`) the Triton experts of a row read for its layer's shape, named once when the
experts are built; "" where they found none, None for experts that read no Triton config."""

from __future__ import annotations

import json
import math

import pytest
import torch

from moebench import cli
from moebench.kernels import registry
from moebench.kernels.interfaces import KernelContext, LayerShape, QuantSpec
from moebench.kernels.triton import config as tconfig
from moebench.kernels.triton import decisions as kdec
from moebench.measure.workload import build_expert_weights
from moebench.results import rows
from moebench.results.rank_result import RankResult
from moebench.results.store import RunStore
from moebench.run.plan import plan

SHAPE = LayerShape(hidden=256, intermediate=128, num_experts=8, topk=2)  # the tiny model
TILE = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 2}
# the fewest forwards through the interpreter: the column is named at build, whatever the timing
QUICK = ["runner.reps=2", "runner.warmup=0", "runner.phase_reps=1", "runner.memory=false", "runner.check=false"]
ENV = f"${tconfig.CONFIG_DIR_ENV}"


@pytest.fixture(autouse=True)
def tuned_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv(tconfig.CONFIG_DIR_ENV, str(tmp_path / "tuned"))
    (tmp_path / "tuned").mkdir()
    tconfig._load_configs.cache_clear()
    kdec.clear_cache()
    yield tmp_path / "tuned"
    tconfig._load_configs.cache_clear()
    kdec.clear_cache()


def _tiles(folder, quant, N=128) -> str:
    """A tiles file for the tiny layer (E=8) at intermediate N on this device; its name."""
    name = tconfig.config_file_name(8, N, tconfig.config_dtype(quant), tconfig.config_block_shape(quant))
    (folder / name).write_text(json.dumps({"16": TILE, "256": TILE}))
    return name


def _sidecar(folder, quant, hidden=256) -> str:
    tiles = tconfig.config_file_name(8, 128, tconfig.config_dtype(quant), tconfig.config_block_shape(quant))
    name = kdec.decisions_name(tiles)
    body = {kdec.SCHEMA_KEY: 1, "layer": {"hidden": hidden}, "entries": {"16": {"row_layout": "gathered"}}}
    (folder / name).write_text(json.dumps(body))
    return name


def _experts(name="triton", quant="bf16", reduction="experts", **options):
    ctx = KernelContext(
        shape=SHAPE, quant=QuantSpec(quant), device=torch.device("cpu"), simulate_ep=1, options=dict(options)
    )
    return registry.get_experts(name)(build_expert_weights(ctx, 0), reduction, ctx)


def _nothing(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


@pytest.mark.multiprocess
def test_a_sweeps_rows_name_the_tuned_files_their_triton_experts_read(tuned_dir, tmp_path):
    """bf16: a tiles file of the layer's shape; fp8_block: tiles and a decisions sidecar; fp8_tensor:
    a tiles file of another shape (N=256), which the layer never reads; torch experts: nothing."""
    bf16 = _tiles(tuned_dir, "bf16")
    block, block_dec = _tiles(tuned_dir, "fp8_block"), _sidecar(tuned_dir, "fp8_block")
    _tiles(tuned_dir, "fp8_tensor", N=256)
    out = tmp_path / "run"
    argv = ["sweep", "backend=local", "experts=triton,torch", "model=tiny", "quant=bf16,fp8_block,fp8_tensor"]
    rc = cli.main(
        [*argv, "reduction=experts", "overlap=none", "workload.tokens_per_rank=[16]", *QUICK, "--out", str(out)]
    )
    assert rc == 0
    df = RunStore(out).load()
    assert len(df) == 6 and set(df["status"]) == {"ok"}
    got = {(r.experts, r.quant): r.tuned_files for r in df.itertuples()}
    assert got[("triton", "bf16")] == f"{ENV}/{bf16}"
    assert got[("triton", "fp8_block")] == f"{ENV}/{block}; {ENV}/{block_dec}"
    assert got[("triton", "fp8_tensor")] == ""  # another shape's file: the heuristic tiles
    assert all(_nothing(got[("torch", q)]) for q in ("bf16", "fp8_block", "fp8_tensor"))


def test_each_triton_experts_names_what_it_read_at_build(tuned_dir):
    assert _experts().tuned_files == ""  # nothing tuned: the heuristic and today's constants
    assert _experts("triton_batched", reduction="finalize").tuned_files == ""
    tiles = _tiles(tuned_dir, "bf16")
    tconfig._load_configs.cache_clear()
    assert _experts().tuned_files == f"{ENV}/{tiles}"
    assert _experts("triton_batched", reduction="finalize").tuned_files == f"{ENV}/{tiles}"  # tiles only
    assert _experts(triton_config=TILE).tuned_files == ""  # the tuner's tile stands in for the file
    side = _sidecar(tuned_dir, "bf16")
    kdec.clear_cache()
    both = f"{ENV}/{tiles}; {ENV}/{side}"
    assert _experts().tuned_files == both
    assert _experts("triton_batched", reduction="finalize").tuned_files == f"{ENV}/{tiles}"  # reads no sidecar
    _sidecar(tuned_dir, "bf16", hidden=512)  # measured at another hidden size: not read
    kdec.clear_cache()
    assert _experts().tuned_files == f"{ENV}/{tiles}"
    assert not hasattr(_experts("torch"), "tuned_files")
    # triton_or_deepgemm (fp8_block: DeepGEMM's weights): its Triton experts' files, the switch-over's sidecar
    block = f"{ENV}/{_tiles(tuned_dir, 'fp8_block')}; {ENV}/{_sidecar(tuned_dir, 'fp8_block')}"
    tconfig._load_configs.cache_clear()
    kdec.clear_cache()
    assert _experts("triton_or_deepgemm", quant="fp8_block").tuned_files == block
    assert not hasattr(_experts("deepgemm", quant="fp8_block"), "tuned_files")


def test_a_file_in_the_packages_folder_is_named_from_kernels_configs(monkeypatch):
    monkeypatch.delenv(tconfig.CONFIG_DIR_ENV)
    inside = tconfig.PARTIAL_DIR / "E=1,N=2,device_name=X.json"
    assert tconfig.file_label(inside) == "kernels/configs/partial/E=1,N=2,device_name=X.json"
    assert tconfig.files_label([None, tconfig.CONFIG_DIR / "a.json", None]) == "kernels/configs/a.json"


def test_the_ranks_files_combine_into_the_rows():
    (combo,), _ = plan(["backend=naive", "experts=torch", "model=tiny", "overlap=none", "runner.device=cpu"])
    base = {"status": "ok", "rel_err": 1e-3, "samples_us": [10.0, 11.0]}

    def row(*named):
        ranks = [RankResult(rank=i, **base, tuned_files=t) for i, t in enumerate(named)]
        return rows.measured_row(combo, 8, ranks, {})["tuned_files"]

    assert row(None, None) is None and row("", "") == "" and row("a", "a") == "a" and row("a", "b") == "mixed"
    failed = rows.outcome_row(combo, 8, "skipped", "why", {})
    assert failed["tuned_files"] is None  # not run: nothing known

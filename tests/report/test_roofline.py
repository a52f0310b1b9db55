"""The roofline floor of a row (docs/design.md) from the ceilings measured on its GPU
(results/ceilings/<gpu>/ceilings.json, as benchmarks/ceilings.py writes it), and its report
table. The ceilings here are synthetic files written by the tests, with round figures that
no GPU has, so every expected floor below is computed by hand from them."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pandas as pd
import pytest

from moebench.report.roofline import CEILINGS_ENV, NO_CEILING, SCHEMA, add_floor, find_ceilings, gpu_slug, read_ceilings
from moebench.report.run_tables import roofline_table

REPO = Path(__file__).resolve().parents[2]
GPU = "NVIDIA Test GPU"


def write_ceilings(
    root: Path,
    gpu: str = GPU,
    device: str = "cuda",
    copy: float = 2.0e12,
    bf16: float = 5.0e14,
    fp8: float = 1.0e15,
    timestamp: str = "2026-12-01T00:00:00+00:00",
    folder: str = "",
) -> Path:
    path = root / (folder or gpu_slug(gpu)) / "ceilings.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            dict(
                schema=SCHEMA,
                device=device,
                gpu=gpu,
                commit="abc1234",
                timestamp=timestamp,
                ceilings=dict(copy_bytes_per_s=copy, gemm_flops_per_s=dict(bf16=bf16, fp8=fp8)),
            )
        )
    )
    return path


def row(**kw):
    base = dict(
        combo_key="k",
        timestamp="2026-11-30T00:00:00",
        status="ok",
        device="cuda",
        gpu=GPU,
        backend="local",
        experts="triton",
        reduction="experts",
        overlap="none",
        quant="bf16",
        model="m",
        world_size=1,
        tokens_per_rank=16,
        latency_us_median=1000.0,
        experts_us=800.0,
        expert_bytes=1.2e9,
        expert_flops=1.0e11,
        tflops=1.0,
        hbm_gbps=3000.0,
    )
    return base | kw


def test_floor_of_hand_made_rows_from_the_gpus_ceilings_file(tmp_path):
    write_ceilings(tmp_path)
    df = add_floor(
        pd.DataFrame(
            [
                row(),  # 1.2e9 B / 2e12 B/s = 600 µs; 1e11 FLOP / 5e14 = 200 µs: memory-bound, 600 / 800 µs = 75 %
                row(expert_bytes=1e6, expert_flops=5e11),  # 0.5 µs vs 1000 µs: compute-bound at the bf16 peak
                row(expert_bytes=1e6, expert_flops=5e11, quant="fp8_block"),  # 5e11 / 1e15 = 500 µs: the fp8 peak
                row(expert_bytes=1e6, expert_flops=5e11, quant="fp8_tensor"),  # the same fp8 peak
                row(gpu="NVIDIA Other GPU"),  # no file for this GPU: no floor
            ]
        ),
        root=tmp_path,
    )
    assert df["floor_us"].tolist()[:4] == pytest.approx([600.0, 1000.0, 500.0, 500.0])
    assert df["bound"].tolist() == ["memory", "compute", "compute", "compute", ""]
    assert df.loc[0, "experts_pct_of_floor"] == pytest.approx(75.0)
    assert df.loc[0, "hbm_floor_us"] == pytest.approx(600.0) and df.loc[0, "flop_floor_us"] == pytest.approx(200.0)
    assert pd.isna(df.loc[4, "floor_us"]) and pd.isna(df.loc[4, "experts_pct_of_floor"])
    assert df.loc[0, "ceilings_file"].endswith("nvidia-test-gpu/ceilings.json") and df.loc[4, "ceilings_file"] == ""


def test_roofline_table_lists_gpu_rows_only_and_names_its_ceilings(tmp_path):
    write_ceilings(tmp_path)
    text = roofline_table(pd.DataFrame([row(), row(device="cpu", combo_key="c", tokens_per_rank=64)]), tmp_path)
    assert "| 600.0 | memory | 75 % | 60 % |" in text  # floor 600 µs over the 1000 µs layer: its lower bound
    assert text.count("\n| m |") == 1 and "All rows: backend=local" in text  # constant columns: the caption
    assert "ceilings measured on NVIDIA Test GPU" in text and "2.00 TB/s copy" in text and "500 / 1000" in text
    assert "No GPU rows" in roofline_table(pd.DataFrame([row(device="cpu")]), tmp_path)


def test_a_gpu_without_measured_ceilings_gets_empty_floor_columns(tmp_path):
    write_ceilings(tmp_path)  # another GPU's file is never borrowed
    text = roofline_table(pd.DataFrame([row(gpu="NVIDIA H200")]), tmp_path)
    assert f"NVIDIA H200: {NO_CEILING}" in text and "results/ceilings/nvidia-h200/ceilings.json" in text
    assert "| 1000.0 | 800.0 |  |  |  |  | 1.0 |" in text  # floor, bound, % of floor, layer % of floor: empty
    assert NO_CEILING in roofline_table(pd.DataFrame([row(gpu=None)]), tmp_path)


def test_a_cpu_measurement_is_never_a_gpus_ceiling(tmp_path):
    path = write_ceilings(tmp_path, device="cpu")  # even one that names a GPU
    assert find_ceilings(GPU, tmp_path) is None
    with pytest.raises(ValueError, match="not a GPU"):
        read_ceilings(path)
    assert read_ceilings(path, require_gpu=False).device == "cpu"


def test_lookup_matches_the_name_takes_the_newest_and_follows_the_env_var(tmp_path, monkeypatch):
    write_ceilings(tmp_path / "a", copy=1e12, timestamp="2026-12-01T00:00:00+00:00")
    write_ceilings(tmp_path / "a", copy=3e12, timestamp="2026-12-02T00:00:00+00:00", folder="remeasured")
    assert find_ceilings("nvidia  test gpu", tmp_path / "a").copy_bytes_per_s == 3e12  # case and spaces ignored
    assert find_ceilings("NVIDIA Test", tmp_path / "a") is None and find_ceilings(float("nan"), tmp_path) is None
    monkeypatch.setenv(CEILINGS_ENV, str(tmp_path / "a"))
    assert find_ceilings(GPU).copy_bytes_per_s == 3e12


def test_a_malformed_ceilings_file_is_an_error_naming_it(tmp_path):
    path = write_ceilings(tmp_path)
    doc = json.loads(path.read_text())
    doc["ceilings"]["gemm_flops_per_s"].pop("fp8")
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=re.escape(str(path))):
        find_ceilings(GPU, tmp_path)


def test_no_ceiling_constant_is_left_in_the_package():
    """The floors come from measured files only: no figure of the former H200 constants
    (4.0 TB/s, 779 and 1407 TFLOP/s) in moebench's code."""
    pattern = re.compile(r"\b(779|1407)(\.0)?(e12)?\b|\b4(\.0)?e12\b|H200_(COPY|PEAK)")
    hits = [
        f"{p.relative_to(REPO)}:{i}"
        for p in sorted((REPO / "moebench").rglob("*.py"))
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not hits, hits


def test_ceilings_script_writes_its_format_on_the_cpu_and_refuses_the_results_folder(tmp_path, capsys):
    """benchmarks/ceilings.py --cpu: tiny sizes, the JSON the roofline reads, marked device cpu."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import ceilings as script
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    out = tmp_path / "cpu" / "ceilings.json"
    # fp8 on the CPU is slow (~0.8 s a 256^3 product): one sample, no warm-up
    assert script.main(["--cpu", "--out", str(out), "--reps", "1", "--warmup", "0"]) == 0
    doc = json.loads(out.read_text())
    assert doc["schema"] == SCHEMA and doc["device"] == "cpu" and doc["gpu"] == "cpu"
    assert doc["command"] == f"python benchmarks/ceilings.py --cpu --out {out} --reps 1 --warmup 0" and doc["commit"]
    names = {(m["kind"], m["name"]) for m in doc["measurements"]}
    assert {("copy", "copy"), ("gemm", "bf16"), ("gemm", "fp8_tensor"), ("gemm", "fp8_block")} <= names
    for m in doc["measurements"]:  # every figure timed or saying why not
        assert (
            m["status"] == "ok"
            and m["median_us"] > 0
            and m["rate_per_s"] == pytest.approx(m["work"] / (m["median_us"] * 1e-6))
            or m["reason"]
        ), m
    bf16 = [m["rate_per_s"] for m in doc["measurements"] if m["name"] == "bf16"]
    assert doc["ceilings"]["gemm_flops_per_s"]["bf16"] == max(bf16)  # the largest over the sizes
    assert json.loads((out.parent / "env.json").read_text())["gpu"] == "cpu"
    c = read_ceilings(out, require_gpu=False)  # the roofline's reader takes the format ...
    assert c.device == "cpu" and find_ceilings("cpu", tmp_path) is None  # ... and never as a ceiling
    for argv in (["--cpu", "--out", str(REPO / "results" / "ceilings" / "x" / "ceilings.json")], ["--cpu"]):
        with pytest.raises(SystemExit) as e:
            script.main(argv)
        assert e.value.code == 2
    assert "never a GPU's ceiling" in capsys.readouterr().err

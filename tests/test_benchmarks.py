"""The DeepEP comparison scripts' parsing and tables, on the committed logs and rows of
the 2 x H200 runs in results/deepep_vs_own_benchmarks/{ht,ll} (docs/findings/deepep-pplx.md): the
GPU-only parts (running DeepEP's tests and moebench) are the same calls the GPU runs made."""
from __future__ import annotations

import glob
import json
import sys
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import deepep_ht_profiler as ht  # noqa: E402
import deepep_ll_profiler as ll  # noqa: E402
from _deepep_compare import kernel_sums  # noqa: E402

HT_RUN = REPO / "results" / "deepep_vs_own_benchmarks" / "ht"
LL_RUN = REPO / "results" / "deepep_vs_own_benchmarks" / "ll"


def test_intranode_log_parses_to_the_recommended_and_best_configs():
    res = ht.parse_intranode((HT_RUN / "deepep_test_intranode.log").read_text())
    # docs/findings/deepep-pplx.md: 259.3 (fp8), 352.8 (bf16), combine 425.1 (best 403.6 at chunk 8)
    assert res["dispatch_fp8"]["default"] == pytest.approx(259.32)
    assert res["dispatch_bf16"]["default"] == pytest.approx(352.80)
    assert res["combine"] == {"default": pytest.approx(425.09), "best": pytest.approx(403.58), "best_chunk": 8}
    assert res["dispatch_fp8"]["best_chunk"] == 24


def test_intranode_comparison_table_from_the_stored_rows():
    deepep = ht.parse_intranode((HT_RUN / "deepep_test_intranode.log").read_text())
    df = pd.concat(pd.read_parquet(f) for f in glob.glob(str(HT_RUN / "rows" / "*.parquet")))
    kernels = {"dispatch": "intranode::dispatch<", "combine": "intranode::combine<"}
    rows = [{"quant": r["quant"], "overlap": r["overlap"], "status": r["status"], "dispatch_us": r["dispatch_us"],
             "combine_us": r["combine_us"], "kernels": [kernel_sums(json.loads(t), kernels) for t in r["kernel_us"]]}
            for _, r in df.iterrows()]
    bf16 = next(r for r in rows if r["quant"] == "bf16")
    # the same table: moebench's bf16 dispatch kernel 345.8 / 350.2 µs; notify kernels not counted
    assert [round(k["dispatch"], 1) for k in bf16["kernels"]] == [345.8, 350.2]
    table = ht.compare(deepep, rows, 2)
    line = next(x for x in table.splitlines() if x.startswith("| dispatch bf16 |"))
    assert "352.8" in line and "345.8 / 350.2" in line and "0.98 / 0.99" in line


def test_low_latency_log_parses_as_the_committed_comparison():
    log = (LL_RUN / "deepep_test_low_latency.log").read_text()
    stored = json.loads((LL_RUN / "comparison.json").read_text())
    res = ll.parse_low_latency(log)
    assert {str(k): v for k, v in res.items()} == stored["deepep"]
    table = ll.compare(res, stored["moebench"], 2)
    assert "DeepEP low-latency kernels, 2 ranks" in table and table.count("\n| ") >= 4


def _echo_rank(rank, port, tag, q):
    q.put((rank, tag, port > 0))


def _crash_rank(rank, port, q):
    if rank == 1:
        raise SystemExit(3)
    q.put(rank)


def test_run_ranks_collects_one_result_per_rank_and_kills_on_a_crash():
    import time

    from moebench.launch import run_ranks

    assert sorted(run_ranks(_echo_rank, 2, ("x",), 60)) == [(0, "x", True), (1, "x", True)]
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"exited with \[3\]"):
        run_ranks(_crash_rank, 2, (), 60)
    assert time.monotonic() - t0 < 30  # the crash ends the wait, not the timeout


def test_contiguous_gemm_benchmark_runs_through_the_interpreter(tmp_path):
    """benchmarks/triton_fp8_contiguous.py end to end on a tiny shape (CPU, Triton's
    interpreter, no DeepGEMM): every tile variant of both quants ran and matches torch."""
    import triton_fp8_contiguous as bench

    for quant in ("fp8_block", "bf16"):
        out = bench.main(["--device", "cpu", "--models", "tiny", "--tokens", "16", "--configs", "2",
                          "--quant", quant, "--json", str(tmp_path / f"{quant}.json")])
        rows = json.loads((tmp_path / f"{quant}.json").read_text())
        assert rows == json.loads(json.dumps(out))
        # 2 GEMMs x 2 configs x (persistent, one program per tile)
        assert len(rows) == 8 and {r["gemm"] for r in rows} == {"gate_up", "down"}
        assert all(r["quant"] == quant and r["rel_err"] < 2e-2 for r in rows), rows

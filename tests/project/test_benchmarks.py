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
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import deepep_ht_profiler as ht  # noqa: E402 (after sys.path takes benchmarks/)
import deepep_ll_profiler as ll  # noqa: E402 (after sys.path takes benchmarks/)
from _deepep_compare import kernel_sums  # noqa: E402 (after sys.path takes benchmarks/)

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
    rows = [
        {
            "quant": r["quant"],
            "overlap": r["overlap"],
            "status": r["status"],
            "dispatch_us": r["dispatch_us"],
            "combine_us": r["combine_us"],
            "kernels": [kernel_sums(json.loads(t), kernels) for t in r["kernel_us"]],
        }
        for _, r in df.iterrows()
    ]
    bf16 = next(r for r in rows if r["quant"] == "bf16")
    # the same table: moebench's bf16 dispatch kernel 345.8 / 350.2 µs; notify kernels not counted
    assert [round(k["dispatch"], 1) for k in bf16["kernels"]] == [345.8, 350.2]
    table = ht.compare(deepep, rows, 2)
    line = next(x for x in table.splitlines() if x.startswith("| dispatch bf16 |"))
    assert "352.8" in line and "345.8 / 350.2" in line and "0.98 / 0.99" in line


def test_low_latency_log_parses_to_its_figures_and_table():
    log = (LL_RUN / "deepep_test_low_latency.log").read_text()
    res = ll.parse_low_latency(log)
    # read off the log by hand: "[rank r] Dispatch bandwidth: ... avg_t=28.51 us | Combine ... avg_t=39.95 us",
    # the hook pair as send + recv ("19.57 + 8.18 us"); the "Dispatch + combine" line is neither
    assert res == {
        0: {
            "dispatch": 28.51,
            "combine": 39.95,
            "dispatch_hook": pytest.approx(19.57 + 8.18),
            "combine_hook": pytest.approx(31.18 + 9.56),
        },
        1: {
            "dispatch": 27.71,
            "combine": 40.42,
            "dispatch_hook": pytest.approx(19.12 + 8.45),
            "combine_hook": pytest.approx(33.90 + 9.61),
        },
    }
    rows = json.loads((LL_RUN / "comparison.json").read_text())["moebench"]  # moebench's side, as stored
    table = ll.compare(res, rows, 2).splitlines()
    assert table[0].startswith("DeepEP low-latency kernels, 2 ranks, 128 tokens per rank, hidden 7168")
    line = next(x for x in table if x.startswith("| dispatch fp8 (send + receive, one kernel) |"))
    # DeepEP 28.51 / 27.71 µs; the fp8_block overlap=none row's kernels 118.21 / 27.06 µs; 118.21 / 28.51 = 4.15
    assert line == (
        "| dispatch fp8 (send + receive, one kernel) | 28.5 / 27.7 | 118.2 / 27.1 "
        "(quant=fp8_block, overlap=none) | 4.15 / 0.98 |"
    )
    line = next(x for x in table if x.startswith("| combine bf16, hook: send + receive |"))
    assert "| 40.7 / 43.5 |" in line and line.endswith("| 1.10 / 1.00 |")


def _echo_rank(rank, port, tag, q):
    q.put((rank, tag, port > 0))


def _crash_rank(rank, port, q):
    if rank == 1:
        raise SystemExit(3)
    q.put(rank)


@pytest.mark.multiprocess
def test_run_ranks_collects_one_result_per_rank_and_kills_on_a_crash():
    import time

    from moebench.run.launch import run_ranks

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
        out = bench.main(
            [
                "--device",
                "cpu",
                "--models",
                "tiny",
                "--tokens",
                "16",
                "--configs",
                "2",
                "--quant",
                quant,
                "--json",
                str(tmp_path / f"{quant}.json"),
            ]
        )
        rows = json.loads((tmp_path / f"{quant}.json").read_text())
        assert len(out) == len(rows)
        # 2 GEMMs x the first 2 tiles of the benchmark's list x (persistent, one program per tile)
        tiles = {
            "fp8_block": ["128x128x128 g8 w8 s4", "128x128x128 g8 w4 s4"],
            "bf16": ["128x128x64 g8 w8 s4", "128x256x64 g8 w8 s3"],
        }[quant]
        assert sorted((r["gemm"], r["kernel"]) for r in rows) == sorted(
            (g, f"{t} {p}") for g in ("gate_up", "down") for t in tiles for p in ("persist", "grid")
        )
        assert all(
            r["model"] == "tiny" and r["tokens"] == 16 and r["quant"] == quant and r["vs_deepgemm"] is None
            for r in rows
        ), rows
        assert all(r["rel_err"] < 2e-2 and r["us"] > 0 for r in rows), rows
        # tflops = 2 * pairs * N * K / us: tiny (hidden 256, intermediate 128) gives gate_up N 256 (2 x 128),
        # K 256 and down N 256, K 128; both count the same local (token, expert) pairs, at most 16 x top-2
        pairs = {
            round(r["tflops"] * r["us"] * 1e6 / (2 * 256 * (256 if r["gemm"] == "gate_up" else 128)), 6) for r in rows
        }
        assert len(pairs) == 1 and next(iter(pairs)).is_integer() and 1 <= next(iter(pairs)) <= 32, pairs


def test_host_enqueue_script_refuses_bad_input_and_writes_its_table():
    import host_enqueue as he

    assert he.main(["--cases", "nope"]) == 2
    assert he.main(["--profile", "nope"]) == 2
    rows = [
        {
            "case": "qwen3_bf16_triton_32",
            "tokens": 32,
            "kernels": 9,
            "copies": 1,
            "host_us": 280.0,
            "gpu_us": 282.5,
            "gpu_timing": "graph",
            "host_over_gpu": 0.99,
        },
        {
            "case": "dsv3_ep8_bf16_triton_4096",
            "tokens": 4096,
            "kernels": 12,
            "copies": 0,
            "host_us": 410.0,
            "gpu_us": 1951.0,
            "gpu_timing": "graph",
            "host_over_gpu": 0.21,
        },
        {"case": "qwen3_fp8_deepgemm_1024", "tokens": 1024, "skipped": "deep_gemm not installed"},
    ]
    text = he.table(rows).splitlines()
    assert text[2] == "| qwen3_bf16_triton_32 | 32 | 9 (+1 copies) | 280 | 282.5 (graph) | 0.99 | 498, 282, 14 |"
    assert "| 410 ✗ |" in text[3]  # a triton path over the issue's 300 µs
    assert "skipped: deep_gemm not installed" in text[4]
    assert set(he.ISSUE_34) == set(he.GROUPS["issue34"])
    assert set(he.CASES) == set(he.ISSUE_34) | set(he.GROUPS["gluon_pairs"])


def test_host_enqueue_gluon_pairs(capsys):
    """issue #46's pairs: qwen3 and DeepSeek-V3's EP-8 share, fp8_block on the contiguous rows at 4096
    and 16384 tokens, auto against triton, knobs that compose; the probes taken in alternating rounds;
    the ratio auto / triton in the rows and a verdict table; the cases reach --breakdown (on the CPU:
    past the name check, to the GPU check)."""
    import host_enqueue as he

    from moebench.config import compose

    assert len(he.GLUON_PAIRS) == 4 and len(he.GROUPS["gluon_pairs"]) == 8
    for auto, triton in he.GLUON_PAIRS.items():
        (a, ta), (t, tt) = he.CASES[auto], he.CASES[triton]
        assert ta == tt in (4096, 16384)
        assert "experts.contiguous_gemm=auto" in a and "experts.contiguous_gemm=triton" in t
        assert [o for o in a if "contiguous_gemm" not in o] == [o for o in t if "contiguous_gemm" not in o]
        assert {"quant=fp8_block", "experts=triton", "experts.row_layout=contiguous"} <= set(a)
        combo = compose.to_combo(compose.compose_config(a))
        assert combo.experts == "triton" and combo.quant == "fp8_block"
    dsv3 = [n for n in he.GLUON_PAIRS if {"model=deepseek_v3", "backend.simulate_ep=8"} <= set(he.CASES[n][0])]
    assert len(dsv3) == 2
    seen = []
    probes = he.probe_rounds(["a", "b", "c"], 3, lambda n: seen.append(n) or float(len(seen)))
    assert seen == ["a", "b", "c", "c", "b", "a", "a", "b", "c"] and probes["a"] == [1.0, 6.0, 7.0]
    auto, triton = next(iter(he.GLUON_PAIRS.items()))
    rows = [
        {
            "case": auto,
            "tokens": 4096,
            "label": "L",
            "host_us": 650.0,
            "host_us_probes": [600.0, 650.0, 700.0],
            "host_rounds": "interleaved",
            "last_gemm": "gluon/gluon",
        },
        {
            "case": triton,
            "tokens": 4096,
            "label": "L",
            "host_us": 500.0,
            "host_us_probes": [500.0, 500.0, 500.0],
            "host_rounds": "interleaved",
            "last_gemm": "triton/triton",
        },
    ]
    rows = he.add_pair_ratios(rows)
    assert rows[0]["pair_case"] == triton and rows[0]["host_ratio"] == pytest.approx(1.3)
    assert rows[0]["host_ratio_p20"] == pytest.approx(1.24) and "host_ratio" not in rows[1]
    text = he.pair_table(rows)
    assert "| L | 4096 | 650 (gluon/gluon) | 500 (triton/triton) | 1.30 (1.24–1.36) | ok |" in text
    assert he.pair_table(rows[1:]) == "" and not he._bound(auto) and he._bound("qwen3_bf16_triton_32")
    capsys.readouterr()
    assert he.main(["--breakdown", "dsv3_ep8_fp8_contiguous_auto_4096"]) == 2
    assert he.main(["--cases", "gluon_pairs"]) == 2
    err = capsys.readouterr().err
    assert "unknown case" not in err and err.count("needs a CUDA GPU") == 2


def test_clock_recovery_script_refuses_bad_gaps():
    import clock_recovery

    assert clock_recovery.main(["--gaps", "1,x"]) == 2


def test_host_python_script_times_every_piece_with_launches_stubbed(tmp_path):
    """benchmarks/host_python.py on the CPU (its own process: it stubs Triton's JIT launch
    and needs the kernels as JITFunctions, not the interpreter's): every piece ran with the
    launches its code makes, and its figures are written with the environment."""
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    out = tmp_path / "rows.json"
    cmd = [
        sys.executable,
        str(REPO / "benchmarks" / "host_python.py"),
        "--number",
        "3",
        "--repeats",
        "3",
        "--json",
        str(out),
    ]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    data = json.loads(out.read_text())
    launches = {r["piece"]: r["launches"] for r in data["rows"]}
    # one launch a wrapper; the bf16 experts: align, gate/up GEMM, SiLU-and-mul, down GEMM; fp8_block adds
    # the input's quantization; the layer (every expert local, reduction=experts) launches the experts' four
    assert launches == {
        "launch_gemm": 1,
        "launch_align": 1,
        "invoke_fused_moe_gemm": 1,
        "per_token_group_quant_fp8": 1,
        "moe_align_block_size": 1,
        "silu_and_mul_rows": 1,
        "moe_kernel_bf16": 4,
        "fused_moe_standard_bf16": 4,
        "fused_moe_standard_fp8_block": 5,
    }
    for r in data["rows"]:
        assert len(r["samples"]) == 3 and r["p20"] <= r["us"] <= r["p80"] and r["us"] > 0, r
    # every launch after a piece's first takes launch.py's compiled handle: the arguments match the
    # kernel's signature (a stale argument list would go through the JIT every time)
    handle = {r["piece"]: r["handle_launches"] for r in data["rows"]}
    assert handle == launches, (handle, launches)
    assert set(data["env"]) >= {"python", "torch", "triton"}
    assert "| launch_gemm | 1 |" in res.stdout


def test_host_python_script_refuses_bad_counts():
    import host_python

    assert host_python.main(["--number", "0"]) == 2


def test_hold_bias_script_refuses_bad_arguments_and_a_machine_without_a_gpu():
    import hold_bias

    assert hold_bias.main(["--modes", "held,nope"]) == 2
    assert hold_bias.main(["--n", "100"]) == 2
    assert hold_bias.main(["--pairs", "1"]) == 2
    import torch

    if not torch.cuda.is_available():  # CI: it compares two GPU timers, so it must refuse, not run
        assert hold_bias.main([]) == 2


def test_gluon_options_benchmark_refuses_a_machine_without_an_sm90_gpu(capsys):
    """benchmarks/gluon_options.py times Gluon kernels, which have no interpreter: without an SM90
    GPU it says so in one line and exits 2 before building anything (a shell loop must not read a
    pass); its kernel table pairs every option with a default it must equal bit for bit."""
    import gluon_options as bench

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the refusal is the CPU machine's path")
    assert bench.main(["--tokens", "16"]) == 2
    assert "needs an SM90 GPU" in capsys.readouterr().err
    defaults = {name for name, (default, _) in bench.KERNELS.items() if default is None}
    assert defaults == {"gluon 128x128", "gluon 128x192"}
    assert all(d in defaults for d, _ in bench.KERNELS.values() if d is not None)


def test_gluon_options_kernels_picks_options_with_their_defaults(capsys):
    """--kernels NAME ...: only those Gluon kernels, each with the default its output must equal (one
    option under Nsight Compute: the fewest launches); an unknown name is refused (exit 2, argparse's
    line naming the choices) before any GPU check."""
    import gluon_options as bench

    assert list(bench.chosen(["gluon 128x192 scale-tma"])) == ["gluon 128x192", "gluon 128x192 scale-tma"]
    assert list(bench.chosen(["gluon 128x128"])) == ["gluon 128x128"]
    assert bench.chosen(None) == bench.KERNELS
    with pytest.raises(SystemExit) as e:
        bench.main(["--kernels", "gluon 128x192 direct-read"])
    assert e.value.code == 2 and "invalid choice: 'gluon 128x192 direct-read'" in capsys.readouterr().err


def test_contiguous_gemm_benchmark_refuses_a_variant_it_does_not_have():
    """A wrong --variant must not run nothing and exit 0 (a shell loop would read a pass)."""
    import triton_fp8_contiguous as bench

    for argv in (
        ["--variants", "--variant", str(len(bench.VARIANTS["fp8_block"]))],
        ["--variants", "--variant", "-1"],
        ["--variant", "0"],
        ["--gluon"],
        ["--gluon", "--quant", "bf16"],  # (Gluon: no interpreter)
        ["--device", "cuda", "--gluon", "--variant", str(len(bench.GLUON_VARIANTS))],
    ):
        with pytest.raises(SystemExit) as e:
            bench.main(["--device", "cpu", "--models", "tiny", *argv])
        assert e.value.code == 2, argv


def test_contiguous_gemm_benchmark_check_mode_fails_a_wrong_kernel(monkeypatch, capsys):
    """--check TOL (the GPU suite's Gluon test runs the script so, in a process of its own): each
    kernel once against the fp32 torch product, a row marked failed past TOL, which the script's
    exit code reports; a kernel that writes a wrong product is caught."""
    import triton_fp8_contiguous as bench

    argv = ["--device", "cpu", "--models", "tiny", "--tokens", "16", "--configs", "1", "--check", "2e-2"]
    rows = bench.main(argv)
    assert len(rows) == 4 and not any(r.get("failed") for r in rows), rows  # 2 GEMMs x (persistent, grid)
    right = bench.contiguous_gemm

    def wrong(a, a_s, w, s, c, *args, **kw):
        right(a, a_s, w, s, c, *args, **kw)
        c.mul_(1.1)  # 10 % off

    monkeypatch.setattr(bench, "contiguous_gemm", wrong)
    rows = bench.main(argv)
    assert rows and all(r.get("failed") for r in rows), rows
    assert "FAILED" in capsys.readouterr().out

    def broken(*args, **kw):  # a kernel that does not compile or faults: it fails, not vanishes
        raise RuntimeError("no kernel")

    monkeypatch.setattr(bench, "contiguous_gemm", broken)
    rows = bench.main(argv)
    assert len(rows) == 4 and all(r.get("failed") and "no kernel" in r["error"] for r in rows), rows

    def partial(a, a_s, w, s, c, m_indices, *args, **kw):  # leaves one valid row unwritten (NaN)
        right(a, a_s, w, s, c, m_indices, *args, **kw)
        c[int((m_indices >= 0).nonzero()[0])] = float("nan")

    monkeypatch.setattr(bench, "contiguous_gemm", partial)
    rows = bench.main(argv)
    assert any(r.get("failed") for r in rows), rows


SCRIPTS = sorted(p.relative_to(REPO) for folder in ("benchmarks", "scripts") for p in (REPO / folder).glob("[!_]*.py"))


def _one_line_refusal(err: str, script: str) -> str:
    """The error of `err`, which must be one line naming the script as it is run and its help."""
    prog = f"python {script}"
    assert err.count("\n") == 1 and "usage:" not in err, err
    assert err.startswith(f"{prog}: error: ") and err.endswith(f" (see {prog} --help)\n"), err
    return err[len(f"{prog}: error: ") : -len(f" (see {prog} --help)\n")]


@pytest.mark.parametrize("script", SCRIPTS, ids=str)
def test_every_scripts_command_line_refusal_is_one_line_naming_it(script, monkeypatch, capsys):
    """benchmarks/*.py and scripts/*.py given an unknown option: one line and exit 2, as moebench's
    commands (moebench/util/arg_errors.py); argparse printed the script's whole usage block first. A
    main takes its arguments or reads sys.argv; the DeepEP comparisons' main is _deepep_compare's."""
    import importlib
    import inspect

    monkeypatch.syspath_prepend(str(REPO / script.parent))
    monkeypatch.setattr(sys, "argv", [str(script), "--no-such-option"])
    module = importlib.import_module(script.stem)
    with pytest.raises(SystemExit) as done:
        if module.main.__module__ != script.stem:  # deepep_{ht,ll}_profiler: (doc, name, log, three steps)
            module.main(module.__doc__, script.stem, "x.log", None, None, None)
        elif inspect.signature(module.main).parameters:
            module.main(["--no-such-option"])
        else:
            module.main()
    assert done.value.code == 2
    line = _one_line_refusal(capsys.readouterr().err, str(script))
    assert "--no-such-option" in line or "the following arguments are required" in line, line


def test_a_scripts_own_refusal_is_the_same_one_line(capsys):
    """A script's own `error(...)` after parsing (a flag that needs another) takes the same form."""
    import triton_fp8_contiguous as bench

    with pytest.raises(SystemExit) as done:
        bench.main(["--device", "cpu", "--models", "tiny", "--variant", "0"])
    assert done.value.code == 2
    line = _one_line_refusal(capsys.readouterr().err, "benchmarks/triton_fp8_contiguous.py")
    assert line.startswith("--variant needs --variants"), line


def test_a_script_run_as_a_file_refuses_in_one_line_with_this_checkouts_moebench(tmp_path):
    """`python benchmarks/list_time.py --nope` from another folder and without PYTHONPATH: it finds this
    checkout's moebench (arg_errors), names itself as run, exit 2."""
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    cmd = [sys.executable, str(REPO / "benchmarks" / "list_time.py"), "--nope"]
    res = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and res.stdout == "", res
    assert _one_line_refusal(res.stderr, "benchmarks/list_time.py") == "unrecognized arguments: --nope"

"""moebench.traces: phase recorder, torch / nsys trace parsing, overlap metrics, `moebench trace`.

CPU only. Fixtures under tests/fixtures/traces/ come from make_fixtures.py there
(the synthetic scenario and its exact figures are described in its docstring).
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import shutil
import sqlite3
import time
from pathlib import Path

import pytest
import torch

from moebench.report.trace_markdown import OVERLAP_HEADER, to_markdown
from moebench.report.trace_report import find_traces, trace_command
from moebench.traces import nsys as nsys_mod
from moebench.traces.files import summarize_file
from moebench.traces.metrics import (
    METHOD_INTERSECTION,
    METHOD_STRETCH,
    PLAIN_NOTE,
    intersect,
    length,
    stretch_aware,
    summarize,
    union,
)
from moebench.traces.model import ABLATION_PREFIXES, is_comm_kernel
from moebench.traces.nsys import (
    NSYS_MISSING,
    nsys_available,
    nsys_capture_stem,
    nsys_command,
    nsys_processes,
    nsys_rank_prefix,
    parse_nsys_sqlite,
)
from moebench.traces.nvtx import combo_range, make_phase_recorder, sample_range
from moebench.traces.torch_trace import capture, parse_torch_trace, trace_path

FIX = Path(__file__).parents[1] / "fixtures" / "traces"
CHROME = FIX / "synthetic_cuda.json"
NSYS = FIX / "synthetic_nsys.sqlite"
CPU_TRACE = FIX / "cpu_phases.json.gz"
GPU_TRACE = FIX / "h200_nccl_rank0_T1024.json.gz"  # capture_gpu_trace.py on 2 x H200, torch 2.11
ABLATION = FIX / "synthetic_ablation.json"  # the stretch scenario (make_fixtures.py)
ABLATION_NSYS = FIX / "synthetic_ablation_nsys.sqlite"
# real traces of the old format, no ablation samples (the allgather_rs ones, at 2be9ad1, have them)
H200 = sorted(p for p in FIX.glob("h200_*.json.gz") if "allgather_rs" not in p.name)
H200_ABLATION = sorted(FIX.glob("h200_allgather_rs_*.json.gz"))


def _fixtures_module():
    spec = importlib.util.spec_from_file_location("make_fixtures", FIX / "make_fixtures.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _md_row(md: str, label: str) -> str:
    """The value column of the overlap table's row that starts with `label`."""
    for line in md.splitlines():
        if line.startswith(f"| {label}"):
            return line.rsplit("|", 2)[1].strip()
    raise AssertionError(f"no row {label!r} in\n{md}")


# exact figures of the synthetic scenario (µs per sample)
CPU_US = {
    "prepare": 10,
    "dispatch": 10,
    "shared_experts": 20,
    "experts": 20,
    "finalize": 40,
    "weight_reduce": 8,
    "combine": 20,
}
GPU_US = {
    "prepare": 10,
    "dispatch": 70,
    "shared_experts": 100,
    "experts": 100,
    "finalize": 55,
    "weight_reduce": 10,
    "combine": 40,
}


# -- recorder -----------------------------------------------------------------
def test_recorder_all_off_is_null_phases():
    from moebench.kernels.interfaces import NULL_PHASES

    assert make_phase_recorder(False, False, False, "cpu") is NULL_PHASES


def test_recorder_cpu_timing_and_nvtx_without_profiler():
    rec = make_phase_recorder(nvtx=True, record_function=True, cuda_events=True, device="cpu")
    with combo_range("k"), sample_range(0):
        with rec("experts"):
            time.sleep(0.002)
        with rec("experts"):
            time.sleep(0.001)
        with rec("finalize"), rec("combine"):
            pass
    d = rec.durations_us()
    assert set(d) == {"experts", "finalize", "combine"}
    assert 2900 <= d["experts"] < 50_000
    assert d["finalize"] >= d["combine"] >= 0
    assert rec.counts()["experts"] == 2
    rec.reset()
    assert rec.durations_us() == {}


def test_trace_path_layout(tmp_path):
    assert trace_path(tmp_path, "a-b", 1, 128) == tmp_path / "a-b" / "rank1_T128.json"
    assert trace_path("t", "k", 0, 8, gzip_=True).name == "rank0_T8.json.gz"


# -- (a) a real CPU torch-profiler trace ----------------------------------------
def test_real_cpu_trace_phase_durations_and_nesting(tmp_path):
    rec = make_phase_recorder(nvtx=False, record_function=True, cuda_events=True, device="cpu")
    x, w = torch.randn(128, 384), torch.randn(384, 384)
    measured = []

    def forward():
        measured.clear()
        with combo_range("local-torch"):
            for i in range(3):
                rec.reset()
                with sample_range(i):
                    with rec("prepare"):
                        y = x * 2.0
                    with rec("experts"):
                        for _ in range(6):
                            y = torch.tanh(y @ w)
                    with rec("finalize"):
                        with rec("weight_reduce"):
                            y = y * 0.5
                        with rec("combine"):
                            y = y + 1.0
                    with rec("shared_experts"):
                        for _ in range(4):
                            y = y + x @ w
                measured.append(rec.durations_us())

    path = capture(forward, trace_path(tmp_path, "local-torch", 0, 128, gzip_=True), warmup=1, mark_samples=False)
    with gzip.open(path, "rt") as f:
        assert "traceEvents" in json.load(f)
    trace = parse_torch_trace(path)
    s = summarize(trace)
    assert s.num_samples == 3 and s.combos == ["local-torch"]
    assert not trace.kernels and s.trace_overlap_fraction is None
    sample_us = {int(r.name.split("/")[1]): r.end_us - r.start_us for r in trace.ranges if r.name.startswith("sample/")}
    for i, (fig, meas) in enumerate(zip(s.per_sample, measured, strict=True)):
        for name, us in meas.items():
            got = fig["phases"][name]["cpu_us"]
            # the record_function range encloses the perf_counter window: never shorter; and it
            # lies inside its sample's range (a bound that holds on a loaded machine too, where a
            # descheduling can stretch one range by milliseconds: no ratio of durations is asserted)
            assert us - 5 <= got <= sample_us[i], (name, got, us, sample_us[i])
    for name in measured[0]:
        # the median over the samples is one of the per-sample figures checked above
        assert s.phases[name].cpu_us in [f["phases"][name]["cpu_us"] for f in s.per_sample], name
    # nesting: combine and weight_reduce inside finalize, every phase inside its sample, samples in the combo
    by = {}
    for r in trace.ranges:
        by.setdefault(r.name, []).append(r)
    for inner in by["combine"] + by["weight_reduce"]:
        assert any(f.start_us <= inner.start_us and inner.end_us <= f.end_us for f in by["finalize"])
    combo = by["combo/local-torch"][0]
    for i in range(3):
        smp = by[f"sample/{i}"][0]
        assert combo.start_us <= smp.start_us and smp.end_us <= combo.end_us
    for name in ("prepare", "experts", "finalize", "shared_experts"):
        assert len(by[name]) == 3


def test_capture_marks_samples_and_combo_and_worker_helpers(tmp_path):
    """The worker's call: capture(fn, path, samples=, combo_key=, barrier=) then overlap_from_trace."""
    from moebench.traces.analyze import overlap_from_trace, trace_row

    rec = make_phase_recorder(nvtx=True, record_function=True, cuda_events=True, device="cpu")
    x = torch.randn(64, 64)
    calls = []

    def fn():
        with rec("experts"):
            x @ x
        with rec("shared_experts"):
            x + 1

    path = capture(
        fn, trace_path(tmp_path, "k", 0, 64), warmup=2, samples=3, combo_key="k", barrier=lambda: calls.append(1)
    )
    assert len(calls) == 3
    s = summarize(parse_torch_trace(path))
    assert s.num_samples == 3 and s.combos == ["k"] and s.phases["experts"].num_ranges == 1
    assert overlap_from_trace(path) is None  # no GPU kernels on CPU
    row = trace_row(path)
    assert row["trace_experts_cpu_us"] > 0 and row["trace_shared_us"] is None
    assert overlap_from_trace(CHROME) == pytest.approx(0.6)


def test_committed_cpu_trace_parses():
    s = summarize_file(CPU_TRACE)[0]
    assert s.num_samples == 3
    assert {"prepare", "experts", "finalize", "combine", "shared_experts"} <= set(s.phases)
    assert s.phases["finalize"].cpu_us >= s.phases["combine"].cpu_us > 0


# -- (b) synthetic Chrome trace with GPU kernels on two streams -----------------
def _check_scenario(s):
    assert s.num_samples == 2
    for name in CPU_US:
        assert s.phases[name].cpu_us == pytest.approx(CPU_US[name], abs=1e-6), name
        assert s.phases[name].gpu_us == pytest.approx(GPU_US[name], abs=1e-6), name
    assert s.shared_us == pytest.approx(100)
    assert s.comm_us == pytest.approx(110)
    assert s.overlap_us == pytest.approx(60)
    assert s.window_us == pytest.approx(150)
    assert s.layer_us == pytest.approx(305 - 20)  # quant kernel starts at 20, the copy-out ends at 305
    # no ablation samples: the plain intersection figure, and the summary says so
    assert s.method == METHOD_INTERSECTION and PLAIN_NOTE in s.notes
    assert s.trace_overlap_fraction == pytest.approx(0.6, abs=1e-9) == s.intersection_fraction
    assert s.shared_exposed_us == pytest.approx(40)
    assert s.shared_alone_us is None and s.comm_alone_us is None and s.comm_stretch is None
    streams = {st.lane: st for st in s.streams}
    assert set(streams) == {"dev0/s7", "dev0/s20"}
    assert streams["dev0/s7"].busy_us == pytest.approx(225)
    assert streams["dev0/s7"].shared_us == pytest.approx(100) and streams["dev0/s7"].comm_us == 0
    assert streams["dev0/s20"].busy_us == pytest.approx(110) and streams["dev0/s20"].comm_us == pytest.approx(110)
    assert streams["dev0/s20"].phases == pytest.approx({"dispatch": 70, "combine": 40})
    assert any("outside every sample" in n for n in s.notes)  # the warm-up kernel
    row = s.as_row()
    assert row["trace_overlap_fraction"] == pytest.approx(0.6) and row["trace_combine_gpu_us"] == pytest.approx(40)


def test_synthetic_chrome_trace():
    trace = parse_torch_trace(CHROME)
    by_name = {k.name.split("(")[0].strip(): k for k in trace.kernels if k.sample == 0}
    assert by_name["fused_moe_kernel"].phase == "experts"  # cuLaunchKernelEx (cuda_driver); user range ignored
    assert by_name["void weight_reduce_kernel<bf16, 8>"].phases == ("finalize", "weight_reduce")  # via ac2g flow
    assert by_name["Memcpy DtoD"].phase == "finalize" and by_name["Memcpy DtoD"].kind == "memcpy"
    assert by_name["ncclDevKernel_AllGather_RING_LL"].comm and not by_name["ncclDevKernel_AllGather_RING_LL"].shared
    assert [k.combo for k in trace.kernels] == ["deepep_ht-triton-finalize-combine-bf16"] * len(trace.kernels)
    assert trace.gpu_ranges and trace.gpu_ranges[0][3] == "dev0/s7"
    s = summarize(trace)
    _check_scenario(s)
    md = to_markdown(s)
    assert OVERLAP_HEADER in md and f"note: {PLAIN_NOTE}" in md
    assert _md_row(md, "**trace_overlap_fraction** (plain intersection)") == "0.600"
    assert _md_row(md, "intersection_fraction") == "0.600"
    assert _md_row(md, "shared experts alone") == "–" and _md_row(md, "exposed (shared in layer") == "40.0"


def test_real_h200_trace_with_nccl():
    """A real torch 2.11 CUDA trace: NCCL all-gather on its own stream beside the shared expert."""
    trace = parse_torch_trace(GPU_TRACE)
    assert all(k.launch_us is not None for k in trace.kernels)
    s = summarize(trace)
    assert s.num_samples == 4 and not [n for n in s.notes if "launch" in n]
    for i in range(4):
        ks = [k for k in trace.kernels if k.sample == i]
        nccl = {k.name.split("(")[0]: k for k in ks if k.comm}
        assert nccl["ncclDevKernel_AllGather_RING_LL"].phases == ("dispatch",)
        assert nccl["ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL"].phases == ("finalize", "combine")
        assert nccl["ncclDevKernel_AllGather_RING_LL"].lane != nccl["ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL"].lane
        shared = [k for k in ks if k.shared]
        assert len(shared) == 4 and {k.lane for k in shared} == {"dev0/s7"}
        # our shared-expert span equals torch's own GPU-side projection of the range
        ((a, b),) = [
            (a, b) for n, a, b, _ in trace.gpu_ranges if n == "shared_experts" and a <= shared[0].start_us <= b
        ]
        assert max(k.end_us for k in shared) - min(k.start_us for k in shared) == pytest.approx(b - a, abs=0.01)
    assert s.trace_overlap_fraction == pytest.approx(0.5697, abs=1e-3)
    assert 0 < s.shared_exposed_us < s.shared_us  # medians of per-sample figures
    assert set(s.phases) == set(CPU_US)


# -- (c) the same scenario as an nsys SQLite export -------------------------------
def test_synthetic_nsys_sqlite_same_figures():
    assert nsys_processes(NSYS) == [4242]
    trace = parse_nsys_sqlite(NSYS)
    assert trace.fmt == "nsys"
    # the default-domain decoy `experts` range is ignored; registered strings resolved
    assert sum(r.name == "experts" for r in trace.ranges) == 2
    assert {"sample/0", "sample/1"} <= {r.name for r in trace.ranges}
    assert any(k.name == "Memcpy DtoD" for k in trace.kernels)
    _check_scenario(summarize(trace))


def test_nsys_two_ranks_in_one_report_split_by_process(tmp_path):
    """Ranks launched under one nsys share a report; correlation ids repeat across processes."""
    db_path = tmp_path / "two.sqlite"
    shutil.copy(NSYS, db_path)
    shift = (4343 - 4242) << 24
    with sqlite3.connect(db_path) as db:
        for table, col in (
            ("NVTX_EVENTS", "globalTid"),
            ("CUPTI_ACTIVITY_KIND_RUNTIME", "globalTid"),
            ("CUPTI_ACTIVITY_KIND_KERNEL", "globalPid"),
            ("CUPTI_ACTIVITY_KIND_MEMCPY", "globalPid"),
        ):
            cols = [r[1] for r in db.execute(f"PRAGMA table_info({table})")]
            sel = ", ".join(f"{c} + {shift}" if c == col else c for c in cols)
            db.execute(f"INSERT INTO {table} ({', '.join(cols)}) SELECT {sel} FROM {table}")
    assert nsys_processes(db_path) == [4242, 4343]
    summaries = summarize_file(db_path)
    assert [s.source.rsplit("#", 1)[1] for s in summaries] == ["pid4242", "pid4343"]
    for s in summaries:
        _check_scenario(s)


def test_nsys_command_and_absence(monkeypatch):
    assert nsys_available() == (shutil.which("nsys") is not None)
    monkeypatch.setattr(nsys_mod.shutil, "which", lambda name: None)
    with pytest.raises(ValueError, match="nsys not found on PATH: writing the torch trace instead"):
        nsys_command(["python", "-m", "x"], "out")
    assert "install Nsight Systems" in NSYS_MISSING
    monkeypatch.setattr(nsys_mod.shutil, "which", lambda name: "/usr/bin/nsys")
    cmd = nsys_command(["python", "-m", "moebench.worker", "cfg.yaml"], "/r/traces/k/nsys", combo_key="k")
    assert cmd[:2] == ["nsys", "profile"] and cmd[-4:] == ["python", "-m", "moebench.worker", "cfg.yaml"]
    assert "--trace=cuda,nvtx" in cmd and "--capture-range=nvtx" in cmd
    assert "--nvtx-capture=moebench/combo/k" in cmd  # a default-domain range, by its message
    assert cmd[cmd.index("-o") + 1] == "/r/traces/k/nsys"


def test_nsys_rank_capture_matches_the_range_the_worker_opens(tmp_path, monkeypatch):
    """The launcher's nsys captures the NVTX range the worker opens around each row's timed
    work, once per row (repeat); the worker records each capture as nsys numbers them, and
    the row names no file before one exists."""
    from moebench.measure import capture as capture_mod
    from moebench.run.nsys_import import read_captures
    from moebench.traces import nvtx as nvtx_mod

    prefix = nsys_rank_prefix(tmp_path)
    assert prefix[:2] == ["nsys", "profile"] and "--trace=cuda,nvtx" in prefix
    assert "--sample=none" in prefix and "--cpuctxsw=none" in prefix
    assert "--capture-range=nvtx" in prefix and "--capture-range-end=repeat" in prefix
    assert "--env-var=NSYS_NVTX_PROFILER_REGISTER_ONLY=0" in prefix  # our messages are not registered strings
    assert prefix[-2:] == ["-o", str(tmp_path / "traces" / "nsys" / "ranks_%p")]
    (capture,) = [a.split("=", 1)[1] for a in prefix if a.startswith("--nvtx-capture=")]
    assert "@" not in capture, "the default domain: nsys's `range` form"
    assert nsys_capture_stem(tmp_path, 42, 3) == tmp_path / "traces" / "nsys" / "ranks_42.3"

    log = []
    fake = nvtx_mod.NvtxEmitter("torch.cuda.nvtx", lambda m: log.append(("push", m)), lambda: log.append(("pop",)))
    monkeypatch.setattr(nvtx_mod, "_EMITTER", fake)
    monkeypatch.setattr(nvtx_mod, "_RESOLVED", True)
    monkeypatch.setattr(capture_mod, "_nsys_captures", 0)
    rows = []
    for key, tokens in (("a", 4), ("b", 8)):
        with capture_mod.nsys_capture(key, str(tmp_path), tokens, 0) as row:
            log.append(("timed work",))
        rows.append(row)
    pid = os.getpid()
    assert rows == [{}, {}]
    recorded = read_captures(tmp_path)
    assert recorded[("a", 4, 0)]["stem"] == f"traces/nsys/ranks_{pid}.1"
    assert recorded[("b", 8, 0)]["stem"] == f"traces/nsys/ranks_{pid}.2"
    assert recorded[("a", 4, 0)]["api"] == "torch.cuda.nvtx"
    # the capture range of nsys's --nvtx-capture=<range>, around the timed work, with the
    # combination's range inside it (so the report holds it)
    assert log[:5] == [("push", capture), ("push", "moebench/combo/a"), ("timed work",), ("pop",), ("pop",)]
    assert log[5:] == [("push", capture), ("push", "moebench/combo/b"), ("timed work",), ("pop",), ("pop",)]
    # without an NVTX API nothing is pushed, nsys captures nothing: the record says so
    monkeypatch.setattr(nvtx_mod, "_EMITTER", None)
    with capture_mod.nsys_capture("c", str(tmp_path), 4, 0) as row:
        pass
    assert row == {} and capture_mod._nsys_captures == 2
    assert read_captures(tmp_path)[("c", 4, 0)]["stem"] is None


# -- metrics helpers -------------------------------------------------------------
def test_interval_helpers_and_comm_names():
    u = union([(0, 10), (5, 20), (30, 40), (40, 41)])
    assert u == [(0, 20), (30, 41)] and length(u) == 31
    assert intersect(u, [(15, 35)]) == [(15, 20), (30, 35)]
    for name in (
        "ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
        "ncclKernel_AllGather_RING_LL_Sum_int8_t",
        "void deep_ep::intranode::dispatch<8, 768>(...)",
        "pplx::combineKernel",
        "void c10d::symmetric_memory::one_shot_all_reduce_kernel<bf16>",
    ):
        assert is_comm_kernel(name), name
    assert not is_comm_kernel("fused_moe_kernel") and not is_comm_kernel("void dispatch_tokens_local()")


# -- (d) `moebench trace` on a run directory, with --plot -------------------------
def _run_dir(tmp_path) -> Path:
    run = tmp_path / "run"
    (run / "traces" / "combo_a").mkdir(parents=True)
    (run / "traces" / "combo_b").mkdir(parents=True)
    shutil.copy(CHROME, run / "traces" / "combo_a" / "rank0_T128.json")
    shutil.copy(NSYS, run / "traces" / "combo_b" / "nsys.sqlite")
    shutil.copy(CPU_TRACE, run / "traces" / "combo_b" / "rank0_T8.json.gz")
    shutil.copy(GPU_TRACE, run / "traces" / "combo_a" / "rank0_T1024.json.gz")
    (run / "rows.parquet").write_bytes(b"not a trace")
    (run / "traces" / "combo_b" / "rank1_T8.json").write_text("{truncated")  # a crashed rank
    return run


def test_trace_command_directory_and_plot(tmp_path, capsys):
    run = _run_dir(tmp_path)
    assert len(find_traces(run)) == 5
    assert trace_command(str(run), plot=True, out=None) == 0
    captured = capsys.readouterr()
    text = captured.out
    assert "skipped:" in captured.err and "rank1_T8.json" in captured.err
    # the CPU trace has no GPU activity: one line says there is no overlap to measure, no table of dashes
    assert text.count(OVERLAP_HEADER) == 3 and text.count("overlap: none to measure — no GPU activity") == 1
    assert "| **trace_overlap_fraction** (plain intersection) | 0.600 |" in text
    pngs = sorted((run / "traces").rglob("*.timeline.png"))
    assert len(pngs) == 4 and all(p.stat().st_size > 5000 for p in pngs)
    assert all(f"timeline: {p}" in text for p in pngs)
    assert pngs[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_trace_command_file_with_out_dir(tmp_path, capsys):
    out = tmp_path / "plots"
    assert trace_command(str(CHROME), plot=True, out=str(out)) == 0
    assert (out / "synthetic_cuda.json.timeline.png").is_file()
    assert "timeline:" in capsys.readouterr().out


# -- (e) bad input ----------------------------------------------------------------
def test_bad_paths_raise_value_error(tmp_path):
    with pytest.raises(ValueError, match="no such file or directory"):
        trace_command(str(tmp_path / "missing"), plot=False, out=None)
    (tmp_path / "empty" / "traces").mkdir(parents=True)
    with pytest.raises(ValueError, match="no trace files"):
        trace_command(str(tmp_path / "empty"), plot=False, out=None)
    (tmp_path / "empty" / "traces" / "r.json").write_text("[1, 2")
    with pytest.raises(ValueError, match="no readable trace"):
        trace_command(str(tmp_path / "empty"), plot=False, out=None)
    bad_ext = tmp_path / "x.txt"
    bad_ext.write_text("{}")
    with pytest.raises(ValueError, match="x.txt: a file, not a run folder"):
        trace_command(str(bad_ext), plot=False, out=None)
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{not json")
    with pytest.raises(ValueError, match="not a readable JSON trace"):
        trace_command(str(bad_json), plot=False, out=None)
    no_events = tmp_path / "noevents.json"
    no_events.write_text('{"foo": 1}')
    with pytest.raises(ValueError, match="traceEvents"):
        trace_command(str(no_events), plot=False, out=None)
    bad_gz = tmp_path / "bad.json.gz"
    bad_gz.write_bytes(b"\x1f\x8b garbage")
    with pytest.raises(ValueError, match="not a readable JSON trace"):
        trace_command(str(bad_gz), plot=False, out=None)
    bad_db = tmp_path / "bad.sqlite"
    bad_db.write_bytes(b"this is not sqlite at all, not even close" * 20)
    with pytest.raises(ValueError, match="SQLite"):
        trace_command(str(bad_db), plot=False, out=None)
    other_db = tmp_path / "other.sqlite"
    sqlite3.connect(other_db).execute("CREATE TABLE t (x INTEGER)").connection.commit()
    with pytest.raises(ValueError, match="not an nsys SQLite export"):
        trace_command(str(other_db), plot=False, out=None)


# -- fixtures stay in sync with their generator ---------------------------------------
def test_fixture_script_reproduces_synthetic_trace(tmp_path):
    mod = _fixtures_module()
    mod.write_chrome(tmp_path / "c.json")
    mod.write_nsys(tmp_path / "n.sqlite")
    assert json.loads((tmp_path / "c.json").read_text())["traceEvents"] == json.loads(CHROME.read_text())["traceEvents"]
    _check_scenario(summarize(parse_nsys_sqlite(tmp_path / "n.sqlite")))
    mod.write_chrome(tmp_path / "a.json", mod.ablation_samples(), mod.STRETCH_COMBO)
    mod.write_nsys(tmp_path / "a.sqlite", mod.ablation_samples(), mod.STRETCH_COMBO)
    assert (
        json.loads((tmp_path / "a.json").read_text())["traceEvents"] == json.loads(ABLATION.read_text())["traceEvents"]
    )
    _check_stretch_scenario(summarize(parse_nsys_sqlite(tmp_path / "a.sqlite")))


# -- (f) stretch-aware overlap: ablation samples in the trace ----------------------------
def _check_stretch_scenario(s):
    """make_fixtures.py's stretch scenario: exposed 20 of 80 µs of shared experts."""
    assert s.num_samples == 3 and s.num_ablation_samples == {"noshared": 3, "shared": 3}
    assert s.method == METHOD_STRETCH and PLAIN_NOTE not in s.notes
    assert s.shared_us == pytest.approx(80) and s.comm_us == pytest.approx(190)
    assert s.overlap_us == pytest.approx(80) and s.window_us == pytest.approx(190)
    assert s.comm_alone_us == pytest.approx(170) and s.shared_alone_us == pytest.approx(80)
    assert s.shared_exposed_us == pytest.approx(20)
    assert s.trace_overlap_fraction == pytest.approx(0.75, abs=1e-9)
    assert s.intersection_fraction == pytest.approx(1.0)
    assert s.comm_stretch == pytest.approx(190 / 170) and s.shared_stretch == pytest.approx(1.0)
    # the ablation samples stay out of the layer's phases, streams and "outside" count
    assert s.phases["experts"].num_kernels == 1 and s.phases["shared_experts"].gpu_us == pytest.approx(80)
    assert {st.lane: st.num_kernels for st in s.streams} == {"dev0/s7": 15, "dev0/s20": 6}
    assert any(n.startswith("1 GPU activities outside every sample") for n in s.notes)
    row = s.as_row()
    assert row["trace_overlap_fraction"] == pytest.approx(0.75) and row["trace_overlap_method"] == "stretch"
    assert row["trace_intersection_fraction"] == pytest.approx(1.0)
    assert row["trace_comm_alone_us"] == pytest.approx(170) and row["trace_window_us"] == pytest.approx(190)


def test_stretch_aware_fixture_chrome_and_nsys(tmp_path, capsys):
    trace = parse_torch_trace(ABLATION)
    by = {}
    for k in trace.kernels:
        by.setdefault((k.sample, k.ablation), []).append(k)
    assert {key for key in by if key[1]} == {(None, (kind, i)) for kind in ABLATION_PREFIXES for i in range(3)}
    assert all(not k.shared for k in by[(None, ("noshared", 0))])  # no shared-expert kernel without them
    assert all(k.shared for k in by[(None, ("shared", 0))])  # inside the `shared_experts` range of the call
    _check_stretch_scenario(summarize(trace))
    _check_stretch_scenario(summarize(parse_nsys_sqlite(ABLATION_NSYS)))
    assert trace_command(str(ABLATION), plot=True, out=str(tmp_path)) == 0
    md = capsys.readouterr().out
    assert (tmp_path / "synthetic_ablation.json.timeline.png").stat().st_size > 5000
    for label, want in [
        ("samples: layer", "3 / 3 / 3"),
        ("shared experts alone", "80.0"),
        ("shared experts in the layer", "80.0"),
        ("comm alone", "170.0"),
        ("comm in the layer", "190.0"),
        ("comm stretch", "1.118"),
        ("window", "190.0"),
        ("intersection: comm ∩ shared", "80.0"),
        ("exposed (window − comm alone)", "20.0"),
        ("**trace_overlap_fraction** (stretch-aware", "0.750"),
        ("intersection_fraction", "1.000"),
    ]:
        assert _md_row(md, label) == want, label
    assert PLAIN_NOTE not in md


def _stretch_summary(tmp_path, name, **kw):
    mod = _fixtures_module()
    path = tmp_path / f"{name}.json"
    mod.write_chrome(path, mod.ablation_samples(**kw), mod.STRETCH_COMBO)
    return summarize(parse_torch_trace(path))


def test_stretch_aware_perfect_overlap_without_stretch_is_one(tmp_path):
    """(a) The shared experts run entirely beside a reduce-scatter that does not slow down."""
    s = _stretch_summary(tmp_path, "a", stretch=(0, 0, 0), rs_alone=(100, 100, 100), act_alone=(30, 30, 30))
    assert s.method == METHOD_STRETCH
    assert s.window_us == pytest.approx(170) == s.comm_alone_us and s.shared_exposed_us == pytest.approx(0)
    assert s.trace_overlap_fraction == pytest.approx(1.0) == s.intersection_fraction
    assert s.comm_stretch == pytest.approx(1.0)


@pytest.mark.parametrize("stretch", [5, 20, 40, 80, 130])
def test_stretch_aware_comm_stretched_by_x(tmp_path, stretch):
    """(b) The reduce-scatter is X µs longer beside the shared experts (80 µs alone): 1 − X/80
    (clamped at 0), while the plain intersection still says 1.0."""
    s = _stretch_summary(tmp_path, f"b{stretch}", stretch=(stretch,) * 3, rs_alone=(100,) * 3, act_alone=(30,) * 3)
    assert s.shared_exposed_us == pytest.approx(stretch)
    assert s.trace_overlap_fraction == pytest.approx(max(0.0, 1 - stretch / 80), abs=1e-9)
    assert s.intersection_fraction == pytest.approx(1.0)
    assert s.comm_stretch == pytest.approx((170 + stretch) / 170)


@pytest.mark.parametrize("rs_alone", [(100, 100, 100), (96, 97, 99), (103, 104, 102)])
def test_stretch_aware_overlap_none_is_zero(tmp_path, rs_alone):
    """(c) overlap=none: no shared kernel runs beside communication, window = comm + shared, so
    nothing is hidden, also when the comm kernel alone is a few µs shorter or longer (noise)."""
    s = _stretch_summary(tmp_path, "c", stretch=(0, 0, 0), rs_alone=rs_alone, act_alone=(30, 31, 29), overlap="none")
    assert s.method == METHOD_STRETCH
    assert s.overlap_us == 0 and s.window_us == pytest.approx(170 + 80)
    assert s.trace_overlap_fraction == 0.0 and s.intersection_fraction == 0.0


def test_stretch_aware_formula_clamps_and_bound():
    assert stretch_aware(190, 170, 80, 80) == (20, 0.75)
    assert stretch_aware(150, 170, 80, 80) == (0, 1.0)  # window shorter than comm alone: clamped
    assert stretch_aware(300, 170, 80, 80) == (130, 0.0)  # more exposed than the shared experts take alone
    exposed, frac = stretch_aware(245, 168, 80, 0.0)  # no intersection, comm a little faster in the layer
    assert exposed == 77 and frac == 0.0  # bounded by the intersection: not 1 − 77/80
    assert stretch_aware(200, 170, 80, 10)[1] == pytest.approx(10 / 80)  # 1 − 30/80 = 0.625 > 10/80
    assert stretch_aware(190, 170, 80) == (20, 0.75)  # no bound without an intersection
    assert stretch_aware(None, 170, 80, 80) == (None, None)
    assert stretch_aware(190, 170, 0, 80) == (None, None)


def test_only_one_ablation_family_falls_back_to_plain(tmp_path):
    mod = _fixtures_module()
    samples = [smp for smp in mod.ablation_samples() if not smp["name"].startswith("sample_shared/")]
    path = tmp_path / "half.json"
    mod.write_chrome(path, samples, mod.STRETCH_COMBO)
    s = summarize(parse_torch_trace(path))
    assert s.method == METHOD_INTERSECTION and PLAIN_NOTE in s.notes
    assert s.trace_overlap_fraction == pytest.approx(1.0) and s.comm_alone_us == pytest.approx(170)


@pytest.mark.parametrize("path", H200, ids=[p.name for p in H200])
def test_old_format_traces_give_the_plain_figure_with_a_note(path, capsys):
    """(d) Traces without ablation samples (the committed H200 ones): the plain intersection
    figure, and `moebench trace` says so."""
    s = summarize_file(path)[0]
    assert s.num_ablation_samples == {"noshared": 0, "shared": 0}
    assert s.method == METHOD_INTERSECTION and s.trace_overlap_fraction == s.intersection_fraction
    assert s.shared_alone_us is None and s.comm_alone_us is None
    assert trace_command(str(path), plot=False, out=None) == 0
    out = capsys.readouterr().out
    assert f"note: {PLAIN_NOTE}" in out
    assert _md_row(out, "**trace_overlap_fraction** (plain intersection)") == f"{s.trace_overlap_fraction:.3f}"


def test_capture_records_ablation_families(tmp_path):
    """capture(..., ablation=): after the layer samples, as many of each ablation callable, each
    warmed up, in its own range, with the barrier before every sample."""
    calls, order = [], []
    rec = make_phase_recorder(nvtx=False, record_function=True, cuda_events=False, device="cpu")
    x = torch.randn(32, 32)

    def layer():
        order.append("layer")
        with rec("experts"):
            x @ x
        with rec("shared_experts"):
            x + 1

    def noshared():
        order.append("noshared")
        with rec("experts"):
            x @ x

    def shared():
        order.append("shared")
        with rec("shared_experts"):
            x + 1

    path = capture(
        layer,
        tmp_path / "t.json",
        warmup=1,
        samples=2,
        combo_key="k",
        barrier=lambda: calls.append(1),
        ablation={"shared": shared, "noshared": noshared},
    )
    assert order == ["layer", "noshared", "shared"] + ["layer"] * 2 + ["noshared"] * 2 + ["shared"] * 2
    assert len(calls) == 6
    trace = parse_torch_trace(path)
    names = {r.name for r in trace.ranges}
    assert {
        "sample/0",
        "sample/1",
        "sample_noshared/0",
        "sample_noshared/1",
        "sample_shared/0",
        "sample_shared/1",
    } <= names
    assert trace.has_ablation()
    s = summarize(trace)
    assert s.num_samples == 2 and s.num_ablation_samples == {"noshared": 2, "shared": 2}
    assert s.phases["experts"].num_ranges == 1  # per layer sample: the ablation samples stay out
    assert s.trace_overlap_fraction is None and s.method is None  # CPU: no kernels, no figure
    with pytest.raises(ValueError, match="ablation kinds"):
        capture(layer, tmp_path / "u.json", ablation={"alone": shared})


# -- (g) the worker's capture, end to end on 2 gloo ranks ----------------------------------
@pytest.mark.multiprocess
def test_worker_trace_records_ablation_samples_on_two_gloo_ranks(tmp_path, monkeypatch, capsys):
    """trace=torch on the CPU (no GPU kernels): with overlap=combine each rank's trace holds the
    layer samples, then as many samples of the layer without shared experts and of the shared
    experts alone; overlap=none records the layer samples only."""
    from moebench.results.store import RunStore
    from moebench.run.sweep import execute

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    run_dir, _ = execute(
        [
            "backend=naive",
            "experts=torch",
            "reduction=experts",
            "overlap=none,combine",
            "quant=bf16",
            "model=tiny",
            "trace=torch",
            "trace.samples=2",
            "workload.tokens_per_rank=[4]",
            "runner.reps=3",
            "runner.warmup=1",
            "runner.phase_reps=2",
            "runner.memory=false",
        ],
        None,
        str(tmp_path / "run"),
        quiet=True,
    )
    df = RunStore(run_dir).load().set_index("overlap")
    assert set(df.status) == {"ok"} and set(df.index) == {"none", "combine"}
    for overlap, row in df.iterrows():
        path = Path(run_dir) / row.trace_path
        assert path.name == "rank0_T4.json" and path.parent.name in row.trace_path
        for rank in (0, 1):
            trace = parse_torch_trace(path.with_name(f"rank{rank}_T4.json"))
            names = [r.name for r in trace.ranges]
            assert [n for n in names if n.startswith("sample/")] == ["sample/0", "sample/1"]
            families = {kind: sorted(i for i, _ in trace.ablation_ranges(kind)) for kind in ABLATION_PREFIXES}
            if overlap == "combine":
                assert families == {"noshared": [0, 1], "shared": [0, 1]}, (rank, names)
                # the ablation samples come after the layer samples; the layer without shared
                # experts has no shared_experts range; the shared experts alone have theirs only
                last_layer = max(r.end_us for _, r in trace.sample_ranges())
                assert all(
                    r.start_us >= last_layer for kind in ABLATION_PREFIXES for _, r in trace.ablation_ranges(kind)
                )
                for kind, want in (("noshared", False), ("shared", True)):
                    for _, sr in trace.ablation_ranges(kind):
                        inner = {
                            r.name
                            for r in trace.ranges
                            if sr.start_us <= r.start_us <= r.end_us <= sr.end_us and r is not sr
                        }
                        assert ("shared_experts" in inner) == want, (kind, inner)
                        if kind == "shared":
                            assert inner == {"shared_experts"}
            else:
                assert families == {"noshared": [], "shared": []}
            s = summarize(trace)
            assert s.num_samples == 2 and s.trace_overlap_fraction is None  # no GPU kernels on the CPU
    assert trace_command(str(run_dir), plot=False, out=None) == 0
    out = capsys.readouterr().out
    # gloo ranks on the CPU: no GPU activity, so one line per trace instead of an overlap table of dashes,
    # still counting the samples each family recorded; and no ranks table of dashes
    assert OVERLAP_HEADER not in out and out.count("overlap: none to measure — no GPU activity in the trace") == 4
    assert out.count("(a CPU run; samples: layer 2 / without shared experts 2 / shared experts alone 2)") == 2
    assert out.count("ranks: nothing to compare — no GPU activity in the 2 ranks' traces") == 2
    assert "| rank | layer span µs" not in out


@pytest.mark.parametrize("path", H200_ABLATION, ids=[p.name for p in H200_ABLATION])
def test_real_traces_with_ablation_samples_give_the_stretch_figure(path):
    """allgather_rs, overlap=combine, 4096 tokens on H200 (at 2be9ad1): 3 samples of each family,
    the stretch-aware figure, comm kernels found in the layer and alone."""
    s = summarize_file(path)[0]
    assert s.num_samples == 3 and s.num_ablation_samples == {"noshared": 3, "shared": 3}
    assert s.method == METHOD_STRETCH
    assert s.shared_alone_us > 400 and s.comm_alone_us > 0 and s.layer_us > 5000
    # hidden time is bounded by the intersection (metrics.py): overlap / shared alone
    assert 0.0 <= s.trace_overlap_fraction <= s.overlap_us / s.shared_alone_us + 1e-9
    # the shared experts run longer beside NCCL's kernels than alone; NCCL's busy time is no
    # such measure: on rank 0 it is shorter in the layer (0.86-0.88 of alone), being mostly
    # the wait for rank 1, which the shared experts shift
    assert s.shared_stretch > 1.05


# -- (h) several ranks: communication without the wait for the last rank -------------------
def _rank_trace(comm, shared, comm_alone, shared_alone):
    """A 2-rank allgather_rs-like trace: one layer sample (comm + shared kernels), one sample
    of the layer without shared experts, one of the shared experts alone (µs)."""
    from moebench.traces.model import Kernel, Range, Trace

    ranges = [
        Range("sample/0", 0.0, 1000.0, "t"),
        Range("sample_noshared/0", 1000.0, 2000.0, "t"),
        Range("sample_shared/0", 2000.0, 3000.0, "t"),
    ]
    k = [
        Kernel("ncclDevKernel_ReduceScatter", *comm, 0, 1, sample=0, comm=True),
        Kernel("gemm", *shared, 0, 0, sample=0, phases=("shared_experts",)),
        Kernel("ncclDevKernel_ReduceScatter", *comm_alone, 0, 1, ablation=("noshared", 0), comm=True),
        Kernel("gemm", *shared_alone, 0, 0, ablation=("shared", 0), phases=("shared_experts",)),
    ]
    return Trace(source="synthetic", fmt="torch", ranges=ranges, kernels=k)


def test_matched_overlap_trims_the_wait_for_the_last_rank():
    """Rank 0 reaches the reduce-scatter 100 µs before rank 1 and runs its shared experts in
    that wait; trimmed, its collective starts with rank 1's: 50 of its 150 µs of shared
    experts ran beside the transfer (1/3), where the untrimmed figure says 2/3. Rank 1 waited
    for nobody: its figure stands, and it is the row's."""
    from moebench.traces.matched import matched_overlap, trim_comm_waits

    r0 = _rank_trace((100, 400), (100, 250), (1100, 1350), (2000, 2150))
    r1 = _rank_trace((200, 400), (200, 350), (1150, 1350), (2000, 2150))
    assert abs(summarize(r0).trace_overlap_fraction - 2 / 3) < 1e-9
    trimmed, waits, notes = trim_comm_waits([r0, r1])
    assert [k.start_us for k in trimmed[0].kernels if k.comm] == [200, 1150] and notes == []
    assert waits == [100.0, 0.0]
    m = matched_overlap([r0, r1])
    assert m.critical_rank == 1 and abs(m.fraction_per_rank[0] - 1 / 3) < 1e-9 and m.fraction == 1.0
    assert matched_overlap([r0]) is None  # one rank: nothing to match
    # ranks that ran different numbers of collectives in a sample are left as they are
    from moebench.traces.model import Kernel

    r1.kernels.append(Kernel("ncclDevKernel_AllGather", 0, 50, 0, 1, sample=0, comm=True))
    trimmed, _, notes = trim_comm_waits([r0, r1])
    assert [k.start_us for k in trimmed[0].kernels if k.comm] == [100, 1150] and "1 samples" in notes[0]


def test_capture_marks_the_samples_the_host_paced(tmp_path):
    """capture(..., pace=): a sample whose start the GPU had passed before the host had enqueued it
    gets a `host_paced/<its range>` range; the summary names those samples in a note, and
    `moebench trace`'s markdown prints it."""
    paced = iter([False, True, False, False, False, True])  # layer sample 1, shared-alone sample 1

    class Pace:
        def __init__(self):
            self.started_n = 0

        def started(self):
            self.started_n += 1

        def enqueued(self):
            return next(paced)

    x = torch.randn(16, 16)
    pace = Pace()
    path = capture(
        lambda: x @ x,
        tmp_path / "t.json",
        warmup=1,
        samples=2,
        combo_key="k",
        cuda=False,
        pace=pace,
        ablation={"noshared": lambda: x @ x, "shared": lambda: x + 1},
    )
    assert pace.started_n == 6
    trace = parse_torch_trace(path)
    assert trace.host_paced() == ["sample/1", "sample_shared/1"]
    s = summarize(trace)
    assert s.host_paced == ["sample/1", "sample_shared/1"] and s.num_samples == 2  # the marks are no samples
    note = next(n for n in s.notes if "host-paced" in n)
    assert note.startswith("2 of 6 samples host-paced (sample/1, sample_shared/1)")
    assert "2 of 6 samples host-paced" in to_markdown(s)
    clean = summarize(parse_torch_trace(capture(lambda: x @ x, tmp_path / "u.json", samples=2, cuda=False)))
    assert clean.host_paced == [] and not any("host-paced" in n for n in clean.notes)


# -- (h) Kineto's notes stay out of a sweep's output -----------------------------------------
def test_kinetos_notes_are_dropped_and_every_other_line_of_fd_2_kept(capfd):
    """What the profiler's start and stop write to fd 2: Kineto's 'USDT:... profiler_start' notes go,
    a warning or an error written in the same window still shows."""
    from moebench.traces.torch_trace import kineto_notes_dropped

    with kineto_notes_dropped():
        os.write(2, b"USDT:2026-12-08 00:44:59 9005:9005 SyncActivityProfilerHandler.cpp:52] profiler_start\n")
        os.write(2, b"ERROR:2026-12-08 00:44:59 9005:9005 CuptiActivityApi.cpp:1] a real failure\n")
        os.write(2, b"STAGE:2026-12-08 00:44:59 9005:9005 SyncActivityProfilerHandler.cpp:51] Completed Stage\n")
    err = capfd.readouterr().err
    assert err == "ERROR:2026-12-08 00:44:59 9005:9005 CuptiActivityApi.cpp:1] a real failure\n", err


@pytest.mark.multiprocess
def test_a_trace_torch_sweep_prints_no_profiler_notes(tmp_path, monkeypatch, capfd):
    """`moebench sweep trace=torch` printed two Kineto lines a row ('USDT:... SyncActivityProfilerHandler
    .cpp:52] profiler_start', then profiler_stop) among its own, from the rank processes' stderr."""
    from moebench.run.sweep import execute

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    overrides = ["backend=local", "experts=torch", "model=tiny", "quant=bf16", "overlap=none", "reduction=experts"]
    run_dir, _ = execute(
        overrides + ["trace=torch", "trace.samples=1", "workload.tokens_per_rank=[4]", "runner.reps=2"],
        None,
        str(tmp_path / "run"),
        quiet=False,
    )
    from moebench.results.store import RunStore

    assert set(RunStore(run_dir).load().status) == {"ok"}
    assert list((Path(run_dir) / "traces").rglob("rank0_T4.json"))  # traced
    out, err = capfd.readouterr()
    assert "moebench: " in err, err  # the sweep's own lines reached the captured stderr
    noted = [line for line in (out + err).splitlines() if "profiler_st" in line or ".cpp:" in line]
    assert not noted, noted

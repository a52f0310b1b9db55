"""moebench.traces: phase recorder, torch / nsys trace parsing, overlap metrics, `moebench trace`.

CPU only. Fixtures under tests/fixtures/traces/ come from make_fixtures.py there
(the synthetic scenario and its exact figures are described in its docstring).
"""
from __future__ import annotations

import gzip
import importlib.util
import json
import shutil
import sqlite3
import time
from pathlib import Path

import pytest
import torch

from moebench.traces import nsys as nsys_mod
from moebench.traces.cli import find_traces, summarize_file, trace_command
from moebench.traces.metrics import intersect, length, summarize, to_markdown, union
from moebench.traces.model import is_comm_kernel
from moebench.traces.nsys import NSYS_MISSING, nsys_available, nsys_command, nsys_processes, parse_nsys_sqlite
from moebench.traces.nvtx import combo_range, make_phase_recorder, sample_range
from moebench.traces.torch_trace import capture, parse_torch_trace, trace_path

FIX = Path(__file__).parent / "fixtures" / "traces"
CHROME = FIX / "synthetic_cuda.json"
NSYS = FIX / "synthetic_nsys.sqlite"
CPU_TRACE = FIX / "cpu_phases.json.gz"
GPU_TRACE = FIX / "h200_nccl_rank0_T1024.json.gz"  # capture_gpu_trace.py on 2 x H200, torch 2.11

# exact figures of the synthetic scenario (µs per sample)
CPU_US = {"prepare": 10, "dispatch": 10, "shared_experts": 20, "experts": 20, "finalize": 40, "weight_reduce": 8, "combine": 20}
GPU_US = {"prepare": 10, "dispatch": 70, "shared_experts": 100, "experts": 100, "finalize": 55, "weight_reduce": 10, "combine": 40}


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
    for fig, meas in zip(s.per_sample, measured):
        for name, us in meas.items():
            got = fig["phases"][name]["cpu_us"]
            # the record_function range encloses the perf_counter window: never shorter,
            # longer by the annotation cost (or by a descheduling on a loaded machine)
            assert us - 5 <= got <= us * 1.5 + 5000, (name, got, us)
    for name in measured[0]:
        # medians over the 3 samples: robust to one descheduled sample
        want = sorted(m[name] for m in measured)[1]
        assert want - 5 <= s.phases[name].cpu_us <= want * 1.15 + 500, (name, s.phases[name].cpu_us, want)
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

    path = capture(fn, trace_path(tmp_path, "k", 0, 64), warmup=2, samples=3, combo_key="k",
                   barrier=lambda: calls.append(1))
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
    assert s.trace_overlap_fraction == pytest.approx(0.6, abs=1e-9)
    assert s.shared_exposed_us == pytest.approx(40)
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
    assert "| 100.0 | 110.0 | 60.0 | 0.600 | 40.0 |" in md


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
        (a, b), = [(a, b) for n, a, b, _ in trace.gpu_ranges if n == "shared_experts" and a <= shared[0].start_us <= b]
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
        for table, col in (("NVTX_EVENTS", "globalTid"), ("CUPTI_ACTIVITY_KIND_RUNTIME", "globalTid"),
                           ("CUPTI_ACTIVITY_KIND_KERNEL", "globalPid"), ("CUPTI_ACTIVITY_KIND_MEMCPY", "globalPid")):
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
    assert "--nvtx-capture=combo/k@moebench" in cmd
    assert cmd[cmd.index("-o") + 1] == "/r/traces/k/nsys"


# -- metrics helpers -------------------------------------------------------------
def test_interval_helpers_and_comm_names():
    u = union([(0, 10), (5, 20), (30, 40), (40, 41)])
    assert u == [(0, 20), (30, 41)] and length(u) == 31
    assert intersect(u, [(15, 35)]) == [(15, 20), (30, 35)]
    for name in ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "ncclKernel_AllGather_RING_LL_Sum_int8_t",
                 "void deep_ep::intranode::dispatch<8, 768>(...)", "pplx::combineKernel",
                 "void c10d::symmetric_memory::one_shot_all_reduce_kernel<bf16>"):
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
    assert text.count("| shared µs | comm µs |") == 4
    assert "| 100.0 | 110.0 | 60.0 | 0.600 | 40.0 |" in text
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
    with pytest.raises(ValueError, match="not a trace file"):
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
    spec = importlib.util.spec_from_file_location("make_fixtures", FIX / "make_fixtures.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.write_chrome(tmp_path / "c.json")
    mod.write_nsys(tmp_path / "n.sqlite")
    assert json.loads((tmp_path / "c.json").read_text())["traceEvents"] == json.loads(CHROME.read_text())["traceEvents"]
    _check_scenario(summarize(parse_nsys_sqlite(tmp_path / "n.sqlite")))

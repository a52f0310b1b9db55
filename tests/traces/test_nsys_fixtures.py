"""Real Nsight Systems exports from the H200 (tests/fixtures/traces/h200_nsys_*.sqlite, made by
.gpu/nsys_call.sh and tests/fixtures/traces/import_nsys_fixtures.py; unmodified `nsys export
--type sqlite` of the Debian 2024.2.3 target's captures): the kernels and moebench's NVTX ranges
are there by name, and `moebench trace` gives per-phase kernel time, the stream timeline, the
shared ∩ communication overlap and the exposed time from them. The fixtures are committed: a missing
one fails, as it would hide what these tests check."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from moebench import cli
from moebench.traces.files import load_traces
from moebench.traces.metrics import summarize
from moebench.traces.model import PHASES
from moebench.traces.nsys import NVTX_PREFIX

FIX = Path(__file__).parents[1] / "fixtures" / "traces"
SMOKE = FIX / "h200_nsys_smoke.sqlite"
OVERLAPS = ("none", "combine")
# the committed sweep exports, by name (a glob would pass with none), and any added beside them
SWEEP = sorted(
    {FIX / f"h200_nsys_triton_{ov}_T256.sqlite" for ov in OVERLAPS}
    | {p for p in FIX.glob("h200_nsys_*.sqlite") if p != SMOKE}
)
ALL = [SMOKE, *SWEEP]
MISSING = "missing: made by .gpu/nsys_call.sh on the GPU machine, then import_nsys_fixtures.py --install"


def _present(path: Path) -> Path:
    assert path.is_file(), f"{path.name} {MISSING}"
    return path


def _names(path) -> set:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = con.execute(
            "SELECT COALESCE(e.text, s.value) FROM NVTX_EVENTS e "
            "LEFT JOIN StringIds s ON s.id = e.textId WHERE e.eventType IN (59, 60)"
        ).fetchall()
    finally:
        con.close()
    return {r[0] for r in rows if r[0]}


def _tables(path) -> set:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    finally:
        con.close()


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.name)
def test_a_real_export_holds_kernels_ranges_and_its_provenance(path):
    assert _present(path).stat().st_size < 2_000_000, "keep fixtures small"
    tables = _tables(path)
    # unmodified: the export's own provenance tables are there
    assert {
        "TARGET_INFO_GPU",
        "META_DATA_CAPTURE",
        "META_DATA_EXPORT",
        "CUPTI_ACTIVITY_KIND_KERNEL",
        "CUPTI_ACTIVITY_KIND_RUNTIME",
        "NVTX_EVENTS",
        "StringIds",
    } <= tables
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    gpu = con.execute("SELECT * FROM TARGET_INFO_GPU").fetchall()
    con.close()
    assert any("H200" in str(v) for g in gpu for v in g), gpu
    names = _names(path)
    ours = {n[len(NVTX_PREFIX) :] for n in names if n.startswith(NVTX_PREFIX)}
    assert {"experts"} <= ours and any(n.startswith("combo/") for n in ours), names
    (trace,) = load_traces(path)
    assert trace.kernels and all(k.end_us >= k.start_us for k in trace.kernels)
    assert any(k.launch_us is not None for k in trace.kernels), "kernels matched to their launches"
    assert {k.phase for k in trace.kernels} & set(PHASES), "kernels attributed to moebench's phases"


def test_the_smoke_capture_two_streams_named_ranges():
    """Three samples of experts (main stream), shared_experts (a side stream) and combine."""
    names = _names(_present(SMOKE))
    expected = {"combo/smoke", "sample/0", "sample/1", "sample/2", "experts", "shared_experts", "combine"}
    assert {NVTX_PREFIX + n for n in expected} <= names
    (trace,) = load_traces(SMOKE)
    assert [i for i, _ in trace.sample_ranges()] == [0, 1, 2]
    by_phase = {}
    for k in trace.kernels:
        by_phase.setdefault(k.phase, set()).add(k.lane)
    assert by_phase["shared_experts"].isdisjoint(by_phase["experts"]), "shared experts on their own stream"
    s = summarize(trace)
    assert s.num_samples == 3 and len(s.streams) >= 2
    for ph in ("experts", "shared_experts", "combine"):
        assert s.phases[ph].gpu_us > 0 and s.phases[ph].num_kernels >= 1
    assert s.shared_us > 0 and s.comm_us == 0 and s.overlap_us == 0  # one GPU: no communication kernel
    assert s.shared_exposed_us == pytest.approx(s.shared_us)


@pytest.mark.parametrize("path", SWEEP, ids=lambda p: p.name)
def test_moebench_trace_on_a_sweep_export(path, capsys, tmp_path):
    """A row's report from `moebench sweep trace=nsys`: the phases of the layer as its phase
    samples ran them, the streams (a second one for the shared experts with overlap=combine),
    the overlap table; and the timeline PNG."""
    names = {n[len(NVTX_PREFIX) :] for n in _names(_present(path)) if n.startswith(NVTX_PREFIX)}
    assert {"prepare", "experts", "finalize"} <= names
    (trace,) = load_traces(path)
    s = summarize(trace)
    assert s.phases["experts"].gpu_us > 0
    if "_combine_" in path.name:
        assert "shared_experts" in names and s.shared_us > 0
        assert len({k.lane for k in trace.kernels if k.shared}) >= 1
        assert len(s.streams) >= 2, [st.lane for st in s.streams]
    assert cli.main(["trace", str(path), "--plot", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    # local/triton on one GPU: no communication kernels, so no overlap table but one line saying why
    assert "| experts |" in out and "| stream |" in out and "intersection: comm ∩ shared" not in out
    assert "overlap: none to measure — no communication kernels in the trace (one rank" in out
    if "_combine_" in path.name:
        assert f"the shared experts took {s.shared_us:.1f} µs in the layer" in out
    assert list(tmp_path.glob("*.timeline.png"))


@pytest.mark.parametrize("overlap", OVERLAPS)
def test_nsys_phase_times_agree_with_the_torch_trace_of_the_same_combination(overlap):
    """The same combination (local/triton/finalize, deepseek_v2_lite bf16, 256 tokens) captured
    in one GPU call by Nsight Systems (trace=nsys) and by the torch profiler (trace=torch):
    each phase's kernel time per range agrees within 10 %. The nsys report holds the row's phase
    samples (no sample ranges at that commit: its figures are sums over the ranges)."""
    nsys = _present(FIX / f"h200_nsys_triton_{overlap}_T256.sqlite")
    torch_trace = _present(FIX / f"nsys_call_torch_triton_{overlap}_T256.json.gz")
    a = summarize(load_traces(nsys)[0]).phases
    b = summarize(load_traces(torch_trace)[0]).phases
    checked = 0
    for name in PHASES:
        if name not in a or name not in b or not b[name].gpu_us:
            continue
        per_range = a[name].gpu_us / a[name].num_ranges
        assert abs(per_range / b[name].gpu_us - 1) <= 0.10, (name, per_range, b[name].gpu_us)
        checked += 1
    assert checked >= 4

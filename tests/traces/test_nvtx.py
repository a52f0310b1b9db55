"""Phase ranges (moebench/traces/nvtx.py): NVTX ranges carry the names and nesting of the
torch record_function ranges, and with measurement off the timed forwards run with
`NULL_PHASES` (no range, no event, no NVTX call).

The NVTX emitter is a fake that records push / pop calls, so these tests do not depend
on an NVTX API being installed (nor on a profiler listening to it)."""

from __future__ import annotations

import json
import logging
import sys

import pytest
import torch

from moebench.config import compose
from moebench.kernels.interfaces import NULL_PHASES
from moebench.kernels.modular import MoEKernel
from moebench.measure import timing
from moebench.measure.layer import build_layer
from moebench.measure.workload import make_inputs
from moebench.run import plan, worker
from moebench.run.messages import Task
from moebench.traces import nvtx as nvtx_mod
from moebench.traces.nsys import NVTX_PREFIX
from moebench.traces.nvtx import PhaseRecorder, combo_range, make_phase_recorder, phase_recorder_for, sample_range


class FakeDomain:
    """Records the pushes / pops PhaseRecorder and named_range make through the NVTX emitter
    (names without the `moebench/` prefix every NVTX message carries)."""

    def __init__(self):
        self.calls = []  # ("push", name) | ("pop", None)
        self.emitter = nvtx_mod.NvtxEmitter("fake", self._push, self._pop)

    def _push(self, message):
        assert message.startswith(NVTX_PREFIX), message
        self.push_range(message[len(NVTX_PREFIX) :])

    def push_range(self, name):
        self.calls.append(("push", name))

    def _pop(self):
        self.calls.append(("pop", None))

    def pushed(self) -> list:
        """(name, depth) of each pushed range, in push order; asserts pushes and pops balance."""
        out, depth = [], 0
        for op, name in self.calls:
            if op == "push":
                out.append((name, depth))
                depth += 1
            else:
                depth -= 1
                assert depth >= 0, self.calls
        assert depth == 0, self.calls
        return out


@pytest.fixture
def domain(monkeypatch):
    """The fake in place of the process's NVTX emitter (nvtx_emitter() returns its emitter)."""
    fake = FakeDomain()
    monkeypatch.setattr(nvtx_mod, "_EMITTER", fake.emitter)
    monkeypatch.setattr(nvtx_mod, "_RESOLVED", True)
    return fake


def _layer(overlap: str, reduction: str) -> MoEKernel:
    cfg = compose.compose_config(
        ["backend=local", "experts=torch", "model=tiny", f"reduction={reduction}", "quant=bf16", f"overlap={overlap}"]
    )
    kernel = build_layer(compose.to_combo(cfg), 0, 1, None, torch.device("cpu")).kernel
    assert kernel.shared is not None
    return kernel


def _record_function_tree(chrome_trace: dict) -> list:
    """(name, depth) of the trace's record_function ranges in start order, depth by containment."""
    evs = sorted(
        (e for e in chrome_trace["traceEvents"] if e.get("cat") == "user_annotation" and e.get("ph") == "X"),
        key=lambda e: (e["ts"], -e["dur"]),
    )
    out, open_ends = [], []
    for e in evs:
        start, end = e["ts"], e["ts"] + e["dur"]
        while open_ends and open_ends[-1] <= start:
            open_ends.pop()
        assert not open_ends or end <= open_ends[-1], ("ranges overlap without nesting", e["name"])
        out.append((e["name"], len(open_ends)))
        open_ends.append(end)
    return out


# -- (a) NVTX ranges: the record_function names, nested alike ---------------------------
@pytest.mark.parametrize("overlap, reduction", [("combine", "finalize"), ("none", "experts")])
def test_nvtx_ranges_are_the_record_function_ranges(domain, tmp_path, overlap, reduction):
    """One CPU forward with NVTX and record_function on: the NVTX pushes (names, nesting)
    equal the torch trace's record_function ranges, combo and sample ranges included."""
    kernel = _layer(overlap, reduction)
    x, w, ids = make_inputs(kernel.pf.ctx.shape, 8, "uniform", 1.0, 0, 0, 1, torch.device("cpu"))
    kernel(x, w, ids)  # warm-up outside the profiler and without ranges
    assert domain.calls == []
    rec = make_phase_recorder(nvtx=True, record_function=True, cuda_events=False, device="cpu")
    assert isinstance(rec, PhaseRecorder) and rec._nvtx is domain.emitter
    kernel.phases = rec
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with combo_range("k"), sample_range(0):
            kernel(x, w, ids)
    kernel.phases = NULL_PHASES
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    torch_tree = _record_function_tree(json.loads((tmp_path / "t.json").read_text()))

    nvtx_tree = domain.pushed()
    assert nvtx_tree == torch_tree
    names = [n for n, _ in nvtx_tree]
    assert names[:2] == ["combo/k", "sample/0"] and {"prepare", "experts", "finalize", "shared_experts"} <= set(names)
    inner = "weight_reduce" if reduction == "finalize" else "combine"
    depth = dict(nvtx_tree)
    assert depth["finalize"] == 2 and depth[inner] == 3  # inside finalize, inside sample/0
    # overlap=combine runs the shared experts inside finalize, overlap=none after it
    assert depth["shared_experts"] == (3 if overlap == "combine" else 2)


def test_without_an_nvtx_api_no_range_and_one_warning(monkeypatch, caplog):
    monkeypatch.setattr(nvtx_mod, "_EMITTER", None)
    monkeypatch.setattr(nvtx_mod, "_RESOLVED", False)
    monkeypatch.setattr(nvtx_mod, "_torch_emitter", lambda: None)  # no CUDA
    monkeypatch.setitem(sys.modules, "nvtx", None)  # `import nvtx` raises ImportError
    with caplog.at_level(logging.WARNING, logger=nvtx_mod.__name__):
        rec = make_phase_recorder(nvtx=True, record_function=False, cuda_events=True, device="cpu")
        make_phase_recorder(nvtx=True, record_function=False, cuda_events=True, device="cpu")
    assert rec._nvtx is None and nvtx_mod.nvtx_api() is None
    with rec("experts"):
        pass
    assert rec.counts() == {"experts": 1}
    assert sum("no NVTX API" in r.getMessage() for r in caplog.records) == 1


def test_the_api_follows_cuda_and_can_be_forced(monkeypatch):
    """With CUDA, torch.cuda.nvtx (the one Nsight Systems 2024.2 records); without, the nvtx
    package; MOEBENCH_NVTX_API picks one."""

    def resolve(forced=None):
        monkeypatch.setattr(nvtx_mod, "_RESOLVED", False)
        monkeypatch.setattr(nvtx_mod, "_EMITTER", None)
        if forced is None:
            monkeypatch.delenv("MOEBENCH_NVTX_API", raising=False)
        else:
            monkeypatch.setenv("MOEBENCH_NVTX_API", forced)
        return nvtx_mod.nvtx_api()

    if torch.cuda.is_available():
        assert resolve() == nvtx_mod.API_TORCH
    else:
        pytest.importorskip("nvtx")
        assert resolve() == nvtx_mod.API_PACKAGE
    assert resolve("none") is None
    with pytest.raises(ValueError, match="valid: torch, nvtx, none"):
        resolve("perfetto")


def test_the_real_nvtx_package_takes_our_calls(monkeypatch):
    """With the `nvtx` package (the API without CUDA), the recorder pushes `moebench/<name>`
    ranges in the default domain."""
    nvtx = pytest.importorskip("nvtx")
    pushed = []
    real_push = nvtx.push_range
    monkeypatch.setattr(nvtx, "push_range", lambda message=None, **k: pushed.append(message) or real_push(message, **k))
    monkeypatch.setattr(nvtx_mod, "_RESOLVED", False)
    monkeypatch.setattr(nvtx_mod, "_EMITTER", None)
    monkeypatch.setenv("MOEBENCH_NVTX_API", "nvtx")
    assert nvtx_mod.nvtx_api() == "nvtx package"
    rec = make_phase_recorder(nvtx=True, record_function=False, cuda_events=False, device="cpu")
    with combo_range("k", record_function=False), rec("experts"), rec("finalize"):
        pass  # no profiler attached: the calls must still be accepted
    assert pushed == ["moebench/combo/k", "moebench/experts", "moebench/finalize"]


# -- (b) measurement off: nothing during the timed forwards -------------------------------
def test_all_off_and_trace_modes():
    assert make_phase_recorder(False, False, False, "cpu") is NULL_PHASES
    assert phase_recorder_for("none", "cpu", cuda_events=False) is NULL_PHASES
    assert phase_recorder_for("nvtx", "cpu", cuda_events=False)._nvtx is nvtx_mod.nvtx_emitter()
    with pytest.raises(ValueError, match="valid: none, nvtx, torch, nsys"):
        phase_recorder_for("perfetto", "cpu")


@pytest.mark.parametrize("trace", ["none", "nvtx"])
def test_timed_forwards_run_with_null_phases(domain, monkeypatch, tmp_path, trace):
    """The worker's measurement of one combination (two token counts: the second one's timed
    samples follow the first one's phase samples), in this process: every forward that
    timing.time_interleaved times runs with `kernel.phases is NULL_PHASES` (pf and experts
    too), with no NVTX call and no record_function range. The phase samples around them do
    get a recorder (so a recorder left installed would show), with NVTX pushes for trace=nvtx
    and none for trace=none."""
    combos, _ = plan.plan(
        [
            "backend=local",
            "experts=torch",
            "model=tiny",
            "reduction=finalize",
            "overlap=combine",
            "quant=bf16",
            f"trace={trace}",
            "runner.device=cpu",
            "runner.reps=3",
            "runner.warmup=1",
            "runner.phase_reps=2",
            "runner.memory=false",
        ]
    )
    (c,) = combos
    state = {"timed": False}
    seen = []  # (timed, kernel phases, pf phases, experts phases) per layer forward

    forward = MoEKernel.forward

    def spy_call(self, *a, **k):
        seen.append((state["timed"], self._phases, self.pf.phases, self.experts.phases))
        return forward(self, *a, **k)

    monkeypatch.setattr(MoEKernel, "__call__", spy_call)
    record_functions = []
    real_rf = torch.profiler.record_function

    def spy_rf(name, *a, **k):
        record_functions.append((state["timed"], name))
        return real_rf(name, *a, **k)

    monkeypatch.setattr(torch.profiler, "record_function", spy_rf)
    timed_pushes = []
    real_push = domain.push_range

    def push(name):
        if state["timed"]:
            timed_pushes.append(name)
        real_push(name)

    domain.push_range = push
    real_time = timing.time_interleaved

    def timed(fn):
        def run():
            state["timed"] = True
            try:
                return fn()
            finally:
                state["timed"] = False

        return run

    def spy_time_interleaved(fns, *a, **k):
        assert len(fns) == 3  # the layer, without shared experts, the shared experts alone
        return real_time([timed(f) for f in fns], *a, **k)

    monkeypatch.setattr(timing, "time_interleaved", spy_time_interleaved)

    task = Task(0, c.combo, (4, 8))
    results = [
        (t, r) for t, r in worker.run_combination(task, 0, 1, None, torch.device("cpu"), str(tmp_path)) if r is not None
    ]
    assert [t for t, _ in results] == [4, 8] and all(r.status == "ok" for _, r in results)

    in_timed = [s for s in seen if s[0]]
    assert len(in_timed) >= 2 * 2 * (3 + 1)  # 2 token counts x 2 layer fns x (reps + warm-up)
    assert all(p is NULL_PHASES and pf is NULL_PHASES and ex is NULL_PHASES for _, p, pf, ex in in_timed)
    assert timed_pushes == [] and [n for t, n in record_functions if t] == []
    # the phase samples (after each token count's timed samples) ran with the worker's recorder
    recorded = [p for t, p, _, _ in seen if not t and p is not NULL_PHASES]
    # 2 token counts x (phase_reps + the uncounted forward before them)
    assert len(recorded) == 2 * (2 + 1) and all(isinstance(p, PhaseRecorder) for p in recorded)
    assert {n for t, n in record_functions if not t} >= {"experts", "finalize", "shared_experts"}
    pushed = [n for op, n in domain.calls if op == "push"]
    if trace == "none":
        assert pushed == []
    else:
        assert set(pushed) >= {"experts", "finalize", "shared_experts"}
    assert "experts" in results[0][1].phases_us and "finalize" in results[1][1].phases_us  # from the recorder

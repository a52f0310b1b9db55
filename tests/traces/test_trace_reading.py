"""What `moebench trace` shows a reader of a CPU run: the phase table nests each phase's parts under
it and says which rows add up to the layer; the timeline names its lanes for what they are (a host
thread, a GPU stream) and says what the host's dispatch holds. The fixtures are real traces of
`backend=naive experts=torch reduction=finalize quant=bf16 model=tiny trace=torch` on two gloo ranks,
16 tokens, rank 0, kept to their record_function ranges (tests/fixtures/traces/make_fixtures.py)."""

from __future__ import annotations

from pathlib import Path

from moebench.report.trace_markdown import to_markdown
from moebench.traces.metrics import summarize
from moebench.traces.model import PHASES, Range
from moebench.traces.torch_trace import parse_torch_trace

FIX = Path(__file__).parents[1] / "fixtures" / "traces"
# overlap=dispatch: the shared experts inside the dispatch (send -> received), prepare (the ids made
# local) after it; overlap=combine: the shared experts inside the combine, inside finalize
NAIVE_DISPATCH = FIX / "cpu_naive_dispatch_rank0_T16.json.gz"
NAIVE_COMBINE = FIX / "cpu_naive_combine_rank0_T16.json.gz"


def _table(md: str) -> list:
    """The phase table's rows as (phase cell, part of) after its header."""
    lines = md.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| phase |")) + 2
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows.append((cells[0], cells[1]))
    return rows


def test_the_phase_table_nests_each_phase_s_parts_under_it():
    """finalize beside its own parts could not be added up: its parts follow it, marked, with the
    phase they are part of, and the rows come in the order they start (the naive dispatch sends bf16
    and makes the ids local after it)."""
    s = summarize(parse_torch_trace(NAIVE_DISPATCH))
    md = to_markdown(s)
    assert _table(md) == [
        ("dispatch", "–"),
        ("└ shared_experts", "dispatch"),
        ("prepare", "–"),
        ("experts", "–"),
        ("finalize", "–"),
        ("└ weight_reduce", "finalize"),
        ("└ combine", "finalize"),
    ]
    assert (
        "rows in the order they start; └ part of X: inside X, its time counted in X's too; the rows without one "
        f"follow one another and add up to the layer, gaps aside — a sample: CPU {s.layer_cpu_us:.1f} µs\n"
    ) in md
    # what the legend says holds in every sample: the top-level rows fit in the sample, a part in its phase
    samples = {i: r.dur_us for i, r in parse_torch_trace(NAIVE_DISPATCH).sample_ranges()}
    for fig in s.per_sample:
        cpu = {ph: v["cpu_us"] for ph, v in fig["phases"].items() if v["cpu_us"] is not None}
        top = sum(cpu[p.name] for p in s.phases.values() if p.parent is None)
        assert 0.8 * samples[fig["sample"]] < top <= samples[fig["sample"]]
        for p in s.phases.values():
            if p.parent:
                assert cpu[p.name] <= cpu[p.parent], p.name


def test_a_part_of_a_part_names_its_own_phase():
    """overlap=combine: the shared experts run inside the combine (send -> received), itself part of finalize."""
    s = summarize(parse_torch_trace(NAIVE_COMBINE))
    assert {p.name: p.parent for p in s.phases.values()} == {
        "dispatch": None,
        "prepare": None,
        "experts": None,
        "finalize": None,
        "weight_reduce": "finalize",
        "combine": "finalize",
        "shared_experts": "combine",
    }
    assert ("└ shared_experts", "combine") in _table(to_markdown(s))


def test_a_gpu_trace_s_legend_gives_its_gpu_span_and_that_streams_overlap():
    s = summarize(parse_torch_trace(FIX / "synthetic_cuda.json"))
    md = to_markdown(s)
    assert ("└ combine", "finalize") in _table(md) and ("shared_experts", "–") in _table(md)
    assert "gaps aside (on the GPU, overlaps too) — a sample: CPU 400.0 µs, GPU span 285.0 µs" in md


def _r(name, a, b, thread="1/1"):
    return Range(name, float(a), float(b), thread)


def test_phase_tree_reads_nesting_per_thread_and_by_most_ranges():
    from moebench.traces.model import phase_tree

    ranges = [
        _r("finalize", 50, 90),
        _r("combine", 60, 80),
        _r("dispatch", 0, 20),
        _r("shared_experts", 10, 30),  # only partly inside the dispatch: not part of it
        _r("prepare", 5, 8, thread="1/2"),  # another thread's: not inside the dispatch either
        _r("experts", 30, 50),
    ]
    assert phase_tree(ranges) == [
        ("dispatch", None),
        ("prepare", None),
        ("shared_experts", None),
        ("experts", None),
        ("finalize", None),
        ("combine", "finalize"),
    ]
    # a phase is part of the phase that holds most of its ranges; ranges that hold each other by
    # turns (experts in prepare three times, prepare in experts twice) leave no loop
    turns = [_r("prepare", 0, 100)] + [_r("experts", 10 * i + 1, 10 * i + 2) for i in range(3)]
    turns += [_r("experts", 200, 300), _r("prepare", 210, 220), _r("prepare", 230, 240)]
    tree = phase_tree(turns)
    assert sorted(tree) == [("experts", "prepare"), ("prepare", None)]
    assert {name for name, _ in phase_tree(_r(p, i, i + 1) for i, p in enumerate(PHASES))} == set(PHASES)


def test_lanes_are_named_for_what_they_are():
    """`CPU 5448/5448` and `GPU dev0/s7` said nothing to a new reader: a host thread names itself and
    its process (the main thread as such), a GPU lane its GPU and stream, in the figure and the
    stream table alike; an nsys thread (a globalTid) reads as a torch trace's does."""
    from moebench.report.timeline import _lanes, _select
    from moebench.traces.files import load_traces

    (cpu,) = load_traces(NAIVE_DISPATCH)
    t0, t1, _, _, ranges, kernels = _select(cpu, None)
    assert [name for name, _, _ in _lanes(ranges, kernels, t0, t1)][0] == "host main thread (pid 11472)"
    (nsys,) = load_traces(FIX / "synthetic_nsys.sqlite")
    t0, t1, _, _, ranges, kernels = _select(nsys, None)
    names = [name for name, _, _ in _lanes(ranges, kernels, t0, t1)]
    assert names[0] == "host thread 4243 (pid 4242)"  # the fixture's PID, TID (make_fixtures.py)
    assert {"GPU 0 stream 7", "GPU 0 stream 20"} <= set(names)
    md = to_markdown(summarize(load_traces(FIX / "synthetic_cuda.json")[0]))
    assert "| GPU 0 stream 7 | 12 | 225.0 |" in md and "| GPU 0 stream 20 | 4 | 110.0 |" in md
    assert "dev0/s" not in md


def test_lane_labels():
    from moebench.traces.model import lane_label, thread_label

    assert thread_label("5448/5448") == "host main thread (pid 5448)"
    assert thread_label("5448/5460") == "host thread 5460 (pid 5448)"
    assert thread_label("71168954515") == "host thread 71168954515"  # another form: as it is
    assert lane_label("dev1/s20") == "GPU 1 stream 20" and lane_label("odd") == "odd"


def test_the_host_s_dispatch_is_drawn_with_the_gloo_collectives_it_waits_for():
    """A CPU run drew prepare after a dispatch of milliseconds, and nothing said why: that is the
    order the naive backend runs them in (it sends bf16 and makes the ids local on arrival), and the
    dispatch lasts until gloo's broadcasts, on threads of their own, have arrived. The figure draws
    those collectives in a lane below the host thread's, and the legend says what each phase holds."""
    from matplotlib.figure import Figure

    from moebench.report.timeline import _lanes, _legend, _select
    from moebench.traces.files import load_traces

    (trace,) = load_traces(NAIVE_DISPATCH)
    t0, t1, _, _, ranges, kernels = _select(trace, None)
    lanes = _lanes(ranges, kernels, t0, t1)
    assert [(name, rows) for name, _, rows in lanes] == [
        ("host main thread (pid 11472)", 2),  # the shared experts and finalize's parts below
        ("gloo threads (pid 11472)", 2),  # one row per gloo thread
    ]
    host = sorted((b[0], b[1], b[6]) for b in lanes[0][1] if b[7] == 0)  # (start, dur, phase) at the top
    assert [name for _, _, name in host] == ["dispatch", "prepare", "experts", "finalize"]
    (dispatch_start, dispatch_dur, _), (prepare_start, _, _) = host[:2]
    gloo = [(b[0], b[0] + b[1], b[6]) for b in lanes[1][1]]
    broadcasts = [(a, b) for a, b, op in gloo if op == "broadcast"]
    assert len(broadcasts) >= 2 and {op for *_, op in gloo} == {"broadcast", "all_reduce"}
    # the broadcasts run inside the dispatch, and the dispatch ends once the last has: prepare follows
    assert all(dispatch_start <= a and b <= dispatch_start + dispatch_dur for a, b in broadcasts)
    assert max(b for _, b in broadcasts) <= prepare_start
    fig = Figure()
    ax = fig.add_subplot()
    _legend(ax, lanes)
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert texts[:2] == ["prepare: quantize, local ids\n(before or after dispatch)", "dispatch: send → received"]
    assert "finalize: weight_reduce + combine" in texts and "combine: send → received" in texts
    # a CPU run has no kernels: no marks for them in its legend, only the gloo lane's communication
    assert texts[-1] == "communication" and "shared-expert kernel" not in texts


def test_gpu_streams_are_drawn_in_the_order_of_their_numbers():
    """Streams came in the order of their names' letters (s17 above s7); the stream table had them as numbers."""
    from moebench.report.timeline import _lanes, _select
    from moebench.traces.files import load_traces

    (trace,) = load_traces(FIX / "h200_allgather_rs_triton_combine_rank0_T4096.json.gz")
    t0, t1, _, _, ranges, kernels = _select(trace, None)
    gpu = [name for name, _, _ in _lanes(ranges, kernels, t0, t1) if name.startswith("GPU")]
    assert gpu == ["GPU 0 stream 7", "GPU 0 stream 17"]
    assert [st.lane for st in summarize(trace).streams] == ["dev0/s7", "dev0/s17"]

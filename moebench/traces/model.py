"""The trace representation shared by the torch-profiler and nsys parsers.

Both parsers produce a `Trace`: CPU-side annotated ranges (record_function or
NVTX), GPU activities (kernels, memcpy, memset) with the thread and time of the
CPU call that launched them, and GPU-side annotation ranges where the source has
them. `attribute()` then tags each GPU activity with the moebench phases whose
CPU range encloses its launch (innermost last), its `sample/<i>` (a layer sample)
or its ablation sample (`sample_noshared/<i>`: the layer without shared experts;
`sample_shared/<i>`: the shared experts alone) and its `combo/<key>`, so that every
metric downstream has one code path.

All times are µs on the trace's own clock (torch: µs since the epoch; nsys: ns
since session start / 1000); only differences are meaningful.
"""

from __future__ import annotations

import bisect
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Optional

# The phase names (NVTX domain `moebench` and torch.profiler.record_function).
PHASES = ("prepare", "dispatch", "experts", "weight_reduce", "finalize", "combine", "shared_experts")
DOMAIN = "moebench"
COMBO_PREFIX = "combo/"
SAMPLE_PREFIX = "sample/"
# ablation samples recorded after the layer samples in the same trace (kind -> range prefix)
ABLATION_PREFIXES = {"noshared": "sample_noshared/", "shared": "sample_shared/"}
# after a sample the host paced (the GPU passed its start before the host had enqueued it), an
# empty range `host_paced/<the sample's range>` (torch_trace.capture): its kernels may hold launch gaps
HOST_PACED_PREFIX = "host_paced/"
# a gloo collective's record_function range (`gloo:broadcast`, `gloo:all_reduce`): gloo runs it on
# threads of its own, so on the CPU the host's dispatch and combine ranges hold the wait for it
HOST_COLLECTIVE_PREFIX = "gloo:"
# trace=nsys: the worker's NVTX range around the timed work of one row, each one an nsys capture
CAPTURE_RANGE = "timed"
SHARED_PHASE = "shared_experts"

# Communication kernels (matched case-insensitively anywhere in the kernel name).
COMM_PATTERNS = (
    r"nccl",  # ncclDevKernel_*, ncclKernel_*
    r"deep_ep::",  # DeepEP intranode / internode / low-latency dispatch and combine
    r"pplx",  # pplx-kernels dispatch / combine
    r"\b(?:dispatch|combine)Kernel<",  # pplx-kernels' (anonymous namespace)::dispatchKernel<...>
    r"symm(etric)?_?mem",  # torch symmetric memory
    r"multimem",  # symmetric memory multimem all-reduce
    r"(one|two)_shot_all_reduce",
    r"cross_device_reduce",  # vLLM custom all-reduce
    r"nvshmem",
    r"Memcpy PtoP",  # peer-to-peer copies (torch names)
)
_COMM_RE = re.compile("|".join(f"(?:{p})" for p in COMM_PATTERNS), re.IGNORECASE)


def is_comm_kernel(name: str, pattern: Optional[re.Pattern] = None) -> bool:
    """True when a GPU activity's name is a communication kernel (NCCL, DeepEP, pplx, symm-mem)."""
    return bool((pattern or _COMM_RE).search(name))


@dataclass
class Range:
    """An annotated CPU range (record_function / NVTX push-pop), times in µs."""

    name: str
    start_us: float
    end_us: float
    thread: str  # "pid/tid" (torch; nsys: from its globalTid); thread_label names it

    @property
    def dur_us(self) -> float:
        return self.end_us - self.start_us


@dataclass
class Kernel:
    """One GPU activity (kernel, memcpy or memset), times in µs.

    `launch_thread` / `launch_us` locate the CPU launch call (None when the trace
    lacks it); `phases` (outermost first), `sample`, `ablation` and `combo` are
    filled by `attribute()`. `sample` is the index of the layer sample
    (`sample/<i>`); `ablation` is (kind, index) of an ablation sample
    (`sample_noshared/<i>` -> ("noshared", i), `sample_shared/<i>` -> ("shared", i)).
    """

    name: str
    start_us: float
    end_us: float
    device: int
    stream: int
    correlation: Optional[int] = None
    kind: str = "kernel"  # kernel | memcpy | memset
    launch_thread: Optional[str] = None
    launch_us: Optional[float] = None
    phases: tuple = ()
    sample: Optional[int] = None
    ablation: Optional[tuple] = None
    combo: Optional[str] = None
    comm: bool = False

    @property
    def dur_us(self) -> float:
        return self.end_us - self.start_us

    @property
    def lane(self) -> str:
        """The GPU lane as a key, "dev<d>/s<s>" (`lane_label` names it: 'GPU 0 stream 7')."""
        return f"dev{self.device}/s{self.stream}"

    @property
    def phase(self) -> Optional[str]:
        """Innermost enclosing moebench phase, or None."""
        return self.phases[-1] if self.phases else None

    @property
    def shared(self) -> bool:
        """Launched inside a `shared_experts` range (and not a communication kernel)."""
        return SHARED_PHASE in self.phases and not self.comm


@dataclass
class Trace:
    """One parsed trace file (one rank, one combination, one token count)."""

    source: str
    fmt: str  # "torch" | "nsys"
    ranges: list = field(default_factory=list)  # [Range], CPU side
    kernels: list = field(default_factory=list)  # [Kernel]
    gpu_ranges: list = field(default_factory=list)  # [(name, start_us, end_us, lane)] GPU-side annotations
    notes: list = field(default_factory=list)  # what the parser had to skip or guess

    def phase_ranges(self) -> list:
        return [r for r in self.ranges if r.name in PHASES]

    def sample_ranges(self, prefix: str = SAMPLE_PREFIX) -> list:
        """`<prefix><i>` ranges sorted by start, as (index, Range); by default the layer samples `sample/<i>`."""
        out = []
        for r in self.ranges:
            if r.name.startswith(prefix):
                try:
                    out.append((int(r.name[len(prefix) :]), r))
                except ValueError:
                    continue
        return sorted(out, key=lambda x: x[1].start_us)

    def ablation_ranges(self, kind: str) -> list:
        """Ablation sample ranges of `kind` ("noshared" | "shared") sorted by start, as (index, Range)."""
        return self.sample_ranges(ABLATION_PREFIXES[kind])

    def host_paced(self) -> list:
        """The sample ranges (`sample/<i>`, `sample_noshared/<i>`, ...) the capture marked host-paced."""
        return sorted({r.name[len(HOST_PACED_PREFIX) :] for r in self.ranges if r.name.startswith(HOST_PACED_PREFIX)})

    def has_ablation(self) -> bool:
        """Whether the trace holds both ablation families (`sample_noshared/<i>` and `sample_shared/<i>`)."""
        return all(self.ablation_ranges(kind) for kind in ABLATION_PREFIXES)

    def combos(self) -> list:
        return sorted({r.name[len(COMBO_PREFIX) :] for r in self.ranges if r.name.startswith(COMBO_PREFIX)})

    def t0_us(self) -> float:
        """Earliest timestamp in the trace (µs), the origin of relative times."""
        starts = [r.start_us for r in self.ranges] + [k.start_us for k in self.kernels]
        starts += [k.launch_us for k in self.kernels if k.launch_us is not None]
        return min(starts) if starts else 0.0


def thread_label(thread: str) -> str:
    """A host thread (`Range.thread`, "pid/tid") as tables and figures name it: 'host main thread
    (pid 5448)' where its id is the process's (Linux's main thread), else 'host thread 5460 (pid
    5448)'; an id of another form as 'host thread <id>'."""
    pid, _, tid = thread.partition("/")
    if not (pid.isdigit() and tid.isdigit()):
        return f"host thread {thread}"
    return f"host main thread (pid {pid})" if pid == tid else f"host thread {tid} (pid {pid})"


def lane_label(lane: str) -> str:
    """A GPU lane (`Kernel.lane`, "dev<d>/s<s>") as tables and figures name it: 'GPU 0 stream 7';
    a lane of another form as it is."""
    m = re.fullmatch(r"dev(-?\d+)/s(-?\d+)", lane)
    return f"GPU {m[1]} stream {m[2]}" if m else lane


def nesting(ranges: Iterable[Range]) -> list:
    """(range, the innermost of `ranges` on its thread that holds it whole, or None) for each of
    `ranges`, in order of start (at equal starts the longer first, as its parent). A range that only
    partly overlaps another (an open send -> receive range closed late) is not inside it."""
    out: list = []
    open_: dict = {}  # thread -> ranges started and not known to have ended
    for r in sorted(ranges, key=lambda r: (r.start_us, -r.end_us)):
        stack = open_.setdefault(r.thread, [])
        while stack and stack[-1].end_us < r.start_us:
            stack.pop()
        out.append((r, next((p for p in reversed(stack) if r.end_us <= p.end_us), None)))
        stack.append(r)
    return out


def phase_tree(ranges: Iterable[Range]) -> list:
    """[(phase, the phase it is part of or None)] of the phase ranges among `ranges`, in reading
    order: the layer's top-level phases in the order they first start, each followed by its parts
    (in the order they start, theirs after each). A phase is part of the phase whose range holds most
    of its ranges (`nesting`; finalize holds weight_reduce and combine, an overlapped dispatch or
    combine the shared experts); the top-level phases follow one another through the layer."""
    votes: dict = {}
    for r, p in nesting(r for r in ranges if r.name in PHASES):
        votes.setdefault(r.name, Counter())[p.name if p is not None else None] += 1
    parents = {name: c.most_common(1)[0][0] for name, c in votes.items()}  # votes keeps first-start order
    for name in parents:  # a loop of parents (ranges that hold each other by turns) is cut
        seen, p = {name}, parents[name]
        while p is not None and p not in seen:
            seen.add(p)
            p = parents[p]
        if p == name:
            parents[name] = None
    out: list = []

    def add(parent) -> None:
        for name in parents:
            if parents[name] == parent:
                out.append((name, parent))
                add(name)

    add(None)
    return out


def _enclosing(ranges: Iterable[Range], queries: list) -> dict:
    """For (key, thread, t_us) queries: key -> names of the ranges on `thread` enclosing t, outermost first.

    A sweep over open/query/close points per thread; at equal times ranges open
    before queries and queries come before closes, so a launch at the very edge of
    a range belongs to it.
    """
    points: dict = {}
    for r in ranges:
        # outer (longer) ranges open first at equal start so the stack stays nested
        points.setdefault(r.thread, []).append((r.start_us, 0, -r.end_us, r))
        points.setdefault(r.thread, []).append((r.end_us, 2, 0.0, r))
    for key, thread, t in queries:
        points.setdefault(thread, []).append((t, 1, 0.0, key))
    out = {}
    for pts in points.values():
        pts.sort(key=lambda p: (p[0], p[1], p[2]))
        active: list = []
        for _, what, _, obj in pts:
            if what == 0:
                active.append(obj)
            elif what == 2:
                # non-nested (start/end) ranges may close out of order
                for i in range(len(active) - 1, -1, -1):
                    if active[i] is obj:
                        del active[i]
                        break
            else:
                out[obj] = tuple(r.name for r in active)
    return out


def attribute(trace: Trace, comm_pattern: Optional[re.Pattern] = None) -> Trace:
    """Tag every GPU activity with its phases, sample index, combo key and comm flag (in place).

    Phases: the moebench phase ranges on the launching thread that enclose the
    launch call, outermost first (so `kernel.phase`, the last, is the innermost).
    Sample: the `sample/<i>` range containing the launch time (any thread; samples
    never overlap within a rank); ablation: likewise for the `sample_noshared/<i>`
    and `sample_shared/<i>` ranges. Activities without a launch record keep no phase
    and are assigned to samples by their own start time.
    """
    structural = [r for r in trace.ranges if r.name in PHASES or r.name.startswith(COMBO_PREFIX)]
    queries = [(i, k.launch_thread, k.launch_us) for i, k in enumerate(trace.kernels) if k.launch_us is not None]
    enclosing = _enclosing(structural, queries)
    samples = trace.sample_ranges()
    starts = [r.start_us for _, r in samples]
    ablations = []
    for kind in ABLATION_PREFIXES:
        rs = trace.ablation_ranges(kind)
        if rs:
            ablations.append((kind, rs, [r.start_us for _, r in rs]))
    for i, k in enumerate(trace.kernels):
        names = enclosing.get(i, ())
        k.phases = tuple(n for n in names if n in PHASES)
        combos = [n for n in names if n.startswith(COMBO_PREFIX)]
        k.combo = combos[-1][len(COMBO_PREFIX) :] if combos else None
        k.comm = is_comm_kernel(k.name, comm_pattern)
        t = k.launch_us if k.launch_us is not None else k.start_us
        k.sample = sample_at(samples, starts, t)
        k.ablation = None
        if k.sample is None:
            for kind, rs, st in ablations:
                j = sample_at(rs, st, t)
                if j is not None:
                    k.ablation = (kind, j)
                    break
    return trace


def sample_at(samples: list, starts: list, t_us: float) -> Optional[int]:
    """Index of the range of `samples` ((index, Range) sorted by start, `starts` their starts)
    containing t (µs), or None."""
    j = bisect.bisect_right(starts, t_us) - 1
    if j >= 0 and samples[j][1].start_us <= t_us <= samples[j][1].end_us:
        return samples[j][0]
    return None

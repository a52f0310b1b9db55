"""torch.profiler capture and the Chrome/Perfetto JSON trace parser.

Capture: `capture(fn, path, warmup, samples, combo_key, barrier, ablation)` runs `fn`
under `torch.profiler.profile` (CPU, plus CUDA when available), one `sample/<i>` range
per call inside `combo/<key>`, then, when `ablation` gives them, as many samples of the
layer without its shared experts (`sample_noshared/<i>`) and of the shared experts
alone (`sample_shared/<i>`) — what the stretch-aware overlap of metrics.py needs — and
writes `export_chrome_trace` to `path` (gzipped when it ends in `.gz`). Paths follow
`trace_path(trace_dir, combo_key, rank, tokens)`.

Parse: `parse_torch_trace(path, max_mb)` reads what torch (Kineto) writes (refusing, with
one line, a trace over `max_mb` MB once inflated, checked while inflating, or JSON nested
deeper than Python's recursion limit): `traceEvents`
with `ph: "X"` complete events, `ts`/`dur` in µs;
- `cat: "user_annotation"`: record_function ranges on CPU threads (pid, tid);
- `cat: "gpu_user_annotation"`: the same names on GPU lanes (pid = device, tid = stream);
- `cat: "kernel" | "gpu_memcpy" | "gpu_memset"`: GPU activities, args `device`,
  `stream`, `correlation`;
- `cat: "cuda_runtime" | "cuda_driver"`: launch calls (`cudaLaunchKernel`,
  `cuLaunchKernelEx`, `cudaGraphLaunch`, ...), args `correlation`;
- `ph: "s"/"f"`, `cat: "ac2g"`: launch -> GPU flow arrows (id = correlation), used
  only when a GPU event lacks its `correlation` arg.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
import shutil
import sys
import tempfile
import zlib
from pathlib import Path
from typing import Callable, Optional

from moebench.traces.model import Kernel, Range, Trace, attribute
from moebench.traces.nsys import DEFAULT_MAX_TRACE_MB
from moebench.util.safe_write import open_write

_GPU_KIND = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
_LAUNCH_CATS = ("cuda_runtime", "cuda_driver", "runtime", "driver")


def trace_path(trace_dir, combo_key: str, rank: int, tokens: int, gzip_: bool = False) -> Path:
    """`{trace_dir}/{combo_key}/rank{rank}_T{tokens}.json[.gz]`."""
    name = f"rank{rank}_T{tokens}.json" + (".gz" if gzip_ else "")
    return Path(trace_dir) / combo_key / name


def capture(
    fn: Callable[[], object],
    path,
    warmup: int = 1,
    samples: int = 1,
    combo_key: Optional[str] = None,
    barrier: Optional[Callable[[], object]] = None,
    mark_samples: bool = True,
    cuda: Optional[bool] = None,
    ablation: Optional[dict] = None,
    pace=None,
) -> Path:
    """Run `fn` `warmup` times untraced, then `samples` times under torch.profiler; write the trace.

    Each traced call runs inside `sample_range(i)` (unless `mark_samples=False`,
    for an `fn` that marks its own samples), all inside `combo_range(combo_key)`
    when a key is given; `barrier` (e.g. the ranks' barrier) runs before each
    sample, outside its range. ablation: {"noshared": callable, "shared": callable}
    (either may be absent): after the layer samples, `samples` calls of each (in that
    order), inside `ablation_range(kind, i)` (`sample_noshared/<i>`,
    `sample_shared/<i>`), warmed up like `fn` and with the barrier before each; every
    rank must pass the same kinds so that the barriers match. cuda: also record CUDA
    activity (default: when CUDA is available). pace (measure/samples.py PaceCount):
    told when each sample starts and once it is enqueued; a sample the host paced (the GPU
    passed its start before the host had enqueued it) gets a `host_paced/<its range>` range
    after it, which model.py reads back, so that the trace says which of its samples hold
    the host's launch gaps. Returns the written path (a `.gz` suffix writes gzipped JSON).
    """
    import functools

    import torch
    from torch.profiler import ProfilerActivity, profile

    from moebench.traces.model import ABLATION_PREFIXES, HOST_PACED_PREFIX, SAMPLE_PREFIX
    from moebench.traces.nvtx import ablation_range, combo_range, named_range, sample_range

    ablation = {k: f for k, f in (ablation or {}).items() if f is not None}
    unknown = set(ablation) - set(ABLATION_PREFIXES)
    if unknown:
        raise ValueError(f"ablation kinds {sorted(unknown)}; valid: {', '.join(ABLATION_PREFIXES)}")
    # (the range one sample of it runs in, the callable, the ranges' prefix)
    runs: list[tuple[Callable[[int], contextlib.AbstractContextManager], Callable, str]] = [
        (lambda i: sample_range(i) if mark_samples else contextlib.nullcontext(), fn, SAMPLE_PREFIX)
    ]
    runs += [
        (functools.partial(ablation_range, kind), ablation[kind], ABLATION_PREFIXES[kind])
        for kind in ABLATION_PREFIXES
        if kind in ablation
    ]
    if cuda is None:
        cuda = torch.cuda.is_available()
    for _, f, _ in runs:
        for _ in range(warmup):
            f()
    if cuda:
        torch.cuda.synchronize()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    outer = combo_range(combo_key) if combo_key is not None else contextlib.nullcontext()
    with quietly(profile(activities=activities, record_shapes=False)) as prof:
        with outer:
            for n, (mark, f, prefix) in enumerate(runs):
                if n and cuda:  # an ablation family starts on an idle GPU, not beside the tail of the last one
                    torch.cuda.synchronize()
                for i in range(samples):
                    if barrier is not None:
                        barrier()
                    if pace is not None:
                        pace.started()
                    with mark(i):
                        f()
                    if pace is not None and pace.enqueued():
                        with named_range(f"{HOST_PACED_PREFIX}{prefix}{i}"):
                            pass
        if cuda:
            torch.cuda.synchronize()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)  # the caller made it a real folder (safe_dir)
    # torch writes the export by name, following links: into a private folder first, then
    # copied to `path` without following one (moebench/util/safe_write.py)
    with tempfile.TemporaryDirectory(prefix="moebench-trace-") as tmp:
        raw = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(raw)
        with open(raw, "rb") as src, open_write(path) as out:
            if path.name.endswith(".gz"):
                with gzip.GzipFile(filename=path.name[:-3], mode="wb", fileobj=out) as dst:
                    shutil.copyfileobj(src, dst)
            else:
                shutil.copyfileobj(src, out)
    return path


# a note Kineto writes to stderr each time a profiler starts or stops ('USDT:2026-12-08 00:44:59
# 9005:9005 SyncActivityProfilerHandler.cpp:52] profiler_start'), and its stage notes
KINETO_NOTE = re.compile(r"(USDT|STAGE):\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ \w+\.cpp:\d+\] ")


@contextlib.contextmanager
def kineto_notes_dropped():
    """fd 2 into a temporary file for the block, then every line of it but Kineto's notes (KINETO_NOTE)
    written to stderr: a warning or an error still shows. KINETO_LOG_LEVEL cannot drop the notes
    alone: their level (USDT) ranks above ERROR, so a level that hides them hides the errors too."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with tempfile.TemporaryFile() as tmp:
            os.dup2(tmp.fileno(), 2)
            try:
                yield
            finally:
                os.dup2(saved, 2)
                tmp.seek(0)
                text = tmp.read().decode(errors="replace")
                kept = "".join(line for line in text.splitlines(keepends=True) if not KINETO_NOTE.match(line))
                if kept:
                    sys.stderr.write(kept)
                    sys.stderr.flush()
    finally:
        os.close(saved)


@contextlib.contextmanager
def quietly(prof):
    """`prof` (a torch.profiler.profile) entered and left without Kineto's notes on stderr (a line
    each start and stop, in every traced row's output): only its start and stop are filtered, never
    the traced work."""
    with kineto_notes_dropped():
        prof.__enter__()
    try:
        yield prof
    finally:
        with kineto_notes_dropped():
            prof.__exit__(None, None, None)


def _read_capped(path: Path, max_mb: Optional[float]) -> bytes:
    """The bytes of a file, inflated if `.gz`, read in chunks: ValueError as soon as they pass
    `max_mb` MB, so that a small gzip that inflates to gigabytes is refused before it fills memory."""
    limit = None if max_mb is None else int(max_mb * 1e6)
    opener = gzip.open if path.name.endswith(".gz") else open
    chunks, total = [], 0
    try:
        with opener(path, "rb") as f:
            while True:
                chunk = f.read(1 << 20)
                if not chunk:
                    break
                total += len(chunk)
                if limit is not None and total > limit:
                    raise ValueError(
                        f"{path}: more than {max_mb:g} MB{' inflated' if opener is gzip.open else ''}, "
                        "the limit on a trace (--max-trace-mb raises it)"
                    )
                chunks.append(chunk)
    except (OSError, EOFError, zlib.error) as e:
        raise ValueError(f"{path}: not a readable JSON trace ({e})") from e
    return b"".join(chunks)


def load_json(path, max_mb: Optional[float] = DEFAULT_MAX_TRACE_MB) -> dict:
    """The JSON object of a `.json` or `.json.gz` trace (ValueError when unreadable, larger than
    `max_mb` MB once inflated (None: no limit), or nested deeper than Python's recursion limit)."""
    path = Path(path)
    raw = _read_capped(path, max_mb)
    try:
        data = json.loads(raw)
    except RecursionError:
        raise ValueError(
            f"{path}: JSON nested too deeply to be a Chrome/Perfetto trace (over ~{sys.getrecursionlimit()} levels)"
        ) from None
    except MemoryError:
        raise ValueError(f"{path}: too large to parse in this machine's memory (--max-trace-mb lower)") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a readable JSON trace ({e})") from e
    if isinstance(data, list):  # the bare-array Chrome format
        data = {"traceEvents": data}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise ValueError(f"{path}: no 'traceEvents' list: not a Chrome/Perfetto trace")
    return data


def _num(v, default=None):
    try:
        return float(v)
    except (TypeError, ValueError):
        return default


def _int(v, default=None):
    """int(v); also the trailing number of labels like "stream 7" (older Kineto lanes)."""
    try:
        return int(v)
    except (TypeError, ValueError):
        m = re.search(r"(-?\d+)\s*$", v) if isinstance(v, str) else None
        return int(m.group(1)) if m else default


def _device_stream(ev: dict, args: dict) -> tuple:
    """(device, stream) of a GPU-lane event: its args, else its lane (pid = device, tid = stream)."""
    return _int(args.get("device"), _int(ev.get("pid"), 0)), _int(args.get("stream"), _int(ev.get("tid"), 0))


def parse_torch_trace(path, max_mb: Optional[float] = DEFAULT_MAX_TRACE_MB) -> Trace:
    """Parse a torch-profiler Chrome trace into an attributed `Trace` (times in µs); ValueError for
    a trace over `max_mb` MB inflated or malformed (`load_json`)."""
    data = load_json(path, max_mb)
    trace = Trace(source=str(path), fmt="torch")
    launches: dict = {}  # correlation -> (thread, ts)
    flows_out: dict = {}  # flow id -> (thread, ts) of the launch side
    flows_in: dict = {}  # (pid, tid, ts) of the GPU side -> flow id
    gpu_events = []
    for ev in data["traceEvents"]:
        if not isinstance(ev, dict):
            continue
        ph, cat = ev.get("ph"), ev.get("cat", "")
        if ph in ("s", "f") and cat == "ac2g":
            key = ev.get("id")
            if ph == "s":
                flows_out[key] = (f"{ev.get('pid')}/{ev.get('tid')}", _num(ev.get("ts"), 0.0))
            else:
                flows_in[(str(ev.get("pid")), str(ev.get("tid")), _num(ev.get("ts")))] = key
            continue
        if ph != "X":
            continue
        ts, dur = _num(ev.get("ts")), _num(ev.get("dur"), 0.0)
        if ts is None:
            continue
        args = ev.get("args") or {}
        name = str(ev.get("name", ""))
        if cat == "user_annotation":
            trace.ranges.append(Range(name, ts, ts + dur, f"{ev.get('pid')}/{ev.get('tid')}"))
        elif cat == "gpu_user_annotation":
            dev, stream = _device_stream(ev, args)
            trace.gpu_ranges.append((name, ts, ts + dur, f"dev{dev}/s{stream}"))
        elif cat in _GPU_KIND:
            gpu_events.append((ev, cat, name, ts, dur, args))
        elif cat in _LAUNCH_CATS:
            corr = _int(args.get("correlation"))
            if corr is not None:
                launches[corr] = (f"{ev.get('pid')}/{ev.get('tid')}", ts)
    missing = 0
    for ev, cat, name, ts, dur, args in gpu_events:
        corr = _int(args.get("correlation"))
        launch = launches.get(corr) if corr is not None else None
        if launch is None:
            key = flows_in.get((str(ev.get("pid")), str(ev.get("tid")), ts))
            launch = flows_out.get(key) if key is not None else None
        if launch is None:
            missing += 1
        dev, stream = _device_stream(ev, args)
        trace.kernels.append(
            Kernel(
                name=name,
                start_us=ts,
                end_us=ts + dur,
                device=dev,
                stream=stream,
                correlation=corr,
                kind=_GPU_KIND[cat],
                launch_thread=launch[0] if launch else None,
                launch_us=launch[1] if launch else None,
            )
        )
    if missing:
        trace.notes.append(f"{missing} GPU activities without a launch record: no phase for them")
    trace.kernels.sort(key=lambda k: k.start_us)
    return attribute(trace)

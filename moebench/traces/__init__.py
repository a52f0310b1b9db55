"""Traces: NVTX / record_function phase ranges, torch-profiler and nsys capture, parsing, overlap.

Harness entry points (imported lazily, so `moebench trace` does not pay for torch):
- `make_phase_recorder(nvtx, record_function, cuda_events, device)`, `combo_range(key)`,
  `sample_range(i)`, `ablation_range(kind, i)`        (moebench.traces.nvtx)
- `capture(fn, path, warmup, ..., ablation={"noshared": f, "shared": g})`,
  `trace_path(trace_dir, combo_key, rank, tokens)`
                                                      (moebench.traces.torch_trace)
- `nsys_available()`, `nsys_command(argv, output, combo_key)`, `NSYS_MISSING`, `record_capture`
                                                      (moebench.traces.nsys)
- `resolve_nsys_rows(run_dir)`, `import_command(target)`, `nsys_info()`
                                                      (moebench.traces.nsys_import)
- `nvtx_emitter()`, `nvtx_api()`: which API emits NVTX (moebench.traces.nvtx)
- `overlap_from_trace(path)`, `trace_row(path)` (moebench.traces.analyze);
  `summarize_file(path)` -> [TraceSummary]; `.as_row()` gives `trace_overlap_fraction` etc.
- `trace_command(target, plot, out, max_trace_mb, import_from)`
                                                      (moebench.traces.cli)
"""
import importlib

_EXPORTS = {
    "find_traces": "cli", "load_traces": "cli", "summarize_file": "cli", "trace_command": "cli",
    "TraceSummary": "metrics", "stretch_aware": "metrics", "summarize": "metrics", "to_markdown": "metrics",
    "ABLATION_PREFIXES": "model", "COMM_PATTERNS": "model", "DOMAIN": "model", "PHASES": "model",
    "Kernel": "model", "Range": "model", "Trace": "model", "is_comm_kernel": "model",
    "NSYS_MISSING": "nsys", "nsys_available": "nsys", "nsys_command": "nsys", "parse_nsys_sqlite": "nsys",
    "record_capture": "nsys",
    "import_command": "nsys_import", "nsys_info": "nsys_import", "resolve_nsys_rows": "nsys_import",
    "PhaseRecorder": "nvtx", "ablation_range": "nvtx", "combo_range": "nvtx", "make_phase_recorder": "nvtx",
    "nvtx_api": "nvtx", "nvtx_emitter": "nvtx", "sample_range": "nvtx",
    "capture": "torch_trace", "parse_torch_trace": "torch_trace", "trace_path": "torch_trace",
    "plot_timeline": "timeline",
    "overlap_from_trace": "analyze", "trace_row": "analyze",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'moebench.traces' has no attribute {name!r}")
    return getattr(importlib.import_module(f"moebench.traces.{mod}"), name)

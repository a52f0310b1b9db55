"""The trace model and what reads or records traces, below every room that uses them (the
ranks record ranges and captures, the rows take trace figures, reports and `moebench trace`
read them): model.py (kernels, ranges, the trace), metrics.py and matched.py (overlap and
critical-path figures), analyze.py (a row's trace figures), files.py (which files are traces,
loading them), nvtx.py (NVTX / record_function ranges, the phase recorder), torch_trace.py
(torch-profiler capture and parsing), nsys.py (Nsight Systems: the launcher prefix, captures,
exports)."""

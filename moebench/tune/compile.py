"""Compile a batch of tile configs in parallel before timing them.

Compiling dominates a tune (each config is two GEMM kernels, ~1-7 s of one core each
on sm_90; the experts' other kernels are shared), and Triton compiles in the process
that launches. So a batch goes in two steps:

  record   the experts run once per config with Triton's `jit_cache_hook` set and
           every launch turned into a warm-up: a kernel missing from the in-memory
           cache is recorded (its exact specialization: argument types,
           16-divisibility, constexprs, options, as the real launch computes them),
           none compiles and none runs;
  compile  a pool of CPU processes compiles the recorded kernels with the target of
           the GPU, writing Triton's on-disk cache; the timing loop's first launch of
           each config then loads it from there (`Stats.hits`, `Stats.misses` say
           whether it did).

The workers need no GPU. They rebuild each kernel's source the way
`JITFunction.preload` does from the hook's specialization data.
"""

from __future__ import annotations

import importlib
import json
import multiprocessing
import os
import signal
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Optional, Sequence


@dataclass
class Stats:
    kernels: int = 0  # compiled by the pool
    wall_s: float = 0.0
    core_s: float = 0.0  # summed compile time of the workers
    errors: list = field(default_factory=list)
    hits: int = 0  # launches that loaded a kernel from the disk cache
    misses: int = 0  # launches that had to compile in the timing process

    def add(self, other: "Stats") -> None:
        self.kernels += other.kernels
        self.wall_s += other.wall_s
        self.core_s += other.core_s
        self.errors += other.errors

    def summary(self) -> str:
        s = f"{self.kernels} kernels compiled in {self.wall_s:.1f} s ({self.core_s:.0f} core-s)"
        if self.hits or self.misses:
            s += f"; timing loaded {self.hits} from the cache, compiled {self.misses} itself"
        return s + (f"; {len(self.errors)} failed to compile" if self.errors else "")


def available() -> bool:
    """Whether this Triton has the hooks used here (3.4+) and kernels are JIT-compiled."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return False
    try:
        from triton import knobs

        return hasattr(knobs.runtime, "jit_cache_hook") and hasattr(knobs.compilation, "listener")
    except ImportError:
        return False


class Recorder:
    """Inside `with Recorder() as r:` no Triton kernel launches: those missing from
    Triton's memory cache are recorded in r.jobs (module, qualname, specialization
    data) instead of compiled, and loaded ones are skipped too, as they would run on the
    outputs of the skipped ones (an activation kernel reading an alignment kernel's
    unwritten row ids can fault). Torch's own ops still run, on those unwritten buffers."""

    def __init__(self):
        self.jobs: dict[str, tuple[str, str, str]] = {}

    def _hook(self, *, key, repr, fn, compile, is_manual_warmup, already_compiled):  # Triton's names
        spec = compile["specialization_data"]
        self.jobs.setdefault(spec, (fn.module, fn.name, spec))
        return True  # skip the compile (and so the launch)

    def __enter__(self):
        from triton import knobs
        from triton.runtime.jit import JITFunction

        self._old = knobs.runtime.jit_cache_hook
        knobs.runtime.jit_cache_hook = self._hook
        self._run = run = JITFunction.run
        # every launch becomes a warm-up: compile (here: record) if missing, never launch
        JITFunction.run = lambda fn, *args, grid, warmup, **kw: run(fn, *args, grid=grid, warmup=True, **kw)
        return self

    def __exit__(self, *exc):
        from triton import knobs
        from triton.runtime.jit import JITFunction

        knobs.runtime.jit_cache_hook = self._old
        JITFunction.run = self._run
        return False


class HitCounter:
    """Counts the kernels the timing process loaded from the disk cache or compiled."""

    def __init__(self, stats: Stats):
        self.stats = stats

    def _listen(self, *, src, metadata, metadata_group, times, cache_hit):
        if cache_hit:
            self.stats.hits += 1
        else:
            self.stats.misses += 1

    def __enter__(self):
        from triton import knobs

        self._old = knobs.compilation.listener
        knobs.compilation.listener = self._listen
        return self

    def __exit__(self, *exc):
        from triton import knobs

        knobs.compilation.listener = self._old
        return False


def _init_worker() -> None:
    # Ctrl-C (or a time limit's SIGINT) is the tuning process's to handle: it stores what
    # it has and shuts the pool down
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        os.nice(10)  # below the timing process, if it shares the cores
    except OSError:
        pass


def compile_job(module: str, qualname: str, spec: str, target: tuple) -> tuple[float, str]:
    """Compile one recorded kernel for `target` (backend, arch, warp size) into Triton's
    disk cache: (seconds, error or "")."""
    t0 = time.perf_counter()
    try:
        import triton
        import triton.language as tl
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        from triton.runtime.jit import convert_to_tuple_if_list

        fn = importlib.import_module(module)
        for part in qualname.split("."):
            fn = getattr(fn, part)
        d = json.loads(spec)
        constexprs = {
            tuple(k): tl.dtype(v)
            if tl.dtype.is_dtype(v)
            else tl.constexpr(v["constexpr"])
            if isinstance(v, dict) and "constexpr" in v
            else v
            for k, v in zip(d["constant_keys"], d["constant_vals"], strict=True)
        }
        attrs = dict(zip(map(tuple, d["attrs_keys"]), d["attrs_vals"], strict=True))
        signature = {k: convert_to_tuple_if_list(v) for k, v in d["signature"].items()}
        options = {k: tuple(v) if isinstance(v, list) else v for k, v in d["options"].items()}
        src = ASTSource(fn, signature, constexprs, attrs)
        triton.compile(src, target=GPUTarget(*target), options=options)
        return time.perf_counter() - t0, ""
    except Exception as e:  # noqa: BLE001 (reported; the timing loop then meets the same error at launch)
        return time.perf_counter() - t0, f"{type(e).__name__}: {str(e)[:300]}"


def _run(job) -> tuple[float, str]:
    return compile_job(*job)


class Pool:
    """A process pool for `compile`, started once (workers import torch and triton)."""

    def __init__(self, workers: int):
        self.workers = max(1, int(workers))
        self._ex: Optional[ProcessPoolExecutor] = None
        self.broken = ""  # why the pool stopped (the timing process then compiles itself)

    def compile(self, jobs: Sequence[tuple[str, str, str]], target: tuple) -> Stats:
        st = Stats()
        if not jobs or self.broken:
            return st
        t0 = time.perf_counter()
        try:
            if self._ex is None:
                self._ex = ProcessPoolExecutor(
                    self.workers, mp_context=multiprocessing.get_context("spawn"), initializer=_init_worker
                )
            for (_, name, _), (sec, err) in zip(
                jobs, self._ex.map(_run, [(*j, tuple(target)) for j in jobs]), strict=True
            ):
                st.kernels += 1
                st.core_s += sec
                if err:
                    st.errors.append(f"{name}: {err}")
        except Exception as e:  # noqa: BLE001 (the pool only saves time: any failure of it, e.g. a worker out of memory, leaves the compiling to the timing loop)
            self.broken = f"{type(e).__name__}: {e}"
            st.errors.append(f"pool: {self.broken}")
            self.close()
        st.wall_s = time.perf_counter() - t0
        return st

    def close(self) -> None:
        if self._ex is not None:
            try:
                self._ex.shutdown(wait=True, cancel_futures=True)
            finally:
                self._ex = None


def current_target() -> tuple:
    """(backend, arch, warp size) of the current GPU, as Triton compiles for it."""
    from triton.runtime import driver

    t = driver.active.get_current_target()
    return (t.backend, t.arch, t.warp_size)


def default_workers(num_gpus: int = 1) -> int:
    """CPU cores a GPU's tune may compile on: all but one, shared between the GPUs."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, (cores - num_gpus) // max(1, num_gpus))

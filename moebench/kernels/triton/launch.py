"""Launch a @triton.jit kernel through its compiled handle (issue #34: host enqueue time).

`fn[grid](*args)` walks Triton's JIT path on every call: argument binding and
specialization, a string cache key, knob reads, launch metadata. `launch(fn, grid, ...)`
does that once per specialization: the first call of a key goes through the JIT (which
compiles if needed and returns the CompiledKernel), later calls of the same key call
`CompiledKernel.run` directly, as JITFunction.run itself does after its cache lookup.

The key (`spec_key`) is at least as fine as Triton's specialization, so a key never
maps to a binary compiled for other arguments:
  tensor       dtype, data_ptr % 16 == 0                    (Triton: *dtype, "D")
  int          the value (`arg_key`: == 1, % 16 == 0,       (constexpr 1, "D", i32 / i64 / u64)
               fits i32, >= 2**63 is what Triton reads)
  bool, float  the type                                     (u1, fp32: not specialized)
  None         None                                         (constexpr None)
  descriptor   base dtype, block shape, padding, rank;     (tensordesc<dtype[block]>; Gluon's:
               Gluon's also its layout as Triton writes it  tensordesc<dtype[block],layout>)
  constexpr    the value and its type (False == 0 in Python, not in Triton's key)
plus the launch options (num_warps, num_stages, ...) and the device. Per call site
(positional count, keyword names in order: `_Site`) the key is built flat (`site_key_args`): the
keywords' values and types, the positional arguments as above, no per-parameter binding;
the constexprs' and defaults' values a key implies are kept with its binary (on the CPU,
launch stubbed: ~9.5 -> ~6 µs a fused_moe_kernel launch, results/host_python). A site with
a constexpr given positionally, a runtime parameter by keyword, or an unknown keyword keys
through `bind` / `spec_key` (the same partition: tests/kernels/test_triton_launch.py). Any other
argument type, an unhashable constexpr, a kernel with pre-run hooks or anything but a JITFunction
(the interpreter's kernels, under TRITON_INTERPRET=1; an autotuner, whose configs stay its
own) takes the normal launch.
The Gluon kernels (`@gluon.jit`: a JITFunction subclass) launch here as the Triton ones do; the launcher's
C entry and tensor descriptors on it: launch_entry.py.

Not re-read per launch (snapshot at a key's first launch): TRITON_DEBUG and Triton's
instrumentation mode; the launch hooks (profilers) are read on every launch.

MOEBENCH_TRITON_FASTLAUNCH=0 turns the fast path off (read once; `set_enabled` for tests), as
does a Triton other than the 3.6 whose launch convention this copies (KNOWN_TRITON).
"""

from __future__ import annotations

import os
from typing import Any, Optional

import torch

from .launch_entry import direct as c_entry
from .launch_entry import expand_descriptors, layout_text

try:  # the interpreter's kernels are not JITFunctions: they take the plain launch
    from triton.runtime.jit import JITFunction
except ImportError:  # pragma: no cover (triton always has it)
    JITFunction = None  # no fast path

ENV = "MOEBENCH_TRITON_FASTLAUNCH"
_UNKEYED = object()  # an argument spec_key cannot key: the JIT launch
MAX_KEYS = 4096  # per kernel: (shapes x alignments x constexprs) seen; cleared when full
_enabled: Optional[bool] = None
_RUNTIME: Optional[tuple] = None  # _runtime()
# launches by path (GPU tests check them); direct: of the handle's, through the launcher's C entry;
# fills: tensor descriptors the handle path filled (a CUtensorMap each; the rest reuse a kept one)
stats = {"handle": 0, "jit": 0, "direct": 0, "fills": 0}
# the Triton versions whose JITFunction.run / CompiledKernel.run calling convention this
# module copies (read from 3.6's runtime/jit.py); on others every launch takes the JIT
KNOWN_TRITON = ("3.6.",)


def enabled() -> bool:
    """Whether launch() may take the compiled handle (MOEBENCH_TRITON_FASTLAUNCH, default on,
    and a Triton in KNOWN_TRITON)."""
    global _enabled
    if _enabled is None:
        import triton

        _enabled = os.environ.get(ENV, "1") != "0" and triton.__version__.startswith(KNOWN_TRITON)
    return _enabled


def set_enabled(value: Optional[bool]) -> None:
    """Force the fast path on / off; None re-reads the environment (and the driver) next launch."""
    global _enabled, _RUNTIME
    _enabled = value
    _RUNTIME = None


def _runtime() -> tuple:
    """(current device, current stream of a device, Triton's runtime knobs), looked up once:
    the driver's LazyProxy answers each attribute through __getattr__."""
    global _RUNTIME
    if _RUNTIME is None:
        from triton import knobs
        from triton.runtime.driver import driver

        active = driver.active
        get_device = active.get_current_device
        # torch's current_device() is _lazy_init() + _cuda_getDevice(): once CUDA is initialized
        # here, the C function alone (a driver a test put in place, a CPU torch keep their own)
        raw = getattr(torch._C, "_cuda_getDevice", None)
        if get_device is torch.cuda.current_device and raw is not None and torch.cuda.is_available():
            torch.cuda.current_device()  # initializes CUDA (launch() is about to launch on it)
            get_device = raw
        _RUNTIME = (get_device, active.get_current_stream, knobs.runtime)
    return _RUNTIME


def interpreted(fn) -> bool:
    """Whether fn runs in Triton's CPU interpreter (decided when it was decorated, by
    TRITON_INTERPRET then); a wrapper (an autotuner) answers for the kernel it wraps."""
    for _ in range(8):
        if JITFunction is not None and isinstance(fn, JITFunction):
            return False
        if type(fn).__name__ == "InterpretedFunction":
            return True
        if not hasattr(fn, "fn"):
            break
        fn = fn.fn
    return JITFunction is None


def arg_key(a: Any) -> Any:
    """What Triton specializes a runtime argument on (module doc), or _UNKEYED."""
    if isinstance(a, torch.Tensor):
        return (a.dtype, a.data_ptr() & 15 == 0)
    t = type(a)
    if t is bool:
        return bool
    if t is int:
        return (a == 1, a & 15 == 0, -(2**31) <= a < 2**31, a >= 2**63)
    if t is float:
        return float
    if a is None:
        return None
    if t.__name__ == "TensorDescriptor":  # triton.tools.tensor_descriptor's (host TMA) or Gluon's
        layout = getattr(a, "layout", None)  # (Gluon's: part of its signature, tensordesc<dtype[block],layout>)
        return (
            t,
            a.base.dtype,
            tuple(a.block_shape),
            getattr(a, "padding", None),
            len(a.shape),
            None if layout is None else layout_text(layout),
        )
    return _UNKEYED


class _Plan:
    """Per kernel: its parameters in order, which are constexpr, their defaults."""

    __slots__ = ("names", "index", "constexpr", "defaults", "cache", "sites", "ok")

    def __init__(self, fn):
        params = fn.params
        self.names = [p.name for p in params]
        self.index = {n: i for i, n in enumerate(self.names)}
        self.constexpr = [p.is_constexpr for p in params]
        self.defaults = [p.default if p.has_default else _UNKEYED for p in params]
        self.cache: dict = {}  # spec_key's (sites _Site does not fit)
        self.sites: dict = {}  # (positional count, *keyword names) -> _Site
        self.ok = not fn.pre_run_hooks


def _plan(fn) -> _Plan:
    plan = fn.__dict__.get("_moebench_plan")
    if plan is None:
        plan = fn._moebench_plan = _Plan(fn)
    return plan


def bind(plan: _Plan, args: tuple, kwargs: dict) -> tuple[Optional[list], dict]:
    """(every parameter's value in declaration order, the launch options); the values are
    None where a parameter without a default was not given (the JIT raises the error)."""
    vals = list(args)
    n = len(plan.names)
    if len(vals) < n:
        vals.extend([_UNKEYED] * (n - len(vals)))
    options = {}
    for k, v in kwargs.items():
        i = plan.index.get(k)
        if i is None:
            options[k] = v
        else:
            vals[i] = v
    for i in range(len(args), n):
        if vals[i] is _UNKEYED:
            d = plan.defaults[i]
            if d is _UNKEYED:
                return None, options
            vals[i] = d
    return vals, options


def spec_key(plan: _Plan, vals: list, options: dict) -> Any:
    """A hashable key at least as fine as Triton's specialization, or None (no fast path).
    Runtime ints enter by value (finer than Triton's == 1 / % 16 / width, and cheaper to
    build: a shape's ints are the same every forward); constexprs with their type
    (False == 0 == 0.0 in Python, not in Triton's cache key)."""
    key: list = []
    append = key.append
    for is_const, v in zip(plan.constexpr, vals, strict=True):
        t = type(v)
        if is_const:
            append((t, v))
        elif t is int:
            append(v)  # never equal to the other keys: tuples, types, None
        elif t is torch.Tensor or isinstance(v, torch.Tensor):
            append((v.dtype, v.data_ptr() & 15 == 0))
        else:
            k = arg_key(v)
            if k is _UNKEYED:
                return None
            append(k)
    append(tuple([(k, type(v), v) for k, v in options.items()]))
    out = tuple(key)
    try:
        hash(out)
    except TypeError:  # an unhashable constexpr or option
        return None
    return out


# launch options a call may pass beside the kernel's parameters (JITFunction.run's options);
# a call site with any other keyword that is not a constexpr parameter takes the generic key
OPTIONS = frozenset(
    {
        "num_warps",
        "num_stages",
        "num_ctas",
        "maxnreg",
        "enable_fp_fusion",
        "launch_cooperative_grid",
        "launch_pdl",
        "debug",
        "sanitize_overflow",
        "enable_reflect_ftz",
    }
)


class _Site:
    """One call signature of a kernel: how many positional arguments, which keywords in which
    order. `ok` where the site key (site_key_args) applies: the positional arguments are runtime
    parameters, every keyword a constexpr parameter or a launch option, every parameter not
    given has a default. `tail`: the parameters after the positional ones, each as
    (keyword name, default) — their values follow from the key's keyword values."""

    __slots__ = ("ok", "tail", "cache")

    def __init__(self, plan: _Plan, nargs: int, names: tuple):
        n = len(plan.names)
        self.cache: dict = {}
        self.tail: tuple = ()
        self.ok = nargs <= n and not any(plan.constexpr[:nargs])
        for name in names:
            i = plan.index.get(name)
            if i is None:
                self.ok = self.ok and name in OPTIONS
            else:  # a constexpr keyword after the positional arguments (not a runtime one: a tensor in a key)
                self.ok = self.ok and plan.constexpr[i] and i >= nargs
        if self.ok:
            tail = [(plan.names[i], plan.defaults[i]) for i in range(nargs, n)]
            self.ok = all(name in names or d is not _UNKEYED for name, d in tail)
            self.tail = tuple(tail)


class _NotKeyed(Exception):
    """An argument site_key_args cannot key: the generic path."""


def _other_key(a: Any) -> Any:
    k = arg_key(a)
    if k is _UNKEYED:
        raise _NotKeyed
    return k


_Tensor = torch.Tensor


def site_key_args(device: Any, args: tuple, kwargs: dict) -> tuple[tuple, list]:
    """(the key of one launch at a site (_Site.ok), as fine as spec_key's: the device, the
    keywords' values and types (in the site's fixed order), each positional argument as arg_key
    keys it (ints by value, tensors by dtype, alignment, and is_cuda); the positional arguments
    for the launcher: each tensor as its data_ptr() int, read once for both). Raises TypeError
    (an unhashable keyword value, at the look-up) or _NotKeyed. Triton's launcher takes an int
    for a pointer as it is; a tensor costs it a data_ptr() call and a cuPointerGetAttribute check
    (issue #34). CPU tensors key apart (`is_cuda`) and reach the launcher as tensors: its check
    stays theirs."""
    vals = kwargs.values()
    key: list = [device, *vals, *map(type, vals)]
    out: list = []
    for a in args:
        t = type(a)
        if t is int:
            key.append(a)
            out.append(a)
        elif t is _Tensor:
            p, on_cuda = a.data_ptr(), a.is_cuda
            key.append((a.dtype, p & 15 == 0, on_cuda))
            out.append(p if on_cuda else a)  # a CPU one (pinned memory passes the JIT's check) stays checked
        else:
            key.append(_other_key(a))
            out.append(a)
    return tuple(key), out


def launch(fn, grid: tuple, *args, **kwargs) -> None:
    """fn[grid](*args, **kwargs), through the compiled handle where the key allows (module doc).
    Per call site (positional count, keyword names) the key is site_key_args'; a site it does not
    fit takes spec_key's (bind)."""
    if _enabled is None:
        enabled()
    plan = fn.__dict__.get("_moebench_plan") if _enabled and type(grid) is tuple else None
    if plan is None:
        if not _enabled or JITFunction is None or not isinstance(fn, JITFunction) or type(grid) is not tuple:
            fn[grid](*args, **kwargs)
            return
        plan = _plan(fn)
    get_device, get_stream, rt = _RUNTIME or _runtime()
    if rt.jit_cache_hook is not None or JITFunction.run.__qualname__ != "JITFunction.run":
        # a tool watches Triton's launch path (the tuner's Recorder and HitCounter, a test's
        # patch of JITFunction.run): it must see every launch, never a binary launched behind it
        fn[grid](*args, **kwargs)
        return
    if not plan.ok:
        fn[grid](*args, **kwargs)
        return
    sig = (len(args), *kwargs)
    site = plan.sites.get(sig)
    if site is None:
        site = plan.sites[sig] = _Site(plan, len(args), tuple(kwargs))
    if not site.ok:
        _launch_generic(plan, fn, grid, args, kwargs)
        return
    device = get_device()
    try:
        key, ptr_args = site_key_args(device, args, kwargs)
        entry = site.cache.get(key)
    except (TypeError, _NotKeyed):  # an unhashable constexpr or option, an argument not keyed
        fn[grid](*args, **kwargs)
        return
    if entry is None:  # the JIT compiles (or finds) the binary and launches it
        kernel = _jit_launch(fn, grid, args, kwargs)
        if kernel is not None:
            if len(site.cache) >= MAX_KEYS:  # ints that change every call: do not grow without bound
                site.cache.clear()
            site.cache[key] = (kernel, tuple([kwargs[n] if n in kwargs else d for n, d in site.tail]), c_entry(kernel))
        return
    kernel, tail, direct = entry
    stats["handle"] += 1
    stream = get_stream(device)
    enter, exit_ = rt.launch_enter_hook, rt.launch_exit_hook
    if (enter is not None and getattr(enter, "calls", True)) or (exit_ is not None and getattr(exit_, "calls", True)):
        _run(kernel, grid, stream, rt, (*args, *tail))  # a profiler's hooks: with the launch metadata
        return
    n = len(grid)  # (_run without hooks, inlined: this is the per-launch path)
    if direct is not None:  # the launcher's C entry itself (launch_entry.direct)
        c_launch, function, coop, pdl, packed, descs = direct
        stats["direct"] += 1
        if descs:  # tensor descriptors: expanded here, as Triton's wrapper of the entry would
            c_launch(
                grid[0],
                grid[1] if n > 1 else 1,
                grid[2] if n > 2 else 1,
                stream,
                function,
                coop,
                pdl,
                None,
                None,
                packed,
                None,
                None,
                None,
                *expand_descriptors(descs, [*ptr_args, *tail], stats),
            )
            return
        c_launch(
            grid[0],
            grid[1] if n > 1 else 1,
            grid[2] if n > 2 else 1,
            stream,
            function,
            coop,
            pdl,
            None,
            None,
            packed,
            None,
            None,
            None,
            *ptr_args,
            *tail,
        )
        return
    kernel.run(
        grid[0],
        grid[1] if n > 1 else 1,
        grid[2] if n > 2 else 1,
        stream,
        kernel.function,
        kernel.packed_metadata,
        None,
        None,
        None,
        *ptr_args,
        *tail,
    )


def _jit_launch(fn, grid, args, kwargs):
    stats["jit"] += 1
    kernel = fn.run(*args, grid=grid, warmup=False, **kwargs)
    if hasattr(kernel, "result"):
        kernel = kernel.result()
    return kernel


def _run(kernel, grid: tuple, stream, rt, vals) -> None:
    """CompiledKernel.run with every parameter's value in order, as JITFunction.run calls it."""
    enter, exit_ = rt.launch_enter_hook, rt.launch_exit_hook
    # an empty hook chain does nothing: skip it and the metadata it would receive
    if enter is not None and not getattr(enter, "calls", True):
        enter = None
    if exit_ is not None and not getattr(exit_, "calls", True):
        exit_ = None
    meta = kernel.launch_metadata(grid, stream, *vals) if enter is not None or exit_ is not None else None
    n = len(grid)
    kernel.run(
        grid[0],
        grid[1] if n > 1 else 1,
        grid[2] if n > 2 else 1,
        stream,
        kernel.function,
        kernel.packed_metadata,
        meta,
        enter,
        exit_,
        *vals,
    )


def _launch_generic(plan: _Plan, fn, grid: tuple, args: tuple, kwargs: dict) -> None:
    """The launch keyed by spec_key over every parameter (bind): sites _Site does not fit."""
    vals, options = bind(plan, args, kwargs)
    key = None if vals is None else spec_key(plan, vals, options)
    if key is None:  # a missing argument (the JIT raises its error), or one not keyed
        fn[grid](*args, **kwargs)
        return
    assert vals is not None  # (a key was made of them)
    get_device, get_stream, rt = _RUNTIME or _runtime()
    device = get_device()
    kernel = plan.cache.get((device, key))
    if kernel is None:  # the JIT compiles (or finds) the binary and launches it
        kernel = _jit_launch(fn, grid, args, kwargs)
        if kernel is not None:
            if len(plan.cache) >= MAX_KEYS:
                plan.cache.clear()
            plan.cache[(device, key)] = kernel
        return
    stats["handle"] += 1
    _run(kernel, grid, get_stream(device), rt, vals)

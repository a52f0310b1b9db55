"""kernels/triton/launch.py: the fast launch's key is at least as fine as Triton's
specialization (pure Python, against Triton's own specializer), and under the
interpreter launch() is the plain JIT launch. The compiled-handle launch itself runs
on a GPU: tests/gpu/test_triton_fastlaunch.py."""

from __future__ import annotations

import itertools
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

from moebench.kernels.triton import launch as fl
from moebench.kernels.triton import launch_entry as le


def _triton_spec(a):
    """Triton's own specialization of one runtime argument (what its cache key holds)."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    return native_specialize_impl(BaseBackend, a, False, True, True)


def _samples():
    base = torch.empty(64, dtype=torch.float32)
    ints = [
        0,
        1,
        2,
        15,
        16,
        17,
        32,
        -1,
        -16,
        2**31 - 1,
        2**31,
        2**31 + 16,
        2**32,
        2**63,
        2**63 + 16,
        -(2**31),
        -(2**31) - 1,
    ]
    tensors = [
        base,
        base[1:],
        base[4:],
        base.view(8, 8).t(),
        base.to(torch.bfloat16),
        base.to(torch.bfloat16)[8:],
        base.to(torch.int32),
        torch.empty(3, dtype=torch.int64),
    ]
    return ints + tensors + [True, False, 1.0, 0.5, None]


def test_arg_key_at_least_as_fine_as_triton():
    """Equal keys imply equal Triton specializations: a key never reuses another binary."""
    samples = _samples()
    for a, b in itertools.combinations(samples, 2):
        ka, kb = fl.arg_key(a), fl.arg_key(b)
        if ka == kb:
            assert _triton_spec(a) == _triton_spec(b), (a, b, ka)


def test_arg_key_distinguishes_what_triton_does():
    t = torch.empty(64, dtype=torch.float32)
    assert fl.arg_key(t) != fl.arg_key(t[1:])  # 16-byte alignment
    assert fl.arg_key(t) != fl.arg_key(t.to(torch.bfloat16))  # dtype
    assert fl.arg_key(t) == fl.arg_key(torch.empty(128, dtype=torch.float32))  # shape is not specialized
    assert fl.arg_key(1) != fl.arg_key(2) and fl.arg_key(16) != fl.arg_key(17)  # == 1, % 16
    assert fl.arg_key(2**31 - 16) != fl.arg_key(2**31)  # i32 / i64
    assert fl.arg_key(2**63) != fl.arg_key(2**62)  # u64
    assert fl.arg_key(True) != fl.arg_key(1) and fl.arg_key(1.0) != fl.arg_key(1)
    assert fl.arg_key(object()) is fl._UNKEYED  # unknown types take the JIT launch


def test_arg_key_tensor_descriptor():
    td = pytest.importorskip("triton.tools.tensor_descriptor")
    x = torch.empty(256, 128, dtype=torch.bfloat16)
    d = td.TensorDescriptor.from_tensor(x, [64, 64])
    same = td.TensorDescriptor.from_tensor(torch.empty(512, 128, dtype=torch.bfloat16), [64, 64])
    assert fl.arg_key(d) == fl.arg_key(same) and _triton_spec(d) == _triton_spec(same)
    other = td.TensorDescriptor.from_tensor(x, [128, 64])
    assert fl.arg_key(d) != fl.arg_key(other)
    assert fl.arg_key(d) != fl.arg_key(td.TensorDescriptor.from_tensor(x.float(), [64, 64]))


class _Param:
    def __init__(self, name, constexpr=False, default=None):
        self.name, self.is_constexpr = name, constexpr
        self.has_default, self.default = default is not None, default


class _FakeJit:
    """The attributes launch()'s plan reads from a JITFunction."""

    def __init__(self):
        self.params = [_Param("x"), _Param("n"), _Param("BLOCK", True), _Param("FLAG", True, default=False)]
        self.pre_run_hooks = []


def test_spec_key_constexprs_options_and_defaults():
    plan = fl._Plan(_FakeJit())
    x = torch.empty(16)
    vals, opts = fl.bind(plan, (x, 32), dict(BLOCK=64, num_warps=4))
    assert vals == [x, 32, 64, False] and opts == {"num_warps": 4}
    key = fl.spec_key(plan, vals, opts)

    def k(*args, **kw):
        return fl.spec_key(plan, *fl.bind(plan, args, kw))

    assert k(torch.empty(32), 32, BLOCK=64, num_warps=4) == key  # same specialization: another tensor
    assert k(torch.empty(32), 48, BLOCK=64, num_warps=4) != key  # ints by value: finer than Triton, never coarser
    assert k(x, 32, BLOCK=128, num_warps=4) != key  # constexpr value
    assert k(x, 32, BLOCK=64, num_warps=8) != key  # option
    assert k(x, 32, BLOCK=64, FLAG=True, num_warps=4) != key  # defaulted constexpr given
    assert k(x, 32, BLOCK=64, FLAG=0, num_warps=4) != key  # False == 0 in Python, not in Triton
    assert k(x, 1, BLOCK=64, num_warps=4) != key  # the value-1 specialization
    assert k(x, 33, BLOCK=64, num_warps=4) != key  # divisibility by 16
    assert k(x, 32, BLOCK=[64], num_warps=4) is None  # unhashable: the JIT launch
    assert k(x, object(), BLOCK=64, num_warps=4) is None  # an unknown argument type: the JIT launch
    assert k(x[1:], 32, BLOCK=64, num_warps=4) != key  # a misaligned tensor
    assert k(x.double(), 32, BLOCK=64, num_warps=4) != key  # another dtype
    assert k(x, True, BLOCK=64, num_warps=4) != k(x, 1, BLOCK=64, num_warps=4)  # u1 / constexpr 1


def test_spec_key_at_least_as_fine_as_triton():
    """Equal keys imply equal Triton specializations, over every runtime argument sampled."""
    plan = fl._Plan(_FakeJit())
    samples = _samples()
    seen = {}
    for a in samples:
        key = fl.spec_key(plan, *fl.bind(plan, (a, 5), dict(BLOCK=64)))
        seen.setdefault(key, []).append(a)
    for group in seen.values():
        assert len({_triton_spec(a) for a in group}) == 1, group


def test_interpreter_takes_the_jit_launch():
    """Under TRITON_INTERPRET=1 the kernels are not JITFunctions: launch() is fn[grid](...)."""
    from moebench.kernels.triton.align import _align_count_kernel, moe_align_block_size

    if torch.cuda.is_available():
        pytest.skip("the interpreter runs only without CUDA here")
    assert fl.interpreted(_align_count_kernel)
    ids = torch.tensor([[0, 2], [1, -1], [2, 2]])
    sorted_ids, expert_ids, num_post = moe_align_block_size(ids, 3, 4)
    assert int(num_post) == 12 and expert_ids[:3].tolist() == [0, 1, 2]


def test_env_switch(monkeypatch):
    import triton

    fl.set_enabled(None)
    monkeypatch.setenv(fl.ENV, "0")
    assert not fl.enabled()
    fl.set_enabled(None)
    monkeypatch.setenv(fl.ENV, "1")
    assert fl.enabled() == triton.__version__.startswith(fl.KNOWN_TRITON)
    fl.set_enabled(None)
    monkeypatch.setattr(triton, "__version__", "9.9.9")  # an unknown launch convention: the JIT
    assert not fl.enabled()
    fl.set_enabled(None)


def _jit_kernel():
    """A real JITFunction (not the interpreter's), built without a GPU."""
    from triton.runtime.jit import JITFunction

    from tests.kernels import _fastlaunch_kernel as mod

    return JITFunction(mod.kernel_body)


class _Compiled:
    """What launch() reads from a CompiledKernel."""

    function, packed_metadata = "FUNCTION", "PACKED"

    def __init__(self):
        self.calls = []

    def run(self, *args):
        self.calls.append(args)

    def launch_metadata(self, grid, stream, *args):
        return ("META", grid, stream)


def test_launch_mechanics(monkeypatch):
    """First call of a key: the JIT (fn.run) launches and its binary is kept; later calls of
    the key: CompiledKernel.run with the grid, the stream, every parameter in order
    (defaults and constexprs included, as JITFunction.run passes them); a new key: the JIT
    again; disabled: fn[grid]."""
    fn = _jit_kernel()
    compiled = _Compiled()
    jit_calls = []

    def fake_run(*args, grid, warmup, **kwargs):
        jit_calls.append((args, grid, kwargs))
        return compiled

    monkeypatch.setattr(fn, "run", fake_run)
    hooks = type("Hooks", (), {"launch_enter_hook": None, "launch_exit_hook": None, "jit_cache_hook": None})()
    fl.set_enabled(True)
    monkeypatch.setattr(fl, "_RUNTIME", (lambda: 0, lambda dev: 1234, hooks))
    try:
        x = torch.empty(64)
        fl.launch(fn, (3, 2), x, 32, BLOCK=64, num_warps=4)
        assert len(jit_calls) == 1 and not compiled.calls
        assert jit_calls[0] == ((x, 32), (3, 2), dict(BLOCK=64, num_warps=4))
        fl.launch(fn, (3, 2), x, 32, BLOCK=64, num_warps=4)
        assert len(jit_calls) == 1
        # a CPU tensor goes as itself (a CUDA one as its data_ptr() int: site_key_args)
        assert compiled.calls == [(3, 2, 1, 1234, "FUNCTION", "PACKED", None, None, None, x, 32, 64, False)]
        fl.launch(fn, (5,), x, 32, BLOCK=64, FLAG=True, num_warps=4)  # a new key
        assert len(jit_calls) == 2
        fl.launch(fn, (5,), x, 32, BLOCK=64, FLAG=True, num_warps=4)
        assert compiled.calls[-1] == (5, 1, 1, 1234, "FUNCTION", "PACKED", None, None, None, x, 32, 64, True)
        # profiler hooks: passed through with the launch metadata, as the JIT does
        hooks.launch_enter_hook = enter = lambda meta: None
        fl.launch(fn, (5,), x, 32, BLOCK=64, FLAG=True, num_warps=4)
        assert compiled.calls[-1][6:9] == (("META", (5,), 1234), enter, None)
        hooks.launch_enter_hook = None
        # a tool watching Triton's launch path (the tuner's Recorder: jit_cache_hook, a patched
        # JITFunction.run) sees every launch: the JIT's path, never the kept binary
        hooks.jit_cache_hook = lambda **kw: None
        n, m = len(jit_calls), len(compiled.calls)
        fl.launch(fn, (5,), x, 32, BLOCK=64, FLAG=True, num_warps=4)
        assert (len(jit_calls), len(compiled.calls)) == (n + 1, m)
        hooks.jit_cache_hook = None
        from triton.runtime.jit import JITFunction

        real = JITFunction.run
        monkeypatch.setattr(
            JITFunction, "run", lambda self, *a, grid, warmup, **k: real(self, *a, grid=grid, warmup=True, **k)
        )
        fl.launch(fn, (5,), x, 32, BLOCK=64, FLAG=True, num_warps=4)
        assert (len(jit_calls), len(compiled.calls)) == (n + 2, m)
        monkeypatch.setattr(JITFunction, "run", real)
        fl.launch(fn, (5,), x, 32, BLOCK=64, FLAG=True, num_warps=4)
        assert (len(jit_calls), len(compiled.calls)) == (n + 2, m + 1)
        # off: the JIT's own path (fn[grid] -> fn.run)
        fl.set_enabled(False)
        fl.launch(fn, (5,), x, 32, BLOCK=64, FLAG=True, num_warps=4)
        assert len(jit_calls) == n + 3
    finally:
        fl.set_enabled(None)


def test_interpreted_sees_through_wrappers():
    from triton.runtime.jit import JITFunction

    from tests.kernels import _fastlaunch_kernel as mod

    jit = JITFunction(mod.kernel_body)
    wrapper = type("Autotuner", (), {"fn": jit})()
    assert not fl.interpreted(jit) and not fl.interpreted(wrapper)
    InterpretedFunction = type("InterpretedFunction", (), {})
    assert fl.interpreted(InterpretedFunction()) and fl.interpreted(
        type("Autotuner", (), {"fn": InterpretedFunction()})()
    )


def test_site_key_partitions_like_spec_key():
    """The per-site key (launch's path) groups launches exactly as spec_key does, over every
    runtime argument sampled and constexpr / option values of both types: at least as fine as
    Triton's specialization wherever spec_key is (test_spec_key_at_least_as_fine_as_triton)."""
    plan = fl._Plan(_FakeJit())
    calls = [
        ((a, n), dict(BLOCK=b, num_warps=w))
        for a in _samples()
        for n in (1, 5, 16, True)
        for b in (64, 64.0, True, 1)
        for w in (4, 8)
    ]
    site = [fl.site_key_args(0, args, kw)[0] for args, kw in calls]
    spec = [fl.spec_key(plan, *fl.bind(plan, args, kw)) for args, kw in calls]
    for i, j in itertools.combinations(range(len(calls)), 2):
        assert (site[i] == site[j]) == (spec[i] == spec[j]), (calls[i], calls[j])
    seen = {}  # and directly: one Triton specialization (runtime arguments, constexprs with their type) a key
    for (args, kw), key in zip(calls, site, strict=True):
        spec = (tuple(_triton_spec(a) for a in args), tuple((type(v), v) for v in kw.values()))
        seen.setdefault(key, set()).add(spec)
    assert all(len(group) == 1 for group in seen.values())


def test_site_key_distinguishes_what_triton_does():
    x = torch.empty(16)

    def k(*args, **kw):
        return fl.site_key_args(0, args, kw)[0]

    key = k(x, 32, BLOCK=64, num_warps=4)
    assert k(torch.empty(32), 32, BLOCK=64, num_warps=4) == key  # another tensor of the same specialization
    assert k(x, 48, BLOCK=64, num_warps=4) != key  # ints by value
    assert k(x, 32, BLOCK=128, num_warps=4) != key and k(x, 32, BLOCK=64, num_warps=8) != key
    assert k(x, 32, BLOCK=64.0, num_warps=4) != key  # 64 == 64.0 in Python, not in Triton
    assert k(x, True, BLOCK=64, num_warps=4) != k(x, 1, BLOCK=64, num_warps=4)
    assert k(x[1:], 32, BLOCK=64, num_warps=4) != key and k(x.double(), 32, BLOCK=64, num_warps=4) != key
    assert fl.site_key_args(1, (x, 32), dict(BLOCK=64, num_warps=4))[0] != key  # another device
    # the launch arguments beside the key: a CPU tensor as itself (the launcher's check stays its
    # own: pinned memory passes the JIT's), a CUDA one as its data_ptr() int (the GPU tests)
    key2, launch_args = fl.site_key_args(0, (x, 32, None), dict(BLOCK=64, num_warps=4))
    assert key2 == k(x, 32, None, BLOCK=64, num_warps=4) and launch_args[0] is x and launch_args[1:] == [32, None]
    # a tensor keys with whether it is on CUDA: a CPU tensor keys apart from a CUDA one of the same
    # dtype and alignment, so its launch takes the JIT, whose pointer check refuses it;
    # tests/gpu/test_triton_fastlaunch.py launches both
    assert key[-2] == (x.dtype, True, False)
    with pytest.raises(fl._NotKeyed):
        k(x, object(), BLOCK=64, num_warps=4)


def test_site_fits_only_runtime_positionals_and_constexpr_keywords():
    plan = fl._Plan(_FakeJit())
    assert fl._Site(plan, 2, ("BLOCK", "num_warps")).ok
    assert fl._Site(plan, 2, ("BLOCK", "FLAG")).ok
    assert fl._Site(plan, 2, ("BLOCK",)).tail == (("BLOCK", fl._UNKEYED), ("FLAG", False))
    assert not fl._Site(plan, 3, ()).ok  # a constexpr given positionally: spec_key's path
    assert not fl._Site(plan, 1, ("n", "BLOCK")).ok  # a runtime parameter by keyword (a tensor would enter the key)
    assert not fl._Site(plan, 2, ("BLOCK", "no_such_option")).ok
    assert not fl._Site(plan, 2, ("num_warps",)).ok  # BLOCK missing: the JIT raises its error
    assert not fl._Site(plan, 5, ("BLOCK",)).ok  # more positionals than parameters


def test_launch_off_site_takes_the_generic_key(monkeypatch):
    """A call whose site _Site does not fit (a runtime parameter by keyword) still launches
    through the handle after its first call, with the parameters in declaration order."""
    fn = _jit_kernel()
    compiled = _Compiled()
    jit_calls = []
    monkeypatch.setattr(fn, "run", lambda *a, grid, warmup, **kw: jit_calls.append(a) or compiled)
    hooks = type("Hooks", (), {"launch_enter_hook": None, "launch_exit_hook": None, "jit_cache_hook": None})()
    fl.set_enabled(True)
    monkeypatch.setattr(fl, "_RUNTIME", (lambda: 0, lambda dev: 7, hooks))
    try:
        x = torch.empty(64)
        for _ in range(2):
            fl.launch(fn, (2,), x, n=32, BLOCK=64)
        assert len(jit_calls) == 1
        assert compiled.calls == [(2, 1, 1, 7, "FUNCTION", "PACKED", None, None, None, x, 32, 64, False)]
        fl.launch(fn, (2,), x, n=33, BLOCK=64)  # a new key there too
        assert len(jit_calls) == 2
        # an unhashable constexpr: the JIT every time, never a key
        fl.launch(fn, (2,), x, 32, BLOCK=[64])
        fl.launch(fn, (2,), x, 32, BLOCK=[64])
        assert len(jit_calls) == 4 and len(compiled.calls) == 1
    finally:
        fl.set_enabled(None)


def test_handle_launches_get_the_values_the_jit_binds():
    """Every launch of the experts' forwards (standard, batched and contiguous (TMA descriptors),
    bf16 / fp8_tensor / fp8_block, both reductions), the fused prepare kernel, the Gluon GEMM's three
    kernels (gluon_contiguous.GluonGemm: Gluon descriptors, c_desc one or None) and wrappers, through
    the per-site key with Triton's JIT stubbed, hands CompiledKernel.run the values bind() gives
    (every parameter in order, defaults included): tests/kernels/_launch_vals.py in its own process
    (the kernels must be JITFunctions)."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(repo), env.get("PYTHONPATH", "")])
    res = subprocess.run(
        [sys.executable, str(repo / "tests" / "kernels" / "_launch_vals.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    words = res.stdout.split()  # "checked N handle launches of K kernels"
    launches, kernels = int(words[1]), int(words[5])
    assert launches >= 78 and kernels == 16, res.stdout


def _gluon_desc(t, block, layout=None):
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    dtype = gl.float8e4nv if t.dtype == torch.float8_e4m3fn else gl.bfloat16
    layout = layout or gl.NVMMASharedLayout.get_default_for(block, dtype)
    return TensorDescriptor.from_tensor(t, block, layout)


def test_arg_key_gluon_tensor_descriptor_at_least_as_fine_as_triton():
    """A Gluon descriptor's layout is part of its signature (tensordesc<dtype[block],layout>):
    equal keys imply equal Triton specializations, over layouts that differ in swizzle, element
    width, transposition and in a field's type alone (1 == True in Python, not in its text)."""
    pytest.importorskip("triton.experimental.gluon.nvidia.hopper")
    from triton.experimental.gluon import language as gl

    f8 = torch.empty(512, 256, dtype=torch.float8_e4m3fn)
    b16 = torch.empty(512, 256, dtype=torch.bfloat16)
    swz = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=8)
    trans = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, transposed=True)
    trans_int = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, transposed=1)
    assert trans == trans_int and repr(trans) != repr(trans_int)
    other = torch.empty(256, 128, dtype=torch.float8_e4m3fn)
    samples = [
        _gluon_desc(f8, [128, 128]),
        _gluon_desc(other, [128, 128]),
        _gluon_desc(f8, [64, 128]),
        _gluon_desc(f8, [128, 128], swz),
        _gluon_desc(f8, [128, 128], trans),
        _gluon_desc(f8, [128, 128], trans_int),
        _gluon_desc(b16, [64, 128]),
        _gluon_desc(b16[:, :128], [64, 128]),
        _gluon_desc(b16, [64, 64]),
    ]
    for a, b in itertools.combinations(samples, 2):
        if fl.arg_key(a) == fl.arg_key(b):
            assert _triton_spec(a) == _triton_spec(b), (a, b)
    assert fl.arg_key(samples[0]) == fl.arg_key(samples[1])  # another tensor, same block and layout
    assert fl.arg_key(samples[4]) != fl.arg_key(samples[5])  # the layouts' texts differ
    assert len({fl.arg_key(d) for d in samples}) == len(samples) - 2  # (and b16 / its slice)
    td = pytest.importorskip("triton.tools.tensor_descriptor")
    host = td.TensorDescriptor.from_tensor(f8, [128, 128])  # the host descriptor of the same block: another type
    assert fl.arg_key(host) != fl.arg_key(samples[0]) and _triton_spec(host) != _triton_spec(samples[0])


class CudaLauncher:
    """Stands in for Triton 3.6's CudaLauncher (launch_entry.direct reads its type's name): `launch` as
    driver.wrap_handle_tensordesc wraps the C entry for the signature given."""

    def __init__(self, signature: dict, metas):
        from triton.backends.nvidia.driver import wrap_handle_tensordesc

        self.c_calls: list = []
        self.launch = wrap_handle_tensordesc(lambda *a: self.c_calls.append(a), signature, metas)
        self.global_scratch_size = self.profile_scratch_size = 0
        self.num_ctas, self.launch_cooperative_grid, self.launch_pdl = 1, False, False


class _DescCompiled:
    function, packed_metadata = 77, (4, 1, 0)

    def __init__(self, launcher):
        self.run = launcher


def _fake_fills(monkeypatch) -> list:
    """make_tensordesc_arg with TMA metadata, on the CPU: a stand-in CUtensorMap (what it encodes),
    shape and strides, as the real one returns them; the calls recorded."""
    import triton.backends.nvidia.driver as drv

    made = []

    def make(arg, meta):
        if meta is None:
            return [arg.base, *arg.shape, *arg.strides, arg.padding == "nan", *arg.shape, *arg.strides]
        made.append(arg)
        return [
            ("CUtensorMap", arg.base.data_ptr(), tuple(arg.shape), tuple(arg.strides), id(meta)),
            *arg.shape,
            *arg.strides,
        ]

    monkeypatch.setattr(drv, "make_tensordesc_arg", make)
    return made


def test_descriptor_expansion_is_tritons_with_fills_kept(monkeypatch):
    """_direct unwraps driver.wrap_handle_tensordesc to the C entry; expand_descriptors hands it
    what Triton's wrapper would (each descriptor as make_tensordesc_arg expands it, in parameter
    order, TMA metadata or none), and fills a descriptor again only for another pointer or shape."""
    pytest.importorskip("triton.backends.nvidia.driver")
    made = _fake_fills(monkeypatch)
    sig = {
        "a": "tensordesc<fp8e4nv[128, 128],L>",
        "n": "i32",
        "b": "tensordesc<bf16[64, 64]>",
        "p": "*bf16",
        "c": "tensordesc<bf16[64, 128],L>",
        "K": "constexpr",
    }
    metas = [{"swizzle": 3}, None, {"swizzle": 2}]
    launcher = CudaLauncher(sig, metas)
    entry, function, coop, pdl, packed, descs = le.direct(_DescCompiled(launcher))
    assert (function, coop, pdl, packed) == (77, False, False, (4, 1, 0)) and len(descs) == 3
    f8 = torch.empty(512, 256, dtype=torch.float8_e4m3fn)
    b16 = torch.empty(256, 128, dtype=torch.bfloat16)
    base = (3, 1, 1, 0, 77, False, False, None, None, (4, 1, 0), None, None, None)

    def args_for(a):
        return [
            _gluon_desc(a, [128, 128]),
            5,
            _gluon_desc(b16, [64, 64]),
            b16.data_ptr(),
            _gluon_desc(b16, [64, 128]),
            2048,
        ]

    for a, fills in ((f8, 2), (f8, 0), (f8[256:], 1)):  # the same pointers refill nothing; a new base, its own
        args = args_for(a)
        launcher.launch(*base, *args)  # Triton's wrapper (it fills every descriptor)
        n = len(made)
        entry(*base, *le.expand_descriptors(descs, list(args), fl.stats))
        assert len(made) - n == fills
        assert launcher.c_calls[-1] == launcher.c_calls[-2]
    assert launcher.c_calls[-1][14:17] == (256, 256, 256)  # a's shape and first stride follow it
    # a launcher of no descriptors: its C entry as it is
    plain = CudaLauncher({"x": "*fp32"}, None)
    assert le.descriptor_entry(plain.launch) == (plain.launch, ())


def test_launch_hands_the_c_entry_tritons_expansion(monkeypatch):
    """launch() on a kernel with a descriptor argument: the JIT's first launch, then the handle's
    through the C entry with the descriptor expanded as Triton's wrapper would, filled once."""
    pytest.importorskip("triton.backends.nvidia.driver")
    made = _fake_fills(monkeypatch)
    fn = _jit_kernel()
    launcher = CudaLauncher(
        {"x_ptr": "tensordesc<fp8e4nv[128, 128],L>", "n": "i32", "BLOCK": "constexpr", "FLAG": "constexpr"},
        [{"swizzle": 3}],
    )
    jit_calls = []
    monkeypatch.setattr(fn, "run", lambda *a, grid, warmup, **kw: jit_calls.append(a) or _DescCompiled(launcher))
    hooks = type("Hooks", (), {"launch_enter_hook": None, "launch_exit_hook": None, "jit_cache_hook": None})()
    fl.set_enabled(True)
    monkeypatch.setattr(fl, "_RUNTIME", (lambda: 0, lambda dev: 9, hooks))
    try:
        x = torch.empty(256, 128, dtype=torch.float8_e4m3fn)
        direct, fills = fl.stats["direct"], fl.stats["fills"]
        for _ in range(3):
            fl.launch(fn, (4,), _gluon_desc(x, [128, 128]), 32, BLOCK=64)
        assert len(jit_calls) == 1 and fl.stats["direct"] - direct == 2 and fl.stats["fills"] - fills == 1
        want = ("CUtensorMap", x.data_ptr(), (256, 128), (128, 1), None)
        got = launcher.c_calls
        assert len(got) == 2 and got[0] == got[1] and len(made) == 1
        assert got[0][:13] == (4, 1, 1, 9, 77, False, False, None, None, (4, 1, 0), None, None, None)
        assert got[0][13][:4] == want[:4] and got[0][14:] == (256, 128, 128, 1, 32, 64, False)
    finally:
        fl.set_enabled(None)


def test_gluon_gemm_handle_hands_the_c_entry_what_the_jit_does():
    """issue #46: each of the Gluon GEMM's kernels, lowered for sm_90 (its real signature and TMA
    metadata), through launch.py's handle hands the launcher's C entry what its JIT launch handed
    it through Triton's own descriptor wrapper, and fills its descriptors once:
    tests/kernels/_gluon_c_entry.py in its own process (the kernels must be JITFunctions)."""
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("triton.backends.nvidia.driver")
    repo = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(repo), env.get("PYTHONPATH", "")])
    res = subprocess.run(
        [sys.executable, str(repo / "tests" / "kernels" / "_gluon_c_entry.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0 and "checked 7 kernels" in res.stdout, res.stdout[-3000:] + res.stderr[-3000:]

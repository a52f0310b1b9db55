"""The roofline's ceilings, measured on this machine's GPU: device-to-device copy bandwidth
(read + write bytes) and the dense bf16 and fp8 (e4m3) GEMM peaks. Writes
`results/ceilings/<gpu-slug>/ceilings.json` and the environment fingerprint beside it
(`env.json`, as `moebench env --json` prints it); `moebench/report/roofline.py` reads the
file for rows measured on a GPU of that name (docs/design.md, "Derived rates and the roofline").

    python benchmarks/ceilings.py                       # one GPU, ~20 s
    python benchmarks/ceilings.py --cpu --out DIR       # tiny sizes on the CPU: checks the script
                                                        # and its JSON; measures no GPU's ceiling

What is timed (each at several sizes; a ceiling is the largest rate over its sizes):
  copy         dst.copy_(src) of 256 MiB - 2 GiB, counting the bytes read and written
  bf16         torch.matmul, M = N = K in 4096, 8192, 16384, random normal data
  fp8_tensor   torch._scaled_mm on e4m3 operands with one scale a tensor (fast accumulation
               off, and `fp8_tensor_fast_accum` with it on)
  fp8_block    torch._scaled_mm with DeepSeek-V3's blockwise scales (1x128 activations, 128x128
               weights), where this torch and GPU offer it; else a row saying why not
The fp8 ceiling is the fastest fp8 variant. Every GEMM variant is first checked against a
float32 reference at 512^3 (128^3 with `--cpu`): a wrong kernel's speed is no ceiling.

Each figure: `--warmup` calls, then calls for `--warmup-ms` (200 ms, as moebench's
runner.warmup_ms) so that the samples see the clock the GPU sustains under load rather than
its idle boost (docs/findings/timing.md, "Sustained clock"), then `--reps` samples, each
between its own pair of CUDA events, enqueued back to back and read once; the rate of the
median sample. No L2 flush: every operand set is larger than the H200's 50 MB L2 but the
smallest GEMM's, whose rate is not the largest.
"""

from __future__ import annotations

import datetime
import functools
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from moebench.measure.gpu_state import probe_for
from moebench.report.roofline import SCHEMA, ceilings_dir, gpu_slug
from moebench.run.env import fingerprint, git_info
from moebench.util.arg_errors import OneLineErrors, script_prog

MIB = 2**20
GPU_SIZES = dict(copy_bytes=[256 * MIB, 1024 * MIB, 2048 * MIB], gemm=[4096, 8192, 16384])
CPU_SIZES = dict(copy_bytes=[1 * MIB, 4 * MIB], gemm=[128, 256])
CHECK_SIZE = 512  # the correctness check's M = N = K (a multiple of the 128 scale blocks)
# on the CPU torch's fp8 _scaled_mm takes ~0.1 s at 128^3 and ~7 s at 512^3 (one thread)
CPU_CHECK_SIZE = 128
BLOCK = 128
FP8 = torch.float8_e4m3fn


def time_samples(
    fn: Callable[[], object], device: torch.device, reps: int, warmup: int, warmup_ms: float
) -> tuple[list[float], float]:
    """(`reps` samples of fn() in µs, the SM clock in MHz over them): CUDA events around each
    call, enqueued back to back and read once (the host's launches stay hidden behind the GPU's
    work), the clock from measure/clock.py's stamps before the first sample and after the last
    (NaN without the probe); the monotonic clock and NaN on the CPU."""
    for _ in range(warmup):
        fn()
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        while (time.perf_counter() - t0) * 1e3 < warmup_ms:  # sustained clock, not idle boost
            for _ in range(8):
                fn()
            torch.cuda.synchronize(device)
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        probe, _ = probe_for(device)
        if probe is not None:
            probe.begin(1)
            probe.stamp(0, end=False)
        for start, end in ev:
            start.record()
            fn()
            end.record()
        if probe is not None:
            probe.stamp(0, end=True)
        torch.cuda.synchronize(device)
        mhz = float(probe.read()[0][0]) if probe is not None else float("nan")
        return [s.elapsed_time(e) * 1e3 for s, e in ev], mhz
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e6)
    return out, float("nan")


def _fp8(x: torch.Tensor) -> torch.Tensor:
    return x.to(FP8)


def gemm_variants(m: int, n: int, k: int, device: torch.device) -> dict[str, tuple[Callable, Callable]]:
    """name -> (the timed call, its float32 reference of the same product). Operands: A [M, K]
    and B [N, K] row-major (B enters transposed, the layout cuBLAS's fp8 GEMM needs)."""
    a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, k, device=device, dtype=torch.bfloat16)
    bt = b.t()
    a8, b8 = _fp8(a), _fp8(b)
    one = torch.ones((), device=device, dtype=torch.float32)
    # blockwise scales as torch's _scaled_mm takes them: A's 1x128 scales [M, K/128] with
    # the M dimension contiguous, B's 128x128 scales [N/128, K/128] row-major, passed transposed
    sa = (torch.rand(k // BLOCK, m, device=device) + 0.5).t()
    sb = torch.rand(n // BLOCK, k // BLOCK, device=device) + 0.5

    def ref_block():
        da = a8.float() * sa.repeat_interleave(BLOCK, dim=1)
        db = b8.float() * sb.repeat_interleave(BLOCK, dim=0).repeat_interleave(BLOCK, dim=1)
        return da @ db.t()

    return {
        "bf16": (lambda: torch.matmul(a, bt), lambda: a.float() @ b.float().t()),
        "fp8_tensor": (
            lambda: torch._scaled_mm(a8, b8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
            lambda: a8.float() @ b8.float().t(),
        ),
        "fp8_tensor_fast_accum": (
            lambda: torch._scaled_mm(
                a8, b8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=True
            ),
            lambda: a8.float() @ b8.float().t(),
        ),
        "fp8_block": (
            lambda: torch._scaled_mm(a8, b8.t(), scale_a=sa, scale_b=sb.t(), out_dtype=torch.bfloat16),
            ref_block,
        ),
    }


def check(name: str, device: torch.device) -> str:
    """'' when the variant runs and matches its float32 reference at CHECK_SIZE^3 (CPU_CHECK_SIZE^3
    on the CPU) within 2 % (normwise; bf16 output), else why not."""
    size = CHECK_SIZE if device.type == "cuda" else CPU_CHECK_SIZE
    fn, ref = gemm_variants(size, size, size, device)[name]
    try:
        out = fn().float()
    except Exception as e:  # noqa: BLE001  (a variant this torch or GPU lacks is a row saying why, not a crash)
        return f"unavailable here: {str(e).splitlines()[0][:200]}"
    expect = ref()
    err = float((out - expect).norm() / expect.norm())
    return "" if np.isfinite(err) and err < 2e-2 else f"incorrect: rel_err {err:.3g} against float32"


def _mhz(x) -> float | None:
    """A clock for the JSON: None where unread (JSON has no NaN)."""
    return float(x) if x is not None and np.isfinite(x) else None


def summary(timed: tuple[list[float], float], work: float) -> dict:
    """time_samples' (samples, clock) as a record's figures; `work` in bytes or FLOPs."""
    samples, mhz = timed
    s = np.asarray(samples)
    med = float(np.median(s))
    return dict(
        median_us=med,
        p20_us=float(np.percentile(s, 20)),
        p80_us=float(np.percentile(s, 80)),
        reps=len(samples),
        rate_per_s=work / (med * 1e-6),
        sm_clock_mhz=_mhz(mhz),  # None on the CPU and without the probe
    )


def measure(device: torch.device, sizes: dict, reps: int, warmup: int, warmup_ms: float) -> list[dict]:
    """One record per (kind, size): its work (bytes or FLOPs), median / p20 / p80 (µs), rate
    (per second), or a status saying why it was not timed."""
    rows = []
    for nbytes in sizes["copy_bytes"]:
        src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        timed = time_samples(functools.partial(dst.copy_, src), device, reps, warmup, warmup_ms)
        rows.append(
            dict(
                kind="copy",
                name="copy",
                shape=[nbytes],
                status="ok",
                reason="",
                work=2.0 * nbytes,
                unit="bytes (read + write)",
                **summary(timed, 2.0 * nbytes),
            )
        )
        del src, dst
    names = list(gemm_variants(BLOCK, BLOCK, BLOCK, device))
    for name in names:
        why = check(name, device)
        for size in sizes["gemm"]:
            flops = 2.0 * size**3
            row = dict(kind="gemm", name=name, shape=[size, size, size], work=flops, unit="FLOP")
            if why:
                rows.append(row | dict(status=why.split(":")[0].split()[0], reason=why))
                continue
            fn, _ = gemm_variants(size, size, size, device)[name]
            rows.append(
                row | dict(status="ok", reason="", **summary(time_samples(fn, device, reps, warmup, warmup_ms), flops))
            )
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows


def ceilings(rows: list[dict]) -> dict:
    """The largest rate of each ceiling over its sizes and variants, with the record it came from."""

    def best(pred) -> dict:
        ok = [r for r in rows if r["status"] == "ok" and pred(r)]
        if not ok:
            raise RuntimeError("no measurement of this ceiling ran: see the rows' reasons")
        return max(ok, key=lambda r: r["rate_per_s"])

    copy, bf16, fp8 = (
        best(lambda r: r["kind"] == "copy"),
        best(lambda r: r["name"] == "bf16"),
        best(lambda r: r["name"].startswith("fp8")),
    )
    src = lambda r: f"{r['name']} {'x'.join(map(str, r['shape']))}"
    return dict(
        copy_bytes_per_s=copy["rate_per_s"],
        gemm_flops_per_s=dict(bf16=bf16["rate_per_s"], fp8=fp8["rate_per_s"]),
        source=dict(copy=src(copy), bf16=src(bf16), fp8=src(fp8)),
        # the SM clock each peak ran at: the roofline scales a GEMM peak to a row's clock
        sm_clock_mhz={k: r.get("sm_clock_mhz") for k, r in (("copy", copy), ("bf16", bf16), ("fp8", fp8))},
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = OneLineErrors(prog=script_prog(__file__), description=__doc__.splitlines()[0])
    p.add_argument(
        "--out",
        type=Path,
        help="the JSON to write (default on a GPU: results/ceilings/<gpu-slug>/ceilings.json; required with --cpu)",
    )
    p.add_argument(
        "--cpu",
        action="store_true",
        help="tiny sizes on the CPU: a check of the script and its JSON (device cpu), never a ceiling",
    )
    p.add_argument("--reps", type=int, default=None, help="samples per figure (GPU 50, CPU 3)")
    p.add_argument("--warmup", type=int, default=5, help="calls before the timed warm-up")
    p.add_argument("--warmup-ms", type=float, default=200.0, help="GPU: calls for this long before sampling")
    args = p.parse_args(argv)
    if args.cpu:
        device, sizes, reps = torch.device("cpu"), CPU_SIZES, args.reps or 3
        if args.out is None:
            p.error("--cpu needs --out: a CPU run's JSON checks the format and is no ceiling")
        if ceilings_dir().resolve() in args.out.resolve().parents:
            p.error(f"--cpu writes no file under {ceilings_dir()}: a CPU run is never a GPU's ceiling")
    elif not torch.cuda.is_available():
        p.error("no CUDA device: run on the GPU to measure, or --cpu --out DIR to check the script")
    else:
        device, sizes, reps = torch.device("cuda", 0), GPU_SIZES, args.reps or 50
    if reps < 1:
        p.error("--reps must be at least 1")
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    out = args.out or ceilings_dir() / gpu_slug(gpu) / "ceilings.json"
    torch.manual_seed(0)
    t0 = time.perf_counter()
    rows = measure(device, sizes, reps, args.warmup, args.warmup_ms if device.type == "cuda" else 0.0)
    git = git_info()
    doc = dict(
        schema=SCHEMA,
        device=device.type,
        gpu=gpu,
        commit=git["git_sha"],
        dirty=git["git_dirty"],
        command=shlex.join(["python", "benchmarks/ceilings.py", *argv]),
        timestamp=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        torch=torch.__version__,
        cuda=torch.version.cuda,
        seconds=round(time.perf_counter() - t0, 1),
        ceilings=ceilings(rows),
        measurements=rows,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    (out.parent / "env.json").write_text(json.dumps(fingerprint(), indent=1, default=str) + "\n")
    c = doc["ceilings"]
    print(
        f"{gpu} ({device.type}): copy {c['copy_bytes_per_s'] / 1e12:.2f} TB/s, bf16 "
        f"{c['gemm_flops_per_s']['bf16'] / 1e12:.0f} TFLOP/s, fp8 {c['gemm_flops_per_s']['fp8'] / 1e12:.0f} "
        f"TFLOP/s ({c['source']['fp8']}); {doc['seconds']} s; wrote {out} and env.json beside it"
        + ("" if device.type == "cuda" else " (a CPU check: no GPU's ceiling)")
    )
    for r in rows:
        if r["status"] != "ok":
            print(f"  {r['name']} {'x'.join(map(str, r['shape']))}: {r['reason']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Per rank: build the layer, check it against the reference, time it, measure
memory, mark phases. Workers read a fully resolved plain config (never
@hydra.main in a rank) and report through a queue to launch.py."""
from __future__ import annotations

import gc
import json
import os
import signal
import time
import traceback
from contextlib import contextmanager, nullcontext
from typing import Iterator, Optional

import torch
import torch.distributed as dist

from . import memory, timing
from .kernels import registry
from .kernels.interfaces import NULL_PHASES, ActivationFormat, KernelContext, LayerShape, QuantSpec
from .kernels.modular import MoEKernel
from .kernels.reference import reference_moe, rel_err
from .plan import TOLERANCE
from .workload import build_expert_weights, build_shared, make_inputs, reference_expert_fn


# ---------------------------------------------------------------------------
# derived figures, per rank (DESIGN.md "Derived figures")


def expert_flops(pairs: int, hidden: int, intermediate: int) -> int:
    """2 * pairs * 3 * K * I: one multiply-add per weight element for each
    token-expert pair, in 3 matmuls (gate, up, down)."""
    return 2 * pairs * 3 * hidden * intermediate


def expert_bytes(
    hit_experts: int, bytes_per_expert: int, rows_in: int, rows_out: int, hidden: int, act_bytes: int
) -> int:
    """Fewest bytes the experts must move: the weights and scales of every
    local expert the routing hit, read once + activations in (rows_in * K at
    the input precision) + outputs (rows_out * K bf16)."""
    return hit_experts * bytes_per_expert + rows_in * hidden * act_bytes + rows_out * hidden * 2


def _rate(amount: float, us: float, unit: float) -> float:
    if not us or us != us or us <= 0:
        return float("nan")
    return amount / (us * 1e-6) / unit


# ---------------------------------------------------------------------------


def _all_max(value: float, group, device) -> float:
    if group is None:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t.item())


def _barrier_fn(group, device):
    if group is None:
        return None

    def barrier():
        if device.type == "cuda":
            dist.barrier(group=group, device_ids=[device.index])
        else:
            dist.barrier(group=group)

    return barrier


def _align_fn(group, device):
    """A one-element all-reduce on the GPU: the ranks' devices leave it together,
    so each sample's start event fires at the same moment on every rank."""
    if group is None or device.type != "cuda":
        return None
    one = torch.zeros(1, device=device)
    return lambda: dist.all_reduce(one, group=group)


def rank_sync(group, device, l2_flush: bool = True) -> dict:
    """barrier / flush / align / agree for timing.time_samples on this rank of `group`,
    as the harness starts its samples (benchmarks/ use it too); None where not needed
    (one rank, or no GPU)."""
    return {
        "barrier": _barrier_fn(group, device),
        "flush": timing.L2Flusher(device) if device.type == "cuda" and l2_flush else None,
        "align": _align_fn(group, device),
        "agree": (lambda v: _all_max(v, group, device)) if group is not None else None,
    }


def _median(xs: list[float]) -> float:
    return timing.Samples(xs).median if xs else float("nan")


def _routing_counts(kernel: MoEKernel, x, w, ids) -> dict:
    """Pairs, rows and experts this rank's experts process (outside timing)."""
    prepared = kernel.pf.prepare(x, w, ids, kernel.experts.input_quant)
    if kernel.experts.activation_format == ActivationFormat.BATCHED:
        counts = prepared.expert_num_tokens_E.long()
        pairs = int(counts.sum())
        hit = int((counts > 0).sum())
        rows_in, rows_out = pairs, pairs
    else:
        local = prepared.topk_ids_MP
        pairs = int((local >= 0).sum())
        hit = int(torch.unique(local[local >= 0]).numel())
        rows_in = int(((local >= 0).any(dim=1)).sum())
        rows_out = rows_in if kernel.experts.reduction == "experts" else pairs
    comm = kernel.pf.comm_bytes(x.shape[0], prepared)
    return {"pairs": pairs, "hit": hit, "rows_in": rows_in, "rows_out": rows_out, "comm_bytes": comm}


def _phase_head_start(kernel: MoEKernel, fn, rec, barrier, device, agree) -> int:
    """Spin cycles before each phase sample on several GPUs (timing.lead_cycles), measured
    with the phase recorder on, whose events cost enqueue time; 0 on the CPU or one rank.
    Collective (same calls on every rank). Call it before the timed samples: measuring
    idles the GPU for ~60 ms, which the time-based warm-up then undoes."""
    if barrier is None or device.type != "cuda":
        return 0
    kernel.phases = rec
    try:
        return timing.lead_cycles(fn, device, agree)
    finally:
        kernel.phases = NULL_PHASES


def _phase_samples(kernel: MoEKernel, fn, rec, reps: int, barrier, flush, align=None, lead: int = 0) -> dict:
    """Median µs per phase over `reps` forwards, each started as the timed samples are
    (barrier, flush, align and `lead` spin cycles, the head start of _phase_head_start:
    without it a launch-bound phase would carry the host's launch latency)."""
    per_phase: dict[str, list[float]] = {}
    kernel.phases = rec
    try:
        start = timing.sample_start(barrier, flush, align, lead)
        for _ in range(reps):
            start()
            rec.reset()
            fn()
            for name, us in rec.durations_us().items():
                per_phase.setdefault(name, []).append(us)
    finally:
        kernel.phases = NULL_PHASES
    return {name: _median(v) for name, v in per_phase.items()}


def _combo_range(key: str):
    from .traces.nvtx import combo_range

    return combo_range(key)


def _make_recorder(device, nvtx: bool):
    from .traces.nvtx import make_phase_recorder

    return make_phase_recorder(nvtx=nvtx, record_function=True, cuda_events=True, device=device)


def build_layer(cfg: dict, combo: dict, rank: int, world_size: int, group, device: torch.device):
    """(KernelContext, ExpertWeights, MoEKernel) of one combination, as every rank builds it."""
    m = cfg["model"]
    shape = LayerShape(
        hidden=m["hidden"], intermediate=m["intermediate"], num_experts=m["num_experts"], topk=m["topk"],
        num_shared_experts=m["num_shared_experts"], shared_intermediate=m["shared_intermediate"],
    )
    quant = QuantSpec(cfg["quant"]["name"])
    ctx = KernelContext(
        shape=shape, quant=quant, device=device, rank=rank, world_size=world_size, group=group,
        simulate_ep=combo["simulate_ep"], max_tokens_per_rank=combo["max_tokens_per_rank"],
        options={"num_sms": combo["num_sms"], "dispatch_nvl_chunk": combo.get("dispatch_nvl_chunk", 0),
                 "combine_nvl_chunk": combo.get("combine_nvl_chunk", 0), "deepgemm_min_tokens": combo["deepgemm_min_tokens"],
                 "triton_row_layout": combo.get("row_layout", "auto"),
                 "extra": dict(combo.get("extra") or {})},  # extra.* knobs reach the kernels (e.g. pplx_mode)
    )
    weights = build_expert_weights(ctx, combo["seed"])
    pf = registry.get_backend(combo["backend"])(ctx)
    experts = registry.get_experts(combo["experts"])(weights, combo["reduction"], ctx)
    shared = build_shared(shape, combo["seed"], device, sm_carveout=combo.get("shared_sm_carveout", 0))
    return ctx, weights, MoEKernel(pf, experts, shared, combo["overlap"])


def run_combination(task: dict, rank: int, world_size: int, group, device: torch.device, run_dir: str) -> Iterator:
    """Yield (tokens, per-rank result dict) for each token count of one combination."""
    cfg, combo = task["cfg"], task["combo"]
    r, extra = cfg["runner"], cfg.get("extra", {})
    # fault injection for the harness's own tests (a hang, a crash on one rank)
    if extra.get("sleep_s"):
        time.sleep(float(extra["sleep_s"]))
    if extra.get("raise_on_rank") is not None and int(extra["raise_on_rank"]) == rank:
        raise RuntimeError(f"injected failure on rank {rank}")

    _release_cached(device)  # a previous combination's cached blocks must not count as ours
    ctx, weights, kernel = build_layer(cfg, combo, rank, world_size, group, device)
    shape, quant, shared, seed = ctx.shape, ctx.quant, kernel.shared, combo["seed"]
    setup_used = memory.device_used_bytes(device)
    sync = rank_sync(group, device, r["l2_flush"])
    barrier, flush, align = sync["barrier"], sync["flush"], sync["align"]
    ref_weights = reference_expert_fn(shape, quant, seed, device)
    kept = range(ctx.first_local_expert, ctx.first_local_expert + ctx.num_local_experts) if ctx.simulate_ep > 1 else None
    shared_ref = (shared.w13_NK.float(), shared.w2_KS.float()) if shared is not None else None
    rec = _make_recorder(device, nvtx=combo.get("trace") in ("nvtx", "nsys"))
    # trace=nsys with nsys on the PATH: the launcher started this rank under nsys (launch.py);
    # without it the row gets the torch trace instead (sweep.py said so)
    under_nsys = combo.get("trace") == "nsys" and _nsys()
    tol = TOLERANCE[quant.name]
    routing = (combo["routing"], combo["skew"], seed, rank)

    try:
        for T in task["tokens"]:
            task["current_tokens"] = T
            res: dict = {"rank": rank}
            # correct first: fresh random data, compared with the float32 reference
            x, w, ids = make_inputs(shape, T, *routing, salt=1, device=device)
            err = float("nan")
            if r["check"]:
                y = kernel(x, w, ids)
                err = rel_err(y, reference_moe(x, w, ids, ref_weights, kept, shared_ref))
                err = _all_max(err if err == err else float("inf"), group, device)
            res["rel_err"] = err
            if r["check"] and not err <= tol:
                res["status"] = "incorrect"
                res["reason"] = f"rel_err {err:.3g} > {tol:g} ({quant.name})"
                yield T, res
                continue

            x, w, ids = make_inputs(shape, T, *routing, salt=2, device=device)
            fn = lambda: kernel(x, w, ids)  # noqa: E731
            use_graph = r["timing"] == "graph" and T <= r["graph_max_tokens"]
            mode = "graph" if use_graph else ("profiler" if r["timing"] == "profiler" else "events")
            res["timing_mode"] = mode
            # the layer, and for the ablation the layer without its shared experts and
            # the shared experts alone, with their samples interleaved
            fns = [fn]
            if shared is not None:
                fns += [lambda: kernel(x, w, ids, with_shared=False), lambda: shared(x)]
            agree = lambda n: _all_max(n, group, device)  # noqa: E731
            with _nsys_capture(task["key"], run_dir, T, rank) if under_nsys else nullcontext({}) as nsys_row:
                phase_lead = _phase_head_start(kernel, fn, rec, barrier, device, agree) if r["phase_reps"] else 0
                timed = timing.time_interleaved(fns, device, r["reps"], r["warmup"], barrier=barrier, flush=flush,
                                                align=align, graph=use_graph, warmup_ms=r.get("warmup_ms", 0.0),
                                                agree=agree)
                res["samples_us"] = timed[0].us
                res.update(_phase_samples(kernel, fn, rec, r["phase_reps"], barrier, flush, align, phase_lead))
            res.update(nsys_row)
            if mode == "profiler":
                res.update(_profiled_phases(kernel, fn, task, rank, T, run_dir, r, barrier, flush, align, group, device))
            if shared is not None:
                res["no_shared_samples_us"] = timed[1].us
                res["shared_samples_us"] = timed[2].us
            if r["memory"]:
                res["workspace_bytes_analytic"] = kernel.workspace_bytes(T)
                res["analytic_peak_bytes"] = kernel.analytic_peak_bytes(T)
                peak = memory.forward_peak_bytes(fn, device, kernel.clear_workspaces)
                res["workspace_bytes_peak"] = peak
                if peak is not None and setup_used is not None and task.get("baseline_used") is not None:
                    res["device_bytes_peak"] = setup_used - task["baseline_used"] + peak
            counts = _routing_counts(kernel, x, w, ids)
            exp_us = res.get("experts", float("nan"))
            res["tflops"] = _rate(expert_flops(counts["pairs"], shape.hidden, shape.intermediate), exp_us, 1e12)
            nbytes = expert_bytes(counts["hit"], weights.nbytes_per_expert(), counts["rows_in"], counts["rows_out"], shape.hidden, quant.act_bytes)
            res["hbm_gbps"] = _rate(nbytes, exp_us, 1e9)
            res["expert_bytes"] = nbytes
            res["expert_flops"] = expert_flops(counts["pairs"], shape.hidden, shape.intermediate)
            # the dispatch / combine windows hold the shared experts when they overlap
            # them, so a link rate is only defined for overlap=none
            comm_us = res.get("dispatch", 0.0) + res.get("combine", 0.0)
            linked = counts["comm_bytes"] and combo["overlap"] == "none"
            res["nvlink_gbps"] = _rate(counts["comm_bytes"], comm_us, 1e9) if linked else float("nan")
            if combo.get("trace") == "torch" or (combo.get("trace") == "nsys" and not under_nsys):
                res.update(_capture_trace(kernel, fn, task, rank, T, run_dir, cfg["trace"], barrier,
                                          inputs=(x, w, ids), align=align, flush=flush, agree=agree,
                                          world_size=world_size))
            res["row_layout_used"] = getattr(kernel.experts, "last_layout", "")
            res["status"] = "ok"
            yield T, res
    finally:
        kernel.close()


def _profiled_phases(kernel, fn, task, rank, T, run_dir, r, barrier, flush, align=None, group=None, device=None) -> dict:
    """Phase times from kernel durations (torch profiler), replacing the event-based ones."""
    from .traces import torch_trace

    path = torch_trace.trace_path(os.path.join(run_dir, "traces", "profiler"), task["key"], rank, T, gzip_=True)
    kernel.phases = _make_recorder(torch.device("cpu"), nvtx=False)  # record_function ranges only
    try:
        prof = timing.profile_kernels(fn, str(path), samples=max(3, min(r["reps"], 20)), barrier=barrier, flush=flush,
                                      align=align, agree=lambda n: _all_max(n, group, device), device=device)
    finally:
        kernel.phases = NULL_PHASES
    kernels = prof.pop("kernels")
    return {**prof, "kernel_us": json.dumps(kernels, sort_keys=True), "profiler_trace_path": os.path.relpath(path, run_dir)}


def _release_cached(device: torch.device) -> None:
    if device.type == "cuda":
        gc.collect()
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def _nsys() -> bool:
    from .traces.nsys import nsys_available

    return nsys_available()


_nsys_captures = 0  # capture ranges this rank process has opened: nsys numbers its reports in this order


@contextmanager
def _nsys_capture(key: str, run_dir: str, tokens: int = 0, rank: int = 0) -> Iterator[dict]:
    """Under nsys, around the timed work of one row (the timed samples and the phase samples):
    the NVTX range that starts and ends one capture (traces/nsys.py `nsys_rank_prefix`),
    recorded in this rank process's capture manifest (traces/nsys.py `record_capture`): once the
    ranks have exited, the launcher sets the row's `trace_path` to the report that exists, or its
    `trace_error` to why there is none (traces/nsys_import.py `resolve_nsys_rows`). Yields {}:
    the row names no file before it exists."""
    global _nsys_captures
    from .traces.nsys import record_capture
    from .traces.nvtx import capture_range

    with capture_range(key) as api:
        if api is not None:
            _nsys_captures += 1
        record_capture(run_dir, os.getpid(), _nsys_captures if api is not None else None, key, tokens, rank, api)
        yield {}


def _capture_trace(kernel, fn, task, rank, T, run_dir, trace_cfg, barrier, inputs=None, align=None,
                   flush=None, agree=None, world_size: int = 1) -> dict:
    """Torch trace of `trace_cfg["samples"]` layer samples (`sample/<i>`); when the layer
    overlaps shared experts (overlap != none) and `inputs` = (x, w, ids) are given, then as
    many samples of the layer without them (`sample_noshared/<i>`: kernel(x, w, ids,
    with_shared=False)) and of the shared experts alone (`sample_shared/<i>`: kernel.shared(x),
    inside a `shared_experts` range), from which traces/metrics.py computes the stretch-aware
    `trace_overlap_fraction`. Every rank runs the same sequence, with the barrier, then the
    GPU alignment (`align`, as the timed samples have it), before each sample, outside its
    range: a rank that starts late would otherwise show up as waiting inside its peer's
    communication kernels. On several GPUs each sample also starts as a timed one does:
    after the L2 flush and a head start of the slowest callable's host enqueue time
    (timing.lead_cycles, measured with the trace's ranges on). With several ranks (all on
    this host: the process group rendezvous is on 127.0.0.1), rank 0 then reads every
    rank's trace and adds `trace_matched_overlap_per_rank` (traces/metrics.py: the overlap
    on communication intervals trimmed of the wait for the last rank)."""
    from .traces import torch_trace

    path = torch_trace.trace_path(os.path.join(run_dir, trace_cfg["dir"]), task["key"], rank, T)
    rec = _make_recorder(torch.device("cpu"), nvtx=True)  # record_function ranges only
    ablation = None
    if inputs is not None and kernel.shared is not None and kernel.overlap != "none":
        x, w, ids = inputs

        def shared_alone():
            with kernel.phases("shared_experts"):
                return kernel.shared(x)

        ablation = {"noshared": lambda: kernel(x, w, ids, with_shared=False), "shared": shared_alone}
    kernel.phases = rec
    device = torch.device("cuda", torch.cuda.current_device()) if align is not None else None
    lead = 0
    try:
        if barrier is not None and device is not None:  # collective: the same calls on every rank
            lead = max(timing.lead_cycles(f, device, agree) for f in [fn, *(ablation or {}).values()])
    except BaseException:
        kernel.phases = NULL_PHASES
        raise

    sync = timing.sample_start(barrier, flush, align, lead) if (align is not None or flush is not None) else barrier
    try:
        torch_trace.capture(fn, path, samples=trace_cfg["samples"], combo_key=task["key"], barrier=sync,
                            ablation=ablation)
    finally:
        kernel.phases = NULL_PHASES
    out = {"trace_path": os.path.relpath(path, run_dir)}
    try:
        from .traces.analyze import trace_row

        row = trace_row(path)
        if row["trace_overlap_fraction"] is not None:
            out["trace_overlap_fraction"] = row["trace_overlap_fraction"]
            out["trace_overlap_method"] = row["trace_overlap_method"]
        if row["trace_intersection_fraction"] is not None:
            out["trace_intersection_fraction"] = row["trace_intersection_fraction"]
        if row.get("trace_layer_us") is not None:
            out["trace_layer_us"] = row["trace_layer_us"]
    except Exception as e:  # a trace we cannot parse still leaves the row
        out["trace_error"] = f"{type(e).__name__}: {e}"
    if world_size > 1 and barrier is not None:
        barrier()  # every rank's trace is written
        if rank == 0:
            paths = [torch_trace.trace_path(os.path.join(run_dir, trace_cfg["dir"]), task["key"], r, T)
                     for r in range(world_size)]
            try:
                from .traces.analyze import matched_figures

                out.update(matched_figures(paths))
            except Exception as e:  # a peer's trace missing or unreadable: the per-rank figures stay
                out["trace_error"] = f"matched figure: {type(e).__name__}: {e}"
    return out


# ---------------------------------------------------------------------------


def rank_main(rank: int, world_size: int, device_kind: str, port: int, tasks: list, queue, run_dir: str) -> None:
    """Entry point of one rank: run `tasks` in order, report each result."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher decides when to stop
    idx: Optional[int] = None
    task: dict = {}
    try:
        if device_kind == "cuda":
            device = torch.device("cuda", rank)
            torch.cuda.set_device(device)
            torch.zeros(1, device=device)  # create the context before the baseline
        else:
            device = torch.device("cpu")
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
        group = None
        if world_size > 1:
            kw = {"device_id": device} if device_kind == "cuda" else {}
            dist.init_process_group(
                "nccl" if device_kind == "cuda" else "gloo",
                init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size, **kw,
            )
            group = dist.group.WORLD
        baseline = memory.device_used_bytes(device)
        backends = set()
        for idx, task in tasks:
            backends.add(task["combo"]["backend"])
            task = dict(task, baseline_used=baseline)
            queue.put(("start", idx, rank, None))
            marked = task["combo"].get("trace") in ("nvtx", "nsys")
            with _combo_range(task["key"]) if marked else nullcontext():
                for tokens, res in run_combination(task, rank, world_size, group, device, run_dir):
                    queue.put(("result", idx, rank, (tokens, res)))
            queue.put(("done", idx, rank, None))
        if group is not None:
            for name in sorted(backends):  # collective: every rank releases the same backends
                registry.get_backend(name).release_group(group)
            dist.destroy_process_group()
        queue.put(("exit", None, rank, None))
    except BaseException as e:  # noqa: BLE001 - everything becomes a row
        oom = isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()
        msg = f"{type(e).__name__}: {e}".strip()
        queue.put(("error", idx, rank, {"status": "oom" if oom else "failed", "reason": msg[:500],
                                         "tokens": task.get("current_tokens"), "traceback": traceback.format_exc()[-4000:]}))
    finally:
        queue.close()
        queue.join_thread()

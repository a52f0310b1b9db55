"""Per rank: build the layer, check it against the reference, time it, measure memory,
capture traces — one typed step each (layer.py, measure.py, derived.py, capture.py).
Ranks receive `Task`s and report `messages` through a queue to launch.py; they never
run @hydra.main."""

from __future__ import annotations

import dataclasses
import gc
import os
import signal
import time
import traceback
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Iterator, Optional

import torch
import torch.distributed as dist

from moebench.config.device import cpu_threads
from moebench.config.validity import timing_mode, timing_note
from moebench.kernels import registry
from moebench.kernels.interfaces import PrepareFinalize
from moebench.measure import memory
from moebench.measure.capture import capture_trace, make_recorder, nsys_capture, profiled_phases
from moebench.measure.derived import derived_figures, routing_counts
from moebench.measure.layer import build_layer, kernel_context, reference_of
from moebench.measure.samples import (
    check,
    host_enqueue,
    host_time_note,
    memory_figures,
    paced_mode,
    rank_sync,
    time_layer,
)
from moebench.measure.workload import drop_kept_weights, make_routed, routing_spec, tokens_rank, weights_key
from moebench.results.rank_result import NAN, RankResult
from moebench.results.row import Status
from moebench.run.lifeline import die_with
from moebench.run.messages import Done, Error, Exited, Result, Started, Task
from moebench.run.outcome import raised_status


def _release_cached(device: torch.device) -> None:
    if device.type == "cuda":
        gc.collect()
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def _under_nsys(combo) -> bool:
    """trace=nsys with nsys on the PATH: the launcher started this rank under nsys."""
    if combo.trace != "nsys":
        return False
    from moebench.traces.nsys import nsys_available

    return nsys_available()


class Stopwatch:
    """Where a rank's time goes (the `harness_*_s` columns of a row, results/row.py): `lap(name)`
    adds the seconds since the previous lap to `name`. On a GPU each lap first waits for the
    work enqueued so far, so GPU work is counted in the stage that enqueued it (the stages
    end in a synchronisation of their own anyway: this changes no measurement)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.s: dict[str, float] = {}
        self._t = time.perf_counter()

    def lap(self, name: str) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        now = time.perf_counter()
        self.s[name] = self.s.get(name, 0.0) + now - self._t
        self._t = now
        return self.s[name]

    def stamp(self, res: RankResult) -> RankResult:
        """`res` with this token count's stages and its total (setup and start included)."""
        res = dataclasses.replace(res)
        for k, v in self.s.items():
            setattr(res, f"harness_{k}_s", v)
        before = sum(v for v in (res.harness_setup_s, res.harness_start_s) if v == v)  # NaN: unknown
        res.harness_total_s = sum(self.s.values()) + before
        return res


def process_age_s() -> float:
    """Seconds since this process started (Linux's /proc; NaN elsewhere): a rank's start,
    imports and process group formation, read once it is ready for its first combination."""
    try:
        start_ticks = int(open("/proc/self/stat").read().rpartition(")")[2].split()[19])
        return time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return NAN


def run_combination(
    task: Task,
    rank: int,
    world_size: int,
    group,
    device: torch.device,
    run_dir: str,
    baseline_used: Optional[int] = None,
    start_s: Optional[float] = None,
) -> Iterator[tuple[int, Optional[RankResult]]]:
    """For each token count of one combination, yield (tokens, None) when it starts and
    (tokens, this rank's RankResult) when it is done. The first row carries the combination's
    setup time and `start_s` (the rank's start and group formation where this is the first
    combination it runs, 0 after it; None: not known)."""
    combo = task.combo
    clock = Stopwatch(device)
    # the previous combination's expert weights stay only where this one uses the same ones
    drop_kept_weights(unless=weights_key(kernel_context(combo, rank, world_size, group, device), combo.seed))
    _release_cached(device)  # a previous combination's cached blocks must not count as ours
    layer = build_layer(combo, rank, world_size, group, device, keep_weights=True)
    ctx, kernel = layer.ctx, layer.kernel
    shape, quant, seed = ctx.shape, ctx.quant, combo.seed
    # the build's freed temporaries (drawing and quantizing the expert weights: ~4 GiB of cached
    # blocks for deepseek_v2_lite) must not count as the layer's: only a combination that built
    # its weights, not one that reused the kept ones, would hold them
    _release_cached(device)
    setup_used = memory.device_used_bytes(device)
    sync = rank_sync(group, device, combo.l2_flush)
    ref = reference_of(layer, seed, device)  # a TP rank's: the whole layer's
    ref_weights, kept, shared_ref = ref.expert_fn, ref.kept, ref.shared
    drawn = tokens_rank(ctx)  # TP ranks draw rank 0's tokens
    rec = make_recorder(device, nvtx=combo.trace in ("nvtx", "nsys"))
    under_nsys = _under_nsys(combo)
    spec = routing_spec(combo)
    setup_s = clock.lap("setup")

    def route(T: int, salt: int):
        return make_routed(shape, T, spec, drawn, salt, device, combo.simulate_rank)

    try:
        for i, T in enumerate(task.tokens):
            yield T, None
            clock = Stopwatch(device)
            res = RankResult(
                rank=rank,
                harness_setup_s=setup_s if i == 0 else 0.0,
                harness_start_s=(NAN if start_s is None else start_s) if i == 0 else 0.0,
            )
            # correct first: fresh random data, compared with the float32 reference
            try:
                if combo.check:
                    checked = route(T, 1)
                    inputs = checked.inputs
                    _fill(kernel, combo, checked, group, world_size)
                    ref_key = (
                        ref.shape,
                        quant,
                        seed,
                        T,
                        spec,
                        drawn,
                        1,
                        combo.simulate_rank,
                        (kept.start, kept.stop) if kept is not None else None,
                        shared_ref is not None,
                    )
                    err, why = check(
                        kernel,
                        inputs,
                        ref_weights,
                        kept,
                        shared_ref,
                        quant.name,
                        group,
                        device,
                        combo.memory_budget,
                        ref_key,
                    )
                    res = dataclasses.replace(res, rel_err=err)
                    del inputs
                    clock.lap("check")
                    if why:
                        yield T, clock.stamp(dataclasses.replace(res, status=Status.INCORRECT, reason=why))
                        continue
                routed = route(T, 2)
                inputs = routed.inputs
                # the ranks' routings are summed over an EP split only (TP ranks route the same tokens)
                ep_world = world_size if spec.ep_size > 1 else 1
                res = dataclasses.replace(res, **routing_fields(routed, combo, kernel, spec.ep_size, group, ep_world))
                kernel.clear_workspaces()
                clock.lap("inputs")
                with memory.capped(device, combo.memory_budget) as cap:
                    fields = _measure(
                        task,
                        kernel,
                        layer,
                        inputs,
                        T,
                        rank,
                        world_size,
                        sync,
                        device,
                        run_dir,
                        rec,
                        under_nsys,
                        setup_used,
                        baseline_used,
                        clock,
                    )
            except torch.OutOfMemoryError as e:
                if not combo.memory_budget or world_size > 1:
                    raise  # a real OOM: the whole process group goes (its peers wait in a collective)
                # under runner.memory_budget on one rank: this token count does not fit the budget
                kernel.clear_workspaces()
                _release_cached(device)
                # torch's first line says what was allowed, allocated and reserved-but-unallocated
                msg = str(e).splitlines()[0][:700]
                yield (
                    T,
                    clock.stamp(
                        dataclasses.replace(
                            res,
                            status=Status.OOM,
                            reason=(
                                f"runner.memory_budget={combo.memory_budget} bytes: the layer needs more at "
                                f"{T} tokens per rank (OutOfMemoryError: {msg})"
                            ),
                        )
                    ),
                )
                continue
            fields["memory_cap_bytes"] = float(cap) if cap else float("nan")
            yield T, clock.stamp(dataclasses.replace(res, **fields))
    finally:
        kernel.close()


def _global_pairs(routed, group, world_size: int) -> torch.Tensor:
    """Pairs per global expert over every rank's tokens (a sum over the group; one rank, or an
    emulated run, knows them already)."""
    pairs = routed.expert_pairs
    if world_size > 1 and group is not None:
        import torch.distributed as dist

        nccl = dist.get_backend(group) == "nccl"
        t = pairs.to(torch.device("cuda", torch.cuda.current_device()) if nccl else "cpu")
        dist.all_reduce(t, group=group)
        pairs = t.cpu()
    return pairs


def _local_counts(kernel, routed, group, world_size: int) -> torch.Tensor:
    """Pairs per local expert of this rank, from every rank's tokens."""
    ctx = kernel.pf.ctx
    first, n = ctx.first_local_expert, ctx.num_local_experts
    if routed.simulated_rank is not None or world_size == 1:
        ids = routed.inputs[2].flatten()
        local = ids[(ids >= first) & (ids < first + n)] - first
        return torch.bincount(local.cpu(), minlength=n)
    return _global_pairs(routed, group, world_size)[first : first + n]


def _fill(kernel, combo, routed, group, world_size: int) -> Optional[tuple[int, torch.Tensor]]:
    """workload.fill: size the batched buffers so the busiest local expert fills that share of
    its rows; (rows, local counts), or None without fill."""
    if not combo.fill:
        return None
    from moebench.routing.generate import fill_rows

    counts = _local_counts(kernel, routed, group, world_size)
    rows = fill_rows(int(counts.max().item()), combo.fill)
    kernel.pf.rows_per_expert = rows
    return rows, counts


def routing_fields(routed, combo, kernel, ep_size: int, group, world_size: int) -> dict:
    """The routing columns of a row (results/row.py, group "routing") for the measured inputs;
    sets workload.fill's rows per expert."""
    from moebench.routing.generate import imbalance

    pairs = routed.expert_pairs if routed.simulated_rank is not None else _global_pairs(routed, group, world_size)
    imb = imbalance(pairs, ep_size)
    out = {"imbalance_experts": imb.experts, "imbalance_ranks": imb.ranks, "routing_window": routed.window}
    if routed.simulated_rank is not None:
        out.update(simulated_rank=float(routed.simulated_rank), received_tokens=float(routed.received_tokens))
    if combo.routing == "replay":
        from moebench.routing.file import load

        layer = None if combo.routing_layer < 0 else combo.routing_layer
        out["routing_source"] = load(combo.routing_file, layer).source
    filled = _fill(kernel, combo, routed, group, world_size)
    if filled:
        rows, counts = filled
        out.update(
            fill_rows=float(rows), fill_max=counts.max().item() / rows, fill_mean=counts.double().mean().item() / rows
        )
    return out


def _measure(
    task: Task,
    kernel,
    layer,
    inputs,
    T: int,
    rank: int,
    world_size: int,
    sync,
    device,
    run_dir: str,
    rec,
    under_nsys: bool,
    setup_used,
    baseline_used,
    clock: Stopwatch,
) -> dict:
    """One token count's timed samples, phases, memory, derived figures and traces (each
    stage's seconds on `clock`)."""
    combo, shape, quant = task.combo, layer.ctx.shape, layer.ctx.quant
    x, w, ids = inputs
    fn = lambda: kernel(x, w, ids)
    mode, note = timing_mode(combo, T), timing_note(combo, T)
    reserved_base = memory.region_start(device)
    host_us = host_enqueue(kernel, inputs, device)
    clock.lap("probe")
    capture: AbstractContextManager[dict] = nsys_capture(task.key, run_dir, T, rank) if under_nsys else nullcontext({})
    with capture as nsys_row:
        timed = time_layer(
            kernel, inputs, combo, sync, device, rec, graph=mode == "graph", hold_us=host_us, lap=clock.lap
        )
    if device.type == "cuda":
        paced = paced_mode(mode, host_us, timed.host_paced, len(timed.samples_us))
        if paced != mode:
            note = host_time_note(host_us, timed.host_paced, len(timed.samples_us))
        mode = paced
    fields = {
        "timing_mode": mode,
        "samples_us": timed.samples_us,
        "phases_us": timed.phases_us,
        "no_shared_samples_us": timed.no_shared_samples_us,
        "shared_samples_us": timed.shared_samples_us,
        "host_enqueue_us": host_us,
        **timed.paced_fields(device.type == "cuda"),
        **timed.clock,
        "timing_note": note,
        **nsys_row,
    }
    if mode == "profiler":
        fields.update(profiled_phases(kernel, fn, task.key, rank, T, run_dir, combo.reps, sync, device))
        clock.lap("trace")
    reserved = memory.reserved_peak_bytes(device, reserved_base)  # timed samples and phases
    if combo.memory:
        # x's rows, not T: simulate_rank runs the M tokens the emulated rank receives
        fields.update(memory_figures(kernel, fn, x.shape[0], device, setup_used, baseline_used))
        # memory_figures reset the peak counters for its one forward: the larger of the two
        again = memory.reserved_peak_bytes(device, reserved_base)
        reserved = max(reserved, again) if reserved is not None and again is not None else reserved
    if reserved is not None:
        fields["reserved_bytes_peak"] = float(reserved)
    clock.lap("memory")
    fields.update(
        derived_figures(
            routing_counts(kernel, x, w, ids),
            fields["phases_us"],
            shape.hidden,
            shape.intermediate,
            layer.weights.nbytes_per_expert(),
            quant.act_bytes,
            combo.overlap,
        )
    )
    if combo.trace == "torch" or (combo.trace == "nsys" and not under_nsys):
        fields.update(
            capture_trace(kernel, fn, task.key, rank, T, run_dir, combo, sync, inputs=inputs, world_size=world_size)
        )
    fields["row_layout_used"] = getattr(kernel.experts, "last_layout", "")
    fields["contiguous_gemm_used"] = getattr(kernel.experts, "last_gemm", "")
    fields["tuned_files"] = getattr(kernel.experts, "tuned_files", None)  # set at build: Triton experts only
    clock.lap("trace")
    return fields


class GroupNotFormed(RuntimeError):
    """The process group did not form within runner.startup_timeout_s (its reason is LOST's)."""


def rank_device(device_kind: str, local_rank: int) -> torch.device:
    """This rank's device: its GPU (its context created, before the memory baseline), or the
    CPU with MOEBENCH_CPU_THREADS torch threads, 1 unless set (config/device.py cpu_threads;
    env.json records it)."""
    if device_kind == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        torch.zeros(1, device=device)
        return device
    torch.set_num_threads(cpu_threads())
    return torch.device("cpu")


def form_group(device: torch.device, rank: int, world_size: int, init_method: str, startup_s: float):
    """The process group of `world_size` ranks, formed within `startup_s` (every rank joined): a
    rank lost before that raises GroupNotFormed there, not after gloo's 30-minute default, which
    held the sweep and its lock. Once formed, collectives wait as long as torch's defaults again
    (a combination's own deadline is the launcher's or rank 0's watchdog's)."""
    import datetime

    from torch.distributed import distributed_c10d as c10d

    from moebench.results.store import LOST

    cuda = device.type == "cuda"
    kw: dict[str, Any] = {"device_id": device} if cuda else {}
    try:
        dist.init_process_group(
            "nccl" if cuda else "gloo",
            init_method=init_method,
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=startup_s),
            **kw,
        )
    except Exception as e:  # the store's timeout, a refused or reset connection
        first = (str(e).strip().splitlines() or [""])[0][:300]
        raise GroupNotFormed(
            f"{LOST}the process group of {world_size} ranks did not form within "
            f"{startup_s:g} s (runner.startup_timeout_s): a rank was lost or never started "
            f"(rank {rank}: {type(e).__name__}: {first})"
        ) from e
    long = c10d.default_pg_nccl_timeout if cuda else c10d.default_pg_timeout
    assert long is not None  # torch's defaults: NCCL's is set wherever NCCL formed the group above
    c10d._set_pg_timeout(long, None)
    c10d._get_default_store().set_timeout(long)
    return dist.group.WORLD


def _setup(rank: int, world_size: int, device_kind: str, port: int, startup_s: float = 30.0):
    """This rank's device and process group (None on one rank)."""
    device = rank_device(device_kind, rank)
    group = form_group(device, rank, world_size, f"tcp://127.0.0.1:{port}", startup_s) if world_size > 1 else None
    return device, group


def rank_main(
    rank: int,
    world_size: int,
    device_kind: str,
    port: int,
    tasks: list[Task],
    queue,
    run_dir: str,
    parent_pid: Optional[int] = None,
    pdeathsig: bool = True,
) -> None:
    """Entry point of one rank: run `tasks` in order, report each result. The rank dies with
    `parent_pid` (moebench/run/lifeline.py)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher decides when to stop
    die_with(parent_pid, pdeathsig)
    idx: Optional[int] = None
    tokens: Optional[int] = None
    try:
        # the plugins import first, each within MOEBENCH_PLUGIN_TIMEOUT_S: a hang there is the start-up's
        # (run/outcome.py), and one that ends disables its plugin before any combination asks for it
        registry.discover()
        device, group = _setup(
            rank, world_size, device_kind, port, max((t.combo.startup_timeout_s for t in tasks), default=30.0)
        )
        baseline = memory.device_used_bytes(device)
        backends = set()
        start_s: Optional[float] = process_age_s()  # the first combination's rows carry it
        for task in tasks:
            idx, tokens = task.idx, None
            backends.add(task.combo.backend)
            queue.put(Started(idx, rank))
            marked = task.combo.trace in ("nvtx", "nsys")
            from moebench.traces.nvtx import combo_range

            with combo_range(task.key) if marked else nullcontext():
                for tokens, res in run_combination(task, rank, world_size, group, device, run_dir, baseline, start_s):
                    if res is not None:
                        queue.put(Result(idx, rank, tokens, res))
            start_s = 0.0
            queue.put(Done(idx, rank))
            tokens = None
        if group is not None:
            for name in sorted(backends):  # collective: every rank releases the same backends
                backend: type[PrepareFinalize] = registry.get_backend(name)
                backend.release_group(group)
            dist.destroy_process_group()
        queue.put(Exited(rank))
    except BaseException as e:  # noqa: BLE001 - everything becomes a row
        msg = f"{type(e).__name__}: {e}".strip()
        queue.put(Error(idx, rank, raised_status(e), msg[:500], tokens, traceback.format_exc()[-4000:]))
    finally:
        queue.close()
        queue.join_thread()

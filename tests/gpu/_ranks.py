"""Two spawned NCCL ranks for the GPU tests that drive a backend directly
(tests/gpu/test_deepep_ll.py, test_pplx.py).

run_job(module, fn_name, args, out_dir) runs module.fn_name(rank, device, *args) on each
rank, then module._after_job(rows) (the collective clean-up of its library), and returns
the per-rank rows, or raises with the first rank's traceback. A rendezvous port taken
between choosing it and binding it (EADDRINUSE) is retried with a new one.
"""

from __future__ import annotations

import importlib
import json
import os
import time
import traceback

import torch

WORLD = 2
# never NVLink multicast / NVLS on the shared machines
COMM_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
PORT_TRIES = 3


def _write(out: str, data: dict) -> None:
    with open(out, "w") as f:
        json.dump(data, f)


def _rank_entry(rank, port, module, fn_name, args, out_dir):
    import torch.distributed as dist

    os.environ.update(COMM_ENV)
    out = os.path.join(out_dir, f"rank{rank}.json")
    try:
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
        dist.init_process_group(
            "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD, device_id=device
        )
        mod = importlib.import_module(module)
        rows = getattr(mod, fn_name)(rank, device, *args)
    except BaseException:  # noqa: BLE001 (a rank must report any failure, exit included, before it dies)
        _write(out, {"error": traceback.format_exc()})
        os._exit(1)  # no collective clean-up: the other rank may be stuck in a collective
    after = getattr(mod, "_after_job", None)
    if after is not None:
        after(rows)  # collective: both ranks got here
    dist.destroy_process_group()
    _write(out, {"rows": rows})


def _spawn_once(module, fn_name, args, out_dir, timeout_s, hang_hint):
    import torch.multiprocessing as mp

    from moebench.run.launch import free_port

    for r in range(WORLD):
        path = os.path.join(out_dir, f"rank{r}.json")
        if os.path.exists(path):
            os.remove(path)
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=_rank_entry, args=(r, port, module, fn_name, args, str(out_dir))) for r in range(WORLD)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s
    why = None
    while any(p.exitcode is None for p in procs):
        if any(p.exitcode not in (None, 0) for p in procs):
            why = "a rank failed"
            break
        if time.monotonic() > deadline:
            why = f"no result within {timeout_s} s{hang_hint}"
            break
        time.sleep(0.5)
    for p in procs:
        if p.exitcode is None:
            p.kill()
        p.join(10)
    return procs, why


def run_job(module: str, fn_name: str, args, out_dir, timeout_s: float = 600, hang_hint: str = ""):
    os.environ.update(COMM_ENV)
    for attempt in range(PORT_TRIES):
        procs, why = _spawn_once(module, fn_name, args, out_dir, timeout_s, hang_hint)
        per_rank, errors = [], []
        for r in range(WORLD):
            path = os.path.join(out_dir, f"rank{r}.json")
            data = json.load(open(path)) if os.path.exists(path) else {}
            if "error" in data:
                errors.append(f"rank {r}:\n{data['error']}")
            per_rank.append(data.get("rows"))
        if errors and "EADDRINUSE" in errors[0] and attempt + 1 < PORT_TRIES:
            continue  # the rendezvous port was taken before rank 0 bound it
        if errors:
            raise RuntimeError(errors[0])
        if why or any(x is None for x in per_rank):
            raise RuntimeError(f"{why or 'a rank wrote no result'} (exit codes {[p.exitcode for p in procs]})")
        return per_rank
    raise AssertionError("unreachable")

"""The plain DeepEP + shared-expert overlap test (docs/findings/overlap.md), on moebench's
timing: DeepEP HT combine alone, the deepseek_v3 shared expert alone, both overlapped
(combine with async_finish on DeepEP's stream, shared expert on the current stream),
and both in sequence, on 2 GPUs with both ranks starting the combine together (no
expert GEMMs before it, unlike a whole layer). A benchmark, not a test: it tells what
the machine allows, next to what `overlap=combine` gets inside the layer.

    python benchmarks/deepep_overlap.py [--tokens 128 1024 4096] [--num-sms 24]
        [--carveout 0 24] [--combine-chunk 0] [--reps 40]
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.distributed as dist

from moebench.kernels.modular import SharedExperts
from moebench.kernels.prepare_finalize import _deepep
from moebench.measure import timing
from moebench.measure.samples import rank_sync
from moebench.run.launch import run_ranks
from moebench.util.arg_errors import OneLineErrors, script_prog

HIDDEN, EXPERTS, TOPK, SHARED_I = 7168, 256, 8, 2048  # deepseek_v3


def _timed_fns(ht, recv_x, handle, shared: SharedExperts, x: torch.Tensor) -> dict:
    """The four things timed for one (tokens, carveout): combine alone, the shared expert alone,
    both overlapped, both in sequence (their own arguments, not the loop's variables)."""

    def combine(async_finish=False):
        return ht.buffer.combine(recv_x, handle, config=ht.combine_config, async_finish=async_finish)

    def overlapped():
        _, _, event = combine(async_finish=True)
        shared(x)
        event.current_stream_wait()

    def sequential():
        combine()
        shared(x)

    return {"combine": combine, "shared": lambda: shared(x), "overlapped": overlapped, "sequential": sequential}


def rank_main(rank: int, port: int, args, q) -> None:
    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, device_id=dev)
    group = dist.group.WORLD
    ht = _deepep.get_ht_buffer(group, HIDDEN * 2, args.num_sms, 0, args.combine_chunk)
    g = torch.Generator(device=dev).manual_seed(1 + rank)
    w13 = (torch.randn(2 * SHARED_I, HIDDEN, device=dev, generator=g) * HIDDEN**-0.5).bfloat16()
    w2 = (torch.randn(HIDDEN, SHARED_I, device=dev, generator=g) * SHARED_I**-0.5).bfloat16()
    sync = rank_sync(group, dev)  # barrier, flush, align, agree: as moebench's rows start samples
    rows = []
    for T in args.tokens:
        x = torch.randn(T, HIDDEN, device=dev, generator=g).bfloat16()
        ids = torch.stack([torch.randperm(EXPERTS, device=dev, generator=g)[:TOPK] for _ in range(T)])
        w = torch.rand(T, TOPK, device=dev, generator=g)
        n_rank, n_rdma, n_expert, in_rank, _ = ht.buffer.get_dispatch_layout(ids, EXPERTS)
        recv_x, _, _, _, handle, _ = ht.buffer.dispatch(
            x,
            num_tokens_per_rank=n_rank,
            num_tokens_per_rdma_rank=n_rdma,
            is_token_in_rank=in_rank,
            num_tokens_per_expert=n_expert,
            topk_idx=ids,
            topk_weights=w,
            config=ht.dispatch_config,
        )
        for carveout in args.carveout:
            fns = _timed_fns(ht, recv_x, handle, SharedExperts(w13, w2, sm_carveout=carveout), x)
            s = timing.time_interleaved(
                list(fns.values()), dev, reps=args.reps, warmup=5, warmup_ms=200, **sync.kwargs()
            )
            med = {k: v.median for k, v in zip(fns, s, strict=True)}
            hidden = (med["combine"] + med["shared"] - med["overlapped"]) / med["shared"]
            rows.append({"rank": rank, "tokens": T, "carveout": carveout, **med, "hidden_fraction": hidden})
    q.put(rows)
    _deepep.release_buffers(group)
    dist.destroy_process_group()


def main() -> None:
    ap = OneLineErrors(
        prog=script_prog(__file__), description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--tokens", type=int, nargs="+", default=[128, 1024, 4096])
    ap.add_argument("--num-sms", type=int, default=24)
    ap.add_argument("--combine-chunk", type=int, default=0, help="0: DeepEP's recommended combine config")
    ap.add_argument("--carveout", type=int, nargs="+", default=[0], help="shared experts' SM carveout(s)")
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    if torch.cuda.device_count() < 2:
        raise SystemExit("needs 2 GPUs")
    _deepep.require()
    rows = sorted(
        (r for per_rank in run_ranks(rank_main, 2, (args,), 600) for r in per_rank),
        key=lambda r: (r["tokens"], r["carveout"], r["rank"]),
    )
    print(
        f"DeepEP HT num_sms={args.num_sms} combine_chunk={args.combine_chunk or 'recommended'}; "
        f"µs, medians of {args.reps}"
    )
    for r in rows:
        print(
            f"T={r['tokens']:5d} carveout={r['carveout']:3d} rank {r['rank']}: combine {r['combine']:7.1f} "
            f"shared {r['shared']:7.1f} overlapped {r['overlapped']:7.1f} sequential {r['sequential']:7.1f} "
            f"hidden {r['hidden_fraction']:.2f}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

"""Synthetic results runs in the store's layout, for tests, the notebook and demos.

The numbers are made up (a latency model of a + b * tokens with log-normal noise); only
the layout and the column schema are the store's (schema 2: identity from moebench/config/spec.py).

A run of any size, the same for the same arguments (what the scale benchmark and tests use):

    python -m moebench.results.synthetic --combinations 1000 --tokens 16 32 ... 8192 --out DIR
"""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path

import numpy as np
import pandas as pd

from moebench.config.spec import IDENTITY_COLUMNS, Combo
from moebench.results import row as schema
from moebench.results.row import SCHEMA_VERSION, Status
from moebench.results.store import ENV_FILE, ROWS_DIR
from moebench.util.arg_errors import OneLineErrors
from moebench.util.safe_write import replace_text

# (backend, experts, reduction, overlap, quant, status, reason)
DEFAULT_COMBOS = [
    ("local", "torch", "experts", "none", "bf16", Status.OK, ""),
    ("local", "torch", "finalize", "none", "bf16", Status.OK, ""),
    ("local", "triton", "experts", "dispatch", "bf16", Status.OK, ""),
    ("local", "triton", "finalize", "combine", "bf16", Status.OK, ""),
    ("local", "deepgemm", "experts", "none", "bf16", Status.SKIPPED, "deepgemm needs quant=fp8_block"),
    (
        "local_batched",
        "torch",
        "experts",
        "none",
        "bf16",
        Status.SKIPPED,
        "layouts differ: batched backend with standard experts",
    ),
    ("naive", "torch", "finalize", "none", "bf16", Status.FAILED, "RuntimeError: boom"),
]


def samples_from(median_us: float, spread: float, num_samples: int, rng: np.random.Generator) -> np.ndarray:
    """``num_samples`` latencies (µs) log-normally spread around ``median_us``."""
    return median_us * np.exp(rng.normal(0.0, spread, num_samples))


def make_row(
    backend: str,
    experts: str,
    reduction: str,
    overlap: str,
    quant: str,
    tokens: int,
    status: str = Status.OK,
    reason: str = "",
    samples_us=None,
    model: str = "tiny",
    world_size: int = 1,
    **extra,
) -> dict:
    """One store row (times in µs, memory in bytes); ``samples_us`` sets the latency.
    Identity fields (seed=, routing=, ...) and `knobs_set={"num_sms": 16}` go into the
    row's Combo, so its key changes with them; other keywords overwrite columns."""
    spec = {k: extra.pop(k) for k in list(extra) if k in IDENTITY_COLUMNS or k == "knobs_set"}
    knobs = tuple(sorted(spec.pop("knobs_set", {}).items()))
    combo = Combo(
        backend=backend,
        experts=experts,
        reduction=reduction,
        overlap=overlap,
        quant=quant,
        model=model,
        hidden=spec.pop("hidden", 256),
        intermediate=spec.pop("intermediate", 512),
        num_experts=spec.pop("num_experts", 8),
        topk=spec.pop("topk", 2),
        device=spec.pop("device", "cuda"),
        world_size=world_size,
        knobs=knobs,
        **spec,
    )
    # every column at row.py's default, then what a synthetic run fills in
    row = {
        **schema.empty(),
        "schema_version": SCHEMA_VERSION,
        **combo.columns(),
        "tokens_per_rank": int(tokens),
        "overrides": "",
    }
    row.update(
        run_id="synthetic",
        sweep="synthetic",
        timing_mode="events" if combo.device == "cuda" else "cpu",  # a CPU has no events
        status=Status(status).value,
        reason=reason,
        gpu="cpu",
        git_sha="0" * 40,
        env_id="synthetic",
        timestamp="2026-01-01T00:00:00",
    )
    if status == Status.OK and samples_us is not None:
        s = np.asarray(samples_us, dtype=float)
        med = float(np.median(s))
        row.update(
            samples_us=s.tolist(),
            latency_us_median=med,
            latency_us_p20=float(np.percentile(s, 20)),
            latency_us_p80=float(np.percentile(s, 80)),
            rel_err=1e-3,
            host_enqueue_us=0.25 * med,
        )  # a GPU-bound row: the host enqueues a forward in a quarter of it
        # Phases: fixed shares of the median, weight_reduce only when the finalize reduces.
        shares = dict(prepare_us=0.1, dispatch_us=0.15, experts_us=0.55, combine_us=0.15)
        shares["weight_reduce_us"] = 0.05 if reduction == "finalize" else 0.0
        row.update({k: v * med for k, v in shares.items()})
        # Workspace: per-(token, k) rows of hidden bf16 when the finalize reduces.
        per_token = row["hidden"] * 2 * (row["topk"] if reduction == "finalize" else 1)
        row.update(
            workspace_bytes_analytic=float(tokens * per_token + 4096),
            workspace_bytes_peak=float(tokens * per_token + 8192),
        )
        if overlap != "none":
            shared = 0.2 * med
            exposed = shared * (0.3 if overlap == "dispatch" else 0.5)
            row.update(
                shared_us=shared,
                latency_no_shared_us=med - exposed,
                shared_exposed_us=exposed,
                overlap_fraction=float(np.clip(1 - exposed / shared, 0, 1)),
            )
    row.update(extra)
    return row


def make_rows(
    tokens=(16, 64, 256),
    combos=DEFAULT_COMBOS,
    num_samples: int = 20,
    spread: float = 0.02,
    seed: int = 0,
    scale: float = 1.0,
) -> pd.DataFrame:
    """Synthetic rows for ``combos`` x ``tokens``; ``scale`` multiplies every latency."""
    rng = np.random.default_rng(seed)
    rows = []
    for i, (backend, experts, reduction, overlap, quant, status, reason) in enumerate(combos):
        for t in tokens:
            median = scale * (40.0 + 10.0 * i + 0.5 * t)
            samples = samples_from(median, spread, num_samples, rng)
            rows.append(
                make_row(
                    backend, experts, reduction, overlap, quant, t, status=status, reason=reason, samples_us=samples
                )
            )
    return pd.DataFrame(rows)


def write_run(run_dir: str | Path, df: pd.DataFrame, env: dict | None = None) -> Path:
    """Write ``df`` as a run: one rows/<hash>.parquet per combo_key, plus env.json."""
    run_dir = Path(run_dir)
    rows_dir = run_dir / ROWS_DIR
    rows_dir.mkdir(parents=True, exist_ok=True)
    for key, group in df.groupby("combo_key", sort=False):
        name = hashlib.sha1(str(key).encode()).hexdigest()[:12]
        group.to_parquet(rows_dir / f"{name}.parquet", index=False)
    env = env if env is not None else default_env()
    replace_text(run_dir / ENV_FILE, json.dumps(env, indent=2))
    return run_dir


def default_env() -> dict:
    """A plausible env.json fingerprint, shaped like moebench/run/env.py's."""
    return {
        "gpu": "NVIDIA H200",
        "gpu_count": 2,
        "gpus": ["NVIDIA H200"] * 2,
        "nvidia_smi": ["NVIDIA H200, 580.159.04, 1980 MHz, 1980 MHz, 3201 MHz, 700.00 W, 35"] * 2,
        "cuda": "13.0",
        "nccl": "2.28.9",
        "torch": "2.11.0+cu130",
        "triton": "3.6.0",
        "deep_ep": "1.2.1",
        "deep_gemm": None,
        "pplx_kernels": None,
        "git_sha": "0123456789abcdef0123456789abcdef01234567",
        "git_dirty": False,
        "hostname": "synthetic",
        "env": {"CUDA_DEVICE_MAX_CONNECTIONS": "1"},
    }


def synthetic_run(run_dir: str | Path, scale: float = 1.0, seed: int = 0) -> Path:
    """Create a small synthetic run (ok, skipped, failed, overlap rows) at ``run_dir``."""
    return write_run(run_dir, make_rows(scale=scale, seed=seed))


# what varies among `many_rows`' combinations: 24 per model, then the next model (m0, m1, ...)
_AXES = (("torch", "triton"), ("finalize", "experts"), ("none", "dispatch", "combine"), ("bf16", "fp8_block"))
TOKENS = tuple(2**k for k in range(4, 14))  # 16 ... 8192: ten token counts


def many_rows(
    num_combinations: int, tokens=TOKENS, seed: int = 0, scale: float = 1.0, num_samples: int = 20
) -> pd.DataFrame:
    """`num_combinations` ok combinations x `tokens`: models m0, m1, ... of 24 combinations each
    (experts x reduction x overlap x quant on the local backend); latency (µs) 40 + 0.5 * tokens,
    0.7 x for triton, up to 6 % apart by model, times `scale`; the same rows for the same arguments."""
    rng = np.random.default_rng(seed)
    per_model = list(itertools.product(*_AXES))
    rows = []
    for n in range(num_combinations):
        m, i = divmod(n, len(per_model))
        experts, reduction, overlap, quant = per_model[i]
        for t in tokens:
            med = scale * (40 + 0.5 * t) * (0.7 if experts == "triton" else 1) * (1 + 0.01 * ((m + i) % 7))
            samples = samples_from(med, 0.02, num_samples, rng)
            rows.append(make_row("local", experts, reduction, overlap, quant, t, samples_us=samples, model=f"m{m}"))
    return pd.DataFrame(rows)


def main(argv=None) -> int:
    ap = OneLineErrors(
        prog="python -m moebench.results.synthetic",
        description="write a synthetic run of N combinations x token counts",
    )
    ap.add_argument("--combinations", type=int, default=24, metavar="N")
    ap.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies every latency (a slower candidate: 1.03)")
    ap.add_argument("--samples", type=int, default=20, help="latency samples per row")
    ap.add_argument("--out", required=True, help="the run folder to write (rows/*.parquet, env.json)")
    args = ap.parse_args(argv)
    if args.combinations < 1 or not args.tokens or min(args.tokens) < 1:
        ap.error("--combinations and every --tokens value must be positive")
    df = many_rows(args.combinations, args.tokens, args.seed, args.scale, args.samples)
    print(f"{write_run(args.out, df)}: {len(df)} rows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

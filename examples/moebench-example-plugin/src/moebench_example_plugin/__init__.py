"""An example moebench plugin (moebench docs/plugins.md).

Importing this module registers three entries with moebench:

- experts `mykernel_v1`: a plain torch function looping over the local experts;
- experts `mykernel_v2`: the same math without the Python loop (padded per-expert
  batches and two batched matmuls), the "new version" an A/B sweep measures against v1;
- backend `example_a2a`: a standard-layout prepare/finalize over
  torch.distributed.all_to_all_single (NCCL on GPUs, gloo on CPU ranks).
"""

# the moebench plugin contract this package follows (moebench.kernels.CONTRACT_VERSION)
MOEBENCH_CONTRACT = 1

from . import all_to_all, experts  # noqa: E402,F401  (their decorators register the entries)

"""Fault injection for the harness's own tests: `experts=fault` is the torch experts with a
fault in apply(), registered only when the tests import this module (conftest.py names it
in MOEBENCH_PLUGIN_MODULES, so every rank process registers it too). It never appears to
users. Knobs: experts.fault (what goes wrong), experts.fault_rank (-1: every rank),
experts.fault_s (seconds, for sleep), experts.fault_rows (only from this many rows in
apply(): a later token count). With MOEBENCH_FAULT_ONCE=<path> the fault fires once, in the
process that creates <path> first (a resume then runs clean)."""

from __future__ import annotations

import os
import resource
import signal
import time

import torch
import torch.distributed as dist

from moebench.kernels.experts.torch import TorchExperts
from moebench.kernels.interfaces import Knob
from moebench.kernels.registry import register_experts

MOEBENCH_CONTRACT = 1  # the plugin contract this module follows (docs/plugins.md)
FAULTS = ("none", "sleep", "raise", "kill", "hang_collective", "stuck_rank", "oom", "desync", "wrong", "gpu_hang")


def _first_time() -> bool:
    """Whether this is the fault's one firing (MOEBENCH_FAULT_ONCE unset: always)."""
    path = os.environ.get("MOEBENCH_FAULT_ONCE")
    if not path:
        return True
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


@register_experts("fault")
class FaultExperts(TorchExperts):
    knobs = (
        Knob("fault", "none", "what goes wrong in apply()", choices=FAULTS, tag="{}"),
        Knob("fault_rank", -1, "the rank it goes wrong on (-1: every rank)", minimum=-1, tag="r{}"),
        Knob("fault_s", 0.0, "seconds of a sleep fault", minimum=0.0, tag="{}s"),
        Knob(
            "fault_rows",
            0,
            "the fault fires only when apply() gets at least this many rows (0: always)",
            minimum=0,
            tag="rows{}",
        ),
    )

    def apply(self, output, prepared, workspace13, workspace2):
        opts, rank = self.ctx.options, self.ctx.rank
        fault = opts.get("fault", "none")
        target = opts.get("fault_rank", -1) in (-1, rank) and prepared.x.shape[0] >= opts.get("fault_rows", 0)
        if fault != "none" and target and not _first_time():
            fault = "none"
        if fault != "none":
            self._fault(fault, float(opts.get("fault_s", 0.0)), rank, target)
        super().apply(output, prepared, workspace13, workspace2)
        if fault == "wrong" and target:
            output.mul_(1.5)  # plausible numbers, wrong by 50 %

    def _fault(self, fault: str, seconds: float, rank: int, target: bool) -> None:
        if fault == "hang_collective":  # the target waits in a barrier its peers never reach
            if target:
                dist.barrier(group=self.ctx.group)
            time.sleep(3600)
        if not target:
            return
        if fault == "sleep":
            time.sleep(seconds)
        elif fault == "raise":
            raise RuntimeError(f"injected failure on rank {rank}")
        elif fault == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif fault == "stuck_rank":  # this rank never returns (the others wait in their next collective)
            while True:
                time.sleep(1)
        elif fault == "desync":  # ranks disagree on a collective's shape
            n = 4 + rank
            dist.all_reduce(torch.ones(n, device=self.ctx.device), group=self.ctx.group)
        elif fault == "gpu_hang":  # a kernel that never returns (a spin of 2^60 cycles)
            torch.cuda._sleep(1 << 60)
            torch.cuda.synchronize(self.ctx.device)
        elif fault == "oom":
            if self.ctx.device.type == "cuda":  # a real CUDA OOM: more than the GPU holds
                free, _ = torch.cuda.mem_get_info(self.ctx.device)
                torch.empty(int(free * 2), dtype=torch.uint8, device=self.ctx.device)
            else:  # a real allocation failure, under an address-space cap set in this rank only
                with open("/proc/self/status") as f:
                    vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
                resource.setrlimit(resource.RLIMIT_AS, (vm + (256 << 20), resource.RLIM_INFINITY))
                torch.empty(1 << 30, dtype=torch.uint8).fill_(1)

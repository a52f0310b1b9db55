"""moebench.kernels: the modular MoE layer under test (installed from ./kernels)."""

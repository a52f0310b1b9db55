"""moebench: benchmark and tune modular Mixture-of-Experts layer kernels."""

__version__ = "0.2.0"  # CHANGELOG.md: what each version changed, and when it bumps

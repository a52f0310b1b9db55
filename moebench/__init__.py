"""moebench: benchmark and tune modular Mixture-of-Experts layer kernels."""

__version__ = "0.1.0"
SCHEMA_VERSION = 1

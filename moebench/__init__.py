"""moebench: benchmark and tune modular Mixture-of-Experts layer kernels."""
import os as _os

__version__ = "0.2.0"  # CHANGELOG.md: what each version changed, and when it bumps

# In a source checkout used without installing (PYTHONPATH=<repo>), map
# moebench.kernels to <repo>/kernels as the installed package does.
_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_root, "kernels", "interfaces.py")) and _root not in __path__:
    __path__.append(_root)

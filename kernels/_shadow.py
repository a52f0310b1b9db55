"""`import kernels` with the repository root on sys.path: load the installed `kernels`
distribution in this folder's place (kernels/__init__.py)."""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys


def stand_aside(init_file: str, name: str = "kernels") -> None:
    """Put the top-level `name` found on sys.path without this folder's parent into
    sys.modules[name] (the import statement then returns it), or raise ModuleNotFoundError."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(init_file)))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != root]
    spec = importlib.machinery.PathFinder.find_spec(name, path)
    if spec is None or spec.loader is None or spec.origin in (None, "namespace"):  # none, or a bare folder
        raise ModuleNotFoundError(
            f"No module named {name!r}: {root}/{name} is moebench.kernels (import it by that name), and no "
            f"{name!r} distribution is installed outside it", name=name)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # the import machinery returns what sys.modules holds after this runs
    spec.loader.exec_module(module)
    # this folder's submodules imported while it stood as `kernels` (this one) name another package
    sys.modules.pop(f"{name}._shadow", None)

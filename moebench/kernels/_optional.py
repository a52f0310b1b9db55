"""An optional kernel library, imported on first use: why it cannot be used here
(with how to get it), or the module. Each library's own module keeps its import
checks (`importer`) and install hint; this keeps the wording and caching alike."""

from __future__ import annotations

import functools
import importlib.util
import sys
from typing import Any, Callable, Optional


class OptionalLibrary:
    """`importer()` -> (module, None) or (None, what failed); `missing` starts the reason.
    `module`: the library's import name, looked up first (importlib.util.find_spec) so that a
    library that is not installed is answered without running the importer (whose
    library would import torch): the same words as the failed import's."""

    def __init__(
        self, missing: str, importer: Callable[[], tuple[Optional[Any], Optional[str]]], hint: str, module: str = ""
    ):
        self.missing, self.hint, self.module = missing, hint, module
        self._import = functools.lru_cache(maxsize=1)(self._probe)
        self._importer = importer

    def _probe(self) -> tuple[Optional[Any], Optional[str]]:
        if self.module and self.module not in sys.modules and importlib.util.find_spec(self.module) is None:
            return None, f"ModuleNotFoundError: No module named {self.module!r}"
        return self._importer()

    def load(self) -> tuple[Optional[Any], Optional[str]]:
        """(the module, None), or (None, why it cannot be used and how to install it)."""
        mod, err = self._import()
        if mod is not None:
            return mod, None
        return None, f"{self.missing}: {self.hint} [import failed: {err}]"

    def unavailable_reason(self) -> Optional[str]:
        return self.load()[1]

    def require(self) -> Any:
        """The module; ImportError with the install hint when missing."""
        mod, reason = self.load()
        if mod is None:
            raise ImportError(reason)
        return mod

    def reset(self) -> None:
        """Forget the import outcome (tests simulate a missing or a fake library)."""
        self._import.cache_clear()

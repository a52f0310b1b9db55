"""An optional kernel library, imported on first use: why it cannot be used here
(with how to get it), or the module. Each library's own module keeps its import
checks (`importer`) and install hint; this keeps the wording and caching alike."""
from __future__ import annotations

import functools
from typing import Any, Callable, Optional


class OptionalLibrary:
    """`importer()` -> (module, None) or (None, what failed); `missing` starts the reason."""

    def __init__(self, missing: str, importer: Callable[[], tuple[Optional[Any], Optional[str]]], hint: str):
        self.missing, self.hint = missing, hint
        self._import = functools.lru_cache(maxsize=1)(importer)

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

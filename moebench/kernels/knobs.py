"""Knobs: typed settings an entry (backend or experts) declares beside the axes.

An entry lists its knobs in `knobs`; the harness puts each one in its config group
(`backend.<name>` / `experts.<name>`, typed, so a misspelled key fails when the config
is composed), in the combination's identity (left out at its default, so that a knob
added later keeps the keys of stored rows), in a row column of the same name and, off
its default, in the row's label as `tag` formatted with the value. The entry reads the
value from `ctx.options[name]`.

Kernels never import moebench: plugins declare knobs with this class too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True)
class Knob:
    name: str  # config key inside the entry's group, and the row column
    default: Any  # int, float, bool or str: its type is the knob's type
    help: str
    choices: tuple = ()  # allowed values (str knobs), empty: any
    minimum: Optional[float] = None  # numeric knobs: smallest allowed value
    tag: str = ""  # label tag off the default, e.g. "sms{}" (empty: "<name>{}")

    @property
    def type(self) -> type:
        return type(self.default)

    def check(self, value: Any) -> Optional[str]:
        """Why `value` is not allowed, or None."""
        if self.choices and value not in self.choices:
            return f"{value!r}; valid: {', '.join(map(str, self.choices))}"
        if self.minimum is not None and not value >= self.minimum:
            return f"{value!r} must be >= {self.minimum:g}"
        return None

    def label(self, value: Any) -> str:
        return (self.tag or f"{self.name}{{}}").format(value)

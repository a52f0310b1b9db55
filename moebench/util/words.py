"""Wording every room shares: a count with its noun ('1 row', '3 rows'), a word that agrees
with a count ('1 row runs', '3 rows run'), so that no line writes 'row(s)' or picks the
form by hand, a duration ('3 min 20 s'), which a sweep's and a tune's progress both print, and a latency in the
unit that reads best ('45.7 µs', '1.40 s'), which a tune's tables print.
Imports nothing of moebench (util stands below every room)."""

from __future__ import annotations

import math


def counted(n: int, noun: str, plural: str = "") -> str:
    """'1 combination', '2 combinations': `n` and its noun, with an s unless `n` is 1 (`plural`
    where the noun takes another form: counted(n, 'entry', 'entries'))."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def agree(n: int, one: str, many: str) -> str:
    """The form of a word that agrees with the count `n`: `one` for 1, else `many`
    (f"{counted(n, 'row')} {agree(n, 'runs', 'run')}" gives '1 row runs', '2 rows run')."""
    return one if n == 1 else many


def duration(seconds: float) -> str:
    """A span of `seconds` (s) in words, to the second below 100 s: '8 s', '3 min 20 s', '2 h 05 min'."""
    s = int(round(seconds))
    if s < 100:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def latency(us: float) -> str:
    """A time given in µs, to three significant figures in the unit that reads best: '45.7 µs',
    '412 µs', '1.02 ms', '1.40 s' (a tune's host time under Triton's interpreter is seconds a call);
    '–' where there is no figure (NaN, inf)."""
    if math.isnan(us) or math.isinf(us):
        return "–"
    # what would round to 1000 in a unit reads in the next one
    scale, unit = (1.0, "µs") if abs(us) < 999.5 else (1e3, "ms") if abs(us) < 999.5e3 else (1e6, "s")
    v = us / scale
    digits = 0 if abs(v) >= 99.95 else 1 if abs(v) >= 9.995 else 2
    return f"{v:.{digits}f} {unit}"

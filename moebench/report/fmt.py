"""How the report writes a number: µs with about four significant digits, intervals,
MiB, fractions. Every table of report/ formats through these."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from moebench.report.stats import pct

MIB = 1024.0 * 1024.0


def fmt_us(x: float) -> str:
    """A time in µs with ~4 significant digits (412.3, 41.23, 4.123); NaN as '-'."""
    if x is None or not np.isfinite(x):
        return "-"
    if abs(x) >= 1000:
        return f"{x:.0f}"
    if abs(x) >= 100:
        return f"{x:.1f}"
    if abs(x) >= 10:
        return f"{x:.2f}"
    return f"{x:.3f}"


def fmt_short(x: float) -> str:
    """A bound of an interval, one digit less precise than fmt_us (405, 40.5, 4.05)."""
    if x is None or not np.isfinite(x):
        return "-"
    if abs(x) >= 100:
        return f"{x:.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def fmt_interval(median: float, p20: float, p80: float) -> str:
    """'412.3 (405–420)': median with its p20–p80 interval, all in µs."""
    if not np.isfinite(median):
        return "-"
    if not (np.isfinite(p20) and np.isfinite(p80)):
        return fmt_us(median)
    return f"{fmt_us(median)} ({fmt_short(p20)}–{fmt_short(p80)})"


def fmt_mib(nbytes: float) -> str:
    """Bytes as MiB (1 decimal above 100 MiB, 3 below 1 MiB, else 2); NaN as '-'."""
    if nbytes is None or not np.isfinite(nbytes):
        return "-"
    mib = nbytes / MIB
    return f"{mib:.1f}" if abs(mib) >= 100 else f"{mib:.2f}" if abs(mib) >= 1 else f"{mib:.3f}"


def fmt_frac(x: float) -> str:
    """A fraction in [0, 1] as a percentage; NaN as '-'."""
    if x is None or not np.isfinite(x):
        return "-"
    return f"{100 * x:.0f}%"


def fmt_frac_interval(x: float, lo: float, hi: float) -> str:
    """'31% [22–40]': a fraction with its interval in percent; without one (older rows,
    too few samples) the fraction alone; NaN as '-'."""
    if x is None or not np.isfinite(x):
        return "-"
    if lo is None or hi is None or not (np.isfinite(lo) and np.isfinite(hi)):
        return fmt_frac(x)
    return f"{fmt_frac(x)} [{100 * lo:.0f}–{100 * hi:.0f}]"


MINUS = "\u2212"


def fmt_pct(x: float, signed: bool = True, digits: int = 1) -> str:
    """A change in percent: '+12.1', '−8.3' (a minus sign, not a hyphen; `digits` decimals); NaN as '-'.
    A figure that rounds to zero is '+0.0' ('0.0' unsigned), never '−0.0'."""
    if x is None or not np.isfinite(x):
        return "-"
    if round(x, digits) == 0:
        x = 0.0  # -0.04 rounds to -0.0: a sign without a figure
    text = f"{x:+.{digits}f}" if signed else f"{x:.{digits}f}"
    return text.replace("-", MINUS)


def fmt_change(ratio: float, lo: float = float("nan"), hi: float = float("nan"), bounds: Sequence[float] = ()) -> str:
    """'−8.3 % [−8.6, −8.0]': the change and its 95 % interval in percent
    (without an interval: '+16.9 %'). `bounds` (ratios: a threshold and its inverse) add a
    decimal, up to three, where a figure would read as a bound it is not: a ratio of 1.0496 is
    '+4.96 %', not the '+5.0 %' of ×1.05 it lies under, so the label beside it reads true. Zero is
    such a bound for an interval that excludes it: '−0.30 % [−0.41, −0.04]', not '[−0.4, +0.0]'."""
    if ratio is None or not np.isfinite(ratio):
        return "-"
    interval = np.isfinite(lo) and np.isfinite(hi)
    shown = [ratio, lo, hi] if interval else [ratio]
    apart = tuple(bounds) + ((1.0,) if interval and (lo > 1 or hi < 1) else ())
    digits = 1
    while digits < 3 and any(
        x != b and fmt_pct(pct(x), digits=digits) == fmt_pct(pct(b), digits=digits) for x in shown for b in apart
    ):
        digits += 1
    text = f"{fmt_pct(pct(ratio), digits=digits)} %"
    if interval:
        text += f" [{fmt_pct(pct(lo), digits=digits)}, {fmt_pct(pct(hi), digits=digits)}]"
    return text

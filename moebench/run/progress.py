"""A sweep's progress over its combinations, on stderr: on a terminal tqdm's bar with its ETA,
redrawn in place; anywhere else (a log file, a pipe, a SLURM job's output) plain lines at a
modest rate, since a bar's carriage-return redraws make one line of kilobytes in a file."""

from __future__ import annotations

import sys
import time
from collections import Counter
from typing import Callable, Optional

from moebench.config.limits import NOISY_SPREAD
from moebench.util.words import counted, duration

LINE_EVERY_S = 10.0  # off a terminal: at most one progress line in this many seconds (and the last)


class Lines:
    """Progress as plain lines, for stderr off a terminal: at most one in LINE_EVERY_S seconds, and
    the last (sweep's Progress here, tune's bar). `clock`: seconds, for tests."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.start = self.last = clock()

    def due(self, done: int, total: int) -> str:
        """'(60 %) in 12 s, about 8 s left' when a line is due (the last: 'in 20 s', no time left), else ''."""
        now = self.clock()
        if not total or (now - self.last < LINE_EVERY_S and done < total):
            return ""
        self.last = now
        elapsed = now - self.start
        left = f", about {duration(elapsed / done * (total - done))} left" if 0 < done < total else ""
        return f"({100 * min(done, total) // total} %) in {duration(elapsed)}{left}"


class Progress:
    """Combinations finished, with ETA. Messages go through write() so that they never break a
    bar; wide-spread rows are counted and summarised at the end (summary()), not printed one by
    one. `tty`: whether to draw a bar (default: whether stderr is a terminal); `clock`: seconds,
    for tests."""

    def __init__(self, total: int, tty: Optional[bool] = None, clock: Callable[[], float] = time.monotonic):
        self.total = total
        self.tty = sys.stderr.isatty() if tty is None else tty
        self.wide: list[tuple[float, str]] = []  # (p80/p20, 'label T=tokens') of each wide-spread row
        self.bar = None
        if self.tty:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="combo", dynamic_ncols=True, file=sys.stderr, disable=total == 0)
        self.lines = Lines(clock)
        self.done = 0

    def _postfix(self, label: str, statuses: Counter) -> str:
        wide = f" wide_spread={len(self.wide)}" if self.wide else ""
        return f"{label} " + " ".join(f"{k}={v}" for k, v in sorted(statuses.items())) + wide

    def update(self, label: str, statuses: Counter, step: int = 1) -> None:
        """`label` ended (step 0: part of it, the rest follows); `statuses`: rows so far by status."""
        self.done += step
        if self.bar is not None:
            self.bar.set_postfix_str(self._postfix(label, statuses), refresh=False)
            self.bar.update(step)
            return
        so_far = self.lines.due(self.done, self.total) if step else ""
        if so_far:
            self.write(
                f"moebench: {self.done} of {counted(self.total, 'combination')} done {so_far}; "
                f"last: {self._postfix(label, statuses)}"
            )

    def write(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def summary(self) -> str:
        """'moebench: 3 rows with a wide spread (p80/p20 > 1.10), widest: <label> T=16 (1.31); ...' or ''."""
        if not self.wide:
            return ""
        worst = sorted(self.wide, reverse=True)[:3]
        shown = "; ".join(f"{where} ({spread:.2f})" for spread, where in worst)
        return (
            f"moebench: {counted(len(self.wide), 'row')} with a wide spread (p80/p20 > {NOISY_SPREAD:.2f}), widest: "
            f"{shown}; more runner.reps or a quieter machine (the report flags them)"
        )

    def close(self, keep: bool = True) -> None:
        """keep=False (an abort): the bar is cleared, not drawn again, so that the abort's one line
        follows the last message (a terminal's bar line is overwritten)."""
        if self.bar is None:
            return
        if not keep:
            self.bar.leave = False
        self.bar.close()

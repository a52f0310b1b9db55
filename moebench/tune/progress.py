"""A tune's progress on stderr: its plan up front, one bar over the whole job, an estimate after
the first trials, and what an interrupt loses.

The bar counts **layer calls** (one forward of the layer's experts), the unit every step of a tune
shares: a screened config is its check against the reference, the warm-up and `--reps` samples; the
finalists of a token count are each checked, warmed up and sampled `--final-reps` times, interleaved;
the winner is re-checked on a second input. So the bar, and its ETA, cover the finalists' timing
and the re-check as well as the search (a search bar that stood at 100 % for minutes while the
finalists were timed is why). Off the GPU the bar moves sample by sample (bench.TokenBench._time);
on a GPU a trial's calls count when it ends. Calls read back from the trial store (a resume) leave the
total up front, as far as the store says (`Calls.reused`), and as read otherwise; those planned but not
needed (a search that ran out of configs before its budget) leave it when a step ends.
Off a terminal (a log file, a pipe) the bar is plain lines at a modest rate, as a sweep's
(run.progress.Lines): its carriage-return redraws would make one line of kilobytes in a file.
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional

from moebench.run.progress import Lines
from moebench.util.words import counted, duration

ESTIMATE_AFTER = 3  # trials timed in this process before the estimate line


@dataclass(frozen=True)
class Calls:
    """Layer calls of each step (bench.TokenBench): `warmup` calls before a timing's samples."""

    warmup: int
    reps: int
    final_reps: int
    finalists: int
    RECHECK = 1  # the winner on a second input (a class constant, not a field)

    def screen(self) -> int:
        """One config screened: the check against the reference, the warm-up, `reps` samples."""
        return 1 + self.warmup + self.reps

    def final(self, n: int) -> int:
        """n finalists timed again, interleaved (none for a lone finalist: it wins as screened)."""
        return n * (1 + self.warmup + self.final_reps) if n > 1 else 0

    def count(self, budget: int) -> int:
        """A token count's plan: `budget` configs screened, its finalists, the re-check."""
        return budget * self.screen() + self.final(min(self.finalists, budget)) + self.RECHECK

    def reused(self, budget: int, screened: int, finals: int, rechecks: int) -> int:
        """The calls of a token count's plan that stored trials (of its reps) spare: up to `budget`
        screened configs, the finalists' timing when as many finals are stored, the re-check."""
        n = min(self.finalists, budget)
        final = self.final(n) if finals >= n else 0
        return min(screened, budget) * self.screen() + final + (self.RECHECK if rechecks else 0)


def plan_line(
    model: str, dims, tokens: list[int], space: str, kept: int, budgets: dict, calls: Calls, reused=(0, 0)
) -> str:
    """The tune's plan in one line: sizes, space, trials and layer calls; `reused`: (stored trials
    a resume reads back, the layer calls they spare)."""
    budget = sorted(set(budgets.values()))
    screened = str(budget[0]) if len(budget) == 1 else f"{budget[0]}-{budget[-1]}"
    total = sum(calls.count(b) for b in budgets.values())
    trials, spared = reused
    left = f"{counted(total, 'layer call')} in all"
    if trials:  # a resume: what the store spares, and what is left to time
        todo = f"about {counted(total - spared, 'call')} to make" if spared < total else "nothing to time"
        left += f", {spared} of them read back from {counted(trials, 'stored trial')} (--out's trials.jsonl): {todo}"
    return (
        f"tune {model} (E={dims.num_experts}, N={dims.intermediate}, hidden={dims.hidden}, top-{dims.topk}): "
        f"{counted(len(tokens), 'token count')} ({', '.join(map(str, tokens))}); --space {space}: "
        f"{counted(kept, 'config')} after pruning; per count up to {screened} screened (baselines included) "
        f"with {counted(calls.reps, 'sample')} each, {calls.finalists} finalists again with {calls.final_reps}, "
        "interleaved, "
        f"the winner re-checked: about {left} (the bar counts them)"
    )


class Progress:
    """The bar over a tune's layer calls (tqdm on stderr; plain lines off a terminal) and the words
    an interrupt needs. `tty`: whether to draw a bar (default: whether stderr is a terminal);
    `clock`: seconds, for tests."""

    def __init__(
        self,
        total: int,
        desc: str,
        position: int = 0,
        disable: bool = False,
        log: Callable[[str], None] = print,
        compiles: bool = False,
        tty: Optional[bool] = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        from tqdm import tqdm

        tty = sys.stderr.isatty() if tty is None else tty
        self.lines = None if tty or disable else Lines(clock)
        self.desc, self._ended = desc, False  # _ended: the last line (all calls made) printed

        self.bar = tqdm(
            total=total,
            desc=desc,
            unit="call",
            position=position,
            file=sys.stderr,
            mininterval=2.0,
            disable=disable or not tty,
            dynamic_ncols=True,
        )
        self._log, self.quiet, self.compiles = log, disable, compiles
        self.stage_words = ""  # what runs now, in words (the bar's postfix; an interrupt's message)
        self.timed: list[tuple[float, int]] = []  # (seconds, calls) of the first trials timed here
        # the account, kept here: a disabled tqdm (a replay) counts nothing
        self.n, self.total, self._dropped = 0, total, 0
        self._credit = 0  # the step's calls that `total` already left out as stored (reuse spends them)

    def say(self, text: str) -> None:
        """A line through the tune's log, the bar cleared first and drawn again under it."""
        with type(self.bar).external_write_mode(file=sys.stderr):
            self._log(text)

    def tick(self, n: int = 1) -> None:
        """`n` layer calls made."""
        self.n += n
        self.bar.update(n)
        self._line()

    def drop(self, n: int) -> None:
        """`n` planned calls that will not be made (read from the store, or not needed)."""
        if n:
            self._dropped += n
            self.total -= n
            self.bar.total = max(self.n, self.total)
            self.bar.refresh()
            self._line()

    def reuse(self, n: int) -> None:
        """`n` planned calls read back from the store: out of the step's credit (left out of the total
        up front), the rest dropped."""
        spent = min(n, self._credit)
        self._credit -= spent
        self._dropped += spent
        self.drop(n - spent)

    def _line(self) -> None:
        """Off a terminal: a progress line when one is due (the last once, when every call is made)."""
        end = self.n >= self.total
        if self.lines is None or (end and self._ended):
            return
        so_far = self.lines.due(self.n, self.total)
        self._ended = end and bool(so_far)
        if so_far:
            stage = f"; {self.stage_words}" if self.stage_words else ""
            print(
                f"{self.desc}: {self.n} of {counted(self.total, 'layer call')} {so_far}{stage}",
                file=sys.stderr,
                flush=True,
            )

    def stage(self, words: str) -> None:
        if words != self.stage_words:
            self.stage_words = words
            self.bar.set_postfix_str(words)

    @contextlib.contextmanager
    def work(self, planned: int, trial: bool = False, credit: int = 0):
        """A step planned at `planned` calls: at its end the total takes the calls it made (ticked
        inside it) and dropped instead of the plan; `trial`: a timed trial, which the estimate reads;
        `credit`: the step's calls the total left out up front as stored (what reuse() did not spend
        goes back on it)."""
        n0, d0, t0 = self.n, self._dropped, time.perf_counter()
        if credit:
            self._credit = credit
        yield
        done = self.n - n0
        unspent = self._credit if credit else 0
        if credit:
            self._credit = 0
        self.drop(planned - (self._dropped - d0) - done - unspent)  # negative: more calls than planned
        if trial and done and len(self.timed) < ESTIMATE_AFTER:
            self.timed.append((time.perf_counter() - t0, done))
            if len(self.timed) == ESTIMATE_AFTER:
                self._estimate()

    def _estimate(self) -> None:
        seconds, calls = (sum(x) for x in zip(*self.timed, strict=True))
        left = max(0, self.total - self.n)
        if self.quiet or not calls:
            return
        each = seconds / calls
        more = "; compiling adds to it" if self.compiles else ""
        self.say(
            f"tune: {each:.3g} s a layer call over the first {len(self.timed)} trials: about "
            f"{duration(each * left)} for the {counted(left, 'call')} left (the bar's ETA follows it{more})"
        )

    def interrupted(self) -> str:
        """What an interrupt now loses, in words ('' before any stage)."""
        return f"during {self.stage_words} (timed again on resume)" if self.stage_words else ""

    def close(self) -> None:
        self.bar.close()

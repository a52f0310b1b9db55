"""Tune's words for host time, in one place. A tune on the CPU, or under Triton's interpreter
(`TRITON_INTERPRET=1`, seconds a layer call), times the host, not a GPU, and a tuned table never
rests on host time: the same words for where it timed open such a tune (search.py), close it
under its table and refuse its install (`--install`, `--install-from`: cli/tune.py,
install_check.py)."""

from __future__ import annotations


def host_timing(device: str, interpreted: bool, gpu: str = "") -> str:
    """Where a tune timed the host, in words ("on the CPU, under Triton's interpreter"); '' on a GPU
    without the interpreter. `device`: the combination's ("cpu" | "cuda"), `gpu` its name."""
    if device == "cuda" and not interpreted:
        return ""
    if device == "cuda":
        return f"under Triton's interpreter (TRITON_INTERPRET=1) on {gpu or 'a GPU'}'s host"
    return "on the CPU, under Triton's interpreter"


def host_line(device: str, interpreted: bool, space: str, gpu: str = "") -> str:
    """The line before a tune's first trial where its figures will be host time, else ''."""
    where = host_timing(device, interpreted, gpu)
    if not where:
        return ""
    hint = "" if space.startswith("small") else "; for a try-out: --space small 'workload.tokens_per_rank=[16]'"
    return (
        f"tune: timed {where}: every figure is host time, not a GPU's, seconds a layer call; the tiles "
        f"say nothing about a GPU (--install refuses them){hint}"
    )


def host_note(where: str) -> str:
    """The line under such a tune's table (`where`: host_timing's words)."""
    return (
        f"timed {where}: every time above is host time, not a GPU's: the tiles are for trying the tool, "
        "not for a GPU (--install refuses them)"
    )


def not_installed(where: str) -> str:
    """Why --install / --install-from installs no such tiles (`where`: host_timing's words)."""
    return (
        f"these tiles were timed {where}: host time, not a GPU's, and are not installed (a tuned table never "
        "rests on host time: tune on a GPU without TRITON_INTERPRET)"
    )

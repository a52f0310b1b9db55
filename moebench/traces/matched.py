"""The overlap of several ranks' traces of one combination on communication intervals trimmed
of the wait for the last rank (traces/metrics.py's module doc, "Several ranks")."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from moebench.traces.metrics import METHOD_STRETCH, intersect, length, summarize, union

# trace layer spans closer than this (relative) name no critical rank
CRITICAL_SPAN_TIE = 0.005


def _sample_key(k) -> Optional[tuple]:
    if k.sample is not None:
        return ("sample", k.sample)
    return ("ablation", *k.ablation) if k.ablation else None


def trim_comm_waits(traces: list) -> tuple[list, list, list]:
    """(traces, wait_us, notes): every rank's trace of one combination and token count, each
    communication kernel of a sample starting when the last rank's matching kernel started
    (the i-th by start time within the same layer or ablation sample; module docstring);
    wait_us: per rank, the time its communication kernels of the layer samples waited for
    the last rank, summed over the collectives that ran beside shared-expert kernels on
    some rank (those the overlap is about). A sample whose ranks ran different numbers of communication
    kernels stays untrimmed, and a note says how many."""
    per_rank, shared = [], []
    for t in traces:
        g: dict = {}
        sh: dict = {}
        for k in t.kernels:
            key = _sample_key(k)
            if k.comm and key is not None:
                g.setdefault(key, []).append(k)
            elif k.shared and key is not None:
                sh.setdefault(key, []).append((k.start_us, k.end_us))
        per_rank.append(g)
        shared.append(sh)
        for ks in g.values():
            ks.sort(key=lambda k: k.start_us)
    starts: dict = {}  # id(kernel) -> trimmed start
    wait_us = [0.0] * len(traces)
    unmatched = 0
    for key in sorted(set().union(*per_rank), key=str):
        lists = [g.get(key, []) for g in per_rank]
        if len({len(ks) for ks in lists}) != 1:
            unmatched += 1
            continue
        shared_busy = [union(sh.get(key, [])) for sh in shared]  # per rank, once per sample
        for i in range(len(lists[0])):
            last = max(ks[i].start_us for ks in lists)
            # the collective the overlap is about: one that ran beside shared experts on some rank
            beside = key[0] == "sample" and any(
                length(intersect([(ks[i].start_us, ks[i].end_us)], shared_busy[r])) for r, ks in enumerate(lists)
            )
            for r, ks in enumerate(lists):
                starts[id(ks[i])] = min(last, ks[i].end_us)
                if beside:
                    wait_us[r] += starts[id(ks[i])] - ks[i].start_us
    notes = (
        [f"{unmatched} samples whose ranks ran different numbers of communication kernels: left untrimmed"]
        if unmatched
        else []
    )
    out = [
        dataclasses.replace(
            t,
            kernels=[dataclasses.replace(k, start_us=starts[id(k)]) if id(k) in starts else k for k in t.kernels],
            notes=list(t.notes) + notes,
        )
        for t in traces
    ]
    return out, wait_us, notes


@dataclass
class MatchedOverlap:
    """Several ranks' overlap on communication intervals trimmed of the wait for peers."""

    fraction_per_rank: list  # stretch-aware trace_overlap_fraction of each rank, trimmed
    wait_us_per_rank: list  # time each rank's communication kernels waited for the last rank
    critical_rank: int  # the rank that waited least: the layer's critical path

    @property
    def fraction(self) -> float:
        return self.fraction_per_rank[self.critical_rank]


def matched_overlap(traces: list) -> Optional[MatchedOverlap]:
    """The overlap figures on communication intervals trimmed of the wait for the other
    ranks (`trim_comm_waits`, module docstring); None unless there are several traces and
    every one of them gives the stretch figure."""
    if len(traces) < 2:
        return None
    trimmed, wait_us, _ = trim_comm_waits(traces)
    out = []
    for t in trimmed:
        s = summarize(t)
        if s.method != METHOD_STRETCH or s.trace_overlap_fraction is None:
            return None
        out.append(s.trace_overlap_fraction)
    return MatchedOverlap(out, wait_us, min(range(len(out)), key=lambda r: wait_us[r]))


def critical_rank(spans: list) -> Optional[int]:
    """The rank whose layer samples span longest in its trace (µs per rank), or None: one
    rank, a span missing, or the two longest within CRITICAL_SPAN_TIE of each other."""
    if len(spans) < 2 or not all(isinstance(s, (int, float)) and s == s for s in spans):
        return None
    order = sorted(range(len(spans)), key=lambda i: spans[i], reverse=True)
    if spans[order[0]] - spans[order[1]] <= CRITICAL_SPAN_TIE * spans[order[0]]:
        return None
    return order[0]

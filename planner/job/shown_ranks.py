"""Which ranks a report of many ranks draws: a plain function of the result documents,
kept apart from the stages so that the report's drawing process reads it without
importing the analysis (pandas and the replay)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

TIMELINE_RANKS = 16
"""Up to this many ranks a report carries every rank's schedules (`timelines`); above,
only those of the slowest, the fastest and the most often last-arriving rank."""


def timeline_ranks(ranks: Sequence[str], metrics: Mapping[str, Any]) -> set[str]:
    """The ranks whose schedules a report carries: all up to `TIMELINE_RANKS`; above,
    the slowest and the fastest (mean makespan, `metrics`: the job's
    `planner.metrics/1`) and the one most often last to arrive at a step's collectives
    (the straggler of `planner.model.waits`). Bounds the report of a job of 1,000+ ranks."""
    if len(ranks) <= TIMELINE_RANKS:
        return set(ranks)
    makespan = {
        e["rank"]: e["makespan_mean"]
        for e in metrics["ranks"]
        if e.get("makespan_mean") is not None
    }
    chosen = set()
    if makespan:
        chosen.add(max(makespan, key=lambda r: (makespan[r], r)))
        chosen.add(min(makespan, key=lambda r: (makespan[r], r)))
    last = Counter(
        s["slowest_rank"]
        for s in (metrics.get("allreduce") or {}).get("stragglers", [])
        if s.get("slowest_rank") is not None
    )
    if last:
        chosen.add(min(last, key=lambda r: (-last[r], r)))
    return chosen or {ranks[0]}

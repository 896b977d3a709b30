"""Trace: observed op timings per rank and iteration, and the job they belong to.

Times are integer nanoseconds here (profilers record ns or µs since the epoch, which
a float second cannot hold exactly); JSON outputs convert to seconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from planner.graph import OpGraph

TIMING_COLUMNS = ("rank", "iteration", "op", "start", "duration")
SPAN_COLUMNS = ("rank", "iteration", "start", "end")


@dataclass(frozen=True)
class Trace:
    """Observed timings.

    `timings`: one row per (rank, iteration, op) with `start` and `duration` in ns, and
    for multi-rank Kineto jobs `wait` (ns of a collective spent waiting for the last
    rank to join; `planner.waits`).
    `spans`: one row per (rank, iteration) with the iteration's `start` and `end` in ns.
    """

    timings: pd.DataFrame
    spans: pd.DataFrame

    @property
    def ranks(self) -> list[str]:
        return sorted(self.spans["rank"].unique().tolist())

    def iterations(self, rank: str) -> list[int]:
        return sorted(self.spans.loc[self.spans["rank"] == rank, "iteration"].tolist())

    def of(self, rank: str, iteration: int | None = None) -> pd.DataFrame:
        """The timings of one rank (and one iteration)."""
        mask = self.timings["rank"] == rank
        if iteration is not None:
            mask &= self.timings["iteration"] == iteration
        return self.timings.loc[mask]


@dataclass(frozen=True)
class Job:
    """Everything ingested from one set of input files.

    `graphs`: one OpGraph per rank (a TF worker partition or a PyTorch rank).
    `notes`: facts a user should know about the input (e.g. records missing in
    some steps), shown by `planner inspect`.
    """

    framework: str
    graphs: Mapping[str, OpGraph]
    trace: Trace
    sources: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    meta: Mapping[str, object] = field(default_factory=dict)

    @property
    def ranks(self) -> list[str]:
        return sorted(self.graphs)


def make_trace(rows: list[tuple[str, int, str, int, int]], spans: list[tuple]) -> Trace:
    """Build a Trace from (rank, iteration, op, start_ns, duration_ns) rows and spans."""
    timings = pd.DataFrame(rows, columns=list(TIMING_COLUMNS))
    timings = timings.astype({"iteration": "int64", "start": "int64", "duration": "int64"})
    span_frame = pd.DataFrame(spans, columns=list(SPAN_COLUMNS))
    span_frame = span_frame.astype({"iteration": "int64", "start": "int64", "end": "int64"})
    return Trace(timings=timings, spans=span_frame)


def empty_trace() -> Trace:
    return make_trace([], [])


def dedicated_durations(starts: np.ndarray, durations: np.ndarray) -> np.ndarray:
    """Split the busy time of one resource among the ops that overlap on it.

    Each instant is shared equally by the ops active then (processor sharing), so
    the result estimates the time each op would take with the resource to itself —
    the quantity TicTac's time oracle stands for (§3.1). The results sum to the
    resource's busy time (the union of the intervals), never more.
    """
    n = len(starts)
    if n == 0:
        return np.zeros(0, dtype=np.float64)
    starts = np.asarray(starts, dtype=np.int64)
    ends = starts + np.asarray(durations, dtype=np.int64)
    points = np.unique(np.concatenate([starts, ends]))
    delta = np.zeros(len(points), dtype=np.int64)
    np.add.at(delta, np.searchsorted(points, starts), 1)
    np.add.at(delta, np.searchsorted(points, ends), -1)
    active = np.cumsum(delta)[:-1]
    width = np.diff(points).astype(np.float64)
    share = np.divide(width, active, out=np.zeros_like(width), where=active > 0)
    prefix = np.concatenate([[0.0], np.cumsum(share)])
    return prefix[np.searchsorted(points, ends)] - prefix[np.searchsorted(points, starts)]


def busy_time(starts: np.ndarray, durations: np.ndarray) -> int:
    """Length of the union of the intervals [start, start + duration)."""
    if len(starts) == 0:
        return 0
    order = np.argsort(starts, kind="stable")
    s = np.asarray(starts, dtype=np.int64)[order]
    e = s + np.asarray(durations, dtype=np.int64)[order]
    reach = np.maximum.accumulate(e)
    gap_start = np.concatenate([[False], s[1:] > reach[:-1]])
    first = np.flatnonzero(np.concatenate([[True], gap_start[1:]]))
    block_start = s[first]
    block_end = np.maximum.reduceat(e, first)
    return int((block_end - block_start).sum())


def with_dedicated(
    trace: Trace, graphs: Mapping[str, OpGraph], transfer_only: bool = True
) -> pd.DataFrame:
    """Timings with a `dedicated` column (ns, float) and the op's `resource`.

    `transfer_only`: a collective's dedicated time leaves out its ``wait`` for the
    peers (the time oracle's view); False keeps the span the rank saw (its own view,
    which the per-rank metrics use, so that a rank reads the same alone or in its job).
    """
    frame = trace.timings.copy()
    resource = np.empty(len(frame), dtype=object)
    for rank, graph in graphs.items():
        mask = (frame["rank"] == rank).to_numpy()
        if mask.any():
            lookup = {name: op.resource for name, op in graph.ops.items()}
            resource[mask] = frame.loc[mask, "op"].map(lookup).fillna("?").to_numpy()
    frame["resource"] = resource
    if transfer_only:
        starts, durations = transfer_part(frame)
    else:
        starts, durations = frame["start"].to_numpy(np.int64), frame["duration"].to_numpy(np.int64)
    dedicated = np.zeros(len(frame), dtype=np.float64)
    for _, idx in frame.groupby(["rank", "iteration", "resource"], sort=False).indices.items():
        dedicated[idx] = dedicated_durations(starts[idx], durations[idx])
    frame["dedicated"] = dedicated
    return frame


def transfer_part(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(start, duration) ns of each row without its ``wait`` for peers (collectives of a
    multi-rank job, `planner.waits`): the time the op itself ran."""
    start = frame["start"].to_numpy(np.int64)
    duration = frame["duration"].to_numpy(np.int64)
    if "wait" not in frame:
        return start, duration
    wait = frame["wait"].to_numpy(np.int64)
    return start + wait, duration - wait

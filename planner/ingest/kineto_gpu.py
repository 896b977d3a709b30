"""GPU work of one rank's Kineto events: which CPU launch started each GPU event.

Kineto gives a GPU event (kernel, memcpy, memset) and the runtime call that launched
it (``cudaLaunchKernel``, ``hipExtModuleLaunchKernel``, ...) the same ``correlation``
id. The launch places GPU work in the step and phase that issued it: on a
well-pipelined job the CPU runs one or two steps ahead, so the GPU's own clock would
put a kernel in the wrong step. A stream runs its work in issue order, so a GPU
event whose launch the trace lacks takes the launch time of the launched event before
it on its stream; one before the first launched event was issued before profiling
began (the CPU ran ahead) and belongs to no step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.ingest.kineto_events import GPU_CATS, LAUNCH_CATS, RankEvents


@dataclass(frozen=True)
class Launches:
    """Per row: the launching runtime call (`row`, -1 without) and the `anchor` time
    that places the event in a step and phase (the launch's start for GPU events)."""

    row: np.ndarray  # int64
    anchor: np.ndarray  # int64 ns
    orphan: np.ndarray  # bool: GPU work issued before profiling began


def launches(ev: RankEvents, is_gpu: np.ndarray) -> Launches:
    """Join GPU events to their launches through the correlation id."""
    n = len(ev)
    launch_rows = np.flatnonzero(ev.cat_flags(LAUNCH_CATS) & (ev.corr >= 0))
    row = np.full(n, -1, dtype=np.int64)
    gpu_idx = np.flatnonzero(is_gpu)
    if len(gpu_idx) and len(launch_rows):
        corr_keys, first_of = np.unique(ev.corr[launch_rows], return_index=True)
        want = ev.corr[gpu_idx]
        pos = np.minimum(np.searchsorted(corr_keys, want), len(corr_keys) - 1)
        ok = corr_keys[pos] == want
        row[gpu_idx[ok]] = launch_rows[first_of[pos[ok]]]
    anchor = ev.ts.copy()
    has = row >= 0
    anchor[has] = ev.ts[row[has]]
    unlaunched = is_gpu & ~has & (ev.corr >= 0)
    orphan = np.zeros(n, dtype=bool)
    if has.any() and unlaunched.any():
        orphan = _follow_stream(ev, anchor, unlaunched, has)
    return Launches(row, anchor, orphan)


def _follow_stream(
    ev: RankEvents, anchor: np.ndarray, unlaunched: np.ndarray, launched: np.ndarray
) -> np.ndarray:
    """Give each `unlaunched` GPU event the anchor of the launched event before it on
    its stream (in place); returns those with none before them (issued earlier)."""
    rows = np.flatnonzero(unlaunched | launched)
    rows = rows[np.lexsort((ev.ts[rows], ev.lane[rows]))]
    new_lane = np.concatenate([[True], ev.lane[rows][1:] != ev.lane[rows][:-1]])
    pos = np.where(launched[rows], np.arange(len(rows)), -1)
    pos[new_lane & ~launched[rows]] = -1
    lane_start = np.maximum.accumulate(np.where(new_lane, np.arange(len(rows)), 0))
    last = np.maximum.accumulate(pos)
    last[last < lane_start] = -1  # the previous launched event is on another stream
    lost = unlaunched[rows] & (last < 0)
    take = unlaunched[rows] & (last >= 0)
    anchor[rows[take]] = anchor[rows[last[take]]]
    orphan = np.zeros(len(ev), dtype=bool)
    orphan[rows[lost]] = True
    return orphan


def gpu_rows(ev: RankEvents) -> np.ndarray:
    """Per row: a GPU event (kernel, memcpy, memset)."""
    return ev.cat_flags(GPU_CATS)


def step_spans(
    steps: np.ndarray, start: np.ndarray, end: np.ndarray, on_gpu: np.ndarray
) -> dict[int, tuple[int, int]]:
    """Step -> (first start, last end) of its GPU occurrences (`on_gpu` marks them)."""
    out: dict[int, tuple[int, int]] = {}
    if not on_gpu.any():
        return out
    s, a, b = steps[on_gpu], start[on_gpu], end[on_gpu]
    keys, inverse = np.unique(s, return_inverse=True)
    first = np.full(len(keys), np.iinfo(np.int64).max, dtype=np.int64)
    last = np.full(len(keys), np.iinfo(np.int64).min, dtype=np.int64)
    np.minimum.at(first, inverse, a)
    np.maximum.at(last, inverse, b)
    for k, f, la in zip(keys.tolist(), first.tolist(), last.tolist(), strict=True):
        out[int(k)] = (int(f), int(la))
    return out

"""Array helpers the ingest, `planner inspect`, the replay and the bucket advice share.

`unique` and `median` give what ``np.unique(values)`` and ``np.median(values)`` give.
numpy 2's own ask ``np.ma`` first (whether the array is masked, a NaN check), which
imports all of numpy.ma (1.2 MiB of RSS and 30-70 ms per process: issue #18's fixed
cost) for arrays that are never masked.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def unique(values: np.ndarray) -> np.ndarray:
    """The sorted distinct values of `values` (flattened), without loading numpy.ma."""
    return np.unique(values, return_index=True)[0]


def median(values: np.ndarray) -> float:
    """``np.median(values)`` of a NaN-free array, to the bit: the middle value, or the
    mean of the two middle values, in float64."""
    ordered = np.sort(np.asarray(values, dtype=np.float64), axis=None)
    n = len(ordered)
    if n == 0:
        raise ValueError("median of an empty array")
    if n % 2:
        return float(ordered[n // 2])
    return float((ordered[n // 2 - 1] + ordered[n // 2]) / 2.0)


def lanes(resource: np.ndarray, start: np.ndarray, duration: np.ndarray) -> np.ndarray:
    """Lane per interval so that intervals on one (resource, lane) never overlap.

    Observed ops overlap on a resource (TF runs a device's ops on a thread pool);
    a trace viewer needs them on separate tracks. Greedy interval partitioning in
    start order: the lowest lane whose last op has ended.
    """
    out = np.zeros(len(start), dtype=np.int64)
    order = np.lexsort((start, resource))
    res, begin = np.asarray(resource)[order], np.asarray(start)[order]
    reach = begin + np.asarray(duration)[order]
    cuts = np.flatnonzero(res[1:] != res[:-1]) + 1
    crowded = []  # (speed) resources where an op starts before an earlier one ended
    for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), len(order)], strict=True):
        if not (begin[a + 1 : b] >= np.maximum.accumulate(reach[a : b - 1])).all():
            crowded.append(order[a:b])  # else every op of the resource runs on lane 0
    ends: dict[Any, list[float]] = {}
    for i in np.concatenate(crowded).tolist() if crowded else []:
        free = ends.setdefault(resource[i], [])
        end = start[i] + duration[i]
        for k, last in enumerate(free):
            if last <= start[i]:
                free[k], out[i] = end, k
                break
        else:
            out[i] = len(free)
            free.append(end)
    return out


def merged(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of intervals [start, end) as disjoint intervals, by start."""
    starts, ends = np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)
    if not len(starts):
        return starts, ends
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    first = np.flatnonzero(np.concatenate([[True], s[1:] > reach[:-1]]))
    return s[first], np.maximum.reduceat(e, first)


def covered(
    starts: np.ndarray, ends: np.ndarray, union: tuple[np.ndarray, np.ndarray]
) -> np.ndarray:
    """Per interval [start, end): how much of it the disjoint intervals `union` (`merged`)
    cover."""
    u_start, u_end = union
    starts, ends = np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)
    if not len(u_start):
        return np.zeros(len(starts), dtype=np.int64)
    prefix = np.concatenate([[0], np.cumsum(u_end - u_start)])

    def upto(t: np.ndarray) -> np.ndarray:  # the covered time before t
        j = np.searchsorted(u_start, t, side="right")
        last = np.maximum(j - 1, 0)
        inside = np.clip(t - u_start[last], 0, u_end[last] - u_start[last])
        return prefix[last] + np.where(j > 0, inside, 0)

    return upto(ends) - upto(starts)

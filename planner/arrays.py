"""Array helpers the ingest and `planner inspect` share.

`unique` and `median` give what ``np.unique(values)`` and ``np.median(values)`` give.
numpy 2's own ask ``np.ma`` first (whether the array is masked, a NaN check), which
imports all of numpy.ma (1.2 MiB of RSS and 30-70 ms per process: issue #18's fixed
cost) for arrays that are never masked.
"""

from __future__ import annotations

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

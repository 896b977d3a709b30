"""Exact arithmetic for the schedulers: times on an integer picosecond grid, and the
(class, op) pairs of the dependency bitsets both TicTac and Caramel collapse ops into."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

TICKS_PER_SECOND = 10**12
"""Times are summed as integers on this grid (1 ps) so that every sum is exact."""


def to_ticks(names: Sequence[str], seconds: np.ndarray) -> np.ndarray:
    """Integer picoseconds; ValueError naming the first op whose time is not finite >= 0."""
    bad = ~np.isfinite(seconds) | (seconds < 0)
    if bad.any():
        name = names[int(np.flatnonzero(bad)[0])]
        raise ValueError(f"time of op {name!r} is {seconds[bad][0]!r}, not a finite >= 0")
    return np.rint(seconds * TICKS_PER_SECOND).astype(np.int64)


def set_bit_pairs(class_bits: list[int], width_bits: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, bit) index pairs of the set bits of Python-int bitsets, row-major.

    Unpacked in chunks of about 16 Mbit so memory stays bounded on 200k-op graphs.
    """
    width = max((width_bits + 7) // 8, 1)
    step = max(1, (1 << 24) // max(width_bits, 1))
    rows_parts, cols_parts = [], []
    for start in range(0, len(class_bits), step):
        chunk = class_bits[start : start + step]
        raw = b"".join(b.to_bytes(width, "little") for b in chunk)
        packed = np.frombuffer(raw, dtype=np.uint8).reshape(len(chunk), width)
        dense = np.unpackbits(packed, axis=1, count=width_bits, bitorder="little")
        r, c = np.nonzero(dense)
        rows_parts.append(r.astype(np.int64) + start)
        cols_parts.append(c.astype(np.int64))
    if not rows_parts:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate(rows_parts), np.concatenate(cols_parts)

"""Adaptive split depth (Caramel §4.4).

A transfer of d bytes is split into `depth` chunks all-reduced in parallel, so that
one chunk is reduced while another is on the wire. Depth 1 for small transfers, up to
8 for large ones, from the batching threshold T (§4.2): the depth is the largest power
of two, at most 8, that keeps every chunk at least T bytes. A chunk below T would pay
the small-message overhead that batching exists to avoid (f(2x)/(2f(x)) <= 0.8 there),
so splitting below T is never worth it; above it, more chunks overlap more reduction.

    d < 2T        -> 1
    2T <= d < 4T  -> 2
    4T <= d < 8T  -> 4
    d >= 8T       -> 8
"""

from __future__ import annotations

MAX_DEPTH = 8
DEPTHS = (1, 2, 4, 8)


def depth(nbytes: int, threshold: int | None, max_depth: int = MAX_DEPTH) -> int:
    """Chunks for a transfer of `nbytes` (1 when there is no finite threshold)."""
    if threshold is None or threshold <= 0:
        return 1
    k = 1
    while k * 2 <= max_depth and nbytes >= 2 * k * threshold:
        k *= 2
    return k


def depth_table(threshold: int | None, max_depth: int = MAX_DEPTH) -> list[dict[str, int | None]]:
    """Rows ``{depth, min_bytes, max_bytes}`` (max exclusive, None = unbounded)."""
    if threshold is None or threshold <= 0:
        return [{"depth": 1, "min_bytes": 0, "max_bytes": None}]
    rows: list[dict[str, int | None]] = []
    depths = [k for k in DEPTHS if k <= max_depth]
    for i, k in enumerate(depths):
        low = 0 if k == 1 else k * threshold
        high = depths[i + 1] * threshold if i + 1 < len(depths) else None
        rows.append({"depth": k, "min_bytes": low, "max_bytes": high})
    return rows

"""Medians, bootstrap intervals of a ratio of medians, rank correlation (numpy, fixed seed)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

RESAMPLES = 2000
SEED = 0


def _by_block(times: Sequence[float], blocks: Sequence[int]) -> list[np.ndarray]:
    groups: dict[int, list[float]] = {}
    for t, b in zip(times, blocks, strict=True):
        groups.setdefault(b, []).append(t)
    return [np.asarray(v) for v in groups.values()]


def ratio_interval(
    alt: tuple[Sequence[float], Sequence[int]],
    base: tuple[Sequence[float], Sequence[int]],
    level: float = 0.95,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> tuple[float, float, float]:
    """median(alt) / median(base) and its bootstrap `level` interval.

    Each side is (step times, block of each step); blocks are resampled whole (steps of
    one block share the machine's state of that moment), each side on its own."""
    rng = np.random.default_rng(seed)
    sides = [_by_block(*alt), _by_block(*base)]
    point = float(np.median(np.asarray(alt[0])) / np.median(np.asarray(base[0])))
    ratios = np.empty(resamples)
    for i in range(resamples):
        medians = []
        for groups in sides:
            picks = rng.integers(0, len(groups), len(groups))
            medians.append(np.median(np.concatenate([groups[k] for k in picks])))
        ratios[i] = medians[0] / medians[1]
    low, high = np.quantile(ratios, [(1 - level) / 2, (1 + level) / 2])
    return point, float(low), float(high)


def median_interval(
    times: Sequence[float], blocks: Sequence[int], level: float = 0.95, seed: int = SEED
) -> tuple[float, float, float]:
    """The median and its block-bootstrap `level` interval."""
    rng = np.random.default_rng(seed)
    groups = _by_block(times, blocks)
    values = np.empty(RESAMPLES)
    for i in range(RESAMPLES):
        picks = rng.integers(0, len(groups), len(groups))
        values[i] = np.median(np.concatenate([groups[k] for k in picks]))
    low, high = np.quantile(values, [(1 - level) / 2, (1 + level) / 2])
    return float(np.median(np.asarray(times))), float(low), float(high)


def _ranks(values: Sequence[float]) -> np.ndarray:
    """Ranks from 1, ties given their mean rank."""
    values = np.asarray(values, dtype=float)
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(1, len(values) + 1)
    for v in np.unique(values):
        tied = values == v
        ranks[tied] = ranks[tied].mean()
    return ranks


def spearman(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Spearman's rank correlation; None with fewer than 3 values or a constant side."""
    if len(a) < 3:
        return None
    ra, rb = _ranks(a), _ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return None
    return float(np.corrcoef(ra, rb)[0, 1])

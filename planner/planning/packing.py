"""Caramel's transfer scheduler: greedy 2D bin packing over time x size (Caramel §4.3).

One iteration in steady state is the backward pass ``[0, B)``, then a gap (the
network-only time Caramel's placements add, ``gap >= 0``), then the next forward
pass ``[0, F)``. A group is ready at ``ready`` (into the backward pass) and must be
done by ``read`` (into the next forward pass, its first read). Each of `channels`
carries one transfer at a time.

1. Groups by descending size (ties: earlier ready, then name).
2. Each goes at the earliest free time in the backward pass after it is ready and
   ending by B; else at the earliest free time in the forward pass ending by its read.
3. The rest, still by size, go beyond the compute: after the backward pass (earliest
   start >= ready, may end past B) or before the forward pass (latest end <= read, may
   start before 0), whichever raises the iteration time less (the backward side on a
   tie). A channel's time past B and before 0 share the gap, so the gap is the largest
   per-channel sum of the two; a placement's `overhead` is how much it grew the gap.

Predicted iteration time = F + B + gap = F + B + the sum of the overheads.
Placements report `start`/`end` from the start of their pass: backward-side ones from
the backward pass's start, forward-side ones from the next forward pass's start.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

PASSES = ("backward", "forward", "beyond_backward", "beyond_forward")


@dataclass(frozen=True)
class Group:
    """A transfer to place: seconds on the wire, ready time and read deadline."""

    name: str
    nbytes: int
    duration: float
    ready: float
    read: float


@dataclass(frozen=True)
class Placement:
    """Where a group goes: `pass_` in PASSES, a channel, and the time it adds."""

    group: str
    pass_: str
    channel: int
    start: float
    end: float
    overhead: float


@dataclass(frozen=True)
class Packing:
    placements: tuple[Placement, ...]
    backward: float
    forward: float
    gap: float
    iteration_time: float
    overhead: float


def mirror_reads(ready: Mapping[str, float], backward: float, forward: float) -> dict[str, float]:
    """First-read estimate when the graph has none: the mirror of the backward pass.

    A gradient ready late in the backward pass belongs to an early layer, read early
    in the forward pass: ``read = F * (1 - ready / B)``.
    """
    if backward <= 0:
        return dict.fromkeys(ready, 0.0)
    return {p: forward * max(0.0, 1.0 - r / backward) for p, r in ready.items()}


def _earliest(busy: list[tuple[float, float]], low: float, d: float) -> float:
    """Earliest start >= low of a free slot of length d among sorted busy intervals."""
    s = low
    for a, b in busy:
        if b <= s:
            continue
        if a >= s + d:
            break
        s = max(s, b)
    return s


def _latest(busy: list[tuple[float, float]], high: float, d: float) -> float:
    """Latest end <= high of a free slot of length d among sorted busy intervals."""
    e = high
    for a, b in reversed(busy):
        if a >= e:
            continue
        if b <= e - d:
            break
        e = min(e, a)
    return e


def sort_key(place: Placement, backward: float) -> tuple[int, float]:
    """The network's start order: backward-side placements, then forward-side ones."""
    side = 0 if place.pass_ in ("backward", "beyond_backward") else 1
    return (side, place.start)


def pack(groups: Sequence[Group], backward: float, forward: float, channels: int = 1) -> Packing:
    """Place every group (see the module docstring); deterministic."""
    if channels < 1:
        raise ValueError("channels must be >= 1")
    bp: list[list[tuple[float, float]]] = [[] for _ in range(channels)]
    fp: list[list[tuple[float, float]]] = [[] for _ in range(channels)]
    over_bp = [0.0] * channels
    over_fp = [0.0] * channels
    gap = 0.0
    placed: dict[str, Placement] = {}
    ordered = sorted(groups, key=lambda g: (-g.nbytes, g.ready, g.name))

    def put(lists: list[list[tuple[float, float]]], c: int, s: float, e: float) -> None:
        lists[c].append((s, e))
        lists[c].sort()

    left: list[Group] = []
    for g in ordered:
        d = g.duration
        best = min(((_earliest(bp[c], g.ready, d), c) for c in range(channels)), key=lambda t: t)
        if best[0] + d <= backward + 1e-15:
            put(bp, best[1], best[0], best[0] + d)
            placed[g.name] = Placement(g.name, "backward", best[1], best[0], best[0] + d, 0.0)
            continue
        best = min(((_earliest(fp[c], 0.0, d), c) for c in range(channels)), key=lambda t: t)
        if best[0] + d <= g.read + 1e-15:
            put(fp, best[1], best[0], best[0] + d)
            placed[g.name] = Placement(g.name, "forward", best[1], best[0], best[0] + d, 0.0)
            continue
        left.append(g)

    for g in left:
        d = g.duration
        options = []
        for c in range(channels):
            s = _earliest(bp[c], g.ready, d)
            new_gap = max(gap, max(over_bp[c], s + d - backward) + over_fp[c])
            options.append((new_gap - gap, 0, s, c))
            e = _latest(fp[c], g.read, d)
            new_gap = max(gap, over_bp[c] + max(over_fp[c], d - e))
            options.append((new_gap - gap, 1, e - d, c))
        overhead, side, s, c = min(options)
        if side == 0:
            put(bp, c, s, s + d)
            over_bp[c] = max(over_bp[c], s + d - backward)
            pass_ = "beyond_backward" if s + d > backward else "backward"
        else:
            put(fp, c, s, s + d)
            over_fp[c] = max(over_fp[c], -s)
            pass_ = "beyond_forward" if s < 0 else "forward"
        gap += overhead
        placed[g.name] = Placement(g.name, pass_, c, s, s + d, overhead)
    order = tuple(placed[g.name] for g in groups)
    return Packing(
        placements=order,
        backward=backward,
        forward=forward,
        gap=gap,
        iteration_time=forward + backward + gap,
        overhead=gap,
    )

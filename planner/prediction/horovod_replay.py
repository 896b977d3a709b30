"""Horovod's background loop replayed: an iteration's all-reduces under other fusion settings.

Horovod (``horovod/common/operations.cc``) runs one background loop per rank. Each cycle
it gathers the tensors every rank has asked for, fuses them into buffers of at most
``HOROVOD_FUSION_THRESHOLD`` bytes (in the order they became ready, each buffer filled
from the tensors after it that still fit; a larger tensor goes alone), all-reduces the
buffers one after the other, and starts its next cycle ``HOROVOD_CYCLE_TIME`` after the
last began, or when that work ends if later. The loop's period also holds the
coordination itself (the negotiation messages), which a timeline's ``CYCLE_START``
marks show: its `overhead` is their median gap less the cycle time the job ran with.

The replay takes each all-reduce's ready time from the timeline (when the last rank
asked for it: `planner.ingest.horovod.allreduce_records`) and costs a buffer of d bytes
``f(d) = a + b*d`` (the network model Caramel fits to the same all-reduces). The first
cycle of an iteration begins half a period after its first tensor is ready (the
expected phase of a loop that runs regardless). An iteration's *span* is from its first
ready tensor to the end of its last all-reduce: the communication the settings change.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from planner.model.oracle import NetworkModel

Ready = tuple[int, int, str]
"""An all-reduce to run: (ready ns, bytes, tensor)."""


@dataclass(frozen=True)
class Iteration:
    """One iteration as traced: its all-reduces, the buffers Horovod ran, the span."""

    tensors: tuple[Ready, ...]
    fused: tuple[tuple[str, ...], ...]
    span: float  # seconds, first ready tensor to the last all-reduce's end


def iterations(records: Mapping[str, Sequence[Any]]) -> list[Iteration]:
    """The traced iterations of `allreduce_records`, in order."""
    by: dict[int, list[int]] = {}
    for k, it in enumerate(records["iteration"]):
        by.setdefault(int(it), []).append(k)
    out = []
    for it in sorted(by):
        rows = by[it]
        ready = tuple(
            sorted(
                (
                    int(records["ready_last"][k]),
                    int(records["nbytes"][k]),
                    str(records["tensor"][k]),
                )
                for k in rows
            )  # fmt: skip
        )
        buffers: dict[int, list[str]] = {}
        for k in sorted(rows, key=lambda k: records["start"][k]):
            buffers.setdefault(int(records["fused"][k]), []).append(str(records["tensor"][k]))
        first = min(r for r, _, _ in ready)
        last = max(int(records["end"][k]) for k in rows)
        fused = tuple(tuple(sorted(b)) for b in buffers.values())
        out.append(Iteration(ready, fused, (last - first) / 1e9))
    return out


def fuse(ready: Sequence[Ready], threshold: int) -> list[list[Ready]]:
    """Horovod's buffers of one cycle: in ready order, each filled from the later tensors
    that still fit under `threshold` bytes (a larger tensor alone)."""
    left = list(ready)
    buffers = []
    while left:
        buffer, size, rest = [left[0]], left[0][1], []
        for item in left[1:]:
            if size + item[1] <= threshold:
                buffer.append(item)
                size += item[1]
            else:
                rest.append(item)
        buffers.append(buffer)
        left = rest
    return buffers


def replay_iteration(
    tensors: Sequence[Ready],
    threshold: int,
    period: float,
    overhead: float,
    network: NetworkModel,
) -> tuple[float, tuple[tuple[str, ...], ...]]:
    """(span seconds, buffers) of one iteration under the settings (module docstring).
    `period`: the loop's period (cycle time + `overhead`), seconds."""
    first = min(r for r, _, _ in tensors) / 1e9
    left = sorted((r / 1e9, n, t) for r, n, t in tensors)
    cycle = first + period / 2
    end = first
    buffers: list[tuple[str, ...]] = []
    while left:
        ready = [x for x in left if x[0] <= cycle]
        if not ready:
            cycle += period * math.ceil((left[0][0] - cycle) / period)
            continue
        now = cycle
        for buffer in fuse([(0, n, t) for _, n, t in ready], threshold):
            now += network.time(sum(n for _, n, _ in buffer))
            buffers.append(tuple(sorted(t for _, _, t in buffer)))
        left = [x for x in left if x[0] > cycle]
        end = now
        cycle = max(cycle + period, now + overhead)
    return end - first, tuple(buffers)


def replay(
    traced: Sequence[Iteration],
    threshold: int,
    cycle_time: float,
    overhead: float,
    network: NetworkModel,
) -> dict[str, Any]:
    """Every traced iteration replayed under (`threshold` bytes, `cycle_time` s):
    ``spans`` (seconds, numpy) and ``buffers`` (per iteration, each a tuple of tensors)."""
    found = [replay_iteration(it.tensors, threshold, cycle_time + overhead, overhead, network)
             for it in traced]  # fmt: skip
    return {
        "spans": np.array([span for span, _ in found], dtype=np.float64),
        "buffers": [buffers for _, buffers in found],
    }

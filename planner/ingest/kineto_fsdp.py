"""The FSDP unit of each collective of one rank, where the trace names it.

FSDP2 (``fully_shard``) records a range around each collective it issues, named for
the unit (its module's name in the model): ``FSDP::all_gather (<unit>)`` around a
unit's parameter all-gather (in its pre-forward, its pre-backward or a prefetch),
``FSDP::post_backward_reduce (<unit>)`` around its gradient reduce-scatter. FSDP1
records none: its units are told apart by their bytes (`planner.measure.fsdp`).
"""

from __future__ import annotations

import re

import numpy as np

from planner.ingest.kineto_events import RankEvents
from planner.ingest.kineto_steps import by_lane

UNIT_RANGE = re.compile(r"^FSDP::(?:all_gather|post_backward_reduce|reduce_scatter)\s*\((.*)\)$")


def units(ev: RankEvents, calls: list[int]) -> list[str | None]:
    """Per c10d op row of `calls` (-1: none), the unit of the innermost FSDP range
    around it on its thread (`UNIT_RANGE`), None outside one."""
    unit_of = [UNIT_RANGE.match(n) for n in ev.names]
    rows = np.flatnonzero(ev.name_flags(UNIT_RANGE.match))
    lanes = by_lane(rows, ev.lane, ev.ts)
    out: list[str | None] = []
    for call in calls:
        starts, found = lanes.get(int(ev.lane[call]), (None, None)) if call >= 0 else (None, None)
        unit = None
        if starts is not None:
            j = int(np.searchsorted(starts, ev.ts[call], side="right")) - 1
            while j >= 0 and unit is None:
                row = int(found[j])
                if ev.end[row] >= ev.end[call]:
                    unit = unit_of[ev.name_code[row]].group(1).strip()[:200]
                j -= 1
                if j >= 0 and ev.ts[call] - starts[j] > 10**9:  # 1 s of unrelated ranges
                    break
        out.append(unit)
    return out

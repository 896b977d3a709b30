"""Scheduling-efficiency figures (TicTac §3.2) and transfer-order stability (§2.2).

Per iteration, with that iteration's own dedicated op times:
``umax = sum Time(op)`` (all serial), ``lmin = max_resource sum Time(op on it)``
(every resource always busy), ``efficiency = (umax - m) / (umax - lmin)`` and
``speedup_bound = (umax - lmin) / lmin``.

The makespan ``m`` is the iteration's busy time: its span less the ``idle`` time in
which none of the rank's ops ran (waiting on something outside the DAG — the PS's
own compute, another worker, the client). Idle time is no ordering effect, so it is
reported on its own instead of being charged to the schedule; with it removed,
``lmin <= m <= umax`` holds by construction and E lies in [0, 1].
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from planner.graph import OpGraph
from planner.trace import busy_time


@dataclass(frozen=True)
class StepMetrics:
    """TicTac's figures for one iteration of one rank; times in seconds."""

    rank: str
    iteration: int
    makespan: float
    idle: float
    busy_makespan: float
    umax: float
    lmin: float
    efficiency: float
    speedup_bound: float
    transfer_order: tuple[str, ...]


def bounds(times: Mapping[str, float], graph: OpGraph) -> tuple[float, float]:
    """(Umax, Lmin) of Equations 1 and 2 for op times in seconds."""
    per_resource: dict[str, float] = {}
    for name, t in times.items():
        resource = graph.ops[name].resource if name in graph.ops else "?"
        per_resource[resource] = per_resource.get(resource, 0.0) + t
    umax = float(sum(per_resource.values()))
    lmin = float(max(per_resource.values(), default=0.0))
    return umax, lmin


def efficiency(umax: float, lmin: float, makespan: float) -> float:
    """Equation 3; 1.0 when the bounds coincide (no ordering can matter)."""
    if umax - lmin <= 0:
        return 1.0
    return float(min(1.0, max(0.0, (umax - makespan) / (umax - lmin))))


def speedup_bound(umax: float, lmin: float) -> float:
    """Equation 4: the most the best schedule can gain over the worst."""
    return float((umax - lmin) / lmin) if lmin > 0 else 0.0


def step_metrics(graph: OpGraph, rank: str, iteration: int, rows: pd.DataFrame) -> StepMetrics:
    """Figures of one iteration from its rows (with `dedicated` and `resource`)."""
    starts = rows["start"].to_numpy()
    durations = rows["duration"].to_numpy()
    if len(rows) == 0:
        return StepMetrics(rank, iteration, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, ())
    span = float((starts + durations).max() - starts.min())
    busy = float(busy_time(starts, durations))
    per_resource = rows.groupby("resource")["dedicated"].sum()
    umax = float(per_resource.sum()) / 1e9
    lmin = float(per_resource.max()) / 1e9
    m = busy / 1e9
    recvs = rows[[graph.ops[n].kind == "recv" if n in graph.ops else False for n in rows["op"]]]
    order = tuple(
        recvs.assign(end=recvs["start"] + recvs["duration"])
        .sort_values(["end", "op"], kind="stable")["op"]
        .tolist()
    )
    return StepMetrics(
        rank=rank,
        iteration=iteration,
        makespan=span / 1e9,
        idle=(span - busy) / 1e9,
        busy_makespan=m,
        umax=umax,
        lmin=lmin,
        efficiency=efficiency(umax, lmin, m),
        speedup_bound=speedup_bound(umax, lmin),
        transfer_order=order,
    )


def distinct_orders(steps: list[StepMetrics]) -> int:
    """How many different recv completion orders the iterations show (TicTac §2.2)."""
    return len({s.transfer_order for s in steps if s.transfer_order})


def summarize(steps: list[StepMetrics]) -> dict[str, float]:
    """Mean/min of efficiency and mean makespan over iterations."""
    if not steps:
        return {}
    eff = np.array([s.efficiency for s in steps])
    return {
        "efficiency_mean": float(eff.mean()),
        "efficiency_min": float(eff.min()),
        "makespan_mean": float(np.mean([s.makespan for s in steps])),
        "busy_makespan_mean": float(np.mean([s.busy_makespan for s in steps])),
        "speedup_bound_mean": float(np.mean([s.speedup_bound for s in steps])),
        "distinct_transfer_orders": distinct_orders(steps),
    }

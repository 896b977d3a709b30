"""The schedules a person looks at: the traced step with the median busy makespan
(`median_step`, `observed_timeline`) beside each plan's simulated schedule
(`timelines_of`), in the columnar form `planner.export.chrome_trace` writes."""

from __future__ import annotations

from typing import Any

import numpy as np

from planner.errors import InputError
from planner.model.arrays import lanes
from planner.model.trace import Job
from planner.prediction.step_model import measured


def observed_timeline(job: Job, rank: str, iteration: int) -> dict[str, list]:
    """The traced schedule of one step in `timeline` form (starts from the step's first op)."""
    graph = job.graphs[rank]
    rows = job.trace.of(rank, iteration)
    rows = rows[rows["op"].isin(graph.ops)]
    if not len(rows):
        raise InputError(None, f"{rank} has no timed ops in step {iteration}")
    resource = np.array([graph.ops[n].resource for n in rows["op"]], dtype=object)
    start = (rows["start"].to_numpy() - rows["start"].min()) / 1e9
    duration = rows["duration"].to_numpy() / 1e9
    return {
        "op": rows["op"].tolist(),
        "resource": resource.tolist(),
        "lane": lanes(resource, start, duration).tolist(),
        "start": start.tolist(),
        "duration": duration.tolist(),
    }


def median_step(job: Job, rank: str) -> int:
    """The traced step of `rank` with the median busy makespan (lower median)."""
    frame = job.trace.of(rank)
    if not len(frame):
        raise InputError(None, f"{rank} has no timed steps")
    busy = [(measured(rows)[0], int(i)) for i, rows in frame.groupby("iteration", sort=True)]
    return sorted(busy)[(len(busy) - 1) // 2][1]


def timelines_of(job: Job, comparison: dict[str, Any]) -> list[dict[str, Any]]:
    """Moves the per-plan timelines out of `comparison` into a list of schedules.

    Adds, per rank, the traced step with the median busy makespan as plan ``measured``.
    """
    out = []
    for entry in comparison["ranks"]:
        rank = entry["rank"]
        step = median_step(job, rank)
        out.append(
            {
                "plan": "measured",
                "rank": rank,
                "iteration": step,
                "timeline": observed_timeline(job, rank, step),
            }
        )
        for plan in entry["plans"]:
            if "timeline" in plan:
                out.append(
                    {
                        "plan": plan["plan"],
                        "rank": rank,
                        "predicted": plan["predicted"],
                        "timeline": plan.pop("timeline"),
                    }
                )
    return out

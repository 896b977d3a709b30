"""Schedules as Chrome trace JSON (the Trace Event Format) for Perfetto / chrome://tracing.

One process per (plan, rank), one thread (track) per resource and lane, one complete
("X") event per op. Transfers are named by parameter and size; every event's `args`
carries the op, kind, param and bytes. The plan names sit in the process names and in
``otherData``. A schedule is the columnar `timeline` of `planner.prediction.event_loop` (simulated
or observed): op, resource, lane, start and duration in seconds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from planner.model.graph import OpGraph

SCHEMA = "planner.timeline/1"


def label(graph: OpGraph | None, op: str) -> str:
    """Event name: the op, or for a transfer its parameter and bytes."""
    o = graph.ops.get(op) if graph is not None else None
    if o is None or not o.is_transfer:
        return op
    return f"{o.kind} {o.param or op} ({o.nbytes} B)"


def _meta(pid: int, tid: int, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"ph": "M", "pid": pid, "tid": tid, "name": name, "args": args}


def track_events(
    timeline: Mapping[str, Sequence[Any]],
    graph: OpGraph | None,
    pid: int,
    process: str,
    sort_index: int = 0,
) -> list[dict[str, Any]]:
    """Metadata and one "X" event per op of one schedule, as process `pid`."""
    events: list[dict[str, Any]] = [
        _meta(pid, 0, "process_name", {"name": process}),
        _meta(pid, 0, "process_sort_index", {"sort_index": sort_index}),
    ]
    tracks = sorted(set(zip(timeline["resource"], timeline["lane"], strict=True)))
    tid = {track: k + 1 for k, track in enumerate(tracks)}
    lanes_of: dict[str, int] = {}
    for resource, _ in tracks:
        lanes_of[resource] = lanes_of.get(resource, 0) + 1
    for (resource, lane), k in tid.items():
        name = resource if lanes_of[resource] == 1 else f"{resource} #{lane}"
        events.append(_meta(pid, k, "thread_name", {"name": name}))
        events.append(_meta(pid, k, "thread_sort_index", {"sort_index": k}))
    columns = zip(
        timeline["op"],
        timeline["resource"],
        timeline["lane"],
        timeline["start"],
        timeline["duration"],
        strict=True,
    )
    for op, resource, lane, start, duration in columns:
        o = graph.ops.get(op) if graph is not None else None
        args: dict[str, Any] = {"op": op, "resource": resource}
        if o is not None:
            args.update(kind=o.kind, phase=o.phase)
            if o.is_transfer:
                args.update(param=o.param, nbytes=o.nbytes)
        events.append(
            {
                "name": label(graph, op),
                "cat": o.kind if o is not None else "op",
                "ph": "X",
                "pid": pid,
                "tid": tid[(resource, lane)],
                "ts": float(start) * 1e6,
                "dur": float(duration) * 1e6,
                "args": args,
            }
        )
    return events


def chrome_trace(
    schedules: Sequence[Mapping[str, Any]], metadata: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """A Chrome trace document of several schedules side by side.

    Each schedule: ``plan`` (name), ``rank``, ``timeline`` and optionally ``graph``
    (for labels), ``predicted`` and ``iteration`` (shown in the process name).
    """
    events: list[dict[str, Any]] = []
    listed = []
    for pid, schedule in enumerate(schedules, start=1):
        plan, rank = str(schedule["plan"]), str(schedule["rank"])
        process = f"{rank} · {plan}"
        if schedule.get("iteration") is not None:
            process += f" step {schedule['iteration']}"
        if schedule.get("predicted") is not None:
            process += f" ({float(schedule['predicted']) * 1e3:.3f} ms)"
        events.extend(track_events(schedule["timeline"], schedule.get("graph"), pid, process, pid))
        listed.append(
            {"pid": pid, "plan": plan, "rank": rank, "ops": len(schedule["timeline"]["op"])}
        )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"schema": SCHEMA, **(metadata or {}), "schedules": listed},
    }

"""Per FSDP unit and step: its all-gathers' exposed time and its reduce-scatter's overlap.

A job that reduce-scatters its gradients (FSDP, ZeRO) all-gathers each unit's
parameters before the unit's forward (and again before its backward where it reshards
after the forward), and reduce-scatters the unit's gradients after its backward. Per
unit the figures are its collectives' traced time and the part of it in which the rank
computed nothing (`exposed`, as `planner.measure.communication` counts it): an
all-gather's exposed time is the compute waiting for the unit's parameters, a
reduce-scatter's hidden time its overlap with the backward's compute.

A unit is the one an FSDP2 range names (``FSDP::all_gather (<unit>)``: ``source``
``"trace"``), else the unit of the collective's bytes (FSDP1 records no unit: an
all-gather and a reduce-scatter of the same unsharded size are one unit's, ``source``
``"inferred"``; two units of one size are one row).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from planner.measure.communication import exposed_ns, totals
from planner.model.graph import PHASES
from planner.model.trace import Job, rank_meta

FSDP_KINDS = ("all_gather", "reduce_scatter")


def rank_units(job: Job, rank: str) -> dict[str, Any] | None:
    """One rank's rows per step, unit, kind and phase (count, bytes, time, exposed) and
    its units (name, source, bytes, order of first use); None unless it reduce-scatters."""
    graph = job.graphs[rank]
    meta = rank_meta(job, rank)
    called = meta.get("collectives") or {}
    if not any((c or {}).get("kind") == "reduce_scatter" for c in called.values()):
        return None
    shown = meta.get("exposed") or {}
    unit_of: dict[str, str] = {}
    units: dict[str, dict[str, Any]] = {}
    for name, op in graph.ops.items():
        c = called.get(name) or {}
        if op.kind != "collective" or c.get("kind") not in FSDP_KINDS:
            continue
        unit = c.get("unit")
        key = str(unit) if unit is not None else f"{op.nbytes} B"
        unit_of[name] = key
        source = "trace" if unit is not None else "inferred"
        entry = units.setdefault(
            key, {"unit": key, "bytes": int(op.nbytes), "order": len(units), "source": source}
        )
        entry["bytes"] = max(entry["bytes"], int(op.nbytes))
    table, rows = job.trace.table, job.trace.rows_of(rank)
    found: dict[tuple[Any, ...], list[int]] = {}
    for op, step, took in zip(table["op"][rows].tolist(), table["iteration"][rows].tolist(),
                              table["duration"][rows].tolist(), strict=True):  # fmt: skip
        if op not in unit_of:
            continue
        key = (int(step), unit_of[op], called[op]["kind"], graph.ops[op].phase)
        entry = found.setdefault(key, [0, 0, 0, 0])
        entry[0] += 1
        entry[1] += int(graph.ops[op].nbytes)
        entry[2] += int(took)
        entry[3] += exposed_ns(shown, int(step), op, int(took))
    return {
        "rank": rank,
        "steps": len(set(table["iteration"][rows].tolist())),
        "units": units,
        "rows": [
            {
                "rank": rank,
                "iteration": s,
                "unit": u,
                "kind": k,
                "phase": p,
                "count": n,
                "bytes": b,
                "time": t / 1e9,
                "exposed": x / 1e9,
            }  # fmt: skip
            for (s, u, k, p), (n, b, t, x) in sorted(found.items())
        ],
    }


def join(parts: Iterable[Mapping[str, Any] | None]) -> dict[str, Any] | None:
    """The job's ``fsdp`` document from its ranks' `rank_units`: the units in order of
    first use, the rows, and per unit, kind and phase the totals and figures per step
    (`communication.totals`); None when no rank reduce-scatters."""
    parts = [p for p in parts if p]
    if not parts:
        return None
    units: dict[str, dict[str, Any]] = {}
    for part in parts:
        for name, unit in part["units"].items():
            units.setdefault(name, dict(unit))
    order = {name: u["order"] for name, u in units.items()}
    rows = [row for part in parts for row in part["rows"]]
    steps = {p["rank"]: p["steps"] for p in parts}
    found = totals(rows, ("unit", "kind", "phase"), steps)
    phase = {p: i for i, p in enumerate(PHASES)}
    found.sort(key=lambda e: (order[e["unit"]], FSDP_KINDS.index(e["kind"]), phase[e["phase"]]))
    listed = sorted(units.values(), key=lambda u: u["order"])
    return {
        "units": [{k: v for k, v in u.items() if k != "order"} for u in listed],
        "rows": rows,
        "by_unit_kind_phase": found,
    }

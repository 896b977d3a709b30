"""A TensorFlow read's transfers planned as one transfer.

Grappler folds a static `ShapeN` of a PS-side variable read into a control message
beside the read's data: the worker then has two recvs of the read, ``recv:^X`` (0 bytes)
and ``recv:X`` (the tensor). Both leave the PS when the read X is done, and the TF
module orders the read, not the message (`planner.export.tf_graph`). Planned apart,
TAC put every 0-byte message first (its communication time is nothing), so the plan's
order of reads followed the messages while its replay, which orders the reads by their
data, ran another; and TIC and TAC replayed alike. Planned as one (`contracted`), the
read is placed where its data is best placed, and the message rides with it
(`expanded`: just before its data, at its priority).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

import numpy as np

from planner.model.graph import OpGraph, is_acyclic
from planner.model.plan import Plan, read_of

MESSAGE = "recv:^"


def read_units(graph: OpGraph) -> dict[str, str]:
    """Control message -> the data transfer of the same read (``recv:^X`` -> ``recv:X``,
    `read_of` both), for every read of `graph` that has both."""
    recvs = set(graph.recvs)
    return {
        r: f"recv:{read_of(r)}"
        for r in graph.recvs
        if r.startswith(MESSAGE) and f"recv:{read_of(r)}" in recvs
    }


def contracted(graph: OpGraph, units: Mapping[str, str]) -> OpGraph | None:
    """`graph` with each message of `units` merged into its data transfer (its edges
    moved to it, the transfer's bytes kept: a message carries none); None where the
    merge would close a cycle (the two are then planned apart, as before)."""
    if not units:
        return graph
    keep = [n for n in graph.ops if n not in units]
    position = {n: i for i, n in enumerate(keep)}
    target = np.array([position[units.get(n, n)] for n in graph.ops], dtype=np.int64)
    edges: dict[tuple[int, int], bool] = {}  # (src, dst) -> control, in first-seen order
    for u, v, c in zip(
        target[graph.src].tolist(), target[graph.dst].tolist(), graph.control.tolist(), strict=True
    ):
        if u != v:
            edges[(u, v)] = edges.get((u, v), True) and bool(c)  # data wins over control
    pairs = np.array(list(edges), dtype=np.int64).reshape(-1, 2)
    merged = OpGraph(
        ops={n: graph.ops[n] for n in keep},
        src=pairs[:, 0],
        dst=pairs[:, 1],
        control=np.array(list(edges.values()), dtype=bool),
    )
    return merged if is_acyclic(merged.src, merged.dst, len(merged)) else None


def expanded(plan: Plan, units: Mapping[str, str]) -> Plan:
    """`plan` (made on the `contracted` graph) for the whole graph: each message just
    before its data transfer in the order, with its priority and figures."""
    messages: dict[str, list[str]] = {}
    for message, data in sorted(units.items()):
        messages.setdefault(data, []).append(message)
    order = tuple(n for name in plan.order for n in (*messages.get(name, ()), name))
    priority = dict(plan.priority)
    priority.update({m: plan.priority[d] for m, d in units.items() if d in plan.priority})
    properties = {
        key: {**values, **{m: values[d] for m, d in units.items() if d in values}}
        for key, values in plan.properties.items()
    }
    return replace(plan, order=order, priority=priority, properties=properties)


def planned_as_units(graph: OpGraph, plan_on: Callable[[OpGraph], Plan]) -> Plan:
    """`plan_on(graph)` with each read's transfers planned as one (`contracted`,
    `expanded`); on `graph` as it is where it has no such read or the merge would close
    a cycle. The plan's inputs count the ops and recvs of `graph`."""
    units = read_units(graph)
    merged = contracted(graph, units)
    if merged is None or merged is graph:
        return plan_on(graph)
    plan = expanded(plan_on(merged), units)
    counts = {"n_ops": len(graph), "n_recvs": len(graph.recvs)}
    kept = {k: v for k, v in counts.items() if k in plan.inputs}
    return replace(plan, inputs={**plan.inputs, **kept})

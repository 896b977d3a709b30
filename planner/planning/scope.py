"""Which collectives the schedulers and the bucket advice plan: those of the data-parallel
process group, and which groups they leave alone.

Caramel orders and batches a data-parallel job's gradient all-reduces, and DDP's bucket
cap sizes them: a tensor-parallel group's all-reduces of activations, a pipeline's
sends or an expert group's all-to-alls are no gradients to order, and run when the
model's math needs them. On a rank whose collectives run on one group everything is
planned, as before; on a rank of several groups (`planner.ingest.kineto_groups`: each
group's role, stated by the trace or inferred) only the collectives of a data-parallel
group are. A job that shards its gradients (FSDP, ZeRO: reduce-scatters) has no DDP
buckets and no gradient all-reduces to order: Caramel does not apply (`sharded`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from planner.ingest.kineto_calls import SHARDING
from planner.ingest.kineto_groups import DATA_ROLES, SHARDED_NOTE
from planner.model.graph import OpGraph


def _groups_of(graph: OpGraph, meta: Mapping[str, Any]) -> dict[str, list[str]]:
    """Group name -> the rank's collective ops on it (rank meta ``collectives``; all on
    one unnamed group where the meta names none)."""
    called = meta.get("collectives") or {}
    out: dict[str, list[str]] = {}
    for name, op in graph.ops.items():
        if op.kind == "collective":
            group = str((called.get(name) or {}).get("group", "0"))
            out.setdefault(group, []).append(name)
    return out


def sharded(graph: OpGraph, meta: Mapping[str, Any]) -> bool:
    """Whether the rank reduce-scatters (FSDP, ZeRO), by the ingest's kinds."""
    called = meta.get("collectives") or {}
    return any(
        (called.get(name) or {}).get("kind") in SHARDING
        for name, op in graph.ops.items()
        if op.kind == "collective"
    )


def group_scope(graph: OpGraph, meta: Mapping[str, Any]) -> dict[str, Any] | None:
    """None where the rank's collectives run on one process group (all planned); else
    ``planned`` (the collectives of its data-parallel groups), ``groups`` (those groups)
    and ``left_alone`` (the others), each group as ``name``, ``desc``, ``role``,
    ``role_source``, ``ranks`` and its number of ``collectives``."""
    by_group = _groups_of(graph, meta)
    if len(by_group) < 2:
        return None
    described = meta.get("process_groups") or {}
    planned, groups, left = [], [], []
    for name, ops in sorted(by_group.items()):
        info = described.get(name) or {}
        entry = {
            "name": name,
            **{k: info[k] for k in ("desc", "role", "role_source", "ranks") if k in info},
            "collectives": len(ops),
        }
        if info.get("role") in DATA_ROLES:
            planned.extend(ops)
            groups.append(entry)
        else:
            left.append(entry)
    return {"planned": sorted(planned), "groups": groups, "left_alone": left}


def rank_problem(graph: OpGraph, meta: Mapping[str, Any]) -> str | None:
    """Why Caramel and the bucket advice do not plan a rank's collectives: it shards its
    gradients, or none of its several process groups is data-parallel; None where they
    plan them."""
    if sharded(graph, meta):
        return f"Caramel does not apply: {SHARDED_NOTE}"
    scope = group_scope(graph, meta)
    if scope is not None and not scope["planned"]:
        left = ", ".join(sorted(g.get("desc") or g["name"] for g in scope["left_alone"]))
        return (
            "Caramel does not apply: it orders a data-parallel group's gradient all-reduces, "
            f"and none of the process groups ({left}) is data-parallel"
        )
    return None


def scope_line(scope: Mapping[str, Any]) -> str:
    """What a plan or the bucket advice planned and left alone, in words (the groups as
    the reference rank holds them: every rank plans its own group of that role)."""

    def named(g: Mapping[str, Any]) -> str:
        role = str(g.get("role", "unknown")).replace("_", " ")
        inferred = ", inferred" if g.get("role_source") == "inferred" else ""
        ranks = ",".join(map(str, g["ranks"])) if g.get("ranks") else "?"
        return f"{g.get('desc') or g['name']} ({role}{inferred}; group {g['name']}: ranks {ranks})"

    planned = "; ".join(named(g) for g in scope.get("groups", [])) or "none"
    left = "; ".join(named(g) for g in scope.get("left_alone", [])) or "none"
    return (
        f"planned only the collectives of the data-parallel group {planned}; left alone "
        f"{left} (groups as the reference rank holds them)"
    )

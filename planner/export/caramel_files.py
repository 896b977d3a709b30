"""Caramel's files for the enforcement side (format in docs/caramel.md).

- ``planner.control_deps/1``: per rank, the control edges by op name (the TF graph
  rewrite adds each as a ``^src`` input of ``dst``) and the activation order.
- ``planner.bucket_plan/1``: per rank, the groups in the order the network sends them,
  each with parameter names, bytes, depth and placement; a PyTorch DDP hook or the
  gradient-sync module all-reduces exactly these groups in this order. For a traced
  PyTorch DDP job each group also lists its DDP ``buckets`` (with their tensors) and the
  rank the traced ``model`` (`planner.export.ddp_buckets`), so the runtime binds the
  file to the live model unedited.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from planner.export import ddp_buckets
from planner.export.files import dumps, write_atomic
from planner.model.graph import OpGraph
from planner.model.plan import Plan

CONTROL_DEPS_SCHEMA = "planner.control_deps/1"
BUCKET_PLAN_SCHEMA = "planner.bucket_plan/1"


def _caramel(plans: Mapping[str, Plan]) -> list[tuple[str, Plan]]:
    out = []
    for rank in sorted(plans):
        plan = plans[rank]
        if plan.algorithm != "caramel":
            raise ValueError(f"rank {rank}: a {plan.algorithm} plan has no Caramel files")
        out.append((rank, plan))
    return out


def control_deps_document(plans: Mapping[str, Plan]) -> dict[str, Any]:
    """Edges (src before dst) and activation order per rank."""
    return {
        "schema": CONTROL_DEPS_SCHEMA,
        "ranks": [
            {
                "rank": rank,
                "activation_order": list(plan.inputs.get("activation_order", ())),
                "edges": [{"src": u, "dst": v} for u, v in plan.control_edges],
            }
            for rank, plan in _caramel(plans)
        ],
    }


def bucket_plan_document(
    plans: Mapping[str, Plan],
    graphs: Mapping[str, OpGraph] | None = None,
    meta: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Groups in send order per rank, with the network model and threshold used.

    With the traced `graphs` (and the Job's `meta`, for the parameters ingest found),
    the groups of a DDP job carry their buckets and the rank its traced model.
    """
    ranks = []
    for rank, plan in _caramel(plans):
        i = plan.inputs
        graph = graphs.get(rank) if graphs is not None else None
        params = list(((meta or {}).get("parameters") or {}).get(rank) or ())
        source = ((meta or {}).get("parameter_source") or {}).get(rank)
        groups = [
            {
                "order_index": g["group"],
                "transfers": g["params"],
                "params": g["param_names"],
                "nbytes": g["nbytes"],
                "depth": g["depth"],
                "ready": g["ready"],
                "read": g["read"],
                "placement": {"pass": g["pass"], "start": g["start"], "end": g["end"]},
                "overhead": g["overhead"],
            }
            for g in i.get("groups", ())
        ]
        model = None
        if graph is not None:
            for doc, g in zip(groups, i.get("groups", ()), strict=True):
                buckets = ddp_buckets.bucket_entries(graph, g["params"], params)
                if buckets is not None:
                    doc["buckets"] = buckets
            model = ddp_buckets.model_entry(graph, params, source)
        entry: dict[str, Any] = {
            "rank": rank,
            "threshold_bytes": i.get("threshold_bytes"),
            "channels": i.get("channels", 1),
            "network": i.get("network"),
            "predicted_iteration_time": i.get("predicted_iteration_time"),
            "groups": groups,
        }
        if model is not None:
            entry["model"] = model
        ranks.append(entry)
    return {"schema": BUCKET_PLAN_SCHEMA, "ranks": ranks}


def write_control_deps(path: str | Path, plans: Mapping[str, Plan]) -> None:
    write_atomic(path, dumps(control_deps_document(plans)))


def write_bucket_plan(
    path: str | Path,
    plans: Mapping[str, Plan],
    graphs: Mapping[str, OpGraph] | None = None,
    meta: Mapping[str, Any] | None = None,
) -> None:
    write_atomic(path, dumps(bucket_plan_document(plans, graphs, meta)))

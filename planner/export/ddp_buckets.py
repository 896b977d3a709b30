"""What a PyTorch plan file carries so that the runtime can bind it to the live model.

A transfer of a traced DDP job is a bucket all-reduce (op `param` ``bucket<k>``; DDP
reduces buckets in index order, so k is also DDP's bucket index). Each planned transfer
or group lists its buckets with their bytes and, when the trace tells them apart (the
Execution Trace, or the layer ops' input shapes), their tensors: label, shape, bytes.
`planner.enforce.binding` matches those to ``model.named_parameters()``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from planner.model.graph import OpGraph

BUCKET = "bucket"


def bucket_index(graph: OpGraph, op_name: str) -> int | None:
    """DDP's index of the bucket a traced all-reduce carries (None: not a DDP bucket)."""
    op = graph.ops.get(op_name)
    if op is None or op.kind != "collective" or not (op.param or "").startswith(BUCKET):
        return None
    digits = str(op.param)[len(BUCKET) :]
    return int(digits) if digits.isdigit() else None


def bucket_entries(
    graph: OpGraph, op_names: Iterable[str], parameters: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]] | None:
    """The ``buckets`` of one transfer or group (None when one of its ops is no bucket)."""
    out = []
    for name in op_names:
        index = bucket_index(graph, name)
        if index is None:
            return None
        rows = sorted(
            (r for r in parameters if r.get("collective") == name),
            key=lambda r: (r.get("bucket_offset") is None, r.get("bucket_offset") or 0),
        )
        tensors = [{"name": str(r["name"]), "shape": r.get("shape"), "nbytes": int(r["nbytes"])}
                   for r in rows]  # fmt: skip
        out.append({"bucket": index, "nbytes": int(graph.ops[name].nbytes), "tensors": tensors})
    return out


def model_entry(
    graph: OpGraph, parameters: Sequence[Mapping[str, Any]], source: str | None
) -> dict[str, Any] | None:
    """The traced model as the binding sees it: DDP buckets, gradient bytes, tensors."""
    sizes = [graph.ops[n].nbytes for n in graph.ops if bucket_index(graph, n) is not None]
    if not sizes:
        return None
    return {
        "buckets": len(sizes),
        "nbytes": int(sum(sizes)),
        "parameters": len(parameters) or None,
        "parameter_source": source or "bucket",
    }

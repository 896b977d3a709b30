"""Parameters of one rank without an Execution Trace: the layer ops' weight and bias
inputs (``Input Dims``), assigned to DDP's gradient buckets by their sizes."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from planner.ingest.kineto_comms import DTYPE_BYTES

if TYPE_CHECKING:
    from planner.ingest.kineto_rank import RankModel

#: Layer ops whose (argument position, name) inputs are parameters; with Input Dims these
#: give the parameter sizes when no Execution Trace is at hand.
LAYER_PARAMS: dict[str, tuple[tuple[int, str], ...]] = {
    "aten::conv1d": ((1, "weight"), (2, "bias")),
    "aten::conv2d": ((1, "weight"), (2, "bias")),
    "aten::conv3d": ((1, "weight"), (2, "bias")),
    "aten::linear": ((1, "weight"), (2, "bias")),
    "aten::batch_norm": ((1, "weight"), (2, "bias")),
    "aten::layer_norm": ((2, "weight"), (3, "bias")),
    "aten::group_norm": ((2, "weight"), (3, "bias")),
    "aten::embedding": ((0, "weight"),),
    "aten::embedding_bag": ((0, "weight"),),
}


def layer_reads(
    events: list[tuple[str, dict[str, Any]]], op_of: list[str], steps: list[int]
) -> dict[int, list[tuple[str, str, int]]]:
    """Step -> the forward layer ops' parameter reads in time order: (op, label, nbytes).

    `events` are the layer events (name, args) in time order, `op_of` the op each
    belongs to ("" when it is no op) and `steps` their steps.
    """
    out: dict[int, list[tuple[str, str, int]]] = {}
    for (name, a), op, step in zip(events, op_of, steps, strict=True):
        if not op:
            continue
        dims, types = a.get("Input Dims") or [], a.get("Input type") or []
        for pos, label in LAYER_PARAMS[name]:
            if pos >= len(dims) or pos >= len(types) or not dims[pos]:
                continue
            size = DTYPE_BYTES.get(str(types[pos]).lower())
            if size is None or not all(isinstance(d, int) for d in dims[pos]):
                continue
            out.setdefault(int(step), []).append((op, label, math.prod(dims[pos]) * size))
    return out


def parameters_from_sizes(
    model: RankModel, reference: int
) -> tuple[list[dict[str, Any]], list[str]]:
    """Parameters of one rank from the layer ops' Input Dims and the DDP bucket sizes.

    Used without an Execution Trace. The candidates are the weight/bias inputs of the
    forward layer ops (`LAYER_PARAMS`) of the reference step. They are assigned to the
    gradient all-reduces (``bucket<k>``, in launch order) only when that is unambiguous:
    one bucket holding exactly their bytes, or several whose cumulative sizes each fall
    on a boundary between two layer ops of the reverse forward order (the order DDP
    fills its buckets in). Otherwise nothing is assigned and a note says the windows
    stay per bucket.
    """
    occ = model.occurrences
    sel = np.flatnonzero(occ.iteration == reference)
    found: list[tuple[int, str]] = []  # (start, op) of the step's bucket all-reduces
    for start, op_id in zip(occ.start[sel].tolist(), occ.op[sel].tolist(), strict=True):
        op = model.ops[model.op_names[op_id]]
        if op.kind == "collective" and (op.param or "").startswith("bucket"):
            found.append((start, op.name))
    found.sort()
    buckets = list(dict.fromkeys(op for _, op in found))  # in order of first start
    buckets.sort(key=lambda op: int(str(model.ops[op].param)[len("bucket") :]))
    if not buckets:
        return [], []
    sizes = [model.ops[op].nbytes for op in buckets]
    cands = list(reversed(model.layer_reads.get(reference, [])))
    total = sum(n for _, _, n in cands)
    per_bucket = f"{model.rank}: parameters stay per DDP bucket ({len(buckets)} buckets)"
    if not cands:
        return [], [f"{per_bucket}: no layer-op input shapes (profile with record_shapes=True)"]
    if total != sum(sizes):
        return [], [
            f"{per_bucket}: the forward layer ops read {total} parameter bytes, the buckets "
            f"carry {sum(sizes)}; an Execution Trace would tell them apart"
        ]
    owner: list[str] = []
    done, k, ambiguous = 0, 0, False
    for i, (op, _, nbytes) in enumerate(cands):
        if done == sizes[k] and k + 1 < len(sizes):  # a bucket ends before this one
            ambiguous |= i > 0 and cands[i - 1][0] == op
            done, k = 0, k + 1
        owner.append(buckets[k])
        done += nbytes
        if done > sizes[k]:
            ambiguous = True
            break
    if ambiguous or k != len(sizes) - 1:
        return [], [f"{per_bucket}: bucket sizes do not split the layers unambiguously"]
    out: list[dict[str, Any]] = []
    used: dict[str, int] = {}
    for (op, label, nbytes), bucket in zip(cands, owner, strict=True):
        base = f"{op.split('/', 1)[-1]}:{label}"
        used[base] = used.get(base, 0) + 1
        out.append(
            {
                "name": base if used[base] == 1 else f"{base}~{used[base]}",
                "shape": None,
                "nbytes": nbytes,
                "collective": bucket,
                "bucket_offset": None,
                "first_read_op": op,
            }
        )
    out.sort(key=lambda r: (r["collective"], r["name"]))
    return out, [
        f"{model.rank}: {len(out)} parameters assigned to {len(buckets)} DDP bucket(s) from "
        "their sizes (layer-op input shapes, reverse forward order); no names without an "
        "Execution Trace"
    ]


GRAD_READY = "torch::autograd::AccumulateGrad"
"""The autograd node that writes a parameter's gradient: its end is the gradient's
ready time, its ``Input Dims`` the gradient's shape (with ``record_shapes=True``)."""


def gradient_ready(
    events: list[tuple[int, dict[str, Any]]], steps: list[int]
) -> dict[int, list[tuple[int, int]]]:
    """Step -> the gradients in the order they became ready: (end ns, nbytes).

    `events` are the `GRAD_READY` events (end, args) in time order, `steps` their steps;
    an event without a usable shape is skipped.
    """
    out: dict[int, list[tuple[int, int]]] = {}
    for (end, a), step in zip(events, steps, strict=True):
        dims, types = a.get("Input Dims") or [], a.get("Input type") or []
        if not dims or not types or not isinstance(dims[0], list):
            continue
        size = DTYPE_BYTES.get(str(types[0]).lower())
        if size is None or not all(isinstance(d, int) and d >= 0 for d in dims[0]):
            continue
        out.setdefault(int(step), []).append((int(end), math.prod(dims[0]) * size))
    return out

"""Checks on values read from PyTorch traces that their readers would otherwise trust.

Plain functions over the parsed values, kept apart from the Kineto and Execution
Trace readers so that each check is one call there:

- `check_input_dims`: the `Input Dims` of the events whose arguments the planner uses
  (layer ops, collectives) are shapes: lists of non-negative integers, TensorLists of
  them, nested a few levels at most, and their element counts fit in int64;
- `check_world`: `distributedInfo.world_size` is positive and holds the rank;
- `check_same_job`: the ranks of one call come from one job: same world size, backend
  and process groups, and the same collectives (every rank of a process group calls
  each of its collectives), else the first difference is named.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from planner.errors import InputError
from planner.ingest.exact_json import number_text
from planner.ingest.files import MAX_NBYTES, size_text
from planner.model.graph import OpGraph

MAX_DIMS_DEPTH = 3
"""`Input Dims` nesting: the argument list, a TensorList, a shape (3 levels of lists)."""

_MAX_DIM = 1 << 62


def _shape_error(value: Any, depth: int) -> str | None:
    """What is wrong with one argument's dims (a shape or a TensorList), or None."""
    if depth > MAX_DIMS_DEPTH:
        return f"nested more than {MAX_DIMS_DEPTH} levels deep"
    if not isinstance(value, list):
        return f"holds {_a(value)} where a list of sizes belongs"
    if all(type(x) is int for x in value):  # (speed) a shape, as nearly all are: in C
        if value and not (min(value) >= 0 and max(value) < _MAX_DIM):
            return next(f"holds the size {x}, out of range [0, 2**62)" for x in value
                        if not 0 <= x < _MAX_DIM)  # fmt: skip
        numel = math.prod(value)
        if numel * 8 > MAX_NBYTES:
            return f"describes a tensor of {numel} elements, over {size_text(MAX_NBYTES)}"
        return None
    if any(isinstance(x, list) for x in value):
        for item in value:
            problem = _shape_error(item, depth + 1) if isinstance(item, list) else None
            if problem is None and not isinstance(item, list):
                problem = f"mixes sizes and lists ({item!r})"
            if problem:
                return problem
        return None
    numel = 1
    for size in value:
        if isinstance(size, bool) or not isinstance(size, int):
            return f"holds {_a(size)} ({size!r:.40}) where a size belongs"
        if not 0 <= size < _MAX_DIM:
            return f"holds the size {size}, out of range [0, 2**62)"
        numel *= size
    if numel * 8 > MAX_NBYTES:
        return f"describes a tensor of {numel} elements, over {size_text(MAX_NBYTES)}"
    return None


def _a(value: Any) -> str:
    names = {type(None): "null", float: "a float", str: "a string", dict: "an object"}
    return names.get(type(value), type(value).__name__)


def check_input_dims(path: Path, args: Mapping[int, Any], names: list[str], codes: Any) -> None:
    """Refuse a kept event (row -> args) whose `Input Dims` is no list of shapes.

    `names[codes[row]]` names the event in the message. Nesting is checked without
    recursion past MAX_DIMS_DEPTH, so a list nested 600 deep costs nothing.
    """
    for row, event_args in args.items():
        if not isinstance(event_args, dict) or "Input Dims" not in event_args:
            continue
        dims = event_args["Input Dims"]
        problem = "is not a list" if not isinstance(dims, list) else None
        for argument in dims if problem is None else ():
            problem = _shape_error(argument, 2) if isinstance(argument, list) else None
            if not isinstance(argument, list):
                problem = f"holds {_a(argument)} where a shape belongs"
            if problem:
                break
        if problem:
            name = names[int(codes[row])] if 0 <= row < len(codes) else "?"
            raise InputError(path, f"'Input Dims' of a {name[:80]} event {problem}")
    check_message_sizes(path, args, names, codes)


MESSAGE_SIZES = ("In msg nelems", "Out msg nelems")
"""A collective's element counts (the record_param_comms args its bytes come from)."""


def check_message_sizes(path: Path, args: Mapping[int, Any], names: list[str], codes: Any) -> None:
    """Refuse a kept event whose element count (an integer or a float) is negative or
    describes a message over `MAX_NBYTES` (a size no real transfer has: past int64 it
    cannot even be held)."""
    for row, event_args in args.items():
        if not isinstance(event_args, dict):
            continue
        for key in MESSAGE_SIZES:
            value = event_args.get(key)
            if (
                isinstance(value, int | float)
                and not isinstance(value, bool)
                and not 0 <= value <= MAX_NBYTES // 8
            ):
                name = names[int(codes[row])] if 0 <= row < len(codes) else "?"
                problem = f"'{key}' of a {name[:80]} event is {number_text(value)}, out of range"
                raise InputError(path, f"{problem} [0, {MAX_NBYTES // 8}]")


def check_world(path: Path, rank: Any, world_size: Any) -> None:
    """Refuse a `distributedInfo` whose world_size is not positive or misses the rank."""
    if world_size is None:
        return
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size <= 0:
        raise InputError(path, f"distributedInfo.world_size is {world_size!r}; must be >= 1")
    if isinstance(rank, int) and not 0 <= rank < world_size:
        raise InputError(path, f"distributedInfo.rank {rank} is not below world_size {world_size}")


def _signature(meta: Mapping[str, Any], graph: OpGraph) -> dict[str, Any]:
    """What every rank of one data-parallel job shares."""
    dist = meta.get("distributed") or {}
    # each rank lists the groups it belongs to: in a job of several groups per dimension
    # (2x2 data x tensor parallel) rank 0 is in groups "1" and "3", rank 1 in "1" and "4";
    # what they share is the groups' descriptions, sizes and backends, in any order
    groups = sorted(
        (
            {k: v for k, v in g.items() if k not in ("ranks", "pg_name")}
            if isinstance(g, dict)
            else g
            for g in (dist.get("pg_config") or [])
        ),
        key=repr,
    )
    # the kinds and counts, not the sizes: a rank of a 128-rank job (HTA's trace_filter)
    # all-reduces 105 and 108 MB where its peer all-reduces 78 and 105 MB in the same
    # steps (variable-size or sub-group all-reduces), while ResNet and Transformer DDP
    # ranks differ in their collectives (BatchNorm broadcasts, buckets)
    kinds = Counter(
        name.split("/", 1)[-1].split("#", 1)[0]
        for name, op in graph.ops.items()
        if op.kind == "collective"
    )
    return {
        "world_size": meta.get("world_size"),
        "backend": dist.get("backend"),
        "process groups": groups,
        "collectives": kinds,
    }


def _describe(key: str, value: Any) -> str:
    if key == "collectives":
        return ", ".join(f"{n} {kind}" for kind, n in sorted(value.items())) or "none"
    return repr(value)


def check_same_job(graphs: Mapping[str, OpGraph], ranks: Mapping[str, Mapping[str, Any]]) -> None:
    """Refuse ranks of different jobs, naming the first difference and both files.

    `ranks` is the Job meta per rank (`source`, `world_size`, `distributed`).
    """
    names: Iterable[str] = list(graphs)
    first = next(iter(names), None)
    if first is None:
        return
    reference = _signature(ranks[first], graphs[first])
    for name in names:
        signature = _signature(ranks[name], graphs[name])
        for key, value in signature.items():
            if value != reference[key]:
                raise InputError(
                    ranks[name].get("source"),
                    f"not from the same job as {ranks[first].get('source')}: {key} differ "
                    f"({name}: {_describe(key, value)}; {first}: {_describe(key, reference[key])})",
                )

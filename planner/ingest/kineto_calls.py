"""The c10d ops of one rank's Kineto events: what each collective does, its bytes and its
process group, whatever the backend runs it with.

A ``c10d::`` op (``c10d::_reduce_scatter_base_``, ``c10d::allgather_into_tensor_coalesced``,
``c10d::allreduce_``, ...) is the call the training code made; the backend's record
(``gloo:all_reduce``, ``nccl:_reduce_scatter_base``) or kernel is how it ran, and times
it. The two can disagree: gloo has no reduce-scatter of a flat tensor and runs
``_reduce_scatter_base`` as an all-reduce (FSDP's gradient reduce-scatters read as
``gloo:all_reduce``), so the kind is the call's (`kineto_comms` joins the two).

A collective's bytes (`call_bytes`) are its largest buffer: the all-reduced,
broadcast or sent tensor; an all-gather's gathered output; a reduce-scatter's
unsharded input (NCCL-tests' "size"). A list form that records only its per-rank side
(``allgather_`` of a list, ``reduce_scatter_``) counts that side times the group's size.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any

import numpy as np

from planner.ingest.kineto_events import CPU_OP_CATS, RankEvents
from planner.ingest.kineto_steps import by_lane

#: Element sizes of the dtype names Kineto writes (`Input type`, record_param_comms `dtype`).
DTYPE_BYTES: dict[str, int] = {
    "float": 4, "float32": 4, "int": 4, "int32": 4, "unsigned int": 4,
    "double": 8, "float64": 8, "long": 8, "long int": 8, "int64": 8, "long long": 8,
    "complexfloat": 8, "c10::complex<float>": 8, "c10::complex<double>": 16,
    "half": 2, "c10::half": 2, "bfloat16": 2, "c10::bfloat16": 2, "short": 2, "short int": 2,
    "signed char": 1, "unsigned char": 1, "char": 1, "byte": 1, "bool": 1, "int8": 1,
    "uint8": 1, "c10::float8_e4m3fn": 1, "c10::float8_e5m2": 1,
}  # fmt: skip
_KIND = {
    "allreduce": "all_reduce", "alltoall": "all_to_all", "alltoallv": "all_to_all",
    "allgather": "all_gather", "reducescatter": "reduce_scatter", "broadcast": "broadcast",
    "barrier": "barrier", "send": "send", "recv": "recv", "sendrecv": "send_recv",
    "reduce": "reduce", "gather": "gather", "scatter": "scatter",
}  # fmt: skip
KINDS = frozenset(_KIND.values())
"""The collective kinds, as `collective_kind` names them."""
_KIND_SUFFIXES = ("coalesced", "intotensor", "tensor", "base", "single")
GATHERING = frozenset({"all_gather", "reduce_scatter", "gather", "scatter"})
"""Kinds whose output and input differ in size by the group's (FSDP/ZeRO): their size is
the larger."""
SHARDING = frozenset({"reduce_scatter"})
"""The kinds of a job that shards its gradients (FSDP, ZeRO-2/3): it has no DDP buckets.
(An all-gather alone does not tell: DDP jobs gather embeddings and metrics.)"""
IMPLEMENTS: dict[str, tuple[str, ...]] = {"all_reduce": ("all_reduce", "reduce_scatter")}
"""A backend record's kind -> the kinds of call it runs: gloo runs ``_reduce_scatter_base``
and ``reduce_scatter_tensor_coalesced`` as all-reduces; every other kind runs its own."""


def collective_kind(raw: str) -> str:
    """Normalised collective kind (``all_reduce``, ``all_gather``, ...) of a backend name:
    ``_allgather_base``, ``all_gather_into_tensor_coalesced`` -> ``all_gather``."""
    key = raw.lower().replace("_", "")
    changed = True
    while changed and key not in _KIND:
        changed = False
        for suffix in _KIND_SUFFIXES:
            if key.endswith(suffix) and len(key) > len(suffix):
                key, changed = key[: -len(suffix)], True
    return _KIND.get(key, raw.lower().strip("_"))


def numel(shape: Any, depth: int = 0) -> int:
    """Elements of a shape, or of a TensorList of shapes; 0 for anything odd."""
    if not isinstance(shape, list) or not shape or depth > 4:
        return 0
    if all(isinstance(x, list) for x in shape):
        return sum(numel(s, depth + 1) for s in shape)
    if not all(isinstance(x, int) and 0 <= x < 1 << 40 for x in shape):
        return 0
    total = int(np.prod(shape, dtype=np.float64))
    return total if total < 1 << 62 else 0


def tensor_elems(args: dict[str, Any]) -> list[tuple[int, int]]:
    """(elements, bytes per element: 0 where the trace names no dtype) of each tensor
    argument of an op's args (a TensorList summed), the ones of no elements left out."""
    dims, types = args.get("Input Dims"), args.get("Input type")
    if not isinstance(dims, list):
        return []
    types = types if isinstance(types, list) else []
    out = []
    for i, shape in enumerate(dims):
        n = numel(shape)
        if n:
            out.append((n, DTYPE_BYTES.get(str(types[i]).lower() if i < len(types) else "", 0)))
    return out


def record_elems(args: dict[str, Any]) -> int:
    """Elements of a backend record (``In msg nelems``, else its first input's)."""
    if "In msg nelems" in args:
        value = args["In msg nelems"]
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
    dims = args.get("Input Dims")
    return numel(dims[0]) if isinstance(dims, list) and dims else 0


def call_bytes(args: dict[str, Any], kind: str, group_size: int, element: int = 4) -> int:
    """The collective's bytes from its c10d op's args (the module's docstring says which
    buffer); `element`: the bytes of an element of a tensor list, whose dtype the
    trace does not name (the backend record's)."""
    sizes = [n * (size or element) for n, size in tensor_elems(args)]
    if not sizes or kind == "barrier":  # a barrier's one-byte tensor carries nothing
        return 0
    if kind in GATHERING:
        if len(sizes) == 1 and group_size > 1:  # a list form: only the per-rank side
            return sizes[0] * group_size
        return max(sizes)
    return sizes[0]


@dataclass
class Calls:
    """The c10d ops of a rank by start: their kind and their tensors' elements; the
    per-kind queues a worker thread's backend records take them from (`queued_call`)."""

    rows: np.ndarray
    kind: list[str]
    elems: list[tuple[int, ...]]
    by_kind: dict[str, list[int]]  # kind -> indexes into rows, by start
    taken: np.ndarray
    next: dict[str, int]
    by_lane: dict[int, tuple[np.ndarray, np.ndarray]]  # lane -> (starts, indexes)

    WINDOW = 64
    """How far past the oldest untaken call of a kind a record's call is looked for."""


def find_calls(ev: RankEvents) -> Calls:
    """Every ``c10d::`` CPU op of `ev`, by start."""
    c10d = ev.name_flags(lambda n: n.startswith("c10d::")) & ev.cat_flags(CPU_OP_CATS)
    rows = np.flatnonzero(c10d)
    rows = rows[np.argsort(ev.ts[rows], kind="stable")]
    kinds, elems = [], []
    by_kind: dict[str, list[int]] = {}
    for i, r in enumerate(rows.tolist()):
        kinds.append(call_kind(ev.names[ev.name_code[r]]))
        elems.append(tuple(n for n, _ in tensor_elems(ev.args.get(r, {}))))
        by_kind.setdefault(kinds[-1], []).append(i)
    lanes = by_lane(np.arange(len(rows)), ev.lane[rows], None, key=ev.ts[rows])
    return Calls(rows, kinds, elems, by_kind, np.zeros(len(rows), bool), {}, lanes)


def call_kind(name: str) -> str:
    """The kind of a c10d op by its name: ``c10d::_reduce_scatter_base_`` ->
    ``reduce_scatter``."""
    return collective_kind(name.split("::", 1)[1].rstrip("_"))


def enclosing_call(ev: RankEvents, calls: Calls, row: int) -> int:
    """Index of the innermost c10d op around `row` on its thread, -1 without one."""
    starts, index = calls.by_lane.get(int(ev.lane[row]), (None, None))
    if starts is None:
        return -1
    j = int(np.searchsorted(starts, ev.ts[row], side="right")) - 1
    while j >= 0:
        i = int(index[j])
        if ev.end[calls.rows[i]] >= ev.end[row]:
            return i
        if ev.ts[row] - starts[j] > 10**9:  # give up past 1 s of unrelated ops
            break
        j -= 1
    return -1


def queued_call(ev: RankEvents, calls: Calls, row: int, kind: str, elems: int) -> int:
    """Index of the c10d op a worker thread's backend record `row` (of `kind`, `elems`
    elements) runs: the earliest untaken one issued before it, of a kind the record
    runs (`IMPLEMENTS`), one of whose tensors has its size, else the oldest of its own
    kind (else of the other kinds it runs); -1 without one. gloo runs queued
    collectives on two threads, so a later one can start first: first in, first out by
    kind alone would swap them. Each call is taken once."""
    pick, fallback = -1, -1
    for want in IMPLEMENTS.get(kind, (kind,)):
        queue = calls.by_kind.get(want, [])
        first = calls.next.get(want, 0)
        while first < len(queue) and calls.taken[queue[first]]:
            first += 1
        calls.next[want] = first
        for i in queue[first : first + calls.WINDOW]:
            if ev.ts[calls.rows[i]] > ev.ts[row]:
                break
            if calls.taken[i]:
                continue
            if fallback < 0:
                fallback = i
            if elems and elems in calls.elems[i]:
                if pick < 0 or ev.ts[calls.rows[i]] < ev.ts[calls.rows[pick]]:
                    pick = i
                break
    chosen = pick if pick >= 0 else fallback
    if chosen >= 0:
        calls.taken[chosen] = True
    return chosen


# ----------------------------------------------------------------------------- groups


MAX_GROUP = 1 << 20
"""The most ranks a process group is taken to have (a larger size or list is no group)."""


def group_info(ev: RankEvents, name: str, args: list[dict[str, Any]]) -> dict[str, Any]:
    """The process group `name` as the trace describes it: ``desc``, ``ranks``, ``size``
    and ``backend`` from ``distributedInfo.pg_config``, else from a comm record's args
    (``Process Group Description`` / ``Ranks``, ``Group size``); the default group
    (``0``) of a trace without either is the world. Keys the trace does not give are
    left out."""
    out: dict[str, Any] = {"name": name}
    config = ev.distributed.get("pg_config")
    for pg in config if isinstance(config, list) else []:
        if isinstance(pg, dict) and str(pg.get("pg_name")) == name:
            _put(out, "desc", pg.get("pg_desc"))
            _put(out, "ranks", _ranks(pg.get("ranks")))
            _put(out, "size", pg.get("pg_size"))
            _put(out, "backend", pg.get("backend_config"))
            break
    for a in args:
        _put(out, "desc", a.get("Process Group Description"))
        _put(out, "ranks", _ranks(a.get("Process Group Ranks")))
        _put(out, "size", a.get("Group size"))
    if name in ("0", "default_pg", "") and ev.world_size:
        _put(out, "size", int(ev.world_size))
    if "backend" not in out and isinstance(ev.distributed.get("backend"), str):
        out["backend"] = ev.distributed["backend"]
    if "ranks" in out and "size" not in out:
        out["size"] = len(out["ranks"])
    return out


def _put(out: dict[str, Any], key: str, value: Any) -> None:
    """`out[key] = value` unless already set or the value is missing or odd."""
    if key in out or value is None or value == "":
        return
    if key == "size" and not (
        isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_GROUP
    ):
        return
    if key in ("desc", "backend"):
        value = str(value)[:200]
    out[key] = value


def _ranks(value: Any) -> list[int] | None:
    """A group's ranks: a list of ints, or the text of one (``"[0, 1, 2]"``); None for
    anything else or more than `MAX_GROUP` of them."""
    if isinstance(value, str) and len(value) < 1 << 20:
        try:
            value = ast.literal_eval(value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return None
    if (
        isinstance(value, list | tuple)
        and len(value) <= MAX_GROUP
        and all(isinstance(x, int) and not isinstance(x, bool) for x in value)
    ):
        return [int(x) for x in value]
    return None

"""Collectives of one rank's Kineto events: which events are communication, their
kind, size, process group, launching op and time.

Three sources, joined per collective:

- backend records: ``nccl:*`` / ``gloo:*`` / ``rccl:*`` ... ``user_annotation`` ranges
  (on the CPU: the enqueue for NCCL, transfer + reduce on gloo's worker threads);
- their GPU side: the ``gpu_user_annotation`` span with the record's ``External id``
  (NCCL/RCCL), else the communication kernels launched inside the record;
- communication kernels with no record around their launch: every NCCL/RCCL
  generation (``ncclKernel_<Op>_...``, ``ncclDevKernel_<Op>_...``,
  ``ncclDevKernel_Generic``, ``ncclDevKernel_SendRecv``) and the non-NCCL patterns of
  `BUILTIN_PATTERNS` (symm_mem / multimem, vLLM custom all-reduce, DeepEP,
  peer-to-peer memcpy), which a user extends with a pattern file (`load_patterns`).

A collective's time on a GPU trace is its GPU span, never the CPU enqueue.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from planner.errors import InputError
from planner.ingest.kineto_calls import (
    DTYPE_BYTES,
    GATHERING,
    KINDS,
    Calls,
    call_bytes,
    call_kind,
    collective_kind,
    enclosing_call,
    find_calls,
    group_info,
    numel,
    queued_call,
    record_elems,
)
from planner.ingest.kineto_events import CPU_OP_CATS, RankEvents, id_problem
from planner.ingest.kineto_steps import by_lane
from planner.model.arrays import unique

BACKEND = re.compile(r"^(nccl|gloo|rccl|hccl|mpi|ucc|xccl|mccl):(\w+)$", re.IGNORECASE)

# ----------------------------------------------------------------------------- patterns


@dataclass(frozen=True)
class CommPattern:
    """One row of the pattern table: GPU events whose name matches `match` are
    communication of `kind` (empty: from the regex group ``kind``, else the backend
    record around the launch); `size_op`, a regex on CPU op names, says which
    enclosing CPU op's ``Input Dims`` give the size."""

    name: str
    match: re.Pattern[str]
    kind: str = ""
    size_op: re.Pattern[str] | None = None


def _pattern(name: str, match: str, kind: str = "", size_op: str | None = None) -> CommPattern:
    return CommPattern(
        name, re.compile(match, re.IGNORECASE), kind, re.compile(size_op) if size_op else None
    )


BUILTIN_PATTERNS: tuple[CommPattern, ...] = (
    _pattern("NCCL/RCCL kernels", r"^(?:nccl|rccl)\w*?(?:Kernel|DevKernel)_(?P<kind>[A-Za-z]+)"),
    _pattern("symm_mem multimem", r"multimem_all_reduce|multimem_one_shot", "all_reduce",
             r"^symm_mem::|^vllm::all_reduce"),
    _pattern("symm_mem one/two-shot", r"(?:one|two)_shot_all_reduce", "all_reduce",
             r"^symm_mem::|^vllm::all_reduce"),
    _pattern("vLLM custom all-reduce", r"cross_device_reduce_\dstage", "all_reduce",
             r"^_C_custom_ar::|^vllm::all_reduce|custom_ar"),
    _pattern("DeepEP", r"deep_ep::\w+::(?P<kind>dispatch|combine)", "", r"deep_ep"),
    _pattern("peer-to-peer memcpy", r"^Memcpy PtoP", "p2p_copy"),
)  # fmt: skip
PATTERNS_ENV = "PLANNER_COMM_PATTERNS"
"""Environment variable naming a pattern file, read when no file is given."""


def load_patterns(path: Path | str | None = None) -> tuple[CommPattern, ...]:
    """The built-in table plus the rows of a pattern file (JSON: a list of
    ``{"name", "match", "kind", "size_op"}``; `path`, else ``$PLANNER_COMM_PATTERNS``)."""
    path = path or os.environ.get(PATTERNS_ENV)
    if not path:
        return BUILTIN_PATTERNS
    path = Path(path)
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InputError(path, f"cannot read the pattern file ({exc})") from None
    if not isinstance(rows, list):
        raise InputError(path, "a pattern file is a JSON list of {name, match, kind, size_op}")
    extra = []
    for i, row in enumerate(rows):
        try:
            if not isinstance(row, dict) or not isinstance(row.get("match"), str):
                raise ValueError("needs a 'match' regex")
            extra.append(
                _pattern(str(row.get("name", f"pattern {i}")), row["match"],
                         str(row.get("kind") or ""), row.get("size_op"))
            )  # fmt: skip
        except (re.error, ValueError, TypeError) as exc:
            raise InputError(path, f"pattern {i}: {exc}") from None
    return (*extra, *BUILTIN_PATTERNS)


def keep_args_pattern(patterns: tuple[CommPattern, ...]) -> re.Pattern[str] | None:
    """CPU op names whose args the reader must keep for the patterns' sizes."""
    sizes = [p.size_op.pattern for p in patterns if p.size_op is not None]
    return re.compile("|".join(f"(?:{s})" for s in sizes)) if sizes else None


def kernel_kinds(
    ev: RankEvents, is_gpu: np.ndarray, patterns: tuple[CommPattern, ...]
) -> tuple[np.ndarray, list[str]]:
    """Per distinct name: the index of the first matching pattern and the kind it gives
    (``""`` for NCCL's Generic kernel: the kind comes from the backend record)."""
    hit = np.full(len(ev.names), -1, dtype=np.int64)
    kinds = [""] * len(ev.names)
    gpu_names = np.zeros(len(ev.names), dtype=bool)
    gpu_names[unique(ev.name_code[is_gpu])] = True
    for code in np.flatnonzero(gpu_names).tolist():
        name = ev.names[code]
        for i, p in enumerate(patterns):
            found = p.match.search(name)
            if found:
                hit[code] = i
                raw = p.kind or (found.groupdict().get("kind") or "")
                kinds[code] = "" if raw.lower() == "generic" else collective_kind(raw)
                break
    return hit, kinds


# ----------------------------------------------------------------------------- sizes


def nbytes_of(args: dict[str, Any], kind: str = "") -> int:
    """Bytes of a comm record: `In msg nelems` x dtype (the larger of in and out for
    gathering kinds), else `Input Dims` x `Input type` of the first input."""
    if "In msg nelems" in args:
        nelems = _int(args["In msg nelems"])
        if kind in GATHERING:
            nelems = max(nelems, _int(args.get("Out msg nelems")))
        return nelems * DTYPE_BYTES.get(str(args.get("dtype", "float")).lower(), 4)
    dims = args.get("Input Dims")
    types = args.get("Input type") or []
    if not isinstance(dims, list) or not dims:
        return 0
    dtype = str(types[0]).lower() if isinstance(types, list) and types else "float"
    return numel(dims[0]) * DTYPE_BYTES.get(dtype, 4)


def _int(value: Any) -> int:
    try:
        return max(0, int(value))
    except (TypeError, ValueError, OverflowError):
        return 0


# ----------------------------------------------------------------------------- collectives


@dataclass
class Collectives:
    """The collectives of one rank, one entry per occurrence, in discovery order."""

    row: list[int]  # the event that names it (kernel, GPU annotation or backend record)
    start: list[int]  # ns: its GPU span on GPU traces, else the record
    end: list[int]
    kind: list[str]
    pg: list[str]
    nbytes: list[int]
    launcher: list[int]  # row of the CPU op that launched it, -1 unknown
    anchor: list[int]  # row whose time places it in a step (the record or the launch)
    comm_rows: np.ndarray  # every event that is communication (never compute)
    call: list[int] = field(default_factory=list)  # row of its c10d op, -1 without one
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)  # `kineto_calls.group_info`
    named: list[bool] = field(default_factory=list)  # its args name its group

    def __len__(self) -> int:
        return len(self.row)


def find_collectives(
    ev: RankEvents,
    is_gpu: np.ndarray,
    launch_row: np.ndarray,
    enclosing: np.ndarray,
    step_of: np.ndarray,
    patterns: tuple[CommPattern, ...],
) -> Collectives:
    """Every collective of the rank's steps, joined to its kernels and GPU span."""
    hit, kernel_kind = kernel_kinds(ev, is_gpu, patterns)
    is_kernel = is_gpu & (hit[ev.name_code] >= 0)
    backend = ev.name_flags(BACKEND.match) & ev.cat_flags({"user_annotation"})
    gpu_ann = ev.name_flags(BACKEND.match) & ev.cat_flags({"gpu_user_annotation"})
    out = Collectives([], [], [], [], [], [], [], [], np.flatnonzero(is_kernel | gpu_ann))
    taken = np.zeros(len(ev), dtype=bool)
    calls = find_calls(ev)
    _from_records(ev, out, backend & (step_of >= 0), is_kernel, gpu_ann, launch_row,
                  enclosing, taken, kernel_kind, calls)  # fmt: skip
    _from_kernels(ev, out, is_kernel & ~taken & (step_of >= 0), launch_row, enclosing,
                  hit, kernel_kind, patterns, calls)  # fmt: skip
    return out


def _external_ids(ev: RankEvents, rows: np.ndarray) -> dict[int, int]:
    """External id -> row, for the GPU-side annotations `rows`."""
    out: dict[int, int] = {}
    for r in rows.tolist():
        ext = _external_id(ev, r)
        if ext is not None:
            out.setdefault(ext, r)
    return out


def _external_id(ev: RankEvents, row: int) -> int | None:
    """The `External id` of a backend record or its GPU annotation (it joins the two);
    None without one, or for a float or a string (no id). InputError when it is an
    integer out of range (`kineto_events.id_problem`)."""
    ext = ev.args.get(row, {}).get("External id")
    problem = id_problem("External id", ext)
    if problem is not None:
        name = ev.names[ev.name_code[row]]
        raise InputError(ev.path, f"malformed {name[:80]} event: {problem}")
    return ext if isinstance(ext, int) and not isinstance(ext, bool) else None


def _from_records(
    ev: RankEvents,
    out: Collectives,
    records: np.ndarray,
    is_kernel: np.ndarray,
    gpu_ann: np.ndarray,
    launch_row: np.ndarray,
    enclosing: np.ndarray,
    taken: np.ndarray,
    kernel_kind: list[str],
    calls: Calls,
) -> None:
    """One collective per backend record, timed by its GPU annotation or kernels; its
    kind, bytes and launcher from the c10d op it runs (`kineto_calls`)."""
    names, code, ts, end, lane = ev.names, ev.name_code, ev.ts, ev.end, ev.lane
    kernels = np.flatnonzero(is_kernel & (launch_row >= 0))
    kernel_by_launch = by_lane(
        kernels, lane[launch_row[kernels]], None, key=ts[launch_row[kernels]]
    )
    gpu_span = _external_ids(ev, np.flatnonzero(gpu_ann))
    rpc_by_lane = by_lane(np.flatnonzero(ev.name_flags("record_param_comms".__eq__)), lane, ts)
    for a in np.flatnonzero(records)[np.argsort(ts[np.flatnonzero(records)], kind="stable")]:
        a = int(a)
        a_args = ev.args.get(a, {})
        kind = collective_kind(BACKEND.match(names[code[a]]).group(2))
        nested = enclosing[a] != a
        rpc = _enclosing_rpc(ev, rpc_by_lane, a) if nested else {}
        mine = _launched_in(kernel_by_launch.get(int(lane[a])), ts[a], end[a], taken)
        k_args = ev.args.get(mine[0], {}) if mine else {}
        if not kind and mine:
            kind = kernel_kind[code[mine[0]]]
        elems = record_elems(a_args) or record_elems(rpc)
        call = enclosing_call(ev, calls, a) if nested else queued_call(ev, calls, a, kind, elems)
        ext = _external_id(ev, a)
        g = -1 if ext is None else gpu_span.get(ext, -1)
        if g >= 0:
            row, start, stop = g, int(ts[g]), int(end[g])
        elif mine:
            row, start, stop = mine[0], int(ts[mine].min()), int(end[mine].max())
        else:
            row, start, stop = a, int(ts[a]), int(end[a])
        taken[mine] = True
        call_row = int(calls.rows[call]) if call >= 0 else -1
        if nested:
            launcher = int(enclosing[a])
        else:
            launcher = -1 if call < 0 else int(enclosing[call_row] if enclosing[call_row] >= 0
                                               else call_row)  # fmt: skip
        _add(ev, out, (row, start, stop, a, launcher), kind, call_row, (a_args, rpc, k_args))


def _add(
    ev: RankEvents,
    out: Collectives,
    where: tuple[int, int, int, int, int],
    kind: str,
    call_row: int,
    args: tuple[dict[str, Any], ...],
) -> None:
    """Append one collective: `where` (row, start, stop, anchor, launcher); its kind is
    its c10d op's (`call_row`, -1 without one) where that names a collective, else
    `kind`; its group and bytes from the `args` of its record, record_param_comms and
    kernel, and its c10d op's (`kineto_calls.call_bytes`)."""
    call_args = ev.args.get(call_row, {}) if call_row >= 0 else {}
    if call_row >= 0:
        named = call_kind(ev.names[ev.name_code[call_row]])
        kind = named if named in KINDS else kind
    named = next((a["Process Group Name"] for a in args if a.get("Process Group Name")), None)
    pg = str(named if named is not None else "0")
    out.named.append(named is not None)
    if pg not in out.groups:
        out.groups[pg] = group_info(ev, pg, list(args))
    sizes = [nbytes_of(a, kind) for a in args]
    if call_args:
        element = next((_element(a) for a in args if _element(a)), 4)
        sizes.append(call_bytes(call_args, kind, out.groups[pg].get("size", 1), element))
    # gathering kinds: the larger of output and input (the record may name the shard only)
    out.nbytes.append(max(sizes) if kind in GATHERING else next((n for n in sizes if n), 0))
    row, start, stop, anchor, launcher = where
    out.row.append(row)
    out.start.append(start)
    out.end.append(stop)
    out.kind.append(kind)
    out.pg.append(pg)
    out.launcher.append(launcher)
    out.anchor.append(anchor)
    out.call.append(call_row)


def _element(args: dict[str, Any]) -> int:
    """Bytes of an element of a comm record (its ``dtype`` or first input type), 0 unknown."""
    if "dtype" in args:
        return DTYPE_BYTES.get(str(args["dtype"]).lower(), 0)
    types = args.get("Input type")
    return DTYPE_BYTES.get(str(types[0]).lower(), 0) if isinstance(types, list) and types else 0


def _launched_in(
    group: tuple[np.ndarray, np.ndarray] | None, start: int, stop: int, taken: np.ndarray
) -> list[int]:
    """The comm kernels (not yet taken) whose launch lies in [start, stop]."""
    if group is None:
        return []
    starts, rows = group
    a = int(np.searchsorted(starts, start, side="left"))
    b = int(np.searchsorted(starts, stop, side="right"))
    return [int(r) for r in rows[a:b].tolist() if not taken[r]]


def _enclosing_rpc(ev: RankEvents, rpc_by_lane: dict, row: int) -> dict[str, Any]:
    """Args of the innermost record_param_comms around `row` on its thread."""
    starts, rows = rpc_by_lane.get(int(ev.lane[row]), (None, None))
    if starts is None:
        return {}
    j = int(np.searchsorted(starts, ev.ts[row], side="right")) - 1
    while j >= 0:
        r = int(rows[j])
        if ev.end[r] >= ev.end[row]:
            return ev.args.get(r, {})
        j -= 1
        if ev.ts[row] - starts[j + 1] > 10**9:  # give up past 1 s of unrelated records
            break
    return {}


def _from_kernels(
    ev: RankEvents,
    out: Collectives,
    kernels: np.ndarray,
    launch_row: np.ndarray,
    enclosing: np.ndarray,
    hit: np.ndarray,
    kernel_kind: list[str],
    patterns: tuple[CommPattern, ...],
    calls: Calls,
) -> None:
    """One collective per comm kernel that no backend record claimed; its kind and
    bytes from the c10d op around its launch where there is one."""
    size_ops = _size_ops(ev, patterns)
    for k in np.flatnonzero(kernels).tolist():
        k_args = ev.args.get(k, {})
        code = ev.name_code[k]
        kind = kernel_kind[code] or "collective"
        kind = collective_kind(str(k_args.get("Collective name") or kind))
        lr = int(launch_row[k])
        size_args = _size_op_args(ev, size_ops.get(int(hit[code])), lr) if lr >= 0 else {}
        call = enclosing_call(ev, calls, lr) if lr >= 0 else -1
        launcher = int(enclosing[lr]) if lr >= 0 and enclosing[lr] >= 0 else -1
        where = (k, int(ev.ts[k]), int(ev.end[k]), lr if lr >= 0 else k, launcher)
        _add(ev, out, where, kind, int(calls.rows[call]) if call >= 0 else -1, (k_args, size_args))


def _size_ops(ev: RankEvents, patterns: tuple[CommPattern, ...]) -> dict[int, dict]:
    """Pattern index -> the rows of CPU ops its `size_op` names, grouped by lane."""
    out: dict[int, dict] = {}
    cpu = ev.cat_flags(CPU_OP_CATS)
    for i, p in enumerate(patterns):
        if p.size_op is not None:
            rows = np.flatnonzero(ev.name_flags(p.size_op.search) & cpu)
            out[i] = by_lane(rows, ev.lane, ev.ts)
    return out


def _size_op_args(ev: RankEvents, group: dict | None, launch: int) -> dict[str, Any]:
    """Args of the innermost size op around the launch `launch` on its thread."""
    if not group:
        return {}
    starts, rows = group.get(int(ev.lane[launch]), (None, None))
    if starts is None:
        return {}
    j = int(np.searchsorted(starts, ev.ts[launch], side="right")) - 1
    while j >= 0 and ev.end[rows[j]] < ev.end[launch]:
        j -= 1
    return ev.args.get(int(rows[j]), {}) if j >= 0 else {}

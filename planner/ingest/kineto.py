"""PyTorch profiler (Kineto) chrome traces of data-parallel jobs: one `Job` for all ranks.

What becomes an op (per rank):

- CPU: the *outermost* `cpu_op` / `cuda_runtime` / `cuda_driver` event on each thread
  (nested events are the op's own internals; `user_annotation` ranges give steps and
  phases, `python_function` frames are ignored). Resource: the thread lane (``main``
  is the thread holding ``ProfilerStep#N``; others ``<thread name>.<i>``).
- GPU: kernels, memcpy and memset on ``gpu<device>/stream<stream>``.
- Collectives and p2p (kind ``collective``): one per backend record (``nccl:*``,
  ``gloo:*``, ``rccl:*`` ...); its time is the communication kernel it launched when
  the trace has one (``ncclKernel_*``, joined through the launch's ``correlation``),
  otherwise the backend record itself (gloo's worker-thread record spans transfer +
  reduce). Resource ``net`` for the default process group, ``net:<pg>`` for others.

Op identity: ``<lane>/<event name>#<k>`` with k the occurrence in the step on that
lane, and ``<net>/<collective kind>#<k>`` for collectives (k in launch order within the
process group, which NCCL and gloo require to match on every rank), so the same op has
the same name in every step and on every rank. All-reduces in the backward pass carry
``param = bucket<k>`` (DDP launches one per bucket, in bucket order).

Conservative DAG without an Execution Trace (all edges ``control``):
per-lane program order; launch -> kernel (correlation); launching CPU op ->
collective; every collective -> the first optimizer op of the step (or, without an
optimizer range, the first op on the launching thread that starts after the
collective ends). Edges come from one reference step; ops only seen in other steps
get their edges from the first step that has them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np
import pandas as pd

from planner.errors import InputError
from planner.graph import GraphError, Op, OpGraph, build_graph
from planner.ingest.files import read_bytes
from planner.trace import SPAN_COLUMNS, TIMING_COLUMNS, Job, Trace

try:  # orjson parses Kineto JSON ~2-3x faster with less peak memory than json
    import orjson as _json

    _JSONError: tuple[type[Exception], ...] = (_json.JSONDecodeError,)
except ImportError:  # pragma: no cover - orjson is a dependency; json is the fallback
    import json as _json  # type: ignore[no-redef]

    _JSONError = (ValueError,)

_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_BACKEND = re.compile(r"^(nccl|gloo|rccl|hccl|mpi|ucc|xccl|mccl):(\w+)$", re.IGNORECASE)
_COMM_KERNEL = re.compile(r"^(nccl|rccl)\w*?(?:Kernel|DevKernel)_(\w+?)_", re.IGNORECASE)
_THREAD_LABEL = re.compile(r"^thread \d+ \((.*)\)$")
CPU_OP_CATS = frozenset({"cpu_op", "operator", "cuda_runtime", "runtime", "cuda_driver"})
GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"})
LAUNCH_CATS = frozenset({"cuda_runtime", "runtime", "cuda_driver"})

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
    "allreduce": "all_reduce", "alltoall": "all_to_all", "alltoallbase": "all_to_all",
    "alltoallv": "all_to_all", "allgather": "all_gather", "allgatherbase": "all_gather",
    "allgatherintocoalesced": "all_gather", "reducescatter": "reduce_scatter",
    "reducescatterbase": "reduce_scatter", "broadcast": "broadcast", "barrier": "barrier",
    "send": "send", "recv": "recv", "sendrecv": "send_recv", "reduce": "reduce",
    "gather": "gather", "scatter": "scatter",
}  # fmt: skip


def collective_kind(raw: str) -> str:
    """Normalised collective kind (``all_reduce``, ``all_to_all``, ...) of a backend name."""
    key = raw.lower().replace("_", "")
    return _KIND.get(key, raw.lower())


# ----------------------------------------------------------------------------- sniffing


def is_kineto(head: bytes) -> bool:
    """True when the first bytes of (decompressed) content look like a Kineto trace."""
    text = head.lstrip()
    if b'"/job:' in head:  # a TensorFlow timeline
        return False
    if text.startswith(b"["):  # the old (2020) format: a bare event array
        return b'"ph"' in head and (b'"Operator"' in head or b"ProfilerStep#" in head)
    if not text.startswith(b"{") or b'"traceEvents"' not in head and b'"schemaVersion"' not in head:
        return False
    markers = (
        b'"schemaVersion"', b'"deviceProperties"', b'"distributedInfo"', b'"cpu_op"',
        b"ProfilerStep#", b'"displayTimeUnit"', b'"cuda_runtime"', b'"Operator"',
    )  # fmt: skip
    return any(m in head for m in markers)


def is_execution_trace(head: bytes) -> bool:
    """True when the first bytes look like an ExecutionTraceObserver JSON document."""
    text = head.lstrip()
    return (
        text.startswith(b"{")
        and b'"schema"' in head
        and b'"nodes"' in head
        and (b'"rf_id"' in head or b"execution_trace" in head or b"execution_graph" in head)
    )


def read_document(path: Path) -> Any:
    """Parse a `.json` / `.json.gz` file; InputError on unreadable, truncated or bad JSON."""
    raw = read_bytes(path)
    if not raw.strip():
        raise InputError(path, "file is empty")
    try:
        return _json.loads(raw)
    except _JSONError as exc:
        raise InputError(path, f"invalid JSON ({exc})") from None


# ----------------------------------------------------------------------------- one rank


@dataclass
class RankEvents:
    """The columnar events of one rank's trace (one row per complete 'X' event)."""

    path: Path
    rank: int | None
    world_size: int | None
    distributed: dict[str, Any]
    frame: pd.DataFrame  # name cat pid tid ts end corr rf lane
    args: dict[int, dict[str, Any]]  # row -> args, only for the rows that need them
    lane_names: dict[int, str]
    pids: frozenset[int] = frozenset()


def _ns(values: list[Any]) -> np.ndarray:
    """Microsecond timestamps (float or int) to int64 ns without amplifying float error."""
    arr = np.asarray(values, dtype=np.float64)
    whole = np.floor(arr)
    return whole.astype(np.int64) * 1000 + np.rint((arr - whole) * 1000).astype(np.int64)


def _lane_label(raw: str) -> str:
    found = _THREAD_LABEL.match(raw.strip())
    label = found.group(1) if found else raw.strip()
    return re.sub(r"\s+", "_", label) or "thread"


def read_rank(path: Path, document: Any | None = None) -> RankEvents:
    """Columnar events of one Kineto file (the JSON document is dropped afterwards)."""
    doc = read_document(path) if document is None else document
    if isinstance(doc, list):  # old format: the event array alone
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict):
        raise InputError(path, "not a Kineto trace: top level is not a JSON object")
    events = doc.get("traceEvents")
    if not isinstance(events, list):
        raise InputError(path, "not a Kineto trace: no traceEvents list")
    dist = doc.get("distributedInfo") if isinstance(doc.get("distributedInfo"), dict) else {}
    rank = dist.get("rank") if isinstance(dist.get("rank"), int) else None
    world = dist.get("world_size") if isinstance(dist.get("world_size"), int) else None
    meta_names: dict[tuple[Any, Any], str] = {}
    for e in events:
        if isinstance(e, dict) and e.get("ph") == "M" and e.get("name") == "thread_name":
            key = (e.get("pid"), e.get("tid"))
            if key not in meta_names:
                meta_names[key] = str((e.get("args") or {}).get("name", ""))
    try:
        xs = [e for e in events if e.get("ph") == "X" and "dur" in e and "ts" in e]
    except AttributeError:
        raise InputError(path, "traceEvents holds something that is not an event object") from None
    del events, doc
    if not xs:
        raise InputError(path, "Kineto trace has no complete ('X') events")
    try:
        names = [str(e.get("name", "")) for e in xs]
        cats = [str(e.get("cat", "")).lower() for e in xs]
        ts = _ns([e["ts"] for e in xs])
        dur = _ns([e["dur"] for e in xs])
        args = [e.get("args") or {} for e in xs]
        pids = [e.get("pid") for e in xs]
        tids = [e.get("tid") for e in xs]
    except (TypeError, ValueError) as exc:
        raise InputError(path, f"malformed event ({exc})") from None
    corr = np.array([a.get("correlation", -1) if isinstance(a, dict) else -1 for a in args])
    rf = np.array([a.get("Record function id", 0) if isinstance(a, dict) else 0 for a in args])
    frame = pd.DataFrame(
        {
            "name": pd.array(names, dtype=object),
            "cat": pd.Categorical(cats),
            "ts": ts,
            "end": ts + np.maximum(dur, 0),
            "corr": pd.to_numeric(pd.Series(corr), errors="coerce").fillna(-1).astype(np.int64),
            "rf": pd.to_numeric(pd.Series(rf), errors="coerce").fillna(0).astype(np.int64),
        }
    )
    lane_key = pd.Series([f"{p}|{t}" for p, t in zip(pids, tids, strict=False)], dtype=object)
    lane_codes, lane_uniques = pd.factorize(lane_key)
    frame["lane"] = lane_codes
    keep_args = frame["name"].str.contains(
        r"^(?:nccl|gloo|rccl|hccl|mpi|ucc|xccl|mccl|c10d)[:_]|record_param_comms|ProfilerStep",
        case=False,
        regex=True,
    ) | (frame["cat"].isin(list(GPU_CATS)) & frame["name"].str.contains("ccl", case=False))
    saved = {int(i): args[i] for i in np.flatnonzero(keep_args.to_numpy())}
    # GPU lane identity from device/stream args of the first event on the lane
    first_on_lane = frame.drop_duplicates("lane")
    lane_names: dict[int, str] = {}
    for row, lane in zip(first_on_lane.index, first_on_lane["lane"], strict=False):
        pid, tid = pids[row], tids[row]
        if frame.at[row, "cat"] in GPU_CATS:
            a = args[row] if isinstance(args[row], dict) else {}
            lane_names[int(lane)] = f"gpu{a.get('device', pid)}/stream{a.get('stream', tid)}"
        else:
            lane_names[int(lane)] = _lane_label(meta_names.get((pid, tid), f"thread {tid}"))
    del xs, args, lane_uniques
    pid_set = frozenset(p for p in set(pids) if isinstance(p, int))
    return RankEvents(path, rank, world, dict(dist), frame, saved, lane_names, pid_set)


# ----------------------------------------------------------------------------- per-rank model


@dataclass
class RankModel:
    """One rank, reduced to ops: rows of op occurrences plus the edge candidates."""

    rank: str
    ops: dict[str, Op]
    rows: pd.DataFrame  # step op start duration launch_start phase lane ...
    spans: list[tuple[int, int, int]]  # (step, start, end)
    edges_by_step: dict[int, list[tuple[str, str, str]]]
    rf_to_op: dict[int, str]  # Record function id (ET step) -> op name
    notes: list[str]
    meta: dict[str, Any]


def _phase_of(name: str) -> str | None:
    key = name.strip("# ").lower()
    if key == "forward" or key.startswith("forward_"):
        return "forward"
    if key == "backward" or key.startswith("backward_"):
        return "backward"
    if key.startswith("optimizer") and "zero_grad" not in key:
        return "optimizer"
    return None


def _nbytes(args: dict[str, Any]) -> int:
    """Bytes of a comm record: `In msg nelems` x dtype, else `Input Dims` x `Input type`."""
    if "In msg nelems" in args:
        try:
            nelems = int(args["In msg nelems"])
        except (TypeError, ValueError):
            nelems = 0
        return nelems * DTYPE_BYTES.get(str(args.get("dtype", "float")).lower(), 4)
    dims = args.get("Input Dims")
    types = args.get("Input type") or []
    if not isinstance(dims, list) or not dims:
        return 0
    first = dims[0]
    dtype = str(types[0]).lower() if types else "float"

    def numel(shape: Any) -> int:
        if isinstance(shape, list) and shape and all(isinstance(x, list) for x in shape):
            return sum(numel(s) for s in shape)  # a TensorList
        if isinstance(shape, list) and shape:
            return int(np.prod(shape))
        return 0

    return numel(first) * DTYPE_BYTES.get(dtype, 4)


def _outer_index(frame: pd.DataFrame, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For rows in `mask` (one lane each): (is outermost, row of the enclosing outermost)."""
    sub = frame.loc[mask, ["lane", "ts", "end"]]
    order = np.lexsort((-sub["end"].to_numpy(), sub["ts"].to_numpy(), sub["lane"].to_numpy()))
    rows = sub.index.to_numpy()[order]
    lane = sub["lane"].to_numpy()[order]
    ts = sub["ts"].to_numpy()[order]
    end = sub["end"].to_numpy()[order]
    new_lane = np.concatenate([[True], lane[1:] != lane[:-1]])
    big = np.int64(1) << np.int64(62)
    reach = np.empty_like(end)
    starts = np.flatnonzero(new_lane)
    bounds = np.append(starts, len(end))
    for a, b in zip(bounds[:-1], bounds[1:], strict=False):  # one vectorised cummax per lane
        reach[a:b] = np.maximum.accumulate(end[a:b])
    prev = np.concatenate([[-big], reach[:-1]])
    outer = new_lane | (ts >= prev)
    pos = np.where(outer, np.arange(len(rows)), -1)
    owner = rows[np.maximum.accumulate(pos)]
    is_outer = np.zeros(len(frame), dtype=bool)
    is_outer[rows] = outer
    enclosing = np.full(len(frame), -1, dtype=np.int64)
    enclosing[rows] = owner
    return is_outer, enclosing


def _by_lane(
    rows: np.ndarray, lanes: np.ndarray, ts: np.ndarray | None, key: np.ndarray | None = None
) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Rows grouped by lane, each sorted by `key` (default: the rows' ts): lane -> (keys, rows)."""
    out: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    if len(rows) == 0:
        return out
    keys = key if key is not None else ts[rows]
    lane_of = lanes if key is not None else lanes[rows]
    for lane in np.unique(lane_of):
        sel = lane_of == lane
        order = np.argsort(keys[sel], kind="stable")
        out[int(lane)] = (keys[sel][order], rows[sel][order])
    return out


def build_rank(ev: RankEvents, rank_name: str, et_step: int | None = None) -> RankModel:
    """Reduce one rank's events to op occurrences per step, collectives and DAG edges."""
    f = ev.frame
    path = ev.path
    names = f["name"].to_numpy()
    cats = f["cat"].astype(str).to_numpy()
    step_rows = np.flatnonzero(f["name"].str.match(r"^ProfilerStep#\d+$").to_numpy())
    if len(step_rows) == 0:
        raise InputError(path, "no ProfilerStep#N events: profile with torch.profiler.schedule "
                         "and call prof.step() each iteration")  # fmt: skip
    steps = (
        pd.DataFrame(
            {
                "step": [int(names[i].split("#")[1]) for i in step_rows],
                "start": f["ts"].to_numpy()[step_rows],
                "end": f["end"].to_numpy()[step_rows],
                "lane": f["lane"].to_numpy()[step_rows],
            }
        )
        .sort_values("start")
        .drop_duplicates("step")
        .reset_index(drop=True)
    )
    main_lane = int(steps["lane"].mode().iloc[0])
    notes: list[str] = []

    is_cpu = np.isin(cats, list(CPU_OP_CATS))
    is_gpu = np.isin(cats, list(GPU_CATS))
    backend = f["name"].str.match(_BACKEND.pattern, case=False).to_numpy() & (
        cats == "user_annotation"
    )
    comm_kernel = is_gpu & f["name"].str.match(_COMM_KERNEL.pattern, case=False).to_numpy()
    annotations = cats == "user_annotation"

    # outermost CPU ops per thread (comm backend records count as CPU events for nesting)
    cpu_like = (is_cpu | backend) & ~f["name"].str.startswith("ProfilerStep#").to_numpy()
    is_outer, enclosing = _outer_index(f, cpu_like)

    # lane naming: main thread "main"; others label.i in order of first event
    lane_names = dict(ev.lane_names)
    lane_names[main_lane] = "main"
    seen_labels: dict[str, int] = {}
    first_ts = f.groupby("lane")["ts"].min().sort_values()
    final_lane: dict[int, str] = {}
    for lane in first_ts.index:
        label = lane_names.get(int(lane), f"lane{lane}")
        if int(lane) == main_lane or label.startswith("gpu"):
            final_lane[int(lane)] = label
            continue
        i = seen_labels.get(label, 0)
        seen_labels[label] = i + 1
        final_lane[int(lane)] = f"{label}.{i}"

    # launch time / launching op of GPU events through the correlation id
    launch = f.loc[np.isin(cats, list(LAUNCH_CATS)) & (f["corr"].to_numpy() >= 0), ["corr"]]
    corr_to_row = pd.Series(launch.index.to_numpy(), index=launch["corr"].to_numpy())
    corr_to_row = corr_to_row[~corr_to_row.index.duplicated()]
    launch_row = np.full(len(f), -1, dtype=np.int64)
    gpu_idx = np.flatnonzero(is_gpu)
    if len(gpu_idx):
        mapped = corr_to_row.reindex(f["corr"].to_numpy()[gpu_idx]).to_numpy()
        ok = ~np.isnan(mapped.astype(np.float64))
        launch_row[gpu_idx[ok]] = mapped[ok].astype(np.int64)
    ts = f["ts"].to_numpy()
    end = f["end"].to_numpy()
    anchor = ts.copy()  # the time that places an event in a step/phase: launch time for GPU
    has_launch = launch_row >= 0
    anchor[has_launch] = ts[launch_row[has_launch]]

    # step of every event
    idx = np.searchsorted(steps["start"].to_numpy(), anchor, side="right") - 1
    valid = idx >= 0
    step_end = steps["end"].to_numpy()
    valid[valid] &= anchor[valid] < step_end[idx[valid]]
    step_of = np.where(valid, steps["step"].to_numpy()[np.maximum(idx, 0)], -1)

    # phases from record_function ranges (any CPU thread)
    phase_mask = annotations & np.array([_phase_of(n) is not None for n in names])
    pr = np.flatnonzero(phase_mask)
    phase_of = np.full(len(f), "unknown", dtype=object)
    if len(pr):
        order = pr[np.argsort(ts[pr], kind="stable")]
        p_start, p_end = ts[order], end[order]
        p_name = np.array([_phase_of(names[i]) for i in order], dtype=object)
        j = np.searchsorted(p_start, anchor, side="right") - 1
        inside = (j >= 0) & (anchor < p_end[np.maximum(j, 0)])
        phase_of[inside] = p_name[j[inside]]
    else:
        auto = f["name"].str.startswith("autograd::engine::evaluate_function").to_numpy()
        phase_of[auto] = "backward"
        notes.append(f"{rank_name}: no forward/backward/optimizer ranges; phases are guessed")

    # ------------------------------------------------------------------ collectives
    coll_rows: list[int] = []  # the event whose time is the transfer
    coll_info: list[dict[str, Any]] = []
    kernel_taken: set[int] = set()
    ann_rows = np.flatnonzero(backend & (step_of >= 0))
    # comm kernels launched inside a backend record, per launching lane
    kernel_rows = np.flatnonzero(comm_kernel)
    lane_arr = f["lane"].to_numpy()
    launched = kernel_rows[launch_row[kernel_rows] >= 0]
    kernel_by_launch = _by_lane(
        launched,
        lane_arr[launch_row[launched]] if len(launched) else launched,
        None,
        key=ts[launch_row[launched]] if len(launched) else None,
    )
    lane_arr = f["lane"].to_numpy()
    # record_param_comms per lane, for the process group and size
    rpc_rows = np.flatnonzero(names == "record_param_comms")
    c10d_rows = np.flatnonzero(f["name"].str.startswith("c10d::").to_numpy() & is_cpu)
    c10d_by_kind: dict[str, list[int]] = {}
    for r in c10d_rows[np.argsort(ts[c10d_rows], kind="stable")]:
        kind = collective_kind(names[r].split("::", 1)[1].rstrip("_"))
        c10d_by_kind.setdefault(kind, []).append(int(r))
    c10d_used: set[int] = set()

    rpc_by_lane = _by_lane(rpc_rows, lane_arr, ts)

    def enclosing_rpc(row: int) -> dict[str, Any]:
        """Args of the innermost record_param_comms around `row` on its thread."""
        starts, rows_ = rpc_by_lane.get(int(lane_arr[row]), (None, None))
        if starts is None:
            return {}
        j = int(np.searchsorted(starts, ts[row], side="right")) - 1
        while j >= 0:
            r = int(rows_[j])
            if end[r] >= end[row]:
                return ev.args.get(r, {})
            j -= 1
            if ts[row] - starts[j + 1] > 10**9:  # give up past 1 s of unrelated records
                break
        return {}

    for a in ann_rows[np.argsort(ts[ann_rows], kind="stable")]:
        a = int(a)
        a_args = ev.args.get(a, {})
        kind = collective_kind(_BACKEND.match(names[a]).group(2))
        rpc = enclosing_rpc(a) if enclosing[a] != a else {}
        kernel = -1
        kstarts, krows = kernel_by_launch.get(int(lane_arr[a]), (None, None))
        if kstarts is not None:
            j = int(np.searchsorted(kstarts, ts[a], side="left"))
            while j < len(krows) and kstarts[j] <= end[a]:
                if int(krows[j]) not in kernel_taken:
                    kernel = int(krows[j])
                    break
                j += 1
        k_args = ev.args.get(kernel, {}) if kernel >= 0 else {}
        nbytes = _nbytes(a_args) or _nbytes(rpc) or _nbytes(k_args)
        pg = str(rpc.get("Process Group Name") or k_args.get("Process Group Name") or "0")
        if enclosing[a] != a:  # launched inside a c10d/cpu op on this thread
            launcher = int(enclosing[a])
        else:  # gloo worker-thread record: the c10d op that queued it, FIFO per kind
            launcher = -1
            for r in c10d_by_kind.get(kind, []):
                if r not in c10d_used and ts[r] <= ts[a]:
                    c10d_used.add(r)
                    launcher = int(enclosing[r]) if enclosing[r] >= 0 else r
                    break
        if kernel >= 0:
            kernel_taken.add(kernel)
        coll_rows.append(kernel if kernel >= 0 else a)
        coll_info.append(
            {"kind": kind, "pg": pg, "nbytes": nbytes, "launcher": launcher, "anchor_row": a}
        )
    for k in kernel_rows:  # comm kernels with no backend record around their launch
        k = int(k)
        if k in kernel_taken or step_of[k] < 0:
            continue
        k_args = ev.args.get(k, {})
        raw = _COMM_KERNEL.match(names[k]).group(2)
        kind = collective_kind(str(k_args.get("Collective name") or raw))
        lr = int(launch_row[k])
        coll_rows.append(k)
        coll_info.append(
            {
                "kind": kind,
                "pg": str(k_args.get("Process Group Name") or "0"),
                "nbytes": _nbytes(k_args),
                "launcher": int(enclosing[lr]) if lr >= 0 and enclosing[lr] >= 0 else -1,
                "anchor_row": lr if lr >= 0 else k,
            }
        )

    # ------------------------------------------------------------------ op occurrences
    op_mask = ((is_cpu & is_outer) | is_gpu) & (step_of >= 0)
    op_mask[coll_rows] = False
    op_mask[ann_rows] = False
    op_rows = np.flatnonzero(op_mask)
    lanes = np.array([final_lane[int(x)] for x in lane_arr[op_rows]], dtype=object)
    occ = pd.DataFrame(
        {
            "row": op_rows,
            "step": step_of[op_rows],
            "lane": lanes,
            "ev": names[op_rows],
            "start": ts[op_rows],
            "end": end[op_rows],
        }
    ).sort_values(["step", "lane", "start", "row"], kind="stable")
    k = occ.groupby(["step", "lane", "ev"], sort=False).cumcount().to_numpy()
    occ["op"] = occ["lane"] + "/" + occ["ev"] + "#" + pd.Series(k, index=occ.index).astype(str)
    occ["kind"] = "compute"
    occ["param"] = None
    occ["nbytes"] = 0

    if coll_rows:
        crow = np.array(coll_rows, dtype=np.int64)
        arow = np.array([c["anchor_row"] for c in coll_info], dtype=np.int64)
        cstep = step_of[np.where(step_of[arow] >= 0, arow, crow)]
        net = ["net" if c["pg"] in ("0", "default_pg", "") else f"net:{c['pg']}" for c in coll_info]
        coll = pd.DataFrame(
            {
                "row": crow,
                "step": cstep,
                "lane": net,
                "ev": [c["kind"] for c in coll_info],
                "start": ts[crow],
                "end": end[crow],
                "anchor": ts[arow],
                "nbytes": [int(c["nbytes"]) for c in coll_info],
                "launcher": [c["launcher"] for c in coll_info],
            }
        )
        coll = coll[coll["step"] >= 0].sort_values(["step", "anchor", "row"], kind="stable")
        kc = coll.groupby(["step", "lane", "ev"], sort=False).cumcount()
        coll["op"] = coll["lane"] + "/" + coll["ev"] + "#" + kc.astype(str)
        coll["kind"] = "collective"
        coll_phase = phase_of[coll["row"].to_numpy()]
        bwd = (coll["ev"] == "all_reduce").to_numpy() & (coll_phase == "backward")
        bucket = coll[bwd].groupby(["step", "lane"], sort=False).cumcount()
        param = coll["ev"] + "#" + kc.astype(str)
        param.loc[bucket.index] = "bucket" + bucket.astype(str)
        coll["param"] = param
    else:
        coll = occ.iloc[:0].assign(anchor=np.int64(0), launcher=np.int64(0))

    allocc = pd.concat([occ, coll.drop(columns=["anchor", "launcher"])], ignore_index=True)
    allocc["row"] = allocc["row"].astype(np.int64)
    allocc["phase"] = phase_of[allocc["row"].to_numpy()]
    # GPU events: phase of the launch when the anchor missed
    allocc["type"] = names[allocc["row"].to_numpy()]

    # op table: first occurrence defines the op; nbytes = max over steps
    firsts = allocc.drop_duplicates("op")
    nbytes = allocc.groupby("op")["nbytes"].max()
    ops: dict[str, Op] = {}
    resources = allocc.set_index("op")["lane"]
    resources = resources[~resources.index.duplicated()]
    for name, kind, param, phase, typ in zip(
        firsts["op"], firsts["kind"], firsts["param"], firsts["phase"], firsts["type"], strict=False
    ):
        ops[name] = Op(
            name=name,
            kind=kind,
            resource=str(resources[name]),
            param=param if kind == "collective" else None,
            nbytes=int(nbytes[name]),
            phase=phase,
            type=typ,
        )

    # ------------------------------------------------------------------ edges per step
    op_of_row = pd.Series(allocc["op"].to_numpy(), index=allocc["row"].to_numpy())
    op_of_row = op_of_row[~op_of_row.index.duplicated()]
    edges_by_step: dict[int, list[tuple[str, str, str]]] = {}
    lane_occ = allocc[allocc["kind"] == "compute"].sort_values(["step", "lane", "start", "row"])
    for step, group in lane_occ.groupby("step", sort=True):
        e: list[tuple[str, str, str]] = []
        for _lane, g in group.groupby("lane", sort=False):
            seq = g["op"].tolist()
            e.extend((u, v, "control") for u, v in zip(seq, seq[1:], strict=False))
        edges_by_step[int(step)] = e
    # launch -> GPU op
    gpu_occ = allocc[is_gpu[allocc["row"].to_numpy()] & (allocc["kind"] == "compute")]
    for step, row, op in zip(gpu_occ["step"], gpu_occ["row"], gpu_occ["op"], strict=False):
        lr = launch_row[row]
        if lr >= 0 and enclosing[lr] >= 0 and int(enclosing[lr]) in op_of_row.index:
            edges_by_step[int(step)].append((op_of_row[int(enclosing[lr])], op, "control"))
    # launcher -> collective, collective -> optimizer / next op on the launching thread
    if len(coll):
        by_step_lane = {
            (int(s), ln): g.sort_values("start")
            for (s, ln), g in lane_occ.groupby(["step", "lane"], sort=False)
        }
        opt = lane_occ[lane_occ["phase"] == "optimizer"].sort_values("start")
        opt_by_step = {int(s): g for s, g in opt.groupby("step", sort=False)}
        for step, op, launcher, cend in zip(
            coll["step"], coll["op"], coll["launcher"], coll["end"], strict=False
        ):
            step = int(step)
            e = edges_by_step.setdefault(step, [])
            if launcher >= 0 and launcher in op_of_row.index:
                e.append((op_of_row[launcher], op, "control"))
            g = opt_by_step.get(step)
            if g is not None and launcher >= 0:  # the optimizer waits for the gradients
                later = g[g["start"] > ts[launcher]]
                if len(later):
                    e.append((op, later["op"].iloc[0], "control"))
                    continue
            if launcher >= 0:
                lane_name = final_lane[int(lane_arr[launcher])]
                g = by_step_lane.get((step, lane_name))
                if g is not None:
                    # a GPU clock can lag the CPU one: never before the launcher itself
                    after = g[(g["start"] >= cend) & (g["start"] > ts[launcher])]
                    if len(after):
                        e.append((op, after["op"].iloc[0], "control"))

    # spans: the step range, extended to the last op assigned to it (GPU tails)
    last_end = allocc.groupby("step")["end"].max()
    spans = [
        (int(s), int(a), int(max(b, last_end.get(s, b))))
        for s, a, b in zip(steps["step"], steps["start"], steps["end"], strict=False)
        if s in last_end.index
    ]
    rows = pd.DataFrame(
        {
            "rank": rank_name,
            "iteration": allocc["step"].astype(np.int64),
            "op": allocc["op"],
            "start": allocc["start"].astype(np.int64),
            "duration": (allocc["end"] - allocc["start"]).astype(np.int64),
        }
    )
    # Record function id -> op, for the ET join (any event inside the op maps to it)
    rf_to_op: dict[int, str] = {}
    rf = f["rf"].to_numpy()
    if et_step is not None:
        cand = np.flatnonzero((rf > 0) & (step_of == et_step) & cpu_like)
        owner = enclosing[cand]
        for r, o in zip(cand, owner, strict=False):
            if o in op_of_row.index:
                rf_to_op[int(rf[r])] = op_of_row[int(o)]
            elif int(r) in op_of_row.index:
                rf_to_op[int(rf[r])] = op_of_row[int(r)]
        for i, row in enumerate(coll_rows):  # the backend record of a collective -> it
            a = coll_info[i]["anchor_row"]
            if rf[a] > 0 and row in op_of_row.index:
                rf_to_op[int(rf[a])] = op_of_row[row]
    meta = {
        "lanes": sorted(set(allocc["lane"])),
        "collectives_per_step": coll.groupby("step").size().to_dict() if len(coll) else {},
        "distributed": ev.distributed,
    }
    return RankModel(rank_name, ops, rows, spans, edges_by_step, rf_to_op, notes, meta)


def _merge_edges(model: RankModel, reference: int) -> list[tuple[str, str, str]]:
    """Reference step's edges, plus edges of ops it lacks from the first step that has them."""
    edges = list(model.edges_by_step.get(reference, []))
    covered = {x for u, v, _ in edges for x in (u, v)}
    for step in sorted(model.edges_by_step):
        if step == reference:
            continue
        extra = [
            edge
            for edge in model.edges_by_step[step]
            if edge[0] not in covered or edge[1] not in covered
        ]
        if not extra:
            continue
        trial = nx.DiGraph((u, v) for u, v, _ in edges)
        trial.add_edges_from((u, v) for u, v, _ in extra)
        if nx.is_directed_acyclic_graph(trial):
            edges.extend(extra)
            covered.update(x for u, v, _ in extra for x in (u, v))
        else:
            model.notes.append(
                f"{model.rank}: step {step} orders some ops differently; "
                "its extra edges are dropped"
            )
    return edges


def reference_step(model: RankModel, et_step: int | None = None) -> int:
    """The step whose edges define the DAG: the ET step, else the one with most ops."""
    if et_step is not None and et_step in model.edges_by_step:
        return et_step
    counts = model.rows.groupby("iteration").size()
    return int(counts.idxmax())


def load_kineto(paths: Sequence[Path], et_paths: Sequence[Path] | None = None) -> Job:
    """One Job from Kineto traces (files or directories), one file per rank.

    Ranks are named ``rank<distributedInfo.rank>``, else by file order. With
    `et_paths` (one Execution Trace per rank, matched by their `pid`/order), the DAG
    of each rank is the ET's data dependencies plus the thread/stream/launch order
    (see `planner.ingest.execution_trace`).
    """
    files = expand_paths(paths)
    ranked: list[tuple[str, RankEvents]] = []
    used: set[str] = set()
    for order, path in enumerate(files):
        ev = read_rank(path)
        name = f"rank{ev.rank}" if ev.rank is not None else f"rank{order}"
        if name in used:
            raise InputError(path, f"{name} is given twice (distributedInfo.rank repeats)")
        used.add(name)
        ranked.append((name, ev))
    ets: dict[str, Any] = {}
    if et_paths:
        from planner.ingest import execution_trace

        ets = execution_trace.match_ranks(et_paths, ranked)
    graphs: dict[str, OpGraph] = {}
    rows: list[pd.DataFrame] = []
    spans: list[tuple[str, int, int, int]] = []
    notes: list[str] = []
    meta: dict[str, Any] = {"ranks": {}}
    for name, ev in ranked:
        et = ets.get(name)
        step = None
        if et is not None:
            step = et.step if et.step is not None else _guess_et_step(ev, et)
            if step is None:
                raise InputError(et.path, f"no record-function id joins it to {ev.path.name}")
        model = build_rank(ev, name, et_step=step)
        ref = reference_step(model, step)
        edges = _merge_edges(model, ref)
        if et is not None:
            from planner.ingest import execution_trace

            edges, et_notes = execution_trace.dag_edges(et, model, edges, ref)
            notes.extend(et_notes)
        try:
            graphs[name] = build_graph(model.ops.values(), edges)
        except GraphError as exc:  # a cycle means the trace contradicts itself
            text = str(exc)
            text = text if len(text) < 300 else text[:300] + " ..."
            raise InputError(ev.path, f"cannot build the op DAG ({text})") from None
        rows.append(model.rows)
        spans.extend((name, s, a, b) for s, a, b in model.spans)
        notes.extend(model.notes)
        meta["ranks"][name] = {
            "source": str(ev.path),
            "reference_step": ref,
            "world_size": ev.world_size,
            **model.meta,
        }
    timings = pd.concat(rows, ignore_index=True)[list(TIMING_COLUMNS)]
    span_frame = pd.DataFrame(spans, columns=list(SPAN_COLUMNS)).astype(
        {"iteration": "int64", "start": "int64", "end": "int64"}
    )
    return Job(
        framework="pytorch",
        graphs=graphs,
        trace=Trace(timings=timings, spans=span_frame),
        sources=tuple(str(p) for p in files) + tuple(str(p) for p in (et_paths or ())),
        notes=tuple(notes),
        meta=meta,
    )


def _guess_et_step(ev: RankEvents, et: Any) -> int | None:
    """The step whose Kineto events carry the ET's record-function ids."""
    rf = ev.frame["rf"].to_numpy()
    ids = np.fromiter(et.rf_ids(), dtype=np.int64)
    hit = np.isin(rf, ids[ids > 0])
    if not hit.any():
        return None
    starts = ev.frame["ts"].to_numpy()[hit]
    names = ev.frame["name"].to_numpy()
    steps = [
        (int(n.split("#")[1]), s, e)
        for n, s, e in zip(
            names, ev.frame["ts"].to_numpy(), ev.frame["end"].to_numpy(), strict=False
        )
        if isinstance(n, str) and _STEP.match(n)
    ]
    for number, s, e in steps:
        if ((starts >= s) & (starts < e)).sum() * 2 >= len(starts):
            return number
    return None


def expand_paths(paths: Sequence[Path]) -> list[Path]:
    """Files as given; a directory yields its ``*.pt.trace.json[.gz]`` / ``rank*.json[.gz]``."""
    files: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            found = sorted(
                p
                for p in path.iterdir()
                if p.is_file()
                and (
                    re.search(r"\.pt\.trace\.json(\.gz)?$", p.name)
                    or re.match(r"^rank[^/]*\.json(\.gz)?$", p.name)
                )
            )
            if not found:
                raise InputError(path, "directory holds no Kineto traces (*.pt.trace.json[.gz])")
            files.extend(found)
        elif path.exists():
            files.append(path)
        else:
            raise InputError(path, "no such file or directory")
    if not files:
        raise InputError(None, "no Kineto trace given")
    return files

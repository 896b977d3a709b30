"""PyTorch profiler (Kineto) chrome traces of data-parallel jobs: one `Job` for all ranks.

The work is split by concern, one module each: `kineto_events` reads a file into
columns, `kineto_steps` finds steps, lanes, phases and op nesting, `kineto_gpu` joins
GPU work to its launches, `kineto_comms` finds the collectives with their kernels and
GPU spans, `kineto_dag` builds the edges and `kineto_params` the parameters. This
module turns one rank's events into ops and occurrences, and the ranks into a `Job`.

What becomes an op (per rank):

- CPU: the *outermost* `cpu_op` / `cuda_runtime` / `cuda_driver` event on each thread
  (nested events are the op's own internals; `user_annotation` ranges give steps and
  phases, `python_function` frames are ignored). Resource: the thread lane (``main``
  is the thread holding the steps; others ``<thread name>.<i>``).
- GPU: kernels, memcpy and memset on ``gpu<device>/stream<stream>``, in the step that
  launched them; communication kernels are never compute.
- Collectives and p2p (kind ``collective``): see `kineto_comms`. Resource ``net`` for
  the default process group, ``net:<pg>`` for others.

Op identity: ``<lane>/<event name>#<k>`` with k the occurrence in the step on that
lane, aligned across steps where a step makes a call more or fewer than the others
(`kineto_identity`: ``<event name>@<op>#<k>`` names a call the lane's reference step
lacks by the op it follows), and ``<net>/<collective kind>#<k>`` for collectives (k in
launch order within the process group, which NCCL and gloo require to match on every
rank), so the same op has the same name in every step and on every rank. All-reduces
in the backward pass carry ``param = bucket<k>`` (DDP launches one per bucket, in
bucket order).

A step's span is its CPU range extended to its last op on a CPU trace; on a GPU trace
it is the GPU span of the work the step launched (its iteration time is the GPU
period), and the CPU range and the CPU-to-GPU lag are kept in the rank's ``steps``.
"""

from __future__ import annotations

import gc
import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from planner.errors import InputError
from planner.ingest import kineto_dag, kineto_params, kineto_windows, limits
from planner.ingest.kineto_comms import (
    BACKEND,
    BUILTIN_PATTERNS,
    DTYPE_BYTES,
    Collectives,
    CommPattern,
    collective_kind,
    find_collectives,
    keep_args_pattern,
    load_patterns,
)
from planner.ingest.kineto_events import (
    CPU_OP_CATS,
    STEP_NAME,
    ArgFlags,
    RankEvents,
    is_execution_trace,
    is_kineto,
    read_document,
    read_rank,
    read_rank_generic,
)
from planner.ingest.kineto_gpu import gpu_rows, launches, step_spans
from planner.ingest.kineto_identity import aligned_occurrence, op_suffixes
from planner.ingest.kineto_params import LAYER_PARAMS, parameters_from_sizes
from planner.ingest.kineto_rank import Occurrences, RankModel
from planner.ingest.kineto_steps import (
    BACKWARD,
    FORWARD,
    INPUT,
    Steps,
    cumcount,
    find_steps,
    lane_labels,
    outer_index,
    phases,
    step_of,
)
from planner.model import waits
from planner.model.arrays import unique
from planner.model.graph import PHASES, GraphError, Op, OpGraph, build_graph, is_acyclic
from planner.model.trace import SPAN_COLUMNS, TIMING_COLUMNS, Job, Trace

__all__ = [
    "DTYPE_BYTES", "CommPattern", "Occurrences", "RankEvents", "RankModel", "build_rank",
    "collective_kind", "expand_paths", "is_execution_trace", "is_kineto", "load_kineto",
    "load_patterns", "parameters_from_sizes", "read_document", "read_rank",
    "read_rank_generic",
]  # fmt: skip


OpMemo = dict[tuple[Any, ...], Op]
"""An Op's fields -> the one Op with them: the ranks of a data-parallel job repeat their
ops, and an Op is a frozen value, so one object (and one name string) serves them all."""


INPUT_WAIT = re.compile(r"^enumerate\(DataLoader\)")
"""The range PyTorch's DataLoader records around each ``__next__``: the time the step
waited for its batch (the loader's workers, pinning), an op of the thread that ran it
whose duration is the step's own, not a gap between ops; its phase is ``input``, no work
of the model. Ops inside it (the batch's ``aten::set_``) are part of it."""


@dataclass
class _Rows:
    """What `build_rank` knows about every event row of one rank."""

    ev: RankEvents
    is_cpu: np.ndarray
    is_gpu: np.ndarray
    gpu_side: np.ndarray  # GPU events and GPU-side annotations
    cpu_like: np.ndarray
    enclosing: np.ndarray  # row of the enclosing outermost CPU op, -1
    launch_row: np.ndarray
    step: np.ndarray  # step of each row, -1 outside every step
    phase: np.ndarray  # codes into PHASES
    lane_label: dict[int, str]
    orphan: np.ndarray  # GPU work issued before profiling began (no step)


def _rows(ev: RankEvents, rank: str, steps: Steps, notes: list[str]) -> tuple[_Rows, np.ndarray]:
    """Classify the rows of `ev`; also returns which rows are outermost CPU ops."""
    waits = ev.cat_flags({"user_annotation"}) & ev.name_flags(INPUT_WAIT.match)
    is_cpu = ev.cat_flags(CPU_OP_CATS) | waits
    is_gpu = gpu_rows(ev)
    backend = ev.name_flags(BACKEND.match) & ev.cat_flags({"user_annotation"})
    # outermost CPU ops per thread (comm backend records count as CPU events for nesting)
    cpu_like = (is_cpu | backend) & ~ev.name_flags(lambda n: n.startswith("ProfilerStep#"))
    is_outer, enclosing = outer_index(ev.lane, ev.ts, ev.end, cpu_like)
    launch = launches(ev, is_gpu)
    step = step_of(steps, launch.anchor)
    step[launch.orphan] = -1
    phase = phases(ev, launch.anchor, rank, notes)
    phase[waits] = INPUT
    rows = _Rows(
        ev, is_cpu, is_gpu, is_gpu | ev.cat_flags({"gpu_user_annotation"}), cpu_like,
        enclosing, launch.row, step, phase, lane_labels(ev, steps.main_lane), launch.orphan,
    )  # fmt: skip
    return rows, is_outer


@dataclass
class _Occ:
    """The occurrences of one rank: compute first (`n_comp`), then collectives."""

    rows: np.ndarray  # the event of each occurrence
    step: np.ndarray
    lane: np.ndarray  # code into `labels`
    start: np.ndarray
    end: np.ndarray
    phase: np.ndarray
    text: list[str]  # the op's event/collective name
    suffix: list[str]  # ``#<k>``: the occurrence of that name on that lane (`op_suffixes`)
    n_comp: int
    labels: list[str]
    lane_code_of: np.ndarray  # reader lane -> code into `labels`
    c_nbytes: np.ndarray
    c_launcher: np.ndarray
    c_param: list[str]
    c_anchor: np.ndarray  # row of the call that issued it (its backend record, or launch)


def _occurrences(r: _Rows, is_outer: np.ndarray, coll: Collectives, n_steps: int) -> _Occ:
    """Compute and collective occurrences, each sorted into its canonical order."""
    ev = r.ev
    net_labels = ["net" if pg in ("0", "default_pg", "") else f"net:{pg}" for pg in coll.pg]
    labels = sorted(set(r.lane_label.values()) | set(net_labels))
    label_code = {label: i for i, label in enumerate(labels)}
    n_lanes = int(ev.lane.max()) + 1
    lane_code_of = np.array([label_code[r.lane_label[i]] for i in range(n_lanes)], np.int64)

    op_mask = ((r.is_cpu & is_outer) | r.is_gpu) & (r.step >= 0)
    op_mask[coll.comm_rows] = False
    op_mask[coll.row] = False
    op_mask[ev.name_flags(BACKEND.match) & ev.cat_flags({"user_annotation"})] = False
    o_row = np.flatnonzero(op_mask)
    o_step, o_lane = r.step[o_row], lane_code_of[ev.lane[o_row]]
    order = np.lexsort((o_row, ev.ts[o_row], o_lane, o_step))
    o_row, o_step, o_lane = o_row[order], o_step[order], o_lane[order]
    aligned = aligned_occurrence(o_step, o_lane, ev.name_code[o_row])
    o_suffix = op_suffixes(aligned, ev.names)
    c = _collective_order(r, coll, [label_code[x] for x in net_labels])
    if len(o_row) + len(c["row"]) == 0:
        raise InputError(ev.path, f"no CPU or GPU op falls inside a ProfilerStep#N range "
                         f"({n_steps} step(s) found, all empty)")  # fmt: skip
    rows = np.concatenate([o_row, c["row"]])
    return _Occ(
        rows=rows,
        step=np.concatenate([o_step, c["step"]]),
        lane=np.concatenate([o_lane, c["lane"]]),
        start=np.concatenate([ev.ts[o_row], c["start"]]),
        end=np.concatenate([ev.end[o_row], c["end"]]),
        phase=np.concatenate([r.phase[o_row], c["phase"]]),
        text=[ev.names[i] for i in ev.name_code[o_row].tolist()] + c["kind"],
        suffix=o_suffix + [f"#{k}" for k in c["k"].tolist()],
        n_comp=len(o_row),
        labels=labels,
        lane_code_of=lane_code_of,
        c_nbytes=c["nbytes"],
        c_launcher=c["launcher"],
        c_param=c["param"],
        c_anchor=c["anchor"],
    )


def _collective_order(r: _Rows, coll: Collectives, lane: list[int]) -> dict[str, Any]:
    """The collectives in a step, ordered by step and launch; named per kind and group."""
    ev = r.ev
    c_row = np.array(coll.row, dtype=np.int64)
    a_row = np.array(coll.anchor, dtype=np.int64)
    c_step = r.step[np.where(r.step[a_row] >= 0, a_row, c_row)] if len(c_row) else c_row
    keep = np.flatnonzero(c_step >= 0)
    # launch order: gloo runs queued collectives on two threads, so records can start
    # out of the order their c10d ops queued them (DDP's buckets)
    l_row = np.array(coll.launcher, dtype=np.int64)
    launched = ev.ts[np.where(l_row >= 0, l_row, a_row)] if len(c_row) else c_row
    order = keep[np.lexsort((c_row[keep], ev.ts[a_row[keep]], launched[keep], c_step[keep]))]
    kinds = [coll.kind[i] for i in order.tolist()]
    out: dict[str, Any] = {
        "row": c_row[order],
        "step": c_step[order],
        "lane": np.array(lane, dtype=np.int64)[order] if len(order) else c_row[order],
        "start": np.array(coll.start, dtype=np.int64)[order] if len(order) else c_row[order],
        "end": np.array(coll.end, dtype=np.int64)[order] if len(order) else c_row[order],
        "phase": r.phase[a_row[order]],
        "kind": kinds,
        "nbytes": np.array(coll.nbytes, dtype=np.int64)[order] if len(order) else c_row[order],
        "launcher": np.array(coll.launcher, dtype=np.int64)[order] if len(order) else c_row[order],
        "anchor": a_row[order],
    }
    kind_ids: dict[str, int] = {}
    kind_code = np.array([kind_ids.setdefault(k, len(kind_ids)) for k in kinds], np.int64)
    out["k"] = cumcount(out["step"], out["lane"], kind_code)
    # DDP launches one all-reduce per gradient bucket in the backward pass, in bucket order
    bwd = np.flatnonzero(np.array([k == "all_reduce" for k in kinds], dtype=bool)
                         & (out["phase"] == BACKWARD))  # fmt: skip
    param = [f"{k}#{i}" for k, i in zip(kinds, out["k"].tolist(), strict=True)]
    for j, i in zip(bwd.tolist(), cumcount(out["step"][bwd], out["lane"][bwd]).tolist(),
                    strict=True):  # fmt: skip
        param[j] = f"bucket{i}"
    out["param"] = param
    return out


def _ops(o: _Occ, ev: RankEvents, memo: OpMemo) -> tuple[dict[str, Op], list[str], np.ndarray]:
    """The ops (ids in order of first occurrence) and each occurrence's op id."""
    op_ids: dict[str, int] = {}
    op_id = np.array(
        [op_ids.setdefault(f"{o.labels[la]}/{t}{k}", len(op_ids))
         for la, t, k in zip(o.lane.tolist(), o.text, o.suffix, strict=True)],
        dtype=np.int64,
    )  # fmt: skip
    op_names = list(op_ids)
    del op_ids
    first_occ = np.unique(op_id, return_index=True)[1].tolist()
    op_nbytes = np.zeros(len(op_names), dtype=np.int64)
    np.maximum.at(op_nbytes, op_id[o.n_comp :], o.c_nbytes)
    phases_, lanes = o.phase.tolist(), o.lane.tolist()
    types = ev.name_code[o.rows[first_occ]].tolist()
    ops: dict[str, Op] = {}
    for i, (occ, nbytes, row) in enumerate(zip(first_occ, op_nbytes.tolist(), types, strict=True)):
        collective = occ >= o.n_comp
        param = o.c_param[occ - o.n_comp] if collective else None
        key = (
            op_names[i], "collective" if collective else "compute", o.labels[lanes[occ]],
            param, nbytes, PHASES[phases_[occ]], ev.names[row],
        )  # fmt: skip
        op = memo.get(key)
        if op is None:
            op = memo[key] = Op(*key)
        ops[op.name] = op
        op_names[i] = op.name
    return ops, op_names, op_id


def build_rank(
    ev: RankEvents,
    rank_name: str,
    et_step: int | None = None,
    op_memo: OpMemo | None = None,
    step_marker: str | None = None,
    patterns: tuple[CommPattern, ...] = BUILTIN_PATTERNS,
) -> RankModel:
    """Reduce one rank's events to op occurrences per step, collectives and DAG edges.

    `op_memo` is shared by the ranks of one job; `step_marker` names the step ranges
    of a trace without ``ProfilerStep#N``; `patterns` say which GPU events communicate.
    """
    limits.check_world(ev.path, ev.rank, ev.distributed.get("world_size"))
    limits.check_input_dims(ev.path, ev.args, ev.names, ev.name_code)
    steps = find_steps(ev, rank_name, step_marker)
    notes = list(steps.notes)
    r, is_outer = _rows(ev, rank_name, steps, notes)
    coll = find_collectives(ev, r.is_gpu, r.launch_row, r.enclosing, r.step, patterns)
    o = _occurrences(r, is_outer, coll, len(steps.number))
    ops, op_names, op_id = _ops(o, ev, {} if op_memo is None else op_memo)
    op_at_row = np.full(len(ev), -1, dtype=np.int64)
    op_at_row[o.rows] = op_id
    edges = _edges(r, o, op_id, op_at_row)
    device = r.gpu_side[o.rows]  # a GPU rank's device work: GPU ops and collectives
    if device.any():
        device[o.n_comp :] = True
        src, dst = _recorded_waits(r, o, op_id)
        if src is None:  # the trace names no stream sync: infer them
            src, dst = _inferred_waits(r, o, op_id, device)
        _add_stream_waits(edges, o, op_id, src, dst)
    spans, gpu_steps = _spans_of(steps, o, device)
    per_step = np.unique(o.step[o.n_comp :], return_counts=True)
    meta: dict[str, Any] = {
        "lanes": sorted({o.labels[i] for i in unique(o.lane).tolist()}),
        "collectives_per_step": dict(zip(per_step[0].tolist(), per_step[1].tolist(), strict=True)),
        "distributed": ev.distributed,
        "step_source": steps.source,
    }
    if gpu_steps:
        meta["steps"] = gpu_steps
    ready = _gradient_ready(r)
    if ready:
        meta["gradient_ready"] = ready
    queued = _queued_before(r, coll.comm_rows)
    if queued:
        meta["queued_before"] = queued
    return RankModel(
        rank_name, ops, Occurrences(o.step.astype(np.int64), op_id, o.start, o.end - o.start),
        spans, op_names, edges, _rf_to_op(r, coll, et_step, op_at_row, op_names), notes, meta,
        layer_reads=_layer_reads(r, op_at_row, op_names),
    )  # fmt: skip


def _edges(
    r: _Rows, o: _Occ, op_id: np.ndarray, op_at_row: np.ndarray
) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """The per-step edge candidates (`kineto_dag.step_edges`)."""
    comp_rows = o.rows[: o.n_comp]
    lr = r.launch_row[comp_rows]
    owner = np.where(lr >= 0, r.enclosing[np.maximum(lr, 0)], -1)
    gpu_launcher = np.where(r.is_gpu[comp_rows] & (owner >= 0), op_at_row[np.maximum(owner, 0)], -1)
    n = o.n_comp
    launched = np.where(r.is_gpu[comp_rows] & (lr >= 0), r.ev.ts[np.maximum(lr, 0)], -1)
    called = r.ev.ts[o.c_anchor]  # the collective's call: its backend record or launch
    return kineto_dag.step_edges(
        op_id, n, o.step[:n], o.lane[:n], o.phase[:n], o.start, gpu_launcher,
        (o.step[n:], o.end[n:], o.c_launcher), r.ev.ts, o.lane_code_of[r.ev.lane], op_at_row,
        r.is_cpu[comp_rows], o.labels.index("main") if "main" in o.labels else -1,
        (launched, called), o.end, r.gpu_side[o.rows[n:]],
    )  # fmt: skip


def _inferred_waits(
    r: _Rows, o: _Occ, op_id: np.ndarray, device: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The stream syncs between the rank's device ops, inferred from their times
    (`kineto_dag.stream_wait_edges`)."""
    n = o.n_comp
    lr = r.launch_row[o.rows[:n]]
    ready = np.concatenate([
        np.where(lr >= 0, r.ev.ts[np.maximum(lr, 0)], -1),
        r.ev.ts[o.c_anchor],  # a collective: its call
    ])  # fmt: skip
    sel = np.flatnonzero(device)
    sel = sel[np.lexsort((o.start[sel], o.lane[sel], o.step[sel]))]
    return kineto_dag.stream_wait_edges(
        op_id[sel], o.step[sel], o.lane[sel], o.start[sel], o.end[sel], ready[sel]
    )


def _recorded_waits(
    r: _Rows, o: _Occ, op_id: np.ndarray
) -> tuple[np.ndarray, np.ndarray] | tuple[None, None]:
    """The stream syncs the trace records, as edges; (None, None) where it records none.

    Kineto (PyTorch 2.1 on) records each ``cudaStreamWaitEvent`` as a ``cuda_sync``
    event "Stream Wait Event" on the waiting stream, naming the stream waited on and the
    correlation of the ``cudaEventRecord`` call. The event marks the work launched on
    that stream before the record call; the wait holds the work launched on the
    waiting stream after the wait call. Edge: the op launched last before the record
    call on the stream waited on -> the op launched first after the wait call on the
    waiting stream."""
    ev = r.ev
    rows = np.flatnonzero(ev.cat_flags({"cuda_sync"}) & ev.name_flags("Stream Wait Event".__eq__))
    if not len(rows):
        return None, None
    calls = np.flatnonzero(ev.cat_flags(CPU_OP_CATS) & (ev.corr >= 0))
    called = dict(zip(ev.corr[calls].tolist(), ev.ts[calls].tolist(), strict=True))
    comp = np.arange(o.n_comp)
    lr = r.launch_row[o.rows[comp]]
    gpu = comp[r.is_gpu[o.rows[comp]] & (lr >= 0)]
    launched = ev.ts[r.launch_row[o.rows[gpu]]]
    by_lane: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for code in np.unique(o.lane[gpu]).tolist():
        mine = gpu[o.lane[gpu] == code]
        at = launched[o.lane[gpu] == code]
        order = np.argsort(at, kind="stable")
        by_lane[o.labels[code]] = (at[order], mine[order])
    src, dst = [], []
    for row in rows.tolist():
        a = ev.args.get(row) or {}
        record = called.get(a.get("wait_on_cuda_event_record_corr_id", -1))
        wait = called.get(int(ev.corr[row]))
        device = a.get("device", 0)
        waited = by_lane.get(f"gpu{device}/stream{a.get('wait_on_stream')}")
        waiting = by_lane.get(f"gpu{device}/stream{a.get('stream')}")
        if record is None or wait is None or waited is None or waiting is None:
            continue
        i = int(np.searchsorted(waited[0], record, side="right")) - 1
        j = int(np.searchsorted(waiting[0], wait, side="left"))
        if i >= 0 and j < len(waiting[1]):
            src.append(int(op_id[waited[1][i]]))
            dst.append(int(op_id[waiting[1][j]]))
    return np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64)


def _add_stream_waits(
    edges: dict[int, tuple[np.ndarray, np.ndarray]],
    o: _Occ,
    op_id: np.ndarray,
    src: np.ndarray,
    dst: np.ndarray,
) -> None:
    """Add the stream syncs `src` -> `dst` (op ids) to each step's `edges` that holds
    both ops, where they keep the step's edges acyclic."""
    if not len(src):
        return
    # (speed) which steps hold each op of the edges, as one table, not a scan per step
    involved, slot = np.unique(np.concatenate([src, dst]), return_inverse=True)
    steps, step_at = np.unique(o.step, return_inverse=True)
    present = np.zeros((len(involved), len(steps)), dtype=bool)
    mine = np.isin(op_id, involved)
    present[np.searchsorted(involved, op_id[mine]), step_at[mine]] = True
    u, v = slot[: len(src)], slot[len(src) :]
    n_ops = int(op_id.max()) + 1
    column = {int(s): c for c, s in enumerate(steps.tolist())}
    for step, (s, d) in edges.items():
        keep = present[u, column[step]] & present[v, column[step]]
        s2, d2 = np.concatenate([s, src[keep]]), np.concatenate([d, dst[keep]])
        if keep.any() and is_acyclic(s2, d2, n_ops):
            edges[step] = (s2, d2)


def _queued_before(r: _Rows, comm_rows: np.ndarray) -> dict[str, int]:
    """Stream -> end (ns) of the work it ran that was issued before profiling began:
    the queue the first traced step found on it; and ``net``, the collectives'
    resource, -> the end of the communication kernels among that work. A job whose CPU
    runs ahead starts its profiling window with the device still running the previous
    step, and CUPTI records that work without its launch (HTA `trace_diff/test`: 610
    kernels on stream 7 until 39.3 ms into its first step, whose own first kernel
    starts 6 us later; NCCL's stream 15 until 30.9 ms)."""
    rows = np.flatnonzero(r.orphan)
    if not len(rows):
        return {}
    lanes, at = np.unique(r.ev.lane[rows], return_inverse=True)
    end = np.full(len(lanes), np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(end, at, r.ev.end[rows])
    out = {r.lane_label[int(k)]: int(e) for k, e in zip(lanes.tolist(), end.tolist(), strict=True)}
    comm = rows[np.isin(rows, comm_rows)]
    if len(comm):
        out["net"] = int(r.ev.end[comm].max())
    return out


def _spans_of(
    steps: Steps, o: _Occ, on_gpu: np.ndarray
) -> tuple[list[tuple[int, int, int]], list[dict[str, int]]]:
    """(step, start, end) per step with occurrences: the span of the device work it
    launched (`on_gpu`: GPU ops and collectives) where it has any, else its CPU range
    extended to its last op; plus, for GPU steps, the CPU range and the device span
    (ns) for the rank's ``steps``."""
    occ_steps, step_at = np.unique(o.step, return_inverse=True)
    last_end = np.full(len(occ_steps), np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(last_end, step_at, o.end)
    last = dict(zip(occ_steps.tolist(), last_end.tolist(), strict=True))
    gpu = step_spans(o.step, o.start, o.end, on_gpu)
    spans: list[tuple[int, int, int]] = []
    info: list[dict[str, int]] = []
    for s, a, b in zip(steps.number.tolist(), steps.start.tolist(), steps.end.tolist(),
                       strict=True):  # fmt: skip
        if s not in last:
            continue
        if s in gpu:
            g0, g1 = gpu[s]
            spans.append((s, g0, g1))
            info.append({"step": s, "cpu_start": a, "cpu_end": b, "gpu_start": g0, "gpu_end": g1})
        else:
            spans.append((s, a, max(b, last[s])))
    return spans, info


def _rf_to_op(
    r: _Rows, coll: Collectives, et_step: int | None, op_at_row: np.ndarray, op_names: list[str]
) -> dict[int, str]:
    """Record function id -> op, for the ET join (any event inside the op maps to it)."""
    out: dict[int, str] = {}
    if et_step is None:
        return out
    rf = r.ev.rf
    cand = np.flatnonzero((rf > 0) & (r.step == et_step) & r.cpu_like)
    for row, owner in zip(cand.tolist(), r.enclosing[cand].tolist(), strict=False):
        if owner >= 0 and op_at_row[owner] >= 0:
            out[int(rf[row])] = op_names[op_at_row[owner]]
        elif op_at_row[row] >= 0:
            out[int(rf[row])] = op_names[op_at_row[row]]
    for row, a in zip(coll.row, coll.anchor, strict=True):  # the backend record -> it
        if rf[a] > 0 and op_at_row[row] >= 0:
            out[int(rf[a])] = op_names[op_at_row[row]]
    return out


def _gradient_ready(r: _Rows) -> dict[int, list[tuple[int, int]]]:
    """Per step, each gradient's ready time and size (`kineto_params.gradient_ready`)."""
    ev = r.ev
    rows = np.flatnonzero(ev.name_flags(kineto_params.GRAD_READY.__eq__) & (r.step >= 0))
    rows = rows[np.argsort(ev.end[rows], kind="stable")]
    events = [(int(ev.end[i]), ev.args.get(i, {})) for i in rows.tolist()]
    return kineto_params.gradient_ready(events, r.step[rows].tolist())


def _layer_reads(
    r: _Rows, op_at_row: np.ndarray, op_names: list[str]
) -> dict[int, list[tuple[str, str, int]]]:
    """The forward layer ops' parameter reads per step (`kineto_params.layer_reads`)."""
    ev = r.ev
    rows = np.flatnonzero(
        ev.name_flags(LAYER_PARAMS.__contains__) & r.is_cpu & (r.step >= 0) & (r.phase == FORWARD)
    )
    rows = rows[np.argsort(ev.ts[rows], kind="stable")]
    owner = np.where(r.enclosing[rows] >= 0, r.enclosing[rows], rows)
    ops = [op_names[i] if i >= 0 else "" for i in op_at_row[owner].tolist()]
    events = [(ev.names[ev.name_code[i]], ev.args.get(i, {})) for i in rows.tolist()]
    return kineto_params.layer_reads(events, ops, r.step[rows].tolist())


@contextmanager
def _cycle_gc_paused() -> Iterator[None]:
    """Pause Python's cycle collector, restoring its state afterwards.

    Ingest allocates millions of short-lived containers that cannot form cycles (JSON
    trees, the DAG's dicts); the collector would scan them again and again, which
    costs about half the load time. Reference counting still frees them.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


STEP_MARKER_ENV = "PLANNER_STEP_MARKER"
"""Environment variable naming the step marker, read when none is given."""


@dataclass(frozen=True)
class Options:
    """How to read a job: the step marker of traces without ``ProfilerStep#N`` and the
    communication pattern table (`kineto_comms.load_patterns`)."""

    step_marker: str | None = None
    patterns: tuple[CommPattern, ...] = BUILTIN_PATTERNS


def load_kineto(
    paths: Sequence[Path],
    et_paths: Sequence[Path] | None = None,
    step_marker: str | None = None,
    patterns: tuple[CommPattern, ...] | None = None,
) -> Job:
    """One Job from Kineto traces (files or directories), one file per rank.

    Ranks are named ``rank<distributedInfo.rank>``, else by file order. With
    `et_paths` (one Execution Trace per rank, matched by their `pid`/order), the DAG
    of each rank is the ET's data dependencies plus the thread/stream/launch order
    (see `planner.ingest.execution_trace`). `step_marker` names the step ranges of a
    trace without ``ProfilerStep#N`` (default ``$PLANNER_STEP_MARKER``); `patterns`
    (default: the built-in table plus ``$PLANNER_COMM_PATTERNS``) say which GPU events
    are communication.
    """
    marker = step_marker or os.environ.get(STEP_MARKER_ENV) or None
    options = Options(marker, load_patterns() if patterns is None else patterns)
    with _cycle_gc_paused():
        return _load_kineto(paths, et_paths, options)


def _load_kineto(paths: Sequence[Path], et_paths: Sequence[Path] | None, options: Options) -> Job:
    files = expand_paths(paths)
    arg_memo: ArgFlags = {}
    used: set[str] = set()
    keep = keep_args_pattern(options.patterns)

    processes: dict[frozenset[int], int] = {}  # a file without distributedInfo: its process

    def read(order: int, path: Path) -> tuple[str, RankEvents]:
        ev = read_rank(path, memo=arg_memo, keep=keep)
        if ev.rank is not None:
            return f"rank{ev.rank}", ev
        # no rank in the file: one rank per process, in order of first appearance, so
        # that the windows of a one-process job (a schedule with repeat) are joined
        number = processes.setdefault(frozenset(ev.pids), len(processes))
        return f"rank{number}", ev

    def once(ranks: Iterator[tuple[str, RankEvents, int]]) -> Iterator[tuple[str, RankEvents]]:
        for name, ev, count in ranks:
            if name in used:
                why = (
                    "distributedInfo.rank repeats"
                    if ev.rank is not None
                    else "no distributedInfo, and another file of its process is not next to it"
                )
                raise InputError(ev.path, f"{name} is given twice ({why})")
            used.add(name)
            if count > 1:
                windows.append(f"{name}: {count} windows of one profiling session joined")
            yield name, ev

    windows: list[str] = []
    ets: dict[str, Any] = {}
    ranks: Iterator[tuple[str, RankEvents]]
    # a rank's adjacent files from one process are windows of one session: joined
    read_all = kineto_windows.grouped(read(order, path) for order, path in enumerate(files))
    if et_paths:  # an ET is matched to its rank among all of them: read them all first
        from planner.ingest import execution_trace

        ranked = list(once(read_all))
        ets = execution_trace.match_ranks(et_paths, ranked)
        ranks = iter(ranked)
    else:  # one rank's events in memory at a time
        ranks = once(read_all)
    parts = _JobParts()
    op_memo: OpMemo = {}
    failed: InputError | None = None
    for name, ev in ranks:
        if failed is None:
            try:
                _add_rank(parts, name, ev, ets.get(name), op_memo, options)
            except InputError as exc:
                failed = exc  # raised once every file is read: a bad file is reported first
        del ev
    if failed is not None:
        raise failed
    parts.notes.extend(windows)
    limits.check_same_job(parts.graphs, parts.meta["ranks"])
    timings = _timings(parts.occurrences)
    _add_waits(timings, parts)
    return Job(
        framework="pytorch",
        graphs=parts.graphs,
        trace=Trace(table=timings, span_table=_spans(parts.spans)),
        sources=tuple(str(p) for p in files) + tuple(str(p) for p in (et_paths or ())),
        notes=tuple(parts.notes),
        meta=parts.meta,
    )


@dataclass
class _JobParts:
    """What the ranks add to their Job, gathered rank by rank."""

    graphs: dict[str, OpGraph] = field(default_factory=dict)
    occurrences: list[tuple[str, Occurrences, list[str]]] = field(default_factory=list)
    spans: list[tuple[str, int, int, int]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(
        default_factory=lambda: {"ranks": {}, "parameters": {}, "parameter_source": {}}
    )


def _add_rank(
    parts: _JobParts,
    name: str,
    ev: RankEvents,
    et: Any | None,
    op_memo: OpMemo,
    options: Options = Options(),
) -> None:
    """Model one rank (joined to its Execution Trace `et`, if any) into `parts`."""
    notes, meta = parts.notes, parts.meta
    step = None
    if et is not None:
        step = et.step if et.step is not None else _guess_et_step(ev, et)
        if step is None:
            raise InputError(et.path, f"no record-function id joins it to {ev.path.name}")
    model = build_rank(ev, name, step, op_memo, options.step_marker, options.patterns)
    ref = kineto_dag.reference_step(model, step)
    edges = kineto_dag.merge_edges(model, ref)
    params: list[dict[str, Any]] = []
    p_notes: list[str] = []
    source = "bucket"
    if et is not None:
        from planner.ingest import execution_trace

        edges, et_notes = execution_trace.dag_edges(et, model, edges, ref)
        notes.extend(et_notes)
        if et.parameters:
            params, p_notes = execution_trace.resolve_parameters(et, model)
            source = "execution_trace"
        else:
            p_notes = [f"{name}: the Execution Trace has no DDP bucket copies"]
    if not params:
        params, size_notes = parameters_from_sizes(model, ref)
        p_notes += size_notes
        source = "bucket_sizes" if params else "bucket"
    notes.extend(p_notes)
    meta["parameters"][name] = params
    meta["parameter_source"][name] = source
    try:
        parts.graphs[name] = build_graph(model.ops.values(), edges)
    except GraphError as exc:  # a cycle means the trace contradicts itself
        text = str(exc)
        text = text if len(text) < 300 else text[:300] + " ..."
        raise InputError(ev.path, f"cannot build the op DAG ({text})") from None
    if (ev.world_size or 0) > 1 and not any(op.is_transfer for op in model.ops.values()):
        notes.append(
            f"{name}: world size {ev.world_size} but no communication found in its steps "
            "(a backend the pattern table does not know? see --comm-patterns)"
        )
    parts.occurrences.append((name, model.occurrences, model.op_names))
    parts.spans.extend((name, s, a, b) for s, a, b in model.spans)
    notes.extend(model.notes)
    meta["ranks"][name] = {
        "source": str(ev.path),
        "reference_step": ref,
        "world_size": ev.world_size,
        **model.meta,
    }


def _add_waits(timings: dict[str, np.ndarray], parts: _JobParts) -> None:
    """The ``wait`` column (ns): each collective's time waiting for the last rank."""
    mask = waits.collective_rows(timings, parts.graphs)
    wait = np.zeros(len(mask), dtype=np.int64)
    rows = {k: v[mask] for k, v in timings.items()}
    wait[mask], alignment = waits.split_waits(rows)
    timings["wait"] = wait
    if alignment is not None:
        parts.meta["clock_alignment"] = alignment.to_dict()
    elif mask.any():
        parts.notes.append(
            "one rank: a collective's wait for its peers cannot be told from its transfer; "
            "its whole span counts as transfer (the time oracle takes the minimum over steps)"
        )


# The two tables are numpy columns (`Trace.table`): pandas is loaded only by the commands
# that need a DataFrame, which `Trace.timings` builds from them.


def _timings(rows: Sequence[tuple[str, Occurrences, list[str]]]) -> dict[str, np.ndarray]:
    """The timings table (`TIMING_COLUMNS`) of every rank's op occurrences, in rank order."""
    rank = np.repeat(np.array([name for name, _, _ in rows], dtype=object),
                     [len(occ) for _, occ, _ in rows])  # fmt: skip
    op = np.concatenate([np.array(names, dtype=object)[occ.op] for _, occ, names in rows])
    columns = (
        rank,
        np.concatenate([occ.iteration for _, occ, _ in rows]),
        op,
        np.concatenate([occ.start for _, occ, _ in rows]),
        np.concatenate([occ.duration for _, occ, _ in rows]),
    )
    return dict(zip(TIMING_COLUMNS, columns, strict=True))


def _spans(spans: Sequence[tuple[str, int, int, int]]) -> dict[str, np.ndarray]:
    """The spans table (`SPAN_COLUMNS`): one row per (rank, iteration)."""
    rank, iteration, start, end = zip(*spans, strict=True) if spans else ((), (), (), ())
    columns = (
        np.array(rank, dtype=object),
        np.array(iteration, dtype=np.int64),
        np.array(start, dtype=np.int64),
        np.array(end, dtype=np.int64),
    )
    return dict(zip(SPAN_COLUMNS, columns, strict=True))


def _guess_et_step(ev: RankEvents, et: Any) -> int | None:
    """The step whose Kineto events carry the ET's record-function ids."""
    ids = np.fromiter(et.rf_ids(), dtype=np.int64)
    hit = np.isin(ev.rf, ids[ids > 0])
    if not hit.any():
        return None
    starts = ev.ts[hit]
    step_rows = np.flatnonzero(ev.name_flags(STEP_NAME.match))
    for r in step_rows.tolist():
        number = int(ev.names[ev.name_code[r]].split("#")[1])
        if ((starts >= ev.ts[r]) & (starts < ev.end[r])).sum() * 2 >= len(starts):
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

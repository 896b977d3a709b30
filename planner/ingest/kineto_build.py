"""One Kineto rank's model (`RankModel`) built from its events: `build_rank`.

From the occurrences and ops of `kineto_ops`: the DAG edges of each step
(`kineto_dag.step_edges`) with the stream syncs the trace records or, where it records
none, those inferred from the times; the step spans (the device span of a GPU step);
and what the rank's meta keeps for the later stages: the gradients' ready times, the
layer ops' parameter reads, the stream work queued before the window, and the
record-function ids an Execution Trace joins by.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from planner.ingest import kineto_dag, kineto_exposure, kineto_fsdp, kineto_params, limits
from planner.ingest.files import escaped_note
from planner.ingest.kineto_calls import SHARDING
from planner.ingest.kineto_comms import (
    BUILTIN_PATTERNS,
    Collectives,
    CommPattern,
    find_collectives,
)
from planner.ingest.kineto_events import (
    CPU_OP_CATS,
    RankEvents,
)
from planner.ingest.kineto_gpu import step_spans
from planner.ingest.kineto_groups import SHARDED_NOTE, assign_groups
from planner.ingest.kineto_ops import OpMemo, _Occ, _occurrences, _ops, _Rows, _rows
from planner.ingest.kineto_params import LAYER_PARAMS
from planner.ingest.kineto_rank import Occurrences, RankModel
from planner.ingest.kineto_steps import (
    FORWARD,
    Steps,
    find_steps,
)
from planner.model.arrays import unique
from planner.model.graph import is_acyclic


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
    if ev.escaped:
        notes.append(f"{ev.path}: {escaped_note(ev.escaped)}")
    r, is_outer = _rows(ev, rank_name, steps, notes)
    coll = find_collectives(ev, r.is_gpu, r.launch_row, r.enclosing, r.step, patterns)
    assign_groups(ev, coll, r.phase)
    if SHARDING.intersection(coll.kind):
        notes.append(f"{rank_name}: {SHARDED_NOTE}")
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
    if len(o.c_pg):
        meta["collectives"] = _collective_meta(r, o, op_names, op_id)
        meta["process_groups"] = {pg: coll.groups[pg] for pg in sorted(set(o.c_pg))}
        busy = kineto_exposure.busy(r.ev, r.is_gpu, coll.comm_rows)
        meta["exposed"] = _exposed(o, op_names, op_id, busy)
        meta["in_flight"] = _in_flight(r, o, op_names, op_id, busy)
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


def _exposed(
    o: _Occ, op_names: list[str], op_id: np.ndarray, busy: tuple[np.ndarray, np.ndarray]
) -> dict[int, dict[str, int]]:
    """Per step, each collective's ns that no compute of the rank (`busy`) hid
    (`kineto_exposure`)."""
    n = o.n_comp
    found = kineto_exposure.exposed(o.start[n:], o.end[n:], busy)
    out: dict[int, dict[str, int]] = {}
    for step, i, ns in zip(o.step[n:].tolist(), op_id[n:].tolist(), found.tolist(), strict=True):
        out.setdefault(int(step), {})[op_names[i]] = int(ns)
    return out


def _in_flight(
    r: _Rows, o: _Occ, op_names: list[str], op_id: np.ndarray, busy: tuple[np.ndarray, np.ndarray]
) -> dict[int, dict[str, list[int]]]:
    """Per step, each collective's compute ns while in flight, 1 where it was issued
    ahead (else 0) and the ns from its issue to its start (`kineto_exposure.in_flight`).
    On a GPU rank in flight is the collective's kernel span: its call on the CPU runs
    ahead of the stream it waits in."""
    n = o.n_comp
    computed, ahead, lead = kineto_exposure.in_flight(
        r.ev, o.c_call, o.start[n:], o.end[n:], busy, from_call=not r.is_gpu.any()
    )
    out: dict[int, dict[str, list[int]]] = {}
    for step, i, ns, early, ago in zip(o.step[n:].tolist(), op_id[n:].tolist(),
                                       computed.tolist(), ahead.tolist(), lead.tolist(),
                                       strict=True):  # fmt: skip
        out.setdefault(int(step), {})[op_names[i]] = [int(ns), int(early), int(ago)]
    return out


def _collective_meta(
    r: _Rows, o: _Occ, op_names: list[str], op_id: np.ndarray
) -> dict[str, dict[str, Any]]:
    """Collective op -> what it does (``kind``), the c10d op it was called as (``call``,
    None without one), the backend record or kernel that ran and timed it
    (``backend``), its process group (``group``) and, where an FSDP2 range names it,
    its FSDP ``unit`` (`kineto_fsdp`), from its first occurrence."""
    names, code = r.ev.names, r.ev.name_code
    units = kineto_fsdp.units(r.ev, o.c_call.tolist())
    out: dict[str, dict[str, Any]] = {}
    for j, i in enumerate(op_id[o.n_comp :].tolist()):
        name = op_names[i]
        if name in out:
            continue
        call = int(o.c_call[j])
        out[name] = {
            "kind": o.text[o.n_comp + j],
            "call": names[code[call]] if call >= 0 else None,
            "backend": names[code[o.rows[o.n_comp + j]]],
            "group": o.c_pg[j],
            **({"unit": units[j]} if units[j] is not None else {}),
        }
    return out

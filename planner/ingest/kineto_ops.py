"""One Kineto rank's events turned into op occurrences and ops (`kineto` gives the rules).

`_rows` classifies every event row (CPU op or GPU work, the outermost CPU op enclosing
it, its launch, step, phase and lane); `_occurrences` picks the occurrences and puts
them in their canonical order (compute by step, lane and start; then the collectives by
launch within each process group, `_collective_order`); `_ops` names them into `Op`s,
one per name, shared by the ranks of a job (`OpMemo`). `kineto_build` makes the rest of
the rank's model from these: its edges, spans and the figures its meta keeps.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from planner.errors import InputError
from planner.ingest.kineto_calls import SHARDING
from planner.ingest.kineto_comms import (
    BACKEND,
    Collectives,
)
from planner.ingest.kineto_events import (
    CPU_OP_CATS,
    RankEvents,
)
from planner.ingest.kineto_gpu import gpu_rows, launches
from planner.ingest.kineto_groups import DATA_ROLES, net_lanes
from planner.ingest.kineto_identity import aligned_occurrence, op_suffixes
from planner.ingest.kineto_steps import (
    BACKWARD,
    INPUT,
    Steps,
    cumcount,
    lane_labels,
    outer_index,
    phases,
    step_of,
)
from planner.model.graph import PHASES, Op

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
    c_call: np.ndarray  # row of its c10d op, -1 without one
    c_pg: list[str]  # its process group's name


def _occurrences(r: _Rows, is_outer: np.ndarray, coll: Collectives, n_steps: int) -> _Occ:
    """Compute and collective occurrences, each sorted into its canonical order."""
    ev = r.ev
    lane_of = net_lanes(coll.groups)
    net_labels = [lane_of.get(pg) or f"net:{pg}" for pg in coll.pg]
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
        c_call=c["call"],
        c_pg=c["pg"],
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
        "call": np.array(coll.call, dtype=np.int64)[order] if len(order) else c_row[order],
        "pg": [coll.pg[i] for i in order.tolist()],
    }
    kind_ids: dict[str, int] = {}
    kind_code = np.array([kind_ids.setdefault(k, len(kind_ids)) for k in kinds], np.int64)
    out["k"] = cumcount(out["step"], out["lane"], kind_code)
    # DDP launches one all-reduce per gradient bucket in the backward pass, in bucket
    # order; a rank that reduce-scatters its gradients (FSDP, ZeRO) has no DDP buckets,
    # whatever its all-reduces are (HSDP's across replicas); on a rank of several groups,
    # only a data-parallel group's (`kineto_groups`: a tensor-parallel group all-reduces
    # activation gradients in the backward)
    ddp = not SHARDING.intersection(kinds)
    several = len(coll.groups) > 1
    buckets = [
        k == "all_reduce" and ddp and _bucket_group(coll.groups.get(pg) or {}, several)
        for k, pg in zip(kinds, out["pg"], strict=True)
    ]
    bwd = np.flatnonzero(np.array(buckets, dtype=bool) & (out["phase"] == BACKWARD))
    param = [f"{k}#{i}" for k, i in zip(kinds, out["k"].tolist(), strict=True)]
    for j, i in zip(bwd.tolist(), cumcount(out["step"][bwd], out["lane"][bwd]).tolist(),
                    strict=True):  # fmt: skip
        param[j] = f"bucket{i}"
    out["param"] = param
    return out


def _bucket_group(group: dict[str, Any], several: bool) -> bool:
    """Whether a group's backward all-reduces can be DDP's buckets: a data-parallel group,
    or one whose role neither the trace states nor the rank's other groups tell."""
    if group.get("role") in DATA_ROLES:
        return True
    return group.get("role_source") != "trace" and not several


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

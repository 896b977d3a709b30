"""DAG edges of one rank's Kineto ops, without an Execution Trace (all ``control``).

Per-lane program order; launch -> GPU op (correlation); launching CPU op ->
collective; every collective -> the first optimizer op of the step (or, without an
optimizer range, the first op on the launching thread that starts after the
collective ends; where the collective runs on the device, the first kernel that op or
a later one launched); the main thread's op that started last before another CPU thread's
first op of the step -> that op (the thread is handed its work: autograd's engine
thread starts the backward once ``backward()`` has seeded the gradient); the GPU op
launched last before a collective was called -> that collective (NCCL's stream waits for
the caller's); device op -> the device op on another stream that waited for it (an
unrecorded stream sync, inferred across steps: `stream_wait_edges`). Edges are gathered
per step; the DAG takes them from one reference step, and ops only seen in other steps
get theirs from the first step that has them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import numpy as np

from planner.ingest.kineto_steps import OPTIMIZER as _OPTIMIZER
from planner.model.arrays import unique
from planner.model.graph import is_acyclic

if TYPE_CHECKING:
    from planner.ingest.kineto_rank import RankModel


def collective_edges(
    op_id: np.ndarray,
    n_comp: int,
    o_step: np.ndarray,
    o_lane: np.ndarray,
    o_start: np.ndarray,
    o_phase: np.ndarray,  # codes into PHASES
    ts: np.ndarray,
    c_step: np.ndarray,
    c_end: np.ndarray,
    c_launcher: np.ndarray,
    lane_of_row: np.ndarray,
    op_at_row: np.ndarray,
    launched: np.ndarray | None = None,
    c_device: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Edges launcher -> collective and collective -> the ops that wait for it.

    The waiting op is the step's first optimizer op starting after the launcher, else
    the first op on the launching thread starting after the collective ends (and after
    the launcher: a GPU clock can lag the CPU one). With an optimizer, the first op on
    the launching thread after both the collective's end and the thread's last
    collective launch of the step waits too (DDP waits for every bucket after launching
    the last, then copies each back to the gradients: without the edge the replay ran
    that copy work during the 64 MiB all-reduce). Candidates are ordered by a
    quicksort on start time, so ties resolve as they always have.

    A collective run on the device (`c_device`: NCCL, RCCL) is not waited for by the
    CPU: the optimizer's CPU op is issued at once and its first *kernel* waits (the
    caller's stream joins the communication stream). There each waiting op is the first
    GPU op launched (`launched`: per compute occurrence the time its launch was called,
    -1: not a GPU op) at or after the CPU op's start, and no edge is made where the
    step launches none. The CPU edge was contradicted by every step of the MI300 DDP
    trace, whose CPU issues the optimizer 23-29 ms before the all-reduce it waited for.
    """
    comp_op = op_id[:n_comp]
    device_waiter = None
    if launched is not None and c_device is not None and c_device.any():
        device_waiter = _device_waiter(o_step, o_start, launched)
    opt = np.flatnonzero(o_phase == _OPTIMIZER)
    opt = opt[np.argsort(o_start[opt], kind="quicksort")]
    opt = opt[np.argsort(o_step[opt], kind="stable")]  # per step, in that start order
    last_launch: dict[tuple[int, int], int] = {}
    for step, launcher in zip(c_step.tolist(), c_launcher.tolist(), strict=True):
        if launcher >= 0:
            key = (step, int(lane_of_row[launcher]))
            last_launch[key] = max(last_launch.get(key, 0), int(ts[launcher]))
    device = c_device.tolist() if c_device is not None else [False] * len(c_step)
    collectives = zip(
        c_step.tolist(),
        op_id[n_comp:].tolist(),
        c_launcher.tolist(),
        c_end.tolist(),
        device,
        strict=True,
    )
    src, dst, tag = _collective_waits(
        collectives, comp_op, o_step, o_lane, o_start, ts, lane_of_row, op_at_row, opt,
        last_launch, device_waiter,
    )  # fmt: skip
    return (
        np.array(src, dtype=np.int64),
        np.array(dst, dtype=np.int64),
        np.array(tag, dtype=np.int64),
    )


def _collective_waits(
    collectives: Iterable[tuple[int, int, int, int, bool]],
    comp_op: np.ndarray,
    o_step: np.ndarray,
    o_lane: np.ndarray,
    o_start: np.ndarray,
    ts: np.ndarray,
    lane_of_row: np.ndarray,
    op_at_row: np.ndarray,
    opt: np.ndarray,
    last_launch: dict[tuple[int, int], int],
    device_waiter: Callable[[int, int], int] | None,
) -> tuple[list[int], list[int], list[int]]:
    """The edges of `collective_edges` as (src, dst, step) lists, one collective at a time
    (`collectives`: step, op id, launcher row, end, run on the device; `opt`: the
    optimizer's compute occurrences by step and start; `last_launch`: per (step, lane)
    the thread's last collective launch)."""
    opt_step = o_step[opt]
    lane_groups: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
    src: list[int] = []
    dst: list[int] = []
    tag: list[int] = []
    for step, cop, launcher, cend, on_gpu in collectives:
        if launcher >= 0 and op_at_row[launcher] >= 0:
            src.append(int(op_at_row[launcher]))
            dst.append(cop)
            tag.append(step)
        if launcher < 0:
            continue
        key = (step, int(lane_of_row[launcher]))
        group = lane_groups.get(key)
        if group is None:
            members = np.flatnonzero((o_step == key[0]) & (o_lane == key[1]))
            members = members[np.argsort(o_start[members], kind="quicksort")]
            group = lane_groups[key] = (members, o_start[members])
        members, starts = group
        i = int(np.searchsorted(starts, max(cend, int(ts[launcher]) + 1), side="left"))
        # DDP waits for every bucket's all-reduce once the thread has launched the last
        # one, then copies each bucket back (copy_bucket_to_grad / as_strided): the first
        # op on the thread after both the collective's end and that last launch waits
        after = max(cend, last_launch.get(key, int(ts[launcher])) + 1)
        w = int(np.searchsorted(starts, after, side="left"))
        waiter = int(comp_op[members[w]]) if w < len(members) else -1
        a = int(np.searchsorted(opt_step, step))
        b = int(np.searchsorted(opt_step, step, side="right"))
        if b > a:  # the optimizer waits for the gradients
            cand = opt[a:b]
            j = int(np.searchsorted(o_start[cand], ts[launcher], side="right"))
            if j < len(cand):
                first = int(cand[j])
                if on_gpu and device_waiter is not None:
                    first = device_waiter(step, first)
                    held = device_waiter(step, int(members[w])) if w < len(members) else -1
                    waiter = int(comp_op[held]) if held >= 0 else -1
                if first >= 0:
                    src.append(cop)
                    dst.append(int(comp_op[first]))
                    tag.append(step)
                if waiter >= 0 and (first < 0 or waiter != int(comp_op[first])):
                    src.append(cop)
                    dst.append(waiter)
                    tag.append(step)
                continue
        if i < len(members):
            first = int(members[i])
            if on_gpu and device_waiter is not None:
                first = device_waiter(step, first)
            if first >= 0:
                src.append(cop)
                dst.append(int(comp_op[first]))
                tag.append(step)
    return src, dst, tag


def _device_waiter(
    o_step: np.ndarray, o_start: np.ndarray, launched: np.ndarray
) -> Callable[[int, int], int]:
    """(step, CPU occurrence) -> the step's first GPU occurrence launched at or after
    that occurrence's start (-1: none): where a device collective's waiter really waits."""
    gpu = np.flatnonzero(launched >= 0)
    gpu = gpu[np.lexsort((gpu, launched[gpu], o_step[gpu]))]
    g_step, g_at = o_step[gpu], launched[gpu]

    def first_after(step: int, occ: int) -> int:
        a = int(np.searchsorted(g_step, step, side="left"))
        b = int(np.searchsorted(g_step, step, side="right"))
        j = a + int(np.searchsorted(g_at[a:b], o_start[occ], side="left"))
        return int(gpu[j]) if j < b else -1

    return first_after


def enqueue_edges(
    comp: np.ndarray,
    o_step: np.ndarray,
    launched: np.ndarray,
    c_op: np.ndarray,
    c_step: np.ndarray,
    c_launched: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Edges GPU op -> collective: the device work the CPU enqueued last before it
    called the collective. NCCL's stream waits for the caller's stream at the call
    (ProcessGroupNCCL syncs the two with an event), so a bucket's all-reduce cannot
    start before the backward kernels launched ahead of it; Kineto records the event
    calls without saying which streams they join, and without the edge a collective
    waited only by its typical delay, which the observed order hides and a new order
    does not (the MI300 DDP trace's second all-reduce, moved first, ran 10 ms before
    its gradients). `launched`: per compute occurrence the time its launch was called
    (-1: not a GPU op); `c_launched`: per collective the time it was called (its backend
    record's start, or its kernel's launch call).
    """
    gpu = np.flatnonzero(launched >= 0)
    order = gpu[np.lexsort((launched[gpu], o_step[gpu]))]
    key_step, key_at = o_step[order], launched[order]
    src, dst, tag = [], [], []
    for cop, step, at in zip(c_op.tolist(), c_step.tolist(), c_launched.tolist(), strict=True):
        if at < 0:
            continue
        a = int(np.searchsorted(key_step, step, side="left"))
        b = int(np.searchsorted(key_step, step, side="right"))
        j = a + int(np.searchsorted(key_at[a:b], at, side="left")) - 1
        if j >= a:
            src.append(int(comp[order[j]]))
            dst.append(int(cop))
            tag.append(int(step))
    return (
        np.array(src, dtype=np.int64),
        np.array(dst, dtype=np.int64),
        np.array(tag, dtype=np.int64),
    )


STREAM_WAIT = 20_000  # ns: a device op that waited longer than this on its own lane...
STREAM_TIGHT = 1_000_000  # ns: ...and started within this after another lane's op ended


def stream_wait_edges(
    op_id: np.ndarray,
    step: np.ndarray,
    lane: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    ready: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Edges device op -> device op on another lane that waited for it: the stream
    syncs the trace does not record (CUDA events joining two streams, a collective's
    `wait()`), inferred from the times across steps.

    A device op v waited when it started more than `STREAM_WAIT` after its own lane
    let it (`ready`: its launch call, per occurrence; and the end of its lane's previous
    op). The op u on another lane that ended last, within `STREAM_TIGHT`, before v
    started is what it waited for in that step. Across steps v takes the u it followed
    so in most of the steps it waited, if u ended before v started in every step that
    has both: an edge no step contradicts. HTA ``trace_diff/control``: the
    ``CatArrayBatchedCopy`` after a DLRM all-to-all starts 2 us after the all-to-all
    ends, 1.5 ms after its launch; with no edge the replay took its wait from the other
    steps (9.2 ms) and ran 7.5 ms late. `STREAM_TIGHT` is 1 ms, not a few us: in
    ``trace_diff/test`` a copy on stream 14 starts 0.44-0.56 ms after an all-to-all
    ends in five steps (4 us in the sixth), and the most common follower across steps
    keeps a chance ordering out. The arrays describe the device occurrences, sorted by
    step, then lane, then start.
    """
    empty = np.zeros(0, dtype=np.int64)
    if len(op_id) < 2:
        return empty, empty
    first = np.r_[True, (step[1:] != step[:-1]) | (lane[1:] != lane[:-1])]
    previous_end = np.where(first, -1, np.r_[-1, end[:-1]])
    own = np.maximum(ready, previous_end)
    waited = np.flatnonzero((own >= 0) & (start - own > STREAM_WAIT))
    if not len(waited):
        return empty, empty
    by_end = np.lexsort((end, step))
    end_step, end_at = step[by_end], end[by_end]
    followed: dict[int, dict[int, int]] = {}  # v op -> {u op: steps it followed u}
    times_waited: dict[int, int] = {}
    for i in waited.tolist():
        v = int(op_id[i])
        times_waited[v] = times_waited.get(v, 0) + 1
        a = int(np.searchsorted(end_step, step[i], side="left"))
        b = int(np.searchsorted(end_step, step[i], side="right"))
        hi = a + int(np.searchsorted(end_at[a:b], start[i], side="right"))
        for j in range(hi - 1, a - 1, -1):
            u = by_end[j]
            if end[u] < start[i] - STREAM_TIGHT:
                break
            if lane[u] != lane[i] and start[u] < start[i]:
                counts = followed.setdefault(v, {})
                counts[int(op_id[u])] = counts.get(int(op_id[u]), 0) + 1
                break
    pairs = []
    for v, counts in followed.items():
        u, n = max(counts.items(), key=lambda item: (item[1], -item[0]))
        if 2 * n >= times_waited[v]:
            pairs.append((u, v))
    if not pairs:
        return empty, empty
    src = np.array([u for u, _ in pairs], dtype=np.int64)
    dst = np.array([v for _, v in pairs], dtype=np.int64)
    # an edge some step contradicts (v started before u ended there) is not kept
    involved = unique(np.concatenate([src, dst]))
    slot = np.full(int(op_id.max()) + 1, -1, dtype=np.int64)
    slot[involved] = np.arange(len(involved))
    mine = slot[op_id] >= 0
    steps, step_of = np.unique(step, return_inverse=True)
    first_start = np.full((len(involved), len(steps)), np.iinfo(np.int64).max, dtype=np.int64)
    last_end = np.full((len(involved), len(steps)), -1, dtype=np.int64)
    at = (slot[op_id[mine]], step_of[mine])
    np.minimum.at(first_start, at, start[mine])
    np.maximum.at(last_end, at, end[mine])
    u, v = slot[src], slot[dst]
    both = (last_end[u] >= 0) & (last_end[v] >= 0)
    after = (last_end[u] <= first_start[v]) & (first_start[u] < first_start[v])
    held = np.where(both, after, True).all(axis=1)
    return src[held], dst[held]


def thread_start_edges(
    comp: np.ndarray,
    o_step: np.ndarray,
    o_lane: np.ndarray,
    start: np.ndarray,
    is_cpu: np.ndarray,
    main: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Edges main-thread op -> the first op of each other CPU thread in a step.

    A thread other than the one running the steps does nothing until it is handed
    work: PyTorch's autograd engine thread starts the backward pass once the main
    thread's ``backward()`` has seeded the gradient (``aten::ones_like``). Without the
    edge the first backward op of a step waited from the step's start, for as long as
    the forward pass took in the other steps (HTA ``ns_resolution_trace``: 14.4 ms in
    its first step, 38.3 ms in the others). The source is the main thread's op that
    started last before it (`start` of the compute occurrences, sorted by step, lane,
    start; `main` is the main thread's lane code, -1 for none).
    """
    empty = np.zeros(0, dtype=np.int64)
    if main < 0 or not len(comp):
        return empty, empty, empty
    first = np.ones(len(comp), dtype=bool)
    first[1:] = (o_step[1:] != o_step[:-1]) | (o_lane[1:] != o_lane[:-1])
    heads = np.flatnonzero(first & is_cpu & (o_lane != main))
    on_main = np.flatnonzero(o_lane == main)  # sorted by step, then start
    key_step, key_start = o_step[on_main], start[on_main]
    src, dst, tag = [], [], []
    for v in heads.tolist():
        a = int(np.searchsorted(key_step, o_step[v], side="left"))
        b = int(np.searchsorted(key_step, o_step[v], side="right"))
        j = a + int(np.searchsorted(key_start[a:b], start[v], side="left")) - 1
        if j >= a:
            src.append(int(comp[on_main[j]]))
            dst.append(int(comp[v]))
            tag.append(int(o_step[v]))
    return (
        np.array(src, dtype=np.int64),
        np.array(dst, dtype=np.int64),
        np.array(tag, dtype=np.int64),
    )


def thread_join_edges(
    comp: np.ndarray,
    o_step: np.ndarray,
    o_lane: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    is_cpu: np.ndarray,
    main: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Edges the last op of each other CPU thread in a step -> the main thread's first
    op after it, where the main thread sat idle when it ended.

    The join of `thread_start_edges`: ``backward()`` returns to the main thread once
    autograd's engine thread has run the last backward op. Without the edge the
    optimizer waited as long after ``ones_like`` as the backward took in the other
    steps (`param/linear_kineto`: 34 ms in iteration 10; its iterations run from 18 to
    48 ms). A thread that ends while the main thread is busy is not waited for.
    """
    src, dst, tag = [], [], []
    if main >= 0 and len(comp):
        on_main = np.flatnonzero(o_lane == main)  # sorted by step, as are `others`
        others = np.flatnonzero(is_cpu & (o_lane != main))
        main_step, other_step = o_step[on_main], o_step[others]
        for step in unique(other_step).tolist():
            lo, hi = np.searchsorted(main_step, [step, step + 1])
            mine = on_main[lo:hi]
            if not len(mine):
                continue
            lo, hi = np.searchsorted(other_step, [step, step + 1])
            theirs = others[lo:hi]
            for lane in unique(o_lane[theirs]).tolist():
                lane_ops = theirs[o_lane[theirs] == lane]
                u = int(lane_ops[np.argmax(end[lane_ops])])
                after = mine[start[mine] >= end[u]]
                if not len(after):
                    continue
                v = int(after[np.argmin(start[after])])
                before = mine[start[mine] < start[v]]
                if end[before].max(initial=np.iinfo(np.int64).min) <= end[u]:
                    src.append(int(comp[u]))
                    dst.append(int(comp[v]))
                    tag.append(int(step))
    return (
        np.array(src, dtype=np.int64),
        np.array(dst, dtype=np.int64),
        np.array(tag, dtype=np.int64),
    )


def merge_edges(model: RankModel, reference: int) -> list[tuple[str, str, str]]:
    """Reference step's edges, plus edges of ops it lacks from the first step that has them."""
    names = model.op_names
    empty = np.zeros(0, dtype=np.int64)
    ref_src, ref_dst = model.edges_by_step.get(reference, (empty, empty))
    src, dst = [ref_src], [ref_dst]
    covered = np.zeros(len(names), dtype=bool)
    covered[ref_src] = True
    covered[ref_dst] = True
    for step in sorted(model.edges_by_step):
        if step == reference:
            continue
        s, d = model.edges_by_step[step]
        extra = ~covered[s] | ~covered[d]
        if not extra.any():  # the common case: every step repeats the reference's ops
            continue
        s, d = s[extra], d[extra]
        if is_acyclic(np.concatenate([*src, s]), np.concatenate([*dst, d]), len(names)):
            src.append(s)
            dst.append(d)
            covered[s] = True
            covered[d] = True
        else:
            model.notes.append(
                f"{model.rank}: step {step} orders some ops differently; "
                "its extra edges are dropped"
            )
    return [
        (names[u], names[v], "control")
        for u, v in zip(np.concatenate(src).tolist(), np.concatenate(dst).tolist(), strict=True)
    ]


def reference_step(model: RankModel, et_step: int | None = None) -> int:
    """The step whose edges define the DAG: the ET step, else the one with most ops."""
    if et_step is not None and et_step in model.edges_by_step:
        return et_step
    steps, counts = np.unique(model.occurrences.iteration, return_counts=True)
    return int(steps[np.argmax(counts)])


def step_edges(
    op_id: np.ndarray,
    n_comp: int,
    o_step: np.ndarray,
    o_lane: np.ndarray,
    o_phase: np.ndarray,
    start: np.ndarray,
    gpu_launcher: np.ndarray,
    collectives: tuple[np.ndarray, ...],
    ts: np.ndarray,
    lane_of_row: np.ndarray,
    op_at_row: np.ndarray,
    is_cpu: np.ndarray | None = None,
    main: int = -1,
    enqueued: tuple[np.ndarray, np.ndarray] | None = None,
    end: np.ndarray | None = None,
    c_device: np.ndarray | None = None,
) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Step -> (src op ids, dst op ids): lane order, then launches, then collectives,
    then the threads' starts (and joins, given the occurrences' `end`), then the device
    work each collective was enqueued after (`enqueued`: per compute occurrence the
    time its launch was called, -1 for none, and per collective the time it was called).
    `c_device` says which collectives ran on the device: their waiters are kernels, and
    only they wait for the device work enqueued before their call.

    `o_*` describe the compute occurrences (sorted by step, lane, start, row),
    `gpu_launcher` the launching op id of each compute occurrence (-1: none),
    `collectives` (step, end, launcher row) of the collective occurrences, `is_cpu`
    which compute occurrences are CPU ops and `main` the main thread's lane code.
    """
    same = (o_step[1:] == o_step[:-1]) & (o_lane[1:] == o_lane[:-1])
    comp = op_id[:n_comp]
    src, dst, tag = [comp[:-1][same]], [comp[1:][same]], [o_step[1:][same]]
    hit = gpu_launcher >= 0
    src.append(gpu_launcher[hit])
    dst.append(comp[hit])
    tag.append(o_step[hit])
    c_step, c_end, c_launcher = collectives
    if len(c_step):
        c_src, c_dst, c_tag = collective_edges(
            op_id, n_comp, o_step, o_lane, start[:n_comp], o_phase, ts, c_step, c_end,
            c_launcher, lane_of_row, op_at_row, enqueued[0] if enqueued is not None else None,
            c_device,
        )  # fmt: skip
        src.append(c_src)
        dst.append(c_dst)
        tag.append(c_tag)
    if is_cpu is not None:
        t_src, t_dst, t_tag = thread_start_edges(comp, o_step, o_lane, start[:n_comp], is_cpu, main)
        src.append(t_src)
        dst.append(t_dst)
        tag.append(t_tag)
        if end is not None:
            j_src, j_dst, j_tag = thread_join_edges(
                comp, o_step, o_lane, start[:n_comp], end[:n_comp], is_cpu, main
            )
            src.append(j_src)
            dst.append(j_dst)
            tag.append(j_tag)
    if enqueued is not None and len(c_step):
        launched, called = enqueued
        if c_device is not None:  # a collective known by its CPU call alone waits for no kernel
            called = np.where(c_device, called, -1)
        e_src, e_dst, e_tag = enqueue_edges(comp, o_step, launched, op_id[n_comp:], c_step, called)
        src.append(e_src)
        dst.append(e_dst)
        tag.append(e_tag)
    all_src, all_dst, all_tag = np.concatenate(src), np.concatenate(dst), np.concatenate(tag)
    order = np.argsort(all_tag, kind="stable")
    all_src, all_dst, all_tag = all_src[order], all_dst[order], all_tag[order]
    steps = unique(np.concatenate([o_step, c_step]))
    cut = np.searchsorted(all_tag, steps)
    cut_end = np.searchsorted(all_tag, steps, side="right")
    return {
        int(s): (all_src[a:b], all_dst[a:b]) for s, a, b in zip(steps, cut, cut_end, strict=True)
    }

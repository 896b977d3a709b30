"""`planner.prediction._simkernel`'s list-scheduling loop for Python lists: the same
schedules from the same arrays and draws, without numba.

`python_list_schedule` is written for numba (numpy arrays read one element at a time,
heaps kept by hand); run by the interpreter, each element read costs a numpy scalar, and
a dispatch takes 5-10 µs. Here the arrays are Python lists and ints, the heaps Python's
`heapq`, and a dispatch takes 1-2 µs, so that a job of a few hundred thousand dispatches
(the demo, a small DDP job) finishes before numba would have loaded (0.5-0.8 s).

Identical results: every choice of the loop is fixed by the order it keeps, not by how
the order is stored. A resource picks from its lowest-numbered bucket (a min-heap of
bucket numbers has one minimum however it is laid out); its candidates are that bucket's
items then the unprioritized ones, in insertion order with a taken item replaced by the
last (as there); ends complete by (time, op), one key per op (a heap pops them in that
order whatever its layout); the touched resources pick in the order first touched; a draw
``int(u * k)`` is the same float64 product in both.
"""

from __future__ import annotations

from heapq import heappop, heappush

import numpy as np


def list_schedule(
    dur: np.ndarray,
    succ_ptr: np.ndarray,
    succ_idx: np.ndarray,
    indeg0: np.ndarray,
    res: np.ndarray,
    cap: np.ndarray,
    bucket: np.ndarray,
    bstart: np.ndarray,
    hstart: np.ndarray,
    ustart: np.ndarray,
    lstart: np.ndarray,
    rand: np.ndarray,
    record: bool,
    out_start: np.ndarray,
    out_lane: np.ndarray,
    makespan: np.ndarray,
    done_out: np.ndarray,
    budget: int | None = None,
) -> tuple[bool, int]:
    """`_simkernel.python_list_schedule`, same arguments and outputs (the segment starts
    `bstart`, `hstart`, `ustart`, `lstart` only give the bucket count here): (whether
    every row is done, the dispatches run).

    A sample draws only where a resource picks among several ready ops; where the first
    sample never did, every row follows its very path (the draws of a pick among one are
    never read), and its results fill them all: a GPU stream runs its ops in one order.
    Otherwise the other rows run too, unless they take more than `budget` dispatches:
    then they are left for the caller (False)."""
    rows, n = rand.shape[0], dur.shape[0]
    if rows == 0:
        return True, 0
    ptr = succ_ptr.tolist()
    targets = succ_idx.tolist()
    graph = (
        dur.tolist(),
        [targets[ptr[i] : ptr[i + 1]] for i in range(n)],
        indeg0.tolist(),
        res.tolist(),
        cap.tolist(),
        bucket.tolist(),
        max(len(bstart) - 1, 0),
    )
    for s in range(rows):
        span, done, start, lane, chose = _sample(graph, rand[s].tolist(), record)
        makespan[s], done_out[s] = span, done
        if record:
            ran = np.fromiter((i for i, t in enumerate(start) if t >= 0), np.int64)
            out_start[s, ran] = np.asarray(start, np.int64)[ran]
            out_lane[s, ran] = np.asarray(lane, np.int64)[ran]
        if s > 0:
            continue
        if not chose:
            makespan[1:], done_out[1:] = span, done
            if record:
                out_start[1:], out_lane[1:] = out_start[0], out_lane[0]
            return True, n
        if budget is not None and rows * n > budget:
            return False, n
    return True, rows * n


def _sample(
    graph: tuple, row: list[float], record: bool
) -> tuple[int, int, list[int], list[int], bool]:
    """One sample on its row of draws: (makespan, ops run, start per op or -1 if not run
    (with `record`), lane per op, whether it drew: a resource picked among several)."""
    dur, succ, indeg0, res, cap, bucket, n_buckets = graph
    n = len(dur)
    indeg = indeg0.copy()
    items, heads, free, lanes, busy = _working(cap, n_buckets)
    lane_of, start = [0] * n, [-1] * n
    ends: list[int] = []  # end * n + op: by time, then op
    ready = [i for i in range(n) if indeg[i] == 0]
    touched: dict[int, None] = {}  # the resources to pick at t, in the order touched
    t = kr = done = 0
    chose = False
    while True:
        for i in ready:
            r = res[i]
            b = bucket[i]
            if b >= 0:
                held = items[b]
                held.append(i)
                if len(held) == 1:
                    heappush(heads[r], b)
            else:
                free[r].append(i)
            touched[r] = None
        for r in touched:
            head, waiting, channels = heads[r], free[r], cap[r]
            while busy[r] < channels:
                bc = 0
                if head:
                    held = items[head[0]]
                    bc = len(held)
                k = bc + len(waiting)
                if k == 0:
                    break
                j = 0  # the draw of a pick among one is never read
                if k > 1:
                    chose = True
                    j = int(row[kr] * k)
                    if j >= k:
                        j = k - 1
                kr += 1
                if j < bc:
                    i = held[j]
                    last = held.pop()
                    if j < bc - 1:
                        held[j] = last
                    if bc == 1:
                        heappop(head)
                else:
                    j -= bc
                    i = waiting[j]
                    last = waiting.pop()
                    if j < len(waiting):
                        waiting[j] = last
                busy[r] += 1
                lane_of[i] = lanes[r].pop()
                if record:
                    start[i] = t
                heappush(ends, (t + dur[i]) * n + i)
        if not ends:
            break
        touched = {}
        ready = []
        t = ends[0] // n
        first = t * n
        while ends and ends[0] - first < n:
            i = heappop(ends) - first
            done += 1
            r = res[i]
            busy[r] -= 1
            lanes[r].append(lane_of[i])
            touched[r] = None
            for v in succ[i]:
                indeg[v] -= 1
                if indeg[v] == 0:
                    ready.append(v)
    return t, done, start, lane_of, chose


def _working(cap: list[int], n_buckets: int) -> tuple[list, ...]:
    """A sample's working lists: per bucket its ready ops; per resource the min-heap of
    its non-empty buckets, its unprioritized ready ops, its free lanes (lane 0 on top)
    and its busy channels."""
    return (
        [[] for _ in range(n_buckets)],
        [[] for _ in cap],
        [[] for _ in cap],
        [list(range(c - 1, -1, -1)) for c in cap],
        [0] * len(cap),
    )

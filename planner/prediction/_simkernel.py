"""The list-scheduling loop of `planner.prediction.event_loop`, over plain integer arrays.

One function, `python_list_schedule` (with the helpers it calls, `_HELPERS`), is the
whole discrete-event loop, written for numba, which compiles it when numba is installed
(``pip install numba``) and the work is large enough to pay for loading numba
(`list_schedule` picks). Smaller work runs `planner.prediction._pyloop`, the same loop
over Python lists (about 1.4 µs a dispatch: 5x the interpreted form of this one, 50x
slower than numba's); all three return identical schedules from the same arrays and
random draws. Set ``PLANNER_NO_NUMBA=1`` to force the Python loop.

Per resource the ready ops sit in buckets, one per priority number (a min-heap of
bucket ids per resource gives the lowest number) plus one bucket of unprioritized
ops. A free resource draws uniformly among the lowest-numbered bucket and the
unprioritized ops (TicTac §3.1), consuming exactly one uniform draw per dispatch, so
a sample is fixed by its row of draws. All completions at an instant are processed
before any resource picks, so an op that becomes ready at t competes at t.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from importlib.util import find_spec
from typing import Any

import numpy as np

from planner.prediction import _pyloop


def python_list_schedule(
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
) -> None:
    """Simulate one sample per row of `rand`; write makespans (and starts if `record`).

    dur: int64 ticks per op; succ_ptr/succ_idx: CSR successors; indeg0: in-degrees;
    res: resource id per op; cap: channels per resource; bucket: priority bucket per op
    (-1 = unprioritized), buckets sorted by (resource, priority); bstart/hstart/ustart/
    lstart: segment starts of buckets, per-resource bucket heaps, unprioritized lists
    and lanes. done_out[s] < n means a cycle left ops unrun.

    A sample reads a draw only where a resource picks among several ready ops: where
    the first never did, every row follows its very path, and its results fill them all
    (a GPU stream runs its ops in one order).
    """
    for s in range(rand.shape[0]):
        makespan[s], done_out[s], drew = _sample(
            dur, succ_ptr, succ_idx, indeg0, res, cap, bucket, bstart, hstart, ustart, lstart,
            rand, s, record, out_start, out_lane,
        )  # fmt: skip
        if s == 0 and not drew:
            for r in range(1, rand.shape[0]):
                makespan[r] = makespan[0]
                done_out[r] = done_out[0]
                if record:
                    out_start[r, :] = out_start[0, :]
                    out_lane[r, :] = out_lane[0, :]
            return


def _sample(
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
    s: int,
    record: bool,
    out_start: np.ndarray,
    out_lane: np.ndarray,
) -> tuple[int, int, bool]:
    """Sample `s` of `python_list_schedule` (its row of `rand`): (makespan, ops run,
    whether it drew: a resource picked among several ready ops).

    (speed) One loop: the phases of an instant (the ready ops join their buckets, the
    touched resources pick, the next completions) stay in it, for numba compiles the
    loop 1.5-5x slower with any of them made a function of its own."""
    indeg, bitems, bcount, bheap, hsize, uitems, ucount, busy, lane_of, et, eo = _sample_arrays(
        dur.shape[0], cap.shape[0], bstart.shape[0] - 1, indeg0
    )
    lanes, ltop = _lane_stacks(cap, lstart)
    ready, nready = _roots(indeg)
    dirty = np.zeros(cap.shape[0], np.bool_)
    dlist = np.empty(cap.shape[0], np.int64)
    t, kr, done, esize, nd = 0, 0, 0, 0, 0
    drew = False
    while True:
        # newly ready ops join their resource's bucket
        for q in range(nready):
            i = ready[q]
            r = res[i]
            b = bucket[i]
            if b >= 0:
                bitems[bstart[b] + bcount[b]] = i
                bcount[b] += 1
                if bcount[b] == 1:
                    _bucket_push(bheap, hstart[r], hsize[r], b)
                    hsize[r] += 1
            else:
                uitems[ustart[r] + ucount[r]] = i
                ucount[r] += 1
            nd = _touch(r, dirty, dlist, nd)
        nready = 0
        # every touched resource with a free channel picks
        for q in range(nd):
            r = dlist[q]
            dirty[r] = False
            while busy[r] < cap[r]:
                bc = 0
                b = -1
                if hsize[r] > 0:
                    b = bheap[hstart[r]]
                    bc = bcount[b]
                k = bc + ucount[r]
                if k == 0:
                    break
                if k > 1:
                    drew = True
                j = int(rand[s, kr] * k)
                kr += 1
                if j >= k:
                    j = k - 1
                if j < bc:
                    pos = bstart[b] + j
                    i = bitems[pos]
                    bitems[pos] = bitems[bstart[b] + bc - 1]
                    bcount[b] = bc - 1
                    if bc == 1:
                        hsize[r] -= 1
                        _bucket_pop(bheap, hstart[r], hsize[r])
                else:
                    pos = ustart[r] + j - bc
                    i = uitems[pos]
                    ucount[r] -= 1
                    uitems[pos] = uitems[ustart[r] + ucount[r]]
                busy[r] += 1
                ltop[r] -= 1
                lane = lanes[lstart[r] + ltop[r]]
                lane_of[i] = lane
                if record:
                    out_start[s, i] = t
                    out_lane[s, i] = lane
                _event_push(et, eo, esize, t + dur[i], i)
                esize += 1
        nd = 0
        if esize == 0:
            break
        # all completions at the next instant
        t = et[0]
        while esize > 0 and et[0] == t:
            esize -= 1
            i = _event_pop(et, eo, esize)
            done += 1
            r = res[i]
            busy[r] -= 1
            lanes[lstart[r] + ltop[r]] = lane_of[i]
            ltop[r] += 1
            nd = _touch(r, dirty, dlist, nd)
            for e in range(succ_ptr[i], succ_ptr[i + 1]):
                v = succ_idx[e]
                indeg[v] -= 1
                if indeg[v] == 0:
                    ready[nready] = v
                    nready += 1
    return t, done, drew


def _sample_arrays(
    n: int, n_res: int, n_buckets: int, indeg0: np.ndarray
) -> tuple[np.ndarray, ...]:
    """A sample's working arrays: in-degrees left, bucket items, counts and per-resource
    bucket heaps (with their sizes), unprioritized items and counts, busy channels per
    resource, each op's lane, and the event heap (end times, ops)."""
    return (
        indeg0.copy(),
        np.empty(n, np.int64),
        np.zeros(max(n_buckets, 1), np.int64),
        np.empty(max(n_buckets, 1), np.int64),
        np.zeros(n_res, np.int64),
        np.empty(n, np.int64),
        np.zeros(n_res, np.int64),
        np.zeros(n_res, np.int64),
        np.zeros(n, np.int64),
        np.empty(n, np.int64),
        np.empty(n, np.int64),
    )


def _lane_stacks(cap: np.ndarray, lstart: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(per resource a stack of its free lanes, lane 0 on top; the stack's height)."""
    n_res = cap.shape[0]
    lanes = np.empty(max(lstart[n_res], 1), np.int64)
    ltop = np.zeros(n_res, np.int64)
    for r in range(n_res):
        for k in range(cap[r]):
            lanes[lstart[r] + k] = cap[r] - 1 - k
        ltop[r] = cap[r]
    return lanes, ltop


def _roots(indeg: np.ndarray) -> tuple[np.ndarray, int]:
    """(the ready list, room for every op, holding the ops without predecessors; their
    count)."""
    n = indeg.shape[0]
    ready = np.empty(n, np.int64)
    nready = 0
    for i in range(n):
        if indeg[i] == 0:
            ready[nready] = i
            nready += 1
    return ready, nready


def _touch(r: int, dirty: np.ndarray, dlist: np.ndarray, nd: int) -> int:
    """Mark resource `r` to pick at this instant (once); the new count of marked ones."""
    if dirty[r]:
        return nd
    dirty[r] = True
    dlist[nd] = r
    return nd + 1


def _bucket_push(bheap: np.ndarray, base: int, size: int, b: int) -> None:
    """Bucket `b` into the min-heap of `size` buckets at `base` of `bheap`."""
    pos = size
    while pos > 0:
        parent = (pos - 1) >> 1
        if bheap[base + parent] <= b:
            break
        bheap[base + pos] = bheap[base + parent]
        pos = parent
    bheap[base + pos] = b


def _bucket_pop(bheap: np.ndarray, base: int, size: int) -> None:
    """The top bucket out of the min-heap at `base` of `bheap`, which keeps `size`."""
    last = bheap[base + size]
    pos = 0
    while True:
        c = 2 * pos + 1
        if c >= size:
            break
        if c + 1 < size and bheap[base + c + 1] < bheap[base + c]:
            c += 1
        if bheap[base + c] >= last:
            break
        bheap[base + pos] = bheap[base + c]
        pos = c
    if size > 0:
        bheap[base + pos] = last


def _event_push(et: np.ndarray, eo: np.ndarray, size: int, ft: int, i: int) -> None:
    """Op `i`'s end `ft` into the event heap of `size` entries, by (time, op)."""
    pos = size
    while pos > 0:
        parent = (pos - 1) >> 1
        pt = et[parent]
        po = eo[parent]
        if pt < ft or (pt == ft and po < i):
            break
        et[pos] = pt
        eo[pos] = po
        pos = parent
    et[pos] = ft
    eo[pos] = i


def _event_pop(et: np.ndarray, eo: np.ndarray, size: int) -> int:
    """The op of the event heap's first entry, taken out (the heap keeps `size`)."""
    i = eo[0]
    lt = et[size]
    lo = eo[size]
    pos = 0
    while True:
        c = 2 * pos + 1
        if c >= size:
            break
        if c + 1 < size and (et[c + 1] < et[c] or (et[c + 1] == et[c] and eo[c + 1] < eo[c])):
            c += 1
        if lt < et[c] or (lt == et[c] and lo < eo[c]):
            break
        et[pos] = et[c]
        eo[pos] = eo[c]
        pos = c
    if size > 0:
        et[pos] = lt
        eo[pos] = lo
    return i


_HELPERS = (
    _sample, _sample_arrays, _lane_stacks, _roots, _touch, _bucket_push, _bucket_pop,
    _event_push, _event_pop,
)  # fmt: skip
"""The functions `python_list_schedule` calls: numba compiles them into it
(`numba.extending.register_jitable`, registered in `compiled`), and they run as plain
Python in the Python loop."""


ACCELERATED = not os.environ.get("PLANNER_NO_NUMBA") and find_spec("numba") is not None
"""Whether the compiled loop is available (numba installed, not disabled); numba itself is
imported only when the loop is first compiled."""

SMALL_WORK = 400_000
"""Op dispatches (ops x samples run, summed over the calls of a process) run by the Python
loop before numba is loaded. Importing numba and loading its cached machine code costs about
0.6 s of CPU and 110 MiB per process, the time of about 450,000 dispatches of the Python
loop (`_pyloop`, 1.4 µs each), so that the demo and small jobs (a 2-rank DDP job of 600
ops a rank: 200,000 a rank) never load numba, and larger work pays at most twice the
better choice's time."""

REPLAYS_PER_SAMPLE = 4
"""A rank's replay and plan comparison dispatch about this many times samples x ops
(the demo: 4.1, a rank of `traces/torch/resnet_ddp`: 3.3): `loads_compiled`'s estimate."""

_state: dict[str, Any] = {"python_work": 0, "compiled": None}


def compiled() -> Callable[..., None]:
    """The numba-compiled loop (compiled, or loaded from numba's cache, on first use)."""
    if _state["compiled"] is None:
        import numba
        from numba.extending import register_jitable

        for helper in _HELPERS:  # callable from the compiled loop, still plain Python here
            register_jitable(inline="always")(helper)
        _state["compiled"] = numba.njit(cache=True, nogil=True)(python_list_schedule)
    return _state["compiled"]


def loads_compiled(ops: int, samples: int) -> bool:
    """Whether replaying and comparing one rank of `ops` ops at `samples` samples is
    expected to pass SMALL_WORK in a process, and so to load numba (where installed), if
    its samples draw (a rank whose first samples never do runs one sample a call)."""
    return ACCELERATED and REPLAYS_PER_SAMPLE * ops * samples > SMALL_WORK


def list_schedule(*args: Any) -> None:
    """`python_list_schedule` on the same arguments, run by the loop that finishes first:
    numba once loaded; before, the Python loop (`_pyloop`), whose first sample stands for
    all where it never drew, while this process's dispatches stay under SMALL_WORK; then
    numba (loaded then)."""
    if _state["compiled"] is not None:
        compiled()(*args)
        return
    budget = max(SMALL_WORK - _state["python_work"], 0) if ACCELERATED else None
    finished, work = _pyloop.list_schedule(*args, budget=budget)
    _state["python_work"] += work
    if not finished:  # every row again: the first costs numba next to nothing
        compiled()(*args)


def dispatched() -> int:
    """The dispatches this process's Python loop has run (`load_ahead` reads them)."""
    return _state["python_work"]


def load_ahead(work: int, replays: int) -> None:
    """Load the compiled loop now where `replays` more replays like the one just run (`work`
    dispatches of the Python loop) would pass SMALL_WORK: a process handed many ranks
    loads it once after the first, instead of running the Python loop for them all (a
    rank whose samples never draw never needs more than the Python loop itself)."""
    if ACCELERATED and _state["compiled"] is None and work * replays > SMALL_WORK:
        warm()


def warm() -> None:
    """Load the compiled loop now (numba's import and its cached machine code, about
    0.5 s), in a worker that waits anyway, before the replays that need it; nothing
    without numba. A one-op graph, one sample: the argument types of `simulate`'s calls
    (its random rows are read-only), so that numba loads that machine code."""
    if not ACCELERATED:
        return
    one, zero = np.ones(1, np.int64), np.zeros(1, np.int64)
    rand = np.zeros((1, 1))
    rand.setflags(write=False)
    compiled()(
        one, np.array([0, 0]), np.zeros(0, np.int64), zero, zero, one, np.array([-1]),
        np.array([0, 0]), np.array([0, 0]), np.array([0, 0]), np.array([0, 1]), rand, False,
        np.zeros((1, 1), np.int64), np.zeros((1, 1), np.int64), zero.copy(), zero.copy(),
    )  # fmt: skip

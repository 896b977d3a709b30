"""How much of each collective of one rank the rank's compute hid, from its events.

A collective is exposed while the rank computes nothing: on a GPU rank, while no compute
kernel runs (memcpy, memset and the collectives' own kernels are no compute); on a CPU
rank, while no innermost CPU op runs on a thread that computes. The innermost ops, not
the outermost: a synchronous collective's wait (``work.wait()``, which records nothing)
happens inside an outer op (an autograd Function's range, FSDP's pre-forward) that
would otherwise hide it. The c10d ops only enqueue or wait, and the communication
backend's worker threads (``pt_gloo_runloop``) only communicate: neither computes.
The gaps between innermost ops (Python between two ops) count as exposed.
"""

from __future__ import annotations

import numpy as np

from planner.ingest.kineto_comms import BACKEND
from planner.ingest.kineto_events import CPU_OP_CATS, RankEvents
from planner.model.arrays import covered, merged, unique


def busy(
    ev: RankEvents, is_gpu: np.ndarray, comm_rows: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The disjoint intervals (ns) in which the rank computed: its GPU compute kernels
    on a GPU rank, else its innermost CPU ops (the module's docstring)."""
    names = ev.names
    if is_gpu.any():
        rows = is_gpu.copy()
        rows[comm_rows] = False
        rows &= ~ev.name_flags(lambda n: n[:6].lower() in ("memcpy", "memset"))
        rows &= ev.cat_flags({"kernel"})
        picked = np.flatnonzero(rows)
        return merged(ev.ts[picked], ev.end[picked])
    backend = ev.name_flags(BACKEND.match)
    workers = np.zeros(int(ev.lane.max()) + 1 if len(ev) else 0, dtype=bool)
    workers[unique(ev.lane[backend])] = True
    cpu = ev.cat_flags(CPU_OP_CATS) & ~workers[ev.lane]
    rows = np.flatnonzero(cpu)
    if not len(rows):
        return rows, rows
    rows = rows[_by_thread_then_time(ev.lane[rows], ev.ts[rows], ev.end[rows])]
    same = np.concatenate([ev.lane[rows][1:] == ev.lane[rows][:-1], [False]])
    nested = np.concatenate([ev.ts[rows][1:] < ev.end[rows][:-1], [False]])
    leaf = rows[~(same & nested)]  # nothing starts inside it on its thread
    c10d = np.fromiter((n.startswith("c10d::") for n in names), bool, len(names))
    leaf = leaf[~c10d[ev.name_code[leaf]]]
    return merged(ev.ts[leaf], ev.end[leaf])


def _by_thread_then_time(lane: np.ndarray, ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """``np.lexsort((-end, ts, lane))``: by thread, then start, the longer first. (speed)
    One stable sort of a key that packs thread and start (the events come nearly in that
    order already, which the sort runs through); the lexsort where two share both, or
    where the key would not fit in int64."""
    if len(ts):
        first = int(ts.min())
        span = int(ts.max()) - first + 1
        if int(lane.min()) >= 0 and (int(lane.max()) + 1) * span < 1 << 62:
            key = lane.astype(np.int64) * span + (ts - first)
            order = np.argsort(key, kind="stable")
            packed = key[order]
            if not (packed[1:] == packed[:-1]).any():
                return order
    return np.lexsort((-end, ts, lane))


def exposed(
    start: np.ndarray, end: np.ndarray, intervals: tuple[np.ndarray, np.ndarray]
) -> np.ndarray:
    """Per collective [start, end): the ns of it outside the compute `intervals`."""
    return (np.asarray(end) - np.asarray(start)) - covered(start, end, intervals)


def in_flight(
    ev: RankEvents,
    calls: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    intervals: tuple[np.ndarray, np.ndarray],
    from_call: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per collective its compute ns while in flight, whether it was issued ahead and
    the ns from its issue to its start (its backend record's or kernel's).

    In flight: from its issue (with `from_call`, its c10d call's start, where `calls`
    names one before the backend record starts; else `start`) to its `end`; the
    compute: the `intervals` (`busy`) in it, at most the collective's own time
    (`end - start`), so that the share of a collective's time the rank computed beside
    it stays a share. Issued
    ahead: its call lies inside a range whose name holds ``prefetch`` on the call's
    thread (FSDP1's ``_pre_forward_prefetch``, FSDP2's ``FSDP::backward_prefetch``):
    released before the rank needed it, so the rank could have computed meanwhile."""
    calls = np.asarray(calls, dtype=np.int64)
    start, end = np.asarray(start, dtype=np.int64), np.asarray(end, dtype=np.int64)
    issued = np.where(calls >= 0, np.minimum(ev.ts[np.maximum(calls, 0)], start), start)
    issued = issued if from_call else start
    computed = np.minimum(covered(issued, end, intervals), end - start)
    ranges = np.flatnonzero(ev.name_flags(lambda n: "prefetch" in n.lower()))
    ahead = np.zeros(len(calls), dtype=bool)
    for lane in unique(ev.lane[ranges]).tolist():
        mine = ranges[ev.lane[ranges] == lane]
        mine = mine[np.argsort(ev.ts[mine], kind="stable")]
        reach = np.maximum.accumulate(ev.end[mine])  # the latest end of a range begun by then
        k = np.flatnonzero((calls >= 0) & (ev.lane[np.maximum(calls, 0)] == lane))
        t = ev.ts[calls[k]]
        j = np.searchsorted(ev.ts[mine], t, side="right") - 1
        ahead[k] = (j >= 0) & (reach[np.maximum(j, 0)] > t)
    return computed, ahead, start - issued

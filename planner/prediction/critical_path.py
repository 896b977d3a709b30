"""The critical path of a step as it ran and as it replayed, and the cause of a miss in
words (`_cause`): which op's wait, off from its typical one, moved the step's end. Apart
because it only reads a step model and its replayed times, to explain an error the replay
measured."""

from __future__ import annotations

import numpy as np

from planner.prediction.compiled import sorted_unique
from planner.prediction.step_model import StepModel


def critical_waits(model: StepModel, start: np.ndarray, end: np.ndarray, last: int) -> np.ndarray:
    """Per op of the step's n ops: whether its wait (overhead op n + i) lies on the
    critical path that ends at op `last`, given `start`/`end` (ticks or ns, -1 unknown)
    of every op of `model.compiled`. Walked back from `last`: at each op, the
    predecessor that ended exactly when it started (an edge that held it), else the op
    of the same resource that did (a busy thread or channel); the walk stops where
    neither exists (the step's start, an op whose time is unknown)."""
    return _waits_on_path(held_by(model, start, end), start, last, len(model.overhead))


def held_by(model: StepModel, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per op of `model.compiled`, the op that held it (`critical_waits`' step back;
    -1: none). (speed) Fixed by the times alone: found once for every op, and shared by
    the walks from different ends (a GPU rank's device step and its CPU range)."""
    c = model.compiled
    # the held predecessor: the first edge into the op, in the graph's edge order, whose
    # source ended as the op started
    after = np.full(len(c.names), -1, dtype=np.int64)
    held = np.flatnonzero(end[c.src] == start[c.dst])
    took, first = np.unique(c.dst[held], return_index=True)
    after[took] = c.src[held[first]]
    # else the op of the same resource that ended as it started: the last of its run, by
    # (resource, end, index) as a dict would keep; (resource, end) as one sortable key
    known = np.flatnonzero(end >= 0)
    ends = sorted_unique(end[known])
    key_of = np.int64(len(ends) + 1)
    by_end = known[np.lexsort((known, end[known], c.res[known]))]
    keys = c.res[by_end] * key_of + np.searchsorted(ends, end[by_end])
    free = np.flatnonzero(after < 0)
    at = np.searchsorted(ends, start[free])
    exact = at < len(ends)
    exact[exact] = ends[at[exact]] == start[free[exact]]
    free, at = free[exact], at[exact]
    query = c.res[free] * key_of + at
    k = np.searchsorted(keys, query, "right") - 1
    hit = (k >= 0) & (keys[np.maximum(k, 0)] == query)
    after[free[hit]] = by_end[k[hit]]
    return after


def _waits_on_path(after: np.ndarray, start: np.ndarray, last: int, n: int) -> np.ndarray:
    """Per op of the step's n ops: whether its wait is on the walk from `last`."""
    waits = _walk(after, start > 0, last)
    on = np.zeros(n, dtype=bool)
    on[waits[(waits >= n) & (waits < 2 * n)] - n] = True
    return on


def _walk(after: np.ndarray, open_: np.ndarray, last: int) -> np.ndarray:
    """The ops from `last` on, each followed by ``after[op]``, up to (not with) the first
    that is -1 or not `open_`, and at most ``len(after)`` of them (a walk that comes back
    to an op would only go round again). (speed) By pointer doubling: a few numpy
    steps, not one Python step per op of the path."""
    m = len(after)
    jump = np.append(np.where(after >= 0, after, m), m)  # m: the end, where it stays
    valid = np.append(open_, False)
    path = np.array([last if last >= 0 else m], dtype=np.int64)
    while True:
        stop = np.flatnonzero(~valid[path])
        if len(stop):
            return path[: stop[0]]
        if len(path) >= m:
            return path[:m]
        path = np.concatenate([path, jump[path]])  # ops 0..2k-1 of the walk from 0..k-1
        jump = jump[jump]


def observed_times(model: StepModel, start_of: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start and end (ns from the step's start, -1 unknown) of every op of
    `model.compiled` as the step ran them: each observed op at its record, its overhead
    op over the wait before it; the rest unknown."""
    n = len(model.overhead)
    start = np.full(len(model.compiled.names), -1, dtype=np.int64)
    end = start.copy()
    seen = np.flatnonzero(model.observed)
    wait = np.rint(model.overhead[seen] * 1e9).astype(np.int64)
    start[seen] = start_of[seen]
    end[seen] = start_of[seen] + np.rint(model.seconds[seen] * 1e9).astype(np.int64)
    start[n + seen] = start_of[seen] - wait
    end[n + seen] = start_of[seen]
    return start, end


def _cause(
    own: StepModel,
    used: StepModel,
    path: np.ndarray | None = None,
    queued: np.ndarray | None = None,
) -> str:
    """The largest unmodelled gap of a step, in words: missing records, the DAG edge the
    trace contradicts most, and the op whose wait in this step differs most from the
    typical one the replay used (a PS-side or peer wait, a slow input batch), among the
    waits of the `path` ops where any is: for the step's wall-clock time the waits on
    the step's or the replay's critical path (`critical_waits`; a wait off both paths
    moved no step end: a recv asked for late while the step waited for other tensors),
    for its busy time the rank's own ops (that recv spread the step's work).

    `queued` (ns per op, NaN unknown): how long TensorFlow's executor held the op queued
    with its inputs done before a thread ran it (`scheduled_micros`). The part of the
    wait it covers was a wait for a core or a thread, which no record of the step
    shows (mlp worker1 step 7: 12.3 ms, while worker1's executor ran nothing), and the
    cause says so: what a user can act on (cores per process, pinning)."""
    parts = []
    if own.missing:
        parts.append(
            f"{len(own.missing)} op(s) without a record in this step "
            f"(e.g. {own.missing[0]}), run at the oracle's time"
        )
    if own.violated is not None and own.violated[2] > 1e-4:
        u, v, late = own.violated
        parts.append(
            f"DAG edge {u} -> {v} contradicted by the trace ({v} started {late * 1e3:.3g} "
            f"ms before {u} started): dropped"
        )
    if len(own.overhead):
        diff = own.overhead - used.overhead
        if path is not None and path.any():
            diff = np.where(path, diff, 0.0)
        k = int(np.argmax(np.abs(diff)))
        if diff[k] != 0:
            parts.append(
                f"{own.compiled.names[k]} waited {own.overhead[k] * 1e3:.3g} ms before it "
                f"started in this step, {used.overhead[k] * 1e3:.3g} ms in the other steps "
                "(median)"
            )
            held = queued[k] / 1e9 if queued is not None and k < len(queued) else np.nan
            if held > 0:
                parts[-1] += (
                    f", {min(held, own.overhead[k]) * 1e3:.3g} ms of it queued in TensorFlow's "
                    "executor with its inputs done: a wait for a core or a thread"
                )
    return "; ".join(parts)


Holders = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _holders(traced: StepModel, begin: np.ndarray, ticks: np.ndarray) -> Holders:
    """The step's start, end and `held_by` as it ran, and `held_by` of its replay from
    `begin`/`ticks`: what every walk of `_critical` over the step reads."""
    start, end = observed_times(traced, traced.start_of)
    replayed_end = begin + ticks
    return (
        start,
        end,
        held_by(traced, start, end),
        held_by(traced, begin, replayed_end),
    )


def _critical(
    traced: StepModel,
    begin: np.ndarray,
    ticks: np.ndarray,
    own: int,
    among: np.ndarray | None = None,
    holders: Holders | None = None,
) -> np.ndarray:
    """Per op whether its wait lies on the critical path of the step as it ran or of
    its replay (`critical_waits`), each walked back from the rank's op that ended last
    (of the `among` ops, per op of the rank's `own`, where given: a GPU rank's CPU ops
    for its CPU range). `holders`: `_holders` of the step, when the caller walks from
    several ends (found once, not per walk)."""
    chosen = traced.observed[:own] if among is None else traced.observed[:own] & among
    mine = np.flatnonzero(chosen)
    n = len(traced.overhead)
    if not len(mine):
        return np.zeros(n, dtype=bool)
    start, end, ran, replayed = holders or _holders(traced, begin, ticks)
    replayed_end = begin + ticks
    on = _waits_on_path(ran, start, int(mine[np.argmax(end[mine])]), n)
    last = int(mine[np.argmax(replayed_end[mine])])
    return on | _waits_on_path(replayed, begin, last, n)

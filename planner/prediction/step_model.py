"""The step model: one traced step as the replay runs it (`StepModel`, `step_model`): its
observed durations, concurrency and order, the overhead op before each op, the peers'
releases and the plan's order where one is replayed; with the rank's shape over all of its
steps (`rank_shape`, `usual_predecessors`). Apart because it is what the replay, the
plans' replay and the peers' releases all build on, and holds no loop of its own."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from planner.model.arrays import lanes
from planner.model.trace import busy_time
from planner.prediction import host
from planner.prediction.compiled import Compiled, PlanArrays, op_rows


def measured(rows: pd.DataFrame | Mapping[str, np.ndarray]) -> tuple[float, float]:
    """(busy makespan, span) of one step in seconds, from its op intervals (`rows`: a
    DataFrame or numpy columns with ``start`` and ``duration``)."""
    starts, durations = np.asarray(rows["start"]), np.asarray(rows["duration"])
    span = float((starts + durations).max() - starts.min()) / 1e9
    return busy_time(starts, durations) / 1e9, span


@dataclass(frozen=True)
class StepModel:
    """One traced step as the replay runs it (see `step_model`).

    `compiled`: the rank's n ops followed by n overhead ops (op i waits for overhead op
    n + i, which waits for op i's predecessors and lane predecessor), with `cap` threads
    or channels per resource; `seconds`: per op the observed duration, per overhead op
    the overhead; `overhead`: the overhead per op (s); `observed`: ops with a record
    this step; `tail`: the step's closing time after its last op (s); `missing`: ops
    recorded in every other step of the rank but not in this one; `violated`: the DAG
    edge (u, v, seconds) the trace contradicts most (v started before u did), if any;
    `ready`: per op when its predecessors let it start (ns from `t0`, the step's start);
    `start_of`: per op its observed start (ns from `t0`, 0 without a record).
    """

    compiled: Compiled
    cap: np.ndarray
    priority: np.ndarray
    seconds: np.ndarray
    overhead: np.ndarray
    observed: np.ndarray
    tail: float
    missing: tuple[str, ...]
    violated: tuple[str, str, float] | None
    ready: np.ndarray
    t0: int
    start_of: np.ndarray


def step_model(
    compiled: Compiled,
    rows: pd.DataFrame,
    span: tuple[int, int],
    fallback: np.ndarray,
    missing: Sequence[str] = (),
    release: np.ndarray | None = None,
    own: int | None = None,
    shape: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
    idx: np.ndarray | None = None,
    plan: PlanArrays | None = None,
    usual: np.ndarray | None = None,
    names: tuple[str, ...] | None = None,
) -> StepModel:
    """The replay model of one step: what plain list scheduling misses, taken from it.

    - Concurrency: a resource runs as many ops at once as the step ever ran on it (TF's
      inter-op thread pool, gRPC serving 12-14 transfers on one channel, one thread or
      stream: 1), each at its observed duration, not the processor-shared `dedicated`
      one; ops start in observed order (priority), and a resource that ran one op at a
      time (a Python thread, a GPU stream) keeps its exact order (chain edges).
    - Overhead: the time between an op being ready (its DAG and chain predecessors done,
      the step begun) and its start: framework and Python overhead, launch latency and
      CPU-ahead queues, PS-side and peer waits the DAG has no edge for. An overhead op
      before each op carries it without holding the op's resource.
    - Peers: `release` (ns from the step's start per op, -1 for none) is the time the
      other ranks were ready for the same collective or transfer in the same step (from
      their traces): it cannot start before, as a collective waits for the slowest rank.
    - Tail: the step's span after its last op (closing overhead), kept as observed.
    - The rank's shape: `shape` = (edges the trace contradicts in some step of the rank,
      the widths of its thread pools, edges it contradicts in every step), from
      `rank_shape`: those edges are dropped as the ones this step contradicts are, and a
      pool runs as many ops as it ever did. `violated`, the contradicted edge the cause
      names, is one this step contradicts that some other step does not: an edge every
      step contradicts (a CPU running ahead of the collective its optimizer is given to
      wait for) is the rank's shape, no gap of the step.
    Ops without a record this step run at their `fallback` time, unconstrained (their
    edges dropped), so a partial step still replays (and is flagged). `idx`: the op
    index of each of `rows` (`op_rows`), when the caller has them; `rows` may then be
    numpy columns (``start``, ``duration``) rather than a DataFrame. A ``work`` column
    (`planner.prediction.host`: an op's share of a core the job's processes shared) is what the op
    needs of its resource in the replay; its waits still run from its observed end.
    `plan` (`plan_arrays`): the step as a plan would run it: the planned ops take the
    places their resource gave planned ops in the observed order, in the plan's order,
    and the plan's control edges join the DAG; everything else as observed.
    `usual` (`usual_predecessors`): per op the op that precedes it on its one-at-a-time
    resource in most steps of the rank (-1 none). Where another op came between them in
    this step, the op's overhead runs from (and is measured from) its usual
    predecessor's end, and the op follows the one before it in this step with no
    overhead: an op slotted into the gap (a kernel of another thread run while the
    stream waited) fills the gap rather than pushing the op's wait behind it.
    `names`: `overhead_names` of `compiled`, when the caller has them (once per rank).
    """
    if idx is None:
        rows, idx = op_rows(compiled, rows)
    step = _recorded(compiled, rows, span, idx, shape)
    priority, chains, slotted = _observed_order(compiled, step, plan, usual)
    src, dst, issued, violated = _kept_edges(compiled, step, chains, plan)
    ready, held, gap = _ready_times(step, (src, dst), slotted, issued, release)
    names = overhead_names(compiled) if names is None else names
    edges = (src, dst)
    expanded, seconds = _expanded(
        compiled, step, names, edges, slotted, issued, held, gap, release, fallback
    )
    n, k, m = len(compiled.names), len(held), len(issued[0])
    priority = np.concatenate([priority, np.full(k + m, -1, dtype=np.int64)])
    cap = np.concatenate([step["width"], [max(1, n), max(1, n + k + m)]]).astype(np.int64)
    (t0, t1), observed, end_of = span, step["observed"], step["end_of"]
    tail = max(0, t1 - t0 - int(end_of[:own][observed[:own]].max(initial=0))) / 1e9
    return StepModel(
        expanded, cap, priority, seconds, gap / 1e9, observed, tail, tuple(missing), violated,
        ready, t0, step["start_of"],
    )  # fmt: skip


def _recorded(
    compiled: Compiled,
    rows: pd.DataFrame | Mapping[str, np.ndarray],
    span: tuple[int, int],
    idx: np.ndarray,
    shape: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
) -> dict[str, Any]:
    """What `step_model` reads of the step's records: ``idx`` (op index per record),
    ``start`` (ns from the step's start) and ``dur`` (its duration, or its ``work`` on a
    shared core) per record; per op ``observed`` (has a record), ``start_of`` and
    ``end_of`` (ns from the step's start, 0 without a record) and ``res`` (its resource,
    the unrecorded one without a record); per resource ``width`` (ops at once); the
    rank's ``dropped`` and ``always`` edges (`rank_shape`, None without `shape`)."""
    n = len(compiled.names)
    t0, _ = span
    start = np.asarray(rows["start"], dtype=np.int64) - t0
    dur = np.asarray(rows["duration"], dtype=np.int64)
    lane = lanes(compiled.res[idx], start.astype(np.float64), dur.astype(np.float64))
    observed_end = start + dur
    if "work" in rows:  # on one shared core an op holds it for its share, not its span
        dur = np.asarray(rows["work"], dtype=np.int64)
    observed = np.zeros(n, dtype=bool)
    observed[idx] = True
    n_res = len(compiled.resources)
    width = np.ones(n_res, dtype=np.int64)
    np.maximum.at(width, compiled.res[idx], lane + 1)
    dropped = always = None
    if shape is not None:
        dropped, rank_width, always = shape
        width = np.maximum(width, rank_width)
    width[[host.is_shared(r) for r in compiled.resources]] = max(1, n)  # shared, no lanes
    res = compiled.res.copy()
    res[~observed] = n_res
    end_of = np.zeros(n, dtype=np.int64)
    end_of[idx] = observed_end
    start_of = np.zeros(n, dtype=np.int64)
    start_of[idx] = start
    return {
        "idx": idx, "start": start, "dur": dur, "observed": observed, "start_of": start_of,
        "end_of": end_of, "res": res, "width": width, "dropped": dropped, "always": always,
    }  # fmt: skip


def _observed_order(
    compiled: Compiled,
    step: Mapping[str, Any],
    plan: PlanArrays | None,
    usual: np.ndarray | None,
) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(priority per op and overhead op, the chain edges (src, dst) of the one-at-a-time
    resources, the slotted ops (their usual predecessor, the op before them in this step,
    the op)) of `step_model`: the observed start order per resource, with the planned
    ops in the plan's order in their places."""
    n = len(compiled.names)
    idx, start, res, width = step["idx"], step["start"], step["res"], step["width"]
    # observed start order per resource -> priorities, and chains on one-at-a-time ones
    # ties in start time go by the DAG's topological order, so that a chain never runs
    # against an edge (zero-length ops at one instant)
    order = np.lexsort((compiled.topological_position[idx], start, res[idx]))
    o_idx, o_res = idx[order], res[idx][order]
    if plan is not None:  # the planned ops in the plan's order, in the planned ops' places
        slots = np.flatnonzero(plan.position[o_idx] >= 0)
        o_idx[slots] = o_idx[slots][np.lexsort((plan.position[o_idx[slots]], o_res[slots]))]
    first = np.searchsorted(o_res, o_res, side="left")
    priority = np.full(2 * n, -1, dtype=np.int64)
    priority[o_idx] = np.arange(len(o_idx)) - first
    same = (o_res[1:] == o_res[:-1]) & (width[o_res[1:]] == 1)
    chain_src, chain_dst = o_idx[:-1][same], o_idx[1:][same]
    anchor_src = direct_src = direct_dst = np.zeros(0, dtype=np.int64)
    if usual is not None and len(chain_dst):
        position = np.full(n, -1, dtype=np.int64)
        position[o_idx] = np.arange(len(o_idx))
        u = usual[chain_dst]
        slotted = (u >= 0) & (u != chain_src)
        slotted[slotted] = (
            step["observed"][u[slotted]]
            & (res[u[slotted]] == res[chain_dst[slotted]])
            & (position[u[slotted]] < position[chain_dst[slotted]])
        )
        anchor_src, direct_src, direct_dst = u[slotted], chain_src[slotted], chain_dst[slotted]
        chain_src, chain_dst = chain_src[~slotted], chain_dst[~slotted]
    return priority, (chain_src, chain_dst), (anchor_src, direct_src, direct_dst)


def _kept_edges(
    compiled: Compiled,
    step: Mapping[str, Any],
    chains: tuple[np.ndarray, np.ndarray],
    plan: PlanArrays | None,
) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray], tuple[str, str, float] | None]:
    """(src, dst of the edges the step's replay keeps: the DAG's between recorded ops
    that the trace does not contradict, the chains and the plan's control edges; the
    edges issued from inside their source (src, dst); the contradicted edge the cause
    names) of `step_model`."""
    observed, end_of, start_of = step["observed"], step["end_of"], step["start_of"]
    dropped, always = step["dropped"], step["always"]
    # an edge u -> v whose v started before u ended was issued from inside u (a kernel
    # launched, a collective started by a hook, mid-op): v waits for that point, u's
    # start plus the observed offset, not for u's end; one whose v started even before
    # u did is contradicted by the trace and dropped
    g_src, g_dst = compiled.src, compiled.dst
    inside = observed[g_src] & observed[g_dst] & (end_of[g_src] > start_of[g_dst])
    launch = inside & (start_of[g_dst] >= start_of[g_src])
    named = inside & ~launch if always is None else inside & ~launch & ~always
    contradicted = np.flatnonzero(named)
    violated = None
    if len(contradicted):
        late = start_of[g_src[contradicted]] - start_of[g_dst[contradicted]]
        j = contradicted[int(np.argmax(late))]
        violated = (compiled.names[g_src[j]], compiled.names[g_dst[j]], float(late.max()) / 1e9)
    if dropped is not None:  # contradicted in another step of the rank
        launch &= ~dropped
        inside |= dropped
    l_src, l_dst = g_src[launch], g_dst[launch]
    # edges to or from an op without a record this step are dropped: through it, a path
    # could run against the observed order (and close a cycle with the lane chains)
    kept = ~inside & observed[g_src] & observed[g_dst]
    src = np.concatenate([g_src[kept], chains[0]])
    dst = np.concatenate([g_dst[kept], chains[1]])
    if plan is not None and len(plan.src):
        mine = observed[plan.src] & observed[plan.dst]
        src = np.concatenate([src, plan.src[mine]])
        dst = np.concatenate([dst, plan.dst[mine]])
    return src, dst, (l_src, l_dst), violated


def _ready_times(
    step: Mapping[str, Any],
    edges: tuple[np.ndarray, np.ndarray],
    slotted: tuple[np.ndarray, np.ndarray, np.ndarray],
    issued: tuple[np.ndarray, np.ndarray],
    release: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(per op when its predecessors in the step let it start, ns from the step's start;
    the collectives held by their peers' `release`; per op its wait before it started,
    ns) of `step_model`."""
    observed, end_of, start_of = step["observed"], step["end_of"], step["start_of"]
    src, dst = edges
    anchor_src, _, direct_dst = slotted
    l_dst = issued[1]
    ready = np.zeros(len(observed), dtype=np.int64)
    both = observed[src] & observed[dst]
    np.maximum.at(ready, dst[both], end_of[src[both]])
    np.maximum.at(ready, direct_dst, end_of[anchor_src])  # a slotted op's wait: from u*
    np.maximum.at(ready, l_dst, start_of[l_dst])
    own_ready = ready.copy()
    held = np.zeros(0, dtype=np.int64)
    if release is not None:
        # a collective that started before its peers were ready waited inside its
        # observed duration (gloo, NCCL kernels): no release for it
        held = np.flatnonzero(observed & (release > 0) & (release <= start_of))
        ready[held] = np.maximum(ready[held], release[held])
    gap = np.where(observed, np.maximum(start_of - ready, 0), 0)
    return own_ready, held, gap


def _expanded(
    compiled: Compiled,
    step: Mapping[str, Any],
    names: tuple[str, ...],
    edges: tuple[np.ndarray, np.ndarray],
    slotted: tuple[np.ndarray, np.ndarray, np.ndarray],
    issued: tuple[np.ndarray, np.ndarray],
    held: np.ndarray,
    gap: np.ndarray,
    release: np.ndarray | None,
    fallback: np.ndarray,
) -> tuple[Compiled, np.ndarray]:
    """(the step's graph: `compiled`'s n ops, their n overhead ops, an op per collective
    `held` by its peers and one per edge `issued` from inside its source; the seconds of
    each) of `step_model`. `names`: `overhead_names` of `compiled`."""
    idx, res, dur, start_of = step["idx"], step["res"], step["dur"], step["start_of"]
    src, dst = edges
    anchor_src, direct_src, direct_dst = slotted
    l_src, l_dst = issued
    n, n_res = len(compiled.names), len(compiled.resources)
    k, m = len(held), len(l_src)
    seconds = np.concatenate([fallback, np.zeros(n), np.zeros(k), np.zeros(m)])
    seconds[idx] = dur / 1e9
    seconds[n + idx] = gap[idx] / 1e9
    if k:
        seconds[2 * n : 2 * n + k] = release[held] / 1e9
    if m:
        seconds[2 * n + k :] = (start_of[l_dst] - start_of[l_src]) / 1e9
    every = np.arange(n, dtype=np.int64)
    lag = 2 * n + k + np.arange(m)
    expanded = Compiled(
        compiled.graph,
        (
            *names,
            *(f"(peers) {compiled.names[i]}" for i in held),
            *(
                f"(issued) {compiled.names[u]} -> {compiled.names[v]}"
                for u, v in zip(l_src, l_dst, strict=True)
            ),
        ),
        compiled.index,
        (*compiled.resources, "(unrecorded)", "(overhead)"),
        np.concatenate([res, np.full(n + k + m, n_res + 1, dtype=np.int64)]),
        np.concatenate(
            [src, n + every, 2 * n + np.arange(k), n + l_src, lag, direct_src, anchor_src]
        ),
        np.concatenate([n + dst, every, n + held, lag, n + l_dst, direct_dst, n + direct_dst]),
        np.concatenate([compiled.transfer, np.zeros(n + k + m, dtype=bool)]),
    )
    return expanded, seconds


def overhead_names(compiled: Compiled) -> tuple[str, ...]:
    """The op names of `compiled` followed by their overhead ops' (``(overhead) op``):
    (speed) named once per rank by `planner.prediction.replay._step_models` and handed to
    every step's `step_model` (its ``names``)."""
    return (*compiled.names, *(f"(overhead) {name}" for name in compiled.names))


def own_rows(rows: Mapping[str, np.ndarray], own: int | None) -> dict[str, np.ndarray]:
    """The numpy columns `rows` (with ``idx``, the op index of each) of the rank's own
    ops: those numbered below `own` (all when None)."""
    if own is None:
        return dict(rows)
    keep = rows["idx"] < own
    return {k: v[keep] for k, v in rows.items()}


def with_overhead(model: StepModel, overhead: np.ndarray) -> StepModel:
    """`model` with `overhead` (s per op) in place of its own, on its observed ops."""
    n = len(new := np.where(model.observed, overhead, 0.0))
    seconds = model.seconds.copy()
    seconds[n : 2 * n] = new
    return replace(model, seconds=seconds, overhead=new)


def rank_shape(
    compiled: Compiled, steps: Iterable[pd.DataFrame | tuple[pd.DataFrame, np.ndarray]]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dropped, width, always) over the complete steps of one rank: per edge of
    `compiled`, whether the trace contradicts it (its v started before its u did) in
    any step; per resource, the most ops it ever ran at once; per edge, whether every
    step that ran both its ops contradicts it.

    An edge the trace contradicts is not a wait of v for u but an order after u's
    *issue*, which the op table does not hold (TensorFlow runs an executor node once its
    GPU inputs' kernels are launched, not done: a DAG whose GPU node was timed by its
    kernels alone was contradicted so in every step of the TF1 GPU timeline).
    Dropped only in the steps that contradict it and kept in the others, it would make
    v's wait swing between steps with the GPU queue, and the typical wait of the other
    steps would miss by as much: it is dropped in every step of the rank. A step is its
    rows, or (its rows of `compiled`'s ops, their `op_rows` indices), those rows a
    DataFrame or numpy columns (``start``, ``duration``).
    """
    g_src, g_dst = compiled.src, compiled.dst
    dropped = np.zeros(len(g_src), dtype=bool)
    agreed = np.zeros(len(g_src), dtype=bool)  # some step ran u no later than v
    width = np.ones(len(compiled.resources), dtype=np.int64)
    for step in steps:
        rows, idx = step if isinstance(step, tuple) else op_rows(compiled, step)
        start = np.full(len(compiled.names), -1, dtype=np.int64)
        start[idx] = np.asarray(rows["start"], dtype=np.int64)
        seen = (start[g_src] >= 0) & (start[g_dst] >= 0)
        dropped |= seen & (start[g_dst] < start[g_src])
        agreed |= seen & (start[g_dst] >= start[g_src])
        lane = lanes(
            compiled.res[idx],
            np.asarray(rows["start"], dtype=np.float64),
            np.asarray(rows["duration"], dtype=np.float64),
        )
        np.maximum.at(width, compiled.res[idx], lane + 1)
    return dropped, width, dropped & ~agreed


def usual_predecessors(compiled: Compiled, steps: Iterable[Mapping[str, np.ndarray]]) -> np.ndarray:
    """Per op the op that ran just before it on its resource in more than half of the
    `steps` that recorded it (numpy columns ``start``, ``idx``; ties in start by the
    DAG's topological order, as `step_model` chains them), -1 where none did, or where
    it was first on its resource."""
    n = len(compiled.names)
    topo = compiled.topological_position
    candidate = np.full(n, -3, dtype=np.int64)
    lead = np.zeros(n, dtype=np.int64)
    preds = []
    for known in steps:
        idx = known["idx"]
        order = np.lexsort((topo[idx], known["start"], compiled.res[idx]))
        o_idx = idx[order]
        pred = np.full(n, -2, dtype=np.int64)  # -2: no record in the step
        pred[o_idx] = -1
        same = compiled.res[o_idx[1:]] == compiled.res[o_idx[:-1]]
        pred[o_idx[1:][same]] = o_idx[:-1][same]
        preds.append(pred)
        # majority vote (Boyer-Moore), op by op
        seen = pred != -2
        agree = seen & (pred == candidate)
        lead[agree] += 1
        fresh = seen & ~agree & (lead == 0)
        candidate[fresh], lead[fresh] = pred[fresh], 1
        lead[seen & ~agree & ~fresh] -= 1
    if not preds:
        return np.full(n, -1, dtype=np.int64)
    table = np.stack(preds)
    votes = (table == candidate).sum(axis=0)
    recorded = (table != -2).sum(axis=0)
    return np.where((2 * votes > recorded) & (candidate >= 0), candidate, -1)

"""The compiled graph: an OpGraph as the integer arrays every replay and comparison runs on
(op index, resource per op, edges), its op times with the what-if knobs applied, and the
priorities and plans over it (`plan_arrays`, the observed order per step). Apart because
it is the one representation every later piece of the prediction stage reads and none
changes: built once per graph, handed on."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from itertools import repeat

import numpy as np
import pandas as pd

from planner.errors import InputError
from planner.model.graph import OpGraph, on_gpu
from planner.model.oracle import TimeOracle
from planner.model.plan import Plan
from planner.planning.ticks import TICKS_PER_SECOND


@dataclass(frozen=True)
class Compiled:
    """An OpGraph as integer arrays (built once per graph, reused for every plan)."""

    graph: OpGraph
    names: tuple[str, ...]
    index: Mapping[str, int]
    resources: tuple[str, ...]
    res: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    transfer: np.ndarray

    @cached_property
    def topological_position(self) -> np.ndarray:
        """Position of each op in one topological order of the graph: derived from the
        edges once per compiled graph, on first use (`step_model` breaks ties in start
        time by it in every step)."""
        return _topological_position(self.src, self.dst, len(self.names))


def compile_graph(graph: OpGraph) -> Compiled:
    """Op index, resource id per op and the edge arrays of `graph`. Built once where a
    rank's replay (or comparison) starts and handed on: a graph is not changed once
    built, and the arrays are only read."""
    names = tuple(graph.ops)
    index = {name: i for i, name in enumerate(names)}
    resources = tuple(sorted({op.resource for op in graph.ops.values()}))
    rid = {r: i for i, r in enumerate(resources)}
    res = np.fromiter((rid[op.resource] for op in graph.ops.values()), np.int64, len(names))
    src = graph.src.astype(np.int64)
    dst = graph.dst.astype(np.int64)
    transfer = np.fromiter((op.is_transfer for op in graph.ops.values()), bool, len(names))
    return Compiled(graph, names, index, resources, res, src, dst, transfer)


KnownRows = tuple[pd.DataFrame, np.ndarray]
"""(the records whose op a `Compiled` holds, their op indices): `op_rows`'s answer, made
once where a rank's rows are made and handed on to what reads them."""


def op_rows(compiled: Compiled, rows: pd.DataFrame) -> KnownRows:
    """(the rows of `rows` whose op `compiled` holds, in order; their op indices).

    (speed) One dict look-up per row: pandas' ``isin`` and ``map`` over the op names
    cost about a millisecond per call. A rank's replay, its queues carried over and its
    comparison read the same rows: the caller looks them up once and hands the answer
    on (`known_rows`)."""
    ops = rows["op"].tolist()
    idx = np.fromiter(map(compiled.index.get, ops, repeat(-1)), dtype=np.int64, count=len(ops))
    keep = idx >= 0
    return (rows, idx) if keep.all() else (rows[keep], idx[keep])


def known_rows(compiled: Compiled, rows: pd.DataFrame | KnownRows) -> KnownRows:
    """`rows` as `op_rows` gives them: as they are where the caller looked them up
    already (a tuple), else looked up now."""
    return rows if isinstance(rows, tuple) else op_rows(compiled, rows)


def rank_arrays(graph: OpGraph, rows: pd.DataFrame) -> tuple[Compiled, KnownRows]:
    """A rank's `graph` compiled and its `rows` looked up in it (`op_rows`): what the
    rank's replay and comparison read, built once per rank and handed on."""
    compiled = compile_graph(graph)
    return compiled, op_rows(compiled, rows)


def rank_rows(frame: pd.DataFrame, rank: str) -> pd.DataFrame:
    """The rows of `rank` in `frame`: `frame` itself where it holds that rank alone (a
    one-rank job: no copy)."""
    mask = frame["rank"] == rank
    return frame if mask.all() else frame[mask]


def op_seconds(
    compiled: Compiled,
    times: Mapping[str, float] | TimeOracle,
    *,
    bandwidth_scale: float = 1.0,
    compute_scale: float = 1.0,
    latency: float = 0.0,
) -> np.ndarray:
    """Seconds per op in compiled order, with the what-if knobs applied (missing = 0)."""
    if bandwidth_scale <= 0 or compute_scale <= 0 or latency < 0:
        raise InputError(None, "bandwidth and compute scales must be > 0 and latency >= 0")
    table = times.times if isinstance(times, TimeOracle) else times
    seconds = np.array([table.get(n, 0.0) for n in compiled.names], dtype=np.float64)
    if seconds.size and (~np.isfinite(seconds) | (seconds < 0)).any():
        bad = compiled.names[int(np.flatnonzero(~np.isfinite(seconds) | (seconds < 0))[0])]
        raise InputError(None, f"op {bad!r} has time {table.get(bad)}; need a finite time >= 0")
    t = compiled.transfer
    return np.where(t, seconds / bandwidth_scale + latency, seconds / compute_scale)


def priority_array(compiled: Compiled, priority: Mapping[str, int] | None) -> np.ndarray:
    """Priority number per op; -1 where the op has none (masked separately)."""
    out = np.full(len(compiled.names), -1, dtype=np.int64)
    for name, p in (priority or {}).items():
        if name not in compiled.index:
            raise InputError(None, f"plan names op {name!r}, which is not in the graph")
        out[compiled.index[name]] = int(p)
    return out


def capacities(compiled: Compiled, channels: int = 1) -> np.ndarray:
    """Channels per resource: `channels` for resources that carry transfers, else 1."""
    if channels < 1:
        raise InputError(None, f"channels must be >= 1, got {channels}")
    cap = np.ones(len(compiled.resources), dtype=np.int64)
    cap[sorted_unique(compiled.res[compiled.transfer])] = int(channels)
    return cap


def to_ticks(seconds: np.ndarray) -> np.ndarray:
    return np.rint(np.asarray(seconds, dtype=np.float64) * TICKS_PER_SECOND).astype(np.int64)


def _plan_parts(
    plan: Plan | Mapping[str, int] | None,
) -> tuple[Mapping[str, int] | None, tuple[tuple[str, str], ...]]:
    """Priorities and control edges of a plan; a plan with only an order gets its index."""
    if plan is None:
        return None, ()
    if isinstance(plan, Plan):
        priority = plan.priority or plan.order_index()
        return priority, tuple(plan.control_edges)
    return plan, ()


def observed_priority(compiled: Compiled, rows: pd.DataFrame | KnownRows) -> np.ndarray:
    """Priority = observed start order per resource (ties by name); -1 for unseen ops.
    `rows`: a step's rows, or their `op_rows`."""
    rows, idx = known_rows(compiled, rows)
    res = compiled.res[idx]
    order = np.lexsort((rows["op"].to_numpy(), rows["start"].to_numpy(), res))
    res_sorted = res[order]
    first = np.searchsorted(res_sorted, res_sorted, side="left")
    out = np.full(len(compiled.names), -1, dtype=np.int64)
    out[idx[order]] = np.arange(len(order)) - first
    return out


def observed_priorities(
    compiled: Compiled, rows: pd.DataFrame, known: KnownRows | None = None
) -> list[tuple[int, np.ndarray]]:
    """(step, `observed_priority` of its rows) for each step of one rank's `rows`, in
    step order; `known`: `op_rows` of `rows`, where the caller looked them up. (speed)
    The ops are looked up and their names ordered once for the rank, and the steps split
    with numpy, not a pandas group-by: the same priorities."""
    steps = sorted_unique(rows["iteration"].to_numpy(dtype=np.int64))
    known, idx = op_rows(compiled, rows) if known is None else known
    iteration = known["iteration"].to_numpy(dtype=np.int64)
    start = known["start"].to_numpy()
    # ties in start time go by name: the names' sorted positions order them alike
    by_name = np.empty(len(compiled.names), dtype=np.int64)
    by_name[sorted(range(len(compiled.names)), key=compiled.names.__getitem__)] = np.arange(
        len(compiled.names)
    )
    name_key, res = by_name[idx], compiled.res[idx]
    out = []
    for it in steps.tolist():
        of = np.flatnonzero(iteration == it)
        order = of[np.lexsort((name_key[of], start[of], res[of]))]
        res_sorted = res[order]
        first = np.searchsorted(res_sorted, res_sorted, side="left")
        priority = np.full(len(compiled.names), -1, dtype=np.int64)
        priority[idx[order]] = np.arange(len(order)) - first
        out.append((int(it), priority))
    return out


def step_seconds(
    compiled: Compiled, rows: pd.DataFrame | KnownRows, fallback: np.ndarray
) -> np.ndarray:
    """Op times of one step (its rows, or their `op_rows`): its dedicated times, the
    oracle's for ops it did not run."""
    seconds = fallback.copy()
    rows, idx = known_rows(compiled, rows)
    seconds[idx] = rows["dedicated"].to_numpy() / 1e9
    return seconds


@dataclass(frozen=True)
class PlanArrays:
    """A plan on a compiled graph: per op its position in the plan's order (-1: not
    planned) and its control edges as op indices."""

    position: np.ndarray
    src: np.ndarray
    dst: np.ndarray


def plan_arrays(compiled: Compiled, plan: Plan) -> PlanArrays:
    """`plan` on `compiled`: its order (priorities, else its order's index) and control
    edges; InputError naming an op the graph does not hold."""
    priority, control = _plan_parts(plan)
    position = np.full(len(compiled.names), -1, dtype=np.int64)
    for name, p in (priority or {}).items():
        if name not in compiled.index:
            raise InputError(None, f"plan {plan.algorithm!r} orders unknown op {name!r}")
        position[compiled.index[name]] = int(p)
    ends = [(compiled.index.get(u), compiled.index.get(v)) for u, v in control]
    if any(u is None or v is None for u, v in ends):
        raise InputError(None, f"plan {plan.algorithm!r} has a control edge to an unknown op")
    pairs = np.array(ends, dtype=np.int64).reshape(-1, 2)
    return PlanArrays(position, pairs[:, 0].copy(), pairs[:, 1].copy())


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """`np.unique(values)` of a 1-d integer array by one sort: (speed) numpy 2's
    `unique` hashes first and costs ~15x a sort on the few thousand ends of a step."""
    ordered = np.sort(values, kind="stable")
    keep = np.ones(len(ordered), dtype=bool)
    keep[1:] = ordered[1:] != ordered[:-1]
    return ordered[keep]


def per_op(compiled: Compiled, values: Mapping[str, float]) -> np.ndarray:
    """`values` (op name -> number) as an array over `compiled`'s ops, NaN for the rest."""
    out = np.full(len(compiled.names), np.nan)
    for name, value in values.items():
        i = compiled.index.get(name)
        if i is not None:
            out[i] = value
    return out


def _topological_position(src: np.ndarray, dst: np.ndarray, n: int) -> np.ndarray:
    """`Compiled.topological_position` of `n` ops joined by the edges `src` -> `dst`."""
    indeg = np.bincount(dst, minlength=n)
    order = np.argsort(src, kind="stable")
    succ, ptr = dst[order], np.concatenate([[0], np.cumsum(np.bincount(src, minlength=n))])
    # (speed) the walk over plain lists, not numpy scalars
    position_of = [0] * n
    frontier = np.flatnonzero(indeg == 0)[::-1].tolist()
    succ_of, ptr_of, need = succ.tolist(), ptr.tolist(), indeg.tolist()
    k = 0
    while frontier:
        i = frontier.pop()
        position_of[i] = k
        k += 1
        for j in succ_of[ptr_of[i] : ptr_of[i + 1]]:
            need[j] -= 1
            if need[j] == 0:
                frontier.append(j)
    return np.array(position_of, dtype=np.int64)


def _device_ops(compiled: Compiled) -> np.ndarray:
    """Per op of `compiled`: device work of a GPU rank (an op on a GPU stream, or a
    transfer where the rank has GPU streams), as the ingest spans a GPU step and
    `graph.device_ops` counts it."""
    stream = np.array([on_gpu(r) for r in compiled.resources], dtype=bool)[compiled.res]
    return stream | compiled.transfer if stream.any() else stream

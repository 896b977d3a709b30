"""Caramel's Stage 1 (§4.1, Dataflow DAG Optimizer): the activation order.

Repeatedly pick the parameter whose not-yet-done ancestor compute costs least, and mark
those ancestors done. Ties (equal cost, e.g. zero-time ops) go to the parameter needing
fewer ops, then to the earlier one in topological order, then by name: with that key a
parameter is never picked after one whose remaining needs strictly contain its own, so
a parameter left with nothing to do when another is picked activates *together* with it
(``simultaneous``).

The stage runs on ops collapsed into classes with the same set of parameters below
them: every op of a class is done by the same pick, so costs are kept per class and
updated with numpy when a pick kills classes (200k ops, thousands of parameters).
Times are summed as integer picoseconds, so costs and ties are exact. Apart from
Stage 2 (`planner.planning.enforcement`), which takes its result, and from the plan
(`planner.planning.caramel`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from planner.model.graph import OpGraph, topological_sort
from planner.model.oracle import TimeOracle
from planner.planning.ticks import TICKS_PER_SECOND, set_bit_pairs, to_ticks


@dataclass(frozen=True)
class Activation:
    """Stage 1's result.

    `order`: the parameters (transfer ops) in chosen activation order. `cost[p]`: the
    compute seconds picked with p (its not-yet-done ancestors). `needed[p]`: those ops
    (``N_i``, any kind), in topological order. `simultaneous[p]`: the earlier parameter
    p becomes ready together with (p needed no new op), else absent.
    `start_boundary_after[p]`: when p is ready if the compute runs serially in the
    chosen order (sum of the costs up to p); `start_boundary_before[p]`: the same
    under the baseline order (default: the graph's topological order).
    """

    order: tuple[str, ...]
    cost: Mapping[str, float]
    needed: Mapping[str, tuple[str, ...]]
    simultaneous: Mapping[str, str]
    start_boundary_after: Mapping[str, float]
    start_boundary_before: Mapping[str, float]


def gradient_transfers(graph: OpGraph) -> list[str]:
    """The parameters Caramel orders: collectives outside the forward pass.

    Falls back to every collective, then to sends (a PS worker's gradient pushes).
    """
    collectives = [n for n, op in graph.ops.items() if op.kind == "collective"]
    if collectives:
        grads = [n for n in collectives if graph.ops[n].phase != "forward"]
        return grads or collectives
    return [n for n, op in graph.ops.items() if op.kind == "send"]


def time_map(time: Mapping[str, float] | TimeOracle) -> Mapping[str, float]:
    """Op -> seconds from a TimeOracle or a mapping (as Caramel takes either)."""
    return time.times if isinstance(time, TimeOracle) else time


def _compute_ticks(graph: OpGraph, names: Sequence[str], time: Mapping[str, float]) -> np.ndarray:
    """Picoseconds per op (compute ops only: transfers cost no computation)."""
    seconds = np.array(
        [float(time.get(n, 0.0)) if not graph.ops[n].is_transfer else 0.0 for n in names],
        dtype=np.float64,
    )
    return to_ticks(names, seconds)


def _csr(keys: np.ndarray, values: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(keys, kind="stable")
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(keys, minlength=n), out=ptr[1:])
    return ptr, values[order]


@dataclass(frozen=True)
class _Stage1:
    names: list[str]
    index: dict[str, int]
    params: list[str]
    picked: list[int]  # param indices in pick order
    cost: list[int]  # ticks per pick
    count: list[int]  # |N_i| per pick (param ops excluded from N)
    step: np.ndarray  # op index -> pick step that made it done (-1: never)


def _stage1(graph: OpGraph, ticks_of: Mapping[str, float], params: Sequence[str]) -> _Stage1:
    names = topological_sort(graph)
    index = {n: i for i, n in enumerate(names)}
    n_ops, n_param = len(names), len(params)
    ticks = _compute_ticks(graph, names, ticks_of)
    param_of = np.full(n_ops, -1, dtype=np.int64)
    for j, p in enumerate(params):
        param_of[index[p]] = j
    below = _params_below(graph, names, index, param_of)
    op_class, class_bits, param_class = _op_classes(below, param_of, n_param)
    del below
    n_class = len(class_bits)
    is_param_op = param_of >= 0
    weight = np.zeros(n_class, dtype=np.int64)
    np.add.at(weight, op_class, ticks)
    size = np.bincount(op_class[~is_param_op], minlength=n_class).astype(np.int64)

    rows, cols = set_bit_pairs(class_bits, n_param)
    del class_bits
    row_ptr, row_params = _csr(rows, cols, n_class)  # class -> params below it
    col_ptr, col_classes = _csr(cols, rows, n_param)  # param -> classes above it

    cost = np.zeros(n_param, dtype=np.int64)
    np.add.at(cost, cols, weight[rows])
    count = np.zeros(n_param, dtype=np.int64)
    np.add.at(count, cols, size[rows])
    topo = np.array([index[p] for p in params], dtype=np.int64)
    name_rank = np.empty(n_param, dtype=np.int64)
    name_rank[sorted(range(n_param), key=params.__getitem__)] = np.arange(n_param)

    alive_class = np.ones(n_class, dtype=bool)
    class_step = np.full(n_class, -1, dtype=np.int64)
    alive = np.ones(n_param, dtype=bool)
    big = np.iinfo(np.int64).max
    picked: list[int] = []
    picked_cost: list[int] = []
    picked_count: list[int] = []
    for step in range(n_param):
        j = _pick(np.where(alive, cost, big), count, topo, name_rank)
        picked.append(j)
        picked_cost.append(int(cost[j]))
        picked_count.append(int(count[j]))
        alive[j] = False
        above = col_classes[col_ptr[j] : col_ptr[j + 1]]
        killed = np.concatenate([above[alive_class[above]], [param_class[j]]])
        killed = killed[alive_class[killed]]
        alive_class[killed] = False
        class_step[killed] = step
        starts, ends = row_ptr[killed], row_ptr[killed + 1]
        lengths = ends - starts
        if lengths.sum():
            flat = np.concatenate([row_params[s:e] for s, e in zip(starts, ends, strict=True)])
            np.subtract.at(cost, flat, np.repeat(weight[killed], lengths))
            np.subtract.at(count, flat, np.repeat(size[killed], lengths))
    step_of = class_step[op_class]
    return _Stage1(names, index, list(params), picked, picked_cost, picked_count, step_of)


def _params_below(
    graph: OpGraph, names: list[str], index: Mapping[str, int], param_of: np.ndarray
) -> list[int]:
    """Which parameters each op lies strictly above (Python-int bitsets), bottom up."""
    succ = graph.succ
    below: list[int] = [0] * len(names)
    for i in range(len(names) - 1, -1, -1):
        b = 0
        for s in succ[names[i]]:
            k = index[s]
            b |= below[k]
            if param_of[k] >= 0:
                b |= 1 << int(param_of[k])
        below[i] = b
    return below


def _op_classes(
    below: list[int], param_of: np.ndarray, n_param: int
) -> tuple[np.ndarray, list[int], np.ndarray]:
    """Classes: same `below`; every parameter op gets a class of its own. Returns each
    op's class, each class's parameters below (bitset) and each parameter's class."""
    class_of_bits: dict[int, int] = {}
    op_class = np.empty(len(below), dtype=np.int64)
    class_bits: list[int] = []
    param_class = np.empty(n_param, dtype=np.int64)
    for i in range(len(below)):
        if param_of[i] >= 0:
            op_class[i] = len(class_bits)
            param_class[param_of[i]] = len(class_bits)
            class_bits.append(below[i])
            continue
        c = class_of_bits.get(below[i])
        if c is None:
            c = class_of_bits[below[i]] = len(class_bits)
            class_bits.append(below[i])
        op_class[i] = c
    return op_class, class_bits, param_class


def _pick(masked: np.ndarray, count: np.ndarray, topo: np.ndarray, name_rank: np.ndarray) -> int:
    """The next parameter: least cost (`masked`: picked ones at the int64 maximum), then
    fewest ops needed, then the earliest in topological order, then by name."""
    cand = np.flatnonzero(masked == masked.min())
    if cand.size > 1:
        cand = cand[count[cand] == count[cand].min()]
    if cand.size > 1:
        cand = cand[np.lexsort((name_rank[cand], topo[cand]))[:1]]
    return int(cand[0])


def _boundaries(
    graph: OpGraph, names: list[str], ticks: np.ndarray, params: Sequence[str], order: Sequence[str]
) -> dict[str, float]:
    """Ready time of each parameter when compute runs serially in `order`.

    A parameter is ready once its last ancestor in `order` has run; every op in
    `order` before that has run too. Ops missing from `order` go after it, in
    topological order.
    """
    index = {n: i for i, n in enumerate(names)}
    seen = set(order)
    full = [n for n in order if n in index] + [n for n in names if n not in seen]
    pos = np.empty(len(names), dtype=np.int64)
    for k, n in enumerate(full):
        pos[index[n]] = k
    ticks_in_order = ticks[[index[n] for n in full]]
    prefix = np.concatenate([[0], np.cumsum(ticks_in_order)])
    last = np.full(len(names), -1, dtype=np.int64)  # last position among strict ancestors
    pred = graph.pred
    for i, n in enumerate(names):
        m = -1
        for u in pred[n]:
            k = index[u]
            m = max(m, last[k], pos[k])
        last[i] = m
    return {p: int(prefix[last[index[p]] + 1]) / TICKS_PER_SECOND for p in params}


def activation_order(
    graph: OpGraph,
    time: Mapping[str, float] | TimeOracle,
    params: Sequence[str] | None = None,
    baseline: Sequence[str] | None = None,
) -> Activation:
    """Stage 1: the greedy activation order of `params` (default `gradient_transfers`).

    `time`: op -> seconds (a TimeOracle or a mapping; missing ops cost 0; transfers
    never count). `baseline`: an op order to report ``start_boundary_before`` against,
    e.g. the observed order of a step; default the graph's topological order.
    """
    return _activation(graph, time, params, baseline)[0]


def _activation(
    graph: OpGraph,
    time: Mapping[str, float] | TimeOracle,
    params: Sequence[str] | None,
    baseline: Sequence[str] | None,
) -> tuple[Activation, _Stage1]:
    times = time_map(time)
    params = list(gradient_transfers(graph) if params is None else params)
    for p in params:
        if p not in graph.ops:
            raise ValueError(f"parameter {p!r} is not an op of the graph")
    if len(set(params)) != len(params):
        raise ValueError("parameters repeat")
    s1 = _stage1(graph, times, params)
    order = [params[j] for j in s1.picked]
    needed: dict[str, list[str]] = {p: [] for p in order}
    param_set = set(params)
    for i, n in enumerate(s1.names):
        k = int(s1.step[i])
        if k >= 0 and n not in param_set:
            needed[order[k]].append(n)
    simultaneous: dict[str, str] = {}
    leader: str | None = None
    for p, c in zip(order, s1.count, strict=True):
        if c == 0 and leader is not None:
            simultaneous[p] = leader
        elif c > 0:
            leader = p
    ticks = _compute_ticks(graph, s1.names, times)
    after: dict[str, float] = {}
    total = 0
    for p, c in zip(order, s1.cost, strict=True):
        total += c
        after[p] = total / TICKS_PER_SECOND
    before = _boundaries(
        graph, s1.names, ticks, params, list(baseline) if baseline is not None else s1.names
    )
    activation = Activation(
        order=tuple(order),
        cost={p: c / TICKS_PER_SECOND for p, c in zip(order, s1.cost, strict=True)},
        needed={p: tuple(v) for p, v in needed.items()},
        simultaneous=simultaneous,
        start_boundary_after=after,
        start_boundary_before=before,
    )
    return activation, s1

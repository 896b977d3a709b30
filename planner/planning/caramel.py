"""Caramel (all-reduce): activation order, enforcement edges, and the whole plan.

Stage 1 (`activation_order`, Caramel §4.1): repeatedly pick the parameter whose
not-yet-done ancestor compute costs least, and mark those ancestors done. Ties (equal
cost, e.g. zero-time ops) go to the parameter needing fewer ops, then to the earlier
one in topological order, then by name: with that key a parameter is never picked
after one whose remaining needs strictly contain its own, so a parameter left with
nothing to do when another is picked activates *together* with it (``simultaneous``).

Stage 2 (`enforcement_edges`): ``N_i`` = the ops param i needs that are not done yet;
its *free set* ``F_i`` = the ops of ``N_i`` with no predecessor in ``N_i``; the *end set*
of param i = its direct predecessors. Edges go from the end set of the previous
parameter that needed ops to the free set of param i, skipping an end-set op that
reaches another one (the later one carries the order) and any edge the graph (with the
edges added so far) already implies. Then every op of ``N_i`` runs after param i-1 is
ready, so param i becomes ready strictly later; the new graph is the old one plus
edges between ops that the old one left unordered, so it stays acyclic and each of
its topological orders is one of the old graph's. Each added edge is in the
transitive reduction of the new graph (a later edge ends in a later stage and cannot
imply an earlier one).

Both stages run on ops collapsed into classes with the same set of parameters below
them: every op of a class is done by the same pick, so costs are kept per class and
updated with numpy when a pick kills classes (200k ops, thousands of parameters).
Times are summed as integer picoseconds, so costs and ties are exact.

The `caramel` pipeline then batches (§4.2), packs (§4.3) and picks depths (§4.4).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from planner.model.graph import OpGraph
from planner.model.oracle import NetworkModel, TimeOracle, fit_network_model
from planner.model.plan import Plan
from planner.model.trace import dedicated_durations, transfer_part
from planner.planning import batching, packing
from planner.planning.depth import depth, depth_table
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


@dataclass(frozen=True)
class Enforcement:
    """Stage 2's result: the control edges and what the construction considered.

    `candidates`: end-set x free-set pairs before any was dropped; `dropped_end`: pairs
    dropped because their end-set op reaches another end-set op; `implied`: pairs the
    graph (plus the edges added before) already implies.
    """

    edges: tuple[tuple[str, str], ...]
    candidates: int
    dropped_end: int
    implied: int
    stages: int


def gradient_transfers(graph: OpGraph) -> list[str]:
    """The parameters Caramel orders: collectives outside the forward pass.

    Falls back to every collective, then to sends (a PS worker's gradient pushes).
    """
    collectives = [n for n, op in graph.ops.items() if op.kind == "collective"]
    if collectives:
        grads = [n for n in collectives if graph.ops[n].phase != "forward"]
        return grads or collectives
    return [n for n, op in graph.ops.items() if op.kind == "send"]


def _time_map(time: Mapping[str, float] | TimeOracle) -> Mapping[str, float]:
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
    import networkx as nx  # here: a rank's tasks that plan nothing need not load it

    names = list(nx.topological_sort(graph.dag))
    index = {n: i for i, n in enumerate(names)}
    n_ops, n_param = len(names), len(params)
    ticks = _compute_ticks(graph, names, ticks_of)
    param_of = np.full(n_ops, -1, dtype=np.int64)
    for j, p in enumerate(params):
        param_of[index[p]] = j
    succ = graph.dag.succ

    # Which parameters each op lies strictly above (Python-int bitsets), bottom up.
    below: list[int] = [0] * n_ops
    for i in range(n_ops - 1, -1, -1):
        b = 0
        for s in succ[names[i]]:
            k = index[s]
            b |= below[k]
            if param_of[k] >= 0:
                b |= 1 << int(param_of[k])
        below[i] = b

    # Classes: same `below`; every parameter op gets a class of its own.
    class_of_bits: dict[int, int] = {}
    op_class = np.empty(n_ops, dtype=np.int64)
    class_bits: list[int] = []
    param_class = np.empty(n_param, dtype=np.int64)
    for i in range(n_ops):
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
    del below, class_of_bits
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
        masked = np.where(alive, cost, big)
        cand = np.flatnonzero(masked == masked.min())
        if cand.size > 1:
            cand = cand[count[cand] == count[cand].min()]
        if cand.size > 1:
            cand = cand[np.lexsort((name_rank[cand], topo[cand]))[:1]]
        j = int(cand[0])
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
    pred = graph.dag.pred
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
    times = _time_map(time)
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


def enforcement_edges(graph: OpGraph, activation: Activation) -> Enforcement:
    """Stage 2: control edges that make `activation.order` the only activation order.

    See the module docstring for the construction and its guarantees.
    """
    step: dict[str, int] = {}
    for i, p in enumerate(activation.order):
        for n in activation.needed[p]:
            step[n] = i
        step[p] = i
    pred, succ = graph.dag.pred, graph.dag.succ
    added: dict[str, list[str]] = {}

    def reach(source: str, low: int, high: int) -> set[str]:
        """Ops reachable from `source` through ops of steps in [low, high], and the
        first op past `high` on each path (the graph plus the edges added so far)."""
        seen = {source}
        queue = deque([source])
        while queue:
            x = queue.popleft()
            for y in (*succ[x], *added.get(x, ())):
                if y in seen:
                    continue
                k = step.get(y, -1)
                if k < low:
                    continue
                seen.add(y)
                if k <= high:
                    queue.append(y)
        return seen

    edges: list[tuple[str, str]] = []
    candidates = dropped_end = implied = stages = 0
    end: list[str] = []
    for i, p in enumerate(activation.order):
        need = activation.needed[p]
        if not need:
            continue
        if end:
            need_set = set(need)
            free = [v for v in need if not any(u in need_set for u in pred[v])]
            candidates += len(end) * len(free)
            stage_edges = 0
            for u in end:
                hit = reach(u, step.get(u, 0), i - 1)
                for v in free:
                    if v in hit:
                        implied += 1
                    else:
                        edges.append((u, v))
                        added.setdefault(u, []).append(v)
                        stage_edges += 1
            stages += stage_edges > 0
        # End set of p: its direct predecessors, keeping only those no other one follows.
        direct = sorted(pred[p], key=lambda u: step.get(u, -1))
        if len(direct) > 1:
            keep = []
            for u in direct:
                hit = reach(u, step.get(u, 0), i)
                if any(w in hit for w in direct if w != u):
                    dropped_end += 1
                else:
                    keep.append(u)
            direct = keep
        end = direct
    return Enforcement(tuple(edges), candidates, dropped_end, implied, stages)


def activation_positions(graph: OpGraph, order: Sequence[str]) -> dict[str, int]:
    """When each op becomes ready in the sequential run `order`: the position of its
    last predecessor (-1 for a root). The property Stage 2 guarantees is checked on this."""
    pos = {n: k for k, n in enumerate(order)}
    return {n: max((pos[u] for u in graph.dag.pred[n]), default=-1) for n in graph.ops}


def _phase_time(graph: OpGraph, times: Mapping[str, float], phases: Collection[str]) -> float:
    return float(
        sum(
            times.get(n, 0.0)
            for n, op in graph.ops.items()
            if not op.is_transfer and op.phase in phases
        )
    )


def caramel(
    graph: OpGraph,
    oracle: TimeOracle | Mapping[str, float],
    network: NetworkModel | None = None,
    *,
    rank: str = "",
    params: Sequence[str] | None = None,
    channels: int = 1,
    threshold: int | None = None,
    reads: Mapping[str, float] | None = None,
    baseline: Sequence[str] | None = None,
    batching_on: bool = True,
) -> Plan:
    """The whole Caramel plan for one rank.

    `network` defaults to the oracle's fitted model; `threshold` (bytes) to the
    batching threshold of `network`. `reads[p]`: seconds from the start of the next
    forward pass to the first read of parameter p (default: the mirror estimate of
    `packing.mirror_reads`). Returns a Plan with ``algorithm="caramel"``: `order` = the
    transfers in the order the network starts them, `priority` = group number,
    `control_edges` = Stage 2's edges; `properties` per transfer; `inputs` the
    network model, threshold, groups with placement and depth, and the edge counts.
    `batching_on` False sends every parameter alone (a network model that does not hold).
    """
    times = _time_map(oracle)
    if network is None and isinstance(oracle, TimeOracle):
        network = oracle.network
    activation, _ = _activation(graph, times, params, baseline)
    enforcement = enforcement_edges(graph, activation)
    if threshold is None and network is not None:
        threshold = batching.threshold_bytes(network)
    if not batching_on:  # the network model does not hold: every parameter alone
        threshold = None
    nbytes = {p: graph.ops[p].nbytes for p in activation.order}

    forward = _phase_time(graph, times, ("forward",))
    backward = _phase_time(graph, times, ("backward", "unknown"))
    # Serial compute in the chosen order: forward first, then backward; a parameter's
    # ready time in the backward pass is its start boundary after the forward part.
    ready = {
        p: min(max(activation.start_boundary_after[p] - forward, 0.0), backward)
        for p in activation.order
    }
    batches = batching.batch(activation.order, nbytes, ready, network, threshold)
    read_estimate = "given" if reads is not None else "mirror"
    if reads is None:
        reads = packing.mirror_reads(ready, backward, forward)
    groups = [
        packing.Group(
            name=f"group{k}",
            nbytes=b.nbytes,
            duration=network.time(b.nbytes) if network is not None else _group_time(b, times),
            ready=b.ready,
            read=min(reads.get(p, 0.0) for p in b.params),
        )
        for k, b in enumerate(batches)
    ]
    packed = packing.pack(groups, backward, forward, channels)

    by_group = {g.group: g for g in packed.placements}
    start_key = {k: packing.sort_key(by_group[f"group{k}"], backward) for k in range(len(batches))}
    sequence = sorted(range(len(batches)), key=lambda k: (start_key[k], k))
    transfer_order: list[str] = []
    priority: dict[str, int] = {}
    position = {p: i for i, p in enumerate(activation.order)}
    for number, k in enumerate(sequence):
        for p in sorted(batches[k].params, key=position.__getitem__):
            transfer_order.append(p)
            priority[p] = number
    transfer_order = dependency_order(graph, transfer_order)
    last = -1
    for p in transfer_order:  # a transfer moved after its ancestors takes their priority
        last = priority[p] = max(last, priority[p])
    group_docs = []
    props: dict[str, dict[str, float]] = {
        "activation_index": {},
        "activation_cost": {},
        "start_boundary_before": {},
        "start_boundary_after": {},
        "start_boundary_gain": {},
        "ready": {},
        "read": {},
        "group": {},
        "depth": {},
        "start": {},
        "end": {},
    }
    for number, k in enumerate(sequence):
        b, place = batches[k], by_group[f"group{k}"]
        d = depth(b.nbytes, threshold)
        group_docs.append(
            {
                "group": number,
                "params": list(b.params),
                "param_names": [graph.ops[p].param or p for p in b.params],
                "nbytes": b.nbytes,
                "depth": d,
                "ready": b.ready,
                "read": groups[k].read,
                "duration": groups[k].duration,
                "pass": place.pass_,
                "start": place.start,
                "end": place.end,
                "overhead": place.overhead,
            }
        )
        for p in b.params:
            props["group"][p] = number
            props["depth"][p] = d
            props["start"][p] = place.start
            props["end"][p] = place.end
    for i, p in enumerate(activation.order):
        props["activation_index"][p] = i
        props["activation_cost"][p] = activation.cost[p]
        props["start_boundary_before"][p] = activation.start_boundary_before[p]
        props["start_boundary_after"][p] = activation.start_boundary_after[p]
        props["start_boundary_gain"][p] = (
            activation.start_boundary_before[p] - activation.start_boundary_after[p]
        )
        props["ready"][p] = ready[p]
        props["read"][p] = reads.get(p, 0.0)
    inputs = {
        "n_ops": len(graph),
        "n_params": len(activation.order),
        "activation_order": list(activation.order),
        "simultaneous": dict(activation.simultaneous),
        "network": None
        if network is None
        else {"a": network.a, "b": network.b, "r2": _finite(network.r2), "points": network.points},
        "threshold_bytes": threshold,
        "depth_table": depth_table(threshold),
        "channels": channels,
        "forward_time": forward,
        "backward_time": backward,
        "packing_iteration_time": packed.iteration_time,
        "overhead": packed.overhead,
        "groups": group_docs,
        "edges": {
            "added": len(enforcement.edges),
            "candidates": enforcement.candidates,
            "dropped_end_set": enforcement.dropped_end,
            "implied": enforcement.implied,
            "stages_with_edges": enforcement.stages,
        },
        "read_estimate": read_estimate,
        "time_resolution_s": 1 / TICKS_PER_SECOND,
    }
    return Plan(
        algorithm="caramel",
        rank=rank,
        priority=priority,
        order=tuple(transfer_order),
        control_edges=enforcement.edges,
        properties=props,
        inputs=inputs,
    )


def dependency_order(graph: OpGraph, order: Sequence[str]) -> list[str]:
    """`order` (transfers of `graph`) as an order the DAG allows: a transfer that
    depends on another one (a path from it) goes after it, and otherwise the order is
    kept (of the transfers whose transfer ancestors are all placed, the first in
    `order` goes next). Packing places groups by their estimated ready and read times,
    which do not see such paths: on DLRM (HTA ``trace_diff``) the forward pass's
    all-to-alls feed one another through the compute stream (inferred stream syncs),
    and packing put ``all_to_all#4`` before the ``all_to_all#3`` it waits for, an
    order a runtime that launches collectives in plan order would deadlock on."""
    index = {p: k for k, p in enumerate(order)}
    names = graph.names
    n = len(names)
    own = [1 << index[name] if name in index else 0 for name in names]
    above = [0] * n  # per op: the transfers of `order` it depends on, as bits
    indegree = np.bincount(graph.dst, minlength=n).tolist()
    by_src = np.argsort(graph.src, kind="stable")
    bounds = np.searchsorted(graph.src[by_src], np.arange(n + 1)).tolist()
    successors = graph.dst[by_src].tolist()
    ready = deque(i for i in range(n) if indegree[i] == 0)
    while ready:
        u = ready.popleft()
        carried = above[u] | own[u]
        for v in successors[bounds[u] : bounds[u + 1]]:
            above[v] |= carried
            indegree[v] -= 1
            if not indegree[v]:
                ready.append(v)
    position = {name: i for i, name in enumerate(names)}
    needs = [above[position[p]] for p in order]
    if not any(needs):
        return list(order)
    out: list[str] = []
    placed = 0
    left = list(range(len(order)))
    while left:
        k = next(k for k in left if not needs[k] & ~placed)
        left.remove(k)
        out.append(order[k])
        placed |= 1 << k
    return out


def _group_time(b: batching.Batch, times: Mapping[str, float]) -> float:
    """Without a network model: the summed oracle times of the group's transfers."""
    return float(sum(times.get(p, 0.0) for p in b.params))


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


MIN_R2 = 0.9
"""A network fit below this R² does not hold: its batching threshold would be noise."""
MIN_SIZES = 3


def trace_network_model(graph: OpGraph, timings: pd.DataFrame) -> NetworkModel | None:
    """f(d) = a + b*d fitted to the transfers of a job's ranks, one point per size.

    `timings`: rows of `Trace.timings` (``op``, ``duration`` and ``wait`` in ns). Each
    point is the fastest transfer part (duration less the wait for peers) seen for that
    size over the ranks and steps, shared out among the transfers in flight with it on
    the rank (processor sharing, as the time oracle's `dedicated` times: gloo runs two
    all-reduces at once, each at about half the bandwidth): the uncontended transfer, as
    the time oracle takes the minimum of the runs. None with fewer than two distinct
    sizes. Lets Caramel run without a benchmark; check it with `network_problem`.
    """
    sizes = {n: graph.ops[n].nbytes for n in graph.transfers if graph.ops[n].nbytes > 0}
    rows = timings[timings["op"].isin(sizes)]
    start, span = transfer_part(rows)  # a collective's wait for its peers is no network time
    transfer = span.astype(np.float64)
    if {"rank", "iteration"} <= set(rows.columns):  # else no step to share out within
        for idx in rows.groupby(["rank", "iteration"], sort=False).indices.values():
            transfer[idx] = dedicated_durations(start[idx], span[idx])
    fastest = pd.Series(transfer, index=rows["op"].map(sizes).to_numpy()).groupby(level=0).min()
    return fit_network_model(
        fastest.index.to_numpy(dtype=np.float64), fastest.to_numpy(dtype=np.float64) / 1e9
    )


def network_problem(network: NetworkModel | None) -> str | None:
    """Why a fitted network model cannot be trusted for batching, or None when it holds
    (R² >= `MIN_R2` over at least `MIN_SIZES` sizes, b > 0)."""
    if network is None:
        return "fewer than two transfer sizes: no network model can be fitted"
    if network.points < MIN_SIZES:
        return f"only {network.points} transfer sizes (a fit needs {MIN_SIZES})"
    if not math.isfinite(network.r2) or network.r2 < MIN_R2:
        return f"the fit does not hold (R² {network.r2:.2f} < {MIN_R2})"
    if network.b <= 0:
        return "the fit has no per-byte cost (b = 0)"
    return None

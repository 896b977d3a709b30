"""TicTac's TIC and TAC: priorities for the recv ops of one worker partition.

With a parameter server every recv is a root of the worker DAG, so ordering the
transfers comes down to ordering the recvs (TicTac §2.2). Both heuristics read op
properties computed by UpdateProperties (Algorithm 1, §4.1):

- ``op.dep``: the recvs an op depends on, transitively (a recv's includes itself);
- ``op.M``: summed Time of the outstanding recvs in ``op.dep``;
- ``r.P``: summed Time of the ops that completing ``r`` alone would unblock;
- ``r.M_plus``: least ``op.M`` over the ops that wait on ``r`` and other outstanding
  recvs (+inf when there is none).

TIC (Algorithm 2) runs one update with the general oracle (Eq. 5: 1 per recv, 0 for
everything else) and uses ``M_plus`` as the priority. TAC (Algorithm 3) repeatedly
updates the properties over the outstanding recvs, picks the least one and numbers it.
Equation 6 is Johnson's rule for a two-machine flow shop (transfer ``M`` on the
network, then dependent compute ``P``); its pairwise form with the ``M_plus``
tie-break can cycle, so the pick uses Johnson's consistent form (`johnson_key`), as
DESIGN.md fixes.

Two implementations return identical plans: `tic_reference` / `tac_reference`
follow the paper literally (sets, one full UpdateProperties per pick), and `tic` /
`tac` collapse ops with equal ``dep`` into classes and update the properties
incrementally (numpy), which scales to 200k ops and 2k recvs. Times are quantized to
integer picoseconds before any sum so both compute exactly the same numbers; that
grid is far below trace resolution (1 ns).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from heapq import heapify, heappop, heappush

import numpy as np

from planner.model.graph import OpGraph, topological_sort
from planner.model.oracle import TimeOracle
from planner.model.plan import Plan, dense_priorities
from planner.planning.ticks import TICKS_PER_SECOND, set_bit_pairs, to_ticks

_NO_M_PLUS = np.iinfo(np.int64).max
_MAX_TOTAL_TICKS = 2**62

TimeInput = Mapping[str, float] | TimeOracle
Number = int | float


@dataclass(frozen=True)
class Properties:
    """Op properties after one UpdateProperties (Algorithm 1).

    `M` holds every op; `P` and `M_plus` hold the outstanding recvs.
    """

    M: Mapping[str, Number]
    P: Mapping[str, Number]
    M_plus: Mapping[str, Number]


def tic_time(graph: OpGraph) -> dict[str, float]:
    """TicTac's general time oracle (Eq. 5): 1 for recv ops, 0 for every other op."""
    return {name: 1.0 if op.kind == "recv" else 0.0 for name, op in graph.ops.items()}


def communication_dependencies(graph: OpGraph) -> dict[str, frozenset[str]]:
    """``op.dep`` for every op: the recvs it depends on, transitively.

    A recv's dep holds itself (and, should a recv not be a root, the recvs above it).
    """
    dep: dict[str, frozenset[str]] = {}
    pred = graph.pred
    for name in topological_sort(graph):
        own = {name} if graph.ops[name].kind == "recv" else set()
        dep[name] = frozenset(own.union(*(dep[u] for u in pred[name])))
    return dep


def update_properties(
    graph: OpGraph,
    time: Mapping[str, Number],
    outstanding: Collection[str],
    dep: Mapping[str, frozenset[str]] | None = None,
) -> Properties:
    """Algorithm 1 as printed: M for every op, P and M_plus for the recvs in `outstanding`.

    `time` maps op name -> cost (missing = 0); `dep` defaults to
    `communication_dependencies(graph)`.
    """
    if dep is None:
        dep = communication_dependencies(graph)
    R = frozenset(outstanding)
    D_of = {op: dep[op] & R for op in graph.ops}
    time_R = {r: time.get(r, 0) for r in R}
    M = {op: sum(map(time_R.__getitem__, D_of[op])) for op in graph.ops}
    P: dict[str, Number] = dict.fromkeys(R, 0)
    M_plus: dict[str, Number] = dict.fromkeys(R, math.inf)
    for op in graph.ops:
        if op in R:
            continue
        D = D_of[op]
        if len(D) == 1:
            (r,) = D
            P[r] = P[r] + time.get(op, 0)
        elif len(D) > 1:
            for r in D:
                M_plus[r] = min(M_plus[r], M[op])
    return Properties(M=M, P=P, M_plus=M_plus)


def johnson_key(M: Number, P: Number, M_plus: Number, name: str) -> tuple:
    """Sort key of a recv in Johnson's consistent form of Equation 6.

    Recvs with ``M < P`` come first by increasing ``M``, then the others by decreasing
    ``P``; equal keys go by smaller ``M_plus``, then by name.
    """
    if M < P:
        return (0, M, M_plus, name)
    return (1, -P, M_plus, name)


def eq6_less(a: str, b: str, props: Properties) -> bool:
    """Equation 6 pairwise: `a` before `b` iff ``min(P_b, M_a) < min(P_a, M_b)``.

    On equality the smaller ``M_plus`` goes first. (Algorithm 3 as printed swaps the
    two sides, which would put recv2 before recv1 in Figure 1a.) Not transitive: see
    `johnson_key` for the order the schedulers use.
    """
    left = min(props.P[b], props.M[a])
    right = min(props.P[a], props.M[b])
    if left != right:
        return left < right
    return props.M_plus[a] < props.M_plus[b]


# --------------------------------------------------------------------------- shared


def _time_map(time: TimeInput) -> Mapping[str, float]:
    return time.times if isinstance(time, TimeOracle) else time


def _ticks(graph: OpGraph, time: Mapping[str, float]) -> np.ndarray:
    """Integer picoseconds per op, in graph order; rejects negative or non-finite times."""
    seconds = np.array([float(time.get(name, 0.0)) for name in graph.ops], dtype=np.float64)
    ticks = to_ticks(list(graph.ops), seconds)
    if seconds.size and float(seconds.sum()) * TICKS_PER_SECOND >= _MAX_TOTAL_TICKS:
        raise ValueError("the times sum to more than the 1 ps grid can hold (~4.6e6 s)")
    return ticks


def _seconds(value: Number) -> float:
    return math.inf if value == math.inf else int(value) / TICKS_PER_SECOND


def _props_out(records: Mapping[str, tuple[Number, Number, Number]]) -> dict[str, dict]:
    """Plan.properties from (M, P, M_plus) in ticks per recv, in oracle units (seconds)."""
    return {
        "M_plus": {r: _seconds(v[2]) for r, v in records.items()},
        "P": {r: _seconds(v[1]) for r, v in records.items()},
        "M": {r: _seconds(v[0]) for r, v in records.items()},
    }


def _inputs(graph: OpGraph, oracle: str) -> dict[str, object]:
    return {
        "oracle": oracle,
        "n_ops": len(graph),
        "n_recvs": len(graph.recvs),
        "time_resolution_s": 1 / TICKS_PER_SECOND,
    }


def _recv_order(graph: OpGraph, key: Mapping[str, Number]) -> tuple[str, ...]:
    """Recvs by (key, name), but never before a recv they depend on.

    In a worker partition every recv is a root and this is a plain sort; a recv fed by
    another recv must still follow it, or a sender counter would wait forever.
    """
    pred = graph.pred
    if all(not pred[r] for r in key):
        return tuple(sorted(key, key=lambda r: (key[r], r)))
    # the lowest (key, name) among the recvs whose upstream recvs are all placed: the one
    # order there is (networkx's lexicographical_topological_sort, without networkx)
    above = {r: _ancestors(pred, r).intersection(key) for r in key}
    below: dict[str, list[str]] = {r: [] for r in key}
    for r, upstream in above.items():
        for a in upstream:
            below[a].append(r)
    waiting = {r: len(upstream) for r, upstream in above.items()}
    ready = [(key[r], r) for r in key if not waiting[r]]
    heapify(ready)
    order = []
    while ready:
        _, r = heappop(ready)
        order.append(r)
        for b in below[r]:
            waiting[b] -= 1
            if not waiting[b]:
                heappush(ready, (key[b], b))
    return tuple(order)


def _ancestors(pred: Mapping[str, Mapping[str, None]], node: str) -> set[str]:
    """The ops with a path to `node` (`OpGraph.pred`)."""
    seen: set[str] = set()
    stack = list(pred[node])
    while stack:
        u = stack.pop()
        if u not in seen:
            seen.add(u)
            stack.extend(pred[u])
    return seen


def _tic_plan(graph: OpGraph, rank: str, m_plus: Mapping[str, Number], records: dict) -> Plan:
    order = _recv_order(graph, m_plus)
    return Plan(
        algorithm="tic",
        rank=rank,
        priority=dense_priorities(m_plus),
        order=order,
        properties=_props_out(records),
        inputs=_inputs(graph, "tic"),
    )


def _tac_plan(graph: OpGraph, rank: str, order: list[str], records: dict) -> Plan:
    return Plan(
        algorithm="tac",
        rank=rank,
        priority={r: i for i, r in enumerate(order)},
        order=tuple(order),
        properties=_props_out(records),
        inputs=_inputs(graph, "time"),
    )


# ------------------------------------------------------------------------ reference


def tic_reference(graph: OpGraph, rank: str = "") -> Plan:
    """TIC (Algorithm 2), literally: one UpdateProperties with the TIC oracle.

    priority = ``M_plus`` as dense ranks (+inf last); order = by (``M_plus``, name);
    `properties` in TIC oracle units (1 per recv).
    """
    ticks = dict(zip(graph.ops, (int(t) for t in _ticks(graph, tic_time(graph))), strict=True))
    recvs = graph.recvs
    props = update_properties(graph, ticks, recvs)
    records = {r: (props.M[r], props.P[r], props.M_plus[r]) for r in recvs}
    return _tic_plan(graph, rank, {r: props.M_plus[r] for r in recvs}, records)


def tac_reference(graph: OpGraph, time: TimeInput, rank: str = "") -> Plan:
    """TAC (Algorithm 3), literally: update, pick the least recv by `johnson_key`, repeat.

    priority = pick index; `properties` hold each recv's figures when it was picked.
    """
    ticks = dict(zip(graph.ops, (int(t) for t in _ticks(graph, _time_map(time))), strict=True))
    dep = communication_dependencies(graph)
    outstanding = set(graph.recvs)
    order: list[str] = []
    records: dict[str, tuple[Number, Number, Number]] = {}
    while outstanding:
        props = update_properties(graph, ticks, outstanding, dep)
        # A recv downstream of an outstanding recv cannot go first (the sender
        # counter would wait forever); in a worker partition every recv is a root.
        ready = [r for r in outstanding if not (dep[r] - {r}) & outstanding]
        pick = min(
            ready,
            key=lambda r: johnson_key(props.M[r], props.P[r], props.M_plus[r], r),
        )
        records[pick] = (props.M[pick], props.P[pick], props.M_plus[pick])
        outstanding.remove(pick)
        order.append(pick)
    return _tac_plan(graph, rank, order, records)


# ----------------------------------------------------------------------------- fast


class _Classes:
    """Ops collapsed into dep-classes, with Algorithm 1's figures kept incrementally.

    Ops with the same ``dep`` behave alike in Algorithm 1: they share ``M``, only their
    summed time reaches ``P``, and only their common ``M`` reaches ``M_plus``. Per class
    ``c`` this keeps, over the outstanding recvs: ``count`` = |dep ∩ R|, ``M``, ``idxsum``
    (the sum of their indices, i.e. the one left when count is 1), ``weight`` (summed
    time of its ops in G−R) and ``active`` (it has an op in G−R). Recv ``r``'s classes are
    ``rows[ptr[r]:ptr[r+1]]``.
    """

    def __init__(self, graph: OpGraph, ticks: np.ndarray) -> None:
        names = list(graph.ops)
        index = {name: i for i, name in enumerate(names)}
        self.recvs = graph.recvs
        n_recv = len(self.recvs)
        recv_bit = {name: 1 << j for j, name in enumerate(self.recvs)}

        # op.dep as Python-int bitsets over the recvs, in one topological pass.
        pred = graph.pred
        bits: dict[str, int] = {}
        for v in topological_sort(graph):
            b = recv_bit.get(v, 0)
            for u in pred[v]:
                b |= bits[u]
            bits[v] = b
        class_of_bits: dict[int, int] = {}
        op_class = np.empty(len(names), dtype=np.int64)
        for name in names:
            op_class[index[name]] = class_of_bits.setdefault(bits[name], len(class_of_bits))
        del bits
        n_class = len(class_of_bits)

        rows, cols = set_bit_pairs(list(class_of_bits), n_recv)
        recv_ticks = ticks[[index[r] for r in self.recvs]].astype(np.int64)
        self.recv_ticks = recv_ticks
        self.recv_class = op_class[[index[r] for r in self.recvs]]

        self.count = np.bincount(rows, minlength=n_class).astype(np.int64)
        self.M = np.zeros(n_class, dtype=np.int64)
        np.add.at(self.M, rows, recv_ticks[cols])
        self.idxsum = np.zeros(n_class, dtype=np.int64)
        np.add.at(self.idxsum, rows, cols)

        is_recv = np.zeros(len(names), dtype=bool)
        is_recv[[index[r] for r in self.recvs]] = True
        others = op_class[~is_recv]
        self.weight = np.zeros(n_class, dtype=np.int64)
        np.add.at(self.weight, others, ticks[~is_recv])
        self.active = np.bincount(others, minlength=n_class) > 0

        order = np.argsort(cols, kind="stable")
        self.rows = rows[order]
        self.ptr = np.zeros(n_recv + 1, dtype=np.int64)
        np.cumsum(np.bincount(cols, minlength=n_recv), out=self.ptr[1:])

        self.P = np.zeros(n_recv, dtype=np.int64)
        single = self.active & (self.count == 1)
        np.add.at(self.P, self.idxsum[single], self.weight[single])

    def recv_M(self) -> np.ndarray:
        """``r.M`` for every recv (meaningful for the outstanding ones)."""
        return self.M[self.recv_class]

    def m_plus(self, r: int) -> int:
        """``r.M_plus`` of one outstanding recv (`_NO_M_PLUS` for +inf)."""
        cls = self.rows[self.ptr[r] : self.ptr[r + 1]]
        multi = cls[self.active[cls] & (self.count[cls] > 1)]
        return int(self.M[multi].min()) if multi.size else int(_NO_M_PLUS)

    def m_plus_all(self) -> np.ndarray:
        """``M_plus`` of every recv by a masked column-min (meaningful if outstanding)."""
        multi = self.active & (self.count > 1)
        values = np.where(multi[self.rows], self.M[self.rows], _NO_M_PLUS)
        # Every column holds at least the recv's own class, so no segment is empty.
        return np.minimum.reduceat(values, self.ptr[:-1])

    def remove(self, r: int) -> None:
        """Take recv `r` out of R: it joins G−R, its classes lose it."""
        own = self.recv_class[r]
        self.weight[own] += self.recv_ticks[r]
        self.active[own] = True
        cls = self.rows[self.ptr[r] : self.ptr[r + 1]]
        self.count[cls] -= 1
        self.M[cls] -= self.recv_ticks[r]
        self.idxsum[cls] -= r
        single = cls[(self.count[cls] == 1) & self.active[cls]]
        np.add.at(self.P, self.idxsum[single], self.weight[single])


def _py(value: np.integer) -> Number:
    return math.inf if value == _NO_M_PLUS else int(value)


def tic(graph: OpGraph, rank: str = "") -> Plan:
    """TIC (Algorithm 2) on dep-classes; the same plan as `tic_reference`.

    `properties` are in TIC oracle units (1 per recv), not seconds.
    """
    recvs = graph.recvs
    if not recvs:
        return _tic_plan(graph, rank, {}, {})
    state = _Classes(graph, _ticks(graph, tic_time(graph)))
    m_plus = state.m_plus_all()
    M = state.recv_M()
    records = {r: (int(M[j]), int(state.P[j]), _py(m_plus[j])) for j, r in enumerate(recvs)}
    return _tic_plan(graph, rank, {r: _py(m_plus[j]) for j, r in enumerate(recvs)}, records)


_FEW_CANDIDATES = 32


def tac(graph: OpGraph, time: TimeInput, rank: str = "") -> Plan:
    """TAC (Algorithm 3) on dep-classes, updated per pick; the same plan as `tac_reference`.

    Per pick: Johnson's primary key (group, then ``M`` or ``-P``) over the outstanding
    recvs, vectorized; ``M_plus`` and the name only for recvs tied on it.
    """
    recvs = graph.recvs
    if not recvs:
        return _tac_plan(graph, rank, [], {})
    state = _Classes(graph, _ticks(graph, _time_map(time)))
    n = len(recvs)
    name_rank = np.empty(n, dtype=np.int64)
    name_rank[sorted(range(n), key=recvs.__getitem__)] = np.arange(n)
    alive = np.ones(n, dtype=bool)
    order: list[str] = []
    records: dict[str, tuple[Number, Number, Number]] = {}
    for _ in range(n):
        M = state.recv_M()
        P = state.P
        late = M >= P  # Johnson: M < P first (by M), then the rest (by decreasing P)
        ready = alive & (state.count[state.recv_class] == 1)
        group = late.astype(np.int64) + 2 * ~ready
        second = np.where(late, -P, M)
        tied = group == group.min()
        tied &= second == second[tied].min()
        cand = np.flatnonzero(tied)
        if cand.size == 1:
            pick = int(cand[0])
            mp = state.m_plus(pick)
        else:
            if cand.size <= _FEW_CANDIDATES:
                mps = np.array([state.m_plus(int(j)) for j in cand], dtype=np.int64)
            else:
                mps = state.m_plus_all()[cand]
            best = np.lexsort((name_rank[cand], mps))[0]
            pick, mp = int(cand[best]), int(mps[best])
        name = recvs[pick]
        records[name] = (int(M[pick]), int(P[pick]), _py(np.int64(mp)))
        order.append(name)
        alive[pick] = False
        state.remove(pick)
    return _tac_plan(graph, rank, order, records)

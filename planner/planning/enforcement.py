"""Caramel's Stage 2 (§4.1, Dataflow DAG Optimizer): enforcing the activation order.

``N_i`` = the ops param i needs that are not done yet; its *free set* ``F_i`` = the ops
of ``N_i`` with no predecessor in ``N_i``; the *end set* of param i = its direct
predecessors. Edges go from the end set of the previous parameter that needed ops to
the free set of param i, skipping an end-set op that reaches another one (the later one
carries the order) and any edge the graph (with the edges added so far) already
implies. Then every op of ``N_i`` runs after param i-1 is ready, so param i becomes
ready strictly later; the new graph is the old one plus edges between ops that the old
one left unordered, so it stays acyclic and each of its topological orders is one of
the old graph's. Each added edge is in the transitive reduction of the new graph (a
later edge ends in a later stage and cannot imply an earlier one). Apart from Stage 1
(`planner.planning.activation`), whose order it enforces.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from planner.model.graph import OpGraph
from planner.planning.activation import Activation


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


def enforcement_edges(graph: OpGraph, activation: Activation) -> Enforcement:
    """Stage 2: control edges that make `activation.order` the only activation order.

    See the module docstring for the construction and its guarantees.
    """
    step: dict[str, int] = {}
    for i, p in enumerate(activation.order):
        for n in activation.needed[p]:
            step[n] = i
        step[p] = i
    pred, succ = graph.pred, graph.succ
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
    return {n: max((pos[u] for u in graph.pred[n]), default=-1) for n in graph.ops}

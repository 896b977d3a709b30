"""The op graph's own views (`OpGraph.pred`, `OpGraph.succ`, `topological_sort`) hold
what its networkx view (`OpGraph.dag`) does, in the very order: the planners walk them
instead, without importing networkx, and their ties follow that order."""

from __future__ import annotations

from functools import cache

import networkx as nx
import numpy as np
import pytest
from conftest import DEMO, RESNET_IN_REPO

from planner.ingest import detect
from planner.model.graph import GraphError, Op, OpGraph, topological_sort


@cache
def _graphs() -> list[tuple[str, OpGraph]]:
    graphs = []
    for path in (DEMO, RESNET_IN_REPO):
        job = detect.load([path])
        graphs += [(f"{path.name}/{rank}", job.graphs[rank]) for rank in job.ranks]
    return graphs


def _repeated_edge() -> OpGraph:
    """Edges given as arrays (as the Kineto ingest does), one of them twice, out of op
    order: a view must keep a repeated edge once, where its first copy stood."""
    ops = {name: Op(name) for name in "edcba"}
    src, dst = np.array([4, 0, 4, 1, 3, 0]), np.array([2, 1, 2, 2, 1, 3])
    return OpGraph(ops=ops, src=src, dst=dst, control=np.zeros(6, dtype=bool))


@pytest.mark.parametrize(
    "graph", [g for _, g in _graphs()] + [_repeated_edge()],
    ids=[n for n, _ in _graphs()] + ["repeated-edge"],
)  # fmt: skip
def test_views_are_the_networkx_views_in_their_order(graph: OpGraph) -> None:
    dag = graph.dag
    assert list(graph.pred) == list(dag.pred) == list(graph.ops)
    for name in graph.ops:
        assert list(graph.pred[name]) == list(dag.pred[name])
        assert list(graph.succ[name]) == list(dag.succ[name])
    assert topological_sort(graph) == list(nx.topological_sort(dag))


def test_topological_sort_of_a_cycle_names_it() -> None:
    ops = {name: Op(name) for name in "abc"}
    cyclic = OpGraph(ops, np.array([0, 1, 2]), np.array([1, 2, 0]), np.zeros(3, dtype=bool))
    with pytest.raises(GraphError, match="cycle"):
        topological_sort(cyclic)


def test_recv_order_is_networkx_lexicographic_order() -> None:
    """TIC's recv order where recvs feed recvs (the demo's PS worker): the order
    networkx's lexicographical_topological_sort gives the recvs' upstream graph, for the
    plan's own keys and for seeded ones that put later recvs first."""
    from planner.planning import tictac

    graph = detect.load([DEMO]).graphs["worker0"]
    recvs = graph.recvs
    assert any(graph.pred[r] for r in recvs)  # not a plain sort
    rng = np.random.default_rng(3)
    plan = tictac.tic(graph, rank="worker0")
    keys = [{r: plan.order.index(r) for r in recvs}]
    keys += [{r: int(k) for r, k in zip(recvs, rng.permutation(len(recvs)), strict=True)}]
    keys += [dict.fromkeys(recvs, 0.0)]
    for key in keys:
        upstream = nx.DiGraph()
        upstream.add_nodes_from(key)
        for r in key:
            upstream.add_edges_from((a, r) for a in nx.ancestors(graph.dag, r) if a in key)
        expected = nx.lexicographical_topological_sort(upstream, key=lambda r: (key[r], r))
        assert tictac._recv_order(graph, key) == tuple(expected)

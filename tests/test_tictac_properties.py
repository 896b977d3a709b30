"""The fast TIC/TAC give the same plans as the literal ones, on random DAGs."""

from __future__ import annotations

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.model.graph import Op, OpGraph, OpKind, build_graph
from planner.model.plan import Plan
from planner.planning import tictac
from planner.planning.tictac import tac, tac_reference, tic, tic_reference

Case = tuple[OpGraph, dict[str, float]]

integer_times = st.integers(0, 4).map(float)
float_times = st.floats(0.0, 1e-2, allow_nan=False, allow_infinity=False)


@st.composite
def worker_dags(draw: st.DrawFn, paper_shape: bool = True) -> Case:
    """Random DAGs with random times.

    `paper_shape`: recvs are roots and sends leaves (a PS worker partition, TicTac
    §2.2); otherwise any op kind anywhere. Edges go from lower to higher position, so
    the graph is acyclic; names are shuffled so graph order is not name order.
    """
    n_recv = draw(st.integers(0, 7))
    n_compute = draw(st.integers(0, 18))
    n_send = draw(st.integers(0, 4))
    kinds: list[OpKind] = ["recv"] * n_recv + ["compute"] * n_compute + ["send"] * n_send
    if not paper_shape:
        kinds = draw(st.permutations(kinds))
    n = len(kinds)
    labels = draw(st.permutations(range(n)))
    names = [f"{kind[0]}{labels[i]:02d}" for i, kind in enumerate(kinds)]
    edges: list[tuple[str, str]] = []
    density = draw(st.sampled_from([0.15, 0.3, 0.6]))
    for j in range(n):
        if paper_shape and kinds[j] == "recv":
            continue
        for i in range(j):
            if paper_shape and kinds[i] == "send":
                continue
            if draw(st.floats(0, 1)) < density:
                edges.append((names[i], names[j]))
    times = draw(st.one_of(st.just(integer_times), st.just(float_times)))
    missing = draw(st.sets(st.sampled_from(names))) if names else set()
    time = {name: draw(times) for name in names if name not in missing}
    ops = [Op(name, kinds[i]) for i, name in enumerate(names)]
    return build_graph(ops, edges), time


def assert_valid(plan: Plan, graph: OpGraph) -> None:
    """Priorities cover the recvs; the order is a permutation that respects the DAG."""
    assert set(plan.priority) == set(graph.recvs)
    assert sorted(plan.order) == sorted(graph.recvs)
    index = plan.order_index()
    for b in graph.recvs:
        for a in nx.ancestors(graph.dag, b):
            if a in index:
                assert index[a] < index[b], (a, b)
    if all(graph.dag.in_degree(r) == 0 for r in graph.recvs):
        assert [plan.priority[r] for r in plan.order] == sorted(plan.priority.values())


@settings(max_examples=400, deadline=None)
@given(worker_dags())
def test_fast_tac_equals_reference(case: Case) -> None:
    graph, time = case
    fast, ref = tac(graph, time), tac_reference(graph, time)
    assert fast.priority == ref.priority
    assert fast.order == ref.order
    assert fast == ref  # properties at each pick and inputs too
    assert_valid(fast, graph)


@settings(max_examples=300, deadline=None)
@given(worker_dags())
def test_fast_tic_equals_reference(case: Case) -> None:
    graph, _ = case
    fast, ref = tic(graph), tic_reference(graph)
    assert fast.priority == ref.priority
    assert fast.order == ref.order
    assert fast == ref
    assert_valid(fast, graph)


@settings(max_examples=200, deadline=None)
@given(worker_dags(paper_shape=False))
def test_fast_equals_reference_with_recvs_anywhere(case: Case) -> None:
    # Non-root recvs: a picked recv joins G−R with its own time and outstanding deps.
    graph, time = case
    assert tac(graph, time) == tac_reference(graph, time)
    assert tic(graph) == tic_reference(graph)


@settings(max_examples=150, deadline=None)
@given(worker_dags())
def test_fast_tac_equals_reference_on_the_vectorized_path(case: Case) -> None:
    # Every tie goes through the all-recv M_plus (column-min) path.
    graph, time = case
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tictac, "_FEW_CANDIDATES", 0)
        assert tac(graph, time) == tac_reference(graph, time)


@settings(max_examples=100, deadline=None)
@given(worker_dags(), st.randoms(use_true_random=False))
def test_plans_do_not_depend_on_graph_construction_order(case: Case, rnd) -> None:
    graph, time = case
    ops = list(graph.ops.values())
    edges = graph.edges()
    rnd.shuffle(ops)
    rnd.shuffle(edges)
    shuffled = build_graph(ops, edges)
    assert tac(shuffled, time) == tac(graph, time)
    assert tic(shuffled) == tic(graph)

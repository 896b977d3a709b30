"""Caramel worked checks: hand-built DAGs, threshold closed form, depth, batcher, packing."""

from __future__ import annotations

import math

import pytest

from planner.model.graph import Op, OpGraph, build_graph
from planner.model.oracle import NetworkModel
from planner.planning import batching, packing
from planner.planning.activation import activation_order, gradient_transfers
from planner.planning.caramel import caramel
from planner.planning.depth import depth, depth_table
from planner.planning.enforcement import enforcement_edges


def _param(name: str, nbytes: int = 100) -> Op:
    return Op(name, "collective", "net", param=name, nbytes=nbytes, phase="backward")


def figure_dag() -> tuple[OpGraph, dict[str, float]]:
    """Two gradients after a shared loss: A needs a1 (3 s), B needs b1 -> b2 (1 s each).

    Greedy: B first (loss + b1 + b2 = 3 s < loss + a1 = 4 s), then A (a1 = 3 s).
    Enforcement: end set of B = {b2}, free set of A = {a1}: one edge b2 -> a1.
    """
    ops = [Op("loss"), Op("a1"), Op("b1"), Op("b2"), _param("A"), _param("B", 1000)]
    edges = [("loss", "a1"), ("loss", "b1"), ("b1", "b2"), ("a1", "A"), ("b2", "B")]
    return build_graph(ops, edges), {"loss": 1.0, "a1": 3.0, "b1": 1.0, "b2": 1.0}


def test_greedy_order_and_edges_on_figure_dag() -> None:
    graph, time = figure_dag()
    act = activation_order(graph, time)
    assert act.order == ("B", "A")
    assert act.cost == {"B": 3.0, "A": 3.0}
    assert act.needed == {"B": ("loss", "b1", "b2"), "A": ("a1",)}
    assert act.start_boundary_after == {"B": 3.0, "A": 6.0}
    enforcement = enforcement_edges(graph, act)
    assert enforcement.edges == (("b2", "a1"),)
    assert (enforcement.candidates, enforcement.implied, enforcement.dropped_end) == (1, 0, 0)


def test_start_boundary_before_follows_the_baseline_order() -> None:
    graph, time = figure_dag()
    # Baseline runs A's branch first: A ready after loss + a1 = 4, B after everything = 6.
    act = activation_order(graph, time, baseline=["loss", "a1", "b1", "b2", "A", "B"])
    assert act.start_boundary_before == {"A": 4.0, "B": 6.0}
    # Caramel makes B ready 3 s earlier and A no later than it was in the worst case.
    gain = {p: act.start_boundary_before[p] - act.start_boundary_after[p] for p in act.order}
    assert gain == {"A": -2.0, "B": 3.0}


def test_end_set_drops_ops_that_reach_another_and_implied_edges() -> None:
    """P1 <- {x, y} with x -> y: x leaves P1's end set (y carries it). P2 needs z, a
    root: edge y -> z. P3 needs w, which already follows z: that edge is implied."""
    ops = [Op(n) for n in ("x", "y", "z", "w")] + [_param("P1"), _param("P2"), _param("P3")]
    edges = [
        ("x", "y"), ("y", "P1"), ("x", "P1"), ("z", "P2"), ("y", "w"), ("z", "w"), ("w", "P3")
    ]  # fmt: skip
    graph = build_graph(ops, edges)
    time = {"x": 1.0, "y": 1.0, "z": 3.0, "w": 5.0}
    act = activation_order(graph, time)
    assert act.order == ("P1", "P2", "P3")
    enforcement = enforcement_edges(graph, act)
    assert enforcement.edges == (("y", "z"),)
    assert enforcement.dropped_end == 1
    assert (enforcement.candidates, enforcement.implied) == (2, 1)
    plan = caramel(graph, time, NetworkModel(0.0, 1e-9))
    assert plan.control_edges == enforcement.edges
    assert plan.inputs["edges"]["added"] == 1


def test_three_stage_chain_edges() -> None:
    """Independent branches: P1 <- a (1 s), P2 <- b (2 s), P3 <- c (3 s): order by cost,
    and one edge per stage: a -> b, b -> c."""
    ops = [Op("a"), Op("b"), Op("c"), _param("P1"), _param("P2"), _param("P3")]
    graph = build_graph(ops, [("a", "P1"), ("b", "P2"), ("c", "P3")])
    act = activation_order(graph, {"a": 1.0, "b": 2.0, "c": 3.0})
    assert act.order == ("P1", "P2", "P3")
    assert enforcement_edges(graph, act).edges == (("a", "b"), ("b", "c"))
    # Costs reversed: the order reverses too.
    act = activation_order(graph, {"a": 3.0, "b": 2.0, "c": 1.0})
    assert act.order == ("P3", "P2", "P1")
    assert enforcement_edges(graph, act).edges == (("c", "b"), ("b", "a"))


def test_shared_producer_is_simultaneous_and_gets_no_edge() -> None:
    ops = [Op("g"), Op("h"), _param("P1"), _param("P2"), _param("P3")]
    graph = build_graph(ops, [("g", "P1"), ("g", "P2"), ("g", "h"), ("h", "P3")])
    act = activation_order(graph, {"g": 1.0, "h": 1.0})
    assert act.order[2] == "P3"
    second = act.order[1]
    assert act.simultaneous == {second: act.order[0]}
    assert act.needed[second] == ()
    assert enforcement_edges(graph, act).edges == ()  # h already follows g


def test_zero_time_ties_prefer_fewer_needed_ops() -> None:
    """Costs tie at 0; P1 needs only x, P2 needs x and y: P1 first, else P1 would
    activate before P2 whatever the edges."""
    ops = [Op("x"), Op("y"), _param("P2"), _param("P1")]
    graph = build_graph(ops, [("x", "y"), ("y", "P2"), ("x", "P1")])
    act = activation_order(graph, {})
    assert act.order == ("P1", "P2")


def test_gradient_transfers_skip_forward_broadcasts() -> None:
    ops = [
        Op("bcast", "collective", "net", nbytes=8, phase="forward"),
        Op("fw", phase="forward"),
        _param("grad"),
    ]
    graph = build_graph(ops, [("bcast", "fw"), ("fw", "grad")])
    assert gradient_transfers(graph) == ["grad"]


def test_unknown_param_is_rejected() -> None:
    graph, time = figure_dag()
    with pytest.raises(ValueError, match="not an op"):
        activation_order(graph, time, params=["nope"])


# ------------------------------------------------------------------ threshold & depth


@pytest.mark.parametrize(
    ("a", "b"),
    [(1e-4, 1e-9), (3.1e-4, 9.8e-10), (5e-5, 8e-10), (2e-3, 1e-10), (1e-6, 1e-6), (7e-5, 3e-9)],
)
def test_threshold_closed_form_matches_numeric_search(a: float, b: float) -> None:
    model = NetworkModel(a, b)
    closed = batching.threshold_bytes(model)
    assert closed == batching.threshold_search(model.time)
    assert closed == math.floor(1.5 * a / b) + 1
    # The defining property at the boundary: ratio > 0.8 at x, not at x - 1.
    ratio = lambda x: model.time(2 * x) / (2 * model.time(x))  # noqa: E731
    assert ratio(closed) > 0.8 >= ratio(closed - 1)


def test_threshold_edge_cases() -> None:
    assert batching.threshold_bytes(NetworkModel(1e-4, 0.0)) is None  # always batch
    assert batching.threshold_bytes(NetworkModel(0.0, 1e-9)) == 1  # no fixed cost
    assert batching.threshold_bound(NetworkModel(2.0, 1.0), ratio=0.75) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        batching.threshold_bound(NetworkModel(1.0, 1.0), ratio=0.4)


def test_depth_rule_and_table() -> None:
    t = 1000
    assert [depth(n, t) for n in (0, 1999, 2000, 3999, 4000, 7999, 8000, 10**9)] == [
        1, 1, 2, 2, 4, 4, 8, 8
    ]  # fmt: skip
    assert depth(10**9, None) == 1
    for row in depth_table(t):
        low, high = row["min_bytes"], row["max_bytes"]
        assert depth(low, t) == row["depth"]
        if high is not None:
            assert depth(high - 1, t) == row["depth"]
            assert depth(high, t) != row["depth"]
        # Every chunk stays at least the threshold, except depth 1 (no split).
        if row["depth"] > 1:
            assert low // row["depth"] >= t


def test_fit_report_exact_linear_data() -> None:
    sizes = [64, 4096, 65536, 1 << 20, 4 << 20]
    seconds = [1e-4 + 1e-9 * s for s in sizes]
    report = batching.fit_report(sizes, seconds)
    assert report["a"] == pytest.approx(1e-4)
    assert report["b"] == pytest.approx(1e-9)
    assert report["r2"] == pytest.approx(1.0)
    assert report["residual_max_abs"] < 1e-12
    assert report["threshold_bytes"] in (150000, 150001)  # 1.5a/b = 150000 up to rounding
    with pytest.raises(ValueError):
        batching.fit_report([64, 64], [1.0, 2.0])


# ----------------------------------------------------------------------------- batcher


def test_batcher_worked_example() -> None:
    """Threshold 100 B, f(d) = 0.5 + 0.01 d. p0 goes at once (queue idle until p1);
    p1, p2 wait while p0 is on the wire; p3 (>= threshold) goes alone; p4 brings the
    open batch to 110 B >= 100 B, which then waits for p3 to finish."""
    ready = {"p0": 0.0, "p1": 0.1, "p2": 0.2, "p3": 0.3, "p4": 0.4}
    nbytes = {"p0": 30, "p1": 30, "p2": 30, "p3": 200, "p4": 50}
    out = batching.batch(list(ready), nbytes, ready, NetworkModel(0.5, 0.01), 100)
    assert [b.params for b in out] == [("p0",), ("p3",), ("p1", "p2", "p4")]
    assert [b.nbytes for b in out] == [30, 200, 110]
    assert [b.send for b in out] == pytest.approx([0.0, 0.8, 3.3])
    assert out[2].ready == 0.4
    assert out[2].end == pytest.approx(3.3 + 0.5 + 1.1)


def test_batcher_without_threshold_sends_each_alone() -> None:
    ready = {"a": 0.0, "b": 0.0}
    out = batching.batch(["a", "b"], {"a": 1, "b": 1}, ready, NetworkModel(1.0, 0.0), None)
    assert [b.params for b in out] == [("a",), ("b",)]


# ----------------------------------------------------------------------------- packing


def test_packing_worked_example() -> None:
    """B = 10, F = 4, one channel. Big (6 s) ready at 2 fits in the backward pass
    [2, 8); mid (3 s) ready at 5 does not fit before 10 -> forward pass [0, 3) (read at
    3); small (1 s) ready at 9 fits [9, 10). late (2 s, ready 9.5, read at 1) fits
    neither: after the backward pass it runs [10, 12) (+2 s), before the forward pass
    [-2, 0) (+2 s); the tie goes to the backward side."""
    groups = [
        packing.Group("big", 600, 6.0, 2.0, 4.0),
        packing.Group("mid", 300, 3.0, 5.0, 3.0),
        packing.Group("small", 100, 1.0, 9.0, 4.0),
        packing.Group("late", 50, 2.0, 9.5, 1.0),
    ]
    result = packing.pack(groups, backward=10.0, forward=4.0)
    got = {p.group: (p.pass_, p.start, p.end, p.overhead) for p in result.placements}
    assert got["big"] == ("backward", 2.0, 8.0, 0.0)
    assert got["mid"] == ("forward", 0.0, 3.0, 0.0)
    assert got["small"] == ("backward", 9.0, 10.0, 0.0)
    assert got["late"] == ("beyond_backward", 10.0, 12.0, 2.0)
    assert result.gap == 2.0
    assert result.iteration_time == pytest.approx(16.0)


def test_packing_two_channels_run_in_parallel() -> None:
    groups = [packing.Group(f"g{i}", 100 - i, 5.0, 0.0, 0.0) for i in range(2)]
    one = packing.pack(groups, backward=5.0, forward=1.0, channels=1)
    two = packing.pack(groups, backward=5.0, forward=1.0, channels=2)
    assert one.iteration_time == pytest.approx(11.0)
    assert two.iteration_time == pytest.approx(6.0)
    assert {p.channel for p in two.placements} == {0, 1}

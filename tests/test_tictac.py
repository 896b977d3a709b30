"""TIC/TAC on the paper's worked examples (TicTac §4, Figures 1a, 4a, 4b, Eq. 6)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.model.graph import Op, OpGraph, build_graph
from planner.model.oracle import tic_oracle
from planner.model.plan import Plan
from planner.planning import tictac
from planner.planning.tictac import (
    Properties,
    communication_dependencies,
    eq6_less,
    johnson_key,
    tac,
    tac_reference,
    tic,
    tic_reference,
    tic_time,
    update_properties,
)


def graph_of(recvs: list[str], compute: list[str], edges: list[tuple[str, str]]) -> OpGraph:
    ops = [Op(r, "recv", "worker0<-ps0") for r in recvs] + [Op(c) for c in compute]
    return build_graph(ops, edges)


def makespan(graph: OpGraph, time: dict[str, float], order: tuple[str, ...]) -> float:
    """One channel moving the recvs in `order`, one compute resource running the rest
    as soon as their inputs are there (earliest-ready first)."""
    finish: dict[str, float] = {}
    clock = 0.0
    for r in order:
        clock += time.get(r, 0.0)
        finish[r] = clock
    pending = {n for n in graph.ops if n not in finish}
    cpu = 0.0
    while pending:
        ready = [n for n in pending if all(p in finish for p in graph.dag.pred[n])]
        at = {n: max((finish[p] for p in graph.dag.pred[n]), default=0.0) for n in ready}
        op = min(ready, key=lambda n: (at[n], n))
        cpu = max(cpu, at[op]) + time.get(op, 0.0)
        finish[op] = cpu
        pending.remove(op)
    return max(finish.values(), default=0.0)


def assert_valid(plan: Plan, graph: OpGraph) -> None:
    recvs = set(graph.recvs)
    assert set(plan.priority) == recvs
    assert sorted(plan.order) == sorted(recvs)
    assert sorted(plan.order_index().values()) == list(range(len(recvs)))
    # the total order never contradicts the priorities
    ranks = [plan.priority[r] for r in plan.order]
    assert ranks == sorted(ranks)


def both_tac(graph: OpGraph, time: dict[str, float]) -> Plan:
    fast, ref = tac(graph, time), tac_reference(graph, time)
    assert fast == ref
    assert_valid(fast, graph)
    return fast


def both_tic(graph: OpGraph) -> Plan:
    fast, ref = tic(graph), tic_reference(graph)
    assert fast == ref
    assert_valid(fast, graph)
    return fast


# ------------------------------------------------------------------- Figure 1a


def figure_1a(recv1: str = "recv1", recv2: str = "recv2") -> OpGraph:
    # op1 needs recv1 only; op2 needs op1 and recv2, so op2.dep = {recv1, recv2}.
    return graph_of(
        [recv1, recv2], ["op1", "op2"], [(recv1, "op1"), ("op1", "op2"), (recv2, "op2")]
    )


FIG1_TIME = {"recv1": 2.0, "recv2": 3.0, "op1": 5.0, "op2": 7.0}


def test_figure_1a_dependencies() -> None:
    dep = communication_dependencies(figure_1a())
    assert dep["op2"] == {"recv1", "recv2"}
    assert dep["op1"] == {"recv1"}
    assert dep["recv1"] == {"recv1"} and dep["recv2"] == {"recv2"}


def test_figure_1a_properties() -> None:
    g = figure_1a()
    props = update_properties(g, FIG1_TIME, g.recvs)
    assert props.M["op1"] == FIG1_TIME["recv1"]
    assert props.M["op2"] == FIG1_TIME["recv1"] + FIG1_TIME["recv2"]
    assert props.P["recv1"] == FIG1_TIME["op1"]
    assert props.P["recv2"] == 0
    cost = FIG1_TIME["recv1"] + FIG1_TIME["recv2"]
    assert props.M_plus["recv1"] == props.M_plus["recv2"] == cost


def printed_comparator(a: str, b: str, props: Properties) -> bool:
    """Algorithm 3's Comparator exactly as printed (its two sides swapped)."""
    left, right = min(props.P[a], props.M[b]), min(props.P[b], props.M[a])
    return left < right if left != right else props.M_plus[a] < props.M_plus[b]


def test_figure_1a_tac_puts_recv1_first() -> None:
    g = figure_1a()
    plan = both_tac(g, FIG1_TIME)
    assert plan.order == ("recv1", "recv2")
    assert plan.priority == {"recv1": 0, "recv2": 1}
    # recv1 first is the shorter schedule: 2 + 5 (op1) + 7 (op2) vs 3 + 2 + 5 + 7.
    assert makespan(g, FIG1_TIME, ("recv1", "recv2")) == 14.0
    assert makespan(g, FIG1_TIME, ("recv2", "recv1")) == 17.0
    props = update_properties(g, FIG1_TIME, g.recvs)
    assert eq6_less("recv1", "recv2", props) and not eq6_less("recv2", "recv1", props)
    # Algorithm 3 as printed would put recv2 first: DESIGN.md swaps it back.
    assert printed_comparator("recv2", "recv1", props)
    # The figures the plan records are those at the moment of each pick, in seconds.
    assert plan.properties["P"]["recv1"] == 5.0
    assert plan.properties["M_plus"]["recv1"] == 5.0
    assert plan.properties["M_plus"]["recv2"] == math.inf  # only recv2 left: no multi-op


def test_figure_1a_tac_follows_the_graph_not_the_names() -> None:
    g = figure_1a(recv1="z_recv1", recv2="a_recv2")
    time = {"z_recv1": 2.0, "a_recv2": 3.0, "op1": 5.0, "op2": 7.0}
    assert both_tac(g, time).order == ("z_recv1", "a_recv2")


def test_figure_1a_tic_cannot_tell_the_recvs_apart() -> None:
    # With Time = 1 per recv and 0 for compute, M+ = 2 for both recvs: equal priority,
    # and the total order falls back to the name.
    plan = both_tic(figure_1a())
    assert plan.priority == {"recv1": 0, "recv2": 0}
    assert plan.properties["M_plus"] == {"recv1": 2.0, "recv2": 2.0}
    assert plan.order == ("recv1", "recv2")
    renamed = both_tic(figure_1a(recv1="z_recv1", recv2="a_recv2"))
    assert renamed.order == ("a_recv2", "z_recv1")


# ------------------------------------------------------------ Figure 4a, case 1


def figure_4a() -> OpGraph:
    return graph_of(
        ["recvA", "recvB"],
        ["op1", "op2", "op3"],
        [("recvA", "op1"), ("recvB", "op2"), ("op1", "op3"), ("op2", "op3")],
    )


@pytest.mark.parametrize(
    ("M_A", "P_A", "M_B", "P_B", "first"),
    [
        (1.0, 4.0, 3.0, 2.0, "recvA"),  # min(P_B, M_A) = 1 < min(P_A, M_B) = 3
        (3.0, 2.0, 1.0, 4.0, "recvB"),  # swapped: min(P_B, M_A) = 3 > min(P_A, M_B) = 1
    ],
)
def test_figure_4a_equation_6(M_A: float, P_A: float, M_B: float, P_B: float, first: str) -> None:
    g = figure_4a()
    time = {"recvA": M_A, "op1": P_A, "recvB": M_B, "op2": P_B, "op3": 1.0}
    props = update_properties(g, time, g.recvs)
    assert (props.M["recvA"], props.P["recvA"]) == (M_A, P_A)
    assert (props.M["recvB"], props.P["recvB"]) == (M_B, P_B)
    a_first = min(P_B, M_A) < min(P_A, M_B)
    assert eq6_less("recvA", "recvB", props) == a_first
    plan = both_tac(g, time)
    assert plan.order[0] == first
    # The makespan derivation behind Eq. 6: M_A + max(P_A, M_B) + P_B (+ op3) for A -> B.
    ab = makespan(g, time, ("recvA", "recvB"))
    ba = makespan(g, time, ("recvB", "recvA"))
    assert ab == M_A + max(P_A, M_B) + P_B + 1.0
    assert ba == M_B + max(P_B, M_A) + P_A + 1.0
    assert (ab < ba) == a_first
    assert makespan(g, time, plan.order) == min(ab, ba)


# ------------------------------------------------------------ Figure 4b, case 2


def figure_4b() -> OpGraph:
    return graph_of(
        ["recvA", "recvB", "recvC", "recvD"],
        ["op1", "op2", "op3"],
        [
            ("recvA", "op1"),
            ("recvB", "op1"),
            ("op1", "op2"),
            ("recvC", "op2"),
            ("op2", "op3"),
            ("recvD", "op3"),
        ],
    )


FIG4B_TIME = {"recvA": 2.0, "recvB": 1.0, "recvC": 0.5, "recvD": 0.25}
FIG4B_TIME.update(op1=1.0, op2=1.0, op3=1.0)


def test_figure_4b_m_plus_breaks_the_tie() -> None:
    g = figure_4b()
    props = update_properties(g, FIG4B_TIME, g.recvs)
    # Every recv outstanding: no op waits on one recv only, so all P are 0 and Eq. 6
    # sees ties everywhere; M+ separates them.
    assert all(props.P[r] == 0 for r in g.recvs)
    a_b = FIG4B_TIME["recvA"] + FIG4B_TIME["recvB"]
    assert props.M_plus["recvA"] == props.M_plus["recvB"] == a_b
    assert a_b < props.M_plus["recvC"] < props.M_plus["recvD"]
    assert props.M_plus["recvC"] == a_b + FIG4B_TIME["recvC"]
    assert eq6_less("recvA", "recvC", props) and eq6_less("recvB", "recvC", props)
    assert eq6_less("recvC", "recvD", props)
    assert not eq6_less("recvA", "recvB", props) and not eq6_less("recvB", "recvA", props)
    # Even though recvC and recvD are the quickest transfers, A and B go first.
    plan = both_tac(g, FIG4B_TIME)
    assert set(plan.order[:2]) == {"recvA", "recvB"}
    assert plan.order[2:] == ("recvC", "recvD")


def test_figure_4b_tic_priorities() -> None:
    plan = both_tic(figure_4b())
    assert plan.priority == {"recvA": 0, "recvB": 0, "recvC": 1, "recvD": 2}
    assert plan.properties["M_plus"] == {"recvA": 2.0, "recvB": 2.0, "recvC": 3.0, "recvD": 4.0}
    assert plan.order == ("recvA", "recvB", "recvC", "recvD")


# --------------------------------------------------- the pairwise rule can cycle

CYCLE = Properties(
    M={"a": 1, "b": 2, "c": 3}, P={"a": 1, "b": 3, "c": 2}, M_plus={"a": 5, "b": 6, "c": 4}
)


def test_eq6_pairwise_rule_cycles() -> None:
    assert eq6_less("a", "b", CYCLE)  # min(3, 1) == min(1, 2): M+ 5 < 6
    assert eq6_less("b", "c", CYCLE)  # min(2, 2) < min(3, 3)
    assert eq6_less("c", "a", CYCLE)  # min(1, 3) == min(2, 1): M+ 4 < 5
    # so no recv is Eq. 6-before both others: "the minimum" is undefined
    for x in "abc":
        assert any(eq6_less(y, x, CYCLE) for y in "abc" if y != x)


def test_johnson_key_is_a_strict_total_order_on_the_cycle() -> None:
    keys = {r: johnson_key(CYCLE.M[r], CYCLE.P[r], CYCLE.M_plus[r], r) for r in "abc"}
    assert len(set(keys.values())) == 3
    # b has M < P (first set); then c and a by decreasing P
    assert sorted("abc", key=keys.__getitem__) == ["b", "c", "a"]


def cycle_graph(shuffle: bool = False) -> OpGraph:
    """Realizes the cycle: P from one-recv ops, M+ via a padding recv per recv."""
    recvs = ["a", "b", "c", "pad_a", "pad_b", "pad_c"]
    compute = ["pa", "pb", "pc", "ma", "mb", "mc"]
    edges = [("a", "pa"), ("b", "pb"), ("c", "pc")]
    edges += [(x, f"m{x}") for x in "abc"] + [(f"pad_{x}", f"m{x}") for x in "abc"]
    ops = [Op(r, "recv") for r in recvs] + [Op(c) for c in compute]
    if shuffle:
        ops.reverse()
        edges.reverse()
    return build_graph(ops, edges)


CYCLE_TIME = {"a": 1, "b": 2, "c": 3, "pad_a": 4, "pad_b": 4, "pad_c": 1, "pa": 1, "pb": 3}
CYCLE_TIME["pc"] = 2


def test_tac_pick_on_a_realized_cycle_is_well_defined() -> None:
    g = cycle_graph()
    props = update_properties(g, CYCLE_TIME, g.recvs)
    for r in "abc":
        assert (props.M[r], props.P[r], props.M_plus[r]) == (
            CYCLE.M[r],
            CYCLE.P[r],
            CYCLE.M_plus[r],
        )
        assert any(eq6_less(y, r, props) for y in "abc" if y != r)
    plan = both_tac(g, CYCLE_TIME)
    assert plan.order[0] == "b"  # Johnson's first set: M < P
    # deterministic: the same plan again, and whatever order the graph was built in
    assert tac(g, CYCLE_TIME) == plan
    assert tac(cycle_graph(shuffle=True), CYCLE_TIME) == plan
    assert tac_reference(cycle_graph(shuffle=True), CYCLE_TIME) == plan


@settings(max_examples=300, deadline=None)
@given(
    st.integers(2, 8).flatmap(
        lambda n: st.tuples(
            st.lists(st.integers(0, 60), min_size=2 * n, max_size=2 * n, unique=True),
            st.lists(st.one_of(st.integers(0, 80), st.just(math.inf)), min_size=n, max_size=n),
        )
    )
)
def test_johnson_agrees_with_eq6_where_eq6_has_no_ties(
    draw: tuple[list[int], list[float]],
) -> None:
    # All M and P values distinct: min(P_B, M_A) == min(P_A, M_B) cannot happen.
    values, m_plus = draw
    n = len(m_plus)
    names = [f"r{i}" for i in range(n)]
    props = Properties(
        M=dict(zip(names, values[:n], strict=True)),
        P=dict(zip(names, values[n:], strict=True)),
        M_plus=dict(zip(names, m_plus, strict=True)),
    )
    eq6_min = [a for a in names if all(eq6_less(a, b, props) for b in names if b != a)]
    johnson_min = min(names, key=lambda r: johnson_key(props.M[r], props.P[r], props.M_plus[r], r))
    assert eq6_min == [johnson_min]


# ------------------------------------------------------------------ other cases


def test_no_recvs_gives_empty_plans() -> None:
    g = graph_of([], ["x", "y"], [("x", "y")])
    for plan in (tic(g), tic_reference(g), tac(g, {}), tac_reference(g, {})):
        assert plan.priority == {} and plan.order == ()


def test_tic_ranks_infinite_m_plus_last() -> None:
    # r3 feeds no op shared with another recv: M+ stays +inf, lowest priority.
    g = graph_of(["r1", "r2", "r3"], ["x", "y"], [("r1", "x"), ("r2", "x"), ("r3", "y")])
    plan = both_tic(g)
    assert plan.priority == {"r1": 0, "r2": 0, "r3": 1}
    assert plan.properties["M_plus"]["r3"] == math.inf
    assert plan.order == ("r1", "r2", "r3")


def test_tic_time_is_equation_5() -> None:
    g = graph_of(["r1"], ["x"], [("r1", "x")])
    assert tic_time(g) == {"r1": 1.0, "x": 0.0}
    assert tic_time(g) == dict(tic_oracle(g).times)


def test_time_oracle_object_and_missing_times() -> None:
    g = figure_1a()
    oracle = tic_oracle(g)
    assert tac(g, oracle) == tac(g, dict(oracle.times)) == tac_reference(g, oracle)
    # missing ops cost 0: every key ties, down to M+ (0 for both), so the name decides
    assert both_tac(g, {}).order == ("recv1", "recv2")


def test_bad_times_are_rejected() -> None:
    g = figure_1a()
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="op1"):
            tac(g, {"op1": bad})
        with pytest.raises(ValueError, match="op1"):
            tac_reference(g, {"op1": bad})


def test_rank_and_inputs_are_recorded() -> None:
    g = figure_1a()
    plan = tac(g, FIG1_TIME, rank="worker3")
    assert plan.algorithm == "tac" and plan.rank == "worker3"
    assert plan.inputs["n_recvs"] == 2 and plan.inputs["oracle"] == "time"
    assert tic(g, rank="worker3").algorithm == "tic"


def test_non_root_recv_counts_as_its_ancestors_too() -> None:
    # A recv ordered after compute (not the PS worker shape, but graphs may have it).
    g = graph_of(["r1", "r2"], ["x", "y"], [("r1", "x"), ("x", "r2"), ("r2", "y")])
    dep = communication_dependencies(g)
    assert dep["r2"] == {"r1", "r2"} and dep["y"] == {"r1", "r2"}
    time = {"r1": 1.0, "r2": 2.0, "x": 3.0, "y": 4.0}
    props = update_properties(g, time, g.recvs)
    assert props.M["r2"] == 3.0 and props.M_plus["r1"] == 3.0
    assert both_tac(g, time).order == ("r1", "r2")


def test_many_tied_candidates_take_the_vectorized_m_plus(monkeypatch) -> None:
    g = figure_4b()
    expected = tac_reference(g, FIG4B_TIME)
    monkeypatch.setattr(tictac, "_FEW_CANDIDATES", 0)
    assert tac(g, FIG4B_TIME) == expected

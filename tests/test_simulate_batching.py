"""Caramel's batches in the simulator: sent when the last member is ready, one latency."""

from __future__ import annotations

import numpy as np
import pytest

from planner.model.graph import Op, build_graph
from planner.model.plan import Plan
from planner.prediction.comparison import batching
from planner.prediction.compiled import compile_graph, op_seconds
from planner.prediction.event_loop import run


def _graph():
    # backward: b1 -> b2 on the cpu; b1 makes gradient g1 ready, b2 makes g2 ready.
    ops = [
        Op("b1", "compute", "cpu"),
        Op("b2", "compute", "cpu"),
        Op("g1", "collective", "net", nbytes=100),
        Op("g2", "collective", "net", nbytes=100),
    ]
    return build_graph(ops, [("b1", "b2"), ("b1", "g1"), ("b2", "g2")])


def _plan(groups):
    return Plan(
        algorithm="caramel",
        rank="r0",
        priority={"g1": 0, "g2": 1},
        order=("g1", "g2"),
        inputs={"groups": groups, "network": {"a": 1.0, "b": 0.01}},
    )


TIMES = {"b1": 2.0, "b2": 3.0, "g1": 2.0, "g2": 2.0}  # each transfer: a + b*100 = 2


def test_separate_transfers_by_hand():
    compiled = compile_graph(_graph())
    seconds = op_seconds(compiled, TIMES)
    plan = _plan([{"params": ["g1"]}, {"params": ["g2"]}])
    adjusted, edges, batched = batching(compiled, seconds, plan)
    assert batched == 0 and edges == () and np.array_equal(adjusted, seconds)
    # g1 runs [2, 4) beside b2 [2, 5); g2 runs [5, 7)
    assert run(compiled, seconds, plan.priority).makespan[0] == pytest.approx(7.0)


def test_a_batch_waits_for_its_last_member_and_saves_one_latency():
    compiled = compile_graph(_graph())
    seconds = op_seconds(compiled, TIMES)
    plan = _plan([{"params": ["g1", "g2"]}])
    adjusted, edges, batched = batching(compiled, seconds, plan)
    assert batched == 1
    assert edges == (("b2", "g1"),)  # g1 now waits for g2's producer
    assert adjusted[compiled.index["g2"]] == pytest.approx(1.0)  # 2 - a
    assert adjusted[compiled.index["g1"]] == pytest.approx(2.0)
    result = run(compiled, adjusted, plan.priority, edges)
    # b1 [0,2) b2 [2,5); batch g1 [5,7) + g2 [7,8): a + b*200 = 3 after the last ready
    assert result.makespan[0] == pytest.approx(8.0)

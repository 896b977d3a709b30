"""PriorityGate: the sender counter with real threads, timeouts, lenient mode, plan files."""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path

import pytest

from planner.enforce import (
    GateTimeout,
    PriorityGate,
    UnknownTransfer,
    load_control_edges,
    load_plan,
    plan_from_groups,
)
from planner.errors import InputError

ORDER = [f"t{i}" for i in range(8)]


def _run_threads(gate: PriorityGate, names: list[str], delays: dict[str, float]) -> list[str]:
    """One thread per transfer, started in `names` order; returns the launch order."""
    launched: list[str] = []
    errors: list[BaseException] = []

    def sender(name: str) -> None:
        time.sleep(delays.get(name, 0.0))
        try:
            with gate.turn(name):
                launched.append(name)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=sender, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert not any(t.is_alive() for t in threads)
    if errors:
        raise errors[0]
    return launched


def test_threads_hand_over_in_plan_order_whatever_the_arrival() -> None:
    gate = PriorityGate(ORDER, timeout=5)
    rng = random.Random(7)
    for _ in range(5):  # several iterations: the counter wraps after n hand-overs
        arrival = ORDER[:]
        rng.shuffle(arrival)
        delays = {n: rng.uniform(0, 0.02) for n in ORDER}
        assert _run_threads(gate, arrival, delays) == ORDER
    assert gate.iteration == 5
    assert gate.history == [tuple(ORDER)] * 5
    assert gate.violations == []
    assert gate.counter == 0


def test_missing_transfer_times_out_naming_it() -> None:
    gate = PriorityGate(["a", "b", "c"], timeout=0.2)
    with gate.turn("a"):
        pass
    start = time.monotonic()
    with pytest.raises(GateTimeout) as info:
        gate.wait("c")
    assert time.monotonic() - start == pytest.approx(0.2, abs=0.15)
    assert info.value.waited_for == "b"
    assert info.value.transfer == "c"
    assert "'b'" in str(info.value) and "order_index 1" in str(info.value)


def test_lenient_mode_lets_it_pass_and_counts() -> None:
    gate = PriorityGate(["a", "b", "c", "d"], timeout=0.1, strict=False)
    launched = _run_threads(gate, ["a", "c"], {})
    assert launched == ["a", "c"]
    assert [(v.kind, v.transfer, v.waited_for) for v in gate.violations] == [("skipped", "c", "b")]
    with gate.turn("b"):  # arrives after its slot was given away
        pass
    assert [v.kind for v in gate.violations] == ["skipped", "late"]
    assert gate.iteration == 0
    with gate.turn("d"):  # on time: the last one wraps the iteration
        pass
    assert gate.iteration == 1 and gate.history == [("a", "c", "b", "d")]


def test_unknown_transfer_strict_and_lenient() -> None:
    with pytest.raises(UnknownTransfer, match="'zz'"):
        PriorityGate(["a"]).wait("zz")
    gate = PriorityGate(["a"], strict=False)
    assert gate.wait("zz") is False
    assert gate.violations[0].kind == "unknown"


def test_submit_queues_until_its_turn_and_runs_in_plan_order() -> None:
    gate = PriorityGate(ORDER, timeout=1)
    launched: list[str] = []
    for name in reversed(ORDER[1:]):
        assert gate.submit(name, lambda n=name: launched.append(n)) is False
    assert launched == [] and gate.pending == tuple(ORDER[1:])
    assert gate.submit("t0", lambda: launched.append("t0")) is True
    assert launched == ORDER
    assert gate.flush() == tuple(ORDER)
    assert gate.iteration == 1


def test_submit_from_many_threads() -> None:
    gate = PriorityGate(ORDER, timeout=2)
    launched: list[str] = []
    rng = random.Random(3)
    for _ in range(10):
        arrival = ORDER[:]
        rng.shuffle(arrival)
        threads = [
            threading.Thread(target=gate.submit, args=(n, lambda n=n: launched.append(n)))
            for n in arrival
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=5)
        gate.flush()
    assert launched == ORDER * 10


def test_flush_times_out_on_missing_transfer_then_lenient_drains() -> None:
    strict = PriorityGate(["a", "b", "c"], timeout=0.1)
    strict.submit("a", lambda: None)
    strict.submit("c", lambda: None)
    with pytest.raises(GateTimeout, match="'b'"):
        strict.flush()

    lenient = PriorityGate(["a", "b", "c", "d"], timeout=0.1, strict=False)
    launched: list[str] = []
    lenient.submit("c", lambda: launched.append("c"))
    lenient.submit("a", lambda: launched.append("a"))
    assert lenient.flush() == ("a", "c")
    assert launched == ["a", "c"]
    assert {(v.kind, v.transfer) for v in lenient.violations} == {
        ("skipped", "c"),
        ("missing", "d"),
    }


def test_plan_files(tmp_path: Path) -> None:
    doc = {
        "schema": "planner.priorities/1",
        "ranks": [
            {
                "rank": "worker0",
                "algorithm": "tac",
                "transfers": [
                    {"name": "r1", "param": "w1", "priority": 0, "order_index": 1},
                    {"name": "r0", "param": "w0", "priority": 0, "order_index": 0},
                ],
            }
        ],
    }
    (tmp_path / "p.json").write_text(json.dumps(doc))
    plan = load_plan(tmp_path / "p.json")
    assert plan.order == ("r0", "r1") and plan.transfers[0].params == ("w0",)
    assert PriorityGate.from_file(tmp_path / "p.json").index == {"r0": 0, "r1": 1}
    assert load_control_edges(tmp_path / "p.json") == [("r0", "r1")]

    (tmp_path / "p.txt").write_text("b\t1\na\t0\n")
    assert load_plan(tmp_path / "p.txt").order == ("a", "b")
    (tmp_path / "bad.txt").write_text("a\t0\nb\t2\n")
    with pytest.raises(InputError, match=r"\[0, n\)"):
        load_plan(tmp_path / "bad.txt")

    buckets = {
        "schema": "planner.bucket_plan/1",
        "groups": [{"params": ["fc2.weight", "fc2.bias"], "depth": 2}, {"params": ["fc1.weight"]}],
    }
    (tmp_path / "b.json").write_text(json.dumps(buckets))
    plan = load_plan(tmp_path / "b.json")
    assert plan.order == ("group0", "group1") and plan.transfers[0].depth == 2
    with pytest.raises(InputError, match="in both"):
        plan_from_groups([["x"], ["x"]])

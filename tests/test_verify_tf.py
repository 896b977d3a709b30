"""`planner verify` on TensorFlow runs that enforced a plan: it checks the order the
export enforces (each read at the first place of its transfers, a folded control message
with its data) by the order the reads' tensors arrived (a worker issues every recv at
the step's start)."""

from __future__ import annotations

import json
from pathlib import Path

import networkx as nx
import pytest

from planner.ingest import detect
from planner.job.verify import enforced_order, enforced_pieces, verify
from planner.model.plan import from_priorities, read_of

TRACES = Path(__file__).resolve().parents[1] / "traces" / "tf"
TAC = TRACES / "cnn_enforced_tac"
TIC = TRACES / "cnn_enforced"


def _steps(folder: Path) -> list[Path]:
    return sorted(folder.glob("run_metadata_step*.pb.gz"))


def _arrival_orders(folder: Path) -> dict[tuple[str, int], list[str]]:
    """(rank, step) -> the reads in the order their first tensor arrived, counted here
    from the ingested records (start + duration of every recv)."""
    job = detect.load(_steps(folder))
    rows = job.trace.timings
    rows = rows[rows["op"].str.startswith("recv:")]
    out: dict[tuple[str, int], list[str]] = {}
    for (rank, step), group in rows.groupby(["rank", "iteration"]):
        ends = (group["start"] + group["duration"]).to_numpy()
        ordered = [group["op"].to_numpy()[i] for i in ends.argsort(kind="stable")]
        out[(rank, int(step))] = list(dict.fromkeys(read_of(o) for o in ordered))
    return out


@pytest.mark.parametrize(("mode", "compliant"), [("arrival", True), ("sender", False)])
def test_verify_checks_the_enforced_order_of_a_tac_run(mode: str, compliant: bool) -> None:
    """The TAC arrival run holds the plan's read order in every step of both workers; the
    sender chain in none (the worker's concurrent RecvTensor RPCs reorder them). Counted
    here from the records, the same verdict step by step."""
    plans = from_priorities(json.loads((TAC / "arrival" / "tac.json").read_text()))
    document = verify(TAC / "arrival" / "tac.json", _steps(TAC / mode))
    assert document["matched"] and not document["unmatched"]
    counted = _arrival_orders(TAC / mode)
    assert len(document["steps"]) == len(counted) == 2 * len(_steps(TAC / mode))
    for step in document["steps"]:
        want = list(dict.fromkeys(read_of(n) for n in enforced_order(plans[step["rank"]].order)))
        seen = counted[(step["rank"], step["iteration"])]
        assert step["in_plan_order"] == ([u for u in seen if u in want] == want[: len(seen)])
        assert step["in_plan_order"] is compliant
    assert document["compliance"] == (1.0 if compliant else 0.0)


def test_verify_of_the_tic_arrival_run_and_its_plain_round() -> None:
    """The kept TIC round: in plan order in every arrival step, in few of the plain ones."""
    plan = TIC / "arrival" / "tic.json"
    enforced = verify(plan, _steps(TIC / "arrival"))
    plain = verify(plan, _steps(TIC / "none"))
    assert enforced["compliance"] == 1.0
    assert max(r["compliance"] for r in plain["ranks"]) <= 0.2


LAB_TIC = (
    Path(__file__).resolve().parents[1] / "bench" / "lab" / "results" / "tf-grid2" / "cnn"
    / "tf-cnn" / "600mbit"
)  # fmt: skip


def test_verify_checks_only_what_the_export_orders_on_a_lab_arrival_run() -> None:
    """The lab's TIC arrival run at 600 Mbit/s (issue #44: `verify`'s order check on a
    lab arrival trace): the export chains the reads of PS variables, not the loss the PS
    computes (`recv:truediv`), whose place TIC plans but the runtime decides. The run
    arrived with the reads in plan order in every step of both workers, and with the
    loss out of its planned place in some; verify counts those steps in order."""
    plan = LAB_TIC / "plan" / "priorities_tic.json"
    steps = _steps(LAB_TIC / "order" / "tic-arrival" / "run")
    document = verify(plan, steps)
    assert len(document["steps"]) == 10 and document["compliance"] == 1.0
    plans = from_priorities(json.loads(plan.read_text()))
    counted = _arrival_orders(LAB_TIC / "order" / "tic-arrival" / "run")
    moved = 0
    for (rank, _), seen in counted.items():
        want = list(dict.fromkeys(read_of(n) for n in enforced_order(plans[rank].order)))
        reads = [u for u in want if u != "truediv"]
        assert [u for u in seen if u in reads] == reads  # counted from the records
        moved += [u for u in seen if u in want] != want
    assert moved >= 1  # the loss out of its planned place: not a departure


REVERSED = TRACES / "lab_cnn_600mbit_reversed"


def test_verify_checks_the_pieces_a_run_enforced_where_the_export_dropped_a_wait() -> None:
    """The lab's TAC reversed run (issue #44: verify checks the order the export actually
    enforces): the export left out worker0's wait of `global_step`'s read before the
    tower reads (the graph makes it wait for them through the loss: a cycle). The run's
    own GraphDef, beside its RunMetadata, holds the waits it ran with: verify checks the
    two pieces, and every step holds them, as counted here from the records. Without
    the graph it checks the whole plan, which no run of that graph can follow."""
    plan = REVERSED / "priorities_tac-reversed.json"
    runs = sorted((REVERSED / "run").iterdir())
    document = verify(plan, runs)
    ranks = {r["rank"]: r for r in document["ranks"]}
    assert (ranks["worker0"]["enforced_pieces"], ranks["worker1"]["enforced_pieces"]) == (2, 1)
    assert document["compliance"] == 1.0
    assert any("2 pieces" in n and "--drop-cyclic" in n for n in document["notes"])
    plans = from_priorities(json.loads(plan.read_text()))
    counted = _arrival_orders(REVERSED / "run")
    for (rank, _), seen in counted.items():
        want = list(dict.fromkeys(read_of(n) for n in enforced_order(plans[rank].order)))
        want = [w for w in want if w in seen and w != "truediv"]
        seen = [u for u in seen if u in want]
        if rank == "worker0":  # global_step arrives last, as the graph makes it
            assert seen[-1] == want[0] == "global_step/Read/ReadVariableOp"
            assert seen[:-1] == want[1:]
        else:
            assert seen == want
    whole = verify(plan, _steps(REVERSED / "run"))  # RunMetadata alone: no graph
    assert {r["rank"]: r["compliance"] for r in whole["ranks"]} == {"worker0": 0.0, "worker1": 1.0}


def test_a_plain_or_another_plans_run_is_checked_against_the_whole_order() -> None:
    """The run's graph cuts the order only where it holds most of the plan's waits. The
    grid's TIC plan at 600 Mbit/s against its own plain run (whose client graph holds
    none of them), and against the reversed run (whose graph holds them the other way,
    the same graph's names), is checked whole, and fails every step of both."""
    tic = LAB_TIC / "plan" / "priorities_tic.json"
    for run in (LAB_TIC / "trace" / "run", REVERSED / "run"):
        assert (run / "graph.pb.gz").exists()
        document = verify(tic, sorted(run.iterdir()))
        assert all(r["enforced_pieces"] == 1 for r in document["ranks"])
        assert document["compliance"] == 0.0


def test_the_pieces_are_the_plan_cut_where_the_graph_has_no_path() -> None:
    """Every read kept, in plan order; a cut exactly where the graph has no path from
    one read to the next; the whole order without a graph or with under half its waits."""
    dag = nx.DiGraph([("a", "m0"), ("m0", "b"), ("c", "x"), ("x", "b"), ("c", "m2"), ("m2", "d")])
    pieces, against = enforced_pieces(["a", "b", "c", "d"], dag)
    assert pieces == [["a", "b"], ["c", "d"]] and against == 1  # c -> x -> b: the other way
    assert enforced_pieces(["a", "b", "c", "d"], None) == ([["a", "b", "c", "d"]], 0)
    assert enforced_pieces(["d", "c", "b", "a"], dag) == ([["d", "c", "b", "a"]], 0)

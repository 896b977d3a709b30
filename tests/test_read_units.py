"""A TF read's transfers planned as one (`planner.planning.read_units`): the order a
plan gives its reads is the order the export enforces and the replay runs."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from planner.export import tf_graph
from planner.ingest import detect
from planner.ingest.tf_graphdef import parse_graphdef
from planner.job import analysis
from planner.planning import tictac
from planner.planning.read_units import contracted, read_units
from planner.prediction.enforced import is_read, read_of

RUN = Path(__file__).resolve().parents[1] / "traces" / "tf" / "cnn_ps_ingraph" / "run1"


@pytest.fixture(scope="module")
def job():  # type: ignore[no-untyped-def]
    return detect.load([RUN])


def _graphdef():  # type: ignore[no-untyped-def]
    path = RUN / "graph.pb.gz"
    return parse_graphdef(gzip.decompress(path.read_bytes()), path, False)


def _reads(order: tuple[str, ...]) -> list[str]:
    """The reads in the order of their first data transfer (as the replay chains them)."""
    seen: list[str] = []
    for name in order:
        if is_read(name) and not name.startswith("recv:^") and read_of(name) not in seen:
            seen.append(read_of(name))
    return seen


def test_the_cnn_run_has_reads_with_a_folded_control_message(job) -> None:  # type: ignore[no-untyped-def]
    """Each conv kernel's read reaches the worker twice: its data and the control message
    of the ShapeN grappler folded (4 of each rank's 16-17 recvs)."""
    for rank, graph in job.graphs.items():
        units = read_units(graph)
        assert len(units) == 4, rank
        assert all(graph.ops[m].nbytes == 0 < graph.ops[d].nbytes for m, d in units.items())


@pytest.mark.parametrize("algorithm", ["tic", "tac"])
def test_a_message_rides_with_its_data_and_the_export_enforces_the_replays_order(
    job, algorithm: str
) -> None:  # type: ignore[no-untyped-def]
    """In the plan each message comes just before its data, at its priority; the reads the
    export chains (`tf_graph.chain_edges`: each read at its first place) come in the order
    the replay chains them (its data transfers' order). (The export also chains the PS's
    computed loss, `truediv`, which the replay leaves alone: both plans put it last, after
    every read it depends on.)"""
    graphdef = _graphdef()
    plans = analysis.schedule(job, algorithm)
    for rank, plan in plans.items():
        units = read_units(job.graphs[rank])
        place = {name: i for i, name in enumerate(plan.order)}
        for message, data in units.items():
            assert place[message] == place[data] - 1
            assert plan.priority[message] == plan.priority[data]
        assert sorted(plan.order) == sorted(job.graphs[rank].recvs)
        _, chains = tf_graph.chain_edges(graphdef, {rank: plan.order})
        assert [n for n in plan.order if not is_read(n)] in ([], [plan.order[-1]])
        assert [r for r in chains.reads[rank] if is_read(f"recv:{r}")] == _reads(plan.order)


def test_planned_apart_tac_put_the_messages_first(job) -> None:  # type: ignore[no-untyped-def]
    """What the units fix: TAC on the graph as ingested places every 0-byte message first,
    so the export (first place of a read) and the replay (its data) ordered the reads
    differently."""
    oracle = analysis.oracles(job)
    graphdef = _graphdef()
    for rank, graph in job.graphs.items():
        apart = tictac.tac(graph, oracle[rank].times, rank=rank)
        assert set(apart.order[: len(read_units(graph))]) == set(read_units(graph))
        _, chains = tf_graph.chain_edges(graphdef, {rank: apart.order})
        assert [r for r in chains.reads[rank] if is_read(f"recv:{r}")] != _reads(apart.order)


def test_the_contracted_graph_keeps_every_dependency_and_stays_acyclic(job) -> None:  # type: ignore[no-untyped-def]
    """Merging a message into its data keeps every path between the other ops and adds no
    cycle; the merged transfer carries the data's bytes."""
    import networkx as nx

    for graph in job.graphs.values():
        units = read_units(graph)
        merged = contracted(graph, units)
        assert merged is not None and nx.is_directed_acyclic_graph(merged.dag)
        assert len(merged) == len(graph) - len(units)
        for u, v, _ in graph.edges():
            a, b = units.get(u, u), units.get(v, v)
            assert a == b or nx.has_path(merged.dag, a, b)
        for data in units.values():
            assert merged.ops[data] == graph.ops[data]

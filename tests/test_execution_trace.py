"""Execution Trace ingest and the ET-joined DAG on real traces."""

from __future__ import annotations

from pathlib import Path

import networkx as nx
import pytest

from planner.errors import InputError
from planner.ingest.execution_trace import read_execution_trace
from planner.ingest.kineto import load_kineto
from tests.conftest import needs

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
RUN = Path(__file__).resolve().parents[1] / "traces" / "torch" / "resnet_ddp"
PARAM = SHARED / "public" / "param" / "et_replay" / "tests" / "inputs"

pytestmark = needs(RUN)


@pytest.fixture(scope="module")
def job():
    return load_kineto([RUN], [RUN / "et_rank0.json.gz", RUN / "et_rank1.json.gz"])


def test_et_joined_dag_is_acyclic_and_holds_every_op_of_the_et_step(job):
    for rank in job.ranks:
        graph = job.graphs[rank]
        assert nx.is_directed_acyclic_graph(graph.dag)
        step_ops = set(job.trace.of(rank, 5)["op"])
        assert step_ops <= set(graph.ops)
        assert job.meta["ranks"][rank]["reference_step"] == 5
        data = [(u, v) for u, v, k in graph.edges() if k == "data"]
        assert len(data) > 300  # tensor dependencies the Kineto trace alone lacks
        # the all-reduce of a bucket reads the gradients the backward ops wrote
        for name in (n for n in graph.transfers if graph.ops[n].type == "gloo:all_reduce"):
            assert any(k == "data" for _, _, k in graph.dag.in_edges(name, data="kind"))
    assert any("2637 of 2645 nodes joined" in n for n in job.notes)


def test_et_adds_edges_beyond_the_conservative_dag(job):
    plain = load_kineto([RUN / "rank0.json.gz"])
    assert job.graphs["rank0"].dag.number_of_edges() > plain.graphs["rank0"].dag.number_of_edges()
    assert set(job.graphs["rank0"].ops) == set(plain.graphs["rank0"].ops)


@pytest.mark.parametrize(
    ("path", "schema"),
    [
        pytest.param(PARAM / "linear_et.json.gz", "1.0.1", marks=needs(PARAM)),
        pytest.param(
            PARAM / "1.0.3-chakra.0.0.4" / "resnet_1gpu_et.json.gz",
            "1.0.3-chakra.0.0.4",
            marks=needs(PARAM),
        ),
        pytest.param(
            PARAM / "1.1.0-chakra.0.0.4" / "resnet_2gpu_et.json.gz",
            "1.1.0-chakra.0.0.4",
            marks=needs(PARAM),
        ),
        (RUN / "et_rank0.json.gz", "1.1.1-chakra.0.0.4"),
    ],
)
def test_schema_versions(path, schema):
    et = read_execution_trace(path)
    assert et.schema == schema
    assert len(et.nodes) > 100
    edges = et.data_edges()
    assert edges and all(a < b for a, b in edges)  # producers precede consumers


def test_bad_et_is_input_error(tmp_path):
    path = tmp_path / "et.json"
    path.write_text('{"schema": "1.0.1", "nodes": [{"name": "x"}]}')
    with pytest.raises(InputError, match="malformed Execution Trace node"):
        read_execution_trace(path)
    with pytest.raises(InputError, match="2 Execution Traces for 1 ranks"):
        load_kineto([RUN / "rank0.json.gz"], [RUN / "et_rank0.json.gz", RUN / "et_rank1.json.gz"])

"""The numpy column path (`Trace.table`) that `planner inspect` and the Kineto ingest use
without pandas gives what the pandas formulations give, on the real traces (issue #18)."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.ingest import detect
from planner.model.arrays import median, unique
from planner.model.graph import is_acyclic
from planner.model.oracle import min_of_columns, min_of_runs
from planner.model.records import partial_steps
from planner.model.trace import Trace, dedicated_columns, with_dedicated
from planner.model.waits import collective_rows, split_waits
from tests.conftest import MLP_IN_REPO, RESNET_IN_REPO, SHARED, need

DLRM = SHARED / "public/param/et_replay/tests/inputs/dlrm_kineto.tar.gz.extracted/dlrm_kineto"


@pytest.fixture(scope="module", params=["resnet_ddp (repo)", "dlrm 8 ranks"])
def job(request):
    path = RESNET_IN_REPO if request.param.startswith("resnet") else need(DLRM)
    return detect.load([path])


def _pivot_waits(rows: pd.DataFrame) -> tuple[np.ndarray, dict | None]:
    """The pandas formulation of `split_waits` (a pivot table of collective ends)."""
    ranks = sorted(rows["rank"].unique().tolist())
    if len(ranks) < 2:
        return np.zeros(len(rows), dtype=np.int64), None
    frame = rows[["rank", "iteration", "op"]].assign(end=(rows["start"] + rows["duration"]))
    ends = frame.pivot_table(index=["iteration", "op"], columns="rank", values="end",
                             aggfunc="first").dropna()  # fmt: skip
    delta = ends.sub(ends[ranks[0]], axis=0)
    offsets = delta.median().round().astype(np.int64).to_dict()
    residual = (delta - pd.Series(offsets)).abs().to_numpy()
    start = rows["start"].to_numpy(np.int64) - rows["rank"].map(offsets).to_numpy(np.int64)
    group = pd.Series(start).groupby([rows["iteration"].to_numpy(), rows["op"].to_numpy()])
    last, seen = group.transform("max").to_numpy(), group.transform("size").to_numpy()
    wait = np.where(seen > 1, np.clip(last - start, 0, rows["duration"].to_numpy()), 0)
    return wait, {
        "offsets": {str(r): int(o) for r, o in offsets.items()},
        "occurrences": len(ends),
        "residual_median": float(np.median(residual)) / 1e9,
        "residual_max": float(residual.max()) / 1e9,
    }


def test_the_pandas_view_is_the_column_table(job):
    table, frame = job.trace.table, job.trace.timings
    assert list(frame.columns) == list(table) == ["rank", "iteration", "op", "start",
                                                  "duration", "wait"]  # fmt: skip
    for name, column in table.items():
        assert np.array_equal(frame[name].to_numpy(), column), name
    again = Trace(frame, job.trace.spans)  # a Trace built from DataFrames has the same table
    assert all(np.array_equal(again.table[k], v) for k, v in table.items())
    assert again.ranks == job.trace.ranks == job.ranks
    with pytest.raises(TypeError):
        Trace(frame, table=table, span_table=job.trace.span_table)


def test_waits_from_columns_match_the_pivot_table(job):
    table = job.trace.table
    mask = collective_rows(table, job.graphs)
    assert mask.any() and np.array_equal(mask, collective_rows(job.trace.timings, job.graphs))
    rows = job.trace.timings[mask]
    wait, alignment = split_waits({k: v[mask] for k, v in table.items()})
    expected, reference = _pivot_waits(rows.reset_index(drop=True))
    assert np.array_equal(wait, expected) and np.array_equal(wait, table["wait"][mask])
    assert (wait > 0).any()  # the ranks do wait for each other
    got = alignment.to_dict()
    assert got["occurrences"] == reference["occurrences"] > 0
    assert got["offsets"] == {r: o / 1e9 for r, o in reference["offsets"].items()}
    assert got["residual_median"] == reference["residual_median"]
    assert got["residual_max"] == reference["residual_max"]


def test_oracle_from_columns_is_min_of_runs(job):
    frame = with_dedicated(job.trace, job.graphs)
    resource, dedicated = dedicated_columns(job.trace, job.graphs)
    assert np.array_equal(frame["dedicated"].to_numpy(), dedicated)
    table = job.trace.table
    for rank, graph in job.graphs.items():
        rows = table["rank"] == rank
        ours = min_of_columns(graph, table["op"][rows], table["iteration"][rows],
                              table["duration"][rows], dedicated[rows])  # fmt: skip
        theirs = min_of_runs(graph, frame[frame["rank"] == rank])
        assert ours == theirs
        assert sum(s == "observed" for s in ours.source.values()) > len(graph) // 2


def test_partial_steps_from_columns_and_frames_agree_on_a_partial_step():
    """worker1 step 6 of the between-graph TF run lacks one RecvTensor record."""
    job = detect.load(MLP_IN_REPO[1:])
    frame = job.trace.timings
    for rank, graph in job.graphs.items():
        rows = frame[frame["rank"] == rank]
        found = partial_steps(rows, graph.ops)
        table = {
            "op": rows["op"].to_numpy(object),
            "iteration": rows["iteration"].to_numpy(),
            "duration": rows["duration"].to_numpy(),
        }
        assert partial_steps(table, graph.ops) == found
    assert any(partial_steps(frame[frame["rank"] == r], g.ops) for r, g in job.graphs.items())


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 12).flatmap(
    lambda n: st.tuples(st.just(n), st.lists(st.tuples(st.integers(0, n - 1),
                                                       st.integers(0, n - 1)), max_size=30))
))  # fmt: skip
def test_is_acyclic_agrees_with_networkx(graph):
    n, edges = graph
    dag = nx.DiGraph()
    dag.add_nodes_from(range(n))
    dag.add_edges_from(edges)
    src = np.array([u for u, _ in edges], dtype=np.int64)
    dst = np.array([v for _, v in edges], dtype=np.int64)
    assert is_acyclic(src, dst, n) == nx.is_directed_acyclic_graph(dag)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(-(2**62), 2**62), min_size=1, max_size=9),
    st.lists(st.floats(-1e300, 1e300), min_size=1, max_size=9),
)
def test_median_and_unique_are_numpys(ints, floats):
    """`planner.model.arrays` (which spare the numpy.ma import) give numpy's results, bitwise."""
    for array in (np.array(ints, dtype=np.int64), np.array(floats, dtype=np.float64)):
        assert median(array) == float(np.median(array))
        assert np.array_equal(unique(array), np.unique(array))

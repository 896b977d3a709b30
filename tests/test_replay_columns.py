"""The replay's numpy forms (issue #19, speed only) give what the plain forms give, on
real ranks: the per-step pandas work they replace, numpy's own median and unique, and
the compiled graph and looked-up rows handed on for a rank."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, SHARED

from planner.ingest import detect
from planner.model.records import missing_ops, partial_steps
from planner.prediction import replay as sim

RESNET = REPO / "traces" / "torch" / "resnet_ddp"
RANKS = [
    RESNET / "rank0.json.gz",
    REPO / "traces" / "demo",
    SHARED / "generated" / "torch" / "transformer_ddp" / "rank1.json.gz",
    SHARED / "generated" / "tf" / "cnn_ps_ingraph",
]


def _loaded(path: Path):
    if not path.exists():
        pytest.skip(f"needs {path}, which is not present (a checkout without ../shared)")
    job = detect.load([path])
    frame = sim._frame(job)
    rank = job.ranks[0]
    rows = frame[frame["rank"] == rank]
    return job, rank, sim.compile_graph(job.graphs[rank]), rows


@pytest.mark.parametrize("path", RANKS, ids=lambda p: p.parent.name + "/" + p.name)
def test_step_columns_are_the_pandas_steps(path: Path) -> None:
    """`_step_models` splits a rank's rows by step with numpy: each step's columns are
    its rows of the graph's ops as a pandas group-by gives them, and the steps' missing
    records (by op number) are `partial_steps` of the rows (by name)."""
    job, rank, compiled, rows = _loaded(path)
    oracle = sim.mean_of_runs(job.graphs[rank], rows)
    models = sim._step_models(compiled, rows, oracle, sim.spans_of(job, rank))
    groups = dict(iter(rows.groupby("iteration", sort=True)))
    assert list(models) == sorted(groups) and len(models) >= 3
    gone = partial_steps(rows, compiled.names)
    for it, (known, _span, model) in models.items():
        step, idx = sim.op_rows(compiled, groups[it])
        assert known["idx"].tolist() == idx.tolist()
        assert known["start"].tolist() == step["start"].tolist()
        assert known["duration"].tolist() == step["duration"].tolist()
        assert model.missing == gone.get(it, ())
        assert sim.measured(known) == sim.measured(step)
    known = sim.op_rows(compiled, rows)
    codes = known[1]
    assert (
        missing_ops(
            codes, known[0]["iteration"].to_numpy(), compiled.names, known[0]["duration"].to_numpy()
        )
        == gone
    )


@pytest.mark.parametrize("path", RANKS, ids=lambda p: p.parent.name + "/" + p.name)
def test_observed_priorities_are_each_steps_observed_priority(path: Path) -> None:
    """The comparison's per-rank `observed_priorities` (op names ordered once) give
    `observed_priority` of each step's rows (ties in start broken by the names)."""
    from planner.prediction import compiled as sim

    _, _, compiled, rows = _loaded(path)
    found = sim.observed_priorities(compiled, rows)
    plain = [(int(i), sim.observed_priority(compiled, r)) for i, r in rows.groupby("iteration")]
    assert [i for i, _ in found] == [i for i, _ in plain]
    for (_, a), (_, b) in zip(found, plain, strict=True):
        assert a.tolist() == b.tolist()
    assert any((p >= 0).sum() > 10 for _, p in found)


@pytest.mark.parametrize("path", RANKS, ids=lambda p: p.parent.name + "/" + p.name)
def test_spans_are_the_span_frames(path: Path) -> None:
    """`spans_of` from the trace's numpy columns gives the rows of its spans frame."""
    job, rank, _, _ = _loaded(path)
    spans = job.trace.spans
    mine = spans[spans["rank"] == rank]
    expected = {
        int(i): (int(a), int(b))
        for i, a, b in zip(mine["iteration"], mine["start"], mine["end"], strict=True)
    }
    assert sim.spans_of(job, rank) == expected and len(expected) >= 3


def test_medians_and_unique_are_numpys_bit_for_bit() -> None:
    """`nan_medians` is `np.nanmedian` over columns, to the last bit, on the overhead and
    duration tables of a real rank's steps and on random tables with holes and ties;
    `sorted_unique` is `np.unique`."""
    job, rank, compiled, rows = _loaded(RESNET / "rank0.json.gz")
    oracle = sim.mean_of_runs(job.graphs[rank], rows)
    models = sim._step_models(compiled, rows, oracle, sim.spans_of(job, rank))
    n = len(compiled.names)
    tables = [
        np.stack([np.where(m.observed, m.overhead, np.nan) for _, _, m in models.values()]),
        np.stack([np.where(m.observed, m.seconds[:n], np.nan) for _, _, m in models.values()]),
    ]
    rng = np.random.default_rng(0)
    for _ in range(200):
        t = np.round(rng.random((int(rng.integers(1, 9)), 30)), int(rng.integers(1, 4)))
        t[rng.random(t.shape) < 0.4] = np.nan
        tables.append(t)
    for table in tables:
        seen = (~np.isnan(table)).any(axis=0)
        got = sim.nan_medians(table[:, seen])
        assert got.tobytes() == np.nanmedian(table[:, seen], axis=0).tobytes()
    for values in (compiled.res, rows["start"].to_numpy(), rng.integers(0, 5, 100), np.zeros(0)):
        assert sim.sorted_unique(values).tolist() == np.unique(values).tolist()


def test_the_compiled_graph_is_built_per_call_and_holds_its_derived_state() -> None:
    """`compile_graph` keeps nothing between calls (no cache keyed by a graph's
    identity): each call builds the arrays of its own graph. The topological positions
    are derived once per compiled graph, on it, and run every edge forward. A rank's
    rows looked up once (`op_rows`) and handed on give what the rows themselves give."""
    job = detect.load([RESNET])
    first, second = (job.graphs[r] for r in job.ranks)
    a, again = sim.compile_graph(first), sim.compile_graph(first)
    assert again is not a and again.names == a.names and (again.res == a.res).all()
    b = sim.compile_graph(second)
    assert b.graph is second and a.graph is first
    position = a.topological_position
    assert a.topological_position is position
    assert sorted(position.tolist()) == list(range(len(a.names)))
    assert (position[a.src] < position[a.dst]).all()
    frame = sim._frame(job)
    rank = job.ranks[0]
    rows = sim.rank_rows(frame, rank)
    compiled, known = sim.rank_arrays(job.graphs[rank], rows)
    spans = sim.spans_of(job, rank)
    queue, plain = sim.carried_over(compiled, known, spans), sim.carried_over(compiled, rows, spans)
    assert queue.keys() == plain.keys()
    assert all((queue[it] == plain[it]).all() for it in queue)
    oracle = sim.mean_of_runs(job.graphs[rank], rows)
    handed = sim._replay_rank(compiled, known, oracle, 0, spans)
    assert handed == sim._replay_rank(sim.compile_graph(job.graphs[rank]), rows, oracle, 0, spans)
